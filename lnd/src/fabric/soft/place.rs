//! The same-host single-copy path: RDMA WRITEs between two ports on one host move their
//! payload with one copy, straight from the requester's memory into the target's registered
//! region, never through sockets.
//!
//! # Design: the responder pulls
//! The requester does not cut such a WRITE into payload packets. It sends one small vendor
//! request, [`Opcode::RcPlacedWrite`](super::packet::Opcode::RcPlacedWrite) (0xF0, `+Imm`
//! 0xF1), in the QP's normal RC stream: BTH + RETH (remote address, R_Key, length) + ImmDt if
//! any, and a payload (`PlacedWrite`) with the requester's identity nonce, the number of PSNs
//! the request takes, and its gather list as virtual addresses of the requester's process. The
//! request takes exactly the PSNs the WRITE would take on the wire, so it is ordered,
//! acknowledged, retransmitted and duplicate-suppressed like any request, and the wire path can
//! take over from any PSN.
//!
//! The responder handles it in PSN order, under its device lock, like the first packet of a
//! wire WRITE: QP access, then key, PD, REMOTE_WRITE and the whole range against its MR table
//! (a failure is the same remote access NAK, `REM_ACCESS_ERR` at the requester, not a byte
//! written), and then copies the data with one `process_vm_readv` from the requester's process
//! into the checked range (`MrTable::write_from_process` in [`super::mem`]). The check and the copy
//! happen under the lock deregistration takes, so the region cannot go away in between. The
//! requester's buffers stay valid until the WRITE completes, which needs the ACK, which is sent
//! only after the copy. A SEND after the WRITE has a later PSN, so its data is in place first.
//! A duplicate of an executed request is re-acknowledged and not copied again.
//!
//! # Who the requester is: the trust argument
//! The requester's pid is never taken from a packet. Each UDP device with the path on
//! publishes a registry entry ([`super::registry`]) under a per-user directory (mode 0700,
//! owned by the user, checked before use) named by its `ip-port`: pid, boot id, the process
//! start time and a random 64-bit nonce. The responder looks up the entry of the packet's
//! *source* address, and uses it only if it is on this boot, the process with that pid still has
//! that start time, and the nonce equals the one in the request (so a restarted peer is looked
//! up again). Only loopback addresses (127/8) on both ends take this path: the kernel drops
//! packets from outside with a loopback source, and a loopback source port is held by the
//! socket of the process that published the entry (binding it again fails), so an entry names
//! the process that sent the request. Only a process of the same user can write the registry.
//! Whatever the entry says, the kernel makes the final check: `process_vm_readv` needs
//! `PTRACE_MODE_ATTACH` over the requester (same user, and Yama's `ptrace_scope` allowing it).
//! The responder only *reads* the requester, and only *writes* the range its own MR table
//! allowed, so a lying requester can at worst have its own memory copied into a region it was
//! entitled to write anyway.
//!
//! # Falling back
//! When the responder cannot place (the kernel says `EPERM`, `ENOSYS` or `ESRCH`, no usable
//! registry entry, or the path is off on its side) it answers with the vendor NAK code
//! [`NakCode::PlacementRefused`](super::packet::NakCode::PlacementRefused) at the request's PSN
//! and does not move its expected PSN. The requester then sends everything from that PSN again
//! on the wire (no retry is spent) and never places on that QP again; its device stops placing
//! to that address. A kernel refusal is reported once per peer on stderr. Other copy failures
//! (`EFAULT`: the requester named memory it does not have) are a remote operational error.
//!
//! # In one process
//! On the simulated wire every device lives in one process: a port's identity is the own pid
//! and a nonce derived from its address, and the same code copies with `process_vm_readv` on
//! the own pid, so the deterministic simulations exercise the real path, with loss,
//! reordering and duplication of the vendor requests.
//!
//! # A late responder: the liveness check
//! The responder reads the source when it *executes* the request, not when the requester sent
//! it. A responder that executes late (it was stopped, SIGSTOP, while the requester's retries
//! ran out, the work request was flushed and the application reused its buffer) would copy the
//! buffer's new contents, where a wire WRITE carries the snapshot taken at send time. So each
//! placed work request owns a liveness word in the requester's process (`super::live`),
//! holding a token until the WQE leaves the send queue (before its completion is pushed out);
//! the request carries the word's address and token. After the copy the responder reads the
//! word: if it still holds the token, the request was outstanding for the whole copy and the
//! data is the snapshot; otherwise the request is dropped like a lost packet (no ACK, no
//! completion, the expected PSN unmoved, `FabricStats::placed_stale` counts it).
//!
//! # Choosing the path
//! [`SoftConfig::single_copy`](super::SoftConfig::single_copy): [`SingleCopy::Auto`] (the
//! default) places whenever the peer is on the same host; [`SingleCopy::Off`] always uses the
//! wire (and refuses placement requests); [`SingleCopy::Syscall`] places but always copies with
//! `process_vm_readv`. The environment variable `LND_SOFT_SINGLE_COPY=0` (or `off`) makes the
//! default `Off`, and `=syscall` makes it `Syscall`, so whole suites can run on each path.
//! `FabricStats::placed_sent`, `placed_writes` and `placed_bytes` count what took the path,
//! `placed_mapped` the copies made from a mapped arena.
//!
//! # The copy: from a mapped arena, or `process_vm_readv`
//! A process's LNet buffers live in its buffer arena ([`lnet_shim::arena`]), a sealed `memfd`
//! its registry entry names. The first request whose source lies in a sender's arena maps it
//! read-only ([`super::peer_arena`]); from then on a request whose every gather entry (and
//! liveness word) lies inside the mapping is copied with `memcpy`: no system call, no page
//! pinning. Anything else (memory outside the arena, an arena that cannot be mapped) is
//! copied with `process_vm_readv` as before; the trust argument is the same, since opening
//! `/proc/<pid>/fd/<fd>` needs the same ptrace permission. Mappings of senders whose process
//! went away or restarted are dropped within a few seconds of device activity
//! (`Placement::forget_departed`), so they do not keep a departed process's memory alive.
//!
//! # A copy left running
//! A mapped copy of 256 KiB or more may be left running on the device's copy engine
//! ([`super::copier`], `Started::Running`) while the device returns to its caller, as an HCA's
//! DMA engine runs while the CPU goes on. The request is then neither accepted nor refused:
//! its QP keeps its expected PSN, no ACK and no completion is made, and the device receives no
//! frame at all until its next `progress` call, which starts by concluding it
//! (`Placement::conclude`: the rest of the copy on that thread, then the liveness word, then
//! accept or refuse as for a copy made on the spot). So the SEND behind the WRITE still finds
//! every byte in place, and nothing is NAKed out of sequence meanwhile. The memory stays valid
//! while the copy runs: the checked region because deregistering any memory the copy writes
//! finishes it first (`Placement::drain_into`, under the device lock), the source mapping because senders are
//! not forgotten and no other request is executed until the conclusion. A QP that leaves
//! RTR/RTS meanwhile drops the request, as it would drop a packet.
//!
//! Not placed: inline WRITEs (their data already sits in the work request), zero-length WRITEs,
//! and anything to a port on another host.

