//! Pure conversions between the fabric's plain-data types and libibverbs values.
//!
//! Nothing here calls into libibverbs: every function maps values (or builds a plain
//! `ibv_*` struct for a later call), so all of it is unit-tested on machines without RDMA.
//!
//! # Work-completion status table (`enum ibv_wc_status` → [`WcStatus`])
//! | verbs | here | why |
//! |---|---|---|
//! | `SUCCESS` | `Success` | |
//! | `LOC_LEN_ERR` | `LocLenErr` | |
//! | `LOC_QP_OP_ERR` | `LocQpOpErr` | |
//! | `LOC_EEC_OP_ERR` | `LocQpOpErr` | RD only; the local-consistency class |
//! | `LOC_PROT_ERR` | `LocProtErr` | |
//! | `WR_FLUSH_ERR` | `WrFlushErr` | |
//! | `MW_BIND_ERR` | `LocProtErr` | a local protection failure (no MWs are used) |
//! | `BAD_RESP_ERR` | `RemOpErr` | the responder misbehaved |
//! | `LOC_ACCESS_ERR` | `LocProtErr` | local buffer protection during an inbound WRITE-with-imm |
//! | `REM_INV_REQ_ERR` | `RemInvReqErr` | |
//! | `REM_ACCESS_ERR` | `RemAccessErr` | |
//! | `REM_OP_ERR` | `RemOpErr` | |
//! | `RETRY_EXC_ERR` | `RetryExcErr` | |
//! | `RNR_RETRY_EXC_ERR` | `RnrRetryExcErr` | |
//! | `LOC_RDD_VIOL_ERR` | `GeneralErr` | RD only |
//! | `REM_INV_RD_REQ_ERR` | `RemInvReqErr` | RD only; the remote-invalid class |
//! | `REM_ABORT_ERR` | `RemOpErr` | the responder aborted |
//! | `INV_EECN_ERR`, `INV_EEC_STATE_ERR` | `GeneralErr` | RD only |
//! | `FATAL_ERR` | `GeneralErr` | |
//! | `RESP_TIMEOUT_ERR` | `RetryExcErr` | no response in time, as a transport timeout |
//! | `GENERAL_ERR`, `TM_ERR`, `TM_RNDV_INCOMPLETE`, unknown | `GeneralErr` | |
//!
//! # Immediate data
//! `ibv_send_wr.imm_data` and `ibv_wc.imm_data` are big-endian (`__be32`) on the wire. The
//! fabric types carry the logical value, so it is converted with `to_be` when posting and
//! `from_be` when reaped: a value posted on one verbs host arrives unchanged on another.

use ibverbs_sys as sys;

use crate::fabric::{
    Access, AsyncEvent, FabricError, Gid, Mtu, PortAddr, PortState, QpModify, QpState, SendFlags, SendOp,
    SendWr, Wc, WcOpcode, WcStatus,
};

/// The hop limit of the GRH on RoCEv2 (the IPv4 TTL) and on routed InfiniBand paths.
pub const HOP_LIMIT: u8 = 64;
/// The largest PSN (24 bits).
pub const PSN_MASK: u32 = 0x00ff_ffff;
/// The largest QP number (24 bits).
pub const QPN_MASK: u32 = 0x00ff_ffff;
/// The permissive LID; the fabric types use it for "no LID" (RoCE).
pub const PERMISSIVE_LID: u16 = 0xffff;

/// The link layer of a port (`ibv_port_attr.link_layer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand: LIDs route, the GRH is needed only across subnets.
    Infiniband,
    /// Ethernet: RoCE; every packet carries a GRH (RoCEv2: an IP header) built from a GID.
    Ethernet,
}

impl LinkLayer {
    /// The link layer of `ibv_port_attr.link_layer` (`UNSPECIFIED` means InfiniBand: old
    /// drivers report it for IB ports).
    pub fn from_ibv(v: u8) -> LinkLayer {
        if u32::from(v) == sys::IBV_LINK_LAYER_ETHERNET { LinkLayer::Ethernet } else { LinkLayer::Infiniband }
    }

    /// A short name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            LinkLayer::Infiniband => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet (RoCE)",
        }
    }
}

/// `Access` → `ibv_access_flags` bits.
pub fn access_to_ibv(a: Access) -> u32 {
    let mut f = 0;
    if a.contains(Access::LOCAL_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    f
}

/// Checks the flag combinations verbs refuses (`EINVAL` from `ibv_reg_mr`): remote write
/// needs local write.
pub fn check_access(a: Access) -> Result<(), FabricError> {
    if a.contains(Access::REMOTE_WRITE) && !a.contains(Access::LOCAL_WRITE) {
        return Err(FabricError::InvalidArgument { what: "REMOTE_WRITE requires LOCAL_WRITE" });
    }
    Ok(())
}

/// `Mtu` → `enum ibv_mtu` (the IBTA codes 1..=5).
pub fn mtu_to_ibv(m: Mtu) -> sys::ibv_mtu {
    sys::ibv_mtu::from(m.code())
}

/// `enum ibv_mtu` → `Mtu`; `None` for a value outside 1..=5.
pub fn mtu_from_ibv(v: sys::ibv_mtu) -> Option<Mtu> {
    u8::try_from(v).ok().and_then(Mtu::from_code)
}

/// `enum ibv_port_state` → `PortState` (`NOP` reads as down, `ACTIVE_DEFER` as active).
pub fn port_state_from_ibv(s: sys::ibv_port_state::Type) -> PortState {
    use sys::ibv_port_state::*;
    match s {
        IBV_PORT_INIT => PortState::Init,
        IBV_PORT_ARMED => PortState::Armed,
        IBV_PORT_ACTIVE | IBV_PORT_ACTIVE_DEFER => PortState::Active,
        _ => PortState::Down,
    }
}

/// `enum ibv_qp_state` → `QpState`. `SQD` (send queue drained, still connected) reads as RTS;
/// `SQE` (send queue error) and anything unknown as ERR.
pub fn qp_state_from_ibv(s: sys::ibv_qp_state::Type) -> QpState {
    use sys::ibv_qp_state::*;
    match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS | IBV_QPS_SQD => QpState::Rts,
        _ => QpState::Err,
    }
}

