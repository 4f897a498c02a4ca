//! A PUT with an ACK between two LNet nodes in one process, over the o2iblnd on the software
//! RDMA fabric: `127.0.0.1@o2ib` and `127.0.0.2@o2ib` on loopback (UDP port 4791, or the
//! first argument). 256 KiB is over the IMMEDIATE limit, so the LND moves it as o2iblnd does:
//! PUT_REQ, PUT_ACK with the sink's RDMA descriptor, an RDMA WRITE, PUT_DONE.
//!
//! ```sh
//! cargo run --release -p lnd --example lnet_put [port]
//! ```

use std::sync::Arc;
use std::time::Duration;

use lnd::driver::{Driver, DriverConfig, FabricChoice};
use lnd::fabric::soft::SoftConfig;
use lnd::tunables::Tunables;
use lnet_shim::matching::{MdOptions, Threshold, Unlink};
use lnet_shim::{
    ANY_PROCESS, AckReq, Buffer, EventKind, EventQueue, Lnd, Lnet, LnetConfig, MatchEntry, Md, Nid, ProcessId,
};

type Error = Box<dyn std::error::Error>;

/// LNet with one o2ib interface at `nid`: ko2iblnd's tunables (the LNet credits come from
/// them, as `credits` and `peer_credits` do in the kernel), the software fabric on `port`.
fn node(nid: Nid, port: u16) -> Result<Lnet, Error> {
    let mut tunables = Tunables::default();
    tunables.finalize()?;
    let fabric = FabricChoice::Soft(SoftConfig { udp_port: port, ..SoftConfig::default() });
    let config = DriverConfig { nid, tunables: tunables.clone(), fabric, seed: None };
    let lnet = Lnet::new(LnetConfig::default())?;
    lnet.add_ni(nid, tunables.credits, tunables.peer_credits, |upcalls| {
        Driver::start(config, upcalls).map(|d| Arc::new(d) as Arc<dyn Lnd>)
    })?;
    Ok(lnet)
}

fn main() -> Result<(), Error> {
    let port = match std::env::args().nth(1) {
        Some(p) => p.parse().map_err(|e| format!("port {p:?}: {e}"))?,
        None => 4791,
    };
    let (a_nid, b_nid): (Nid, Nid) = ("127.0.0.1@o2ib".parse()?, "127.0.0.2@o2ib".parse()?);
    let (a, b) = (node(a_nid, port)?, node(b_nid, port)?);
    let wait = Duration::from_secs(10);
    let len = 256 << 10;

    // Target: a buffer on portal 8 for match bits 42, from anyone.
    let qb = EventQueue::new(64);
    let sink = Arc::new(Buffer::new(len));
    let md = Md::contiguous(sink.clone()).with_options(MdOptions::OP_PUT).with_events(qb.clone());
    b.attach(8, MatchEntry::new(ANY_PROCESS, 42), md, Unlink::Retain)?;

    // Initiator: PUT it with an ACK requested; the MD goes away after its two events.
    let qa = EventQueue::new(64);
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let md = Md::contiguous(Arc::new(Buffer::from_slice(&data)))
        .with_threshold(Threshold::Count(2))
        .with_events(qa.clone());
    let h = a.md_bind(md, Unlink::Auto)?;
    a.put(h, AckReq::Ack, ProcessId::new(b_nid, b.pid()), 8, 42, 0, 0)?;

    let put = qb.wait(wait).ok_or("no PUT event at the target")?;
    println!("{b_nid}: {:?} {:?}, {} bytes from {}", put.kind, put.status, put.mlength, put.initiator);
    if put.status.is_err() || sink.to_vec(0, len)? != data {
        return Err("the PUT did not deliver the bytes".into());
    }
    // SEND (the buffer may be reused), then ACK (the target has the data), in that order.
    for kind in [EventKind::Send, EventKind::Ack] {
        let e = qa.wait(wait).ok_or(format!("no {kind:?} event at the initiator"))?;
        println!("{a_nid}: {:?} {:?}", e.kind, e.status);
        if e.kind != kind || e.status.is_err() {
            return Err(format!("expected {kind:?}, got {:?} {:?}", e.kind, e.status).into());
        }
    }
    a.shutdown();
    b.shutdown();
    Ok(())
}
