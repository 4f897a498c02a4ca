//! An in-process LND: delivers messages between several LNet instances in one process by
//! copying, so LNet can be tested without a network.
//!
//! A [`LoopbackNet`] is a wire that endpoints join with [`LoopbackNet::start`] (one per NID);
//! each endpoint is an [`Lnd`] with its own worker thread that takes its sends in FIFO order
//! and delivers each one completely before the next: the target's [`LndUpcalls::recv`], the
//! copy, the target's `recv_done`, then the sender's `send_done`. It keeps the [`Lnd`]
//! contract (`send` fails only at once; every accepted send is reported exactly once, also at
//! shutdown) and models o2iblnd's choices as LNet sees them:
//! * a payload larger than [`LoopbackConfig::immediate_max`] arrives with `rdma = true`, and
//!   if the target drops it the sender's `send_done` fails with `-ENODATA` (PUT_NAK); a small
//!   one arrives with `rdma = false` and is dropped silently;
//! * a GET that names its sink is answered by writing into the sink (GET_REQ/GET_DONE):
//!   `send_done` carries `reply_len`, or `-ENODATA` if the target drops it. With
//!   [`LoopbackConfig::header_only_gets`] (or without a sink) a GET travels header-only, as a
//!   kernel o2iblnd sends small GETs, and the target's LNet answers with a REPLY message.
//!
//! [`LoopbackLnd::pause`] holds an endpoint's sends (they stay in flight, holding LNet's
//! credits) until [`LoopbackLnd::resume`], for flow-control tests.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{JoinHandle, ThreadId};

use crate::event::Errno;
use crate::hdr::LnetMsg;
use crate::lnd::{
    Frag, Health, Lnd, LndError, LndSend, LndUpcalls, PeerInfo, PeerState, RecvDisposition, SendStatus,
    frags_len,
};
use crate::nid::Nid;

/// o2iblnd's largest IMMEDIATE payload: 4096 − 48 − 72 bytes.
pub const IMMEDIATE_MAX: usize = 3976;

/// How a [`LoopbackNet`] behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopbackConfig {
    /// Send every GET header-only (the target's LNet answers with a REPLY message) even when
    /// it names a sink. Default false.
    pub header_only_gets: bool,
    /// Payloads larger than this arrive with `rdma = true`. Default [`IMMEDIATE_MAX`].
    pub immediate_max: usize,
}

impl Default for LoopbackConfig {
    fn default() -> LoopbackConfig {
        LoopbackConfig { header_only_gets: false, immediate_max: IMMEDIATE_MAX }
    }
}

/// Why an endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoopbackError {
    /// Another endpoint on this wire already has the NID.
    #[error("{nid} is already on this loopback network")]
    NidInUse {
        /// The NID.
        nid: Nid,
    },
    /// The worker thread could not be started.
    #[error("cannot start the loopback worker: {0}")]
    Spawn(#[from] io::Error),
}

struct Hub {
    config: LoopbackConfig,
    endpoints: Mutex<HashMap<Nid, Arc<Endpoint>>>,
}

impl Hub {
    fn lookup(&self, nid: Nid) -> Option<Arc<Endpoint>> {
        self.endpoints.lock().unwrap_or_else(PoisonError::into_inner).get(&nid).cloned()
    }
}

/// A wire joining loopback endpoints. Clones share the wire.
#[derive(Clone)]
pub struct LoopbackNet {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for LoopbackNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoopbackNet({:?})", self.hub.config)
    }
}

impl Default for LoopbackNet {
    fn default() -> LoopbackNet {
        LoopbackNet::new()
    }
}

impl LoopbackNet {
    /// A wire with the default configuration.
    pub fn new() -> LoopbackNet {
        LoopbackNet::with_config(LoopbackConfig::default())
    }

    /// A wire with `config`.
    pub fn with_config(config: LoopbackConfig) -> LoopbackNet {
        LoopbackNet { hub: Arc::new(Hub { config, endpoints: Mutex::new(HashMap::new()) }) }
    }

