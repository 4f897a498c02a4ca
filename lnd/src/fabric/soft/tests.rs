//! Tests of the software device over the simulated wire (seeded, virtual clock), and one on
//! loopback sockets for what only a same-host ring does (the doorbell of `post_send_at`).
//!
//! `LND_SIM_SEED=<n>` replays a run; every failure message names the seed.

use std::net::Ipv4Addr;
use std::time::Duration;

use self::packet::{NakCode, Reth, Syndrome};
use super::*;
use crate::fabric::dma::RegisteredBuf;
use crate::fabric::{
    CompletionQueue, QpModify, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

fn seed() -> u64 {
    std::env::var("LND_SIM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_1234)
}

struct Node {
    dev: SoftDevice,
    pd: SoftPd,
    cq: SoftCq,
    qp: SoftQp,
    buf: RegisteredBuf<SoftDevice>,
}

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

fn node(net: &SimNet, n: u8, config: SoftConfig, buf_len: usize) -> Node {
    node_on(SoftDevice::open_sim(net, ip(n), config), buf_len)
}

/// A PD, a CQ, an RC QP and a registered buffer of `buf_len` bytes on `dev`.
fn node_on(dev: SoftDevice, buf_len: usize) -> Node {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let cap =
        QpCaps { max_send_wr: 512, max_recv_wr: 512, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 };
    let qp = dev.create_qp(&pd, &cq, &cq, &QpInitAttr { cap, sq_sig_all: false }).unwrap();
    let buf = RegisteredBuf::new(&dev, &pd, buf_len, RW).unwrap();
    Node { dev, pd, cq, qp, buf }
}

/// A device seeded with `seed`, on the default same-host path whatever
/// `LND_SOFT_SINGLE_COPY` says: these tests choose their paths themselves ([`on_path`]),
/// and some count ring frames, which only the same-host path sends.
fn config(seed: u64) -> SoftConfig {
    SoftConfig { seed, single_copy: SingleCopy::Auto, ..SoftConfig::default() }
}

/// The paths of RDMA WRITE between ports of one host: single copy from the mapped buffer arena,
/// single copy by `process_vm_readv`, and the wire.
const PATHS: [SingleCopy; 3] = [SingleCopy::Auto, SingleCopy::Syscall, SingleCopy::Off];

fn on_path(seed: u64, path: SingleCopy) -> SoftConfig {
    SoftConfig { single_copy: path, ..config(seed) }
}

/// The WRITEs from `a` to `b` took `path` (the single-copy path is never silently skipped).
fn assert_path(a: &SoftDevice, b: &SoftDevice, path: SingleCopy, s: u64) {
    let (sa, sb) = (a.stats(), b.stats());
    match path {
        SingleCopy::Auto | SingleCopy::Syscall => {
            assert!(
                sa.placed_sent > 0 && sb.placed_writes > 0 && sb.placed_bytes > 0 && sb.placed_refused == 0,
                "seed {s}: single copy not taken: {sa:?} {sb:?}"
            );
            // Every test buffer is in the arena: each copy is from the mapping, or none is.
            let mapped = if path == SingleCopy::Auto && lnet_shim::arena::arena().is_some() {
                sb.placed_writes
            } else {
                0
            };
            assert_eq!(sb.placed_mapped, mapped, "seed {s} {path:?}: {sb:?}");
        }
        SingleCopy::Off => assert!(
            sa.placed_sent == 0 && sb.placed_writes == 0 && sb.placed_bytes == 0,
            "seed {s}: placed on the wire path: {sa:?} {sb:?}"
        ),
    }
}

#[derive(Clone, Copy)]
struct Rc {
    timeout: u8,
    retry: u8,
    rnr_retry: u8,
    min_rnr: u8,
    mtu: Mtu,
}

const RC: Rc = Rc { timeout: 10, retry: 7, rnr_retry: 7, min_rnr: 1, mtu: Mtu::Mtu4096 };

fn to_rtr(qp: &SoftQp, peer: &SoftQp, peer_ip: Ipv4Addr, rq_psn: u32, rc: Rc) {
    qp.modify(&QpModify::Init { port_num: 1, pkey_index: 0, access: Access::REMOTE_WRITE }).unwrap();
    qp.modify(&QpModify::Rtr {
        path_mtu: rc.mtu,
        dest_qpn: peer.qp_num(),
        rq_psn,
        dest: PortAddr::from_ipv4(peer_ip),
        max_dest_rd_atomic: 0,
        min_rnr_timer: rc.min_rnr,
    })
    .unwrap();
}

fn to_rts(qp: &SoftQp, sq_psn: u32, rc: Rc) {
    qp.modify(&QpModify::Rts {
        sq_psn,
        timeout: rc.timeout,
        retry_cnt: rc.retry,
        rnr_retry: rc.rnr_retry,
        max_rd_atomic: 0,
    })
    .unwrap();
}

/// Connects a (at ip(na)) and b (at ip(nb)) with PSNs near the 2^24 wrap.
fn connect(a: &Node, b: &Node, rc: Rc) {
    let (pa, pb) = (0xff_fff0, 0x00_0005);
    to_rtr(&a.qp, &b.qp, b.dev.ip(), pb, rc);
    to_rtr(&b.qp, &a.qp, a.dev.ip(), pa, rc);
    to_rts(&a.qp, pa, rc);
    to_rts(&b.qp, pb, rc);
}

/// Runs the devices on a virtual clock until `done` holds; false if the network went quiet
/// or `max_steps` passed first.
fn run_until(
    devs: &[&SoftDevice],
    now: &mut Instant,
    max_steps: usize,
    done: impl FnMut(Instant) -> bool,
) -> bool {
    run_paced(devs, now, max_steps, Duration::ZERO, Duration::ZERO, done)
}

/// As [`run_until`], but every turn takes at least `turn` of virtual time, as an application's
/// work between two calls of `progress` does: frames arrive between a send being posted and
/// the next `progress` transmitting it. A turn is the engine's poll: `progress_receive`, the
/// application's part (`done`: reaping, posting), `progress`. With a `skew`, every other
/// turn one device's `progress` (the devices take turns) is given an instant `skew` earlier
/// than its `progress_receive` had: a device shared by several scheduler threads sees their
/// instants out of order by as much as one thread's turn, since each reads the clock before
/// it takes the device's lock.
fn run_paced(
    devs: &[&SoftDevice],
    now: &mut Instant,
    max_steps: usize,
    turn: Duration,
    skew: Duration,
    mut done: impl FnMut(Instant) -> bool,
) -> bool {
    for step in 0..max_steps {
        for d in devs {
            d.progress_receive(*now).unwrap();
        }
        let finished = done(*now);
        for (i, d) in devs.iter().enumerate() {
            let lags = (step + i) % 2 == 1;
            let back = u64::try_from(skew.as_nanos()).unwrap_or(u64::MAX);
            let at = if lags { Instant::from_nanos(now.as_nanos().saturating_sub(back)) } else { *now };
            d.progress(at).unwrap();
        }
        if finished {
            return true;
        }
        let next = devs.iter().filter_map(|d| d.next_deadline()).min();
        match next {
            Some(t) => *now = (*now + turn).max(t),
            None => return done(*now),
        }
    }
    false
}

fn poll_all(cq: &SoftCq, out: &mut Vec<Wc>) {
    let mut batch = [Wc::default(); 64];
    loop {
        let n = cq.poll(&mut batch);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&batch[..n]);
    }
}

fn pattern(msg: u64, len: usize) -> Vec<u8> {
    let mut r = crate::rng::Rng::new(msg.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xabcdef);
    let mut v = vec![0u8; len];
    r.fill(&mut v);
    v
}

/// WRITE into a slot of b's buffer, then a SEND whose immediate names the message: b checks
/// the slot when the SEND arrives. Runs `n` messages with up to `window` outstanding; every
/// completion must succeed.
fn write_then_send(a: &Node, b: &Node, n: u64, sizes: &[usize], window: u64, now: &mut Instant, s: u64) {
    let gave_up = write_then_send_or_give_up(a, b, n, sizes, window, now, s, false, Duration::ZERO);
    assert_eq!(gave_up, None);
}

/// [`write_then_send`], where `may_give_up` also accepts what RC promises when loss goes on
/// too long: a's QP runs out of retries (`RETRY_EXC_ERR` on its oldest work request, counted
/// in `retries_exceeded`), every later one is flushed in order, and b has what came before,
/// in order, exactly once. Returns how many messages b verified then, or `None` if all went.
/// `skew`: the devices' instants out of order by that much ([`run_paced`]).
#[allow(clippy::too_many_arguments)]
fn write_then_send_or_give_up(
    a: &Node,
    b: &Node,
    n: u64,
    sizes: &[usize],
    window: u64,
    now: &mut Instant,
    s: u64,
    may_give_up: bool,
    skew: Duration,
) -> Option<u64> {
    // One slot per message in flight, 64 KiB or the largest size.
    let slot_len = sizes.iter().copied().max().unwrap_or(0).next_power_of_two().max(1 << 16);
    let slots = (b.buf.buf().len() / slot_len) as u64;
    assert!(window <= slots);
    for i in 0..64u64 {
        b.qp.post_recv(&[RecvWr { wr_id: i, sg_list: &[b.buf.sge(0, 0)] }]).unwrap();
    }
    let (mut posted, mut verified, mut acked) = (0u64, 0u64, 0u64);
    // After a give-up: the next work request id a flush must name, and whether all are in.
    let mut gave_up: Option<u64> = None;
    let mut recv_order = Vec::new();
    let mut a_wcs = Vec::new();
    let done = run_paced(&[&a.dev, &b.dev], now, 2_000_000, Duration::ZERO, skew, |now| {
        // a: keep `window` messages in flight.
        while gave_up.is_none() && posted < n && posted - verified < window {
            let len = sizes[(posted as usize) % sizes.len()];
            let slot = (posted % slots) as usize;
            let data = pattern(posted, len);
            a.buf.buf().write(slot * slot_len, &data).unwrap();
            let sge = a.buf.sge(slot * slot_len, len as u32);
            let wrs = [
                SendWr {
                    wr_id: posted * 2,
                    op: SendOp::RdmaWrite { remote_addr: b.buf.addr_at(slot * slot_len), rkey: b.buf.rkey() },
                    sg_list: &[sge],
                    flags: SendFlags::UNSIGNALED,
                },
                SendWr {
                    wr_id: posted * 2 + 1,
                    op: SendOp::SendWithImm { imm: posted as u32 },
                    sg_list: &[],
                    flags: SendFlags::SIGNALED,
                },
            ];
            a.qp.post_send(&wrs).unwrap();
            posted += 1;
        }
        // b: verify each message when its SEND arrives.
        let mut wcs = Vec::new();
        poll_all(&b.cq, &mut wcs);
        for wc in wcs {
            assert_eq!(wc.status, WcStatus::Success, "seed {s}: b completion {wc:?}");
            assert_eq!(wc.opcode, WcOpcode::Recv);
            let m = u64::from(wc.imm_data.expect("imm"));
            let len = sizes[(m as usize) % sizes.len()];
            let slot = (m % slots) as usize;
            let got = b.buf.buf().to_vec(slot * slot_len, len).unwrap();
            assert!(got == pattern(m, len), "seed {s}: message {m} corrupted");
            recv_order.push(m);
            verified += 1;
            b.qp.post_recv(&[RecvWr { wr_id: wc.wr_id, sg_list: &[b.buf.sge(0, 0)] }]).unwrap();
        }
        poll_all(&a.cq, &mut a_wcs);
        for wc in a_wcs.drain(..) {
            if let Some(next) = gave_up.as_mut() {
                assert_eq!(
                    (wc.status, wc.wr_id),
                    (WcStatus::WrFlushErr, *next),
                    "seed {s}: flushed in order"
                );
                *next += 1;
                continue;
            }
            if may_give_up && wc.status == WcStatus::RetryExcErr {
                assert!(wc.wr_id >= acked * 2, "seed {s}: {wc:?} after {acked} acknowledged");
                assert_eq!(a.dev.stats().retries_exceeded, 1, "seed {s}: {wc:?}");
                eprintln!("seed {s}: a's QP ran out of retries at work request {} ({wc:?})", wc.wr_id);
                gave_up = Some(wc.wr_id + 1);
                continue;
            }
            assert_eq!(
                wc.status,
                WcStatus::Success,
                "seed {s}: a completion {wc:?} {:?} {:?} at {now:?}",
                a.dev.stats(),
                b.dev.stats()
            );
            assert_eq!(wc.wr_id, acked * 2 + 1, "seed {s}: send completions out of order");
            acked += 1;
        }
        match gave_up {
            Some(next) => next == posted * 2,
            None => verified == n && acked == n,
        }
    });
    assert!(done, "seed {s}: stalled at posted {posted} verified {verified} acked {acked}");
    let delivered = if gave_up.is_some() { verified } else { n };
    assert_eq!(
        recv_order,
        (0..delivered).collect::<Vec<_>>(),
        "seed {s}: delivery not in order exactly once"
    );
    gave_up.map(|_| verified)
}

/// The WRITE sizes of the clean-wire runs: empty, tiny, around a page, several MTUs.
const CLEAN_SIZES: [usize; 7] = [0, 1, 4095, 4096, 4097, 20000, 65536];

/// Two connected nodes on a clean simulated wire (5 µs one way), both on `path`.
fn clean_pair(s: u64, path: SingleCopy) -> (SimNet, Node, Node) {
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, on_path(s, path), 1 << 20);
    let b = node(&net, 2, on_path(s + 1, path), 1 << 20);
    connect(&a, &b, RC);
    (net, a, b)
}