use std::net::Ipv4Addr;
use std::time::Duration;

use lnet_shim::hash::FastMap;

use super::copier::{Copier, CopyHelper, Started};
use super::mem::{self, MemFault, MrTable, PlaceFault};
use super::peer_arena::PeerArena;
use super::streaming::{self, Streaming};
use super::wire::Wire;
use crate::time::Instant;

/// Which path same-host RDMA WRITEs take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SingleCopy {
    /// Place WRITEs to ports on the same host with one copy; the wire otherwise. The copy is a
    /// `memcpy` from the requester's mapped buffer arena when the source lies in it
    /// ([`super::peer_arena`]), else `process_vm_readv`.
    Auto,
    /// As `Auto`, but every copy uses `process_vm_readv` (no peer arena is mapped).
    Syscall,
    /// Always the wire.
    Off,
}

impl SingleCopy {
    /// The default: `Auto`, unless `LND_SOFT_SINGLE_COPY` is `0`, `off`, `false` or `wire`
    /// (`Off`) or `syscall` (`Syscall`). Any other value but `1`, `on`, `true` and `auto` is
    /// reported once on stderr and means `Auto`.
    pub fn from_env() -> SingleCopy {
        super::setting_from_env(
            "LND_SOFT_SINGLE_COPY",
            SingleCopy::parse,
            "1, auto, 0, off, wire or syscall",
            || SingleCopy::Auto,
        )
    }

