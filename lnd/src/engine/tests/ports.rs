//! Ports that do not look like the default software port, as real HCAs do not: an InfiniBand
//! port (its GID is not its IP address), the second port of a dual-port HCA, sides with
//! different path MTUs, a device with fewer scatter/gather entries than `wrq_sge`, and one with
//! smaller CQs than the queue depth needs.

use std::sync::Arc;

use lnet_shim::buffer::Buffer;
use lnet_shim::lnd::{Frag, LndSend};

use super::*;
use crate::engine::EngineError;
use crate::fabric::soft::SoftLimits;
use crate::fabric::{Gid, Mtu, PortAddr};

/// Moves an IMMEDIATE and a bulk PUT each way between nodes 0 and 1 (node 0 connects) and
/// checks every byte.
fn both_ways(sim: &mut Sim, what: &str) {
    let s = sim.seed;
    for (tag, (a, b), len) in
        [(1, (0, 1), 3000), (2, (1, 0), 3000), (3, (0, 1), 200_000), (4, (1, 0), 200_000)]
    {
        let sink = sim.put(a, b, tag, len);
        assert!(sim.wait_send(a, tag, 200_000).is_ok(), "seed {s}: {what}: PUT {tag} ({len} B) failed");
        let got = sink.to_vec(0, len).unwrap();
        assert!(
            got.iter().enumerate().all(|(i, &x)| x == pattern_byte(tag, i)),
            "seed {s}: {what}: PUT {tag} corrupt"
        );
    }
    assert_eq!(sim.nodes[0].engine.conn_details(nid(1)).len(), 1, "seed {s}: {what}: one connection");
}

/// An InfiniBand port's GID comes from its GUID (`fe80::<guid>`), not from its IPoIB address;
/// peers still name it by IP. The engine must accept its NID and the CM must name the port by
/// IP in the REQ (a GID comparison refused the NID; naming the CM by the port's GID made the
/// peer reject the REQ with INVALID_GID).
#[test]
fn infiniband_ports_are_named_by_their_ip_not_their_gid() {
    let s = seed();
    let mut sim = Sim::new(s, 0, &tunables(), FaultConfig::NONE);
    for i in 0..2 {
        let mut gid = [0u8; 16];
        gid[..2].copy_from_slice(&[0xfe, 0x80]);
        gid[8..].copy_from_slice(&(0x0002_c903_0000_1000_u64 + i as u64).to_be_bytes());
        let ib = PortAddr { gid: Gid(gid), lid: 0x10 + i as u16 };
        let soft = SoftConfig { port_addr: Some(ib), ..SoftConfig::default() };
        sim.add_node(i, tunables(), FaultConfig::NONE, soft, 1000 + i as u64);
        assert_eq!(sim.nodes[i].engine.dev.query_port().addr, ib);
    }
    both_ways(&mut sim, "InfiniBand-named ports");
    let cm = sim.nodes[1].engine.cm_stats();
    assert_eq!(cm.invalid_req, 0, "seed {s}: {cm:?}");

    // A NID that is not the port's address is still refused.
    let dev = SoftDevice::open_sim(&sim.net, ip(5), SoftConfig::default());
    let cfg = EngineConfig::new(nid(6), tunables(), 1, s);
    match Engine::new(dev, cfg, Arc::new(TestLnet::default())) {
        Err(EngineError::WrongAddress { nid: n, .. }) => assert_eq!(n, nid(6)),
        Err(e) => panic!("seed {s}: {e}"),
        Ok(_) => panic!("seed {s}: an engine started on a NID that is not its port's"),
    }
    // And so is a NID on another kind of network, at the port's own address.
    let dev = SoftDevice::open_sim(&sim.net, ip(7), SoftConfig::default());
    let tcp: Nid = "10.0.0.8@tcp".parse().expect("a tcp NID");
    assert_eq!(tcp.addr(), ip(7), "the port's address");
    let cfg = EngineConfig::new(tcp, tunables(), 1, s);
    match Engine::new(dev, cfg, Arc::new(TestLnet::default())) {
        Err(e @ EngineError::NotO2ib { nid: n }) => {
            assert_eq!(n, tcp);
            assert!(e.to_string().contains("10.0.0.8@o2ib"), "{e}");
        }
        Err(e) => panic!("seed {s}: {e}"),
        Ok(_) => panic!("seed {s}: an engine started on a tcp NID"),
    }
}