/// After a run from `a` to `b` on a clean wire: nothing was retransmitted or received twice,
/// and the WRITEs took `path`.
fn assert_clean_run(a: &Node, b: &Node, path: SingleCopy, s: u64) {
    let st = a.dev.stats();
    assert_eq!(st.retransmits, 0, "seed {s} {path:?}: {st:?}");
    assert_eq!(b.dev.stats().duplicates, 0, "seed {s} {path:?}");
    assert_path(&a.dev, &b.dev, path, s);
}

#[test]
fn writes_and_sends_arrive_in_order_exactly_once_on_a_clean_wire() {
    for path in PATHS {
        let s = seed();
        let (_net, a, b) = clean_pair(s, path);
        let mut now = Instant::ZERO;
        write_then_send(&a, &b, 200, &CLEAN_SIZES, 8, &mut now, s);
        assert_clean_run(&a, &b, path, s);
        // Idle costs nothing: once all is acknowledged, no device asks to be polled again.
        let idle = |_: Instant| a.dev.next_deadline().is_none() && b.dev.next_deadline().is_none();
        assert!(run_until(&[&a.dev, &b.dev], &mut now, 1000, idle), "seed {s} {path:?}: never idle");
        if path != SingleCopy::Off {
            // 6 of 7 sizes are placed; the 0-byte WRITEs go by the wire.
            let placed = (0..200u64).filter(|m| m % 7 != 0).count() as u64;
            assert_eq!(b.dev.stats().placed_writes, placed, "seed {s}");
        }
    }
}

/// A device shared by several scheduler threads is given their instants out of order (each
/// reads the clock before it takes the device's lock): transport timing that took a step back
/// must neither stall a QP nor retransmit what was acknowledged. 200 µs steps back, every
/// other turn, on both paths.
#[test]
fn instants_out_of_order_by_a_turn_neither_stall_nor_retransmit() {
    for path in PATHS {
        let s = seed();
        let (_net, a, b) = clean_pair(s, path);
        let mut now = Instant::ZERO;
        let skew = Duration::from_micros(200);
        let gave_up = write_then_send_or_give_up(&a, &b, 200, &CLEAN_SIZES, 8, &mut now, s, false, skew);
        assert_eq!(gave_up, None, "seed {s} {path:?}");
        assert_clean_run(&a, &b, path, s);
    }
}

/// WRITEs of 256 KiB and more on the mapped path are copied on two cores (the device's copy
/// engine, `copier`), every byte in place before the SEND behind it, with or without loss,
/// with ordinary or streaming stores; with the helper off, all on the responder's thread.
#[test]
fn large_placed_writes_are_split_over_two_cores() {
    if !mapped_path_available() {
        return;
    }
    let sizes = [1 << 20, (512 << 10) + 3, 300_000, 4096];
    for (helper, drop, streaming) in [
        (CopyHelper::Always, 0.0, Streaming::Off),
        (CopyHelper::Always, 0.05, Streaming::Always),
        (CopyHelper::Auto, 0.05, Streaming::Off),
        (CopyHelper::Off, 0.0, Streaming::Always),
    ] {
        let s = seed();
        let net = SimNet::new(s, Duration::from_micros(5));
        let faults = FaultConfig { tx: DirFaults { drop, ..DirFaults::NONE }, rx: DirFaults::NONE };
        let cfg =
            |seed| SoftConfig { copy_helper: helper, streaming, faults, ..on_path(seed, SingleCopy::Auto) };
        let a = node(&net, 1, cfg(s), 4 << 20);
        let b = node(&net, 2, cfg(s + 1), 4 << 20);
        connect(&a, &b, RC);
        let mut now = Instant::ZERO;
        write_then_send(&a, &b, 120, &sizes, 4, &mut now, s);
        assert_path(&a.dev, &b.dev, SingleCopy::Auto, s);
        let st = b.dev.stats();
        println!(
            "copy_helper {helper:?}, loss {drop}: {} of {} WRITEs split",
            st.placed_split, st.placed_writes
        );
        // Three of the four sizes are large: 90 WRITEs (a retransmitted request that was
        // executed already is acknowledged again, not copied again). `Auto` splits those the
        // helper is free to take in time, which is the OS scheduler's choice.
        let want = match helper {
            CopyHelper::Always => 90..=90,
            CopyHelper::Auto => 0..=90,
            CopyHelper::Off => 0..=0,
        };
        assert!(want.contains(&st.placed_split), "seed {s} {helper:?}: {st:?}");
        let streamed = if streaming == Streaming::Always && super::streaming::AVAILABLE { 90 } else { 0 };
        assert_eq!(st.placed_streamed, streamed, "seed {s} {streaming:?}: {st:?}");
        // In `Always` every large copy ran on the helper while the device went on, and the
        // SEND behind it still found every byte in place. On the simulation's virtual clock
        // `Auto` never leaves one running (whether the helper is looking is the OS's timing,
        // which a seed cannot replay).
        let overlapped = if helper == CopyHelper::Always { 90 } else { 0 };
        assert_eq!(st.placed_overlapped, overlapped, "seed {s} {helper:?}: {st:?}");
    }
}

/// Whether the mapped single-copy path is there (a buffer arena, `LND_SOFT_SINGLE_COPY`
/// unset); says the test is skipped if not.
fn mapped_path_available() -> bool {
    let ok = lnet_shim::arena::arena().is_some() && SingleCopy::from_env() == SingleCopy::Auto;
    if !ok {
        println!("skipped: needs the mapped path (a buffer arena, LND_SOFT_SINGLE_COPY unset)");
    }
    ok
}

/// Two connected nodes with 1 MiB buffers whose copy engines leave every large copy running
/// (`Always`).
fn helper_pair(net: &SimNet, s: u64, rc: Rc) -> (Node, Node) {
    let cfg = |seed| SoftConfig { copy_helper: CopyHelper::Always, ..on_path(seed, SingleCopy::Auto) };
    let (a, b) = (node(net, 1, cfg(s), 1 << 20), node(net, 2, cfg(s + 1), 1 << 20));
    connect(&a, &b, rc);
    (a, b)
}

/// b posts receive `round`; a posts an unsignaled 1 MiB WRITE (wr_id 10 + round) into
/// `target` and a signaled SEND with immediate `round` (wr_id 20 + round) behind it.
fn post_write_then_send(a: &Node, b: &Node, target: &RegisteredBuf<SoftDevice>, round: u64) {
    b.qp.post_recv(&[RecvWr { wr_id: round, sg_list: &[] }]).unwrap();
    let wrs = [
        SendWr {
            wr_id: 10 + round,
            op: SendOp::RdmaWrite { remote_addr: target.addr_at(0), rkey: target.rkey() },
            sg_list: &[a.buf.sge(0, 1 << 20)],
            flags: SendFlags::UNSIGNALED,
        },
        SendWr {
            wr_id: 20 + round,
            op: SendOp::SendWithImm { imm: round as u32 },
            sg_list: &[],
            flags: SendFlags::SIGNALED,
        },
    ];
    a.qp.post_send(&wrs).unwrap();
}

/// Steps a and b until b's device has left its `nth` copy running (and returned with it
/// running), a's frames all arriving before b looks (the SEND is there behind the WRITE's
/// request); false if it never did.
fn step_until_copy_runs(a: &Node, b: &Node, now: &mut Instant, nth: u64) -> bool {
    for _ in 0..1000 {
        a.dev.progress(*now).unwrap();
        *now += Duration::from_micros(100);
        b.dev.progress_receive(*now).unwrap();
        if b.dev.stats().placed_overlapped == nth {
            return true;
        }
        *now = [a.dev.next_deadline(), b.dev.next_deadline()]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(*now)
            .max(*now);
    }
    false
}

/// A placed WRITE whose copy runs on the copy engine holds its QP: the SEND behind it is not
/// received, the WRITE not acknowledged or counted, and the device not idle, until the next
/// `progress` concludes it with every byte in place. Deregistering the target region while
/// the copy runs lets the copy land first, and the WRITE and SEND then complete.
#[test]
fn a_running_copy_holds_its_qp_until_the_next_progress() {
    if !mapped_path_available() {
        return;
    }
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let (a, b) = helper_pair(&net, s, RC);
    let mut extra = Some(RegisteredBuf::new(&b.dev, &b.pd, 1 << 20, RW).unwrap());
    let data = pattern(7, 1 << 20);
    a.buf.buf().write(0, &data).unwrap();
    let mut now = Instant::ZERO;
    for round in 0..2u64 {
        let target = if round == 0 { &b.buf } else { extra.as_ref().unwrap() };
        post_write_then_send(&a, &b, target, round);
        let started = step_until_copy_runs(&a, &b, &mut now, round + 1);
        assert!(started, "seed {s} round {round}: the copy never ran on the helper: {:?}", b.dev.stats());
        let st = b.dev.stats();
        assert_eq!(st.placed_writes, round, "seed {s}: counted before it was concluded");
        let mut wcs = Vec::new();
        poll_all(&b.cq, &mut wcs);
        assert!(wcs.is_empty(), "seed {s} round {round}: received behind a running copy: {wcs:?}");
        assert_eq!(b.dev.next_deadline(), Some(Instant::ZERO), "seed {s}: idle while a copy runs");
        if round == 1 {
            // The region goes while the copy runs into it: the copy lands first.
            drop(extra.take());
        }
        let mut a_wcs = Vec::new();
        let done = run_until(&[&a.dev, &b.dev], &mut now, 10_000, |_| {
            poll_all(&b.cq, &mut wcs);
            poll_all(&a.cq, &mut a_wcs);
            !wcs.is_empty() && !a_wcs.is_empty()
        });
        assert!(done, "seed {s} round {round}: {:?} {:?}", a.dev.stats(), b.dev.stats());
        assert_eq!(wcs.len(), 1, "seed {s}: {wcs:?}");
        assert_eq!((wcs[0].status, wcs[0].imm_data), (WcStatus::Success, Some(round as u32)), "seed {s}");
        assert_eq!((a_wcs[0].status, a_wcs[0].wr_id), (WcStatus::Success, 20 + round), "seed {s}: {a_wcs:?}");
        let st = b.dev.stats();
        assert_eq!(st.placed_writes, round + 1, "seed {s}");
        // The SEND waited in the wire, not refused out of sequence and sent again.
        assert_eq!((st.seq_naks, a.dev.stats().retransmits), (0, 0), "seed {s}: {st:?}");
        if round == 0 {
            assert!(b.buf.buf().to_vec(0, 1 << 20).unwrap() == data, "seed {s}: the WRITE's bytes");
        }
    }
}