    /// The mode a value of `LND_SOFT_SINGLE_COPY` asks for (`None` or empty: unset, `Auto`);
    /// `None` for a value that names no mode.
    pub fn parse(value: Option<&str>) -> Option<SingleCopy> {
        match value.map(str::trim) {
            None | Some("" | "1" | "on" | "true" | "auto") => Some(SingleCopy::Auto),
            Some("0" | "off" | "false" | "wire") => Some(SingleCopy::Off),
            Some("syscall") => Some(SingleCopy::Syscall),
            Some(_) => None,
        }
    }
}

/// A process on this host owning a port of the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPeer {
    /// Its process id.
    pub pid: u32,
    /// A random identity of the port's device, carried in its placement requests.
    pub nonce: u64,
    /// The process's buffer arena, which a responder may map ([`super::peer_arena`]).
    pub arena: Option<lnet_shim::arena::ArenaInfo>,
}

/// Fixed part of a [`PlacedWrite`] payload: nonce (8), PSN count (4), entries (2), zero (2),
/// liveness word address (8) and token (8) ([`super::live`]).
pub(crate) const PLACED_HEADER_LEN: usize = 32;
/// One gather entry: address (8), length (4), zero (4).
pub(crate) const PLACED_SGE_LEN: usize = 16;
/// Most gather entries a placement request may carry.
pub(crate) const MAX_PLACED_SGES: usize = 64;
/// The smallest path MTU: a request may take at most the PSNs its WRITE would take at it.
const MIN_MTU: u64 = 256;

/// Why a placement request's payload was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlacedError {
    /// The payload is not `16 + 16 × entries` bytes, or has more than [`MAX_PLACED_SGES`].
    Length,
    /// The entries do not add up to the RETH length, or the PSN count does not fit it.
    Mismatch,
    /// The liveness token is 0 (no outstanding request has it).
    NoLiveness,
}

/// The payload of a placement request, decoded and checked against its RETH length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PlacedWrite {
    /// The requester's nonce (its registry entry must carry the same).
    pub(crate) nonce: u64,
    /// PSNs the request takes (what its WRITE takes on the wire).
    pub(crate) psn_count: u32,
    /// The requester's liveness word of this request: (address in its process, token).
    pub(crate) live: (u64, u64),
    /// The requester's gather list: (address in its process, length).
    pub(crate) sges: Vec<(u64, u64)>,
}

