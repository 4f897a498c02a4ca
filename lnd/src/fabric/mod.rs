//! The fabric layer: a verbs-shaped device abstraction.
//!
//! The traits here map one-to-one onto libibverbs objects (device context, protection domain,
//! memory region, completion queue, RC queue pair) and onto the GSI (QP1) management-datagram
//! service the connection manager runs on. Everything above this module (CM, connections,
//! credits, the driver) is written against these traits and nothing else, so the same LND runs
//! on the software RoCEv2 device ([`soft`]) and on real InfiniBand/RoCE NICs (`verbs`, behind the
//! cargo feature of that name).
//!
//! # Contract
//! * **Progress is poll-driven.** A device never spawns threads. The driver calls
//!   [`Device::progress`] with the current time whenever one of [`Device::pollable_fds`] is
//!   readable, after posting work, and when [`Device::next_deadline`] passes. A device with
//!   real hardware behind it may have nothing to do in `progress`.
//! * **Completions** are reaped with [`CompletionQueue::poll`]. [`CompletionQueue::req_notify`]
//!   arms the CQ: the next completion makes [`CompletionQueue::event_fd`] readable; consume the
//!   notification with [`CompletionQueue::get_event`], re-arm, then poll again (a completion can
//!   land between the last poll and the arm).
//! * **Memory.** [`Device::reg_mr`] is the one `unsafe` entry point: the caller promises the
//!   memory outlives the region. The device touches registered memory only while the region is
//!   registered and only inside it; dropping a [`MemoryRegion`] deregisters it, after which the
//!   device never touches those bytes again. Posting is therefore safe: a bad key or range fails
//!   the work request with `LOC_PROT_ERR`, as on hardware.
//! * **Errors** are typed ([`FabricError`]); QP creation that runs out of device resources fails
//!   with [`FabricError::Resource`] so callers can retry with smaller queues.
//! * **Every posted work request completes exactly once** if it is signaled or fails: with
//!   success, its error, or `WR_FLUSH_ERR` once the QP is in ERR.

pub mod dma;
pub mod error;
pub mod soft;
pub mod types;
#[cfg(feature = "verbs")]
pub mod verbs;

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

pub use error::FabricError;
pub use types::*;

use crate::time::Instant;