/// `QpState` → `enum ibv_qp_state`.
pub fn qp_state_to_ibv(s: QpState) -> sys::ibv_qp_state::Type {
    use sys::ibv_qp_state::*;
    match s {
        QpState::Reset => IBV_QPS_RESET,
        QpState::Init => IBV_QPS_INIT,
        QpState::Rtr => IBV_QPS_RTR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Err => IBV_QPS_ERR,
    }
}

/// `enum ibv_wc_status` → `WcStatus` (the table in the module docs).
pub fn wc_status_from_ibv(s: sys::ibv_wc_status::Type) -> WcStatus {
    use sys::ibv_wc_status::*;
    match s {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        IBV_WC_LOC_QP_OP_ERR | IBV_WC_LOC_EEC_OP_ERR => WcStatus::LocQpOpErr,
        IBV_WC_LOC_PROT_ERR | IBV_WC_MW_BIND_ERR | IBV_WC_LOC_ACCESS_ERR => WcStatus::LocProtErr,
        IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        IBV_WC_REM_INV_REQ_ERR | IBV_WC_REM_INV_RD_REQ_ERR => WcStatus::RemInvReqErr,
        IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        IBV_WC_REM_OP_ERR | IBV_WC_BAD_RESP_ERR | IBV_WC_REM_ABORT_ERR => WcStatus::RemOpErr,
        IBV_WC_RETRY_EXC_ERR | IBV_WC_RESP_TIMEOUT_ERR => WcStatus::RetryExcErr,
        IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        _ => WcStatus::GeneralErr,
    }
}

/// `enum ibv_wc_opcode` → `WcOpcode`; `None` for opcodes this backend never posts (READ,
/// atomics, memory-window binds, tag matching).
pub fn wc_opcode_from_ibv(op: sys::ibv_wc_opcode::Type) -> Option<WcOpcode> {
    use sys::ibv_wc_opcode::*;
    match op {
        IBV_WC_SEND => Some(WcOpcode::Send),
        IBV_WC_RDMA_WRITE => Some(WcOpcode::RdmaWrite),
        IBV_WC_RECV => Some(WcOpcode::Recv),
        IBV_WC_RECV_RDMA_WITH_IMM => Some(WcOpcode::RecvRdmaWithImm),
        _ => None,
    }
}

/// One `ibv_wc` as a `Wc`. The opcode of a failed completion is undefined in verbs; it is
/// reported as whatever the provider left there (or `Send` when unknown), and only `wr_id`,
/// `status` and `qp_num` should be trusted, as the `Wc` docs say. Immediate data is present
/// only when the completion succeeded and has `IBV_WC_WITH_IMM`.
pub fn wc_from_ibv(wc: &sys::ibv_wc) -> Wc {
    let status = match wc.error() {
        None => WcStatus::Success,
        Some((s, _vendor_err)) => wc_status_from_ibv(s),
    };
    Wc {
        wr_id: wc.wr_id(),
        status,
        opcode: wc_opcode_from_ibv(wc.opcode()).unwrap_or(WcOpcode::Send),
        byte_len: u32::try_from(wc.len()).unwrap_or(u32::MAX),
        imm_data: wc.imm_data().map(u32::from_be),
        qp_num: wc.qp_num,
    }
}