impl PlacedWrite {
    /// Decodes `payload`; `dma_len` is the RETH length the entries must add up to.
    pub(crate) fn parse(payload: &[u8], dma_len: u32) -> Result<PlacedWrite, PlacedError> {
        let short = PlacedError::Length;
        let (nonce, r) = payload.split_first_chunk::<8>().ok_or(short)?;
        let (count, r) = r.split_first_chunk::<4>().ok_or(short)?;
        let (entries, r) = r.split_first_chunk::<2>().ok_or(short)?;
        let (_zero, r) = r.split_first_chunk::<2>().ok_or(short)?;
        let (live_addr, r) = r.split_first_chunk::<8>().ok_or(short)?;
        let live_token = r.first_chunk::<8>().ok_or(short)?;
        let (nonce, live_addr, live_token) =
            (u64::from_be_bytes(*nonce), u64::from_be_bytes(*live_addr), u64::from_be_bytes(*live_token));
        let psn_count = u32::from_be_bytes(*count);
        let entries = usize::from(u16::from_be_bytes(*entries));
        let body = payload.get(PLACED_HEADER_LEN..).ok_or(PlacedError::Length)?;
        if entries > MAX_PLACED_SGES || body.len() != entries * PLACED_SGE_LEN {
            return Err(PlacedError::Length);
        }
        let mut sges = Vec::with_capacity(entries);
        let mut total = 0u64;
        for e in body.chunks_exact(PLACED_SGE_LEN) {
            let (a, rest) = e.split_first_chunk::<8>().ok_or(PlacedError::Length)?;
            let l = rest.first_chunk::<4>().ok_or(PlacedError::Length)?;
            let len = u64::from(u32::from_be_bytes(*l));
            total = total.checked_add(len).ok_or(PlacedError::Mismatch)?;
            sges.push((u64::from_be_bytes(*a), len));
        }
        let max_psns = u64::from(dma_len).div_ceil(MIN_MTU).max(1);
        if total != u64::from(dma_len) || psn_count == 0 || u64::from(psn_count) > max_psns {
            return Err(PlacedError::Mismatch);
        }
        if live_token == 0 {
            return Err(PlacedError::NoLiveness);
        }
        Ok(PlacedWrite { nonce, psn_count, live: (live_addr, live_token), sges })
    }

    /// The payload length for `entries` gather entries.
    pub(crate) fn len_for(entries: usize) -> usize {
        PLACED_HEADER_LEN + entries * PLACED_SGE_LEN
    }

    /// Writes the payload into `out` (exactly [`PlacedWrite::len_for`] bytes); false if it does
    /// not fit or there are too many entries. `live` is the liveness word's (address, token).
    pub(crate) fn emit(
        nonce: u64,
        psn_count: u32,
        live: (u64, u64),
        sges: &[(u64, u32)],
        out: &mut [u8],
    ) -> bool {
        if sges.len() > MAX_PLACED_SGES || out.len() != PlacedWrite::len_for(sges.len()) {
            return false;
        }
        let (head, body) = out.split_at_mut(PLACED_HEADER_LEN);
        let entries = (sges.len() as u16).to_be_bytes();
        let mut h = [0u8; PLACED_HEADER_LEN];
        let fields = nonce
            .to_be_bytes()
            .into_iter()
            .chain(psn_count.to_be_bytes())
            .chain(entries)
            .chain([0, 0])
            .chain(live.0.to_be_bytes())
            .chain(live.1.to_be_bytes());
        for (d, s) in h.iter_mut().zip(fields) {
            *d = s;
        }
        head.copy_from_slice(&h);
        for (chunk, (addr, len)) in body.chunks_exact_mut(PLACED_SGE_LEN).zip(sges) {
            let mut e = [0u8; PLACED_SGE_LEN];
            for (d, s) in e.iter_mut().zip(addr.to_be_bytes().iter().chain(&len.to_be_bytes())) {
                *d = *s;
            }
            chunk.copy_from_slice(&e);
        }
        true
    }
}

/// Why the responder did not place a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unplaced {
    /// Not possible with this peer: NAK `PlacementRefused`, the requester uses the wire.
    Refused,
    /// The MR check failed: remote access error.
    Access,
    /// The copy failed for another reason (bad requester addresses): remote operational error.
    Fault,
    /// The request was no longer outstanding at the requester when the copy ended (its
    /// liveness word had changed, [`super::live`]): dropped like a lost packet.
    Stale,
}

#[derive(Debug)]
enum Sender {
    /// Copies from this process work (as far as we know); its arena, once mapped.
    Known(LocalPeer, ArenaMap),
    /// The kernel refused: the wire for this peer from now on.
    Refused,
}

/// A sender's buffer arena ([`super::peer_arena`]).
#[derive(Debug)]
enum ArenaMap {
    /// Not tried yet (mapped at the first request whose source lies in it).
    Untried,
    Mapped(PeerArena),
    /// It has none, or it could not be mapped: `process_vm_readv` for everything.
    Unavailable,
}

/// How a placed WRITE was copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Copied {
    /// `memcpy` from the requester's mapped arena.
    Mapped,
    /// `process_vm_readv`.
    Syscall,
}