/// Counters a device keeps about its transport (all zero where hardware hides them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Packets transmitted, retransmissions included.
    pub tx_packets: u64,
    /// Payload and header bytes transmitted.
    pub tx_bytes: u64,
    /// Packets received and accepted.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets sent again after a timeout or a NAK.
    pub retransmits: u64,
    /// Retransmission timeouts that fired.
    pub timeouts: u64,
    /// Work requests that failed with `RETRY_EXC_ERR`: a QP's `retry_cnt` retries in a row
    /// (timeouts or sequence NAKs) brought no progress, and it went to the error state.
    pub retries_exceeded: u64,
    /// Work requests that failed with `RNR_RETRY_EXC_ERR`: `rnr_retry` RNR NAKs in a row.
    pub rnr_retries_exceeded: u64,
    /// PSN-sequence NAKs sent.
    pub seq_naks: u64,
    /// RNR NAKs sent (no receive posted).
    pub rnr_naks: u64,
    /// Duplicate request packets received (re-acknowledged, never delivered twice).
    pub duplicates: u64,
    /// Positive ACKs sent riding on a request packet of the other direction instead of in an
    /// ACK frame of their own (the software device's piggybacked ACK).
    pub acks_piggybacked: u64,
    /// Packets dropped because the invariant CRC did not match.
    pub bad_icrc: u64,
    /// Packets dropped because they did not parse or addressed no live QP.
    pub malformed: u64,
    /// RDMA WRITEs refused by the protection checks (remote access errors sent).
    pub access_errors: u64,
    /// Management datagrams sent.
    pub mads_sent: u64,
    /// Management datagrams received.
    pub mads_received: u64,
    /// Same-host RDMA WRITEs sent as one placement request instead of payload packets (first
    /// transmissions; the software device's single-copy path).
    pub placed_sent: u64,
    /// Same-host RDMA WRITEs this device placed into its registered memory with one copy.
    pub placed_writes: u64,
    /// Bytes of those placed WRITEs.
    pub placed_bytes: u64,
    /// Of those placed WRITEs, the ones copied by `memcpy` from the requester's mapped buffer
    /// arena (no system call); the others used `process_vm_readv`.
    pub placed_mapped: u64,
    /// Of those mapped copies, the ones (256 KiB and up) the device's copy engine shared with
    /// its helper thread, on another core.
    pub placed_split: u64,
    /// Placed WRITEs whose copy the device left running on its copy engine while it went on
    /// (the next `progress` concluded them; [`soft::copier`]).
    pub placed_overlapped: u64,
    /// Of those mapped copies, the ones (256 KiB and up) written with streaming stores, around
    /// the CPU caches, because the memory recently written outgrew them (the software device's
    /// `Streaming` setting).
    pub placed_streamed: u64,
    /// Placement requests refused (sent or received `PlacementRefused`): the WRITE went by the
    /// wire instead.
    pub placed_refused: u64,
    /// Placement requests executed after the requester had already completed them in error
    /// (a late responder): the copy is discarded, the request dropped like a lost packet.
    pub placed_stale: u64,
    /// Frames sent through same-host shared-memory rings instead of the network (the software
    /// device's same-host path).
    pub ring_frames_sent: u64,
    /// Frames received from same-host rings.
    pub ring_frames_received: u64,
    /// Doorbells rung: a same-host peer was asleep when a frame was put in its ring.
    pub ring_doorbells: u64,
    /// Frames dropped because a same-host ring was full.
    pub ring_full: u64,
    /// Frames sent into same-host rings without their ICRC (nothing but this host's memory
    /// between the two devices: no fault injection).
    pub ring_frames_unsealed_sent: u64,
    /// Frames received from same-host rings without an ICRC, decoded without its check.
    pub ring_frames_unsealed_received: u64,
    /// Completion-channel notifications: completions that found their CQ armed and signalled
    /// its fd (a consumer polling an unarmed CQ gets none).
    pub cq_notifications: u64,
}