/// A QP that fails while its placed WRITE's copy runs drops the request at the conclusion
/// (no ACK, nothing counted, no completion but the flushes): the requester retries into the
/// failed QP until its retries run out, and its WRITE and SEND each end once, with an error.
#[test]
fn a_qp_failed_while_its_copy_runs_drops_the_request() {
    if !mapped_path_available() {
        return;
    }
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let (a, b) = helper_pair(&net, s, Rc { retry: 3, timeout: 8, ..RC });
    post_write_then_send(&a, &b, &b.buf, 0);
    let mut now = Instant::ZERO;
    let started = step_until_copy_runs(&a, &b, &mut now, 1);
    assert!(started, "seed {s}: the copy never ran on the helper: {:?}", b.dev.stats());
    b.qp.modify(&QpModify::Err).unwrap();
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let done = run_until(&[&a.dev, &b.dev], &mut now, 100_000, |_| {
        poll_all(&a.cq, &mut wa);
        poll_all(&b.cq, &mut wb);
        wa.len() == 2
    });
    assert!(done, "seed {s}: {wa:?} {:?} {:?}", a.dev.stats(), b.dev.stats());
    let got: Vec<_> = wa.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(10, WcStatus::RetryExcErr), (20, WcStatus::WrFlushErr)], "seed {s}");
    let got: Vec<_> = wb.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(0, WcStatus::WrFlushErr)], "seed {s}: only the flush at b");
    let st = b.dev.stats();
    assert_eq!(
        (st.placed_writes, st.placed_bytes),
        (0, 0),
        "seed {s}: the dropped WRITE was counted: {st:?}"
    );
}

#[test]
fn writes_and_sends_survive_20_percent_loss_with_reordering_and_duplication() {
    let s = seed();
    // 20% of frames lost on every link direction (applied once, at the sender), plus
    // reordering and duplication.
    let faults = FaultConfig {
        tx: DirFaults {
            drop: 0.2,
            reorder: 0.1,
            duplicate: 0.05,
            delay_max: Duration::from_micros(30),
            ..DirFaults::NONE
        },
        rx: DirFaults::NONE,
    };
    for path in PATHS {
        let net = SimNet::new(s, Duration::from_micros(5)).with_jitter(Duration::from_micros(3));
        let a = node(&net, 1, SoftConfig { faults, mtu: Mtu::Mtu1024, ..on_path(s, path) }, 1 << 20);
        let b = node(&net, 2, SoftConfig { faults, mtu: Mtu::Mtu1024, ..on_path(s + 1, path) }, 1 << 20);
        connect(&a, &b, Rc { mtu: Mtu::Mtu1024, ..RC });
        let mut now = Instant::ZERO;
        // Go-back-N under this much loss resends whole windows; a QP gives up when 8 rounds in
        // a row bring nothing (its `retry_cnt` of 7 spent), as an HCA's would: measured, in 8
        // of 400 seeds (each running the three paths).
        let sizes = [0, 100, 1024, 3000, 20000, 65536];
        let _ = write_then_send_or_give_up(&a, &b, 300, &sizes, 8, &mut now, s, true, Duration::ZERO);
        let (sa, sb) = (a.dev.stats(), b.dev.stats());
        assert!(
            sa.retransmits > 0 && sb.duplicates > 0 && sb.seq_naks > 0,
            "seed {s} {path:?}: {sa:?} {sb:?}"
        );
        assert!(a.dev.fault_stats().dropped > 0 && a.dev.fault_stats().reordered > 0);
        assert_path(&a.dev, &b.dev, path, s);
    }
}

#[test]
fn corrupted_frames_are_dropped_by_the_icrc_and_recovered() {
    let s = seed();
    let faults = FaultConfig::symmetric(DirFaults { corrupt: 0.05, ..DirFaults::NONE });
    for path in PATHS {
        let net = SimNet::new(s, Duration::from_micros(5));
        let a = node(&net, 1, SoftConfig { faults, ..on_path(s, path) }, 1 << 20);
        let b = node(&net, 2, SoftConfig { faults, ..on_path(s + 1, path) }, 1 << 20);
        connect(&a, &b, RC);
        let mut now = Instant::ZERO;
        // More messages on the single-copy path: it sends far fewer frames to corrupt.
        let n = if path == SingleCopy::Off { 100 } else { 400 };
        write_then_send(&a, &b, n, &[4096, 30000], 4, &mut now, s);
        let bad = a.dev.stats().bad_icrc
            + b.dev.stats().bad_icrc
            + a.dev.stats().malformed
            + b.dev.stats().malformed;
        assert!(bad > 0, "seed {s} {path:?}: corruption must be caught");
        assert_path(&a.dev, &b.dev, path, s);
    }
}

#[test]
fn retry_exhaustion_fails_the_oldest_then_flushes_the_rest_in_order() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, config(s), 4096);
    let b = node(&net, 2, config(s + 1), 4096);
    let rc = Rc { retry: 3, timeout: 8, ..RC };
    connect(&a, &b, rc);
    net.detach(b.dev.ip()); // the peer host disappears
    let mut now = Instant::ZERO;
    for i in 0..3 {
        let flags = if i == 1 { SendFlags::UNSIGNALED } else { SendFlags::SIGNALED };
        a.qp.post_send(&[SendWr { wr_id: i, op: SendOp::Send, sg_list: &[a.buf.sge(0, 100)], flags }])
            .unwrap();
    }
    let mut wcs = Vec::new();
    assert!(run_until(&[&a.dev], &mut now, 10_000, |_| {
        poll_all(&a.cq, &mut wcs);
        wcs.len() == 3
    }));
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        vec![(0, WcStatus::RetryExcErr), (1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)],
        "seed {s}"
    );
    assert_eq!(a.qp.state(), QpState::Err);
    // 1 transmission + 3 retries, each waiting one ACK timeout (4.096 us * 2^8 = 1.05 ms).
    let t = packet::ack_timeout_duration(8).unwrap();
    assert!(now >= Instant::ZERO + t * 4 && now < Instant::ZERO + t * 5, "{now:?}");
    assert_eq!(a.dev.stats().timeouts, 4);
    // Posting on an ERR QP completes at once with a flush.
    a.qp.post_send(&[SendWr { wr_id: 9, op: SendOp::Send, sg_list: &[], flags: SendFlags::UNSIGNALED }])
        .unwrap();
    let mut w = [Wc::default(); 4];
    assert_eq!(a.cq.poll(&mut w), 1);
    assert_eq!((w[0].wr_id, w[0].status), (9, WcStatus::WrFlushErr));
}

#[test]
fn rnr_retry_succeeds_once_a_receive_is_posted() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, config(s), 4096);
    let b = node(&net, 2, config(s + 1), 4096);
    connect(&a, &b, Rc { rnr_retry: 7, min_rnr: 4, ..RC });
    a.buf.buf().write(0, b"hello").unwrap();
    a.qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[a.buf.sge(0, 5)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let mut now = Instant::ZERO;
    // Let several RNR NAKs happen.
    assert!(run_until(&[&a.dev, &b.dev], &mut now, 10_000, |_| b.dev.stats().rnr_naks >= 3));
    b.qp.post_recv(&[RecvWr { wr_id: 7, sg_list: &[b.buf.sge(100, 64)] }]).unwrap();
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    assert!(run_until(&[&a.dev, &b.dev], &mut now, 10_000, |_| {
        poll_all(&a.cq, &mut wa);
        poll_all(&b.cq, &mut wb);
        !wa.is_empty() && !wb.is_empty()
    }));
    assert_eq!((wa[0].wr_id, wa[0].status), (1, WcStatus::Success), "seed {s}");
    assert_eq!((wb[0].wr_id, wb[0].status, wb[0].byte_len), (7, WcStatus::Success, 5));
    assert_eq!(b.buf.buf().to_vec(100, 5).unwrap(), b"hello");
}

#[test]
fn rnr_exhaustion_fails_with_rnr_retry_exc_err() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, config(s), 4096);
    let b = node(&net, 2, config(s + 1), 4096);
    connect(&a, &b, Rc { rnr_retry: 2, min_rnr: 1, ..RC });
    a.qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[a.buf.sge(0, 5)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let mut now = Instant::ZERO;
    let mut wa = Vec::new();
    assert!(run_until(&[&a.dev, &b.dev], &mut now, 10_000, |_| {
        poll_all(&a.cq, &mut wa);
        !wa.is_empty()
    }));
    assert_eq!((wa[0].wr_id, wa[0].status), (1, WcStatus::RnrRetryExcErr), "seed {s}");
    assert_eq!(b.dev.stats().rnr_naks, 3, "first try + 2 retries");
}

/// `wr` maps the target's (address, rkey) to the WRITE's (remote address, rkey, length).
fn access_error_case(s: u64, b_access: Access, wr: impl Fn(u64, u32) -> (u64, u32, u32)) {
    for path in PATHS {
        access_error_on(s, path, b_access, &wr);
    }
}

fn access_error_on(s: u64, path: SingleCopy, b_access: Access, wr: impl Fn(u64, u32) -> (u64, u32, u32)) {
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, on_path(s, path), 65536);
    let b = node(&net, 2, on_path(s + 1, path), 0);
    let target = RegisteredBuf::new(&b.dev, &b.pd, 8192, b_access).unwrap();
    target.buf().fill(0xee);
    a.buf.buf().fill(0x11);
    connect(&a, &b, RC);
    let (remote_addr, rkey, len) = wr(target.addr_at(0), target.rkey());
    let wrs = [
        SendWr {
            wr_id: 1,
            op: SendOp::RdmaWrite { remote_addr, rkey },
            sg_list: &[a.buf.sge(0, len)],
            flags: SendFlags::UNSIGNALED,
        },
        SendWr { wr_id: 2, op: SendOp::Send, sg_list: &[], flags: SendFlags::SIGNALED },
    ];
    a.qp.post_send(&wrs).unwrap();
    let mut now = Instant::ZERO;
    let mut wa = Vec::new();
    assert!(run_until(&[&a.dev, &b.dev], &mut now, 10_000, |_| {
        poll_all(&a.cq, &mut wa);
        wa.len() == 2
    }));
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)],
        "seed {s}"
    );
    assert!(
        target.buf().to_vec(0, 8192).unwrap().iter().all(|&x| x == 0xee),
        "target memory must be unchanged"
    );
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(b.qp.state(), QpState::Err);
    assert_eq!(b.dev.poll_async_event(), Some(AsyncEvent::QpFatal { qp_num: b.qp.qp_num() }));
    assert_eq!(b.dev.stats().access_errors, 1);
    let placed = a.dev.stats().placed_sent;
    assert_eq!(placed, u64::from(path != SingleCopy::Off), "seed {s} {path:?}");
    assert_eq!(b.dev.stats().placed_writes, 0);
}

