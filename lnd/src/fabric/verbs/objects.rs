//! The verbs objects a [`VerbsDevice`](super::VerbsDevice) hands out: protection domains, memory regions,
//! completion queues and RC queue pairs, each owning its provider object (`ibv_pd`, `ibv_mr`,
//! `ibv_cq`, `ibv_qp`) through [`raw`](super::raw), with work requests translated to and from
//! the provider's structures.

use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use ibverbs_sys as sys;

use super::map::{LinkLayer, PERMISSIVE_LID};
use super::raw::{RawCq, RawMr, RawPd, RawQp};
use super::{Core, MrTable, POLL_BATCH, map};
use crate::fabric::{
    Access, CompletionQueue, FabricError, MemoryRegion, ProtectionDomain, QpCaps, QpModify, QpState,
    QueuePair, RecvWr, SendWr, Sge, Wc,
};

/// A protection domain (`ibv_pd`).
pub struct VerbsPd {
    pub(super) raw: Arc<RawPd>,
}

impl std::fmt::Debug for VerbsPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsPd({})", self.raw.handle())
    }
}

impl ProtectionDomain for VerbsPd {
    fn handle(&self) -> u32 {
        self.raw.handle()
    }
}

/// A registered memory region (`ibv_mr`); dropping it deregisters the memory.
pub struct VerbsMr {
    // Dropped (deregistered) after `Drop::drop` removed the lkey from the inline table.
    pub(super) _raw: RawMr,
    pub(super) core: Arc<Core>,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    pub(super) addr: u64,
    pub(super) len: usize,
    pub(super) access: Access,
}

impl std::fmt::Debug for VerbsMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsMr(lkey {:#x}, rkey {:#x}, {:#x}+{})", self.lkey, self.rkey, self.addr, self.len)
    }
}

impl MemoryRegion for VerbsMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn access(&self) -> Access {
        self.access
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        // Under the write lock: no inline post is copying from this region now, and none
        // will pass the check after this; then `raw` deregisters (field drop).
        self.core.mrs_write().remove(&self.lkey);
    }
}

/// A completion queue (`ibv_cq`) with its own completion channel.
pub struct VerbsCq {
    pub(super) raw: Arc<RawCq>,
    pub(super) id: u32,
}

impl std::fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsCq({}, {} entries)", self.id, self.raw.cqe())
    }
}

impl CompletionQueue for VerbsCq {
    fn id(&self) -> u32 {
        self.id
    }

    fn cqe(&self) -> u32 {
        self.raw.cqe()
    }

    /// Provider `poll_cq` in batches of [`POLL_BATCH`]; a provider error ends the batch (an
    /// overrun is also reported as [`AsyncEvent::CqErr`](crate::fabric::AsyncEvent::CqErr)).
    fn poll(&self, out: &mut [Wc]) -> usize {
        let mut buf = [sys::ibv_wc::default(); POLL_BATCH];
        let mut done = 0;
        while let Some(rest) = out.get_mut(done..) {
            let want = rest.len().min(POLL_BATCH);
            if want == 0 {
                break;
            }
            let got = self.raw.poll(buf.get_mut(..want).unwrap_or_default()).min(want);
            for (slot, wc) in rest.iter_mut().zip(buf.iter().take(got)) {
                *slot = map::wc_from_ibv(wc);
            }
            done += got;
            if got < want {
                break;
            }
        }
        done
    }

    fn req_notify(&self, solicited_only: bool) -> Result<(), FabricError> {
        match self.raw.req_notify(solicited_only) {
            0 => Ok(()),
            rc => Err(FabricError::io("ibv_req_notify_cq", io::Error::from_raw_os_error(rc.abs()))),
        }
    }

    fn event_fd(&self) -> RawFd {
        self.raw.channel_fd()
    }

    fn get_event(&self) -> bool {
        self.raw.get_event()
    }
}

/// An RC queue pair (`ibv_qp`); dropping it destroys the QP.
pub struct VerbsQp {
    pub(super) raw: RawQp,
    pub(super) core: Arc<Core>,
    pub(super) caps: QpCaps,
    /// The state after the last successful `modify` (used if `ibv_query_qp` fails).
    pub(super) state: Mutex<QpState>,
}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsQp({:#x})", self.raw.qp_num())
    }
}

/// The first SGE of an inline WR that no live registration covers, as a refusal reason.
pub(super) fn inline_unregistered(table: &MrTable, sges: &[Sge]) -> Option<&'static str> {
    let covered = |s: &Sge| {
        s.length == 0
            || table.get(&s.lkey).is_some_and(|&(addr, len)| {
                s.addr >= addr && s.addr.checked_add(u64::from(s.length)).is_some_and(|end| end <= addr + len)
            })
    };
    (!sges.iter().all(covered)).then_some("inline data is not in a registered region")
}

/// Index of `bad` in a chain of `n` WRs starting at `base` (0 if it is not one of them).
pub(super) fn chain_index<T>(base: *const T, bad: *const T, n: usize) -> usize {
    let size = std::mem::size_of::<T>().max(1);
    let off = (bad as usize).wrapping_sub(base as usize);
    if bad.is_null() || off % size != 0 || off / size >= n { 0 } else { off / size }
}

fn sge_to_ibv(s: &Sge) -> sys::ibv_sge {
    sys::ibv_sge { addr: s.addr, length: s.length, lkey: s.lkey }
}