/// What [`Placement::place`] did with a request it accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placing {
    /// The copy is made and the request was live throughout.
    Done(Copied),
    /// The copy is running on the copy engine ([`super::copier`]); [`Placement::conclude`]
    /// tells how it ends.
    Running,
}

/// The placed WRITE whose copy is running: where it came from and its liveness word.
#[derive(Clone, Copy, Debug)]
struct RunningPlace {
    src: Ipv4Addr,
    live: (u64, u64),
    /// The bytes it writes: address and length.
    dst: (u64, u64),
}

/// How often departed senders are looked for (`Placement::forget_departed`).
const DEPARTED_CHECK: Duration = Duration::from_secs(5);

/// A device's single-copy state: its mode and identity, where it may place, and whom it can
/// copy from.
#[derive(Debug)]
pub(crate) struct Placement {
    name: String,
    mode: SingleCopy,
    own: Option<LocalPeer>,
    /// Requester side: destinations and whether WRITEs to them are placed.
    routes: FastMap<Ipv4Addr, bool>,
    /// Responder side: sources and their processes.
    senders: FastMap<Ipv4Addr, Sender>,
    /// When departed senders were last looked for.
    checked: Instant,
    /// Test hook: the next copies fail with this errno.
    forced_errno: Option<i32>,
    /// Copies from mapped arenas, large ones on two cores.
    copier: Copier,
    /// The request whose copy is running, if any (at most one).
    running: Option<RunningPlace>,
}

impl Placement {
    pub(crate) fn new(
        name: &str,
        mode: SingleCopy,
        own: Option<LocalPeer>,
        copy_helper: CopyHelper,
        helper_spin: Duration,
        streaming: Streaming,
        virtual_clock: bool,
    ) -> Placement {
        let copier = Copier::new(copy_helper, helper_spin, streaming, streaming::cache_budget());
        Placement {
            name: name.to_owned(),
            mode,
            own,
            routes: FastMap::default(),
            senders: FastMap::default(),
            checked: Instant::ZERO,
            forced_errno: None,
            copier: if virtual_clock { copier.timing_free() } else { copier },
            running: None,
        }
    }

    /// Placed WRITEs whose copy the copy engine's helper thread shared.
    pub(crate) fn copies_split(&self) -> u64 {
        self.copier.helped()
    }

    /// Placed WRITEs whose copy was left running on the copy engine while the device went on.
    pub(crate) fn copies_run(&self) -> u64 {
        self.copier.started_running()
    }

    /// Whether the running copy, if any, has finished (a look; never waits).
    pub(crate) fn copy_done(&mut self) -> bool {
        self.copier.is_done()
    }

    /// Puts every byte of the running copy in place, waiting for it, if it writes anywhere in
    /// `addr..addr + len` (the device calls it under its lock before deregistering that
    /// memory); a copy into other memory runs on. The request's outcome is still left for
    /// [`Placement::conclude`].
    pub(crate) fn drain_into(&mut self, addr: u64, len: u64) {
        let overlaps = self.running.as_ref().is_some_and(|r| {
            let (at, n) = r.dst;
            at < addr.saturating_add(len) && addr < at.saturating_add(n)
        });
        if overlaps {
            self.copier.finish();
        }
    }

    /// Ends the running copy, waiting for it (and copying what is left) if need be, and
    /// judges it as [`Placement::place`] judges a copy it made itself: `None` if none was
    /// running.
    pub(crate) fn conclude(&mut self) -> Option<Result<Copied, Unplaced>> {
        let run = self.running.take()?;
        self.copier.finish();
        // The senders do not change while a copy runs (no request is executed and departed
        // senders are not looked for), so the entry that started it is there.
        let Some(Sender::Known(peer, arena)) = self.senders.get(&run.src) else {
            return Some(Err(Unplaced::Fault));
        };
        let peer = *peer;
        let word = match arena {
            ArenaMap::Mapped(m) => m.load_word(run.live.0),
            _ => None,
        };
        let word = match word {
            Some(word) => Ok(word),
            None => read_word(peer.pid, run.live.0).map_err(PlaceFault::Os),
        };
        Some(self.judge(run.src, &peer, word.map(|w| (Copied::Mapped, w)), run.live.1))
    }

