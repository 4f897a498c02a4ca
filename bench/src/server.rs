//! The benchmark server: answers brw and ping RPCs until told to stop.
//!
//! Request buffers wait on [`REQUEST_PORTAL`] (any sender, any match bits; a lazy portal, so a
//! request that finds them all full waits in LNet for the next), as ptlrpc's request
//! buffer descriptors do: each is one MD with LNet's `MAX_SIZE` (every request gets
//! [`REQUEST_BUF`] of room and lands right after the one before) and an infinite threshold, so
//! a buffer takes many requests and is posted again only when it is full and every request in
//! it has been read (not once per request). For a brw write the
//! server GETs the client's bulk buffer into one of its own and checks it; for a brw read it
//! stamps one of its buffers and PUTs it into the client's; then it replies. Bulk buffers are
//! pooled by size so they are registered once. One thread drives everything from one event
//! queue; LNet calls never block.
//!
//! Pings take a shorter road: the request buffers' events go to a callback, which runs on the
//! LND's scheduler thread as the request arrives and answers a ping there and then (as kernel
//! lnet_selftest answers in its event handler), so a ping costs no hop to this thread and back.
//! So do brw RPCs with `check=none` (no data to stamp or check) and those of at most
//! [`proto::INLINE_CHECK_MAX`] bytes (stamped or checked in place in a few microseconds): the
//! callback starts the bulk transfer, and the transfer's own callback checks a write's data and
//! sends the reply.
//! The callback also counts (atomics) and posts a full buffer again, so a ping never wakes this
//! thread; every other request is forwarded here and handled as before. The callback must not ask the
//! LND anything synchronously (stats), because the LND's thread is the one running it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use lnet_shim::buffer::Buffer;
use lnet_shim::event::{Event, EventKind, EventQueue, EventSink};
use lnet_shim::frags::Frag;
use lnet_shim::matching::{ANY_PROCESS, MatchEntry, MdOptions, Threshold, Unlink};
use lnet_shim::nid::ProcessId;
use lnet_shim::{AckReq, Lnet, Md};

use crate::node::Node;
use crate::proto::{
    self, BULK_PORTAL, Check, HDR, Op, REPLY_PORTAL, REQUEST_BUF, REQUEST_PORTAL, Reply, Request,
};

/// Request buffers kept posted: room for at least 512 requests of the largest size in all.
const REQUEST_BUFFERS: u64 = 32;
/// Bytes of each request buffer: at least 16 requests of the largest size, about 900 8-byte
/// pings.
const REQUEST_BUFFER_LEN: usize = 16 * REQUEST_BUF;

const KIND_REQUEST: u64 = 1;
const KIND_BULK: u64 = 2;
const KIND_REPLY: u64 = 3;
/// Bytes of a pooled reply buffer: a header and a ping's echo of up to 4 KiB.
const POOLED_REPLY: usize = HDR + 4096;
/// Most reply buffers the pool keeps (more in flight at once are allocated and dropped).
const POOLED_REPLIES: usize = 256;

fn tag(kind: u64, id: u64) -> u64 {
    (kind << 56) | (id & ((1 << 56) - 1))
}

fn untag(user_ptr: u64) -> (u64, u64) {
    (user_ptr >> 56, user_ptr & ((1 << 56) - 1))
}

struct Pending {
    client: ProcessId,
    req: Request,
    buf: Arc<Buffer>,
}

/// Counters the server keeps.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerCounters {
    /// RPCs answered.
    pub rpcs: u64,
    /// Requests that failed (bulk or reply errors).
    pub errors: u64,
    /// brw writes whose data failed the check.
    pub corrupt: u64,
}

struct Server<'a> {
    node: &'a Node,
    eq: EventQueue,
    requests: Vec<Arc<RequestSlot>>,
    pending: HashMap<u64, Pending>,
    replies: HashMap<u64, Arc<Buffer>>,
    next: u64,
    counters: ServerCounters,
    fast: Arc<Fast>,
}

/// A server's request buffers, attached and waiting for requests ([`post_requests`]).
pub struct Posted {
    eq: EventQueue,
    requests: Vec<Arc<RequestSlot>>,
    fast: Arc<Fast>,
}

