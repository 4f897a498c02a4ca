//! Soak and load on the simulated wire: mixed IMMEDIATE/PUT/GET traffic with every byte
//! verified under loss, reordering, duplication and corruption (which the ICRC must catch),
//! and a transmit pool far smaller than the work offered.
//!
//! The short versions run in CI. `LND_SOAK_TRANSFERS=<n>` sets the length of the `#[ignore]`d
//! long runs (default 50 000 per loss rate): `LND_SOAK_TRANSFERS=200000 cargo test -p lnd
//! --release soak -- --ignored --nocapture`. Every failure names the seed (`LND_SIM_SEED`).

use super::*;
use crate::fabric::FabricStats;
use crate::fabric::soft::{DirFaults, FaultConfig, FaultStats};

/// Loss `p` plus as much reordering, half as much duplication and half as much corruption.
fn hostile_wire(p: f64) -> FaultConfig {
    FaultConfig {
        tx: DirFaults {
            drop: p,
            reorder: p,
            duplicate: p / 2.0,
            corrupt: p / 2.0,
            delay: p,
            delay_max: Duration::from_micros(200),
        },
        rx: DirFaults::NONE,
    }
}

struct SoakResult {
    verified: u64,
    bytes: u64,
    faults: FaultStats,
    fabric: FabricStats,
}

/// Runs `transfers` random transfers among `nodes` engines over a wire with loss `p`; asserts
/// that every one completed exactly once on each side that saw it, that every success was
/// verified, and that credits and descriptors came home. Unless `may_fail`, every transfer
/// must succeed; with it, a transfer may fail when its connection dies (the RC retry count
/// exhausted: at 10% loss a packet and its ACKs can be lost `retry_cnt` times running), which
/// both sides then report once, as an error. Runs that may not fail give their QPs the most
/// retries there are (7) rather than o2iblnd's 5, with which a connection died in about one
/// random seed in 40 at 10% loss (seed 854803796: 12 transfers failed, as they should have).
fn soak(p: f64, nodes: usize, transfers: u64, max_len: usize, may_fail: bool) -> SoakResult {
    let s = seed();
    let t = if may_fail { tunables() } else { tunables_with_most_retries() };
    let mut sim = Sim::new(s, nodes, &t, hostile_wire(p));
    let mut w = Workload::new(s, transfers, 32, max_len);
    w.run(&mut sim, 200_000_000);
    assert_eq!(w.verified + w.failed, transfers, "seed {s}: loss {p}");
    if !may_fail {
        assert_eq!(w.failed, 0, "seed {s}: loss {p}");
    }
    settle_and_check(&mut sim);
    let mut faults = FaultStats::default();
    let mut fabric = FabricStats::default();
    for n in &sim.nodes {
        let f = n.engine.device().fault_stats();
        faults.dropped += f.dropped;
        faults.duplicated += f.duplicated;
        faults.reordered += f.reordered;
        faults.corrupted += f.corrupted;
        let d = n.engine.device().stats();
        fabric.bad_icrc += d.bad_icrc;
        fabric.retransmits += d.retransmits;
        fabric.duplicates += d.duplicates;
        fabric.tx_packets += d.tx_packets;
        let e = n.engine.stats();
        assert_eq!((e.protocol_errors, e.stale_msgs), (0, 0), "seed {s}: {e:?}");
        if !may_fail {
            assert_eq!(e.tx_timeouts, 0, "seed {s}: {e:?}");
        }
    }
    // The faults really happened, and the ICRC caught every corrupted frame it was handed.
    assert!(faults.dropped > 0 && faults.duplicated > 0 && faults.reordered > 0, "seed {s}: {faults:?}");
    assert!(faults.corrupted > 0 && fabric.bad_icrc > 0, "seed {s}: {faults:?} {fabric:?}");
    assert!(fabric.bad_icrc <= faults.corrupted * 2, "seed {s}: {faults:?} {fabric:?}");
    println!(
        "soak loss {:.0}%: {transfers} transfers, {} verified ({} bytes), {} failed with an error; frames {} \
         dropped {} duplicated {} reordered {} corrupted {} (ICRC rejects {}), retransmits {} (seed {s})",
        p * 100.0,
        w.verified,
        w.bytes_verified,
        w.failed,
        fabric.tx_packets,
        faults.dropped,
        faults.duplicated,
        faults.reordered,
        faults.corrupted,
        fabric.bad_icrc,
        fabric.retransmits
    );
    SoakResult { verified: w.verified, bytes: w.bytes_verified, faults, fabric }
}

#[test]
fn one_percent_loss_with_reordering_duplication_and_corruption_loses_no_byte() {
    let r = soak(0.01, 3, 400, 256 << 10, false);
    assert_eq!(r.verified, 400);
    assert!(r.bytes > 0 && r.fabric.retransmits > 0 && r.faults.dropped > 0);
}

#[test]
fn five_percent_loss_with_reordering_duplication_and_corruption_loses_no_byte() {
    soak(0.05, 3, 300, 256 << 10, false);
}

#[test]
fn ten_percent_loss_with_reordering_duplication_and_corruption_loses_no_byte() {
    soak(0.10, 3, 200, 256 << 10, false);
}

fn long_transfers() -> u64 {
    std::env::var("LND_SOAK_TRANSFERS").ok().and_then(|s| s.parse().ok()).unwrap_or(50_000)
}

#[test]
#[ignore = "long soak: run with --ignored (LND_SOAK_TRANSFERS sets the length)"]
fn long_soak_at_one_percent_loss() {
    soak(0.01, 4, long_transfers(), 1 << 20, false);
}

#[test]
#[ignore = "long soak: run with --ignored (LND_SOAK_TRANSFERS sets the length)"]
fn long_soak_at_five_percent_loss() {
    soak(0.05, 4, long_transfers(), 1 << 20, false);
}

#[test]
#[ignore = "long soak: run with --ignored (LND_SOAK_TRANSFERS sets the length)"]
fn long_soak_at_ten_percent_loss() {
    soak(0.10, 4, long_transfers(), 1 << 20, true);
}

#[test]
fn a_tiny_transmit_pool_queues_work_and_never_drops_it() {
    let s = seed();
    let mut t = tunables();
    t.ntx = 16;
    t.finalize().unwrap();
    let mut sim = Sim::new(s, 4, &t, FaultConfig::NONE);
    // 1 000 transfers, 200 in flight at once over 16 descriptors per node.
    let mut w = Workload::new(s, 1000, 200, 64 << 10);
    w.run(&mut sim, 3_000_000);
    assert_eq!((w.verified, w.failed), (1000, 0), "seed {s}");
    let waits: u64 = sim.nodes.iter().map(|n| n.engine.stats().tx_pool_waits).sum();
    assert!(waits > 100, "seed {s}: the pool really ran out ({waits} waits)");
    // The workload ends with its last verified transfer; a NOOP returning credits may still
    // hold a descriptor until its send completes (seed 989418009: one, on one node).
    sim.run_for(Duration::from_millis(100));
    for n in &sim.nodes {
        assert_eq!(n.engine.tx_descriptors(), (0, 16), "seed {s}: every descriptor back on {}", n.nid);
    }
    println!("ntx=16, 200 in flight: 1000 transfers verified after {waits} waits for a descriptor");
}
