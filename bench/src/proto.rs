//! The benchmark's RPC protocol, lnet_selftest style.
//!
//! A client RPC is a small request PUT to the server's request portal; the server moves the
//! bulk data itself (brw write: it GETs from the client's buffer; brw read: it PUTs into it, as
//! lnet_selftest does) and answers with a small reply PUT to the client's reply portal, matched
//! by the RPC id. A ping is a request and a reply carrying `len` payload bytes each way.
//!
//! Requests and replies are fixed 64-byte little-endian headers followed by an optional payload.

use lnet_shim::{Buffer, OutOfRange};

/// Portal the server's request buffers are attached to.
pub const REQUEST_PORTAL: u32 = 51;
/// Portal the client's bulk buffers are attached to (match bits = the RPC's bulk bits).
pub const BULK_PORTAL: u32 = 52;
/// Portal the client's reply buffers are attached to (match bits = the RPC id).
pub const REPLY_PORTAL: u32 = 53;
/// The largest brw RPC whose data the client and the server stamp and check on the LND's
/// scheduler thread (in their event callbacks) rather than on their own threads. On a machine
/// whose cores the schedulers keep busy polling, a hop to another thread waits for one of
/// them to yield: `lnd-bench local` (`check=full`) ran brw write 4K c8 at 25,000–27,000 RPC/s
/// with both hops and about 49,000 with the client's gone (session 33).
pub const INLINE_CHECK_MAX: usize = 64 << 10;

/// Whether a brw RPC's data is handled in the event callbacks, on the LND's thread: nothing to
/// stamp or check, or at most [`INLINE_CHECK_MAX`] bytes of it (client and server both ask).
pub fn checks_inline(check: Check, size: usize) -> bool {
    check == Check::None || size <= INLINE_CHECK_MAX
}

/// Whether a brw write's sink `buf` got all `req.size` bytes (`mlength`) and carries the stamps
/// `req` names (the server checks this on either path).
pub fn write_intact(buf: &Buffer, mlength: u64, req: &Request) -> bool {
    mlength == u64::from(req.size) && verify_buffer(buf, 0, req.size as usize, req.check, req.magic)
}
/// Header size of requests and replies.
pub const HDR: usize = 64;
/// Largest ping payload. Up to 3912 bytes a ping request travels IMMEDIATE; above that LNet
/// moves it by RDMA (PUT_REQ/PUT_ACK/PUT_DONE), as it would any larger message.
pub const MAX_PING: usize = 4096;
/// Request-buffer size on the server: a header and the largest ping.
pub const REQUEST_BUF: usize = HDR + MAX_PING;

const MAGIC: u32 = 0x1b5e_1f7e;
const VERSION: u16 = 1;

/// What an RPC asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Echo `len` bytes.
    Ping,
    /// The server PUTs `size` bytes into the client's bulk buffer.
    BrwRead,
    /// The server GETs `size` bytes from the client's bulk buffer.
    BrwWrite,
    /// The server answers with its counters.
    Stats,
}

impl Op {
    fn code(self) -> u16 {
        match self {
            Op::Ping => 1,
            Op::BrwRead => 2,
            Op::BrwWrite => 3,
            Op::Stats => 4,
        }
    }

    fn from_code(c: u16) -> Option<Op> {
        match c {
            1 => Some(Op::Ping),
            2 => Some(Op::BrwRead),
            3 => Some(Op::BrwWrite),
            4 => Some(Op::Stats),
            _ => None,
        }
    }
}

/// How bulk data is stamped and checked (lnet_selftest's `check=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Check {
    /// No stamping, no checking.
    None,
    /// The first and last 8 bytes of every 4 KiB page.
    Simple,
    /// Every 8 bytes.
    Full,
}

impl Check {
    fn code(self) -> u8 {
        match self {
            Check::None => 0,
            Check::Simple => 1,
            Check::Full => 2,
        }
    }

    fn from_code(c: u8) -> Option<Check> {
        match c {
            0 => Some(Check::None),
            1 => Some(Check::Simple),
            2 => Some(Check::Full),
            _ => None,
        }
    }
}

/// A request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// What to do.
    pub op: Op,
    /// The RPC id: the reply's match bits.
    pub rpc: u64,
    /// Match bits of the client's bulk buffer.
    pub bulk_bits: u64,
    /// Bulk bytes (brw) or ping payload bytes.
    pub size: u32,
    /// Stamping and checking of the bulk data.
    pub check: Check,
    /// The value the data is stamped with.
    pub magic: u64,
}