#[test]
fn rdma_write_with_a_bad_rkey_is_refused_without_writing() {
    access_error_case(seed(), RW, |addr, _| (addr, 0xdead_beef, 4096));
}

#[test]
fn rdma_write_past_the_end_of_the_region_is_refused_without_writing() {
    // 4096 bytes starting 4097 bytes into an 8192-byte region: the last byte is outside.
    access_error_case(seed(), RW, |addr, rkey| (addr + 4097, rkey, 4096));
}

#[test]
fn rdma_write_without_remote_write_access_is_refused_without_writing() {
    access_error_case(seed(), Access::LOCAL_WRITE, |addr, rkey| (addr, rkey, 4096));
}

#[test]
fn send_longer_than_the_receive_is_loc_len_err() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, config(s), 4096);
    let b = node(&net, 2, config(s + 1), 4096);
    connect(&a, &b, RC);
    b.qp.post_recv(&[RecvWr { wr_id: 5, sg_list: &[b.buf.sge(0, 16)] }]).unwrap();
    b.qp.post_recv(&[RecvWr { wr_id: 6, sg_list: &[b.buf.sge(16, 16)] }]).unwrap();
    a.qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[a.buf.sge(0, 100)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let mut now = Instant::ZERO;
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    assert!(run_until(&[&a.dev, &b.dev], &mut now, 10_000, |_| {
        poll_all(&a.cq, &mut wa);
        poll_all(&b.cq, &mut wb);
        !wa.is_empty() && wb.len() == 2
    }));
    assert_eq!((wa[0].wr_id, wa[0].status), (1, WcStatus::RemInvReqErr), "seed {s}");
    assert_eq!((wb[0].wr_id, wb[0].status), (5, WcStatus::LocLenErr));
    assert_eq!((wb[1].wr_id, wb[1].status), (6, WcStatus::WrFlushErr));
}

#[test]
fn scatter_gather_imm_and_small_mtu() {
    for path in PATHS {
        scatter_gather_imm_and_small_mtu_on(path);
    }
}

fn scatter_gather_imm_and_small_mtu_on(path: SingleCopy) {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let rc = Rc { mtu: Mtu::Mtu256, ..RC };
    let a = node(&net, 1, on_path(s, path), 65536);
    let b = node(&net, 2, on_path(s + 1, path), 65536);
    connect(&a, &b, rc);
    let data = pattern(1, 3000);
    a.buf.buf().write(0, &data[..1000]).unwrap();
    a.buf.buf().write(5000, &data[1000..]).unwrap();
    // Gather from two SGEs; scatter into three.
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[b.buf.sge(0, 10), b.buf.sge(100, 1990), b.buf.sge(9000, 4000)],
    }])
    .unwrap();
    b.qp.post_recv(&[RecvWr { wr_id: 2, sg_list: &[b.buf.sge(20000, 8)] }]).unwrap();
    let wrs = [
        SendWr {
            wr_id: 1,
            op: SendOp::SendWithImm { imm: 0xabcd },
            sg_list: &[a.buf.sge(0, 1000), a.buf.sge(5000, 2000)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::RdmaWriteWithImm { remote_addr: b.buf.addr_at(30000), rkey: b.buf.rkey(), imm: 77 },
            sg_list: &[a.buf.sge(0, 1000), a.buf.sge(5000, 2000)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 3,
            op: SendOp::RdmaWrite { remote_addr: b.buf.addr_at(40000), rkey: b.buf.rkey() },
            sg_list: &[a.buf.sge(0, 5)],
            flags: SendFlags { inline: true, signaled: true, ..SendFlags::default() },
        },
    ];
    a.qp.post_send(&wrs).unwrap();
    let mut now = Instant::ZERO;
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    assert!(run_until(&[&a.dev, &b.dev], &mut now, 10_000, |_| {
        poll_all(&a.cq, &mut wa);
        poll_all(&b.cq, &mut wb);
        wa.len() == 3 && wb.len() == 2
    }));
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(
        wa.iter().map(|w| w.opcode).collect::<Vec<_>>(),
        [WcOpcode::Send, WcOpcode::RdmaWrite, WcOpcode::RdmaWrite]
    );
    assert_eq!((wb[0].byte_len, wb[0].imm_data, wb[0].opcode), (3000, Some(0xabcd), WcOpcode::Recv));
    assert_eq!((wb[1].byte_len, wb[1].imm_data, wb[1].opcode), (3000, Some(77), WcOpcode::RecvRdmaWithImm));
    let mut got = b.buf.buf().to_vec(0, 10).unwrap();
    got.extend(b.buf.buf().to_vec(100, 1990).unwrap());
    got.extend(b.buf.buf().to_vec(9000, 1000).unwrap());
    assert_eq!(got, data);
    assert_eq!(b.buf.buf().to_vec(30000, 3000).unwrap(), data);
    assert_eq!(b.buf.buf().to_vec(40000, 5).unwrap(), data[..5]);
    // 3000 bytes at MTU 256 = 12 packets per message; the placed WRITE is one request.
    let tx = a.dev.stats().tx_packets;
    assert!(if path == SingleCopy::Off { tx >= 25 } else { (14..25).contains(&tx) }, "{path:?}: {tx}");
    // The inline WRITE is never placed.
    assert_eq!(b.dev.stats().placed_writes, u64::from(path != SingleCopy::Off));
    assert_path(&a.dev, &b.dev, path, s);
}

#[test]
fn first_packet_in_rtr_raises_comm_est() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, config(s), 4096);
    let b = node(&net, 2, config(s + 1), 4096);
    // b stays in RTR, as a passive side whose RTU has not arrived.
    to_rtr(&a.qp, &b.qp, b.dev.ip(), 100, RC);
    to_rtr(&b.qp, &a.qp, a.dev.ip(), 200, RC);
    to_rts(&a.qp, 200, RC);
    b.qp.post_recv(&[RecvWr { wr_id: 1, sg_list: &[b.buf.sge(0, 64)] }]).unwrap();
    a.qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[a.buf.sge(0, 8)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let mut now = Instant::ZERO;
    let mut wb = Vec::new();
    assert!(run_until(&[&a.dev, &b.dev], &mut now, 1000, |_| {
        poll_all(&b.cq, &mut wb);
        !wb.is_empty()
    }));
    assert_eq!(b.dev.poll_async_event(), Some(AsyncEvent::CommEst { qp_num: b.qp.qp_num() }));
    assert_eq!(b.dev.poll_async_event(), None, "raised once");
    assert_eq!(b.qp.state(), QpState::Rtr);
    // RTR refuses sends; the transition to RTS is the consumer's job.
    assert!(
        b.qp.post_send(&[SendWr { wr_id: 1, op: SendOp::Send, sg_list: &[], flags: SendFlags::SIGNALED }])
            .is_err()
    );
    to_rts(&b.qp, 100, RC);
}

#[test]
fn sizes_are_clamped_to_device_limits() {
    let s = seed();
    let net = SimNet::new(s, Duration::ZERO);
    let limits = SoftLimits {
        max_cqe: 1000,
        max_qp_wr: 100,
        max_sge: 3,
        max_inline_data: 32,
        ..SoftLimits::default()
    };
    let dev = SoftDevice::open_sim(&net, ip(1), SoftConfig { limits, ..config(s) });
    assert_eq!(dev.create_cq(5).unwrap().cqe(), 8, "rounded up");
    assert_eq!(dev.create_cq(5000).unwrap().cqe(), 1000, "clamped to max_cqe");
    assert!(dev.create_cq(0).is_err());
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let cap =
        QpCaps { max_send_wr: 500, max_recv_wr: 50, max_send_sge: 8, max_recv_sge: 1, max_inline_data: 4096 };
    let qp = dev.create_qp(&pd, &cq, &cq, &QpInitAttr { cap, sq_sig_all: false }).unwrap();
    assert_eq!(
        qp.caps(),
        QpCaps { max_send_wr: 100, max_recv_wr: 50, max_send_sge: 3, max_recv_sge: 1, max_inline_data: 32 }
    );
    assert_eq!(dev.query_device().max_qp_wr, 100);
}