/// `SendFlags` → `ibv_send_flags` bits.
pub fn send_flags_to_ibv(f: SendFlags) -> u32 {
    let mut v = 0;
    if f.signaled {
        v |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if f.solicited {
        v |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
    }
    if f.inline {
        v |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    if f.fence {
        v |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
    }
    v
}

/// The opcode, immediate data (big-endian) and RDMA target of a send operation.
pub fn send_op_to_ibv(op: SendOp) -> (sys::ibv_wr_opcode::Type, Option<u32>, Option<(u64, u32)>) {
    use sys::ibv_wr_opcode::*;
    match op {
        SendOp::Send => (IBV_WR_SEND, None, None),
        SendOp::SendWithImm { imm } => (IBV_WR_SEND_WITH_IMM, Some(imm.to_be()), None),
        SendOp::RdmaWrite { remote_addr, rkey } => (IBV_WR_RDMA_WRITE, None, Some((remote_addr, rkey))),
        SendOp::RdmaWriteWithImm { remote_addr, rkey, imm } => {
            (IBV_WR_RDMA_WRITE_WITH_IMM, Some(imm.to_be()), Some((remote_addr, rkey)))
        }
    }
}

/// Builds the `ibv_send_wr` of `wr` with `next = NULL`; `sg_list` points at `wr.sg_list`
/// already converted to `ibv_sge`s (`NULL` when there are none).
pub fn send_wr_to_ibv(wr: &SendWr<'_>, sg_list: *mut sys::ibv_sge) -> sys::ibv_send_wr {
    let (opcode, imm, rdma) = send_op_to_ibv(wr.op);
    let mut out = sys::ibv_send_wr {
        wr_id: wr.wr_id,
        next: std::ptr::null_mut(),
        sg_list,
        num_sge: i32::try_from(wr.sg_list.len()).unwrap_or(i32::MAX),
        opcode,
        send_flags: send_flags_to_ibv(wr.flags),
        ..Default::default()
    };
    if let Some(imm) = imm {
        out.__bindgen_anon_1 = sys::ibv_send_wr__bindgen_ty_1 { imm_data: imm };
    }
    if let Some((remote_addr, rkey)) = rdma {
        out.wr = sys::ibv_send_wr__bindgen_ty_2 {
            rdma: sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey },
        };
    }
    out
}

/// Why a send work request is refused before it reaches the provider (the provider would
/// refuse it too, with a less precise errno), or `None` if it may be posted.
pub fn check_send_wr(wr: &SendWr<'_>, max_send_sge: u32, max_inline_data: u32) -> Option<&'static str> {
    if wr.sg_list.len() > max_send_sge as usize {
        return Some("too many scatter/gather entries");
    }
    let total: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    if total > 1 << 31 {
        return Some("message longer than 2 GiB");
    }
    if wr.flags.inline && total > u64::from(max_inline_data) {
        return Some("inline data longer than max_inline_data");
    }
    None
}

/// The `reason` of a [`FabricError::Post`] for the errno a provider's `post_send` or
/// `post_recv` returned (providers return a positive errno; a negative one is accepted too).
pub fn post_errno_reason(rc: i32) -> &'static str {
    match rc.unsigned_abs() as i32 {
        libc::ENOMEM => "queue full",
        libc::EINVAL => "work request refused by the provider (QP state, opcode, SGE count or inline size)",
        libc::EFAULT => "bad work-request memory",
        _ => "post failed",
    }
}

/// The error of a failed `ibv_create_qp` (errno). Arguments are validated and capacities
/// clamped to the device limits first, so `EINVAL` here means the queues are too large for
/// the device in combination (WQE size × depth): a resource error the caller can retry
/// smaller, like `ENOMEM` and `EAGAIN`.
pub fn create_qp_error(errno: i32) -> FabricError {
    match errno {
        libc::ENOMEM | libc::EAGAIN | libc::ENOSPC => {
            FabricError::Resource { what: "queue pair (device memory or QP count)" }
        }
        libc::EINVAL => FabricError::Resource { what: "queue pair sizes (EINVAL from the provider)" },
        e => FabricError::io("ibv_create_qp", std::io::Error::from_raw_os_error(e)),
    }
}

/// The error of a failed `ibv_create_cq` (errno).
pub fn create_cq_error(errno: i32) -> FabricError {
    match errno {
        libc::ENOMEM | libc::EAGAIN | libc::ENOSPC => FabricError::Resource { what: "completion queues" },
        libc::EINVAL => FabricError::InvalidArgument { what: "completion queue size" },
        e => FabricError::io("ibv_create_cq", std::io::Error::from_raw_os_error(e)),
    }
}

/// The error of a failed `ibv_reg_mr` (errno). `ENOMEM` is usually the locked-memory limit
/// (`ulimit -l`), sometimes the MR table.
pub fn reg_mr_error(errno: i32) -> FabricError {
    match errno {
        libc::ENOMEM | libc::EAGAIN => FabricError::Resource {
            what: "memory registration (locked-memory limit `ulimit -l`, or MR table)",
        },
        libc::EINVAL => FabricError::InvalidArgument { what: "memory region (address, length or access)" },
        libc::EFAULT => FabricError::InvalidArgument { what: "memory region is not mapped" },
        e => FabricError::io("ibv_reg_mr", std::io::Error::from_raw_os_error(e)),
    }
}

/// The error of a failed `ibv_modify_qp` (errno; verbs returns it rather than setting errno).
pub fn modify_qp_error(errno: i32) -> FabricError {
    match errno {
        libc::EINVAL => FabricError::InvalidArgument { what: "QP attributes refused by the device (EINVAL)" },
        e => FabricError::io("ibv_modify_qp", std::io::Error::from_raw_os_error(e)),
    }
}

/// The port, GID and service parameters the address vector of every RTR is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathParams {
    /// The physical port the QPs use.
    pub port_num: u8,
    /// The port's link layer.
    pub link: LinkLayer,
    /// Source GID table index (RoCE: the chosen RoCEv2 GID).
    pub sgid_index: u8,
    /// The source GID itself (its subnet prefix decides whether an IB path needs a GRH).
    pub sgid: Gid,
    /// GRH traffic class (RoCEv2: the IP DSCP/ECN byte).
    pub traffic_class: u8,
    /// Service level (IB SL; RoCE: the VLAN priority where the provider maps it).
    pub service_level: u8,
    /// The port's active MTU: RTR lowers a larger path MTU to it.
    pub active_mtu: Mtu,
}

/// Whether `m` may be applied to a QP in `from` (the same table as the software device):
/// INIT from RESET or INIT, RTR from INIT, RTS from RTR or RTS, ERR and RESET from anything.
pub fn check_transition(from: QpState, m: &QpModify) -> Result<(), FabricError> {
    let ok = match m {
        QpModify::Reset => true,
        // The kernel's `qp_state_table` has no RESET → ERR (EINVAL): nothing to flush there.
        QpModify::Err => from != QpState::Reset,
        QpModify::Init { .. } => matches!(from, QpState::Reset | QpState::Init),
        QpModify::Rtr { .. } => from == QpState::Init,
        QpModify::Rts { .. } => matches!(from, QpState::Rtr | QpState::Rts),
    };
    if ok { Ok(()) } else { Err(FabricError::InvalidTransition { from, to: m.target() }) }
}

/// The address vector (`ibv_ah_attr`) towards `dest`.
///
/// * Ethernet (RoCEv2): always global: `dgid` = the destination GID (IPv4-mapped),
///   `sgid_index` = ours, hop limit 64, our traffic class; `dlid` 0 (the kernel resolves the
///   destination MAC from the GID when the QP moves to RTR).
/// * InfiniBand: `dlid` = the destination LID; a GRH only when the destination GID is on
///   another subnet (its 64-bit prefix differs from ours).
pub fn ah_attr(dest: &PortAddr, p: &PathParams) -> Result<sys::ibv_ah_attr, FabricError> {
    let mut ah = sys::ibv_ah_attr { sl: p.service_level, port_num: p.port_num, ..Default::default() };
    let global = match p.link {
        LinkLayer::Ethernet => {
            if dest.gid == Gid::default() {
                return Err(FabricError::InvalidArgument { what: "dest GID (zero) on a RoCE port" });
            }
            true
        }
        LinkLayer::Infiniband => {
            if dest.lid == 0 || dest.lid >= 0xc000 {
                return Err(FabricError::InvalidArgument { what: "dest LID (not a unicast LID)" });
            }
            ah.dlid = dest.lid;
            dest.gid != Gid::default() && dest.gid.0[..8] != p.sgid.0[..8]
        }
    };
    if global {
        ah.is_global = 1;
        ah.grh = sys::ibv_global_route {
            dgid: sys::ibv_gid { raw: dest.gid.0 },
            flow_label: 0,
            sgid_index: p.sgid_index,
            hop_limit: HOP_LIMIT,
            traffic_class: p.traffic_class,
        };
    }
    Ok(ah)
}

