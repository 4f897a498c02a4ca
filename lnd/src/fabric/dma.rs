//! Registering memory safely.
//!
//! Memory a device may write is a [`Buffer`] (from `lnet-shim`): owned, page-aligned, accessed
//! only by raw copies, like memory shared with an HCA. [`RegisteredBuf`] bundles a buffer with
//! its memory region so that the registration can never outlive the memory: the safe way to call
//! [`Device::reg_mr`] for the LND's own pools. Buffers that belong to LNet are registered through
//! their own registration cache ([`register_cached`]).

pub use lnet_shim::buffer::{BUFFER_ALIGN, Buffer, OutOfRange, RegKeys};

use super::{Access, Device, FabricError, MemoryRegion, Sge};

/// A buffer and its registration; the region is deregistered before the memory is freed.
pub struct RegisteredBuf<D: Device> {
    // Field order matters: `mr` drops (deregisters) before `buf` frees the memory.
    mr: D::Mr,
    buf: Buffer,
}

impl<D: Device> std::fmt::Debug for RegisteredBuf<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegisteredBuf({:?}, lkey {:#x}, rkey {:#x})", self.buf, self.mr.lkey(), self.mr.rkey())
    }
}

impl<D: Device> RegisteredBuf<D> {
    /// Allocates `len` bytes and registers them in `pd` with `access`.
    pub fn new(dev: &D, pd: &D::Pd, len: usize, access: Access) -> Result<RegisteredBuf<D>, FabricError> {
        RegisteredBuf::register(dev, pd, Buffer::new(len), access)
    }

    /// Registers an existing buffer.
    pub fn register(
        dev: &D,
        pd: &D::Pd,
        buf: Buffer,
        access: Access,
    ) -> Result<RegisteredBuf<D>, FabricError> {
        // SAFETY: the region lives inside `RegisteredBuf` next to the buffer and is dropped
        // first (field order), so the memory outlives the registration; `Buffer` never hands
        // out references to its bytes, only raw copies.
        let mr = unsafe { dev.reg_mr(pd, buf.as_mut_ptr(), buf.len(), access)? };
        Ok(RegisteredBuf { mr, buf })
    }

    /// The memory.
    pub fn buf(&self) -> &Buffer {
        &self.buf
    }

    /// The registration.
    pub fn mr(&self) -> &D::Mr {
        &self.mr
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// Address of byte `offset`.
    pub fn addr_at(&self, offset: usize) -> u64 {
        self.buf.addr() + offset as u64
    }

    /// An SGE covering `len` bytes at `offset` (not range-checked: the device checks).
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge { addr: self.addr_at(offset), length: len, lkey: self.mr.lkey() }
    }
}

/// The registration-cache slot of `owner`'s registrations with `access`: one per (device/PD,
/// access), so a buffer that is only ever an RDMA source is never remotely writable, whatever
/// else the same buffer was registered for. `owner` ids are small counters (below 2^56).
pub fn cache_slot(owner: u64, access: Access) -> u64 {
    (owner << 8) | u64::from(access.bits() & 0xff)
}

/// The keys `owner` registered `buf` under in `pd` with exactly `access`, registering it on
/// first use (the registration cache: a buffer is registered once per device/PD and access,
/// and deregistered when the buffer is dropped).
pub fn register_cached<D: Device>(
    dev: &D,
    pd: &D::Pd,
    owner: u64,
    buf: &Buffer,
    access: Access,
) -> Result<RegKeys, FabricError> {
    buf.registration(cache_slot(owner, access), |ptr, len| {
        // SAFETY: the region is stored in the buffer's registration cache, which `Buffer`
        // drops before freeing the memory, so the memory outlives the registration; the buffer
        // never hands out references to its bytes, only raw copies.
        let mr = unsafe { dev.reg_mr(pd, ptr, len, access)? };
        let keys = RegKeys { lkey: mr.lkey(), rkey: mr.rkey() };
        Ok((Box::new(mr) as Box<dyn std::any::Any + Send + Sync>, keys))
    })
}
