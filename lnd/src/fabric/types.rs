//! Plain-data verbs types: attributes, work requests, work completions, events.
//!
//! Each type mirrors the libibverbs structure of the same role (`ibv_device_attr`,
//! `ibv_port_attr`, `ibv_qp_cap`, `ibv_qp_attr`, `ibv_send_wr`, `ibv_recv_wr`, `ibv_sge`,
//! `ibv_wc`, `ibv_async_event`) with Rust types instead of FFI ones.

use std::fmt;
use std::net::Ipv4Addr;

/// A 128-bit port GID. On RoCEv2 and on the software device it is the IPv4-mapped address
/// `::ffff:a.b.c.d`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4-mapped GID `::ffff:a.b.c.d`.
    pub const fn from_ipv4(ip: Ipv4Addr) -> Gid {
        let o = ip.octets();
        Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, o[0], o[1], o[2], o[3]])
    }

    /// The IPv4 address of an IPv4-mapped GID.
    pub fn to_ipv4(&self) -> Option<Ipv4Addr> {
        let g = &self.0;
        if g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff {
            Some(Ipv4Addr::new(g[12], g[13], g[14], g[15]))
        } else {
            None
        }
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_ipv4() {
            Some(ip) => write!(f, "Gid(::ffff:{ip})"),
            None => {
                f.write_str("Gid(")?;
                for (i, pair) in self.0.chunks(2).enumerate() {
                    if i > 0 {
                        f.write_str(":")?;
                    }
                    write!(f, "{:02x}{:02x}", pair[0], pair.get(1).copied().unwrap_or(0))?;
                }
                f.write_str(")")
            }
        }
    }
}

/// The address of a port on the fabric: what an address handle (`ibv_ah_attr`) names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortAddr {
    /// The port GID (IPv4-mapped on RoCEv2).
    pub gid: Gid,
    /// The port LID on InfiniBand; `0xffff` (permissive) on RoCE.
    pub lid: u16,
}

impl PortAddr {
    /// The RoCEv2 address of an IPv4 port.
    pub const fn from_ipv4(ip: Ipv4Addr) -> PortAddr {
        PortAddr { gid: Gid::from_ipv4(ip), lid: 0xffff }
    }
}

/// Path MTU (`enum ibv_mtu`): 256 to 4096 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Mtu {
    /// 256 bytes (code 1).
    Mtu256,
    /// 512 bytes (code 2).
    Mtu512,
    /// 1024 bytes (code 3).
    Mtu1024,
    /// 2048 bytes (code 4).
    Mtu2048,
    /// 4096 bytes (code 5).
    #[default]
    Mtu4096,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The IBTA code (1..=5) used in CM messages and `ibv_mtu`.
    pub const fn code(self) -> u8 {
        match self {
            Mtu::Mtu256 => 1,
            Mtu::Mtu512 => 2,
            Mtu::Mtu1024 => 3,
            Mtu::Mtu2048 => 4,
            Mtu::Mtu4096 => 5,
        }
    }

    /// The MTU of an IBTA code.
    pub const fn from_code(code: u8) -> Option<Mtu> {
        match code {
            1 => Some(Mtu::Mtu256),
            2 => Some(Mtu::Mtu512),
            3 => Some(Mtu::Mtu1024),
            4 => Some(Mtu::Mtu2048),
            5 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    /// The MTU of a byte count (256, 512, 1024, 2048 or 4096).
    pub const fn from_bytes(bytes: u32) -> Option<Mtu> {
        match bytes {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
}

/// Device capabilities (`ibv_device_attr`, the fields an LND uses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Node GUID.
    pub node_guid: u64,
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum work requests per send or receive queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per work request.
    pub max_sge: u32,
    /// Maximum completion queue entries per CQ.
    pub max_cqe: u32,
    /// Maximum number of CQs.
    pub max_cq: u32,
    /// Maximum bytes in one memory region.
    pub max_mr_size: u64,
    /// Maximum number of memory regions.
    pub max_mr: u32,
    /// Maximum number of protection domains.
    pub max_pd: u32,
    /// Maximum RDMA READ/atomic depth as a responder (the LND uses 0).
    pub max_qp_rd_atom: u32,
    /// Maximum inline data per send work request.
    pub max_inline_data: u32,
}

/// Port state (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// The link is down.
    Down,
    /// The port is initialising.
    Init,
    /// Armed, not yet active.
    Armed,
    /// Active: traffic flows.
    Active,
}

/// Port attributes (`ibv_port_attr` plus the GID the LND will use).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// Port number (1 on single-port devices).
    pub port_num: u8,
    /// Port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// Currently active MTU.
    pub active_mtu: Mtu,
    /// The port's address (GID and LID).
    pub addr: PortAddr,
}

