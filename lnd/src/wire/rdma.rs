//! RDMA descriptors (`kib_rdma_desc`): one key and 1..=257 fragments.
//!
//! On the wire: `{u32 rd_key, u32 rd_nfrags, {u32 rf_nob, u64 rf_addr}[rd_nfrags]}`, packed, in
//! the sender's byte order; each fragment is 12 bytes, so `rf_addr` is misaligned. A decoded
//! [`RdmaDesc`] borrows the fragments from the receive buffer and converts each on access; no
//! fragment array is ever copied or allocated.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::fmt;
use std::iter::FusedIterator;

use super::msg::MsgType;
use super::{ByteOrder, IBLND_MAX_RDMA_FRAGS, RDMA_DESC_HDR_SIZE, RDMA_FRAG_SIZE, WireError};

/// One fragment of an RDMA descriptor (`kib_rdma_frag`): `nob` bytes at `addr` under the
/// descriptor's key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RdmaFrag {
    /// Bytes in this fragment (`rf_nob`).
    pub nob: u32,
    /// Address of the fragment in the key's address space (`rf_addr`).
    pub addr: u64,
}

impl RdmaFrag {
    /// A fragment of `nob` bytes at `addr`.
    pub const fn new(addr: u64, nob: u32) -> RdmaFrag {
        RdmaFrag { nob, addr }
    }
}

/// `kiblnd_rd_size`: the total bytes of `frags`, or `None` if the sum does not fit in a `u32`
/// (no LNet message is that large, so treat it as a protocol error).
pub fn rd_size(frags: &[RdmaFrag]) -> Option<u32> {
    frags.iter().try_fold(0u32, |sum, f| sum.checked_add(f.nob))
}

/// A fragment as laid out on the wire: 12 bytes, alignment 1.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct RawFrag {
    nob: [u8; 4],
    addr: [u8; 8],
}

/// The fixed part of a descriptor on the wire.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RawRdHdr {
    key: [u8; 4],
    nfrags: [u8; 4],
}

const _: () = assert!(size_of::<RawFrag>() == RDMA_FRAG_SIZE);
const _: () = assert!(size_of::<RawRdHdr>() == RDMA_DESC_HDR_SIZE);

impl RawFrag {
    fn get(&self, order: ByteOrder) -> RdmaFrag {
        RdmaFrag { nob: order.get_u32(self.nob), addr: order.get_u64(self.addr) }
    }
}

#[derive(Clone, Copy)]
enum Frags<'a> {
    /// Fragments the caller holds in native form (to encode).
    Native(&'a [RdmaFrag]),
    /// Fragments still in a received buffer, in the sender's order.
    Wire { raw: &'a [RawFrag], order: ByteOrder },
}

/// An RDMA descriptor (`kib_rdma_desc`): a key and its fragments, either decoded in place from
/// a received message (see [`unpack`](super::unpack)) or wrapping caller-held fragments for
/// encoding ([`RdmaDesc::new`]). Two descriptors are equal when their key and fragment values
/// are, whatever backs them.
#[derive(Clone, Copy)]
pub struct RdmaDesc<'a> {
    key: u32,
    frags: Frags<'a>,
}

impl<'a> RdmaDesc<'a> {
    /// A descriptor over caller-held fragments (the count is checked when it is encoded).
    pub const fn new(key: u32, frags: &'a [RdmaFrag]) -> RdmaDesc<'a> {
        RdmaDesc { key, frags: Frags::Native(frags) }
    }

    /// The memory key for every fragment (`rd_key`): the sink's rkey in PUT_ACK and GET_REQ.
    pub const fn key(&self) -> u32 {
        self.key
    }

    /// The number of fragments (`rd_nfrags`).
    pub const fn nfrags(&self) -> usize {
        match self.frags {
            Frags::Native(f) => f.len(),
            Frags::Wire { raw, .. } => raw.len(),
        }
    }

    /// Fragment `i`, in native order; `None` past the end.
    pub fn frag(&self, i: usize) -> Option<RdmaFrag> {
        match self.frags {
            Frags::Native(f) => f.get(i).copied(),
            Frags::Wire { raw, order } => raw.get(i).map(|r| r.get(order)),
        }
    }

    /// The fragments in order, converted to native order on the fly.
    pub fn iter(&self) -> RdmaFrags<'a> {
        RdmaFrags { frags: self.frags }
    }

    /// `kiblnd_rd_size`: total bytes described, `None` if the sum overflows a `u32`.
    pub fn size(&self) -> Option<u32> {
        self.iter().try_fold(0u32, |sum, f| sum.checked_add(f.nob))
    }

    /// Bytes the descriptor occupies on the wire: 8 + 12 per fragment.
    pub const fn wire_size(&self) -> usize {
        RDMA_DESC_HDR_SIZE + RDMA_FRAG_SIZE * self.nfrags()
    }
}

