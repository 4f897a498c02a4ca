//! The benchmark client: keeps `concurrency` RPCs in flight against one server.
//!
//! Each slot owns a bulk buffer (registered once, reused), a request buffer and a reply buffer.
//! For every RPC it attaches the bulk buffer on [`BULK_PORTAL`] under fresh match bits (the
//! server GETs it for a brw write, PUTs into it for a brw read) and the reply buffer on
//! [`REPLY_PORTAL`] under the RPC id, then PUTs the request. The RPC is done when the reply
//! and the bulk transfer have both been seen; its latency (request to completion) goes into an
//! `hdrhistogram`. brw read data is checked on arrival; brw write data is checked by the server.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::time::Duration;

use hdrhistogram::Histogram;
use lnd::clock::Clock;
use lnd::time::Instant;
use lnet_shim::buffer::Buffer;
use lnet_shim::event::{Event, EventKind, EventQueue, EventSink};
use lnet_shim::matching::{MatchEntry, MdOptions, Threshold, Unlink};
use lnet_shim::nid::ProcessId;
use lnet_shim::{AckReq, Lnet, Md};

use crate::node::Node;
use crate::proto::{
    self, BULK_PORTAL, Check, HDR, MAX_PING, Op, REPLY_PORTAL, REQUEST_PORTAL, Reply, Request,
};

/// One benchmark run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// What each RPC does.
    pub op: Op,
    /// Bulk bytes (brw) or payload bytes (ping).
    pub size: usize,
    /// RPCs kept in flight.
    pub concurrency: usize,
    /// Run this long ...
    pub duration: Option<Duration>,
    /// ... or this many RPCs.
    pub count: Option<u64>,
    /// Data stamping and checking.
    pub check: Check,
    /// The server.
    pub server: ProcessId,
    /// Print a progress line to stderr every second.
    pub progress: bool,
    /// An RPC that takes longer than this fails the run.
    pub rpc_timeout: Duration,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The spec.
    pub op: Op,
    /// How the data was checked (pings: their echo, always).
    pub check: Check,
    /// Bytes per RPC.
    pub size: usize,
    /// Concurrency.
    pub concurrency: usize,
    /// RPCs completed.
    pub rpcs: u64,
    /// Bulk bytes moved by completed RPCs.
    pub bytes: u64,
    /// Wall time.
    pub secs: f64,
    /// RPC latencies in nanoseconds.
    pub latency: Histogram<u64>,
    /// RPCs that failed (transport errors, timeouts, server errors).
    pub errors: u64,
    /// RPCs whose data failed verification (either side).
    pub corrupt: u64,
    /// First error seen, for the message.
    pub first_error: Option<String>,
}

impl RunResult {
    /// MiB per second.
    pub fn mib_s(&self) -> f64 {
        if self.secs > 0.0 { self.bytes as f64 / f64::from(1 << 20) / self.secs } else { 0.0 }
    }

    /// RPCs per second.
    pub fn rpc_s(&self) -> f64 {
        if self.secs > 0.0 { self.rpcs as f64 / self.secs } else { 0.0 }
    }

    /// Latency percentile in microseconds.
    pub fn lat_us(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1000.0
    }
}

const KIND_REQ: u64 = 1;
const KIND_BULK: u64 = 2;
const KIND_REPLY: u64 = 3;

struct Slot {
    bulk: Arc<Buffer>,
    request: Arc<Buffer>,
    reply: Arc<Buffer>,
    rpc: u64,
    magic: u64,
    started: Instant,
    got_reply: bool,
    got_bulk: bool,
    reply_status: i32,
    live: bool,
}

fn tag(kind: u64, slot: usize) -> u64 {
    (kind << 56) | slot as u64
}

/// The state of one run, shared by the thread that started it and the event callback.
struct Run {
    spec: RunSpec,
    lnet: Lnet,
    sink: EventSink,
    clock: Clock,
    slots: Vec<Slot>,
    result: RunResult,
    next_rpc: u64,
    issued: u64,
    end: Option<Instant>,
    stopping: bool,
    ping_payload: Vec<u8>,
}

impl Run {
    fn more(&self, now: Instant) -> bool {
        self.spec.count.is_none_or(|c| self.issued < c) && self.end.is_none_or(|e| now < e)
    }

    fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.live).count()
    }

    fn start(&mut self, slot: usize, now: Instant) {
        let Run { spec, lnet, sink, slots, result, next_rpc, ping_payload, clock, .. } = self;
        let Some(s) = slots.get_mut(slot) else { return };
        start_rpc(lnet, spec, sink, s, slot, next_rpc, ping_payload, now, clock, result);
        self.issued += 1;
    }

    /// Handles one event; starts the slot's next RPC when its last one finished.
    fn handle(&mut self, ev: &Event) {
        let slot = (ev.user_ptr & 0xffff_ffff) as usize;
        let kind = ev.user_ptr >> 56;
        let Run { spec, slots, result, .. } = self;
        let Some(s) = slots.get_mut(slot) else { return };
        if !s.live {
            return;
        }
        // The RPC ended when its last event came: checking the echo or the data it brought
        // (in `on_event`) is the client's own work, not the RPC's latency.
        let now = self.clock.now();
        let before = result.rpcs;
        if !on_event(s, kind, ev, spec, result) {
            return;
        }
        s.live = false;
        if self.result.rpcs > before {
            record(&mut self.result, self.slots[slot].started, now);
        }
        if !self.stopping && self.more(now) && self.result.first_error.is_none() {
            self.start(slot, now);
        }
    }
}

/// A run's events meet its state here. Whoever holds `run` handles the inbox; a thread that
/// finds it held leaves its event in the inbox, and the holder looks again after letting go,
/// so no event waits for the next one (and a callback never blocks on the lock, even when LNet
/// delivers an event synchronously to the thread that holds it).
struct Shared {
    run: Mutex<Run>,
    inbox: Mutex<VecDeque<Event>>,
    /// The inbox's length, stored under its lock: a callback that finds it zero may skip it.
    queued: AtomicUsize,
    wake: Condvar,
    /// The run's thread waits on `wake` (set and read under the inbox lock): events are
    /// notified only then, since every notify is a system call.
    waiting: AtomicBool,
    finished: AtomicBool,
}

impl Shared {
    /// Handles every event in the inbox unless another thread holds the run (it will).
    fn drain(&self) {
        loop {
            let mut run = match self.run.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            loop {
                let next = {
                    let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
                    let next = inbox.pop_front();
                    self.queued.store(inbox.len(), Ordering::Release);
                    next
                };
                let Some(ev) = next else { break };
                run.handle(&ev);
            }
            self.release(run);
            if self.inbox.lock().unwrap_or_else(PoisonError::into_inner).is_empty() {
                return;
            }
        }
    }

    /// Inline runs' fast path: with the inbox empty and the run free, handles `ev` at once;
    /// false if it must go through the inbox. LNet delivers one event at a time, so while this
    /// holds the run no other callback can queue one; only one on the run's own thread could
    /// have, before, and then the inbox is not empty.
    fn handle_now(&self, ev: &Event) -> bool {
        if self.queued.load(Ordering::Acquire) != 0 {
            return false;
        }
        let mut run = match self.run.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        run.handle(ev);
        self.release(run);
        // Nothing can have come meanwhile (above), but should something have, it is handled
        // as `drain` would.
        if self.queued.load(Ordering::Acquire) != 0 {
            self.drain();
        }
        true
    }

    /// Lets go of the run after handling events; the run's thread is woken if it is over.
    fn release(&self, run: MutexGuard<'_, Run>) {
        let finished = run.live() == 0;
        drop(run);
        if finished {
            self.finished.store(true, Ordering::SeqCst);
            self.wake.notify_all();
        }
    }