    /// Starts an endpoint `nid` whose upcalls go to `upcalls` (what [`crate::Lnet::add_ni`]'s
    /// start function receives).
    pub fn start(&self, nid: Nid, upcalls: Arc<dyn LndUpcalls>) -> Result<Arc<LoopbackLnd>, LoopbackError> {
        let ep = Arc::new(Endpoint {
            nid,
            upcalls,
            queue: Mutex::new(Queue { cmds: VecDeque::new(), paused: false, stopping: false, delivered: 0 }),
            ready: Condvar::new(),
            peers: Mutex::new(HashMap::new()),
        });
        {
            let mut eps = self.hub.endpoints.lock().unwrap_or_else(PoisonError::into_inner);
            if eps.contains_key(&nid) {
                return Err(LoopbackError::NidInUse { nid });
            }
            eps.insert(nid, ep.clone());
        }
        let (ep2, hub2) = (ep.clone(), self.hub.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("loopback-{}", nid.addr()))
            .spawn(move || run(ep2, hub2));
        let worker = match spawned {
            Ok(w) => w,
            Err(e) => {
                self.hub.endpoints.lock().unwrap_or_else(PoisonError::into_inner).remove(&nid);
                return Err(e.into());
            }
        };
        let id = worker.thread().id();
        Ok(Arc::new(LoopbackLnd {
            ep,
            hub: self.hub.clone(),
            worker: Mutex::new(Some(worker)),
            worker_id: id,
        }))
    }
}

struct Queue {
    cmds: VecDeque<LndSend>,
    paused: bool,
    stopping: bool,
    delivered: u64,
}

struct Endpoint {
    nid: Nid,
    upcalls: Arc<dyn LndUpcalls>,
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Messages sent to each peer.
    peers: Mutex<HashMap<Nid, u64>>,
}

impl Endpoint {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One endpoint of a [`LoopbackNet`]: an [`Lnd`].
pub struct LoopbackLnd {
    ep: Arc<Endpoint>,
    hub: Arc<Hub>,
    worker: Mutex<Option<JoinHandle<()>>>,
    worker_id: ThreadId,
}

impl std::fmt::Debug for LoopbackLnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoopbackLnd({})", self.ep.nid)
    }
}

impl LoopbackLnd {
    /// Holds this endpoint's sends: they stay queued (in flight as LNet sees them).
    pub fn pause(&self) {
        self.ep.lock().paused = true;
    }

    /// Lets held sends go.
    pub fn resume(&self) {
        self.ep.lock().paused = false;
        self.ep.ready.notify_all();
    }

    /// Sends accepted and not yet delivered.
    pub fn queued(&self) -> usize {
        self.ep.lock().cmds.len()
    }

    /// Sends delivered (or failed) so far.
    pub fn delivered(&self) -> u64 {
        self.ep.lock().delivered
    }
}

fn err(errno: Errno, health: Health) -> LndError {
    LndError::new(errno, health)
}

impl Lnd for LoopbackLnd {
    fn nid(&self) -> Nid {
        self.ep.nid
    }

    fn send(&self, msg: LndSend) -> Result<(), LndError> {
        if msg.target.is_any() || msg.target.net() != self.ep.nid.net() {
            return Err(err(Errno::EHOSTUNREACH, Health::LocalError));
        }
        let payload = frags_len(&msg.payload).ok_or(err(Errno::EINVAL, Health::LocalError))?;
        if payload != msg.hdr.payload_length as usize
            || !msg.payload.iter().all(Frag::is_valid)
            || !msg.get_sink.iter().flatten().all(Frag::is_valid)
        {
            return Err(err(Errno::EINVAL, Health::LocalError));
        }
        let mut q = self.ep.lock();
        if q.stopping {
            return Err(err(Errno::ESHUTDOWN, Health::LocalDropped));
        }
        q.cmds.push_back(msg);
        drop(q);
        self.ep.ready.notify_all();
        Ok(())
    }