/// The `ibv_qp_attr` and attribute mask of one transition, after validating the arguments.
///
/// | transition | mask |
/// |---|---|
/// | INIT | `STATE PKEY_INDEX PORT ACCESS_FLAGS` |
/// | RTR | `STATE AV PATH_MTU DEST_QPN RQ_PSN MAX_DEST_RD_ATOMIC MIN_RNR_TIMER` |
/// | RTR→RTS | `STATE TIMEOUT RETRY_CNT RNR_RETRY SQ_PSN MAX_QP_RD_ATOMIC` |
/// | RTS→RTS | `STATE` (verbs forbids the RTS attributes on this transition; nothing changes) |
/// | ERR, RESET | `STATE` |
///
/// These are exactly the required attributes of the RC rows of the IBTA QP state table
/// (`ib_modify_qp_is_ok` in the kernel); RTR's path MTU is lowered to the port's active MTU.
/// `from` is the current state (it only matters for RTS → RTS).
pub fn modify_attr(
    from: QpState,
    m: &QpModify,
    p: &PathParams,
) -> Result<(sys::ibv_qp_attr, sys::ibv_qp_attr_mask), FabricError> {
    use sys::ibv_qp_attr_mask as M;
    let mut attr = sys::ibv_qp_attr { qp_state: qp_state_to_ibv(m.target()), ..Default::default() };
    let mut mask = M::IBV_QP_STATE;
    match *m {
        QpModify::Init { port_num, pkey_index, access } => {
            if port_num == 0 {
                return Err(FabricError::InvalidArgument { what: "port_num (0)" });
            }
            attr.port_num = port_num;
            attr.pkey_index = pkey_index;
            attr.qp_access_flags = access_to_ibv(access);
            mask = mask | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS;
        }
        QpModify::Rtr { path_mtu, dest_qpn, rq_psn, dest, max_dest_rd_atomic, min_rnr_timer } => {
            if !(2..=QPN_MASK).contains(&dest_qpn) {
                return Err(FabricError::InvalidArgument { what: "dest_qpn" });
            }
            if rq_psn > PSN_MASK {
                return Err(FabricError::InvalidArgument { what: "rq_psn" });
            }
            if min_rnr_timer > 31 {
                return Err(FabricError::InvalidArgument { what: "min_rnr_timer" });
            }
            attr.path_mtu = mtu_to_ibv(path_mtu.min(p.active_mtu));
            attr.dest_qp_num = dest_qpn;
            attr.rq_psn = rq_psn;
            attr.max_dest_rd_atomic = max_dest_rd_atomic;
            attr.min_rnr_timer = min_rnr_timer;
            attr.ah_attr = ah_attr(&dest, p)?;
            mask = mask
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER;
        }
        QpModify::Rts { sq_psn, timeout, retry_cnt, rnr_retry, max_rd_atomic } => {
            if sq_psn > PSN_MASK {
                return Err(FabricError::InvalidArgument { what: "sq_psn" });
            }
            if retry_cnt > 7 || rnr_retry > 7 || timeout > 31 {
                return Err(FabricError::InvalidArgument { what: "timeout/retry_cnt/rnr_retry" });
            }
            if from != QpState::Rts {
                attr.sq_psn = sq_psn;
                attr.timeout = timeout;
                attr.retry_cnt = retry_cnt;
                attr.rnr_retry = rnr_retry;
                attr.max_rd_atomic = max_rd_atomic;
                mask = mask
                    | M::IBV_QP_TIMEOUT
                    | M::IBV_QP_RETRY_CNT
                    | M::IBV_QP_RNR_RETRY
                    | M::IBV_QP_SQ_PSN
                    | M::IBV_QP_MAX_QP_RD_ATOMIC;
            }
        }
        QpModify::Err | QpModify::Reset => {}
    }
    Ok((attr, mask))
}

/// An `ibv_async_event` reduced to what the mapping needs: the event type and whichever
/// element it names (read by the caller according to the type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawEvent {
    /// A QP-affiliated event with the QP's number.
    Qp(sys::ibv_event_type, u32),
    /// A CQ-affiliated event with the CQ's identifier.
    Cq(sys::ibv_event_type, u32),
    /// A port event with the port number.
    Port(sys::ibv_event_type, u8),
    /// A device-wide event (`DEVICE_FATAL`).
    Device(sys::ibv_event_type),
    /// An event on an object this backend never creates (SRQ, WQ).
    Other(sys::ibv_event_type),
}

/// Which element of `ibv_async_event` an event type names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventElement {
    /// `element.qp`.
    Qp,
    /// `element.cq`.
    Cq,
    /// `element.port_num`.
    Port,
    /// Nothing (device-wide).
    Device,
    /// `element.srq` / `element.wq`: not ours.
    Other,
}

