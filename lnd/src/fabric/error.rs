//! Fabric errors: one variant per failing verb or cause.

use std::io;

use super::types::QpState;

/// What a verb call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// No device could be opened (no RDMA device, ENOSYS from libibverbs, bad name).
    #[error("no RDMA device: {reason}")]
    NoDevice {
        /// Why (the libibverbs error, or which name was not found).
        reason: String,
    },
    /// The device cannot hold the requested queues with the resources it has left
    /// (`ENOMEM` from `ibv_create_qp`). Retry with smaller queues.
    #[error("device resources exhausted: {what}")]
    Resource {
        /// Which resource ran out.
        what: &'static str,
    },
    /// A requested attribute exceeds what the device can ever do (`EINVAL`).
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
    },
    /// A QP cannot move from its current state to the requested one.
    #[error("invalid QP state transition {from:?} -> {to:?}")]
    InvalidTransition {
        /// State before the call.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// Posting failed: the queue is full, the QP is in the wrong state, or a WR is malformed.
    /// `index` is the first work request not posted (verbs' `bad_wr`).
    #[error("post failed at work request {index}: {reason}")]
    Post {
        /// Index of the first work request that was not posted.
        index: usize,
        /// Why.
        reason: &'static str,
    },
    /// An object referenced by the call does not exist (destroyed QP, unknown key).
    #[error("no such {what}")]
    NotFound {
        /// What kind of object.
        what: &'static str,
    },
    /// An operating-system call failed.
    #[error("{call}: {source}")]
    Io {
        /// The call that failed.
        call: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl FabricError {
    /// Wraps an OS error from `call`.
    pub fn io(call: &'static str, source: io::Error) -> FabricError {
        FabricError::Io { call, source }
    }

    /// Whether this is the resource error that the QP-sizing loop retries on.
    pub fn is_resource(&self) -> bool {
        matches!(self, FabricError::Resource { .. })
    }
}