    /// Placed WRITEs copied with streaming (cache-bypassing) stores.
    pub(crate) fn copies_streamed(&self) -> u64 {
        self.copier.streamed()
    }

    pub(crate) fn force_errno(&mut self, errno: Option<i32>) {
        self.forced_errno = errno;
    }

    /// Requester side: the nonce to send in placement requests to `dst`, or `None` if WRITEs
    /// to it go by the wire.
    pub(crate) fn route<W: Wire + ?Sized>(&mut self, wire: &W, dst: Ipv4Addr) -> Option<u64> {
        let own = self.own.filter(|_| self.mode != SingleCopy::Off)?;
        let place = *self.routes.entry(dst).or_insert_with(|| wire.lookup_peer(dst).is_some());
        place.then_some(own.nonce)
    }

    /// Requester side: `dst` refused a placement; WRITEs to it go by the wire from now on.
    pub(crate) fn refused_by(&mut self, dst: Ipv4Addr) {
        self.routes.insert(dst, false);
    }

    /// Responder side: copies the WRITE `w` from `src` into `len` bytes at `va` under `rkey`
    /// (checked again against `mem` for PD `pd` and REMOTE_WRITE).
    #[allow(clippy::too_many_arguments, reason = "a request, its source and its target range")]
    pub(crate) fn place<W: Wire + ?Sized>(
        &mut self,
        wire: &W,
        src: Ipv4Addr,
        w: &PlacedWrite,
        mem: &MrTable,
        pd: u32,
        rkey: u32,
        va: u64,
        len: u64,
    ) -> Result<Placing, Unplaced> {
        debug_assert!(self.running.is_none(), "a request executed while a copy runs");
        if self.mode == SingleCopy::Off || self.own.is_none() {
            return Err(Unplaced::Refused);
        }
        let fresh = match self.senders.get(&src) {
            Some(Sender::Refused) => return Err(Unplaced::Refused),
            Some(Sender::Known(p, _)) => p.nonce != w.nonce,
            None => true,
        };
        if fresh {
            // Unknown, or restarted: look it up again; the entry must carry the request's nonce.
            let p = wire.lookup_peer(src).filter(|p| p.nonce == w.nonce).ok_or(Unplaced::Refused)?;
            self.senders.insert(src, Sender::Known(p, ArenaMap::Untried));
        }
        let Some(Sender::Known(peer, arena)) = self.senders.get_mut(&src) else {
            return Err(Unplaced::Refused);
        };
        let peer = *peer;
        let forced = self.forced_errno;
        let map = self.mode == SingleCopy::Auto;
        let copier = &mut self.copier;
        // The copy, then the liveness word: Ok(how it was copied, the word as read), or
        // Ok(None) when the copy runs on.
        let copied = (|| {
            if let Some(errno) = forced {
                return Err(PlaceFault::Os(std::io::Error::from_raw_os_error(errno)));
            }
            let mapped = map.then(|| mapped_sources(arena, &peer, w)).flatten();
            let how = match &mapped {
                Some((_, sources)) => {
                    // SAFETY: every source was found wholly inside the sender's arena mapping,
                    // which stays in `self.senders` until the copy is done (a running copy
                    // keeps `forget_departed` away and no request runs until it is concluded);
                    // the device finishes a running copy before deregistering any memory it
                    // writes (`Placement::drain_into`).
                    let started = unsafe { mem.write_from_sources(pd, rkey, va, len, sources, copier) }
                        .map_err(PlaceFault::Mem)?;
                    if started == Started::Running {
                        return Ok(None);
                    }
                    Copied::Mapped
                }
                None => {
                    mem.write_from_process(pd, rkey, va, len, peer.pid, &w.sges)?;
                    Copied::Syscall
                }
            };
            // A word outside the mapping is read with `process_vm_readv`; the kernel may refuse
            // that (Yama allows the mapping but not the read), which is a refusal, not staleness.
            let word = match mapped.and_then(|(m, _)| m.load_word(w.live.0)) {
                Some(word) => word,
                None => read_word(peer.pid, w.live.0).map_err(PlaceFault::Os)?,
            };
            Ok(Some((how, word)))
        })();
        match copied {
            Ok(None) => {
                self.running = Some(RunningPlace { src, live: w.live, dst: (va, len) });
                Ok(Placing::Running)
            }
            Ok(Some(done)) => self.judge(src, &peer, Ok(done), w.live.1).map(Placing::Done),
            Err(e) => self.judge(src, &peer, Err(e), w.live.1).map(Placing::Done),
        }
    }

