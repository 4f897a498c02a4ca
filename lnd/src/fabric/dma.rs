//! Memory a device may read and write: owned, page-aligned buffers and safe registration.
//!
//! [`DmaBuf`] owns an allocation that is only ever accessed by raw copies (never through Rust
//! references), like memory shared with an HCA: the device writes it from its own context while
//! the owner holds the buffer. Ordering between the device and the owner comes from the verbs
//! protocol (a completion, reaped under the CQ lock, means the device is done); overlapping
//! concurrent access is a race the protocol above must prevent, exactly as with real DMA.
//!
//! [`RegisteredBuf`] bundles a buffer with its memory region so that the registration can never
//! outlive the memory: the only safe way to call [`Device::reg_mr`].

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

use super::{Access, Device, FabricError, MemoryRegion, Sge};

/// Alignment of every buffer: a page, as registered memory usually is.
pub const DMA_ALIGN: usize = 4096;

/// An access outside the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("range {offset}+{len} is outside a buffer of {size} bytes")]
pub struct OutOfRange {
    /// Requested offset.
    pub offset: usize,
    /// Requested length.
    pub len: usize,
    /// Buffer size.
    pub size: usize,
}

/// An owned, zero-initialised, page-aligned buffer that devices may access.
pub struct DmaBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `DmaBuf` owns its allocation exclusively; all access goes through raw copies whose
// ordering with device access is provided by the verbs protocol (see the module docs). Moving
// it to another thread moves ownership of plain bytes.
unsafe impl Send for DmaBuf {}
// SAFETY: shared access only performs raw copies; the module docs state that overlapping
// concurrent writes are excluded by the protocol, as with memory shared with hardware.
unsafe impl Sync for DmaBuf {}

impl std::fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DmaBuf({:#x}+{})", self.addr(), self.len)
    }
}

impl DmaBuf {
    /// Allocates `len` zeroed bytes aligned to [`DMA_ALIGN`].
    ///
    /// # Panics
    /// If the allocation fails (as `Vec` does).
    pub fn new(len: usize) -> DmaBuf {
        if len == 0 {
            return DmaBuf { ptr: NonNull::<[u8; DMA_ALIGN]>::dangling().cast(), len: 0 };
        }
        let layout = Layout::from_size_align(len, DMA_ALIGN)
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(Layout::new::<u8>()));
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        DmaBuf { ptr, len }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte (what goes in an SGE or an RDMA descriptor).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// A raw pointer to the first byte, for registration.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfRange> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfRange { offset, len, size: self.len }),
        }
    }

    /// Copies bytes `offset..offset+out.len()` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfRange> {
        self.check(offset, out.len())?;
        // SAFETY: the range is inside our allocation (checked above); `out` is a separate
        // borrow, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` to bytes `offset..offset+data.len()`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfRange> {
        self.check(offset, data.len())?;
        // SAFETY: the range is inside our allocation (checked above); `data` is a separate
        // borrow. Concurrent overlapping access is excluded by the protocol (module docs).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Copies `len` bytes from `src` at `src_offset` to this buffer at `offset`.
    pub fn copy_from(
        &self,
        offset: usize,
        src: &DmaBuf,
        src_offset: usize,
        len: usize,
    ) -> Result<(), OutOfRange> {
        self.check(offset, len)?;
        src.check(src_offset, len)?;
        // SAFETY: both ranges are inside their allocations; `copy` tolerates overlap (the same
        // buffer may be both source and destination).
        unsafe { std::ptr::copy(src.ptr.as_ptr().add(src_offset), self.ptr.as_ptr().add(offset), len) };
        Ok(())
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        if self.len > 0 {
            // SAFETY: writes exactly our allocation.
            unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
        }
    }

    /// A copy of the bytes `offset..offset+len`.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, OutOfRange> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            if let Ok(layout) = Layout::from_size_align(self.len, DMA_ALIGN) {
                // SAFETY: allocated in `new` with exactly this layout and not freed before.
                unsafe { dealloc(self.ptr.as_ptr(), layout) };
            }
        }
    }
}

/// A buffer and its registration; the region is deregistered before the memory is freed.
pub struct RegisteredBuf<D: Device> {
    // Field order matters: `mr` drops (deregisters) before `buf` frees the memory.
    mr: D::Mr,
    buf: DmaBuf,
}

impl<D: Device> std::fmt::Debug for RegisteredBuf<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegisteredBuf({:?}, lkey {:#x}, rkey {:#x})", self.buf, self.mr.lkey(), self.mr.rkey())
    }
}

impl<D: Device> RegisteredBuf<D> {
    /// Allocates `len` bytes and registers them in `pd` with `access`.
    pub fn new(dev: &D, pd: &D::Pd, len: usize, access: Access) -> Result<RegisteredBuf<D>, FabricError> {
        RegisteredBuf::register(dev, pd, DmaBuf::new(len), access)
    }

    /// Registers an existing buffer.
    pub fn register(
        dev: &D,
        pd: &D::Pd,
        buf: DmaBuf,
        access: Access,
    ) -> Result<RegisteredBuf<D>, FabricError> {
        // SAFETY: the region lives inside `RegisteredBuf` next to the buffer and is dropped
        // first (field order), so the memory outlives the registration; `DmaBuf` never hands
        // out references to its bytes, only raw copies.
        let mr = unsafe { dev.reg_mr(pd, buf.as_mut_ptr(), buf.len(), access)? };
        Ok(RegisteredBuf { mr, buf })
    }

    /// The memory.
    pub fn buf(&self) -> &DmaBuf {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_are_range_checked() {
        let b = DmaBuf::new(10000);
        assert_eq!(b.addr() % DMA_ALIGN as u64, 0);
        b.write(9990, &[1; 10]).unwrap();
        assert!(b.write(9991, &[1; 10]).is_err());
        assert!(b.write(usize::MAX, &[1]).is_err());
        let mut out = [0u8; 10];
        b.read(9990, &mut out).unwrap();
        assert_eq!(out, [1; 10]);
        b.copy_from(0, &b, 9990, 10).unwrap();
        assert_eq!(b.to_vec(0, 10).unwrap(), vec![1; 10]);
        b.fill(7);
        assert_eq!(b.to_vec(5000, 2).unwrap(), vec![7, 7]);
        let empty = DmaBuf::new(0);
        assert!(empty.is_empty());
        assert!(empty.read(0, &mut []).is_ok());
    }
}