#[test]
fn qp_creation_fails_when_the_wqe_budget_is_spent_and_succeeds_smaller() {
    let s = seed();
    let net = SimNet::new(s, Duration::ZERO);
    let limits = SoftLimits { wqe_budget: 1000, ..SoftLimits::default() };
    let dev = SoftDevice::open_sim(&net, ip(1), SoftConfig { limits, ..config(s) });
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let attr = |q: u32| QpInitAttr {
        cap: QpCaps {
            max_send_wr: q,
            max_recv_wr: 2 * q + 2,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    let first = dev.create_qp(&pd, &cq, &cq, &attr(200)).unwrap(); // 602 WQEs
    let err = dev.create_qp(&pd, &cq, &cq, &attr(200)).unwrap_err();
    assert!(err.is_resource(), "{err}");
    // o2iblnd's loop: shrink the queue depth until the device accepts it.
    let mut q = 200;
    let second = loop {
        match dev.create_qp(&pd, &cq, &cq, &attr(q)) {
            Ok(qp) => break qp,
            Err(e) if e.is_resource() && q > 2 => q -= 1,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(q, 132, "3q + 2 <= 398");
    assert_eq!(dev.live_counts().wqes, 1000);
    drop(first);
    drop(second);
    assert_eq!(dev.live_counts().wqes, 0);
    assert_eq!(dev.live_counts().qps, 0);
}

#[test]
fn mads_go_to_qp1_and_back() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = SoftDevice::open_sim(&net, ip(1), config(s));
    let b = SoftDevice::open_sim(&net, ip(2), config(s + 1));
    let mut req = [0u8; 256];
    req[0] = 1;
    req[1] = 7;
    req[255] = 0xaa;
    a.send_mad(&PortAddr::from_ipv4(ip(2)), &req).unwrap();
    let mut now = Instant::ZERO;
    let mut got = None;
    assert!(run_until(&[&a, &b], &mut now, 100, |_| {
        got = got.or_else(|| b.recv_mad());
        got.is_some()
    }));
    let (from, mad) = got.unwrap();
    assert_eq!((from, mad), (PortAddr::from_ipv4(ip(1)), req));
    let mut rep = mad;
    rep[255] = 0xbb;
    b.send_mad(&from, &rep).unwrap();
    let mut back = None;
    assert!(run_until(&[&a, &b], &mut now, 100, |_| {
        back = back.or_else(|| a.recv_mad());
        back.is_some()
    }));
    assert_eq!(back.unwrap().1[255], 0xbb);
    assert_eq!((a.stats().mads_sent, a.stats().mads_received), (1, 1));
    // What the engine reads without the lock (published as the lock is let go) follows the
    // device: the packet count, and no MAD left once both were taken.
    for d in [&a, &b] {
        let st = d.stats();
        assert_eq!(d.packets(), st.tx_packets + st.rx_packets, "seed {s}");
        assert_eq!(d.recv_mad(), None, "seed {s}");
    }
}

#[test]
fn modify_to_err_flushes_receives_and_objects_do_not_leak() {
    let s = seed();
    let net = SimNet::new(s, Duration::ZERO);
    let dev;
    {
        let a = node(&net, 1, config(s), 4096);
        let b = node(&net, 2, config(s + 1), 4096);
        connect(&a, &b, RC);
        for i in 0..3 {
            a.qp.post_recv(&[RecvWr { wr_id: i, sg_list: &[a.buf.sge(0, 64)] }]).unwrap();
        }
        a.qp.modify(&QpModify::Err).unwrap();
        let mut w = Vec::new();
        poll_all(&a.cq, &mut w);
        assert_eq!(
            w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            (0..3).map(|i| (i, WcStatus::WrFlushErr)).collect::<Vec<_>>()
        );
        assert!(
            a.qp.modify(&QpModify::Init { port_num: 1, pkey_index: 0, access: RW }).is_err(),
            "ERR -> INIT is illegal"
        );
        a.qp.modify(&QpModify::Reset).unwrap();
        assert!(
            matches!(
                a.qp.modify(&QpModify::Err),
                Err(FabricError::InvalidTransition { from: QpState::Reset, to: QpState::Err })
            ),
            "RESET -> ERR is illegal (the kernel's state table)"
        );
        assert!(
            matches!(
                a.qp.modify(&QpModify::Init { port_num: 2, pkey_index: 0, access: RW }),
                Err(FabricError::InvalidArgument { .. })
            ),
            "INIT on a port the device does not drive"
        );
        assert_eq!(a.qp.state(), QpState::Reset);
        a.qp.modify(&QpModify::Init { port_num: 1, pkey_index: 0, access: RW }).unwrap();
        dev = a.dev.clone();
        assert_eq!(dev.live_counts(), LiveCounts { qps: 1, mrs: 1, cqs: 1, pds: 1, wqes: 1024 });
    }
    assert_eq!(dev.live_counts(), LiveCounts::default());
}

#[test]
fn cq_overrun_raises_cq_err_and_kills_its_qps() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, config(s), 4096);
    let dev_b = SoftDevice::open_sim(&net, ip(2), config(s + 1));
    let pd = dev_b.alloc_pd().unwrap();
    let tiny = dev_b.create_cq(2).unwrap();
    let cap = QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qp = dev_b.create_qp(&pd, &tiny, &tiny, &QpInitAttr { cap, sq_sig_all: false }).unwrap();
    let buf = RegisteredBuf::new(&dev_b, &pd, 4096, RW).unwrap();
    let b = Node { dev: dev_b, pd, cq: tiny, qp, buf };
    connect(&a, &b, RC);
    for i in 0..4 {
        b.qp.post_recv(&[RecvWr { wr_id: i, sg_list: &[b.buf.sge(0, 64)] }]).unwrap();
        a.qp.post_send(&[SendWr { wr_id: i, op: SendOp::Send, sg_list: &[], flags: SendFlags::UNSIGNALED }])
            .unwrap();
    }
    let mut now = Instant::ZERO;
    assert!(run_until(&[&a.dev, &b.dev], &mut now, 1000, |_| b.qp.state() == QpState::Err));
    assert_eq!(b.dev.poll_async_event(), Some(AsyncEvent::CqErr { cq_id: b.cq.id() }));
    assert_eq!(b.dev.poll_async_event(), Some(AsyncEvent::QpFatal { qp_num: b.qp.qp_num() }));
}

#[test]
fn posting_checks_state_queue_depth_and_sges() {
    let s = seed();
    let net = SimNet::new(s, Duration::ZERO);
    let a = node(&net, 1, config(s), 4096);
    let b = node(&net, 2, config(s + 1), 4096);
    let send = |n: usize| {
        let sges = vec![a.buf.sge(0, 1); n];
        a.qp.post_send(&[SendWr { wr_id: 0, op: SendOp::Send, sg_list: &sges, flags: SendFlags::SIGNALED }])
    };
    assert!(send(1).is_err(), "RESET refuses sends");
    assert!(a.qp.post_recv(&[RecvWr { wr_id: 0, sg_list: &[] }]).is_err(), "RESET refuses receives");
    connect(&a, &b, RC);
    assert!(matches!(send(5), Err(FabricError::Post { index: 0, .. })), "4 SGEs max");
    for _ in 0..512 {
        send(1).unwrap();
    }
    assert!(matches!(send(1), Err(FabricError::Post { .. })), "send queue full");
    let big = SendWr {
        wr_id: 0,
        op: SendOp::Send,
        sg_list: &[a.buf.sge(0, 65)],
        flags: SendFlags { inline: true, ..SendFlags::default() },
    };
    assert!(b.qp.post_send(&[big]).is_err(), "inline above max_inline_data");
    let sge = Sge { addr: 0, length: 0, lkey: 0 };
    assert!(b.qp.post_recv(&[RecvWr { wr_id: 0, sg_list: &[sge; 5] }]).is_err(), "4 SGEs max");
}

/// Connects one more QP pair on the devices of `a` and `b`.
fn second_pair(a: &Node, b: &Node) -> (SoftQp, SoftQp) {
    let cap =
        QpCaps { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 0 };
    let attr = QpInitAttr { cap, sq_sig_all: false };
    let qa = a.dev.create_qp(&a.pd, &a.cq, &a.cq, &attr).unwrap();
    let qb = b.dev.create_qp(&b.pd, &b.cq, &b.cq, &attr).unwrap();
    to_rtr(&qa, &qb, b.dev.ip(), 100, RC);
    to_rtr(&qb, &qa, a.dev.ip(), 200, RC);
    to_rts(&qa, 200, RC);
    to_rts(&qb, 100, RC);
    (qa, qb)
}

#[test]
fn a_kernel_refusal_sends_the_writes_by_the_wire_under_loss() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let faults = FaultConfig::symmetric(DirFaults::lossy(0.1));
    let a = node(&net, 1, SoftConfig { faults, ..on_path(s, SingleCopy::Auto) }, 1 << 20);
    let b = node(&net, 2, SoftConfig { faults, ..on_path(s + 1, SingleCopy::Auto) }, 1 << 20);
    // As when Yama's ptrace_scope forbids the copy.
    b.dev.force_placement_errno(Some(libc::EPERM));
    connect(&a, &b, RC);
    let mut now = Instant::ZERO;
    write_then_send(&a, &b, 100, &[100, 4096, 65536], 8, &mut now, s);
    let (sa, sb) = (a.dev.stats(), b.dev.stats());
    assert_eq!(sa.placed_refused, 1, "seed {s}: the requester switches once: {sa:?}");
    assert!(sb.placed_refused >= 1 && sb.placed_writes == 0, "seed {s}: {sb:?}");
    assert!(sa.placed_sent >= 1);
    // The device remembers: a new QP to the same peer does not try again.
    let (qa, qb) = second_pair(&a, &b);
    b.buf.buf().fill(0);
    a.buf.buf().write(0, &[7u8; 5000]).unwrap();
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite { remote_addr: b.buf.addr_at(0), rkey: b.buf.rkey() },
        sg_list: &[a.buf.sge(0, 5000)],
        flags: SendFlags::SIGNALED,
    };
    qa.post_send(&[wr]).unwrap();
    let mut wa = Vec::new();
    assert!(run_until(&[&a.dev, &b.dev], &mut now, 100_000, |_| {
        poll_all(&a.cq, &mut wa);
        !wa.is_empty()
    }));
    assert_eq!(wa[0].status, WcStatus::Success, "seed {s}");
    assert_eq!(b.buf.buf().to_vec(0, 5000).unwrap(), vec![7u8; 5000]);
    assert_eq!(a.dev.stats().placed_sent, sa.placed_sent, "seed {s}: no placement after the refusal");
    drop((qa, qb));
}

#[test]
fn a_responder_with_single_copy_off_refuses_and_the_wire_takes_over() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, on_path(s, SingleCopy::Auto), 1 << 20);
    let b = node(&net, 2, on_path(s + 1, SingleCopy::Off), 1 << 20);
    connect(&a, &b, RC);
    let mut now = Instant::ZERO;
    write_then_send(&a, &b, 50, &[1, 4096, 65536], 8, &mut now, s);
    let (sa, sb) = (a.dev.stats(), b.dev.stats());
    assert_eq!(
        (sa.placed_refused, sb.placed_refused, sb.placed_writes),
        (1, 1, 0),
        "seed {s}: {sa:?} {sb:?}"
    );
    assert_eq!(sa.timeouts, 0, "seed {s}: the refusal costs no timeout");
}

/// One crafted placement request: PSN, nonce, RETH length, gather list.
type Crafted = (u32, u64, u32, Vec<(u64, u32)>);

/// Sends crafted placement requests from a raw port at ip(1) to a QP of `b` in RTR and returns
/// the (syndrome, PSN) of each response.
fn hostile_placed(
    b: &Node,
    raw: &mut SimPort,
    now: &mut Instant,
    live: (u64, u64),
    requests: &[Crafted],
) -> Vec<(Syndrome, u32)> {
    let meta = IcrcMeta::new(ip(1), b.dev.ip(), packet::ROCEV2_UDP_PORT, packet::ROCEV2_UDP_PORT);
    let mut out = Vec::new();
    for (psn, nonce, dma_len, sges) in requests {
        let mut bth = Bth::new(Opcode::RcPlacedWrite, b.qp.qp_num(), *psn);
        bth.ack_req = true;
        let reth = Reth { va: b.buf.addr_at(0), rkey: b.buf.rkey(), dma_len: *dma_len };
        let headers = Headers { reth: Some(reth), ..Headers::new(bth) };
        let mut payload = vec![0u8; place::PlacedWrite::len_for(sges.len())];
        let psns = dma_len.div_ceil(4096).max(1);
        assert!(place::PlacedWrite::emit(*nonce, psns, live, sges, &mut payload));
        let mut frame = Vec::new();
        packet::build(&meta, &headers, &payload, &mut frame).unwrap();
        raw.send(*now, b.dev.ip(), &frame).unwrap();
        *now += Duration::from_micros(10);
        b.dev.progress(*now).unwrap();
        // The responses to what a call receives leave on the next call.
        b.dev.progress(*now).unwrap();
        *now += Duration::from_micros(10);
        let mut buf = vec![0u8; 256];
        while let Some(r) = raw.recv(*now, &mut buf).unwrap() {
            let p = packet::parse_unchecked(&buf[..r.len]).unwrap();
            out.push((p.headers.aeth.unwrap().syndrome, p.headers.bth.psn));
        }
    }
    out
}

/// Takes a QP (in RESET) to RTR with REMOTE_WRITE, facing QPN 0x1234 at ip(1) (a raw port),
/// expecting PSN 100.
fn ready_for_raw_peer(qp: &SoftQp) {
    qp.modify(&QpModify::Init { port_num: 1, pkey_index: 0, access: Access::REMOTE_WRITE }).unwrap();
    qp.modify(&QpModify::Rtr {
        path_mtu: Mtu::Mtu4096,
        dest_qpn: 0x1234,
        rq_psn: 100,
        dest: PortAddr::from_ipv4(ip(1)),
        max_dest_rd_atomic: 0,
        min_rnr_timer: 1,
    })
    .unwrap();
}

