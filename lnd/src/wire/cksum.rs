//! The o2iblnd message checksum (`kiblnd_cksum`).
//!
//! For each byte: rotate the 32-bit sum left by one, then add the byte as a C `char`, which is
//! signed on x86 (so 0x80..=0xff add 0xffff_ff80..=0xffff_ffff), wrapping. A final sum of 0
//! becomes 1, because 0 on the wire means "no checksum". The message checksum covers `ibm_nob`
//! bytes with the `ibm_cksum` field taken as zero; it never covers RDMA data.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

/// A running checksum, for data fed in pieces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cksum(u32);

impl Cksum {
    /// A checksum over no bytes yet.
    pub const fn new() -> Cksum {
        Cksum(0)
    }

    /// Feeds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        let mut sum = self.0;
        for &b in bytes {
            // `b as i8 as i32 as u32`: the sign extension a signed C `char` gets.
            sum = sum.rotate_left(1).wrapping_add(b as i8 as i32 as u32);
        }
        self.0 = sum;
    }

    /// Feeds `n` zero bytes (the checksum field itself).
    pub fn update_zeros(&mut self, n: usize) {
        for _ in 0..n {
            self.0 = self.0.rotate_left(1);
        }
    }

    /// The checksum as sent: never 0.
    pub const fn finish(self) -> u32 {
        if self.0 == 0 { 1 } else { self.0 }
    }
}

/// `kiblnd_cksum`: the checksum of `bytes`, never 0.
pub fn cksum(bytes: &[u8]) -> u32 {
    let mut c = Cksum::new();
    c.update(bytes);
    c.finish()
}

/// The checksum of a message occupying `msg` (exactly `ibm_nob` bytes), with the 4-byte
/// `ibm_cksum` field at offset 12 taken as zero. `msg` shorter than the header is summed as is.
pub(crate) fn msg_cksum(msg: &[u8]) -> u32 {
    let mut c = Cksum::new();
    match (msg.get(..12), msg.get(16..)) {
        (Some(head), Some(tail)) => {
            c.update(head);
            c.update_zeros(4);
            c.update(tail);
        }
        _ => c.update(msg),
    }
    c.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cksum_known_value_by_hand() {
        // bytes 01 80 ff, sum starts at 0:
        //   0x01: rotl(0) = 0,                   + 1          = 0x0000_0001
        //   0x80: rotl(1) = 2,   + (char)-128 = 0xffff_ff80  = 0xffff_ff82
        //   0xff: rotl(0xffff_ff82) = 0xffff_ff05, + (char)-1 = 0xffff_ffff
        //                                          -> 0xffff_ff05 + 0xffff_ffff = 0xffff_ff04
        assert_eq!(cksum(&[0x01, 0x80, 0xff]), 0xffff_ff04);
        // bytes 10 20: rotl(0)+0x10 = 0x10; rotl(0x10) = 0x20, + 0x20 = 0x40.
        assert_eq!(cksum(&[0x10, 0x20]), 0x40);
        // 0x80 alone: 0 + (char)-128 = 0xffff_ff80 (0x7f would add plain 0x7f).
        assert_eq!(cksum(&[0x80]), 0xffff_ff80);
    }

    #[test]
    fn zero_sum_becomes_one() {
        assert_eq!(cksum(&[]), 1);
        assert_eq!(cksum(&[0; 64]), 1);
        // 0x01 then 0xfe: rotl(1) = 2, + (char)-2 = 0 -> reported as 1.
        assert_eq!(cksum(&[0x01, 0xfe]), 1);
    }

    #[test]
    fn pieces_equal_whole() {
        let data: Vec<u8> = (0..=255u8).chain(0..=99).collect();
        let mut c = Cksum::new();
        c.update(&data[..100]);
        c.update(&data[100..]);
        assert_eq!(c.finish(), cksum(&data));
    }

    #[test]
    fn msg_cksum_skips_the_field() {
        let mut a = [0x5au8; 60];
        let b = a;
        a[12..16].copy_from_slice(&[1, 2, 3, 4]);
        let mut zeroed = b;
        zeroed[12..16].fill(0);
        assert_eq!(msg_cksum(&a), cksum(&zeroed));
        assert_eq!(msg_cksum(&b), cksum(&zeroed));
    }
}
