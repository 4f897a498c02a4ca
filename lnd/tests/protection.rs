//! Memory protection of the software device, probed through the public fabric API by a peer
//! that guesses: random rkeys, stale rkeys after deregistration (also once a new region took
//! the old one's place), the right key with a range straddling either end of the region, and
//! one region's key with another region's address. A probe must never change a byte outside a
//! live registration that its key names; every refused probe is counted by the target device.
//!
//! `LND_SIM_SEED=<n>` replays a run; failures name the seed.

use std::net::Ipv4Addr;
use std::time::Duration;

use lnd::fabric::dma::RegisteredBuf;
use lnd::fabric::soft::{SimNet, SoftConfig, SoftCq, SoftDevice, SoftPd};
use lnd::fabric::{
    Access, CompletionQueue, Device, MemoryRegion, PortAddr, QpCaps, QpInitAttr, QpModify, QueuePair, RecvWr,
    SendFlags, SendOp, SendWr, Wc, WcStatus,
};
use lnd::rng::Rng;
use lnd::time::Instant;

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
const REGION: usize = 8192;

fn seed() -> u64 {
    std::env::var("LND_SIM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x9e0_7ec7)
}

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

struct Side {
    dev: SoftDevice,
    pd: SoftPd,
    cq: SoftCq,
}

fn side(net: &SimNet, n: u8, s: u64) -> Side {
    let dev = SoftDevice::open_sim(net, ip(n), SoftConfig { seed: s, ..SoftConfig::default() });
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    Side { dev, pd, cq }
}

fn qp(s: &Side) -> <SoftDevice as Device>::Qp {
    let cap =
        QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    s.dev.create_qp(&s.pd, &s.cq, &s.cq, &QpInitAttr { cap, sq_sig_all: false }).unwrap()
}

fn up(q: &<SoftDevice as Device>::Qp, peer_qpn: u32, peer_ip: Ipv4Addr) {
    q.modify(&QpModify::Init { port_num: 1, pkey_index: 0, access: Access::REMOTE_WRITE }).unwrap();
    q.modify(&QpModify::Rtr {
        path_mtu: lnd::fabric::Mtu::Mtu1024,
        dest_qpn: peer_qpn,
        rq_psn: 7,
        dest: PortAddr::from_ipv4(peer_ip),
        max_dest_rd_atomic: 0,
        min_rnr_timer: 1,
    })
    .unwrap();
    q.modify(&QpModify::Rts { sq_psn: 7, timeout: 8, retry_cnt: 3, rnr_retry: 3, max_rd_atomic: 0 }).unwrap();
}

/// One WRITE of `len` bytes to (`addr`, `rkey`) on a fresh connection (an access error kills
/// both QPs); whether the target accepted it.
fn probe(
    a: &Side,
    b: &Side,
    src: &RegisteredBuf<SoftDevice>,
    addr: u64,
    rkey: u32,
    len: u32,
    now: &mut Instant,
) -> bool {
    let (qa, qb) = (qp(a), qp(b));
    up(&qa, qb.qp_num(), ip(2));
    up(&qb, qa.qp_num(), ip(1));
    qb.post_recv(&[RecvWr { wr_id: 9, sg_list: &[] }]).unwrap();
    let wrs = [
        SendWr {
            wr_id: 1,
            op: SendOp::RdmaWrite { remote_addr: addr, rkey },
            sg_list: &[src.sge(0, len)],
            flags: SendFlags::UNSIGNALED,
        },
        SendWr { wr_id: 2, op: SendOp::Send, sg_list: &[], flags: SendFlags::SIGNALED },
    ];
    qa.post_send(&wrs).unwrap();
    let mut got: Vec<Wc> = Vec::new();
    let mut batch = [Wc::default(); 8];
    for _ in 0..10_000 {
        a.dev.progress(*now).unwrap();
        b.dev.progress(*now).unwrap();
        let n = a.cq.poll(&mut batch);
        got.extend(batch.iter().take(n).filter(|w| w.wr_id != 9));
        if got.iter().any(|w| w.wr_id == 2) {
            break;
        }
        let next = [a.dev.next_deadline(), b.dev.next_deadline()].into_iter().flatten().min();
        *now = next.unwrap_or(*now + Duration::from_millis(1)).max(*now);
    }
    // Drain the target's completions (its receive, or its flush).
    while b.cq.poll(&mut batch) > 0 {}
    let send = got.iter().find(|w| w.wr_id == 2).map(|w| w.status);
    assert!(send.is_some(), "the probe completed");
    send == Some(WcStatus::Success)
}

struct Live {
    reg: RegisteredBuf<SoftDevice>,
    shadow: Vec<u8>,
}

#[test]
fn a_peer_probing_keys_and_ranges_never_writes_outside_a_live_registration() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = side(&net, 1, s);
    let b = side(&net, 2, s ^ 1);
    let src = RegisteredBuf::new(&a.dev, &a.pd, REGION, RW).unwrap();
    src.buf().fill(0x11);
    let mut rng = Rng::new(s);
    let mut live: Vec<Live> = (0..8)
        .map(|_| {
            let reg = RegisteredBuf::new(&b.dev, &b.pd, REGION, RW).unwrap();
            reg.buf().fill(0xee);
            Live { reg, shadow: vec![0xee; REGION] }
        })
        .collect();
    let mut stale: Vec<(u64, u32)> = Vec::new();
    let mut now = Instant::ZERO;
    let (mut refused, mut accepted, mut probes) = (0u64, 0u64, 0u64);
    let mut by_kind = [0u64; 6];
    for round in 0..240u64 {
        // Every 8th round a region is deregistered and a new one registered (often at the
        // freed address): its old key becomes stale.
        if round % 8 == 7 {
            let i = rng.below(live.len() as u64) as usize;
            let old = live.swap_remove(i);
            stale.push((old.reg.addr_at(0), old.reg.rkey()));
            drop(old);
            let reg = RegisteredBuf::new(&b.dev, &b.pd, REGION, RW).unwrap();
            reg.buf().fill(0xee);
            live.push(Live { reg, shadow: vec![0xee; REGION] });
        }
        let kind = (round % 6) as usize;
        let t = &live[rng.below(live.len() as u64) as usize];
        let (base, key) = (t.reg.addr_at(0), t.reg.rkey());
        let len = rng.range_inclusive(1, 4096) as u32;
        let (addr, rkey) = match kind {
            // Control: the right key, inside the region.
            0 => (base + rng.below(REGION as u64 - u64::from(len) + 1), key),
            // A random key at a live region's address.
            1 => (base, rng.next_u64() as u32),
            // A stale key at its old address (or a live one's, if none is stale yet).
            2 => stale.last().map_or((base, key ^ 0x100), |&(ad, k)| (ad, k)),
            // Straddling the end.
            3 => (base + REGION as u64 - u64::from(len) + 1 + rng.below(u64::from(len).min(64)), key),
            // Straddling the start.
            4 => (base - 1 - rng.below(64), key),
            // Another live region's key at this region's address.
            _ => {
                let other = live.iter().map(|l| l.reg.rkey()).find(|&k| k != key).unwrap_or(key ^ 1);
                (base, other)
            }
        };
        let before = b.dev.stats().access_errors;
        probes += 1;
        let ok = probe(&a, &b, &src, addr, rkey, len, &mut now);
        if ok {
            accepted += 1;
            // It must have landed wholly inside the live region its key names.
            let l = live.iter_mut().find(|l| l.reg.rkey() == rkey);
            let l =
                l.unwrap_or_else(|| panic!("seed {s}: round {round} kind {kind}: accepted with no live key"));
            let off = addr.checked_sub(l.reg.addr_at(0)).unwrap_or(u64::MAX) as usize;
            assert!(off.saturating_add(len as usize) <= REGION, "seed {s}: round {round}: write outside");
            l.shadow[off..off + len as usize].fill(0x11);
        } else {
            refused += 1;
            by_kind[kind] += 1;
            assert_eq!(b.dev.stats().access_errors, before + 1, "seed {s}: round {round}: refusal counted");
        }
        for (i, l) in live.iter().enumerate() {
            assert!(
                l.reg.buf().to_vec(0, REGION).unwrap() == l.shadow,
                "seed {s}: round {round} kind {kind}: region {i} changed outside the probe"
            );
        }
    }
    println!(
        "protection: {probes} probes, {accepted} accepted (all inside a live region), {refused} refused \
         (random key {}, stale key {}, straddling end {}, straddling start {}, wrong region's key {}); \
         target access_errors {}",
        by_kind[1],
        by_kind[2],
        by_kind[3],
        by_kind[4],
        by_kind[5],
        b.dev.stats().access_errors
    );
    assert_eq!(accepted, probes / 6, "seed {s}: only the control probes land");
    assert_eq!(refused, probes - probes / 6, "seed {s}");
}

