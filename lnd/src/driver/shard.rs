//! Scheduler shards: `nscheds` engines sharing one device port.
//!
//! o2iblnd spreads connections over its scheduler threads; here each scheduler thread owns a
//! whole [`crate::engine::Engine`] (its peers, connections, descriptors and CM), and a peer
//! belongs to exactly one of them, chosen by [`shard_of`] from the peer's IPv4 address (a
//! NID's address on an o2ib network). Everything about a peer therefore stays on one thread,
//! lock-free, as with one scheduler; shards share only the device.
//!
//! Each engine sees the device through a [`Shard`], a [`Device`] that passes every call
//! through except the three shared queues, which it routes:
//! * **MADs** ([`Device::recv_mad`]): a REQ goes to the shard of the source address in its IP
//!   CM header (the peer's NID address, so a peer's own connect and its REQs meet on one
//!   shard); every other CM MAD names the receiver's local comm ID, and each shard's CM
//!   allocates IDs congruent to its index modulo the shard count
//!   ([`crate::cm::CmConfig::id_partition`]). Undecodable MADs go to shard 0, whose CM counts
//!   them.
//! * **Async events** go to every shard; an engine ignores QPs and CQs it does not own.
//! * **Signalled CQs** ([`Device::take_signalled_cqs`]) go to every shard likewise (they are
//!   hints: the CQ's fd is signalled all the same).
//!
//! Whichever shard drains a shared queue hands the others their items and wakes their
//! schedulers. Shard 0 is the device's: only it watches the device's fds
//! ([`Device::pollable_fds`]), runs its timers ([`Device::next_deadline`]) and reports its
//! counters ([`Device::stats`]). Every shard calls [`Device::progress`] (to transmit what it
//! posted), and each is woken by its own connections' CQ fds and by its waker. With one shard
//! every call goes straight through.

use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_queue::SegQueue;
use mio::Waker;

use crate::cm::ip_cm::{CMA_HEADER_LEN, CmaHeader};
use crate::cm::mad::{CmMad, CmMessage};
use crate::fabric::{
    Access, AsyncEvent, Device, DeviceAttr, FabricError, FabricStats, Mad, PortAddr, PortAttr, QpInitAttr,
};
use crate::time::Instant;

