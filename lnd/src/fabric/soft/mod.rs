//! The software RC device (under construction).
