//! Device-level tests.
//!
//! `open_without_a_device_is_no_device` runs everywhere: on machines without RDMA (these CI
//! machines: `ibv_get_device_list` fails with ENOSYS) it checks the error; with a device it
//! only checks that opening works.
//!
//! The `hw_*` tests need a NIC and are `#[ignore]`d. Run them with
//! `LND_VERBS_DEVICE=mlx5_0 cargo test -p lnd --features verbs fabric::verbs -- --ignored`
//! (RoCE also wants `LND_VERBS_IPV4=<the port's IPv4 address>`; `LND_VERBS_PORT` and
//! `LND_VERBS_GID_INDEX` override the port and GID). Without `LND_VERBS_DEVICE`, or when
//! libibverbs lists no device, they print why and pass.

use super::objects::{chain_index, inline_unregistered};
use super::*;
use crate::fabric::dma::RegisteredBuf;
use crate::fabric::{
    CompletionQueue, QpModify, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};

#[test]
fn open_without_a_device_is_no_device() {
    match VerbsDevice::open(VerbsConfig { mad_port: 0, ..VerbsConfig::default() }) {
        Err(FabricError::NoDevice { reason }) => {
            let msg = FabricError::NoDevice { reason: reason.clone() }.to_string();
            assert!(msg.starts_with("no RDMA device: "), "{msg}");
            if let Err(e) = DeviceList::get() {
                // The listing itself failed: the same cause must be named.
                assert!(
                    e.to_string().contains(&reason) || reason.contains("no usable RDMA port"),
                    "{e} / {reason}"
                );
            }
            eprintln!("as expected here: {msg}");
        }
        Err(e) => panic!("expected NoDevice, got {e:?}"),
        Ok(dev) => eprintln!("an RDMA device is present ({dev:?}); nothing to check"),
    }
    let named = VerbsDevice::open(VerbsConfig {
        device: Some("no-such-hca".to_owned()),
        mad_port: 0,
        ..VerbsConfig::default()
    });
    assert!(matches!(named, Err(FabricError::NoDevice { .. })), "{named:?}");
}

#[test]
fn chain_indices_and_inline_checks() {
    let wrs = [0u64; 4];
    let base = wrs.as_ptr();
    assert_eq!(chain_index(base, base.wrapping_add(2), 4), 2);
    assert_eq!(chain_index(base, std::ptr::null(), 4), 0);
    assert_eq!(chain_index(base, base.wrapping_add(4), 4), 0, "outside the chain");
    assert_eq!(chain_index(base, base.cast::<u8>().wrapping_add(3).cast(), 4), 0, "misaligned");

    let mut table = MrTable::new();
    table.insert(7, (0x1000, 0x100));
    let ok = [Sge { addr: 0x1000, length: 0x100, lkey: 7 }, Sge { addr: 0, length: 0, lkey: 0 }];
    assert_eq!(inline_unregistered(&table, &ok), None);
    let past = [Sge { addr: 0x10ff, length: 2, lkey: 7 }];
    assert!(inline_unregistered(&table, &past).is_some());
    let wrong_key = [Sge { addr: 0x1000, length: 1, lkey: 8 }];
    assert!(inline_unregistered(&table, &wrong_key).is_some());
    let wraps = [Sge { addr: u64::MAX, length: 2, lkey: 7 }];
    assert!(inline_unregistered(&table, &wraps).is_some());
}

/// The configuration from the environment, or `None` (with a message) if there is no device.
fn hw_config() -> Option<VerbsConfig> {
    let Ok(device) = std::env::var("LND_VERBS_DEVICE") else {
        eprintln!("skipped: set LND_VERBS_DEVICE to an RDMA device name (see ibv_devices)");
        return None;
    };
    if let Err(e) = DeviceList::get() {
        eprintln!("skipped: {e}");
        return None;
    }
    let env = |k: &str| std::env::var(k).ok();
    Some(VerbsConfig {
        device: Some(device),
        port: env("LND_VERBS_PORT").and_then(|v| v.parse().ok()),
        ipv4: env("LND_VERBS_IPV4").and_then(|v| v.parse().ok()),
        gid_index: env("LND_VERBS_GID_INDEX").and_then(|v| v.parse().ok()),
        mad_port: 0,
        ..VerbsConfig::default()
    })
}