/// Makes [`REQUEST_PORTAL`] lazy and attaches a server's request buffers to `lnet`. Call it
/// from [`Node::start_with`], before the NI comes up, so that the first requests find buffers
/// posted. The portal is lazy, as ptlrpc's request portals are: a request that finds every
/// buffer full waits in LNet until one is posted again, instead of being dropped (its client
/// would wait for a reply until it timed out). Pings and small brw RPCs are answered from the
/// buffers' callbacks from then on; the rest wait in a queue for [`serve`].
pub fn post_requests(lnet: &Lnet) -> Result<Posted, String> {
    lnet.set_lazy_portal(REQUEST_PORTAL).map_err(|e| e.to_string())?;
    let (eq, fast) = (EventQueue::new(1 << 16), Arc::<Fast>::default());
    let reply_sink = counting_sink(&fast);
    let mut requests = Vec::new();
    for i in 0..REQUEST_BUFFERS {
        let slot = Arc::new(RequestSlot {
            lnet: lnet.clone(),
            eq: eq.clone(),
            fast: fast.clone(),
            reply_sink: reply_sink.clone(),
            buf: Arc::new(Buffer::new(REQUEST_BUFFER_LEN)),
            sink: OnceLock::new(),
            queued: AtomicU64::new(0),
            unlinked: AtomicBool::new(false),
        });
        slot.post(i)?;
        requests.push(slot);
    }
    Ok(Posted { eq, requests, fast })
}

/// Serves the requests that land in `posted` (attached to `node`'s LNet) until `stop()`
/// returns true (checked at least every 100 ms).
pub fn serve(node: &Node, posted: Posted, stop: impl Fn() -> bool) -> Result<ServerCounters, String> {
    let Posted { eq, requests, fast } = posted;
    let mut s = Server {
        node,
        eq,
        requests,
        pending: HashMap::new(),
        replies: HashMap::new(),
        next: 1,
        counters: ServerCounters::default(),
        fast,
    };
    while !stop() {
        let Some(ev) = s.eq.wait(Duration::from_millis(100)) else { continue };
        s.handle(ev);
    }
    Ok(s.totals())
}