    /// The outcome of a copy from `src` (`peer`) that ended as `copied` (how, and the liveness
    /// word read after it), the request's token being `token`.
    fn judge(
        &mut self,
        src: Ipv4Addr,
        peer: &LocalPeer,
        copied: Result<(Copied, u64), PlaceFault>,
        token: u64,
    ) -> Result<Copied, Unplaced> {
        match copied {
            // The data was read before the word: if the word still holds the token, the request
            // was outstanding (its buffer not yet handed back) for the whole copy.
            Ok((how, word)) if word == token => Ok(how),
            Ok(_) => Err(Unplaced::Stale),
            Err(PlaceFault::Mem(
                MemFault::BadKey | MemFault::WrongPd | MemFault::Access | MemFault::Range,
            )) => Err(Unplaced::Access),
            Err(PlaceFault::Os(e))
                if matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS | libc::ESRCH)) =>
            {
                self.senders.insert(src, Sender::Refused);
                eprintln!(
                    "lnd: {}: single-copy from {src} (pid {}) is not possible: process_vm_readv: {e}; \
                     RDMA WRITEs from this peer use the wire (buffers outside its arena, or no arena)",
                    self.name, peer.pid
                );
                Err(Unplaced::Refused)
            }
            Err(PlaceFault::Os(_)) => Err(Unplaced::Fault),
        }
    }

    /// Responder side: at most every few seconds (by `now`), forgets the senders whose port now
    /// belongs to no process or to another one, unmapping their arenas (a mapping would keep a
    /// departed process's buffer memory alive).
    pub(crate) fn forget_departed<W: Wire + ?Sized>(&mut self, wire: &W, now: Instant) {
        if self.senders.is_empty()
            || self.running.is_some()
            || now.saturating_duration_since(self.checked) < DEPARTED_CHECK
        {
            return;
        }
        self.checked = now;
        self.senders.retain(|&src, s| match s {
            Sender::Known(p, _) => {
                wire.lookup_peer(src).is_some_and(|q| q.pid == p.pid && q.nonce == p.nonce)
            }
            Sender::Refused => true,
        });
    }

    /// Responder side: how many senders' arenas are mapped.
    pub(crate) fn mapped_arenas(&self) -> usize {
        self.senders.values().filter(|s| matches!(s, Sender::Known(_, ArenaMap::Mapped(_)))).count()
    }
}

/// The word at `addr` in process `pid`, read with `process_vm_readv`.
fn read_word(pid: u32, addr: u64) -> std::io::Result<u64> {
    let mut word = [0u8; 8];
    mem::read_process(pid, addr, &mut word).map(|()| u64::from_ne_bytes(word))
}