#[test]
#[ignore = "needs an RDMA NIC (LND_VERBS_DEVICE)"]
fn hw_open_and_query() {
    let Some(config) = hw_config() else { return };
    let dev = VerbsDevice::open(config).unwrap();
    let attr = dev.query_device();
    let port = dev.query_port();
    eprintln!("{dev:?}\n{attr:?}\n{port:?}");
    assert!(attr.max_qp_wr > 0 && attr.max_sge > 0 && attr.max_cqe > 0);
    assert_eq!(port.state, PortState::Active);
    if dev.link_layer() == LinkLayer::Ethernet {
        assert!(port.addr.gid.to_ipv4().is_some(), "RoCE uses an IPv4-mapped GID");
    } else {
        assert!(port.addr.lid != 0 && port.addr.lid < 0xc000, "IB port has a unicast LID");
    }
    assert_eq!(dev.pollable_fds().len(), 1);
    dev.progress(Instant::ZERO).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    assert!(cq.cqe() >= 64);
    let huge = QpInitAttr {
        cap: QpCaps {
            max_send_wr: u32::MAX,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    match dev.create_qp(&pd, &cq, &cq, &huge) {
        Ok(qp) => assert!(qp.caps().max_send_wr <= attr.max_qp_wr.next_power_of_two()),
        Err(e) => assert!(e.is_resource(), "{e:?}"),
    }
    let stats = dev.stats();
    eprintln!("{stats:?}");
}

/// Two QPs of one port connected to each other: RDMA WRITE with immediate, an inline SEND,
/// and completions through the armed completion channel.
#[test]
#[ignore = "needs an RDMA NIC (LND_VERBS_DEVICE)"]
fn hw_loopback_write_and_send() {
    let Some(config) = hw_config() else { return };
    let dev = VerbsDevice::open(config).unwrap();
    let port = dev.query_port();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let cap =
        QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 2, max_recv_sge: 1, max_inline_data: 64 };
    let a = dev.create_qp(&pd, &cq, &cq, &QpInitAttr { cap, sq_sig_all: false }).unwrap();
    let b = dev.create_qp(&pd, &cq, &cq, &QpInitAttr { cap, sq_sig_all: false }).unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    // On RoCE the IPv4 name is the address; on IB use the real LID (nothing is learned here).
    let dest = port.addr;
    for (qp, peer, psn) in [(&a, &b, 100u32), (&b, &a, 200u32)] {
        qp.modify(&QpModify::Init { port_num: port.port_num, pkey_index: 0, access }).unwrap();
        qp.modify(&QpModify::Rtr {
            path_mtu: port.active_mtu,
            dest_qpn: peer.qp_num(),
            rq_psn: if psn == 100 { 200 } else { 100 },
            dest,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 12,
        })
        .unwrap();
        qp.modify(&QpModify::Rts { sq_psn: psn, timeout: 14, retry_cnt: 5, rnr_retry: 6, max_rd_atomic: 0 })
            .unwrap();
        assert_eq!(qp.state(), QpState::Rts);
    }

    let src = RegisteredBuf::new(&dev, &pd, 8192, Access::LOCAL_WRITE).unwrap();
    let dst = RegisteredBuf::new(&dev, &pd, 8192, access).unwrap();
    let rx = RegisteredBuf::new(&dev, &pd, 256, Access::LOCAL_WRITE).unwrap();
    src.buf().fill(0x5a);
    b.post_recv(&[RecvWr { wr_id: 10, sg_list: &[rx.sge(0, 256)] }]).unwrap();
    b.post_recv(&[RecvWr { wr_id: 11, sg_list: &[rx.sge(0, 256)] }]).unwrap();
    cq.req_notify(false).unwrap();
    let write = [src.sge(0, 4096), src.sge(4096, 4096)];
    let hello = [src.sge(0, 16)];
    a.post_send(&[
        SendWr {
            wr_id: 1,
            op: SendOp::RdmaWriteWithImm { remote_addr: dst.addr_at(0), rkey: dst.rkey(), imm: 0xfeed },
            sg_list: &write,
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sg_list: &hello,
            flags: SendFlags { signaled: true, inline: true, ..SendFlags::UNSIGNALED },
        },
    ])
    .unwrap();

    let mut got = Vec::new();
    let mut out = [Wc::default(); 8];
    for _ in 0..1000 {
        let n = cq.poll(&mut out);
        got.extend_from_slice(out.get(..n).unwrap_or_default());
        if got.len() >= 4 {
            break;
        }
        let mut p = libc::pollfd { fd: cq.event_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd for the duration of the call.
        unsafe { libc::poll(&mut p, 1, 10) };
        if cq.get_event() {
            cq.req_notify(false).unwrap();
        }
    }
    eprintln!("{got:#?}");
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|w| w.status == WcStatus::Success));
    let recv_imm = got.iter().find(|w| w.opcode == WcOpcode::RecvRdmaWithImm).unwrap();
    assert_eq!((recv_imm.imm_data, recv_imm.byte_len), (Some(0xfeed), 8192));
    let recv = got.iter().find(|w| w.opcode == WcOpcode::Recv).unwrap();
    assert_eq!((recv.byte_len, recv.imm_data), (16, None));
    assert_eq!(dst.buf().to_vec(0, 8192).unwrap(), vec![0x5a; 8192]);

    // A wrong rkey: REM_ACCESS_ERR, then everything else flushes.
    a.post_send(&[SendWr {
        wr_id: 3,
        op: SendOp::RdmaWrite { remote_addr: dst.addr_at(0), rkey: dst.rkey() ^ 0x55 },
        sg_list: &hello,
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let mut err = None;
    for _ in 0..1000 {
        let n = cq.poll(&mut out);
        if let Some(w) = out.get(..n).unwrap_or_default().iter().find(|w| w.wr_id == 3) {
            err = Some(w.status);
            break;
        }
        let mut p = libc::pollfd { fd: cq.event_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd for the duration of the call.
        unsafe { libc::poll(&mut p, 1, 10) };
    }
    assert_eq!(err, Some(WcStatus::RemAccessErr));
    let unregistered = [Sge { addr: 0x1000, length: 8, lkey: 0 }];
    let r = a.post_send(&[SendWr {
        wr_id: 4,
        op: SendOp::Send,
        sg_list: &unregistered,
        flags: SendFlags { inline: true, ..SendFlags::SIGNALED },
    }]);
    assert!(matches!(r, Err(FabricError::Post { index: 0, .. })), "{r:?}");
    a.modify(&QpModify::Err).unwrap();
    b.modify(&QpModify::Err).unwrap();
}