impl Server<'_> {
    /// The counters, pings answered in the callback included.
    fn totals(&self) -> ServerCounters {
        ServerCounters {
            rpcs: self.counters.rpcs + self.fast.rpcs.load(Ordering::Relaxed),
            errors: self.counters.errors + self.fast.errors.load(Ordering::Relaxed),
            corrupt: self.counters.corrupt + self.fast.corrupt.load(Ordering::Relaxed),
        }
    }

    fn handle(&mut self, ev: Event) {
        let (kind, id) = untag(ev.user_ptr);
        match kind {
            KIND_REQUEST if ev.kind == EventKind::Put => self.request(ev, id),
            KIND_BULK => self.bulk_event(ev, id),
            KIND_REPLY if ev.kind == EventKind::Send => {
                self.replies.remove(&id);
                if ev.status.is_err() {
                    if let Err(e) = ev.status {
                        eprintln!("lnd-bench server: reply to {} failed: {e}", ev.target);
                    }
                    self.counters.errors += 1;
                }
            }
            _ => {}
        }
    }

    fn request(&mut self, ev: Event, i: u64) {
        let Some(slot) = self.requests.get(i as usize) else { return };
        let len = (ev.mlength as usize).min(REQUEST_BUF);
        let bytes = slot.buf.to_vec(ev.offset as usize, len).unwrap_or_default();
        // Read: the buffer may be posted again once it is full and nothing else waits in it.
        slot.queued.fetch_sub(1, Ordering::SeqCst);
        if let Err(e) = slot.repost_if_done(i) {
            eprintln!("lnd-bench server: request buffer {i}: {e}");
        }
        if ev.status.is_err() {
            return;
        }
        let Some(req) = Request::decode(&bytes) else {
            self.counters.errors += 1;
            return;
        };
        let client = ev.initiator;
        match req.op {
            Op::Ping => {
                let payload = bytes.get(HDR..).unwrap_or_default().to_vec();
                self.reply(client, req.rpc, 0, &payload);
            }
            Op::Stats => {
                let text = stats_text(self.node, &self.totals());
                self.reply(client, req.rpc, 0, text.as_bytes());
            }
            Op::BrwWrite | Op::BrwRead => self.brw(client, req),
        }
    }

    fn brw(&mut self, client: ProcessId, req: Request) {
        let buf = self.fast.take(req.size as usize);
        let id = self.next;
        self.next += 1;
        let lnet = &self.node.lnet;
        let result = if req.op == Op::BrwWrite {
            // Pull the client's data: SEND then REPLY events.
            let md = Md::contiguous(buf.clone())
                .with_threshold(Threshold::Count(2))
                .with_user_ptr(tag(KIND_BULK, id))
                .with_events(self.eq.clone());
            lnet.md_bind(md, Unlink::Auto).and_then(|h| lnet.get(h, client, BULK_PORTAL, req.bulk_bits, 0))
        } else {
            let _ = proto::stamp_buffer(&buf, req.size as usize, req.check, req.magic);
            let md = Md::contiguous(buf.clone())
                .with_threshold(Threshold::Count(1))
                .with_user_ptr(tag(KIND_BULK, id))
                .with_events(self.eq.clone());
            lnet.md_bind(md, Unlink::Auto)
                .and_then(|h| lnet.put(h, AckReq::NoAck, client, BULK_PORTAL, req.bulk_bits, 0, 0))
        };
        match result {
            Ok(()) => {
                self.pending.insert(id, Pending { client, req, buf });
            }
            Err(_) => {
                self.counters.errors += 1;
                self.fast.give(buf);
                self.reply(client, req.rpc, -5, &[]);
            }
        }
    }

    fn bulk_event(&mut self, ev: Event, id: u64) {
        let done_kind = match self.pending.get(&id).map(|p| p.req.op) {
            Some(Op::BrwWrite) => EventKind::Reply,
            Some(_) => EventKind::Send,
            None => return,
        };
        if ev.status.is_ok() && ev.kind != done_kind {
            return; // the SEND of a GET: wait for its REPLY
        }
        let Some(p) = self.pending.remove(&id) else { return };
        let status = match ev.status {
            Err(e) => {
                self.counters.errors += 1;
                e.as_i32()
            }
            Ok(()) if p.req.op == Op::BrwWrite && p.req.check != Check::None => {
                if proto::write_intact(&p.buf, ev.mlength, &p.req) {
                    0
                } else {
                    self.counters.corrupt += 1;
                    proto::STATUS_CORRUPT
                }
            }
            Ok(()) => 0,
        };
        self.fast.give(p.buf);
        self.reply(p.client, p.req.rpc, status, &[]);
    }

    fn reply(&mut self, client: ProcessId, rpc: u64, status: i32, payload: &[u8]) {
        let id = self.next;
        self.next += 1;
        let sink = EventSink::Queue(self.eq.clone());
        let (buf, len) = self.fast.reply_buffer(rpc, status, payload.len());
        // Cannot fail: the buffer has room for the payload after the header.
        let _ = buf.write(HDR, payload);
        match send_reply(&self.node.lnet, sink, id, client, rpc, buf, len) {
            Ok(buf) => {
                self.replies.insert(id, buf);
                self.counters.rpcs += 1;
            }
            Err(()) => self.counters.errors += 1,
        }
    }
}

/// What the event callbacks (on the LND thread) share with the server thread: counters of the
/// RPCs they answered, and the bulk buffers of every brw RPC, pooled by size (registered once).
#[derive(Debug, Default)]
struct Fast {
    rpcs: AtomicU64,
    errors: AtomicU64,
    corrupt: AtomicU64,
    pool: Mutex<HashMap<usize, Vec<Arc<Buffer>>>>,
    replies: Mutex<ReplyPool>,
}

/// The reply buffers of the server's replies. A buffer stays in the pool while LNet and the
/// LND use it and is taken again once the pool's is its only reference: no allocation, no
/// registration per reply (and no need to know when its send ended).
#[derive(Debug, Default)]
struct ReplyPool {
    bufs: Vec<Arc<Buffer>>,
    /// Where the next look for a free buffer starts.
    next: usize,
}

impl ReplyPool {
    /// A buffer of [`POOLED_REPLY`] bytes nobody else holds.
    fn take(&mut self) -> Arc<Buffer> {
        let n = self.bufs.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            // `get_mut` checks with acquire ordering that no other reference is left, so
            // whatever the last holder did with the bytes happened before we write them.
            if Arc::get_mut(&mut self.bufs[i]).is_some() {
                self.next = i + 1;
                return self.bufs[i].clone();
            }
        }
        let buf = Arc::new(Buffer::new_unzeroed(POOLED_REPLY));
        if n < POOLED_REPLIES {
            self.bufs.push(buf.clone());
        }
        buf
    }
}