/// The shard (of `count`) that owns the peer at `ip`.
pub fn shard_of(ip: Ipv4Addr, count: usize) -> usize {
    if count <= 1 {
        return 0;
    }
    // Fibonacci hashing: consecutive addresses spread over the shards.
    let h = u64::from(u32::from(ip)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    (h % count as u64) as usize
}

/// The shard (of `count`) a CM MAD belongs to (see the module notes).
pub fn shard_of_mad(mad: &Mad, count: usize) -> usize {
    if count <= 1 {
        return 0;
    }
    let Ok(m) = CmMad::decode(mad) else { return 0 };
    let ours = match m.msg {
        CmMessage::Req(r) => {
            let hdr = r.private_data.get(..CMA_HEADER_LEN).and_then(|b| CmaHeader::decode(b).ok());
            return hdr.map_or(0, |h| shard_of(h.src, count));
        }
        CmMessage::Rep(r) => r.remote_comm_id,
        CmMessage::Rtu(r) => r.remote_comm_id,
        CmMessage::Rej(r) => r.remote_comm_id,
        CmMessage::Mra(r) => r.remote_comm_id,
        CmMessage::Dreq(r) => r.remote_comm_id,
        CmMessage::Drep(r) => r.remote_comm_id,
    };
    (ours % count as u32) as usize
}

/// One shard's share of the routed queues.
#[derive(Default)]
struct Inbox {
    mads: SegQueue<(PortAddr, Mad)>,
    events: SegQueue<AsyncEvent>,
    signalled: Mutex<Vec<RawFd>>,
}

/// The queues of all shards and their schedulers' wakers.
pub(crate) struct Router {
    inboxes: Vec<Inbox>,
    wakers: Vec<Arc<Waker>>,
}

impl Router {
    /// A router for one shard per waker.
    pub(crate) fn new(wakers: Vec<Arc<Waker>>) -> Router {
        Router { inboxes: wakers.iter().map(|_| Inbox::default()).collect(), wakers }
    }

    fn count(&self) -> usize {
        self.inboxes.len()
    }

    fn wake(&self, shard: usize) {
        if let Some(w) = self.wakers.get(shard) {
            let _ = w.wake();
        }
    }
}

/// A device as one shard's engine sees it.
pub struct Shard<D: Device> {
    dev: Arc<D>,
    index: usize,
    router: Arc<Router>,
}

impl<D: Device> Shard<D> {
    pub(crate) fn new(dev: Arc<D>, index: usize, router: Arc<Router>) -> Shard<D> {
        Shard { dev, index, router }
    }

    fn single(&self) -> bool {
        self.router.count() <= 1
    }

    /// Moves the device's MADs to their shards' inboxes.
    fn route_mads(&self) {
        let n = self.router.count();
        while let Some((from, mad)) = self.dev.recv_mad() {
            let to = shard_of_mad(&mad, n);
            if let Some(inbox) = self.router.inboxes.get(to) {
                inbox.mads.push((from, mad));
            }
            if to != self.index {
                self.router.wake(to);
            }
        }
    }

    /// Copies the device's async events to every shard's inbox.
    fn route_events(&self) {
        let mut any = false;
        while let Some(ev) = self.dev.poll_async_event() {
            any = true;
            for inbox in &self.router.inboxes {
                inbox.events.push(ev);
            }
        }
        if any {
            (0..self.router.count()).filter(|&i| i != self.index).for_each(|i| self.router.wake(i));
        }
    }
}

impl<D: Device> Device for Shard<D> {
    type Pd = D::Pd;
    type Cq = D::Cq;
    type Qp = D::Qp;
    type Mr = D::Mr;

    fn name(&self) -> &str {
        self.dev.name()
    }

    fn query_device(&self) -> DeviceAttr {
        self.dev.query_device()
    }

    fn query_port(&self) -> PortAttr {
        self.dev.query_port()
    }

    fn resolve(&self, ip: Ipv4Addr) -> Result<PortAddr, FabricError> {
        self.dev.resolve(ip)
    }

    fn owns_ipv4(&self, ip: Ipv4Addr) -> bool {
        self.dev.owns_ipv4(ip)
    }

    fn alloc_pd(&self) -> Result<D::Pd, FabricError> {
        self.dev.alloc_pd()
    }

    fn create_cq(&self, cqe: u32) -> Result<D::Cq, FabricError> {
        self.dev.create_cq(cqe)
    }

    unsafe fn reg_mr(
        &self,
        pd: &D::Pd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<D::Mr, FabricError> {
        // SAFETY: the caller gives `reg_mr`'s guarantees for this range; they are passed on
        // unchanged to the device this shard wraps.
        unsafe { self.dev.reg_mr(pd, addr, len, access) }
    }

    fn create_qp(
        &self,
        pd: &D::Pd,
        send_cq: &D::Cq,
        recv_cq: &D::Cq,
        attr: &QpInitAttr,
    ) -> Result<D::Qp, FabricError> {
        self.dev.create_qp(pd, send_cq, recv_cq, attr)
    }

    fn send_mad(&self, dest: &PortAddr, mad: &Mad) -> Result<(), FabricError> {
        self.dev.send_mad(dest, mad)
    }

    fn recv_mad(&self) -> Option<(PortAddr, Mad)> {
        if self.single() {
            return self.dev.recv_mad();
        }
        self.route_mads();
        self.router.inboxes.get(self.index)?.mads.pop()
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        if self.single() {
            return self.dev.poll_async_event();
        }
        self.route_events();
        self.router.inboxes.get(self.index)?.events.pop()
    }

    fn progress(&self, now: Instant) -> Result<(), FabricError> {
        self.dev.progress(now)
    }

    fn progress_receive(&self, now: Instant) -> Result<(), FabricError> {
        self.dev.progress_receive(now)
    }

    fn progress_transmit(&self, now: Instant) -> Result<(), FabricError> {
        self.dev.progress_transmit(now)
    }

    fn next_deadline(&self) -> Option<Instant> {
        // Shard 0 drives the device's timers; the others run `progress` when they post.
        if self.index == 0 { self.dev.next_deadline() } else { None }
    }

    fn pollable_fds(&self) -> Vec<RawFd> {
        if self.index == 0 { self.dev.pollable_fds() } else { Vec::new() }
    }

    fn fd_readable(&self, fd: RawFd) {
        self.dev.fd_readable(fd);
    }

    fn prepare_to_sleep(&self) -> bool {
        if self.index == 0 { self.dev.prepare_to_sleep() } else { true }
    }

    fn awake(&self) {
        if self.index == 0 {
            self.dev.awake();
        }
    }

    fn take_signalled_cqs(&self, out: &mut Vec<RawFd>) {
        if self.single() {
            return self.dev.take_signalled_cqs(out);
        }
        // The device's fresh ones straight into `out`, copied to the other shards from there.
        let start = out.len();
        self.dev.take_signalled_cqs(out);
        let end = out.len();
        for (i, inbox) in self.router.inboxes.iter().enumerate() {
            let mut list = inbox.signalled.lock().unwrap_or_else(PoisonError::into_inner);
            if i == self.index {
                out.append(&mut list);
            } else {
                list.extend_from_slice(out.get(start..end).unwrap_or_default());
            }
        }
    }

    /// The device's counters on shard 0; none on the others, so that each engine's measure of
    /// its own activity (and so its busy-polling) is not driven by another shard's traffic.
    fn stats(&self) -> FabricStats {
        if self.index == 0 { self.dev.stats() } else { FabricStats::default() }
    }

    /// With other shards, their progress can complete this shard's work: unsure, so true.
    fn work_pending(&self) -> bool {
        !self.single() || self.dev.work_pending()
    }

    /// Shard 0's alone, like [`Shard::stats`].
    fn packets(&self) -> u64 {
        if self.index == 0 { self.dev.packets() } else { 0 }
    }

    /// Shard 0's; the other shards poll none of the device's fds ([`Shard::pollable_fds`]), so
    /// nothing moves through theirs (if the device can tell at all).
    fn fd_packets(&self) -> Option<u64> {
        if self.index == 0 { self.dev.fd_packets() } else { self.dev.fd_packets().map(|_| 0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::ip_cm::{PortSpace, ip_service_id};
    use crate::cm::{Cm, CmConfig, ConnectParams};

    #[test]
    fn peers_spread_over_shards_and_one_shard_takes_all() {
        for n in [2usize, 3, 4] {
            let mut seen = vec![0usize; n];
            for i in 1..=64u8 {
                seen[shard_of(Ipv4Addr::new(127, 0, 10, i), n)] += 1;
            }
            assert!(seen.iter().all(|&c| c >= 64 / n / 3), "{n} shards: {seen:?}");
        }
        assert_eq!(shard_of(Ipv4Addr::new(10, 0, 0, 1), 1), 0);
    }

    /// A REQ goes to the shard of its sender's IP; the replies to a shard's own REQ come back
    /// to it by the comm ID it allocated.
    #[test]
    fn cm_mads_are_routed_by_source_address_or_by_the_comm_id() {
        let n = 3usize;
        let a_ip = Ipv4Addr::new(127, 0, 0, 1);
        let b_ip = Ipv4Addr::new(127, 0, 0, 2);
        let sid = ip_service_id(PortSpace::Tcp, 987);
        for index in 0..n as u32 {
            let now = Instant::ZERO;
            let a_cfg = CmConfig {
                id_partition: (index, n as u32),
                ..CmConfig::roce(PortAddr::from_ipv4(a_ip), a_ip, 1)
            };
            let mut a = Cm::new(a_cfg, 7 + u64::from(index));
            let mut b = Cm::new(CmConfig::roce(PortAddr::from_ipv4(b_ip), b_ip, 2), 9);
            b.listen(sid);
            let params = ConnectParams {
                dest: PortAddr::from_ipv4(b_ip),
                dest_ip: b_ip,
                src_port: 1023,
                service_id: sid,
                qpn: 0x100,
                start_psn: 1,
                path_mtu: crate::fabric::Mtu::Mtu4096,
                retry_count: 5,
                rnr_retry_count: 6,
                responder_resources: 1,
                initiator_depth: 1,
                local_ack_timeout: 17,
                private_data: [0; crate::cm::ip_cm::REQ_CONSUMER_DATA_LEN],
            };
            a.connect(now, params).unwrap();
            let (_, req) = a.poll_transmit().unwrap();
            assert_eq!(shard_of_mad(&req, n), shard_of(a_ip, n), "REQ by its source address");
            b.handle_mad(now, PortAddr::from_ipv4(a_ip), &req);
            // b rejects or replies; either way the answer names a's comm ID.
            while let Some(ev) = b.poll_event() {
                if let crate::cm::CmEvent::ConnectRequest { id, .. } = ev {
                    let _ = b.reject(now, id, crate::cm::mad::RejReason::ConsumerDefined, &[]);
                }
            }
            let (_, answer) = b.poll_transmit().unwrap();
            assert_eq!(shard_of_mad(&answer, n), index as usize, "the answer goes to the asking shard");
        }
        assert_eq!(shard_of_mad(&[0u8; 256], n), 0, "undecodable: shard 0");
    }
}