    fn lock_run(&self) -> MutexGuard<'_, Run> {
        self.run.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Runs `spec` against its server.
///
/// Pings are driven from the event callback, on the LND's scheduler thread: the reply's event
/// records the round trip and sends the next ping there and then, with no hop through this
/// thread (a ping's latency is the LND's, not the OS scheduler's). So are brw RPCs with
/// `check=none`, which have no data to stamp or check, and those of at most
/// [`proto::INLINE_CHECK_MAX`] bytes, whose stamping or checking in place takes a few microseconds.
/// Larger brw RPCs are handled here, so that checking the data does not hold up the LND.
pub fn run(node: &Node, spec: &RunSpec) -> RunResult {
    let clock = Clock::new();
    let inline = spec.op == Op::Ping || proto::checks_inline(spec.check, spec.size);
    let shared: Arc<Shared> = Arc::new_cyclic(|me: &Weak<Shared>| {
        let me = me.clone();
        let sink = EventSink::callback(move |ev: &Event| {
            let Some(shared) = me.upgrade() else { return };
            if inline && shared.handle_now(ev) {
                return;
            }
            let waiting = {
                let mut inbox = shared.inbox.lock().unwrap_or_else(PoisonError::into_inner);
                inbox.push_back(*ev);
                shared.queued.store(inbox.len(), Ordering::Release);
                shared.waiting.load(Ordering::Relaxed)
            };
            if inline {
                shared.drain();
            } else if waiting {
                shared.wake.notify_one();
            }
        });
        Shared {
            run: Mutex::new(new_run(node, spec, sink, clock)),
            inbox: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            wake: Condvar::new(),
            waiting: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        }
    });
    let t0 = clock.now();
    {
        let mut run = shared.lock_run();
        run.end = spec.duration.map(|d| t0 + d);
        for i in 0..run.slots.len() {
            if run.more(clock.now()) {
                run.start(i, clock.now());
            }
        }
    }
    shared.drain();
    let mut last_progress = t0;
    let mut last_rpcs = 0u64;
    let mut last_bytes = 0u64;
    loop {
        {
            let inbox = shared.inbox.lock().unwrap_or_else(PoisonError::into_inner);
            shared.waiting.store(true, Ordering::Relaxed);
            let (_inbox, _) = shared
                .wake
                .wait_timeout_while(inbox, Duration::from_millis(50), |q| {
                    q.is_empty() && !shared.finished.load(Ordering::SeqCst)
                })
                .unwrap_or_else(PoisonError::into_inner);
            shared.waiting.store(false, Ordering::Relaxed);
        }
        shared.drain();
        let now = clock.now();
        let mut run = shared.lock_run();
        if run.live() == 0 {
            break;
        }
        if !run.stopping && !run.more(now) {
            run.stopping = true;
        }
        // A stuck RPC fails the run rather than hanging it.
        let timeout = spec.rpc_timeout;
        if let Some(s) =
            run.slots.iter_mut().find(|s| s.live && now.saturating_duration_since(s.started) > timeout)
        {
            // Its buffers stay posted until LNet shuts down; late events are ignored.
            s.live = false;
            run.stopping = true;
            fail(&mut run.result, format!("RPC timed out after {timeout:?} (is the server running?)"));
            continue;
        }
        if spec.progress && now.saturating_duration_since(last_progress) >= Duration::from_secs(1) {
            let dt = now.saturating_duration_since(last_progress).as_secs_f64();
            let r = &run.result;
            eprintln!(
                "  {:>5.1}s  {:>9.1} MiB/s  {:>9.0} RPC/s  in flight {:>3}  errors {}",
                now.saturating_duration_since(t0).as_secs_f64(),
                (r.bytes - last_bytes) as f64 / f64::from(1 << 20) / dt,
                (r.rpcs - last_rpcs) as f64 / dt,
                run.live(),
                r.errors + r.corrupt
            );
            last_progress = now;
            last_rpcs = r.rpcs;
            last_bytes = r.bytes;
        }
    }
    let mut run = shared.lock_run();
    // Stop the callbacks from starting anything more (late events of timed-out RPCs).
    run.stopping = true;
    run.result.secs = clock.now().saturating_duration_since(t0).as_secs_f64();
    run.result.clone()
}

fn new_run(node: &Node, spec: &RunSpec, sink: EventSink, clock: Clock) -> Run {
    let bulk_len = if spec.op == Op::Ping || spec.op == Op::Stats { 0 } else { spec.size };
    let ping_len = if spec.op == Op::Ping { spec.size.min(MAX_PING) } else { 0 };
    let slots = (0..spec.concurrency.max(1))
        .map(|_| Slot {
            bulk: Arc::new(Buffer::new(bulk_len)),
            request: Arc::new(Buffer::new(HDR + ping_len)),
            reply: Arc::new(Buffer::new(HDR + MAX_PING.max(4096))),
            rpc: 0,
            magic: 0,
            started: Instant::ZERO,
            got_reply: false,
            got_bulk: false,
            reply_status: 0,
            live: false,
        })
        .collect();
    let result = RunResult {
        op: spec.op,
        check: if spec.op == Op::Ping { Check::Full } else { spec.check },
        size: spec.size,
        concurrency: spec.concurrency,
        rpcs: 0,
        bytes: 0,
        secs: 0.0,
        latency: Histogram::new_with_bounds(1, 600_000_000_000, 3)
            .unwrap_or_else(|_| Histogram::new(3).expect("histogram")),
        errors: 0,
        corrupt: 0,
        first_error: None,
    };
    let salt = crate::seed();
    Run {
        spec: spec.clone(),
        lnet: node.lnet.clone(),
        sink,
        clock,
        slots,
        result,
        next_rpc: (salt & 0xffff) << 40 | 1,
        issued: 0,
        end: None,
        stopping: false,
        ping_payload: (0..ping_len).map(|i| (i as u8) ^ 0x5a).collect(),
    }
}

fn fail(result: &mut RunResult, msg: String) {
    result.errors += 1;
    result.first_error.get_or_insert(msg);
}

#[allow(clippy::too_many_arguments, reason = "the state of one slot's next RPC")]
fn start_rpc(
    lnet: &Lnet,
    spec: &RunSpec,
    sink: &EventSink,
    s: &mut Slot,
    slot: usize,
    next_rpc: &mut u64,
    ping: &[u8],
    now: Instant,
    clock: &Clock,
    result: &mut RunResult,
) {
    let rpc = *next_rpc;
    *next_rpc += 1;
    s.rpc = rpc;
    s.magic = rpc.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x0be9_1b91;
    s.got_reply = false;
    s.got_bulk = spec.op == Op::Ping || spec.op == Op::Stats;
    s.reply_status = 0;
    s.started = now;
    s.live = true;
    if !s.got_bulk {
        if spec.op == Op::BrwWrite && spec.check != Check::None {
            let _ = proto::stamp_buffer(&s.bulk, s.bulk.len(), spec.check, s.magic);
            // Stamping the data is the client's own work, not the RPC's latency.
            s.started = clock.now();
        }
        let options = if spec.op == Op::BrwWrite { MdOptions::OP_GET } else { MdOptions::OP_PUT };
        let md = Md::contiguous(s.bulk.clone())
            .with_options(options)
            .with_threshold(Threshold::Count(1))
            .with_user_ptr(tag(KIND_BULK, slot))
            .with_events(sink.clone());
        let me = MatchEntry::new(spec.server, rpc).with_unlink(Unlink::Auto);
        if let Err(e) = lnet.attach(BULK_PORTAL, me, md, Unlink::Auto) {
            fail(result, format!("cannot post the bulk buffer: {e}"));
            s.live = false;
            return;
        }
    }
    let md = Md::contiguous(s.reply.clone())
        .with_options(MdOptions::OP_PUT | MdOptions::TRUNCATE)
        .with_threshold(Threshold::Count(1))
        .with_user_ptr(tag(KIND_REPLY, slot))
        .with_events(sink.clone());
    let me = MatchEntry::new(spec.server, rpc).with_unlink(Unlink::Auto);
    if let Err(e) = lnet.attach(REPLY_PORTAL, me, md, Unlink::Auto) {
        fail(result, format!("cannot post the reply buffer: {e}"));
        s.live = false;
        return;
    }
    let req = Request {
        op: spec.op,
        rpc,
        bulk_bits: rpc,
        size: spec.size as u32,
        check: spec.check,
        magic: s.magic,
    };
    let _ = s.request.write(0, &req.encode());
    if !ping.is_empty() {
        let _ = s.request.write(HDR, ping);
    }
    let md = Md::contiguous(s.request.clone())
        .with_threshold(Threshold::Count(1))
        .with_user_ptr(tag(KIND_REQ, slot))
        .with_events(sink.clone());
    let sent = lnet
        .md_bind(md, Unlink::Auto)
        .and_then(|h| lnet.put(h, AckReq::NoAck, spec.server, REQUEST_PORTAL, 0, 0, 0));
    if let Err(e) = sent {
        fail(result, format!("cannot send the request: {e}"));
        s.live = false;
    }
}

/// Handles one event of a slot; true when its RPC is finished.
fn on_event(s: &mut Slot, kind: u64, ev: &Event, spec: &RunSpec, result: &mut RunResult) -> bool {
    if let Err(e) = ev.status {
        let what = match kind {
            KIND_REQ => "request",
            KIND_BULK => "bulk transfer",
            _ => "reply",
        };
        fail(result, format!("{what} to {} failed: {e}", spec.server.nid));
        return true;
    }
    match (kind, ev.kind) {
        (KIND_BULK, EventKind::Put | EventKind::Get) => s.got_bulk = true,
        (KIND_REPLY, EventKind::Put) => {
            s.got_reply = true;
            let mut hdr = [0u8; HDR];
            let _ = s.reply.read(0, &mut hdr);
            match Reply::decode(&hdr) {
                Some(r) if r.rpc == s.rpc => s.reply_status = r.status,
                _ => s.reply_status = -71,
            }
            if spec.op == Op::Ping && !echoed(s, ev.mlength) {
                result.corrupt += 1;
            }
        }
        _ => {}
    }
    if !(s.got_reply && s.got_bulk) {
        return false;
    }
    match s.reply_status {
        0 => {}
        proto::STATUS_CORRUPT => {
            result.corrupt += 1;
            result.first_error.get_or_insert_with(|| "the server found written data corrupt".to_owned());
            return true;
        }
        e => {
            fail(result, format!("server error {e}"));
            return true;
        }
    }
    if spec.op == Op::BrwRead
        && spec.check != Check::None
        && !proto::verify_buffer(&s.bulk, 0, s.bulk.len(), spec.check, s.magic)
    {
        result.corrupt += 1;
        result.first_error.get_or_insert_with(|| "read data failed verification".to_owned());
        return true;
    }
    result.rpcs += 1;
    result.bytes += if spec.op == Op::Ping { 0 } else { spec.size as u64 };
    true
}

/// Whether the ping reply (`mlength` bytes in the slot's reply buffer) echoes the request's
/// payload exactly.
fn echoed(s: &Slot, mlength: u64) -> bool {
    const CHUNK: usize = 256;
    let sent_len = s.request.len().saturating_sub(HDR);
    if usize::try_from(mlength).ok() != Some(HDR + sent_len) {
        return false;
    }
    let (mut echo, mut sent) = ([0u8; CHUNK], [0u8; CHUNK]);
    (0..sent_len).step_by(CHUNK).all(|at| {
        let n = CHUNK.min(sent_len - at);
        let (Some(echo), Some(sent)) = (echo.get_mut(..n), sent.get_mut(..n)) else { return false };
        s.reply.read(HDR + at, echo).is_ok() && s.request.read(HDR + at, sent).is_ok() && echo == sent
    })
}

/// Records the latency of a finished RPC.
fn record(result: &mut RunResult, started: Instant, now: Instant) {
    let ns = now.saturating_duration_since(started).as_nanos();
    let _ = result.latency.record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
}

/// Asks the server for its counters (one STATS RPC); `None` if the request cannot be sent
/// (its SEND event failed: no connection to the server) or no answer comes in 5 s.
pub fn fetch_stats(node: &Node, server: ProcessId) -> Option<std::collections::HashMap<String, u64>> {
    let eq = EventQueue::new(16);
    let rpc = crate::seed() | 1 << 63;
    let reply = Arc::new(Buffer::new(HDR + 4096));
    let lnet = &node.lnet;
    let md = Md::contiguous(reply.clone())
        .with_options(MdOptions::OP_PUT | MdOptions::TRUNCATE)
        .with_threshold(Threshold::Count(1))
        .with_events(eq.clone());
    let (me, _) = lnet
        .attach(REPLY_PORTAL, MatchEntry::new(server, rpc).with_unlink(Unlink::Auto), md, Unlink::Auto)
        .ok()?;
    let req = Request { op: Op::Stats, rpc, bulk_bits: 0, size: 0, check: Check::None, magic: 0 };
    let send = Md::contiguous(Arc::new(Buffer::from_slice(&req.encode())))
        .with_threshold(Threshold::Count(1))
        .with_events(eq.clone());
    let sent = lnet
        .md_bind(send, Unlink::Auto)
        .and_then(|h| lnet.put(h, AckReq::NoAck, server, REQUEST_PORTAL, 0, 0, 0));
    let answer = sent.ok().and_then(|_| stats_answer(&eq, &reply));
    if answer.is_none() {
        let _ = lnet.me_unlink(me);
    }
    answer
}

/// Waits up to 5 s for the STATS reply; `None` at once if the request's SEND failed.
fn stats_answer(eq: &EventQueue, reply: &Buffer) -> Option<std::collections::HashMap<String, u64>> {
    let clock = Clock::new();
    let end = clock.now() + Duration::from_secs(5);
    loop {
        let ev = eq.wait(end.saturating_duration_since(clock.now()))?;
        match ev.kind {
            EventKind::Send if ev.status.is_err() => return None,
            EventKind::Put if ev.status.is_ok() => {
                let n = (ev.mlength as usize).saturating_sub(HDR);
                let text = String::from_utf8(reply.to_vec(HDR, n).ok()?).ok()?;
                return Some(
                    text.lines()
                        .filter_map(|l| l.split_once('='))
                        .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
                        .collect(),
                );
            }
            _ => {}
        }
    }
}