/// An opened RDMA device port: the root of the object graph (`ibv_context` + port).
pub trait Device: Send + Sync + 'static {
    /// Protection domain.
    type Pd: ProtectionDomain;
    /// Completion queue.
    type Cq: CompletionQueue;
    /// Reliable-connected queue pair.
    type Qp: QueuePair;
    /// Registered memory region.
    type Mr: MemoryRegion;

    /// The device name (`soft0`, `mlx5_0`, ...).
    fn name(&self) -> &str;

    /// Device capabilities.
    fn query_device(&self) -> DeviceAttr;

    /// Attributes of the port this device object drives.
    fn query_port(&self) -> PortAttr;

    /// The fabric address of the port that owns `ip` (address resolution, as
    /// `rdma_resolve_addr` does for an IPoIB or RoCE address).
    fn resolve(&self, ip: Ipv4Addr) -> Result<PortAddr, FabricError>;

    /// Whether `ip` is this port's own address: peers that [`Device::resolve`] it reach this
    /// port. On RoCE the port's GID *is* the IPv4-mapped address; on InfiniBand the GID is
    /// not, and the address is the one the port is configured with (its IPoIB address).
    fn owns_ipv4(&self, ip: Ipv4Addr) -> bool;

    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<Self::Pd, FabricError>;

    /// Creates a completion queue with room for at least `cqe` entries if the device allows;
    /// the actual size ([`CompletionQueue::cqe`]) may be rounded up or clamped to `max_cqe`.
    fn create_cq(&self, cqe: u32) -> Result<Self::Cq, FabricError>;

    /// Registers `len` bytes at `addr` in `pd` with `access`.
    ///
    /// # Safety
    /// `addr..addr+len` must be valid for reads and writes for as long as the returned region
    /// exists, and must not be accessed through Rust references while the device may write it
    /// (that is, while a receive or a peer's RDMA WRITE targeting it can be in progress; a
    /// completion, or deregistration, ends that).
    unsafe fn reg_mr(
        &self,
        pd: &Self::Pd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Self::Mr, FabricError>;

    /// Creates an RC queue pair in RESET. Capacities above the per-QP limits are clamped
    /// (see [`QueuePair::caps`]); if the device lacks the resources to hold the queues the
    /// call fails with [`FabricError::Resource`].
    fn create_qp(
        &self,
        pd: &Self::Pd,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        attr: &QpInitAttr,
    ) -> Result<Self::Qp, FabricError>;

    /// Sends a management datagram to the GSI (QP1) of the port at `dest`. Unreliable: it may
    /// be lost, duplicated or reordered.
    fn send_mad(&self, dest: &PortAddr, mad: &Mad) -> Result<(), FabricError>;

    /// The next management datagram addressed to this port's GSI, with the sender's address.
    fn recv_mad(&self) -> Option<(PortAddr, Mad)>;

    /// The next asynchronous event, if any.
    fn poll_async_event(&self) -> Option<AsyncEvent>;

    /// Does whatever work is due at `now`: receives packets, runs the transport, fires
    /// timers. Never blocks.
    fn progress(&self, now: Instant) -> Result<(), FabricError>;

    /// [`Device::progress`] for a caller that handles the completions it produces and then
    /// calls `progress` again at once (the engine's two-half poll): the responses the
    /// transport makes to what arrives (ACKs) may wait for that next call, so that a reply
    /// the caller posts in between can carry them. A device whose transport is elsewhere
    /// (an HCA) does plain `progress`.
    fn progress_receive(&self, now: Instant) -> Result<(), FabricError> {
        self.progress(now)
    }

    /// The transmit part of [`Device::progress`] alone: what was posted leaves now, and
    /// nothing is received (a receive can take long, such as a large same-host copy). For a
    /// caller with bookkeeping to do before its next `progress`. A device whose transport is
    /// elsewhere (an HCA) has nothing to do.
    fn progress_transmit(&self, now: Instant) -> Result<(), FabricError> {
        let _ = now;
        Ok(())
    }

    /// When `progress` next needs to run even if no fd becomes readable; `Some(t <= now)`
    /// means work is pending now.
    fn next_deadline(&self) -> Option<Instant>;

    /// File descriptors whose readability means `progress` has work (sockets, async-event fd).
    fn pollable_fds(&self) -> Vec<RawFd>;

    /// The caller's poller (edge-triggered, as mio's) saw `fd`, one of [`Device::pollable_fds`],
    /// become readable. A device told this may skip reading an fd it has drained until it is
    /// told again, saving a system call per `progress`; one never told keeps reading every time.
    fn fd_readable(&self, fd: RawFd) {
        let _ = fd;
    }

    /// Appends to `out` the event fds of the completion channels ([`CompletionQueue::event_fd`])
    /// this device signalled since the last call, for devices that know without a system call
    /// (the software device signals them inside [`Device::progress`]). The caller may reap
    /// those CQs at once instead of waiting for its poller to report the fds; the fds are
    /// signalled all the same. The default reports nothing.
    fn take_signalled_cqs(&self, out: &mut Vec<RawFd>) {
        let _ = out;
    }

    /// The caller is about to sleep in its poller until one of [`Device::pollable_fds`] is
    /// readable or [`Device::next_deadline`] passes. A device whose peers can deliver without
    /// making an fd readable (the software device's same-host rings) makes them wake it from
    /// now on; it returns false if work arrived meanwhile, and then the caller must not sleep.
    /// The default: sleep.
    fn prepare_to_sleep(&self) -> bool {
        true
    }

    /// The caller woke up after [`Device::prepare_to_sleep`] returned true.
    fn awake(&self) {}

    /// Transport counters.
    fn stats(&self) -> FabricStats;

    /// Whether [`Device::progress`] could find work now that [`Device::next_deadline`] does
    /// not announce (frames waiting, sends ready), answered cheaply and without a system call;
    /// true when unsure (the default). A driver spinning on an idle device asks this instead of
    /// calling `progress` on every turn.
    fn work_pending(&self) -> bool {
        true
    }

    /// Packets sent and received so far through [`Device::pollable_fds`] (the software
    /// device's UDP socket), as opposed to memory the device reads itself (its same-host
    /// rings, or an HCA's CQs); `None` (the default) when the device cannot tell. A spinning
    /// caller that sees it stand still can ask its poller less often.
    fn fd_packets(&self) -> Option<u64> {
        None
    }

    /// Packets sent plus packets received so far (wrapping): a counter that moves whenever
    /// the device moves traffic, cheap enough to read on every scheduler turn.
    fn packets(&self) -> u64 {
        let s = self.stats();
        s.tx_packets.wrapping_add(s.rx_packets)
    }
}