impl PartialEq for RdmaDesc<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.nfrags() == other.nfrags() && self.iter().eq(other.iter())
    }
}

impl Eq for RdmaDesc<'_> {}

impl fmt::Debug for RdmaDesc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaDesc")
            .field("key", &format_args!("{:#x}", self.key))
            .field("nfrags", &self.nfrags())
            .field("frags", &DebugFrags(self))
            .finish()
    }
}

struct DebugFrags<'r, 'a>(&'r RdmaDesc<'a>);

impl fmt::Debug for DebugFrags<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl<'a> IntoIterator for &RdmaDesc<'a> {
    type Item = RdmaFrag;
    type IntoIter = RdmaFrags<'a>;

    fn into_iter(self) -> RdmaFrags<'a> {
        self.iter()
    }
}

/// Iterator over an [`RdmaDesc`]'s fragments, in native order.
#[derive(Clone)]
pub struct RdmaFrags<'a> {
    frags: Frags<'a>,
}

impl Iterator for RdmaFrags<'_> {
    type Item = RdmaFrag;

    fn next(&mut self) -> Option<RdmaFrag> {
        match &mut self.frags {
            Frags::Native(f) => {
                let (first, rest) = f.split_first()?;
                *f = rest;
                Some(*first)
            }
            Frags::Wire { raw, order } => {
                let (first, rest) = raw.split_first()?;
                *raw = rest;
                Some(first.get(*order))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match self.frags {
            Frags::Native(f) => f.len(),
            Frags::Wire { raw, .. } => raw.len(),
        };
        (n, Some(n))
    }
}

impl DoubleEndedIterator for RdmaFrags<'_> {
    fn next_back(&mut self) -> Option<RdmaFrag> {
        match &mut self.frags {
            Frags::Native(f) => {
                let (last, rest) = f.split_last()?;
                *f = rest;
                Some(*last)
            }
            Frags::Wire { raw, order } => {
                let (last, rest) = raw.split_last()?;
                *raw = rest;
                Some(last.get(*order))
            }
        }
    }
}

impl ExactSizeIterator for RdmaFrags<'_> {}

impl FusedIterator for RdmaFrags<'_> {}

/// Decodes the descriptor at the start of `rd` (the message bytes from the descriptor to
/// `ibm_nob`), as `kiblnd_unpack_rd` does: 0 < nfrags <= 257, and the fragments inside `nob`.
/// `offset` is where the descriptor starts in the message, for the error's byte counts.
pub(crate) fn parse_rd<'a>(
    rd: &'a [u8],
    order: ByteOrder,
    msg_type: MsgType,
    offset: usize,
) -> Result<RdmaDesc<'a>, WireError> {
    let nob = u32::try_from(offset.saturating_add(rd.len())).unwrap_or(u32::MAX);
    let (hdr, frags) = rd.split_at_checked(RDMA_DESC_HDR_SIZE).ok_or(WireError::BodyTooShort {
        msg_type,
        nob,
        need: offset + RDMA_DESC_HDR_SIZE,
    })?;
    let hdr: &RawRdHdr = bytemuck::try_from_bytes(hdr).map_err(|_| WireError::BodyTooShort {
        msg_type,
        nob,
        need: offset + RDMA_DESC_HDR_SIZE,
    })?;
    let key = order.get_u32(hdr.key);
    let nfrags = order.get_u32(hdr.nfrags);
    let n = usize::try_from(nfrags).unwrap_or(usize::MAX);
    if n == 0 || n > IBLND_MAX_RDMA_FRAGS {
        return Err(WireError::BadNfrags { msg_type, nfrags });
    }
    // n <= 257, so this cannot overflow.
    let need = n * RDMA_FRAG_SIZE;
    let past = WireError::FragsPastNob { msg_type, nfrags, nob, need: offset + RDMA_DESC_HDR_SIZE + need };
    let frags = frags.get(..need).ok_or(past)?;
    let raw: &[RawFrag] = bytemuck::try_cast_slice(frags).map_err(|_| past)?;
    Ok(RdmaDesc { key, frags: Frags::Wire { raw, order } })
}