#[test]
fn hostile_placement_requests_are_refused_checked_or_fail_the_qp() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let b = node(&net, 2, on_path(s, SingleCopy::Auto), 16384);
    let mut raw = net.attach(ip(1));
    let nonce = raw.local_peer().unwrap().nonce;
    ready_for_raw_peer(&b.qp);
    let src = vec![0xabu8; 8192];
    let at = src.as_ptr() as u64;
    let mut now = Instant::ZERO;
    let ack = |psn| (Syndrome::Ack { credit_code: 0x1f }, psn);
    let nak = |code, psn| (Syndrome::Nak(code), psn);
    let word = live::LiveWord::new();
    let live = (word.addr(), word.token());
    let got = hostile_placed(
        &b,
        &mut raw,
        &mut now,
        live,
        &[
            // Placed from this process (the sim's ports all live here): 2 PSNs.
            (100, nonce, 8192, vec![(at, 4096), (at + 4096, 4096)]),
            // A replay: a duplicate, re-acknowledged, not copied again.
            (100, nonce, 8192, vec![(at, 8192)]),
            // Another identity than the registry's: refused, the requester would use the wire.
            (102, nonce ^ 1, 8, vec![(at, 8)]),
            // Gather addresses the requester does not have: EFAULT, a remote operational error.
            (102, nonce, 8, vec![(8, 8)]),
        ],
    );
    assert_eq!(
        got,
        vec![
            ack(101),
            ack(101),
            nak(NakCode::PlacementRefused, 102),
            nak(NakCode::RemoteOperationalError, 102)
        ],
        "seed {s}"
    );
    assert_eq!(b.buf.buf().to_vec(0, 8192).unwrap(), src);
    let st = b.dev.stats();
    assert_eq!((st.placed_writes, st.placed_bytes, st.placed_refused, st.duplicates), (1, 8192, 1, 1));
    assert_eq!(b.qp.state(), QpState::Err);

    // Lengths that do not add up, and a range outside the region: nothing is copied.
    for (dma_len, sges, code) in [
        (100, vec![(at, 8192)], NakCode::InvalidRequest),
        (16385, vec![(at, 8192), (at, 8192), (at, 1)], NakCode::RemoteAccessError),
    ] {
        b.buf.buf().fill(0);
        b.qp.modify(&QpModify::Reset).unwrap();
        ready_for_raw_peer(&b.qp);
        let got = hostile_placed(&b, &mut raw, &mut now, live, &[(100, nonce, dma_len, sges)]);
        assert_eq!(got, vec![nak(code, 100)], "seed {s}");
        assert!(b.buf.buf().to_vec(0, 16384).unwrap().iter().all(|&x| x == 0));
        assert_eq!(b.qp.state(), QpState::Err);
    }
}

/// A placement request executed after its work request left the requester's queue (a late
/// responder, e.g. one that was stopped) is dropped like a lost packet: no ACK, no completion,
/// the expected PSN unmoved, counted as stale. The same PSN with a live word then goes through.
#[test]
fn a_placement_request_executed_after_the_requester_gave_up_is_dropped() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let b = node(&net, 2, on_path(s, SingleCopy::Auto), 16384);
    let mut raw = net.attach(ip(1));
    let nonce = raw.local_peer().unwrap().nonce;
    ready_for_raw_peer(&b.qp);
    let src = vec![0x5au8; 4096];
    let at = src.as_ptr() as u64;
    let mut now = Instant::ZERO;
    let gone = live::LiveWord::new();
    let stale = (gone.addr(), gone.token());
    drop(gone);
    let got = hostile_placed(&b, &mut raw, &mut now, stale, &[(100, nonce, 4096, vec![(at, 4096)])]);
    assert_eq!(got, vec![], "seed {s}: a stale request is not acknowledged");
    let st = b.dev.stats();
    assert_eq!((st.placed_stale, st.placed_writes, st.placed_bytes), (1, 0, 0), "seed {s}: {st:?}");
    assert_eq!(b.qp.state(), QpState::Rtr, "seed {s}: the QP lives on");
    let word = live::LiveWord::new();
    let got = hostile_placed(
        &b,
        &mut raw,
        &mut now,
        (word.addr(), word.token()),
        &[(100, nonce, 4096, vec![(at, 4096)])],
    );
    assert_eq!(got, vec![(Syndrome::Ack { credit_code: 0x1f }, 100)], "seed {s}: PSN 100 was still expected");
    assert_eq!(b.buf.buf().to_vec(0, 4096).unwrap(), src);
}

/// The late responder end to end, on both paths: a WRITE-with-immediate is sent, the requester
/// flushes it (its QP goes to ERR) and reuses the buffer before the responder runs. On the wire
/// the responder gets the snapshot that was sent and completes it (what an HCA does); on the
/// single-copy path the copy would read the reused buffer, so the request is dropped as stale
/// and nothing completes. The responder never reports the new bytes as the WRITE's data.
#[test]
fn a_late_responder_never_delivers_a_reused_buffer() {
    for path in PATHS {
        let s = seed();
        let net = SimNet::new(s, Duration::from_millis(1));
        let a = node(&net, 1, on_path(s, path), 4096);
        let b = node(&net, 2, on_path(s + 1, path), 4096);
        connect(&a, &b, RC);
        b.qp.post_recv(&[RecvWr { wr_id: 7, sg_list: &[] }]).unwrap();
        let old = pattern(1, 4096);
        a.buf.buf().write(0, &old).unwrap();
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::RdmaWriteWithImm { remote_addr: b.buf.addr_at(0), rkey: b.buf.rkey(), imm: 9 },
            sg_list: &[a.buf.sge(0, 4096)],
            flags: SendFlags::SIGNALED,
        };
        a.qp.post_send(&[wr]).unwrap();
        let mut now = Instant::ZERO;
        a.dev.progress(now).unwrap();
        // The request is on its way; the requester gives up and reuses the buffer.
        a.qp.modify(&QpModify::Err).unwrap();
        let mut wcs = Vec::new();
        poll_all(&a.cq, &mut wcs);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::WrFlushErr)],
            "seed {s} {path:?}"
        );
        a.buf.buf().write(0, &pattern(2, 4096)).unwrap();
        now += Duration::from_millis(5);
        b.dev.progress(now).unwrap();
        let mut got = Vec::new();
        poll_all(&b.cq, &mut got);
        let st = b.dev.stats();
        match path {
            SingleCopy::Auto | SingleCopy::Syscall => {
                assert!(got.is_empty(), "seed {s}: a stale placement completed: {got:?}");
                assert_eq!((st.placed_stale, st.placed_writes), (1, 0), "seed {s}: {st:?}");
            }
            SingleCopy::Off => {
                assert_eq!(got.len(), 1, "seed {s}: {got:?}");
                assert_eq!((got[0].status, got[0].imm_data), (WcStatus::Success, Some(9)));
                assert_eq!(b.buf.buf().to_vec(0, 4096).unwrap(), old, "seed {s}: the wire's snapshot");
            }
        }
    }
}

#[test]
fn a_senders_arena_is_unmapped_once_its_port_is_gone() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, on_path(s, SingleCopy::Auto), 1 << 18);
    let b = node(&net, 2, on_path(s + 1, SingleCopy::Auto), 1 << 18);
    connect(&a, &b, RC);
    let mut now = Instant::ZERO;
    write_then_send(&a, &b, 10, &[4096, 65536], 4, &mut now, s);
    let mapped = usize::from(lnet_shim::arena::arena().is_some());
    assert_eq!(b.dev.mapped_arenas(), mapped, "seed {s}");
    assert_eq!(b.dev.stats().placed_mapped, b.dev.stats().placed_writes * mapped as u64);
    // The sender is still there: a later check keeps the mapping.
    now += Duration::from_secs(6);
    b.dev.progress(now).unwrap();
    assert_eq!(b.dev.mapped_arenas(), mapped, "seed {s}: a live sender's mapping was dropped");
    // Its port goes away: within the check interval of device activity, so does the mapping.
    net.detach(ip(1));
    now += Duration::from_secs(1);
    b.dev.progress(now).unwrap();
    assert_eq!(b.dev.mapped_arenas(), mapped, "checked at most every 5 s");
    now += Duration::from_secs(5);
    b.dev.progress(now).unwrap();
    assert_eq!(b.dev.mapped_arenas(), 0, "seed {s}: a departed sender's arena stays mapped");
    drop(a);
}

/// A placed WRITE is copied from the sender's mapped arena only when its whole gather list lies
/// in the arena; memory outside it (here a heap buffer), alone or mixed with arena memory, is
/// copied with `process_vm_readv`. Every byte arrives either way.
#[test]
fn sources_outside_the_arena_are_copied_with_process_vm_readv() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, on_path(s, SingleCopy::Auto), 65536);
    let b = node(&net, 2, on_path(s + 1, SingleCopy::Auto), 3 * 65536);
    let heap = RegisteredBuf::register(&a.dev, &a.pd, lnet_shim::Buffer::on_heap(65536), RW).unwrap();
    connect(&a, &b, RC);
    let (arena_data, heap_data) = (pattern(1, 20000), pattern(2, 30000));
    a.buf.buf().write(0, &arena_data).unwrap();
    heap.buf().write(0, &heap_data).unwrap();
    let write = |wr_id: u64, at: usize, sg_list: &[crate::fabric::Sge]| {
        let op = SendOp::RdmaWrite { remote_addr: b.buf.addr_at(at), rkey: b.buf.rkey() };
        a.qp.post_send(&[SendWr { wr_id, op, sg_list, flags: SendFlags::SIGNALED }]).unwrap();
    };
    write(1, 0, &[a.buf.sge(0, 20000)]); // all in the arena: mapped
    write(2, 65536, &[heap.sge(0, 30000)]); // all on the heap
    write(3, 2 * 65536, &[a.buf.sge(0, 20000), heap.sge(0, 30000)]); // mixed
    let mut now = Instant::ZERO;
    let mut wcs = Vec::new();
    let done = run_until(&[&a.dev, &b.dev], &mut now, 100_000, |_| {
        poll_all(&a.cq, &mut wcs);
        wcs.len() == 3
    });
    assert!(done, "seed {s}: {wcs:?}");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "seed {s}: {wcs:?}");
    assert_eq!(b.buf.buf().to_vec(0, 20000).unwrap(), arena_data);
    assert_eq!(b.buf.buf().to_vec(65536, 30000).unwrap(), heap_data);
    let mut both = arena_data.clone();
    both.extend(&heap_data);
    assert_eq!(b.buf.buf().to_vec(2 * 65536, 50000).unwrap(), both, "seed {s}");
    let st = b.dev.stats();
    let mapped = u64::from(lnet_shim::arena::arena().is_some());
    assert_eq!((st.placed_writes, st.placed_mapped), (3, mapped), "seed {s}: {st:?}");
}