    fn peers(&self) -> Vec<PeerInfo> {
        let counts = self.ep.peers.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let q = self.ep.lock();
        let mut out: Vec<PeerInfo> = counts
            .keys()
            .map(|&nid| PeerInfo {
                nid,
                state: PeerState::Connected,
                conns: 1,
                queue_depth: 0,
                credits: 0,
                outstanding_credits: 0,
                min_credits: 0,
                queued: q.cmds.iter().filter(|m| m.target == nid).count(),
                active: 0,
            })
            .collect();
        out.sort_by_key(|p| p.nid);
        out
    }

    fn close_peer(&self, peer: Nid) {
        let failed: Vec<LndSend> = {
            let mut q = self.ep.lock();
            let (gone, keep): (VecDeque<LndSend>, VecDeque<LndSend>) =
                q.cmds.drain(..).partition(|m| m.target == peer);
            q.cmds = keep;
            q.delivered += gone.len() as u64;
            gone.into_iter().collect()
        };
        for m in failed {
            self.ep.upcalls.send_done(m.token, Err(err(Errno::ECONNABORTED, Health::LocalDropped)));
        }
    }

    fn shutdown(&self) {
        self.ep.lock().stopping = true;
        self.ep.ready.notify_all();
        {
            let mut eps = self.hub.endpoints.lock().unwrap_or_else(PoisonError::into_inner);
            if eps.get(&self.ep.nid).is_some_and(|e| Arc::ptr_eq(e, &self.ep)) {
                eps.remove(&self.ep.nid);
            }
        }
        if std::thread::current().id() == self.worker_id {
            return; // called from an upcall on our own worker: it finishes by itself
        }
        let handle = self.worker.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for LoopbackLnd {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The worker: delivers queued sends in order until the endpoint stops, then fails the rest.
fn run(ep: Arc<Endpoint>, hub: Arc<Hub>) {
    loop {
        let msg = {
            let mut q = ep.lock();
            loop {
                if q.stopping {
                    break None;
                }
                if !q.paused {
                    if let Some(m) = q.cmds.pop_front() {
                        break Some(m);
                    }
                }
                q = ep.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let Some(msg) = msg else { break };
        *ep.peers.lock().unwrap_or_else(PoisonError::into_inner).entry(msg.target).or_default() += 1;
        match hub.lookup(msg.target) {
            Some(target) => deliver(&*ep.upcalls, &*target.upcalls, ep.nid, msg, &hub.config),
            None => ep.upcalls.send_done(msg.token, Err(err(Errno::EHOSTUNREACH, Health::NetworkTimeout))),
        }
        ep.lock().delivered += 1;
    }
    let rest: Vec<LndSend> = {
        let mut q = ep.lock();
        let rest: Vec<LndSend> = q.cmds.drain(..).collect();
        q.delivered += rest.len() as u64;
        rest
    };
    for m in rest {
        ep.upcalls.send_done(m.token, Err(err(Errno::ESHUTDOWN, Health::LocalDropped)));
    }
}

/// Copies `n` bytes from `src` fragments to `dst` fragments.
fn copy_frags(src: &[Frag], dst: &[Frag], n: usize) -> Result<(), ()> {
    let (mut si, mut so, mut di, mut doff) = (0usize, 0usize, 0usize, 0usize);
    let mut left = n;
    while left > 0 {
        let (Some(s), Some(d)) = (src.get(si), dst.get(di)) else { return Err(()) };
        let s_left = s.len.saturating_sub(so);
        let d_left = d.len.saturating_sub(doff);
        if s_left == 0 {
            si += 1;
            so = 0;
            continue;
        }
        if d_left == 0 {
            di += 1;
            doff = 0;
            continue;
        }
        let k = s_left.min(d_left).min(left);
        d.buf.copy_from(d.offset + doff, &s.buf, s.offset + so, k).map_err(|_| ())?;
        so += k;
        doff += k;
        left -= k;
    }
    Ok(())
}

/// Delivers one message from `from` (whose upcalls are `src`) to the LNet behind `dst`,
/// completely: `dst.recv`, the copy, `dst.recv_done`, then `src.send_done`.
pub(crate) fn deliver(
    src: &dyn LndUpcalls,
    dst: &dyn LndUpcalls,
    from: Nid,
    msg: LndSend,
    config: &LoopbackConfig,
) {
    let token = msg.token;
    let nak = || Err(err(Errno::ENODATA, Health::RemoteError));
    let local_fault = || Err(err(Errno::EINVAL, Health::LocalError));
    match (&msg.hdr.msg, msg.get_sink) {
        (LnetMsg::Get(_), Some(sink)) if !config.header_only_gets => {
            // GET_REQ: the target writes into our sink, GET_DONE carries the length.
            match dst.recv(from, &msg.hdr, true) {
                RecvDisposition::Source { frags, token: rt } => {
                    let n = frags_len(&frags).unwrap_or(0).min(frags_len(&sink).unwrap_or(0));
                    if copy_frags(&frags, &sink, n).is_ok() {
                        dst.recv_done(rt, Ok(n));
                        src.send_done(token, Ok(SendStatus { reply_len: Some(n) }));
                    } else {
                        dst.recv_done(rt, local_fault());
                        src.send_done(token, Err(err(Errno::EINVAL, Health::RemoteError)));
                    }
                }
                RecvDisposition::Sink { token: rt, .. } => {
                    dst.recv_done(rt, local_fault());
                    src.send_done(token, nak());
                }
                RecvDisposition::Drop => src.send_done(token, nak()),
            }
        }
        (LnetMsg::Get(_), _) => {
            // Header-only GET: the target's LNet sends a REPLY message itself.
            match dst.recv(from, &msg.hdr, false) {
                RecvDisposition::Source { token: rt, .. } => dst.recv_done(rt, Ok(0)),
                RecvDisposition::Sink { token: rt, .. } => dst.recv_done(rt, local_fault()),
                RecvDisposition::Drop => {}
            }
            src.send_done(token, Ok(SendStatus { reply_len: None }));
        }
        _ => {
            let payload = msg.payload;
            let len = frags_len(&payload).unwrap_or(0);
            let rdma = len > config.immediate_max;
            // A dropped RDMA PUT is NAKed; a dropped IMMEDIATE one vanishes.
            let dropped = if rdma { nak() } else { Ok(SendStatus { reply_len: None }) };
            match dst.recv(from, &msg.hdr, rdma) {
                RecvDisposition::Sink { frags, mlength, token: rt } => {
                    let n = mlength.min(len);
                    if copy_frags(&payload, &frags, n).is_ok() {
                        dst.recv_done(rt, Ok(n));
                        src.send_done(token, Ok(SendStatus { reply_len: None }));
                    } else {
                        dst.recv_done(rt, local_fault());
                        src.send_done(
                            token,
                            if rdma { Err(err(Errno::EINVAL, Health::RemoteError)) } else { dropped },
                        );
                    }
                }
                RecvDisposition::Source { token: rt, .. } => {
                    dst.recv_done(rt, local_fault());
                    src.send_done(token, dropped);
                }
                RecvDisposition::Drop => src.send_done(token, dropped),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::Buffer;

    #[test]
    fn copies_across_fragment_boundaries() {
        let a = Arc::new(Buffer::from_slice(&(0u8..100).collect::<Vec<_>>()));
        let src =
            vec![Frag { buf: a.clone(), offset: 0, len: 30 }, Frag { buf: a.clone(), offset: 50, len: 50 }];
        let b = Arc::new(Buffer::new(80));
        let dst =
            vec![Frag { buf: b.clone(), offset: 0, len: 7 }, Frag { buf: b.clone(), offset: 10, len: 70 }];
        copy_frags(&src, &dst, 60).unwrap();
        let got = b.to_vec(0, 80).unwrap();
        let want: Vec<u8> = (0..30).chain(50..80).collect();
        assert_eq!(&got[..7], &want[..7]);
        assert_eq!(&got[10..63], &want[7..]);
        assert!(copy_frags(&src, &dst, 81).is_err());
        assert!(copy_frags(&[], &dst, 1).is_err());
        assert!(copy_frags(&[], &[], 0).is_ok());
    }
}