/// Memory-region access flags (`enum ibv_access_flags`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No remote access; local reads only.
    pub const NONE: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: the device may write the region (receives land here).
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE into the region.
    pub const REMOTE_WRITE: Access = Access(2);
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ the region (never used by the LND).
    pub const REMOTE_READ: Access = Access(4);

    /// The raw bit set.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of two flag sets.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = Vec::new();
        if self.contains(Access::LOCAL_WRITE) {
            names.push("LOCAL_WRITE");
        }
        if self.contains(Access::REMOTE_WRITE) {
            names.push("REMOTE_WRITE");
        }
        if self.contains(Access::REMOTE_READ) {
            names.push("REMOTE_READ");
        }
        write!(f, "Access({})", if names.is_empty() { "NONE".to_owned() } else { names.join("|") })
    }
}

/// Requested or actual queue-pair capacities (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpCaps {
    /// Work requests the send queue holds.
    pub max_send_wr: u32,
    /// Work requests the receive queue holds.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send work request.
    pub max_inline_data: u32,
}

/// Queue-pair state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created or reset: nothing is processed.
    Reset,
    /// Initialised: receives may be posted, nothing is sent or received.
    Init,
    /// Ready to receive: inbound packets are processed, sends are refused.
    Rtr,
    /// Ready to send.
    Rts,
    /// Error: every work request completes with `WR_FLUSH_ERR`.
    Err,
}

/// One `ibv_modify_qp` call, with the attributes that transition requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpModify {
    /// RESET → INIT.
    Init {
        /// Physical port number.
        port_num: u8,
        /// P_Key table index.
        pkey_index: u16,
        /// Access granted to remote peers on this QP (REMOTE_WRITE for the LND).
        access: Access,
    },
    /// INIT → RTR.
    Rtr {
        /// Path MTU.
        path_mtu: Mtu,
        /// The remote QP number.
        dest_qpn: u32,
        /// Expected PSN of the first inbound request (the peer's send start PSN).
        rq_psn: u32,
        /// The remote port (address handle).
        dest: PortAddr,
        /// RDMA READ/atomic responder resources (`max_dest_rd_atomic`).
        max_dest_rd_atomic: u8,
        /// RNR NAK timer code sent to peers when no receive is posted (0..=31).
        min_rnr_timer: u8,
    },
    /// RTR → RTS.
    Rts {
        /// PSN of the first outbound request.
        sq_psn: u32,
        /// Local ACK timeout code: 4.096 µs × 2^timeout (0 = infinite).
        timeout: u8,
        /// Transport retries before `RETRY_EXC_ERR` (0..=7).
        retry_cnt: u8,
        /// RNR retries before `RNR_RETRY_EXC_ERR` (0..=7, 7 = forever).
        rnr_retry: u8,
        /// Outstanding RDMA READ/atomic as an initiator (`max_rd_atomic`).
        max_rd_atomic: u8,
    },
    /// Any state → ERR: flush every outstanding work request.
    Err,
    /// Any state → RESET.
    Reset,
}

impl QpModify {
    /// The state this modification moves to.
    pub const fn target(&self) -> QpState {
        match self {
            QpModify::Init { .. } => QpState::Init,
            QpModify::Rtr { .. } => QpState::Rtr,
            QpModify::Rts { .. } => QpState::Rts,
            QpModify::Err => QpState::Err,
            QpModify::Reset => QpState::Reset,
        }
    }
}

/// Attributes for creating an RC queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInitAttr {
    /// Requested capacities; the device may clamp them.
    pub cap: QpCaps,
    /// `sq_sig_all`: if true every send work request generates a completion; if false only
    /// those flagged `signaled` do (`IB_SIGNAL_REQ_WR`, what o2iblnd uses). Failed work
    /// requests always complete.
    pub sq_sig_all: bool,
}

/// A scatter/gather element: `length` bytes at `addr` inside the region keyed `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Byte count.
    pub length: u32,
    /// Local key of the registered region that holds the bytes.
    pub lkey: u32,
}

/// Send work-request opcode (`enum ibv_wr_opcode`; RDMA READ is deliberately absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided SEND: consumes a receive at the peer.
    Send,
    /// SEND with 32 bits of immediate data delivered in the peer's completion.
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// One-sided RDMA WRITE into the peer's registered memory.
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key granting REMOTE_WRITE.
        rkey: u32,
    },
    /// RDMA WRITE that also consumes a receive at the peer and delivers immediate data.
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key granting REMOTE_WRITE.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
}