/// A reply header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The RPC id answered.
    pub rpc: u64,
    /// 0 = done; negative errno; 1 = the server found the written data wrong.
    pub status: i32,
    /// Payload bytes after the header.
    pub len: u32,
}

/// Reply status: the data a brw write delivered failed the server's check.
pub const STATUS_CORRUPT: i32 = 1;

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn get_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn get_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Request {
    /// The 64-byte header.
    pub fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        put_u32(&mut b, 0, MAGIC);
        put_u16(&mut b, 4, VERSION);
        put_u16(&mut b, 6, self.op.code());
        put_u64(&mut b, 8, self.rpc);
        put_u64(&mut b, 16, self.bulk_bits);
        put_u32(&mut b, 24, self.size);
        b[28] = self.check.code();
        put_u64(&mut b, 32, self.magic);
        b
    }

    /// Parses a header; `None` for anything that is not a request of this protocol.
    pub fn decode(b: &[u8]) -> Option<Request> {
        if get_u32(b, 0)? != MAGIC || get_u16(b, 4)? != VERSION {
            return None;
        }
        Some(Request {
            op: Op::from_code(get_u16(b, 6)?)?,
            rpc: get_u64(b, 8)?,
            bulk_bits: get_u64(b, 16)?,
            size: get_u32(b, 24)?,
            check: Check::from_code(*b.get(28)?)?,
            magic: get_u64(b, 32)?,
        })
    }
}

impl Reply {
    /// The 64-byte header.
    pub fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        put_u32(&mut b, 0, MAGIC);
        put_u16(&mut b, 4, VERSION);
        put_u64(&mut b, 8, self.rpc);
        put_u32(&mut b, 16, self.status as u32);
        put_u32(&mut b, 20, self.len);
        b
    }

    /// Parses a header.
    pub fn decode(b: &[u8]) -> Option<Reply> {
        if get_u32(b, 0)? != MAGIC || get_u16(b, 4)? != VERSION {
            return None;
        }
        Some(Reply { rpc: get_u64(b, 8)?, status: get_u32(b, 16)? as i32, len: get_u32(b, 20)? })
    }
}