impl VerbsQp {
    /// On InfiniBand, an IPv4-named destination (LID `0xffff`) becomes the learned address.
    fn translate(&self, m: &QpModify) -> Result<QpModify, FabricError> {
        match *m {
            QpModify::Rtr { dest, .. }
                if self.core.path.link == LinkLayer::Infiniband && dest.lid == PERMISSIVE_LID =>
            {
                let ip =
                    dest.gid.to_ipv4().ok_or(FabricError::InvalidArgument { what: "dest LID (0xffff)" })?;
                let learned = self.core.learned.lock().unwrap_or_else(|p| p.into_inner());
                let real = learned.get(&ip).ok_or(FabricError::NotFound {
                    what: "InfiniBand address of the peer (no side-channel frame from it yet)",
                })?;
                let mut out = *m;
                if let QpModify::Rtr { dest, .. } = &mut out {
                    *dest = real;
                }
                Ok(out)
            }
            _ => Ok(*m),
        }
    }
}

impl QueuePair for VerbsQp {
    fn qp_num(&self) -> u32 {
        self.raw.qp_num()
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    /// `ibv_query_qp` (the HCA may have moved the QP to ERR on its own).
    fn state(&self) -> QpState {
        match self.raw.query_state() {
            Ok(s) => map::qp_state_from_ibv(s),
            Err(_) => *self.state.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    fn modify(&self, m: &QpModify) -> Result<(), FabricError> {
        let from = self.state();
        map::check_transition(from, m)?;
        let m = self.translate(m)?;
        let (mut attr, mask) = map::modify_attr(from, &m, &self.core.path_now())?;
        match self.raw.modify(&mut attr, mask) {
            0 => {
                *self.state.lock().unwrap_or_else(|p| p.into_inner()) = m.target();
                Ok(())
            }
            rc => Err(map::modify_qp_error(rc.abs())),
        }
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), FabricError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let caps = self.caps;
        // Held across the post: inline data is copied by the CPU from registered memory.
        let table = wrs.iter().any(|w| w.flags.inline).then(|| self.core.mrs_read());
        let refused = wrs.iter().enumerate().find_map(|(i, wr)| {
            map::check_send_wr(wr, caps.max_send_sge, caps.max_inline_data)
                .or_else(|| {
                    if wr.flags.inline {
                        table.as_ref().and_then(|t| inline_unregistered(t, wr.sg_list))
                    } else {
                        None
                    }
                })
                .map(|reason| (i, reason))
        });
        let n = refused.map_or(wrs.len(), |(i, _)| i);
        let valid = wrs.get(..n).unwrap_or_default();
        if !valid.is_empty() {
            let mut sges: Vec<sys::ibv_sge> =
                valid.iter().flat_map(|w| w.sg_list.iter().map(sge_to_ibv)).collect();
            let sge_base = sges.as_mut_ptr();
            let mut chain: Vec<sys::ibv_send_wr> = Vec::with_capacity(n);
            let mut off = 0usize;
            for wr in valid {
                let k = wr.sg_list.len();
                let sg = if k == 0 { std::ptr::null_mut() } else { sge_base.wrapping_add(off) };
                off += k;
                chain.push(map::send_wr_to_ibv(wr, sg));
            }
            let base = chain.as_mut_ptr();
            for i in 1..n {
                // SAFETY: `i - 1` and `i` are below `n == chain.len()`; writing through the raw
                // pointer keeps `base` valid (no reference to the elements is created).
                unsafe { (*base.add(i - 1)).next = base.add(i) };
            }
            let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
            // SAFETY: `base` heads a chain of `n` initialised WRs linked above, the last with
            // next = NULL; each `sg_list` points at its `num_sge` entries inside `sges`, and
            // both vectors outlive the call and are not touched during it.
            let rc = unsafe { self.raw.post_send(base, &mut bad) };
            drop(sges);
            if rc != 0 {
                let index = chain_index(base, bad, n);
                return Err(FabricError::Post { index, reason: map::post_errno_reason(rc) });
            }
        }
        drop(table);
        match refused {
            Some((index, reason)) => Err(FabricError::Post { index, reason }),
            None => Ok(()),
        }
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), FabricError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let max_sge = self.caps.max_recv_sge as usize;
        let refused = wrs
            .iter()
            .position(|w| w.sg_list.len() > max_sge)
            .map(|i| (i, "too many scatter/gather entries"));
        let n = refused.map_or(wrs.len(), |(i, _)| i);
        let valid = wrs.get(..n).unwrap_or_default();
        if !valid.is_empty() {
            let mut sges: Vec<sys::ibv_sge> =
                valid.iter().flat_map(|w| w.sg_list.iter().map(sge_to_ibv)).collect();
            let sge_base = sges.as_mut_ptr();
            let mut chain: Vec<sys::ibv_recv_wr> = Vec::with_capacity(n);
            let mut off = 0usize;
            for wr in valid {
                let k = wr.sg_list.len();
                chain.push(sys::ibv_recv_wr {
                    wr_id: wr.wr_id,
                    next: std::ptr::null_mut(),
                    sg_list: if k == 0 { std::ptr::null_mut() } else { sge_base.wrapping_add(off) },
                    num_sge: i32::try_from(k).unwrap_or(i32::MAX),
                });
                off += k;
            }
            let base = chain.as_mut_ptr();
            for i in 1..n {
                // SAFETY: as in `post_send`.
                unsafe { (*base.add(i - 1)).next = base.add(i) };
            }
            let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
            // SAFETY: as in `post_send`: a valid, NULL-terminated chain whose SGE lists live in
            // `sges`, both alive and untouched for the duration of the call.
            let rc = unsafe { self.raw.post_recv(base, &mut bad) };
            drop(sges);
            if rc != 0 {
                let index = chain_index(base, bad, n);
                return Err(FabricError::Post { index, reason: map::post_errno_reason(rc) });
            }
        }
        match refused {
            Some((index, reason)) => Err(FabricError::Post { index, reason }),
            None => Ok(()),
        }
    }
}
