//! InfiniBand connection manager: MAD codecs and the handshake state machine.

pub mod ip_cm;
pub mod mad;
pub mod manager;

pub use manager::{Cm, CmConfig, CmError, CmEvent, CmStats, ConnId, ConnState, ConnectParams, MsgCounts};