/// SENDs both ways on one connection, each of a's answered by one of b's with 8 in flight, on
/// a clean wire and under loss, reordering and duplication: positive ACKs ride on the other
/// direction's SENDs (a SEND that arrives while the answer to an earlier one waits to leave),
/// and still every message arrives once and in order on both sides, and every send completes
/// with success, in order.
#[test]
fn acks_ride_on_sends_the_other_way_and_nothing_is_lost_under_faults() {
    let s = seed();
    let lossy = FaultConfig {
        tx: DirFaults {
            drop: 0.1,
            reorder: 0.1,
            duplicate: 0.05,
            delay_max: Duration::from_micros(30),
            ..DirFaults::NONE
        },
        rx: DirFaults::NONE,
    };
    const SLOT: usize = 4096;
    const SLOTS: u64 = 64;
    let sizes = [8usize, 300, 1024, 3000];
    let (n, window) = (400u64, 8u64);
    for faults in [FaultConfig::NONE, lossy] {
        let net = SimNet::new(s, Duration::from_micros(5)).with_jitter(Duration::from_micros(3));
        let a = node(&net, 1, SoftConfig { faults, mtu: Mtu::Mtu1024, ..config(s) }, 1 << 20);
        let b = node(&net, 2, SoftConfig { faults, mtu: Mtu::Mtu1024, ..config(s + 1) }, 1 << 20);
        connect(&a, &b, Rc { mtu: Mtu::Mtu1024, ..RC });
        // Receive slots first, send slots after them.
        let recv_sge = |x: &Node, slot: u64| x.buf.sge(slot as usize * SLOT, SLOT as u32);
        let send_at = |slot: u64| (SLOTS as usize + slot as usize) * SLOT;
        for x in [&a, &b] {
            for i in 0..SLOTS {
                x.qp.post_recv(&[RecvWr { wr_id: i, sg_list: &[recv_sge(x, i)] }]).unwrap();
            }
        }
        let send = |x: &Node, m: u64, data: &[u8]| {
            let at = send_at(m % SLOTS);
            x.buf.buf().write(at, data).unwrap();
            let sge = x.buf.sge(at, data.len() as u32);
            let wr = SendWr {
                wr_id: m,
                op: SendOp::SendWithImm { imm: m as u32 },
                sg_list: &[sge],
                flags: SendFlags::SIGNALED,
            };
            x.qp.post_send(&[wr]).unwrap();
        };
        let (mut posted, mut answered) = (0u64, 0u64);
        let (mut got_a, mut got_b, mut done_a, mut done_b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut now = Instant::ZERO;
        let finished = run_paced(
            &[&a.dev, &b.dev],
            &mut now,
            2_000_000,
            Duration::from_micros(1),
            Duration::ZERO,
            |_| {
                while posted < n && posted - answered < window {
                    send(&a, posted, &pattern(posted, sizes[posted as usize % sizes.len()]));
                    posted += 1;
                }
                for (x, got, done, answer) in
                    [(&b, &mut got_b, &mut done_b, true), (&a, &mut got_a, &mut done_a, false)]
                {
                    let mut wcs = Vec::new();
                    poll_all(&x.cq, &mut wcs);
                    for wc in wcs {
                        assert_eq!(wc.status, WcStatus::Success, "seed {s}: {wc:?}");
                        if wc.opcode != WcOpcode::Recv {
                            done.push(wc.wr_id);
                            continue;
                        }
                        let m = u64::from(wc.imm_data.expect("imm"));
                        let want = if answer {
                            pattern(m, sizes[m as usize % sizes.len()])
                        } else {
                            pattern(m + n, 16)
                        };
                        let slot = wc.wr_id as usize;
                        assert_eq!(wc.byte_len as usize, want.len(), "seed {s}: message {m}");
                        assert!(
                            x.buf.buf().to_vec(slot * SLOT, want.len()).unwrap() == want,
                            "seed {s}: message {m}"
                        );
                        got.push(m);
                        x.qp.post_recv(&[RecvWr { wr_id: wc.wr_id, sg_list: &[recv_sge(x, wc.wr_id)] }])
                            .unwrap();
                        if answer {
                            send(&b, m, &pattern(m + n, 16));
                        } else {
                            answered += 1;
                        }
                    }
                }
                done_a.len() as u64 == n && done_b.len() as u64 == n && answered == n
            },
        );
        let (sa, sb) = (a.dev.stats(), b.dev.stats());
        assert!(finished, "seed {s}: stalled at posted {posted} answered {answered}: {sa:?} {sb:?}");
        let all: Vec<u64> = (0..n).collect();
        for (what, seen) in
            [("b received", &got_b), ("a received", &got_a), ("a sent", &done_a), ("b sent", &done_b)]
        {
            assert_eq!(seen, &all, "seed {s}: {what}: not each once, in order");
        }
        assert!(sa.acks_piggybacked + sb.acks_piggybacked > 0, "seed {s}: no ACK rode: {sa:?} {sb:?}");
        if faults.tx.drop > 0.0 {
            assert!(sa.retransmits + sb.retransmits > 0, "seed {s}: the faults did nothing: {sa:?} {sb:?}");
        }
    }
}

/// `progress_receive` keeps the ACK of a single SEND for the next `progress` call, and tells
/// the caller not to sleep meanwhile: a reply posted in between carries it (one frame, no ACK
/// frame); with no reply, the next call sends it on its own. Either way the requester's SEND
/// completes.
#[test]
fn progress_receive_holds_a_sends_ack_for_the_reply_until_the_next_call() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, config(s), 1 << 16);
    let b = node(&net, 2, config(s + 1), 1 << 16);
    connect(&a, &b, RC);
    let send = |x: &Node, id: u64| {
        let wr =
            SendWr { wr_id: id, op: SendOp::Send, sg_list: &[x.buf.sge(0, 32)], flags: SendFlags::SIGNALED };
        x.qp.post_send(&[wr]).unwrap();
    };
    let step = Duration::from_micros(10);
    let mut now = Instant::ZERO;
    for (round, reply) in [(0u64, true), (1, false)] {
        for (x, id) in [(&a, 10 + round), (&b, 20 + round)] {
            x.qp.post_recv(&[RecvWr { wr_id: id, sg_list: &[x.buf.sge(4096, 64)] }]).unwrap();
        }
        send(&a, round);
        a.dev.progress(now).unwrap();
        now += step;
        let before = b.dev.stats();
        b.dev.progress_receive(now).unwrap();
        assert_eq!(b.dev.stats().tx_packets, before.tx_packets, "seed {s} round {round}: the ACK waits");
        assert_eq!(b.dev.next_deadline(), Some(Instant::ZERO), "seed {s}: the caller must come back at once");
        let mut wcs = Vec::new();
        poll_all(&b.cq, &mut wcs);
        assert!(
            wcs.iter().any(|w| w.wr_id == 20 + round && w.status == WcStatus::Success),
            "seed {s}: {wcs:?}"
        );
        if reply {
            send(&b, 30);
        }
        b.dev.progress(now).unwrap();
        let after = b.dev.stats();
        assert_eq!(after.tx_packets, before.tx_packets + 1, "seed {s} round {round}: one frame");
        let rode = after.acks_piggybacked - before.acks_piggybacked;
        assert_eq!(rode, u64::from(reply), "seed {s} round {round}: the ACK rides only on a reply");
        now += step;
        a.dev.progress(now).unwrap();
        let mut wcs = Vec::new();
        poll_all(&a.cq, &mut wcs);
        let sent: Vec<_> =
            wcs.iter().filter(|w| w.opcode != WcOpcode::Recv).map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(sent, [(round, WcStatus::Success)], "seed {s} round {round}");
    }
}

#[test]
fn a_timer_per_message_leaves_no_pile_of_cancelled_entries_and_a_moved_deadline_still_fires() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let a = node(&net, 1, config(s), 4096);
    let b = node(&net, 2, config(s + 1), 4096);
    let rc = Rc { timeout: 14, ..RC }; // 67 ms
    connect(&a, &b, rc);
    let timeout = packet::ack_timeout_duration(rc.timeout).unwrap();
    let mut now = Instant::ZERO;
    let send = |id: u64| {
        let wr =
            SendWr { wr_id: id, op: SendOp::Send, sg_list: &[a.buf.sge(0, 8)], flags: SendFlags::SIGNALED };
        a.qp.post_send(&[wr]).unwrap();
    };
    // Ping-pong far inside one retransmission timeout: each SEND arms the timer, its ACK
    // disarms it, the next SEND arms it later again.
    for i in 0..2000u64 {
        b.qp.post_recv(&[RecvWr { wr_id: i, sg_list: &[b.buf.sge(0, 64)] }]).unwrap();
        send(i);
        let mut wcs = Vec::new();
        assert!(
            run_until(&[&a.dev, &b.dev], &mut now, 100, |_| {
                poll_all(&a.cq, &mut wcs);
                wcs.iter().any(|w| w.wr_id == i)
            }),
            "seed {s}: SEND {i} never completed"
        );
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "seed {s}: {wcs:?}");
        poll_all(&b.cq, &mut Vec::new());
        now += Duration::from_micros(1);
    }
    assert!(now < Instant::ZERO + timeout, "the test must stay inside one timeout");
    let heap = a.dev.shared.lock().timers.len();
    assert!(heap <= 2, "seed {s}: {heap} timer entries for one QP");
    // The entry armed by the first SEND is still there, earlier than the last SEND's deadline;
    // when it comes up it must arm that deadline rather than retransmit or forget it.
    b.qp.post_recv(&[RecvWr { wr_id: 9999, sg_list: &[b.buf.sge(0, 64)] }]).unwrap();
    net.detach(b.dev.ip());
    send(9999);
    let last = now;
    assert!(run_until(&[&a.dev], &mut now, 1000, |_| a.dev.stats().timeouts > 0), "seed {s}: no timeout");
    assert!(now >= last + timeout && now < last + timeout + Duration::from_millis(1), "seed {s}: {now:?}");
}

/// `post_send_at` is a doorbell where the destination is reached through a same-host ring:
/// the SEND (with the ACK waiting) leaves before any `progress`. Through UDP, or before the
/// ring exists, it waits for `progress` as `post_send` does (frames are batched there).
#[test]
fn post_send_at_transmits_at_once_over_a_same_host_ring_and_waits_for_progress_elsewhere() {
    let port = 35_000 + (std::process::id() % 5000) as u16;
    for (n, path) in [(1u8, SingleCopy::Auto), (3, SingleCopy::Off)] {
        let udp_node = |host: u8| {
            let config = SoftConfig { udp_port: port, single_copy: path, ..config(seed()) };
            node_on(SoftDevice::open_udp(Ipv4Addr::new(127, 0, 43, host), config).unwrap(), 4096)
        };
        let (a, b) = (udp_node(n), udp_node(n + 1));
        connect(&a, &b, RC);
        for i in 0..4 {
            b.qp.post_recv(&[RecvWr { wr_id: i, sg_list: &[b.buf.sge(0, 64)] }]).unwrap();
        }
        let now = Instant::from_nanos(1);
        let send = |id: u64| {
            let wr = SendWr {
                wr_id: id,
                op: SendOp::Send,
                sg_list: &[a.buf.sge(0, 8)],
                flags: SendFlags::SIGNALED,
            };
            let before = a.dev.stats().tx_packets;
            a.qp.post_send_at(&[wr], now).unwrap();
            a.dev.stats().tx_packets - before
        };
        // Delivered to b, and its completion (the ACK) back at a, within a bounded wait.
        let delivered = |id: u64| {
            let clock = crate::clock::Clock::new();
            let give_up = clock.now() + Duration::from_secs(10);
            let (mut got, mut acked) = (false, false);
            while !(got && acked) && clock.now() < give_up {
                for d in [&a.dev, &b.dev] {
                    d.progress(now).unwrap();
                }
                let mut wcs = Vec::new();
                poll_all(&b.cq, &mut wcs);
                got |= wcs.iter().any(|w| w.opcode == WcOpcode::Recv && w.status == WcStatus::Success);
                wcs.clear();
                poll_all(&a.cq, &mut wcs);
                acked |= wcs.iter().any(|w| w.wr_id == id && w.status == WcStatus::Success);
            }
            got && acked
        };
        // The first frame opens the ring (in `progress`): no doorbell yet.
        assert_eq!(send(1), 0, "{path:?}: transmitted before the ring exists");
        assert!(delivered(1), "{path:?}: the first SEND never arrived");
        let rung = send(2);
        let expected = u64::from(path == SingleCopy::Auto);
        assert_eq!(rung, expected, "{path:?}: frames sent by post_send_at itself");
        assert!(delivered(2), "{path:?}: the second SEND never arrived");
        assert_eq!(a.dev.stats().ring_frames_sent > 0, path == SingleCopy::Auto, "{path:?}");
    }
}