impl Fast {
    /// The reply to RPC `rpc` with `status` and `echo` bytes after the header still to be
    /// written: a pooled buffer when it fits, and the reply's length in it.
    fn reply_buffer(&self, rpc: u64, status: i32, echo: usize) -> (Arc<Buffer>, usize) {
        let len = HDR + echo;
        let buf = if len <= POOLED_REPLY {
            self.replies.lock().unwrap_or_else(PoisonError::into_inner).take()
        } else {
            Arc::new(Buffer::new_unzeroed(len))
        };
        // Cannot fail: the buffer is longer than the header.
        let _ = buf.write(0, &Reply { rpc, status, len: echo as u32 }.encode());
        (buf, len)
    }

    fn take(&self, size: usize) -> Arc<Buffer> {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.get_mut(&size).and_then(Vec::pop).unwrap_or_else(|| Arc::new(Buffer::new(size)))
    }

    fn give(&self, buf: Arc<Buffer>) {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner).entry(buf.len()).or_default().push(buf);
    }

    fn count(&self, ok: bool) {
        let counter = if ok { &self.rpcs } else { &self.errors };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The SEND event sink of a reply sent from a callback: failures are counted.
fn counting_sink(fast: &Arc<Fast>) -> EventSink {
    let fast = fast.clone();
    EventSink::callback(move |ev: &Event| {
        if let Err(e) = ev.status {
            eprintln!("lnd-bench server: reply to {} failed: {e}", ev.target);
            fast.errors.fetch_add(1, Ordering::Relaxed);
        }
    })
}

/// Serves a brw RPC with `check=none`, or of at most [`proto::INLINE_CHECK_MAX`] bytes, in the
/// request's callback, on the LND thread: there is no data to stamp or check, or it takes a
/// few microseconds in place. A read's buffer is stamped before its PUT. The bulk transfer's
/// last event (the REPLY of a write's GET, the SEND of a read's PUT, or the first error)
/// checks a write's data and sends the reply, once.
fn fast_brw(lnet: &Lnet, fast: &Arc<Fast>, reply_sink: &EventSink, client: ProcessId, req: Request) {
    let size = req.size as usize;
    let buf = fast.take(size);
    let write = req.op == Op::BrwWrite;
    if !write {
        let _ = proto::stamp_buffer(&buf, size, req.check, req.magic);
    }
    let done_kind = if write { EventKind::Reply } else { EventKind::Send };
    let sink = {
        let (lnet, fast, buf, answered) = (lnet.clone(), fast.clone(), buf.clone(), AtomicBool::new(false));
        let reply_sink = reply_sink.clone();
        EventSink::callback(move |ev: &Event| {
            if (ev.status.is_ok() && ev.kind != done_kind) || answered.swap(true, Ordering::Relaxed) {
                return;
            }
            let mut status = ev.status.map_or_else(|e| e.as_i32(), |()| 0);
            if status == 0
                && write
                && req.check != Check::None
                && !proto::write_intact(&buf, ev.mlength, &req)
            {
                fast.corrupt.fetch_add(1, Ordering::Relaxed);
                status = proto::STATUS_CORRUPT;
            }
            fast.give(buf.clone());
            let (reply, len) = fast.reply_buffer(req.rpc, status, 0);
            let sent = send_reply(&lnet, reply_sink.clone(), 0, client, req.rpc, reply, len);
            // A corrupt write is answered (the client counts it), as on the server thread.
            fast.count((status == 0 || status == proto::STATUS_CORRUPT) && sent.is_ok());
        })
    };
    let md = Md::contiguous(buf.clone())
        .with_threshold(Threshold::Count(if write { 2 } else { 1 }))
        .with_user_ptr(tag(KIND_BULK, 0))
        .with_events(sink);
    let started = lnet.md_bind(md, Unlink::Auto).and_then(|h| {
        if write {
            lnet.get(h, client, BULK_PORTAL, req.bulk_bits, 0)
        } else {
            lnet.put(h, AckReq::NoAck, client, BULK_PORTAL, req.bulk_bits, 0, 0)
        }
    });
    if started.is_err() {
        fast.give(buf);
        fast.count(false);
        let (reply, len) = fast.reply_buffer(req.rpc, -5, 0);
        let _ = send_reply(lnet, reply_sink.clone(), 0, client, req.rpc, reply, len);
    }
}

/// A request buffer and what its event callback needs. The server owns it; the callback
/// holds it weakly, and its sink is made once and reused at every repost (a ping allocates
/// no new callback).
struct RequestSlot {
    lnet: Lnet,
    eq: EventQueue,
    fast: Arc<Fast>,
    /// The SEND events of replies sent from the callback.
    reply_sink: EventSink,
    buf: Arc<Buffer>,
    sink: OnceLock<EventSink>,
    /// Requests in the buffer handed to the server thread and not yet read by it.
    queued: AtomicU64,
    /// The MD is gone (full): post the buffer again once `queued` is 0.
    unlinked: AtomicBool,
}

impl RequestSlot {
    /// Posts the buffer as request buffer `i`. Its events go to a callback on the LND thread:
    /// a ping is answered and the buffer reposted right there; any other request goes to `eq`
    /// for the server thread.
    fn post(self: &Arc<Self>, i: u64) -> Result<(), String> {
        let sink = self.sink.get_or_init(|| {
            let me: Weak<RequestSlot> = Arc::downgrade(self);
            EventSink::callback(move |ev: &Event| {
                if let Some(slot) = me.upgrade() {
                    slot.on_event(ev, i);
                }
            })
        });
        let md = Md::contiguous(self.buf.clone())
            .with_options(MdOptions::OP_PUT | MdOptions::TRUNCATE)
            .with_threshold(Threshold::Infinite)
            .with_max_size(REQUEST_BUF as u64)
            .with_user_ptr(tag(KIND_REQUEST, i))
            .with_events(sink.clone());
        let me = MatchEntry::new(ANY_PROCESS, 0).ignoring(u64::MAX).with_unlink(Unlink::Auto);
        self.lnet.attach(REQUEST_PORTAL, me, md, Unlink::Auto).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn on_event(self: &Arc<Self>, ev: &Event, i: u64) {
        if ev.kind != EventKind::Put {
            return;
        }
        if !self.serve_inline(ev) {
            // Read on the server thread, which then lets the buffer be posted again.
            self.queued.fetch_add(1, Ordering::SeqCst);
            self.eq.push(*ev);
        }
        if ev.unlinked {
            self.unlinked.store(true, Ordering::SeqCst);
            // Fails only when LNet is shutting down: then nothing is served anyway.
            let _ = self.repost_if_done(i);
        }
    }

    /// Answers a ping, or starts a brw with `check=none` or of at most
    /// [`proto::INLINE_CHECK_MAX`] bytes, right here; false for any other
    /// request (or a failed PUT), which goes to the server thread.
    fn serve_inline(&self, ev: &Event) -> bool {
        if ev.status.is_err() {
            return false;
        }
        let at = ev.offset as usize;
        let len = (ev.mlength as usize).min(REQUEST_BUF);
        let mut hdr = [0u8; HDR];
        let req =
            self.buf.read(at, &mut hdr).ok().filter(|()| len >= HDR).and_then(|()| Request::decode(&hdr));
        if let Some(req) = req.filter(|r| r.op == Op::Ping) {
            // The echo is copied from the request buffer straight into the reply's.
            let echo = len - HDR;
            let (buf, reply_len) = self.fast.reply_buffer(req.rpc, 0, echo);
            let sent = buf.copy_from(HDR, &self.buf, at + HDR, echo).map_err(drop).and_then(|()| {
                send_reply(&self.lnet, self.reply_sink.clone(), 0, ev.initiator, req.rpc, buf, reply_len)
            });
            self.fast.count(sent.is_ok());
            return true;
        }
        let quick = |r: &Request| {
            matches!(r.op, Op::BrwWrite | Op::BrwRead) && proto::checks_inline(r.check, r.size as usize)
        };
        if let Some(req) = req.filter(quick) {
            fast_brw(&self.lnet, &self.fast, &self.reply_sink, ev.initiator, req);
            return true;
        }
        false
    }

    /// Posts the buffer again if its MD is gone and no request in it waits to be read; of two
    /// threads that both see that, one posts.
    fn repost_if_done(self: &Arc<Self>, i: u64) -> Result<(), String> {
        // Nothing lands in an unlinked MD, so `queued` only falls once `unlinked` is set.
        if self.queued.load(Ordering::SeqCst) == 0 && self.unlinked.swap(false, Ordering::SeqCst) {
            return self.post(i);
        }
        Ok(())
    }
}

/// Starts the reply to RPC `rpc` in the first `len` bytes of `buf` (see [`Fast::reply_buffer`]): a
/// small PUT to the client's reply portal; its SEND event goes to `sink` tagged with `id`.
/// Returns the buffer.
#[allow(clippy::too_many_arguments, reason = "the reply, where it goes and how it is reported")]
fn send_reply(
    lnet: &Lnet,
    sink: EventSink,
    id: u64,
    client: ProcessId,
    rpc: u64,
    buf: Arc<Buffer>,
    len: usize,
) -> Result<Arc<Buffer>, ()> {
    let md = Md::new(Frag { buf: buf.clone(), offset: 0, len })
        .with_threshold(Threshold::Count(1))
        .with_user_ptr(tag(KIND_REPLY, id))
        .with_events(sink);
    lnet.md_bind(md, Unlink::Auto)
        .and_then(|h| lnet.put(h, AckReq::NoAck, client, REPLY_PORTAL, rpc, 0, 0))
        .map(|()| buf)
        .map_err(|_| ())
}

/// The server's counters as `key=value` lines (the STATS reply).
fn stats_text(node: &Node, c: &ServerCounters) -> String {
    let s = node.lnd_stats();
    format!(
        "rpcs={}\nerrors={}\ncorrupt={}\nretransmits={}\ncredit_stalls={}\nnoops={}\ntx_msgs={}\nrx_msgs={}\ncpu_us={}\n",
        c.rpcs,
        c.errors,
        c.corrupt,
        s.fabric.retransmits,
        s.engine.credit_stalls,
        s.engine.noops,
        s.engine.tx_msgs,
        s.engine.rx_msgs,
        crate::cpu::used_us(crate::cpu::Who::Process)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pooled reply buffer is handed out again only once nobody else holds it, the pool
    /// stops growing at its limit, and longer replies get a buffer of their own.
    #[test]
    fn reply_buffers_are_reused_only_when_free() {
        let fast = Fast::default();
        let (a, len) = fast.reply_buffer(7, 0, 8);
        assert_eq!((len, a.len()), (HDR + 8, POOLED_REPLY));
        let (b, _) = fast.reply_buffer(8, 0, 0);
        assert!(!Arc::ptr_eq(&a, &b), "a buffer still held was handed out again");
        let a_ptr = Arc::as_ptr(&a);
        drop(a);
        let (c, _) = fast.reply_buffer(9, -5, 0);
        assert_eq!(Arc::as_ptr(&c), a_ptr, "the free buffer was not reused");
        let mut hdr = [0u8; HDR];
        c.read(0, &mut hdr).unwrap();
        assert_eq!(hdr, Reply { rpc: 9, status: -5, len: 0 }.encode(), "the header of the new reply");
        let held: Vec<_> = (0..2 * POOLED_REPLIES).map(|i| fast.reply_buffer(i as u64, 0, 0).0).collect();
        assert_eq!(fast.replies.lock().unwrap().bufs.len(), POOLED_REPLIES);
        drop(held);
        let (big, len) = fast.reply_buffer(1, 0, 5000);
        assert_eq!((len, big.len()), (HDR + 5000, HDR + 5000));
        assert_eq!(fast.replies.lock().unwrap().bufs.len(), POOLED_REPLIES);
    }
}

#[cfg(test)]
mod process_tests {
    use std::sync::atomic::AtomicBool;

    use lnet_shim::nid::Nid;

    use super::*;
    use crate::node::{Fabric, NodeOptions};

    /// Sets its flag when dropped (also while a panic unwinds).
    struct StopOnDrop<'a>(&'a AtomicBool);

    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn node_with<T>(nid: &str, port: u16, before_ni: impl FnOnce(&Lnet) -> Result<T, String>) -> (Node, T) {
        let nid: Nid = nid.parse().unwrap();
        let opts = NodeOptions { nid, tunables: None, fabric: Fabric::Soft, port, tunables_warnings: false };
        Node::start_with(&opts, before_ni).unwrap()
    }

    /// Sends brw write RPC `rpc` of `size` bytes whose data is stamped with `stamped` while the
    /// request names `magic`; the status the server answers.
    fn brw_write_status(
        client: &Node,
        server: ProcessId,
        rpc: u64,
        size: usize,
        stamped: u64,
        magic: u64,
    ) -> i32 {
        let lnet = &client.lnet;
        let eq = EventQueue::new(16);
        let bulk = Arc::new(Buffer::new(size));
        proto::stamp_buffer(&bulk, size, Check::Full, stamped).unwrap();
        let md = Md::contiguous(bulk).with_options(MdOptions::OP_GET).with_threshold(Threshold::Count(1));
        lnet.attach(BULK_PORTAL, MatchEntry::new(server, rpc).with_unlink(Unlink::Auto), md, Unlink::Auto)
            .unwrap();
        let reply = Arc::new(Buffer::new(HDR));
        let md = Md::contiguous(reply.clone())
            .with_options(MdOptions::OP_PUT | MdOptions::TRUNCATE)
            .with_threshold(Threshold::Count(1))
            .with_events(eq.clone());
        lnet.attach(REPLY_PORTAL, MatchEntry::new(server, rpc).with_unlink(Unlink::Auto), md, Unlink::Auto)
            .unwrap();
        let req =
            Request { op: Op::BrwWrite, rpc, bulk_bits: rpc, size: size as u32, check: Check::Full, magic };
        let request = Arc::new(Buffer::new(HDR));
        request.write(0, &req.encode()).unwrap();
        let h =
            lnet.md_bind(Md::contiguous(request).with_threshold(Threshold::Count(1)), Unlink::Auto).unwrap();
        lnet.put(h, AckReq::NoAck, server, REQUEST_PORTAL, 0, 0, 0).unwrap();
        loop {
            let ev = eq.wait(Duration::from_secs(20)).expect("no reply within 20 s");
            if ev.kind == EventKind::Put {
                assert!(ev.status.is_ok(), "{ev:?}");
                return Reply::decode(&reply.to_vec(0, HDR).unwrap()).expect("a reply header").status;
            }
        }
    }

    /// A brw write whose data does not carry the stamp its request names is answered
    /// `STATUS_CORRUPT` and counted, whether the server checks it in the bulk transfer's
    /// callback (64 KiB) or on its own thread (1 MiB); data stamped as named is answered 0.
    #[test]
    fn corrupt_written_data_is_answered_corrupt_on_both_paths() {
        let port = 46_000 + (std::process::id() % 1000) as u16;
        let (server, posted) = node_with("127.0.33.1@o2ib", port, post_requests);
        let (client, ()) = node_with("127.0.33.2@o2ib", port, |_| Ok(()));
        let target = ProcessId::new("127.0.33.1@o2ib".parse().unwrap(), ProcessId::PID_LUSTRE);
        // One size on each path.
        const { assert!((64 << 10) <= proto::INLINE_CHECK_MAX && (1 << 20) > proto::INLINE_CHECK_MAX) };
        let stop = AtomicBool::new(false);
        let counters = std::thread::scope(|sc| {
            let serving = sc.spawn(|| serve(&server, posted, || stop.load(Ordering::SeqCst)));
            // A failed assertion below stops the server too, so the scope can end.
            let stopper = StopOnDrop(&stop);
            let mut rpc = 0;
            for size in [64 << 10, 1 << 20] {
                rpc += 1;
                assert_eq!(brw_write_status(&client, target, rpc, size, 7, 7), 0, "{size}: stamped as named");
                rpc += 1;
                assert_eq!(
                    brw_write_status(&client, target, rpc, size, 8, 7),
                    proto::STATUS_CORRUPT,
                    "{size}"
                );
            }
            drop(stopper);
            serving.join().unwrap()
        })
        .unwrap();
        assert_eq!(counters.corrupt, 2, "{counters:?}");
        assert_eq!(counters.rpcs, 4, "{counters:?}");
        client.shutdown();
        server.shutdown();
    }
}