/// The 8-byte word at byte `at` of data stamped with `magic` (position-dependent, so a block
/// landing in the wrong place is caught).
fn word(magic: u64, at: usize) -> [u8; 8] {
    (magic ^ (at as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes()
}

/// Offsets of the stamped words of `len` bytes under `check`.
fn stamped(check: Check, len: usize) -> Box<dyn Iterator<Item = usize>> {
    let last = len.saturating_sub(8);
    match check {
        Check::None => Box::new(std::iter::empty()),
        Check::Full => Box::new((0..len / 8).map(|i| i * 8)),
        Check::Simple => Box::new(
            (0..len.div_ceil(4096))
                .flat_map(move |p| {
                    let start = p * 4096;
                    let end = (start + 4096).min(len).saturating_sub(8).max(start);
                    // A page of 9 to 15 bytes (the last one) has room for one word only: a
                    // second, overlapping the first, would overwrite part of it.
                    if end >= start + 8 { [start, end] } else { [start, start] }
                })
                .filter(move |&at| at <= last && len >= 8),
        ),
    }
}

/// Where the bytes after the last whole 8-byte word of `len` bytes start.
#[cfg(test)]
fn len_before_tail(len: usize) -> usize {
    len - len % 8
}

/// [`word`] as the integer [`Buffer::fill_words`] and [`Buffer::words_match`] take.
fn word_u64(magic: u64, at: usize) -> u64 {
    u64::from_le_bytes(word(magic, at))
}

/// Stamps the first `len` bytes of `buf` in place for `check` with `magic`, as `stamp`
/// stamps a slice: no copy of the data (a brw buffer is up to gigabytes).
pub fn stamp_buffer(buf: &Buffer, len: usize, check: Check, magic: u64) -> Result<(), OutOfRange> {
    match check {
        Check::None => Ok(()),
        Check::Full => buf.fill_words(0, len, |i| word_u64(magic, i * 8)),
        Check::Simple => stamped(check, len).try_for_each(|at| buf.write(at, &word(magic, at))),
    }
}

/// Whether bytes `offset..offset + len` of `buf` carry the stamps `check` and `magic` call
/// for, read in place, as `verify` reads a slice. False if the range is not in `buf`.
pub fn verify_buffer(buf: &Buffer, offset: usize, len: usize, check: Check, magic: u64) -> bool {
    match check {
        Check::None => offset.checked_add(len).is_some_and(|end| end <= buf.len()),
        Check::Full => buf.words_match(offset, len, |i| word_u64(magic, i * 8)) == Ok(true),
        Check::Simple => stamped(check, len).all(|at| {
            let mut got = [0u8; 8];
            buf.read(offset + at, &mut got).is_ok() && got == word(magic, at)
        }),
    }
}

/// Stamps `buf` (the first `len` bytes) for `check` with `magic`.
#[cfg(test)]
pub fn stamp(buf: &mut [u8], check: Check, magic: u64) {
    if check == Check::Full {
        // Every whole word, in one pass the compiler can keep in registers, then the bytes
        // after the last whole word (their word's first bytes).
        let at = len_before_tail(buf.len());
        let mut words = buf.chunks_exact_mut(8);
        for (i, w) in words.by_ref().enumerate() {
            w.copy_from_slice(&word(magic, i * 8));
        }
        let tail = words.into_remainder();
        let n = tail.len();
        tail.copy_from_slice(&word(magic, at)[..n]);
        return;
    }
    let len = buf.len();
    for at in stamped(check, len) {
        if let Some(w) = buf.get_mut(at..at + 8) {
            w.copy_from_slice(&word(magic, at));
        }
    }
}

/// Whether `buf` carries the stamps `check` and `magic` call for.
#[cfg(test)]
pub fn verify(buf: &[u8], check: Check, magic: u64) -> bool {
    if check == Check::Full {
        let words = buf.chunks_exact(8);
        let tail = words.remainder();
        let at = len_before_tail(buf.len());
        return words.enumerate().all(|(i, w)| w == word(magic, i * 8))
            && tail == &word(magic, at)[..tail.len()];
    }
    let len = buf.len();
    stamped(check, len).all(|at| buf.get(at..at + 8) == Some(&word(magic, at)[..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_refuse_garbage() {
        let r =
            Request { op: Op::BrwWrite, rpc: 7, bulk_bits: 9, size: 1 << 20, check: Check::Full, magic: 42 };
        assert_eq!(Request::decode(&r.encode()), Some(r));
        let p = Reply { rpc: 7, status: -110, len: 12 };
        assert_eq!(Reply::decode(&p.encode()), Some(p));
        assert_eq!(Request::decode(&[0u8; 64]), None);
        assert_eq!(Request::decode(&r.encode()[..20]), None);
    }

    #[test]
    fn stamps_are_checked_at_every_mode() {
        for check in [Check::Simple, Check::Full] {
            let mut b = vec![0u8; 10_000];
            stamp(&mut b, check, 5);
            assert!(verify(&b, check, 5));
            assert!(!verify(&b, check, 6), "another RPC's data fails");
            b[4095] ^= 1; // last word of page 0: stamped in both modes
            assert!(!verify(&b, check, 5), "{check:?}");
        }
        // In place in a buffer, the same stamps as in a slice, at every mode and length.
        for check in [Check::None, Check::Simple, Check::Full] {
            for len in [0usize, 5, 13, 4096, 4099, 10_000] {
                let buf = Buffer::new(10_008);
                stamp_buffer(&buf, len, check, 77).unwrap();
                let mut expect = buf.to_vec(0, len).unwrap();
                stamp(&mut expect, check, 77);
                assert_eq!(buf.to_vec(0, len).unwrap(), expect, "{check:?} {len}");
                assert!(verify_buffer(&buf, 0, len, check, 77), "{check:?} {len}");
                assert!(verify(&expect, check, 77), "{check:?} {len}");
                if check != Check::None && len >= 8 {
                    assert!(!verify_buffer(&buf, 0, len, check, 78), "{check:?} {len}: another RPC's data");
                }
            }
            assert!(!verify_buffer(&Buffer::new(16), 8, 9, check, 1), "{check:?}: past the end");
        }
        let b = vec![0u8; 100];
        assert!(verify(&b, Check::None, 1));
        let mut small = vec![0u8; 5];
        stamp(&mut small, Check::Full, 3);
        assert!(verify(&small, Check::Simple, 3));
        // Full checks every byte, the ones after the last whole word too.
        for len in [5usize, 13, 4099] {
            let mut b = vec![0u8; len];
            stamp(&mut b, Check::Full, 9);
            assert!(verify(&b, Check::Full, 9), "{len}");
            b[len - 1] ^= 1;
            assert!(!verify(&b, Check::Full, 9), "{len}: the last byte is checked");
        }
    }
}