/// Frames that go from one device straight into a same-host ring leave without their ICRC and
/// are decoded without its check; fault injection on either side makes them sealed and
/// checked again, so a corrupted frame is still caught (and retransmitted) rather than
/// delivered. Every SEND's payload is verified.
#[test]
fn ring_frames_go_unsealed_and_faults_on_either_side_seal_and_check_them() {
    let s = seed();
    let port = 40_000 + (std::process::id() % 5000) as u16;
    let corrupt = FaultConfig { tx: DirFaults::NONE, rx: DirFaults { corrupt: 0.1, ..DirFaults::NONE } };
    let tx_corrupt = FaultConfig { tx: corrupt.rx, rx: DirFaults::NONE };
    // (hosts, a's faults, b's faults)
    let cases = [
        (1u8, FaultConfig::NONE, FaultConfig::NONE),
        (3, FaultConfig::NONE, corrupt),
        (5, tx_corrupt, FaultConfig::NONE),
    ];
    for (n, fa, fb) in cases {
        let udp_node = |host: u8, faults: FaultConfig| {
            let config = SoftConfig { udp_port: port, faults, ..config(s + u64::from(host)) };
            node_on(SoftDevice::open_udp(Ipv4Addr::new(127, 0, 44, host), config).unwrap(), 1 << 20)
        };
        let (a, b) = (udp_node(n, fa), udp_node(n + 1, fb));
        connect(&a, &b, RC);
        const MSGS: u64 = 300;
        const LEN: usize = 1000;
        for i in 0..64u64 {
            b.qp.post_recv(&[RecvWr { wr_id: i, sg_list: &[b.buf.sge(i as usize * 4096, 4096)] }]).unwrap();
        }
        let (mut posted, mut got, mut acked) = (0u64, 0u64, 0u64);
        let mut now = Instant::ZERO;
        // A first round opens the rings both ways (frames sent before a ring exists go sealed,
        // by UDP or by the send that opens it); the second is counted.
        let mut before = (a.dev.stats(), b.dev.stats());
        for target in [16, MSGS] {
            before = (a.dev.stats(), b.dev.stats());
            let done = run_until(&[&a.dev, &b.dev], &mut now, 2_000_000, |_| {
                let mut wcs = Vec::new();
                poll_all(&b.cq, &mut wcs);
                for wc in wcs.drain(..) {
                    assert_eq!(
                        (wc.status, wc.byte_len as usize),
                        (WcStatus::Success, LEN),
                        "seed {s}: {wc:?}"
                    );
                    let m = u64::from(wc.imm_data.expect("imm"));
                    assert_eq!(m, got, "seed {s}: out of order");
                    let slot = wc.wr_id as usize * 4096;
                    assert!(
                        b.buf.buf().to_vec(slot, LEN).unwrap() == pattern(m, LEN),
                        "seed {s}: message {m} corrupt"
                    );
                    got += 1;
                    b.qp.post_recv(&[RecvWr { wr_id: wc.wr_id, sg_list: &[b.buf.sge(slot, 4096)] }]).unwrap();
                }
                poll_all(&a.cq, &mut wcs);
                for wc in wcs {
                    assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, acked), "seed {s}: {wc:?}");
                    acked += 1;
                }
                // Posted last: `run_until` stops when nothing is in flight after a turn.
                while posted < target && posted - got < 16 {
                    let at = (posted % 16) as usize * 4096;
                    a.buf.buf().write(at, &pattern(posted, LEN)).unwrap();
                    let wr = SendWr {
                        wr_id: posted,
                        op: SendOp::SendWithImm { imm: posted as u32 },
                        sg_list: &[a.buf.sge(at, LEN as u32)],
                        flags: SendFlags::SIGNALED,
                    };
                    a.qp.post_send(&[wr]).unwrap();
                    posted += 1;
                }
                got == target && acked == target
            });
            assert!(
                done,
                "seed {s} case {n}: stalled at {posted}/{got}/{acked}: {:?} {:?}",
                a.dev.stats(),
                b.dev.stats()
            );
        }
        let minus = |x: FabricStats, y: FabricStats| FabricStats {
            ring_frames_sent: x.ring_frames_sent - y.ring_frames_sent,
            ring_frames_received: x.ring_frames_received - y.ring_frames_received,
            ring_frames_unsealed_sent: x.ring_frames_unsealed_sent - y.ring_frames_unsealed_sent,
            ring_frames_unsealed_received: x.ring_frames_unsealed_received - y.ring_frames_unsealed_received,
            bad_icrc: x.bad_icrc - y.bad_icrc,
            malformed: x.malformed - y.malformed,
            retransmits: x.retransmits - y.retransmits,
            ..x
        };
        let (sa, sb) = (minus(a.dev.stats(), before.0), minus(b.dev.stats(), before.1));
        assert!(sa.ring_frames_sent > 0 && sb.ring_frames_received > 0, "case {n}: no ring: {sa:?}");
        match (fa == FaultConfig::NONE, fb == FaultConfig::NONE) {
            (true, true) => {
                // Both ways unsealed, nothing dropped, nothing retransmitted.
                assert_eq!(sa.ring_frames_unsealed_sent, sa.ring_frames_sent, "{sa:?}");
                assert_eq!(sb.ring_frames_unsealed_received, sb.ring_frames_received, "{sb:?}");
                assert_eq!(sb.ring_frames_unsealed_sent, sb.ring_frames_sent, "{sb:?}");
                assert_eq!((sa.bad_icrc, sb.bad_icrc, sa.retransmits), (0, 0, 0), "{sa:?} {sb:?}");
            }
            (true, false) => {
                // a sends unsealed; b's injector seals each before corrupting, and b checks.
                assert!(
                    sa.ring_frames_unsealed_sent > 0 && sb.ring_frames_unsealed_received > 0,
                    "{sa:?} {sb:?}"
                );
                assert_eq!(sb.ring_frames_unsealed_sent, 0, "b injects faults: it seals: {sb:?}");
                assert!(sb.bad_icrc + sb.malformed > 0 && sa.retransmits > 0, "seed {s}: {sa:?} {sb:?}");
            }
            _ => {
                // a injects faults: it seals everything it sends, and b catches the corruption.
                assert_eq!(sa.ring_frames_unsealed_sent, 0, "{sa:?}");
                assert_eq!(sb.ring_frames_unsealed_received, 0, "{sb:?}");
                assert!(sb.bad_icrc + sb.malformed > 0 && sa.retransmits > 0, "seed {s}: {sa:?} {sb:?}");
            }
        }
    }
}

/// A link taken down loses every frame both ways, raises `PORT_ERR` once and reports the port
/// down; a send posted meanwhile completes once the link is back (RC retransmits it).
#[test]
fn a_link_down_loses_frames_and_a_send_retransmitted_after_it_returns_completes() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let (a, b) = (node(&net, 1, config(s), 4096), node(&net, 2, config(s ^ 1), 4096));
    connect(&a, &b, RC);
    b.qp.post_recv(&[RecvWr { wr_id: 7, sg_list: &[b.buf.sge(0, 64)] }]).unwrap();
    a.dev.set_port_state(PortState::Down);
    a.dev.set_port_state(PortState::Init);
    assert_eq!(a.dev.poll_async_event(), Some(AsyncEvent::PortErr));
    assert_eq!(a.dev.poll_async_event(), None, "one PORT_ERR for one outage");
    assert_eq!(a.dev.query_port().state, PortState::Init);
    a.qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[a.buf.sge(0, 8)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let mut now = Instant::ZERO;
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    // 15 ms of retransmits into a dead link (the QP's retries last about 33 ms: 4 ms ACK
    // timeout, 7 retries): nothing arrives, nothing completes.
    let end = now + Duration::from_millis(15);
    run_until(&[&a.dev, &b.dev], &mut now, 100_000, |t| {
        poll_all(&a.cq, &mut wa);
        poll_all(&b.cq, &mut wb);
        t >= end
    });
    assert!(wa.is_empty() && wb.is_empty(), "seed {s}: {wa:?} {wb:?}");
    let lost = a.dev.fault_stats().link_down;
    assert!(lost >= 2, "seed {s}: the send and a retransmit were lost ({lost})");
    assert_eq!(a.dev.fault_stats().dropped, 0, "link losses are not fault drops");

    a.dev.set_port_state(PortState::Active);
    assert_eq!(a.dev.poll_async_event(), Some(AsyncEvent::PortActive));
    assert_eq!(a.dev.query_port().state, PortState::Active);
    assert!(run_until(&[&a.dev, &b.dev], &mut now, 100_000, |_| {
        poll_all(&a.cq, &mut wa);
        poll_all(&b.cq, &mut wb);
        !wa.is_empty() && !wb.is_empty()
    }));
    assert_eq!((wa.len(), wa[0].status), (1, WcStatus::Success), "seed {s}");
    assert_eq!((wb.len(), wb[0].wr_id, wb[0].status), (1, 7, WcStatus::Success), "seed {s}");
    assert_eq!(a.dev.fault_stats().link_down, lost, "nothing lost once the link is back");
}

/// A failed device flushes every QP's work, raises `DEVICE_FATAL`, and its port stays down.
#[test]
fn a_device_fatal_error_flushes_every_qp_and_keeps_the_port_down() {
    let s = seed();
    let net = SimNet::new(s, Duration::from_micros(5));
    let (a, b) = (node(&net, 1, config(s), 4096), node(&net, 2, config(s ^ 1), 4096));
    connect(&a, &b, RC);
    a.qp.post_recv(&[RecvWr { wr_id: 9, sg_list: &[a.buf.sge(0, 64)] }]).unwrap();
    a.qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[a.buf.sge(64, 8)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    a.dev.inject_device_fatal();
    assert_eq!(a.dev.poll_async_event(), Some(AsyncEvent::DeviceFatal));
    assert_eq!(a.dev.poll_async_event(), None, "no QP_FATAL per QP");
    assert_eq!(a.qp.state(), QpState::Err);
    let mut wa = Vec::new();
    poll_all(&a.cq, &mut wa);
    let mut got: Vec<(u64, WcStatus)> = wa.iter().map(|w| (w.wr_id, w.status)).collect();
    got.sort_by_key(|g| g.0);
    assert_eq!(got, vec![(1, WcStatus::WrFlushErr), (9, WcStatus::WrFlushErr)], "seed {s}");
    a.dev.set_port_state(PortState::Active);
    assert_eq!(a.dev.query_port().state, PortState::Down, "a failed device stays down");
    assert_eq!(a.dev.poll_async_event(), None);
}
