//! Connections (`kib_conn`): one RC QP, its CQ, its receive buffers and its credit state.
//!
//! QP sizing follows o2iblnd (seed 003, LU-12901): `max_send_wr = (1 + max_frags) × Q` (clamped
//! so it fits `max_qp_wr`), `max_recv_wr = 2Q + 2`, `max_send_sge = wrq_sge`, one receive SGE,
//! the CQ holds both queues (a device that gives a smaller CQ than asked gets a smaller Q); when
//! the device lacks the resources for the QP, Q is decremented and creation retried until it
//! succeeds or Q would drop below 2. The 2Q + 2 receive buffers of
//! 4 KiB live in one registered region and are posted before the connection is offered.

use lnet_shim::lnd::LndError;
use lnet_shim::nid::Nid;
use slab::Slab;

use super::tx::{MAX_CONN_KEY, WrKind, rx_index, wr_id};
use crate::cm::manager::ConnId;
use crate::credits::Credits;
use crate::fabric::dma::RegisteredBuf;
use crate::fabric::{
    Access, CompletionQueue, Device, FabricError, QpCaps, QpInitAttr, QpModify, QueuePair, RecvWr,
};
use crate::time::Instant;
use crate::wire::IBLND_MSG_SIZE;

/// Connection state (`IBLND_CONN_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnState {
    /// Active side: REQ sent, waiting for the REP.
    ActiveConnect,
    /// Passive side: REP sent, waiting for the RTU (or COMM_EST).
    PassiveWait,
    /// Messages flow.
    Established,
    /// Closing: the QP is in ERR; waiting for every posted work request to come back.
    Closing,
}

impl ConnState {
    /// Still being set up: the CM exchange has not finished.
    pub(crate) fn is_setting_up(self) -> bool {
        matches!(self, ConnState::ActiveConnect | ConnState::PassiveWait)
    }
}

/// One connection.
pub(crate) struct Conn<D: Device> {
    pub(crate) generation: u32,
    pub(crate) peer: Nid,
    pub(crate) state: ConnState,
    pub(crate) active: bool,
    pub(crate) cm_id: Option<ConnId>,
    // Field order: the QP goes before its CQ and its receive buffers.
    pub(crate) qp: D::Qp,
    pub(crate) cq: D::Cq,
    pub(crate) rx: RegisteredBuf<D>,
    /// Receives posted and not completed.
    pub(crate) posted_rx: u32,
    /// Signaled sends posted and not completed.
    pub(crate) sending: u32,
    pub(crate) credits: Credits<usize>,
    /// Queue depth the QP was sized for, then the negotiated one.
    pub(crate) queue_depth: u32,
    pub(crate) max_frags: u16,
    pub(crate) peer_incarnation: u64,
    pub(crate) my_psn: u32,
    /// The peer's QP number, once known.
    pub(crate) remote_qpn: u32,
    pub(crate) last_send: Instant,
    /// When connecting must be over.
    pub(crate) connect_deadline: Instant,
    /// Transmits posted on this connection that have not finished.
    pub(crate) active_txs: Vec<usize>,
    /// Receives that completed before the connection was established.
    pub(crate) early_rx: Vec<(u32, u32)>,
    pub(crate) close_error: Option<LndError>,
    /// When a closing connection is destroyed even if work requests never came back.
    pub(crate) zombie_deadline: Instant,
    /// Whether a NOOP is owed but no descriptor was free to carry it.
    pub(crate) noop_starved: bool,
    /// Whether the CQ was armed and its notification not consumed yet (see `engine::cq`).
    pub(crate) cq_armed: bool,
    /// Whether the CQ is on the engine's list of CQs polled on every turn.
    pub(crate) cq_polled: bool,
    /// When the CQ last gave a completion.
    pub(crate) cq_busy: Instant,
}

/// What creating a connection needs.
pub(crate) struct ConnSpec {
    pub(crate) peer: Nid,
    pub(crate) key: usize,
    pub(crate) generation: u32,
    pub(crate) queue_depth: u32,
    pub(crate) max_frags: u16,
    pub(crate) wrq_sge: u32,
    pub(crate) active: bool,
    pub(crate) my_psn: u32,
    pub(crate) connect_deadline: Instant,
}

/// Send work requests a connection of depth `q` needs (`kiblnd_send_wrs`).
pub(crate) fn send_wrs(q: u32, max_frags: u16) -> u32 {
    (1 + u32::from(max_frags)).saturating_mul(q)
}