/// The sources of `w` in `peer`'s mapped arena (mapping it first if not tried yet), or `None`
/// if any part lies outside it or there is no mapping.
fn mapped_sources<'a>(
    arena: &'a mut ArenaMap,
    peer: &LocalPeer,
    w: &PlacedWrite,
) -> Option<(&'a PeerArena, Vec<(*const u8, u64)>)> {
    if let ArenaMap::Untried = arena {
        let info = peer.arena?;
        // Only worth it if this request's sources are in the arena.
        info.offset_of(w.sges.first()?.0, w.sges.first()?.1)?;
        *arena = match PeerArena::open(peer.pid, info) {
            Ok(m) => ArenaMap::Mapped(m),
            Err(e) => {
                eprintln!(
                    "lnd: cannot map the buffer arena of pid {}: {e}; copies from it use process_vm_readv",
                    peer.pid
                );
                ArenaMap::Unavailable
            }
        };
    }
    let ArenaMap::Mapped(m) = arena else { return None };
    let sources = w.sges.iter().map(|&(a, l)| m.source(a, l).map(|p| (p, l))).collect::<Option<Vec<_>>>()?;
    Some((m, sources))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placed_write_round_trip_and_hostile_payloads() {
        let sges = [(0x1000u64, 4096u32), (0xdead_beef_0000, 100)];
        let mut buf = vec![0u8; PlacedWrite::len_for(2)];
        assert!(PlacedWrite::emit(7, 2, (0x5000, 9), &sges, &mut buf));
        let w = PlacedWrite::parse(&buf, 4196).unwrap();
        assert_eq!(
            w,
            PlacedWrite {
                nonce: 7,
                psn_count: 2,
                live: (0x5000, 9),
                sges: vec![(0x1000, 4096), (0xdead_beef_0000, 100)]
            }
        );
        // Lengths that do not add up, PSN counts out of range, truncation, trailing bytes.
        assert_eq!(PlacedWrite::parse(&buf, 4195), Err(PlacedError::Mismatch));
        let mut zero = buf.clone();
        zero[8..12].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(PlacedWrite::parse(&zero, 4196), Err(PlacedError::Mismatch));
        let mut many = buf.clone();
        many[8..12].copy_from_slice(&18u32.to_be_bytes());
        assert_eq!(PlacedWrite::parse(&many, 4196), Err(PlacedError::Mismatch));
        for n in 0..buf.len() {
            assert!(PlacedWrite::parse(&buf[..n], 4196).is_err());
        }
        let mut long = buf.clone();
        long.push(0);
        assert_eq!(PlacedWrite::parse(&long, 4196), Err(PlacedError::Length));
        let mut lots = vec![0u8; PlacedWrite::len_for(MAX_PLACED_SGES + 1)];
        lots[12..14].copy_from_slice(&((MAX_PLACED_SGES + 1) as u16).to_be_bytes());
        assert_eq!(PlacedWrite::parse(&lots, 0), Err(PlacedError::Length));
        // Entries near u32::MAX each cannot overflow the sum.
        let big = [(0u64, u32::MAX); MAX_PLACED_SGES];
        let mut buf = vec![0u8; PlacedWrite::len_for(big.len())];
        assert!(PlacedWrite::emit(1, 1, (0, 1), &big, &mut buf));
        assert_eq!(PlacedWrite::parse(&buf, u32::MAX), Err(PlacedError::Mismatch));
        assert!(!PlacedWrite::emit(1, 1, (0, 1), &sges, &mut [0u8; 3]));
        // A request without a liveness token is refused.
        let mut dead = vec![0u8; PlacedWrite::len_for(2)];
        assert!(PlacedWrite::emit(7, 2, (0x5000, 0), &sges, &mut dead));
        assert_eq!(PlacedWrite::parse(&dead, 4196), Err(PlacedError::NoLiveness));
    }

    #[test]
    fn the_environment_switch() {
        for (v, mode) in [
            (None, Some(SingleCopy::Auto)),
            (Some(""), Some(SingleCopy::Auto)),
            (Some("1"), Some(SingleCopy::Auto)),
            (Some("auto"), Some(SingleCopy::Auto)),
            (Some("wire"), Some(SingleCopy::Off)),
            (Some("on"), Some(SingleCopy::Auto)),
            (Some("0"), Some(SingleCopy::Off)),
            (Some(" off "), Some(SingleCopy::Off)),
            (Some("false"), Some(SingleCopy::Off)),
            (Some("syscall"), Some(SingleCopy::Syscall)),
            (Some("of"), None),
            (Some("Syscall"), None),
        ] {
            assert_eq!(SingleCopy::parse(v), mode, "{v:?}");
        }
    }
}