/// The element an event type carries (`man ibv_get_async_event`).
pub fn event_element(t: sys::ibv_event_type) -> EventElement {
    match t {
        sys::IBV_EVENT_QP_FATAL
        | sys::IBV_EVENT_QP_REQ_ERR
        | sys::IBV_EVENT_QP_ACCESS_ERR
        | sys::IBV_EVENT_COMM_EST
        | sys::IBV_EVENT_SQ_DRAINED
        | sys::IBV_EVENT_PATH_MIG
        | sys::IBV_EVENT_PATH_MIG_ERR
        | sys::IBV_EVENT_QP_LAST_WQE_REACHED => EventElement::Qp,
        sys::IBV_EVENT_CQ_ERR => EventElement::Cq,
        sys::IBV_EVENT_PORT_ACTIVE
        | sys::IBV_EVENT_PORT_ERR
        | sys::IBV_EVENT_LID_CHANGE
        | sys::IBV_EVENT_PKEY_CHANGE
        | sys::IBV_EVENT_SM_CHANGE
        | sys::IBV_EVENT_CLIENT_REREGISTER
        | sys::IBV_EVENT_GID_CHANGE => EventElement::Port,
        sys::IBV_EVENT_DEVICE_FATAL => EventElement::Device,
        _ => EventElement::Other,
    }
}

/// Maps an async event to what the LND handles; `None` for events it ignores (they are still
/// acknowledged). QP request/access errors are reported as `QpFatal` (the QP is in ERR either
/// way); port events of other ports are dropped.
pub fn async_event(ev: RawEvent, our_port: u8) -> Option<AsyncEvent> {
    match ev {
        RawEvent::Qp(t, qp_num) => match t {
            sys::IBV_EVENT_COMM_EST => Some(AsyncEvent::CommEst { qp_num }),
            sys::IBV_EVENT_QP_FATAL | sys::IBV_EVENT_QP_REQ_ERR | sys::IBV_EVENT_QP_ACCESS_ERR => {
                Some(AsyncEvent::QpFatal { qp_num })
            }
            _ => None,
        },
        RawEvent::Cq(sys::IBV_EVENT_CQ_ERR, cq_id) => Some(AsyncEvent::CqErr { cq_id }),
        RawEvent::Port(t, port) if port == our_port => match t {
            sys::IBV_EVENT_PORT_ACTIVE => Some(AsyncEvent::PortActive),
            sys::IBV_EVENT_PORT_ERR => Some(AsyncEvent::PortErr),
            _ => None,
        },
        RawEvent::Device(sys::IBV_EVENT_DEVICE_FATAL) => Some(AsyncEvent::DeviceFatal),
        _ => None,
    }
}

/// Whether a port event means the port's LID or GID table may have changed.
pub fn event_refreshes_port(ev: RawEvent, our_port: u8) -> bool {
    matches!(
        ev,
        RawEvent::Port(
            sys::IBV_EVENT_LID_CHANGE
                | sys::IBV_EVENT_PORT_ACTIVE
                | sys::IBV_EVENT_CLIENT_REREGISTER
                | sys::IBV_EVENT_GID_CHANGE,
            p
        ) if p == our_port
    )
}