/// Creates the CQ, the QP (shrinking Q on resource errors), the receive buffers; moves the QP
/// to INIT and posts every receive.
pub(crate) fn create<D: Device>(dev: &D, pd: &D::Pd, spec: ConnSpec) -> Result<Conn<D>, FabricError> {
    if spec.key > MAX_CONN_KEY {
        return Err(FabricError::Resource { what: "connection slots" });
    }
    let attr = dev.query_device();
    let mut q = spec.queue_depth.max(1);
    // o2iblnd: if the send queue would exceed max_qp_wr, Q = max_qp_wr / multiplier.
    let mult = 1 + u32::from(spec.max_frags);
    if send_wrs(q, spec.max_frags) > attr.max_qp_wr {
        q = (attr.max_qp_wr / mult).max(1);
    }
    let cq_entries = |q: u32| send_wrs(q, spec.max_frags).saturating_add(2 * q + 2);
    let cq = dev.create_cq(cq_entries(q))?;
    // A device may clamp the CQ to its `max_cqe`: then Q shrinks until both queues fit in it, or
    // the flushes of a failing connection would overrun the CQ (CQ_ERR kills every QP on it).
    while cq_entries(q) > cq.cqe() && q >= 2 {
        q -= 1;
    }
    if cq_entries(q) > cq.cqe() {
        return Err(FabricError::Resource { what: "completion queue entries" });
    }
    let qp = loop {
        let cap = QpCaps {
            max_send_wr: send_wrs(q, spec.max_frags),
            max_recv_wr: 2 * q + 2,
            max_send_sge: spec.wrq_sge.max(1),
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        match dev.create_qp(pd, &cq, &cq, &QpInitAttr { cap, sq_sig_all: false }) {
            Ok(qp) => break qp,
            Err(e) if e.is_resource() && q >= 2 => q -= 1,
            Err(e) => return Err(e),
        }
    };
    let nrx = 2 * q + 2;
    let rx = RegisteredBuf::new(dev, pd, nrx as usize * IBLND_MSG_SIZE, Access::LOCAL_WRITE)?;
    // The port the device drives: a QP bound to another port of a multi-port HCA would send
    // from that port with this one's GID index.
    let port_num = dev.query_port().port_num;
    qp.modify(&QpModify::Init { port_num, pkey_index: 0, access: Access::REMOTE_WRITE })?;
    let mut conn = Conn {
        generation: spec.generation,
        peer: spec.peer,
        state: if spec.active { ConnState::ActiveConnect } else { ConnState::PassiveWait },
        active: spec.active,
        cm_id: None,
        qp,
        cq,
        rx,
        posted_rx: 0,
        sending: 0,
        credits: Credits::new(q, q, q / 2),
        queue_depth: q,
        max_frags: spec.max_frags,
        peer_incarnation: 0,
        my_psn: spec.my_psn,
        remote_qpn: 0,
        last_send: Instant::ZERO,
        connect_deadline: spec.connect_deadline,
        active_txs: Vec::new(),
        early_rx: Vec::new(),
        close_error: None,
        zombie_deadline: Instant::FAR_FUTURE,
        noop_starved: false,
        cq_armed: false,
        cq_polled: false,
        cq_busy: Instant::ZERO,
    };
    for i in 0..nrx {
        conn.post_rx(spec.key, i)?;
    }
    Ok(conn)
}

impl<D: Device> Conn<D> {
    /// Posts receive buffer `i` (`kiblnd_post_rx`).
    pub(crate) fn post_rx(&mut self, key: usize, i: u32) -> Result<(), FabricError> {
        let sge = self.rx.sge(i as usize * IBLND_MSG_SIZE, IBLND_MSG_SIZE as u32);
        let wr = RecvWr { wr_id: wr_id(WrKind::Rx, self.generation, rx_index(key, i)), sg_list: &[sge] };
        self.qp.post_recv(&[wr])?;
        self.posted_rx += 1;
        Ok(())
    }

    /// Whether every posted work request has come back.
    pub(crate) fn is_quiet(&self) -> bool {
        self.posted_rx == 0 && self.sending == 0
    }
}

/// The connections among `keys` (a peer's `conns`, which also holds those being set up and
/// those closing until their flushes are reaped) that are established, in order.
pub(crate) fn established<'a, D: Device>(
    conns: &'a Slab<Conn<D>>,
    keys: &'a [usize],
) -> impl Iterator<Item = (usize, &'a Conn<D>)> + 'a {
    keys.iter()
        .filter_map(move |&k| Some((k, conns.get(k)?)))
        .filter(|(_, c)| c.state == ConnState::Established)
}