/// A protection domain (`ibv_pd`).
pub trait ProtectionDomain: Send + Sync {
    /// The domain's handle (unique on its device).
    fn handle(&self) -> u32;
}

/// A registered memory region (`ibv_mr`). Dropping it deregisters the memory.
pub trait MemoryRegion: Send + Sync {
    /// Local key, for scatter/gather entries.
    fn lkey(&self) -> u32;
    /// Remote key, for peers' RDMA WRITEs.
    fn rkey(&self) -> u32;
    /// Start address.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Access granted at registration.
    fn access(&self) -> Access;
}

/// A completion queue (`ibv_cq` with its completion channel).
pub trait CompletionQueue: Send + Sync {
    /// Identifier reported in [`AsyncEvent::CqErr`].
    fn id(&self) -> u32;
    /// The actual number of entries.
    fn cqe(&self) -> u32;
    /// Moves up to `out.len()` completions into `out`, oldest first; returns how many.
    fn poll(&self, out: &mut [Wc]) -> usize;
    /// Arms the CQ: the next completion (the next solicited one if `solicited_only`) makes
    /// the event fd readable.
    fn req_notify(&self, solicited_only: bool) -> Result<(), FabricError>;
    /// The completion-channel fd (non-blocking) to register with mio.
    fn event_fd(&self) -> RawFd;
    /// Consumes (and acknowledges) a pending notification; false if there was none.
    fn get_event(&self) -> bool;
}

/// A reliable-connected queue pair (`ibv_qp`, `IBV_QPT_RC`). Dropping it destroys the QP;
/// outstanding work requests are not completed after that.
pub trait QueuePair: Send + Sync {
    /// The QP number peers address.
    fn qp_num(&self) -> u32;
    /// The actual capacities (after clamping).
    fn caps(&self) -> QpCaps;
    /// The current state.
    fn state(&self) -> QpState;
    /// `ibv_modify_qp`: one state transition with its attributes.
    fn modify(&self, m: &QpModify) -> Result<(), FabricError>;
    /// `ibv_post_send`. On failure, work requests before the reported index were posted.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), FabricError>;
    /// [`QueuePair::post_send`] by a caller that knows the time: a device whose transport
    /// runs in software may start transmitting at once (an HCA's doorbell) instead of at its
    /// next `progress`. A device with the transport in hardware does plain `post_send`.
    fn post_send_at(&self, wrs: &[SendWr<'_>], now: Instant) -> Result<(), FabricError> {
        let _ = now;
        self.post_send(wrs)
    }
    /// `ibv_post_recv`. On failure, work requests before the reported index were posted.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), FabricError>;
}