/// A non-negative C int as `u32` (device limits are `int` in `ibv_device_attr`).
pub fn c_uint(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::fabric::Sge;

    fn roce() -> PathParams {
        PathParams {
            port_num: 1,
            link: LinkLayer::Ethernet,
            sgid_index: 3,
            sgid: Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 1)),
            traffic_class: 106,
            service_level: 0,
            active_mtu: Mtu::Mtu1024,
        }
    }

    fn ib() -> PathParams {
        let mut sgid = [0u8; 16];
        sgid[..8].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0]);
        sgid[8..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        PathParams {
            link: LinkLayer::Infiniband,
            sgid_index: 0,
            sgid: Gid(sgid),
            active_mtu: Mtu::Mtu4096,
            service_level: 2,
            ..roce()
        }
    }

    #[test]
    fn every_wc_status_maps() {
        use sys::ibv_wc_status::*;
        let table = [
            (IBV_WC_SUCCESS, WcStatus::Success),
            (IBV_WC_LOC_LEN_ERR, WcStatus::LocLenErr),
            (IBV_WC_LOC_QP_OP_ERR, WcStatus::LocQpOpErr),
            (IBV_WC_LOC_EEC_OP_ERR, WcStatus::LocQpOpErr),
            (IBV_WC_LOC_PROT_ERR, WcStatus::LocProtErr),
            (IBV_WC_WR_FLUSH_ERR, WcStatus::WrFlushErr),
            (IBV_WC_MW_BIND_ERR, WcStatus::LocProtErr),
            (IBV_WC_BAD_RESP_ERR, WcStatus::RemOpErr),
            (IBV_WC_LOC_ACCESS_ERR, WcStatus::LocProtErr),
            (IBV_WC_REM_INV_REQ_ERR, WcStatus::RemInvReqErr),
            (IBV_WC_REM_ACCESS_ERR, WcStatus::RemAccessErr),
            (IBV_WC_REM_OP_ERR, WcStatus::RemOpErr),
            (IBV_WC_RETRY_EXC_ERR, WcStatus::RetryExcErr),
            (IBV_WC_RNR_RETRY_EXC_ERR, WcStatus::RnrRetryExcErr),
            (IBV_WC_LOC_RDD_VIOL_ERR, WcStatus::GeneralErr),
            (IBV_WC_REM_INV_RD_REQ_ERR, WcStatus::RemInvReqErr),
            (IBV_WC_REM_ABORT_ERR, WcStatus::RemOpErr),
            (IBV_WC_INV_EECN_ERR, WcStatus::GeneralErr),
            (IBV_WC_INV_EEC_STATE_ERR, WcStatus::GeneralErr),
            (IBV_WC_FATAL_ERR, WcStatus::GeneralErr),
            (IBV_WC_RESP_TIMEOUT_ERR, WcStatus::RetryExcErr),
            (IBV_WC_GENERAL_ERR, WcStatus::GeneralErr),
            (IBV_WC_TM_ERR, WcStatus::GeneralErr),
            (IBV_WC_TM_RNDV_INCOMPLETE, WcStatus::GeneralErr),
            (999, WcStatus::GeneralErr),
        ];
        for (v, want) in table {
            assert_eq!(wc_status_from_ibv(v), want, "status {v}");
        }
    }

    #[test]
    fn opcodes_map() {
        use sys::ibv_wc_opcode::*;
        assert_eq!(wc_opcode_from_ibv(IBV_WC_SEND), Some(WcOpcode::Send));
        assert_eq!(wc_opcode_from_ibv(IBV_WC_RDMA_WRITE), Some(WcOpcode::RdmaWrite));
        assert_eq!(wc_opcode_from_ibv(IBV_WC_RECV), Some(WcOpcode::Recv));
        assert_eq!(wc_opcode_from_ibv(IBV_WC_RECV_RDMA_WITH_IMM), Some(WcOpcode::RecvRdmaWithImm));
        assert_eq!(wc_opcode_from_ibv(IBV_WC_RDMA_READ), None);
        assert_eq!(wc_opcode_from_ibv(IBV_WC_FETCH_ADD), None);

        let (op, imm, rdma) = send_op_to_ibv(SendOp::Send);
        assert_eq!((op, imm, rdma), (sys::ibv_wr_opcode::IBV_WR_SEND, None, None));
        let (op, imm, _) = send_op_to_ibv(SendOp::SendWithImm { imm: 0x0102_0304 });
        assert_eq!(op, sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM);
        assert_eq!(imm.map(|v| v.to_ne_bytes()), Some([1, 2, 3, 4]), "imm goes on the wire big-endian");
        let (op, imm, rdma) = send_op_to_ibv(SendOp::RdmaWrite { remote_addr: 0x1000, rkey: 7 });
        assert_eq!((op, imm, rdma), (sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE, None, Some((0x1000, 7))));
        let (op, imm, rdma) =
            send_op_to_ibv(SendOp::RdmaWriteWithImm { remote_addr: 0x2000, rkey: 9, imm: 5 });
        assert_eq!(op, sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!((imm, rdma), (Some(5u32.to_be()), Some((0x2000, 9))));
    }

    #[test]
    fn send_wr_is_built_field_by_field() {
        let sges = [Sge { addr: 0x10, length: 8, lkey: 1 }, Sge { addr: 0x20, length: 4, lkey: 1 }];
        let wr = SendWr {
            wr_id: 42,
            op: SendOp::RdmaWriteWithImm { remote_addr: 0xdead_0000, rkey: 0x55, imm: 0xabcd },
            sg_list: &sges,
            flags: SendFlags { signaled: true, solicited: true, inline: false, fence: true },
        };
        let mut ibv_sges = [sys::ibv_sge::default(); 2];
        let w = send_wr_to_ibv(&wr, ibv_sges.as_mut_ptr());
        assert_eq!(w.wr_id, 42);
        assert_eq!(w.num_sge, 2);
        assert!(w.next.is_null());
        assert_eq!(w.opcode, sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        let f = sys::ibv_send_flags::IBV_SEND_SIGNALED.0
            | sys::ibv_send_flags::IBV_SEND_SOLICITED.0
            | sys::ibv_send_flags::IBV_SEND_FENCE.0;
        assert_eq!(w.send_flags, f);
        // SAFETY: `send_wr_to_ibv` wrote the `imm_data` and `rdma` members of these unions
        // for an RDMA WRITE with immediate; reading plain integers has no invalid values.
        let (imm, rdma) = unsafe { (w.__bindgen_anon_1.imm_data, w.wr.rdma) };
        assert_eq!(u32::from_be(imm), 0xabcd);
        assert_eq!((rdma.remote_addr, rdma.rkey), (0xdead_0000, 0x55));

        let inline = SendWr { flags: SendFlags { inline: true, ..SendFlags::UNSIGNALED }, ..wr };
        assert_eq!(
            send_wr_to_ibv(&inline, std::ptr::null_mut()).send_flags,
            sys::ibv_send_flags::IBV_SEND_INLINE.0
        );
        assert_eq!(check_send_wr(&inline, 2, 12), None);
        assert_eq!(check_send_wr(&inline, 2, 11), Some("inline data longer than max_inline_data"));
        assert_eq!(check_send_wr(&wr, 1, 0), Some("too many scatter/gather entries"));
        assert_eq!(check_send_wr(&wr, 2, 0), None, "inline limit applies only to inline WRs");
    }

    #[test]
    fn access_and_mtu_and_states() {
        assert_eq!(access_to_ibv(Access::NONE), 0);
        assert_eq!(access_to_ibv(Access::LOCAL_WRITE), sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        assert_eq!(
            access_to_ibv(all),
            (sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
                .0
        );
        assert!(check_access(Access::REMOTE_WRITE).is_err());
        assert!(check_access(Access::LOCAL_WRITE | Access::REMOTE_WRITE).is_ok());

        for (m, v) in [
            (Mtu::Mtu256, sys::IBV_MTU_256),
            (Mtu::Mtu512, sys::IBV_MTU_512),
            (Mtu::Mtu1024, sys::IBV_MTU_1024),
            (Mtu::Mtu2048, sys::IBV_MTU_2048),
            (Mtu::Mtu4096, sys::IBV_MTU_4096),
        ] {
            assert_eq!(mtu_to_ibv(m), v);
            assert_eq!(mtu_from_ibv(v), Some(m));
        }
        assert_eq!(mtu_from_ibv(0), None);
        assert_eq!(mtu_from_ibv(6), None);

        use sys::ibv_port_state::*;
        assert_eq!(port_state_from_ibv(IBV_PORT_NOP), PortState::Down);
        assert_eq!(port_state_from_ibv(IBV_PORT_DOWN), PortState::Down);
        assert_eq!(port_state_from_ibv(IBV_PORT_INIT), PortState::Init);
        assert_eq!(port_state_from_ibv(IBV_PORT_ARMED), PortState::Armed);
        assert_eq!(port_state_from_ibv(IBV_PORT_ACTIVE), PortState::Active);
        assert_eq!(port_state_from_ibv(IBV_PORT_ACTIVE_DEFER), PortState::Active);

        for s in [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Err] {
            assert_eq!(qp_state_from_ibv(qp_state_to_ibv(s)), s);
        }
        assert_eq!(qp_state_from_ibv(sys::ibv_qp_state::IBV_QPS_SQD), QpState::Rts);
        assert_eq!(qp_state_from_ibv(sys::ibv_qp_state::IBV_QPS_SQE), QpState::Err);
        assert_eq!(LinkLayer::from_ibv(2), LinkLayer::Ethernet);
        assert_eq!(LinkLayer::from_ibv(1), LinkLayer::Infiniband);
        assert_eq!(LinkLayer::from_ibv(0), LinkLayer::Infiniband);
    }

    #[test]
    fn wc_conversion_reads_imm_only_with_the_flag() {
        let mut wc = sys::ibv_wc::default(); // GENERAL_ERR, per the crate
        assert_eq!(wc_from_ibv(&wc).status, WcStatus::GeneralErr);
        wc.imm_data = 7u32.to_be();
        wc.wc_flags = sys::ibv_wc_flags::IBV_WC_WITH_IMM;
        assert_eq!(wc_from_ibv(&wc).imm_data, None, "no immediate data on a failed completion");
        wc.qp_num = 0x1234;
        assert_eq!(wc_from_ibv(&wc).qp_num, 0x1234);
    }

    #[test]
    fn transitions_follow_the_state_table() {
        let init = QpModify::Init { port_num: 1, pkey_index: 0, access: Access::REMOTE_WRITE };
        assert!(check_transition(QpState::Reset, &init).is_ok());
        assert!(check_transition(QpState::Init, &init).is_ok());
        assert!(matches!(
            check_transition(QpState::Rts, &init),
            Err(FabricError::InvalidTransition { from: QpState::Rts, to: QpState::Init })
        ));
        let rts = QpModify::Rts { sq_psn: 0, timeout: 14, retry_cnt: 5, rnr_retry: 6, max_rd_atomic: 0 };
        assert!(check_transition(QpState::Init, &rts).is_err());
        assert!(check_transition(QpState::Rtr, &rts).is_ok());
        assert!(check_transition(QpState::Rts, &rts).is_ok());
        for s in [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Err] {
            assert_eq!(check_transition(s, &QpModify::Err).is_ok(), s != QpState::Reset, "{s:?} -> ERR");
            assert!(check_transition(s, &QpModify::Reset).is_ok());
        }
    }

    #[test]
    fn attr_masks_match_the_rc_state_table() {
        use sys::ibv_qp_attr_mask as M;
        let p = roce();
        let init =
            QpModify::Init { port_num: 1, pkey_index: 0, access: Access::LOCAL_WRITE | Access::REMOTE_WRITE };
        let (a, m) = modify_attr(QpState::Reset, &init, &p).unwrap();
        assert_eq!(m, M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS);
        assert_eq!((a.qp_state, a.port_num, a.pkey_index), (sys::ibv_qp_state::IBV_QPS_INIT, 1, 0));
        assert_eq!(a.qp_access_flags, 3);

        let peer = Ipv4Addr::new(10, 0, 0, 2);
        let rtr = QpModify::Rtr {
            path_mtu: Mtu::Mtu4096,
            dest_qpn: 0x1234,
            rq_psn: 0xab_cdef,
            dest: PortAddr::from_ipv4(peer),
            max_dest_rd_atomic: 0,
            min_rnr_timer: 12,
        };
        let (a, m) = modify_attr(QpState::Init, &rtr, &p).unwrap();
        assert_eq!(
            m,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER
        );
        assert_eq!(a.path_mtu, sys::IBV_MTU_1024, "lowered to the port's active MTU");
        assert_eq!(
            (a.dest_qp_num, a.rq_psn, a.max_dest_rd_atomic, a.min_rnr_timer),
            (0x1234, 0xab_cdef, 0, 12)
        );
        assert_eq!(a.ah_attr.is_global, 1);
        assert_eq!(a.ah_attr.dlid, 0);
        assert_eq!(a.ah_attr.port_num, 1);
        let g = a.ah_attr.grh;
        assert_eq!((g.sgid_index, g.hop_limit, g.traffic_class), (3, 64, 106));
        // SAFETY: `raw` is the byte view of the 16-byte GID union; every bit pattern is valid.
        assert_eq!(unsafe { g.dgid.raw }, Gid::from_ipv4(peer).0);

        let rts = QpModify::Rts { sq_psn: 77, timeout: 14, retry_cnt: 5, rnr_retry: 6, max_rd_atomic: 0 };
        let (a, m) = modify_attr(QpState::Rtr, &rts, &p).unwrap();
        assert_eq!(
            m,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC
        );
        assert_eq!((a.sq_psn, a.timeout, a.retry_cnt, a.rnr_retry, a.max_rd_atomic), (77, 14, 5, 6, 0));
        let (_, m) = modify_attr(QpState::Rts, &rts, &p).unwrap();
        assert_eq!(m, M::IBV_QP_STATE, "RTS -> RTS carries no RTS attributes");

        let (a, m) = modify_attr(QpState::Rts, &QpModify::Err, &p).unwrap();
        assert_eq!((a.qp_state, m), (sys::ibv_qp_state::IBV_QPS_ERR, M::IBV_QP_STATE));
        let (a, m) = modify_attr(QpState::Err, &QpModify::Reset, &p).unwrap();
        assert_eq!((a.qp_state, m), (sys::ibv_qp_state::IBV_QPS_RESET, M::IBV_QP_STATE));
    }

    #[test]
    fn bad_arguments_are_refused_before_the_device_sees_them() {
        let p = roce();
        let rtr = |dest_qpn, rq_psn, min_rnr_timer| QpModify::Rtr {
            path_mtu: Mtu::Mtu1024,
            dest_qpn,
            rq_psn,
            dest: PortAddr::from_ipv4(Ipv4Addr::new(10, 0, 0, 2)),
            max_dest_rd_atomic: 0,
            min_rnr_timer,
        };
        assert!(modify_attr(QpState::Init, &rtr(1, 0, 0), &p).is_err());
        assert!(modify_attr(QpState::Init, &rtr(1 << 24, 0, 0), &p).is_err());
        assert!(modify_attr(QpState::Init, &rtr(5, 1 << 24, 0), &p).is_err());
        assert!(modify_attr(QpState::Init, &rtr(5, 0, 32), &p).is_err());
        let mut zero = rtr(5, 0, 0);
        if let QpModify::Rtr { dest, .. } = &mut zero {
            *dest = PortAddr { gid: Gid::default(), lid: 0xffff };
        }
        assert!(modify_attr(QpState::Init, &zero, &p).is_err(), "RoCE needs a destination GID");
        let rts = |timeout, retry_cnt, rnr_retry| QpModify::Rts {
            sq_psn: 0,
            timeout,
            retry_cnt,
            rnr_retry,
            max_rd_atomic: 0,
        };
        assert!(modify_attr(QpState::Rtr, &rts(32, 0, 0), &p).is_err());
        assert!(modify_attr(QpState::Rtr, &rts(0, 8, 0), &p).is_err());
        assert!(modify_attr(QpState::Rtr, &rts(0, 0, 8), &p).is_err());
        let init0 = QpModify::Init { port_num: 0, pkey_index: 0, access: Access::NONE };
        assert!(modify_attr(QpState::Reset, &init0, &p).is_err());
    }

    #[test]
    fn infiniband_paths_use_the_lid_and_a_grh_only_across_subnets() {
        let p = ib();
        let mut same = p.sgid;
        same.0[15] = 9;
        let local = PortAddr { gid: same, lid: 0x12 };
        let ah = ah_attr(&local, &p).unwrap();
        assert_eq!((ah.dlid, ah.is_global, ah.sl, ah.port_num), (0x12, 0, 2, 1));
        let mut remote = same;
        remote.0[7] = 1; // another subnet prefix
        let ah = ah_attr(&PortAddr { gid: remote, lid: 0x13 }, &p).unwrap();
        assert_eq!((ah.dlid, ah.is_global, ah.grh.hop_limit), (0x13, 1, 64));
        assert!(ah_attr(&PortAddr { gid: same, lid: 0 }, &p).is_err());
        assert!(ah_attr(&PortAddr { gid: same, lid: 0xffff }, &p).is_err(), "permissive LID is not a path");
    }

    #[test]
    fn async_events_map() {
        assert_eq!(
            async_event(RawEvent::Qp(sys::IBV_EVENT_COMM_EST, 5), 1),
            Some(AsyncEvent::CommEst { qp_num: 5 })
        );
        for t in [sys::IBV_EVENT_QP_FATAL, sys::IBV_EVENT_QP_REQ_ERR, sys::IBV_EVENT_QP_ACCESS_ERR] {
            assert_eq!(async_event(RawEvent::Qp(t, 6), 1), Some(AsyncEvent::QpFatal { qp_num: 6 }));
        }
        assert_eq!(async_event(RawEvent::Qp(sys::IBV_EVENT_SQ_DRAINED, 6), 1), None);
        assert_eq!(
            async_event(RawEvent::Cq(sys::IBV_EVENT_CQ_ERR, 3), 1),
            Some(AsyncEvent::CqErr { cq_id: 3 })
        );
        assert_eq!(async_event(RawEvent::Port(sys::IBV_EVENT_PORT_ERR, 1), 1), Some(AsyncEvent::PortErr));
        assert_eq!(
            async_event(RawEvent::Port(sys::IBV_EVENT_PORT_ACTIVE, 1), 1),
            Some(AsyncEvent::PortActive)
        );
        assert_eq!(async_event(RawEvent::Port(sys::IBV_EVENT_PORT_ERR, 2), 1), None, "another port");
        assert_eq!(async_event(RawEvent::Port(sys::IBV_EVENT_LID_CHANGE, 1), 1), None);
        assert!(event_refreshes_port(RawEvent::Port(sys::IBV_EVENT_LID_CHANGE, 1), 1));
        assert!(!event_refreshes_port(RawEvent::Port(sys::IBV_EVENT_LID_CHANGE, 2), 1));
        assert_eq!(
            async_event(RawEvent::Device(sys::IBV_EVENT_DEVICE_FATAL), 1),
            Some(AsyncEvent::DeviceFatal)
        );
        assert_eq!(async_event(RawEvent::Other(sys::IBV_EVENT_SRQ_ERR), 1), None);
        assert_eq!(event_element(sys::IBV_EVENT_COMM_EST), EventElement::Qp);
        assert_eq!(event_element(sys::IBV_EVENT_CQ_ERR), EventElement::Cq);
        assert_eq!(event_element(sys::IBV_EVENT_GID_CHANGE), EventElement::Port);
        assert_eq!(event_element(sys::IBV_EVENT_DEVICE_FATAL), EventElement::Device);
        assert_eq!(event_element(sys::IBV_EVENT_WQ_FATAL), EventElement::Other);
    }

    #[test]
    fn errnos_map_to_typed_errors() {
        assert!(create_qp_error(libc::ENOMEM).is_resource());
        assert!(create_qp_error(libc::EAGAIN).is_resource());
        assert!(create_qp_error(libc::EINVAL).is_resource());
        assert!(matches!(create_qp_error(libc::EPERM), FabricError::Io { .. }));
        assert!(create_cq_error(libc::ENOMEM).is_resource());
        assert!(reg_mr_error(libc::ENOMEM).is_resource());
        assert!(matches!(reg_mr_error(libc::EINVAL), FabricError::InvalidArgument { .. }));
        assert!(matches!(modify_qp_error(libc::EINVAL), FabricError::InvalidArgument { .. }));
        assert!(matches!(modify_qp_error(libc::ETIMEDOUT), FabricError::Io { .. }));
        assert_eq!(post_errno_reason(libc::ENOMEM), "queue full");
        assert_eq!(post_errno_reason(-libc::ENOMEM), "queue full");
        assert_eq!(c_uint(-1), 0);
        assert_eq!(c_uint(5), 5);
    }
}
