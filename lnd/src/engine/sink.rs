//! Sinks: the RDMA descriptor a PUT_ACK or GET_REQ carries, and the registration behind its key.
//!
//! A sink's fragments must lie in one buffer (o2iblnd maps a sink into one region, one key).
//! Its registration grants the peer REMOTE_WRITE, and how long that grant lasts is the
//! `fmr_cache` tunable:
//!
//! * `fmr_cache=1` (the default, o2iblnd's): the buffer's registration is cached for the
//!   buffer's life ([`crate::fabric::dma::register_cached`]), one per buffer and access. The
//!   key stays valid after the transfer: a peer holding it (a late or buggy WRITE) can still
//!   write the buffer, anywhere in it, until LNet drops the buffer.
//! * `fmr_cache=0`: every transfer registers exactly the bytes its descriptor names, and the
//!   region is deregistered when the transfer ends (the PUT_DONE or GET_DONE arrived, or it
//!   failed), *before* LNet hears of the end and may reuse the buffer. A WRITE with that key
//!   afterwards, or past the named bytes, fails at the target with `REM_ACCESS_ERR` and
//!   touches nothing, as o2iblnd's per-transfer FRWR keys do once invalidated. Each transfer
//!   costs a registration and a deregistration: a table entry on the software device, an
//!   `ibv_reg_mr`/`ibv_dereg_mr` (a system call, pinning) on the verbs backend.

use std::any::Any;
use std::sync::Arc;

use lnet_shim::buffer::Buffer;
use lnet_shim::event::Errno;
use lnet_shim::lnd::{Frag, Health, LndError};

use super::send::SINK_ACCESS;
use super::{Engine, err};
use crate::fabric::{Device, MemoryRegion};
use crate::wire::RdmaFrag;

/// A sink's registration for one transfer, type-erased so a [`super::tx::Tx`] can hold it;
/// dropping it deregisters the region.
pub(crate) type TransferReg = Box<dyn Any + Send + Sync>;

/// A region registered for one transfer, and the buffer it lies in.
struct OneTransfer<M> {
    // Field order matters: `mr` drops (deregisters) before the buffer may be freed.
    _mr: M,
    _buf: Arc<Buffer>,
}

/// What a sink's descriptor says, and the registration that backs its key when it was made for
/// this transfer alone.
pub(crate) struct SinkRd {
    pub(crate) key: u32,
    pub(crate) frags: Vec<RdmaFrag>,
    pub(crate) reg: Option<TransferReg>,
}

impl<D: Device> Engine<D> {
    /// The RDMA descriptor for the first `nob` bytes of `frags`: one key for all fragments, so
    /// every fragment must lie in the same buffer (else `-EINVAL`).
    pub(super) fn sink_rd(&mut self, frags: &[Frag], nob: usize) -> Result<SinkRd, LndError> {
        let mut rd = Vec::new();
        let mut buf: Option<&Arc<Buffer>> = None;
        let mut left = nob;
        for f in frags {
            if left == 0 {
                break;
            }
            if f.len == 0 {
                continue;
            }
            if f.len > u32::MAX as usize {
                return Err(err(Errno::EMSGSIZE, Health::LocalError));
            }
            if !f.is_valid() {
                return Err(err(Errno::EINVAL, Health::LocalError));
            }
            if buf.is_some_and(|b| !Arc::ptr_eq(b, &f.buf)) {
                return Err(err(Errno::EINVAL, Health::LocalError));
            }
            buf = Some(&f.buf);
            let n = f.len.min(left);
            rd.push(RdmaFrag { nob: n as u32, addr: f.buf.addr() + f.offset as u64 });
            left -= n;
        }
        if rd.len() > crate::wire::IBLND_MAX_RDMA_FRAGS {
            return Err(err(Errno::EMSGSIZE, Health::LocalError));
        }
        let Some(buf) = buf else {
            // A descriptor has 1..=257 fragments: an empty sink is one empty fragment, and
            // nothing may be written through its key.
            let addr = frags.first().map_or(0, |f| f.buf.addr() + f.offset as u64);
            return Ok(SinkRd { key: 0, frags: vec![RdmaFrag { nob: 0, addr }], reg: None });
        };
        if self.cfg.tunables.fmr_cache {
            let keys = self.keys_of(buf, SINK_ACCESS)?;
            return Ok(SinkRd { key: keys.rkey, frags: rd, reg: None });
        }
        // Exactly the bytes named: from the lowest fragment start to the highest end.
        let lo = rd.iter().map(|f| f.addr).min().unwrap_or(0);
        let hi = rd.iter().map(|f| f.addr + u64::from(f.nob)).max().unwrap_or(lo);
        let offset = (lo - buf.addr()) as usize;
        // SAFETY: `lo..hi` lies inside `buf` (every fragment was checked with `is_valid`); the
        // region is kept in `OneTransfer` next to a reference to the buffer and dropped first
        // (field order), so the memory outlives the registration; `Buffer` hands out no
        // references to its bytes, only raw copies.
        let mr = unsafe {
            self.dev.reg_mr(&self.pd, buf.as_mut_ptr().add(offset), (hi - lo) as usize, SINK_ACCESS)
        }
        .map_err(|_| err(Errno::ENOMEM, Health::LocalError))?;
        self.stats.sink_registrations += 1;
        let key = mr.rkey();
        let reg: TransferReg = Box::new(OneTransfer { _mr: mr, _buf: buf.clone() });
        Ok(SinkRd { key, frags: rd, reg: Some(reg) })
    }
}