/// Writes `rd` at the start of `dst` in `order`; returns the bytes written. Fails if the
/// descriptor has no fragments or more than 257, or `dst` is too small.
pub(crate) fn write_rd(dst: &mut [u8], rd: &RdmaDesc<'_>, order: ByteOrder) -> Result<usize, WireError> {
    let n = rd.nfrags();
    if n == 0 || n > IBLND_MAX_RDMA_FRAGS {
        return Err(WireError::FragCount { count: n });
    }
    let size = rd.wire_size();
    let have = dst.len();
    let too_small = WireError::BufferTooSmall { need: size, have };
    let (hdr, frags) =
        dst.get_mut(..size).ok_or(too_small)?.split_at_mut_checked(RDMA_DESC_HDR_SIZE).ok_or(too_small)?;
    let hdr: &mut RawRdHdr = bytemuck::try_from_bytes_mut(hdr).map_err(|_| too_small)?;
    hdr.key = order.put_u32(rd.key);
    // n <= 257 fits a u32.
    hdr.nfrags = order.put_u32(n as u32);
    let raw: &mut [RawFrag] = bytemuck::try_cast_slice_mut(frags).map_err(|_| too_small)?;
    for (r, f) in raw.iter_mut().zip(rd.iter()) {
        r.nob = order.put_u32(f.nob);
        r.addr = order.put_u64(f.addr);
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> Vec<RdmaFrag> {
        (0..n).map(|i| RdmaFrag::new(0x1000_0000_0000 + (i as u64) * 4096, 4096 - i as u32)).collect()
    }

    #[test]
    fn write_then_parse_both_orders() {
        for order in [ByteOrder::Little, ByteOrder::Big] {
            for n in [1, 2, 17, IBLND_MAX_RDMA_FRAGS] {
                let frags = sample(n);
                let rd = RdmaDesc::new(0xabcd_0123, &frags);
                let mut buf = vec![0u8; rd.wire_size()];
                assert_eq!(write_rd(&mut buf, &rd, order).unwrap(), 8 + 12 * n);
                let back = parse_rd(&buf, order, MsgType::PutAck, 64).unwrap();
                assert_eq!(back, rd);
                assert_eq!(back.key(), 0xabcd_0123);
                assert_eq!(back.nfrags(), n);
                assert_eq!(back.frag(n - 1), Some(frags[n - 1]));
                assert_eq!(back.frag(n), None);
                assert_eq!(back.iter().len(), n);
                assert!(back.iter().rev().eq(frags.iter().rev().copied()));
                assert_eq!(back.size(), rd_size(&frags));
            }
        }
    }

    #[test]
    fn byte_layout_is_packed_and_misaligned() {
        let frags = [RdmaFrag::new(0x1122_3344_5566_7788, 0x99aa_bbcc)];
        let rd = RdmaDesc::new(0x0102_0304, &frags);
        let mut le = [0u8; 20];
        write_rd(&mut le, &rd, ByteOrder::Little).unwrap();
        #[rustfmt::skip]
        let want_le = [
            0x04, 0x03, 0x02, 0x01,                         // rd_key
            0x01, 0x00, 0x00, 0x00,                         // rd_nfrags = 1
            0xcc, 0xbb, 0xaa, 0x99,                         // rf_nob
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // rf_addr at offset 12
        ];
        assert_eq!(le, want_le);
        let mut be = [0u8; 20];
        write_rd(&mut be, &rd, ByteOrder::Big).unwrap();
        #[rustfmt::skip]
        let want_be = [
            0x01, 0x02, 0x03, 0x04,
            0x00, 0x00, 0x00, 0x01,
            0x99, 0xaa, 0xbb, 0xcc,
            0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
        ];
        assert_eq!(be, want_be);
    }

    #[test]
    fn sizes_are_checked() {
        let big = [RdmaFrag::new(0, u32::MAX), RdmaFrag::new(0, 1)];
        assert_eq!(rd_size(&big), None);
        assert_eq!(RdmaDesc::new(0, &big).size(), None);
        let ok = [RdmaFrag::new(0, u32::MAX - 1), RdmaFrag::new(0, 1)];
        assert_eq!(rd_size(&ok), Some(u32::MAX));
        assert_eq!(rd_size(&[]), Some(0));
    }

    #[test]
    fn bad_counts_and_short_buffers() {
        let mut buf = vec![0u8; 8 + 12 * 258];
        let none = RdmaDesc::new(1, &[]);
        assert_eq!(write_rd(&mut buf, &none, ByteOrder::Little), Err(WireError::FragCount { count: 0 }));
        let many = sample(258);
        assert_eq!(
            write_rd(&mut buf, &RdmaDesc::new(1, &many), ByteOrder::Little),
            Err(WireError::FragCount { count: 258 })
        );
        let two = sample(2);
        assert_eq!(
            write_rd(&mut buf[..31], &RdmaDesc::new(1, &two), ByteOrder::Little),
            Err(WireError::BufferTooSmall { need: 32, have: 31 })
        );
        // nfrags says 3 but only 2 are present.
        write_rd(&mut buf, &RdmaDesc::new(1, &two), ByteOrder::Little).unwrap();
        buf[4] = 3;
        assert_eq!(
            parse_rd(&buf[..32], ByteOrder::Little, MsgType::GetReq, 128),
            Err(WireError::FragsPastNob { msg_type: MsgType::GetReq, nfrags: 3, nob: 160, need: 172 })
        );
    }
}
