//! Liveness words: how a same-host responder knows that the WRITE it just copied was still
//! outstanding at the requester while it copied ([`super::place`]).
//!
//! A wire WRITE carries a snapshot of its source taken when it was sent; a placement request
//! carries only addresses, and the responder reads the source when it *executes* the request.
//! A responder that executes late (it was stopped, or simply slow, while the requester's
//! retries ran out, the work request was flushed and the application reused its buffer) would
//! copy the buffer's new contents. So every placed work request owns a liveness word in the
//! requester's memory holding a token while the request is outstanding, and the request
//! carries the word's address and the token. The responder copies the data and *then* reads
//! the word (a load from the requester's mapped arena, or `process_vm_readv`): if it still
//! holds the token, the request was outstanding the whole time the data was read, so the
//! buffer had not been handed back to the application and the copy is the snapshot a wire
//! WRITE would have carried. Otherwise the request is dropped as if its packets had been lost: no ACK, no completion, the
//! expected PSN unmoved (the requester's QP is in error by then and sends nothing more), and
//! whatever reached the target range is undefined, as after any failed RDMA WRITE.
//!
//! The requester clears the word (a release store) when the work request leaves the send
//! queue, before its completion can reach the application, under the device lock. The
//! responder's reads of the data come before its read of the word; x86's load ordering and
//! the system call boundaries keep them so.
//!
//! Words live in a process-wide pool of chunks that are never freed (in the buffer arena when
//! the process has one, so that a responder that maps it reads a word with one load), and
//! tokens come from one 64-bit counter that never repeats, so a word read late is either the
//! same request's token or something else: never an old token that matches by chance (no ABA).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Words per chunk of the pool (8 KiB).
const CHUNK: usize = 1024;

/// The process-wide pool: free words, and the next token (0 means "not outstanding").
struct Pool {
    free: Vec<&'static AtomicU64>,
    next_token: u64,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { free: Vec::new(), next_token: 1 });

/// A chunk of words: in the buffer arena when there is one (so a responder that maps the arena
/// reads a word with a load, [`super::peer_arena`]), else on the heap; never freed.
fn new_chunk() -> &'static [AtomicU64] {
    let bytes = CHUNK * std::mem::size_of::<AtomicU64>();
    match lnet_shim::arena::arena().and_then(|a| a.alloc(bytes)) {
        // SAFETY: a zeroed, page-aligned block of `bytes` bytes that is never given back to the
        // arena and that nothing else refers to; AtomicU64 has the size and (8-byte) alignment
        // the block satisfies, and zero is a valid value.
        Some(block) => unsafe { std::slice::from_raw_parts(block.as_ptr().cast::<AtomicU64>(), CHUNK) },
        None => Box::leak((0..CHUNK).map(|_| AtomicU64::new(0)).collect::<Box<[AtomicU64]>>()),
    }
}

/// The liveness word of one outstanding placed work request; dropping it clears the word.
#[derive(Debug)]
pub(crate) struct LiveWord {
    word: &'static AtomicU64,
    token: u64,
}

impl LiveWord {
    /// Takes a free word and stores a fresh token in it.
    pub(crate) fn new() -> LiveWord {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let word = match pool.free.pop() {
            Some(w) => w,
            None => {
                let chunk = new_chunk();
                let (first, rest) = chunk.split_first().expect("CHUNK > 0");
                pool.free.extend(rest.iter());
                first
            }
        };
        let token = pool.next_token;
        pool.next_token += 1;
        drop(pool);
        word.store(token, Ordering::Release);
        LiveWord { word, token }
    }

    /// Where the word is in this process, for the placement request.
    pub(crate) fn addr(&self) -> u64 {
        self.word as *const AtomicU64 as u64
    }

    /// The token the word holds while the request is outstanding.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }
}

impl Drop for LiveWord {
    fn drop(&mut self) {
        self.word.store(0, Ordering::Release);
        POOL.lock().unwrap_or_else(|e| e.into_inner()).free.push(self.word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(addr: u64) -> u64 {
        let mut out = [0u8; 8];
        crate::fabric::soft::mem::read_process(std::process::id(), addr, &mut out).unwrap();
        u64::from_ne_bytes(out)
    }

    #[test]
    fn a_word_holds_its_token_until_dropped_and_tokens_never_repeat() {
        let a = LiveWord::new();
        let b = LiveWord::new();
        assert_ne!(a.token(), b.token());
        assert_ne!(a.addr(), b.addr());
        assert_eq!(read(a.addr()), a.token());
        let (addr, token) = (a.addr(), a.token());
        drop(a);
        // Cleared, unless another test thread has already taken the free word again (the pool
        // is process-wide): either way it never holds the old token again.
        let after = read(addr);
        assert!(after == 0 || after > token, "dropped word holds {after}, its old token was {token}");
        // The word is reused with a new token: the old one never matches again.
        let words: Vec<LiveWord> = (0..2 * CHUNK).map(|_| LiveWord::new()).collect();
        assert!(words.iter().all(|w| w.token() > token && read(w.addr()) == w.token()));
        assert_eq!(read(b.addr()), b.token());
    }
}