/// The second port of a dual-port HCA: the QP is moved to INIT on the port the device drives,
/// not on port 1 (the device refuses another port, as hardware would send from the wrong one).
#[test]
fn a_device_on_port_2_connects() {
    let s = seed();
    let mut sim = Sim::new(s, 0, &tunables(), FaultConfig::NONE);
    for i in 0..2 {
        let soft = SoftConfig { port_num: 2, ..SoftConfig::default() };
        sim.add_node(i, tunables(), FaultConfig::NONE, soft, 1000 + i as u64);
    }
    both_ways(&mut sim, "port 2");
}

/// The side that connects has the smaller MTU (a RoCE netdev at 1500 against one at 9000):
/// the REQ carries its path MTU and the passive side must not send larger packets than that
/// (it used its own port's MTU, and every message over 1 KiB it sent was refused).
#[test]
fn the_passive_side_takes_the_smaller_path_mtu_of_the_req() {
    let s = seed();
    let mut sim = Sim::new(s, 0, &tunables(), FaultConfig::NONE);
    for (i, mtu) in [(0, Mtu::Mtu1024), (1, Mtu::Mtu4096)] {
        // The wire path: placed WRITEs carry no packets, so no MTU either.
        let soft = SoftConfig { mtu, single_copy: SingleCopy::Off, ..SoftConfig::default() };
        sim.add_node(i, tunables(), FaultConfig::NONE, soft, 1000 + i as u64);
    }
    both_ways(&mut sim, "MTU 1024 connecting to MTU 4096");
    let retransmits = sim.nodes[1].engine.dev.stats().retransmits;
    assert_eq!(retransmits, 0, "seed {s}: no packet of the passive side was refused");
}

/// A device with one SGE per work request while `wrq_sge` is 2: the QP is created with what
/// the device has, and the RDMA WRITEs must use no more (each WR with 2 SGEs was refused and
/// closed the connection on the first bulk transfer with more than one source fragment).
#[test]
fn rdma_writes_use_no_more_sges_than_the_qp_has() {
    let s = seed();
    let mut sim = Sim::new(s, 0, &tunables(), FaultConfig::NONE);
    assert_eq!(tunables().wrq_sge, 2);
    for i in 0..2 {
        let soft = SoftConfig {
            limits: SoftLimits { max_sge: 1, ..SoftLimits::default() },
            single_copy: SingleCopy::Off,
            ..SoftConfig::default()
        };
        sim.add_node(i, tunables(), FaultConfig::NONE, soft, 1000 + i as u64);
    }
    // Eight 4 KiB source fragments into one sink: two SGEs per WRITE if the device allowed.
    let len = 8 * 4096;
    let data = filled(7, len);
    let frags: Vec<Frag> = (0..8).map(|i| Frag { buf: data.clone(), offset: i * 4096, len: 4096 }).collect();
    let sink = Arc::new(Buffer::new(len));
    sim.nodes[1].lnet.post_sink(7, vec![Frag::whole(sink.clone())], len);
    let (a, b) = (nid(0), nid(1));
    let msg =
        LndSend { target: b, hdr: put_hdr(a, b, 7, len), payload: frags.into(), get_sink: None, token: 7 };
    sim.nodes[0].engine.send(sim.now, msg).unwrap();
    assert!(sim.wait_send(0, 7, 200_000).is_ok(), "seed {s}");
    assert_eq!(sink.to_vec(0, len).unwrap(), data.to_vec(0, len).unwrap(), "seed {s}");
    assert_eq!(sim.nodes[0].engine.conn_details(nid(1)).len(), 1, "seed {s}: the connection stays up");
}

/// A device whose CQs hold fewer entries than Q needs (`max_cqe` 1024 against the 2074 of
/// Q = 8 with 256 RDMA fragments): Q shrinks until both queues fit, as it does for a QP that
/// does not fit, and the peer adopts the smaller Q.
#[test]
fn a_device_with_small_cqs_gets_a_smaller_queue_depth() {
    let s = seed();
    let small =
        SoftConfig { limits: SoftLimits { max_cqe: 1024, ..SoftLimits::default() }, ..SoftConfig::default() };
    // The side that connects has the small CQs, then the side that accepts.
    for small_side in 0..2 {
        let mut sim = Sim::new(s, 0, &tunables(), FaultConfig::NONE);
        for i in 0..2 {
            let soft = if i == small_side { small.clone() } else { SoftConfig::default() };
            sim.add_node(i, tunables(), FaultConfig::NONE, soft, 1000 + i as u64);
        }
        both_ways(&mut sim, &format!("max_cqe 1024 on node {small_side}"));
        // (1 + 256) Q + 2Q + 2 <= 1024: Q = 3.
        assert_eq!(sim.nodes[0].engine.conn_details(nid(1))[0].credits.queue_depth, 3, "seed {s}");
        assert_eq!(sim.nodes[1].engine.conn_details(nid(0))[0].credits.queue_depth, 3, "seed {s}");
    }
}