/// Send flags (`enum ibv_send_flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SendFlags {
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Set the solicited-event bit.
    pub solicited: bool,
    /// Copy the data at post time (at most `max_inline_data` bytes); the lkeys are ignored.
    pub inline: bool,
    /// Wait for prior RDMA READs to complete first (accepted; no READs exist here).
    pub fence: bool,
}

impl SendFlags {
    /// Only `signaled` set.
    pub const SIGNALED: SendFlags =
        SendFlags { signaled: true, solicited: false, inline: false, fence: false };
    /// Nothing set: the WR completes silently unless it fails.
    pub const UNSIGNALED: SendFlags =
        SendFlags { signaled: false, solicited: false, inline: false, fence: false };
}

/// A send work request (`ibv_send_wr`).
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Where the data comes from, gathered in order.
    pub sg_list: &'a [Sge],
    /// Completion and inline behaviour.
    pub flags: SendFlags,
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where an inbound SEND's bytes land, scattered in order.
    pub sg_list: &'a [Sge],
}

/// Work-completion status (`enum ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// The work request completed.
    #[default]
    Success,
    /// A received message was longer than the posted receive.
    LocLenErr,
    /// An internal QP consistency error (e.g. a send larger than the port allows).
    LocQpOpErr,
    /// A local key was invalid or did not cover the SGE.
    LocProtErr,
    /// The QP was in the error state: the request was flushed, never executed.
    WrFlushErr,
    /// The responder found the request invalid (e.g. its receive was too short).
    RemInvReqErr,
    /// The responder refused the remote key, the range or the access.
    RemAccessErr,
    /// The responder could not complete the operation.
    RemOpErr,
    /// Transport retries were exhausted without an acknowledgement.
    RetryExcErr,
    /// RNR retries were exhausted: the peer never posted a receive.
    RnrRetryExcErr,
    /// Anything else.
    GeneralErr,
}

impl WcStatus {
    /// The verbs name (`IBV_WC_*` without the prefix).
    pub const fn name(self) -> &'static str {
        match self {
            WcStatus::Success => "SUCCESS",
            WcStatus::LocLenErr => "LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "LOC_QP_OP_ERR",
            WcStatus::LocProtErr => "LOC_PROT_ERR",
            WcStatus::WrFlushErr => "WR_FLUSH_ERR",
            WcStatus::RemInvReqErr => "REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "REM_ACCESS_ERR",
            WcStatus::RemOpErr => "REM_OP_ERR",
            WcStatus::RetryExcErr => "RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "RNR_RETRY_EXC_ERR",
            WcStatus::GeneralErr => "GENERAL_ERR",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Work-completion opcode (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    /// A SEND (with or without immediate) completed.
    #[default]
    Send,
    /// An RDMA WRITE (with or without immediate) completed.
    RdmaWrite,
    /// A receive consumed by an inbound SEND.
    Recv,
    /// A receive consumed by an inbound RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

/// A work completion (`ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Wc {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed. Only meaningful with `Success` (as in verbs).
    pub opcode: WcOpcode,
    /// Bytes received (receive completions).
    pub byte_len: u32,
    /// Immediate data, if the inbound message carried it.
    pub imm_data: Option<u32>,
    /// The local QP number the work request belonged to.
    pub qp_num: u32,
}

/// Asynchronous events (`enum ibv_event_type`, the ones the LND handles).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// A QP in RTR received its first valid packet (`IBV_EVENT_COMM_EST`).
    CommEst {
        /// The QP.
        qp_num: u32,
    },
    /// A QP hit an error it cannot report through a completion (`IBV_EVENT_QP_FATAL`).
    QpFatal {
        /// The QP.
        qp_num: u32,
    },
    /// A CQ overran (`IBV_EVENT_CQ_ERR`); its QPs moved to ERR.
    CqErr {
        /// The CQ's identifier (see [`crate::fabric::CompletionQueue::id`]).
        cq_id: u32,
    },
    /// The port went down (`IBV_EVENT_PORT_ERR`): nothing can be sent or received until
    /// [`AsyncEvent::PortActive`]. QPs keep their state; an RC QP whose peer stays out of
    /// reach fails its sends once its retries run out.
    PortErr,
    /// The port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive,
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`): every QP is lost and the device must be
    /// closed and opened again. No event follows it.
    DeviceFatal,
}

/// A management datagram: exactly 256 bytes, as carried on QP1 (the GSI).
pub type Mad = [u8; 256];