#[test]
fn rkeys_carry_16_random_bits_so_a_stale_key_rarely_matches_the_next_region() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let b = side(&net, 2, s);
    let mut distinct = std::collections::HashSet::new();
    let mut steps = std::collections::HashSet::new();
    let mut repeats = 0u32;
    let mut prev: Option<u32> = None;
    for _ in 0..2000 {
        // Registered and dropped one after another: every region takes the same table slot.
        let r = RegisteredBuf::new(&b.dev, &b.pd, 64, RW).unwrap();
        let k = r.mr().rkey();
        distinct.insert(k);
        if prev == Some(k) {
            repeats += 1;
        }
        if let Some(p) = prev {
            steps.insert(k.wrapping_sub(p));
        }
        prev = Some(k);
    }
    // A slot's keys are a random permutation of the 16-bit variants: 2000 registrations give
    // 2000 distinct keys (a constant, or independent random draws, fail that), with about as
    // many distinct steps from one key to the next (a counter, one step, fails that), and the
    // stale key never comes back.
    println!(
        "rkeys: 2000 registrations in one slot, {} distinct keys, {repeats} equal to the stale one",
        distinct.len()
    );
    assert_eq!(distinct.len(), 2000, "seed {s}: a key came back");
    assert!(steps.len() >= 1900, "seed {s}: {} distinct steps", steps.len());
    assert_eq!(repeats, 0, "seed {s}: {repeats} stale keys came back");
}
