//! InfiniBand connection manager: MAD codecs and the handshake state machine.

pub mod ip_cm;
pub mod mad;
