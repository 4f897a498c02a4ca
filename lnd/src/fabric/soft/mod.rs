//! The software RC device (under construction).
pub mod packet;
