//! A fast hasher for the small integer keys of per-message lookups.
//!
//! LNet and the LND look up a table or two for every message (MD and message handles, queue
//! pair numbers, RDMA cookies, peers), keyed by integers or addresses. std's default SipHash-1-3
//! costs more than the rest of such a lookup: `perf` put it at about 9% of a scheduler thread's
//! time at 200,000 messages a second. [`FastMap`] hashes with one folded 64×64→128-bit multiply
//! per word instead (the construction of `foldhash` and `ahash`'s fallback).
//!
//! Peers choose some of these keys (cookies, match bits, NIDs), so the hash is keyed: every
//! process draws a random seed from std's [`RandomState`], and the same key hashes differently
//! in each process. This resists precomputed collision sets, not an attacker who can watch the
//! table's timing; for these tables that is the same bargain `foldhash` makes.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// A [`HashMap`] with [`FastState`].
pub type FastMap<K, V> = HashMap<K, V, FastState>;

/// Multiplier: the fractional digits of pi (odd, no structure in its bits).
const MUL: u64 = 0x243f_6a88_85a3_08d3;

/// The high and low halves of the full product, folded together.
#[inline]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The process's seed, drawn once.
fn process_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| RandomState::new().hash_one(0x6c6e_6574_u64) | 1)
}

/// Builds [`FastHasher`]s with this process's seed.
#[derive(Clone, Copy, Debug)]
pub struct FastState {
    seed: u64,
}

impl Default for FastState {
    fn default() -> FastState {
        FastState { seed: process_seed() }
    }
}

impl BuildHasher for FastState {
    type Hasher = FastHasher;

    #[inline]
    fn build_hasher(&self) -> FastHasher {
        FastHasher { acc: self.seed }
    }
}

/// The hasher: one folded multiply per 64-bit word written.
#[derive(Clone, Copy, Debug)]
pub struct FastHasher {
    acc: u64,
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            // The length in the top byte: [1] and [1, 0] differ.
            self.write_u64(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.acc = folded_multiply(self.acc ^ i, MUL);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.acc
    }
}

#[cfg(test)]
mod tests {
    use std::hash::Hash;

    use super::*;

    fn hash<T: Hash>(s: &FastState, v: T) -> u64 {
        s.hash_one(v)
    }

    #[test]
    fn equal_keys_hash_equal_and_the_map_works() {
        let s = FastState::default();
        assert_eq!(hash(&s, 42u32), hash(&s, 42u32));
        assert_eq!(hash(&s, [1u8, 2, 3]), hash(&s, [1u8, 2, 3]));
        let mut m: FastMap<u64, u64> = FastMap::default();
        for i in 0..10_000u64 {
            m.insert(i.wrapping_mul(0x1_0000_0001), i);
        }
        for i in 0..10_000u64 {
            assert_eq!(m.get(&i.wrapping_mul(0x1_0000_0001)), Some(&i));
        }
        assert_eq!(m.len(), 10_000);
    }

    /// Sequential and strided keys (QP numbers, cookies stepping by 2, slab indices) spread
    /// over the low bits hashbrown indexes by and the top 7 bits it tags with.
    #[test]
    fn structured_keys_spread_over_low_and_high_bits() {
        let s = FastState::default();
        for stride in [1u64, 2, 8, 4096, 1 << 32] {
            let mut low = [0u32; 256];
            let mut high = [0u32; 128];
            for i in 0..65_536u64 {
                let h = hash(&s, i * stride);
                low[(h & 0xff) as usize] += 1;
                high[(h >> 57) as usize] += 1;
            }
            // 256 (512) per bucket on average; a poor hash leaves buckets empty or doubled.
            assert!(low.iter().all(|&c| (128..=384).contains(&c)), "stride {stride}: low bits {low:?}");
            assert!(high.iter().all(|&c| (256..=768).contains(&c)), "stride {stride}: high bits {high:?}");
        }
    }

    #[test]
    fn byte_strings_of_different_lengths_differ() {
        let s = FastState::default();
        let mut h1 = s.build_hasher();
        h1.write(&[1]);
        let mut h2 = s.build_hasher();
        h2.write(&[1, 0]);
        assert_ne!(h1.finish(), h2.finish());
    }

    #[test]
    fn one_seed_per_process() {
        assert_eq!(FastState::default().seed, FastState::default().seed);
        assert_ne!(process_seed(), 0);
    }
}
