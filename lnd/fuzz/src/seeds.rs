//! The seed corpus: valid inputs for every target, built with the crates' own encoders.
//!
//! `cargo run --example gen_corpus` writes them to `corpus/<target>/seed-*`; the corpus test
//! checks the committed files are exactly what this module produces, so a change to an encoder
//! shows up as a stale seed rather than silently weakening the corpus.

use std::net::Ipv4Addr;

use lnd::cm::ip_cm::{CmaHeader, req_private_data};
use lnd::cm::mad::{
    CmMad, CmMessage, Drep, Dreq, FailoverAccepted, MessageMraed, MessageRejected, Mra, PathRecord, Rej,
    RejReason, Rep, Req, RoceReqParams, Rtu, TransportType, cm_tid,
};
use lnd::fabric::Mtu;
use lnd::fabric::soft::packet::{
    Aeth, Bth, Deth, GSI_QKEY, Headers, NakCode, Opcode, PiggyAck, Reth, Syndrome, build,
};
use lnd::wire::{
    ByteOrder, CompletionMsg, ConnParams, GetMsg, IBLND_MAX_IMMEDIATE, IBLND_MAX_RDMA_FRAGS, IBLND_MSG_SIZE,
    IBLND_MSG_VERSION_1, IBLND_MSG_VERSION_2, ImmediateMsg, KibRej, LNET_PROTO_MAGIC, Msg, MsgBody,
    MsgHeader, MsgType, PutAckMsg, PutReqMsg, RdmaDesc, RdmaFrag, RejectReason,
};
use lnet_shim::hdr::{AckMsg, GetMsg as LnetGet, HelloMsg, LnetHdr, LnetMsg, PutMsg, ReplyMsg, WireHandle};
use lnet_shim::nid::{Nid, ProcessId};

use crate::cm_manager::{self, A, B};
use crate::put_u16;
use crate::roce_packet;
use crate::soft_device_rx::{self, ctl};

/// One seed file: its name (without directory) and contents.
pub type Seed = (String, Vec<u8>);

/// The seeds of the target `name` (empty for an unknown name).
pub fn seeds(name: &str) -> Vec<Seed> {
    let list = match name {
        "roce_packet" => roce_packet(),
        "cm_mad" => cm_mad(),
        "cm_manager" => cm_manager(),
        "o2ib_msg" => o2ib_msg(),
        "kib_rej" => kib_rej(),
        "lnet_hdr" => lnet_hdr(),
        "nid" => nid(),
        "tunables" => tunables(),
        "soft_device_rx" => soft_device_rx(),
        "ring" => ring(),
        _ => Vec::new(),
    };
    // Deduplicate by contents, keeping the first name.
    let mut out: Vec<Seed> = Vec::new();
    for (i, (label, bytes)) in list.into_iter().enumerate() {
        if out.iter().all(|(_, b)| *b != bytes) {
            out.push((format!("seed-{i:03}-{label}"), bytes));
        }
    }
    out
}

fn seed(label: impl Into<String>, bytes: impl Into<Vec<u8>>) -> (String, Vec<u8>) {
    (label.into(), bytes.into())
}

// ---- RoCEv2 frames --------------------------------------------------------------------------

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// Frames of every supported opcode, built by `build` (ICRC for `meta`), with `(label, frame)`.
fn frames(meta: &lnd::fabric::soft::packet::IcrcMeta, qpn: u32, psn: u32) -> Vec<(String, Vec<u8>)> {
    let reth = Reth { va: 0x7f00_1234_5000, rkey: 0x1234_5678, dma_len: 1024 };
    let mut out = Vec::new();
    let mut add = |label: &str, h: Headers, len: usize| {
        let mut f = Vec::new();
        build(meta, &h, &payload(len), &mut f).unwrap_or_else(|e| panic!("seed {label}: {e}"));
        out.push((label.to_owned(), f));
    };
    let bth = |op| Bth::new(op, qpn, psn);
    let h = |op| Headers::new(bth(op));
    for len in [0, 1, 3, 4, 57, 256, 1024] {
        add(&format!("send-only-{len}"), h(Opcode::RcSendOnly), len);
    }
    add("send-first", h(Opcode::RcSendFirst), 1024);
    add("send-middle", h(Opcode::RcSendMiddle), 1024);
    add("send-last", h(Opcode::RcSendLast), 100);
    add("send-last-imm", Headers { imm: Some(0xdead_beef), ..h(Opcode::RcSendLastImm) }, 33);
    add("send-only-imm", Headers { imm: Some(7), ..h(Opcode::RcSendOnlyImm) }, 12);
    let mut flags = bth(Opcode::RcSendOnly);
    (flags.solicited, flags.mig_req, flags.fecn, flags.becn, flags.ack_req, flags.pkey) =
        (true, true, true, true, true, 0x8001);
    add("send-only-flags", Headers::new(flags), 5);
    add("write-first", Headers { reth: Some(reth), ..h(Opcode::RcWriteFirst) }, 1024);
    add("write-middle", h(Opcode::RcWriteMiddle), 1024);
    add("write-last", h(Opcode::RcWriteLast), 64);
    add("write-last-imm", Headers { imm: Some(1), ..h(Opcode::RcWriteLastImm) }, 64);
    add("write-only", Headers { reth: Some(Reth { dma_len: 200, ..reth }), ..h(Opcode::RcWriteOnly) }, 200);
    add("write-only-empty", Headers { reth: Some(Reth { dma_len: 0, ..reth }), ..h(Opcode::RcWriteOnly) }, 0);
    add(
        "write-only-imm",
        Headers { reth: Some(Reth { dma_len: 8, ..reth }), imm: Some(9), ..h(Opcode::RcWriteOnlyImm) },
        8,
    );
    let syndromes = [
        ("ack", Syndrome::Ack { credit_code: 0x1f }),
        ("ack-credits", Syndrome::Ack { credit_code: 3 }),
        ("rnr", Syndrome::RnrNak { timer: 1 }),
        ("nak-seq", Syndrome::Nak(NakCode::PsnSequenceError)),
        ("nak-inv", Syndrome::Nak(NakCode::InvalidRequest)),
        ("nak-access", Syndrome::Nak(NakCode::RemoteAccessError)),
        ("nak-op", Syndrome::Nak(NakCode::RemoteOperationalError)),
        ("nak-rd", Syndrome::Nak(NakCode::InvalidRdRequest)),
    ];
    for (label, syndrome) in syndromes {
        add(
            &format!("ack-{label}"),
            Headers { aeth: Some(Aeth { syndrome, msn: 5 }), ..h(Opcode::RcAck) },
            0,
        );
    }
    let piggy = Some(PiggyAck { psn: 0x00ab_cdef, msn: 9 });
    add("send-only-piggy", Headers { piggy, ..h(Opcode::RcSendOnly) }, 24);
    add(
        "write-only-imm-piggy",
        Headers { piggy, reth: Some(Reth { dma_len: 8, ..reth }), imm: Some(2), ..h(Opcode::RcWriteOnlyImm) },
        8,
    );
    let deth = Deth { qkey: GSI_QKEY, src_qp: 1 };
    add("ud-mad", Headers { deth: Some(deth), ..h(Opcode::UdSendOnly) }, 256);
    add("ud-imm", Headers { deth: Some(deth), imm: Some(3), ..h(Opcode::UdSendOnlyImm) }, 16);
    out
}

fn roce_packet() -> Vec<Seed> {
    let meta = roce_packet::meta();
    let mut out = Vec::new();
    for (label, f) in frames(&meta, 0x12_3456, 0xff_fffe) {
        out.push(seed(label.clone(), [&[0u8][..], &f].concat()));
        // The same frame with a stale ICRC, for the re-sealing path.
        let mut stale = f.clone();
        let n = stale.len();
        stale[n - 1] ^= 0xff;
        if label.starts_with("send-only-57")
            || label.starts_with("write-first")
            || label.starts_with("ack-nak-seq")
        {
            out.push(seed(format!("{label}-reseal"), [&[roce_packet::RESEAL][..], &stale].concat()));
        }
    }
    out
}

// ---- CM MADs --------------------------------------------------------------------------------

/// Scripted exchanges between two `Cm`s; every MAD they emit.
fn cm_exchanges() -> Vec<(String, Vec<u8>)> {
    use cm_manager::Net;
    let mut out = Vec::new();
    let mut keep = |label: &str, net: &Net| {
        for (i, m) in net.wire.iter().enumerate() {
            let name = CmMad::decode(m).map(|d| d.msg.name()).unwrap_or("?");
            out.push((format!("{label}-{i}-{}", name.to_ascii_lowercase()), m.to_vec()));
        }
    };
    // Connect, accept, complete, disconnect.
    let mut net = Net::new();
    net.connect(A, 0x111, 0xab_cdef, cm_manager::SID).unwrap();
    net.settle();
    net.user_call(B, 0, 0, 100);
    net.settle();
    net.user_call(A, 0, 2, 0);
    net.settle();
    net.user_call(A, 0, 4, 0);
    net.settle();
    keep("handshake", &net);
    // Nobody listens: REJ 8.
    let mut net = Net::new();
    let sid = lnd::cm::ip_cm::ip_service_id(lnd::cm::ip_cm::PortSpace::Tcp, 988);
    net.connect(A, 0x111, 1, sid).unwrap();
    net.settle();
    keep("no-listener", &net);
    // Consumer reject with private data.
    let mut net = Net::new();
    net.connect(A, 0x111, 1, cm_manager::SID).unwrap();
    net.settle();
    net.user_call(B, 0, 1, 24);
    net.settle();
    keep("reject", &net);
    // Destroyed while waiting for the REP: REJ 4 with the CA GUID as ARI.
    let mut net = Net::new();
    let id = net.connect(A, 0x111, 1, cm_manager::SID).unwrap();
    net.cms[A].destroy(net.now, id);
    net.pump();
    keep("destroyed", &net);
    out
}

fn cm_mad() -> Vec<Seed> {
    let mut out = cm_exchanges();
    let a_ip = Ipv4Addr::new(192, 168, 1, 1);
    let b_ip = Ipv4Addr::new(192, 168, 1, 2);
    let cma = CmaHeader { src_port: 1023, src: a_ip, dst: b_ip };
    let pd = req_private_data(&cma, b"CONNREQ").unwrap();
    let params = RoceReqParams {
        local_comm_id: 0x1234_5678,
        service_id: lnd::cm::ip_cm::ip_service_id(lnd::cm::ip_cm::PortSpace::Tcp, 987),
        local_ca_guid: 0x0200_5eff_fe00_0001,
        local_qpn: 0x11,
        starting_psn: 0x22,
        local_ip: a_ip,
        remote_ip: b_ip,
        path_mtu: Mtu::Mtu4096,
        responder_resources: 1,
        initiator_depth: 2,
        flow_control: true,
        retry_count: 7,
        rnr_retry_count: 7,
        private_data: pd,
    };
    let mut req = Req::roce_defaults(params.clone());
    req.alternate_path = Some(PathRecord::roce(b_ip, a_ip, 3));
    req.sap_supported = true;
    let mads = [
        ("req-alternate-path", CmMessage::Req(req)),
        (
            "mra-rep",
            CmMessage::Mra(Mra {
                local_comm_id: 5,
                remote_comm_id: 6,
                message_mraed: MessageMraed::Rep,
                service_timeout: 31,
                ..Mra::default()
            }),
        ),
        (
            "rej-ari",
            CmMessage::Rej(Rej {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_rejected: MessageRejected::Rep,
                reject_info_length: 72,
                reason: RejReason::from_u16(12),
                ari: [0xab; 72],
                ..Rej::default()
            }),
        ),
        (
            "dreq",
            CmMessage::Dreq(Dreq {
                local_comm_id: 9,
                remote_comm_id: 8,
                remote_qpn: 0xff_ffff,
                ..Dreq::default()
            }),
        ),
    ];
    for (label, msg) in mads {
        out.push(seed(label, CmMad::new(cm_tid(1, 2), msg).encode().unwrap().to_vec()));
    }
    // Every path MTU and transport, every failover / rejected / MRAed code, odd REJ reasons.
    let base = Req::roce_defaults(RoceReqParams { path_mtu: Mtu::Mtu256, ..params });
    for (i, mtu) in [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048].into_iter().enumerate() {
        let transport = [TransportType::Rc, TransportType::Uc, TransportType::Xrc, TransportType::Rc][i];
        let req = Req { path_mtu: mtu, transport_type: transport, srq: i == 2, ..base.clone() };
        out.push(seed(
            format!("req-mtu{i}"),
            CmMad::new(cm_tid(3, 4), CmMessage::Req(req)).encode().unwrap().to_vec(),
        ));
    }
    for (i, failover) in
        [FailoverAccepted::Accepted, FailoverAccepted::NotSupported, FailoverAccepted::Rejected]
            .into_iter()
            .enumerate()
    {
        let rep = Rep {
            local_comm_id: 7,
            remote_comm_id: 8,
            failover_accepted: failover,
            srq: i == 1,
            ..Rep::default()
        };
        out.push(seed(
            format!("rep-failover{i}"),
            CmMad::new(cm_tid(5, 6), CmMessage::Rep(rep)).encode().unwrap().to_vec(),
        ));
    }
    for (i, (rejected, reason)) in
        [(MessageRejected::Req, 8u16), (MessageRejected::Other, 28), (MessageRejected::Rep, 0xffff)]
            .into_iter()
            .enumerate()
    {
        let rej = Rej {
            message_rejected: rejected,
            reason: RejReason::from_u16(reason),
            reject_info_length: 8,
            ..Rej::default()
        };
        out.push(seed(
            format!("rej-{i}"),
            CmMad::new(cm_tid(5, 6), CmMessage::Rej(rej)).encode().unwrap().to_vec(),
        ));
    }
    for (i, mraed) in [MessageMraed::Req, MessageMraed::Lap].into_iter().enumerate() {
        let mra = Mra { message_mraed: mraed, service_timeout: 3, ..Mra::default() };
        out.push(seed(
            format!("mra-{i}"),
            CmMad::new(cm_tid(5, 6), CmMessage::Mra(mra)).encode().unwrap().to_vec(),
        ));
    }
    out.push(seed(
        "rtu",
        CmMad::new(7, CmMessage::Rtu(Rtu { local_comm_id: 1, remote_comm_id: 2, ..Rtu::default() }))
            .encode()
            .unwrap()
            .to_vec(),
    ));
    out.push(seed(
        "drep",
        CmMad::new(7, CmMessage::Drep(Drep { local_comm_id: 1, remote_comm_id: 2, ..Drep::default() }))
            .encode()
            .unwrap()
            .to_vec(),
    ));
    out
}

// ---- CM state machine ------------------------------------------------------------------------

/// Builds an operation stream for `cm_manager` (see [`cm_manager::Op`]).
#[derive(Default)]
struct CmScript(Vec<u8>);

impl CmScript {
    fn op(mut self, op: cm_manager::Op, args: &[u8]) -> Self {
        self.0.push(op as u8);
        self.0.extend_from_slice(args);
        self
    }

    fn connect(self, side: usize, qpn: u16, no_listener: bool) -> Self {
        let [q0, q1] = qpn.to_le_bytes();
        self.op(cm_manager::Op::Connect, &[side as u8, q0, q1, 0x34, 0x12, u8::from(no_listener)])
    }

    fn all(self) -> Self {
        self.op(cm_manager::Op::DeliverAll, &[])
    }

    fn user(self, side: usize, index: u8, action: u8, arg: u16) -> Self {
        let [a0, a1] = arg.to_le_bytes();
        self.op(cm_manager::Op::User, &[side as u8, index, action, a0, a1])
    }
}

fn cm_manager() -> Vec<Seed> {
    use cm_manager::Op;
    let handshake =
        || CmScript::default().connect(A, 0x111, false).all().user(B, 0, 0, 50).all().user(A, 0, 2, 0).all();
    let mut out = vec![
        seed("handshake", handshake().0),
        seed("handshake-disconnect", handshake().user(A, 0, 4, 0).all().op(Op::NextTimer, &[]).0),
        seed("passive-disconnect", handshake().user(B, 0, 4, 0).all().op(Op::Advance, &[255]).0),
        seed("destroy-established", handshake().user(A, 0, 5, 0).all().0),
        seed("no-listener", CmScript::default().connect(A, 7, true).all().0),
        seed("reject", CmScript::default().connect(B, 9, false).all().user(A, 0, 1, 28).all().0),
        seed(
            "reject-after-reply",
            CmScript::default().connect(A, 9, false).all().user(B, 0, 0, 1).all().user(A, 0, 1, 0).all().0,
        ),
        seed(
            "lost-rep",
            CmScript::default()
                .connect(A, 3, false)
                .all()
                .user(B, 0, 0, 1)
                .op(Op::Drop, &[])
                .op(Op::NextTimer, &[])
                .all()
                .0,
        ),
        seed(
            "lost-rtu-comm-est",
            CmScript::default()
                .connect(A, 3, false)
                .all()
                .user(B, 0, 0, 1)
                .all()
                .user(A, 0, 2, 0)
                .op(Op::Drop, &[])
                .user(B, 0, 3, 0)
                .op(Op::NextTimer, &[])
                .0,
        ),
        seed("duplicate-req", CmScript::default().connect(A, 3, false).op(Op::Duplicate, &[]).all().0),
        seed(
            "reorder",
            CmScript::default().connect(A, 3, false).connect(A, 4, false).op(Op::Swap, &[]).all().0,
        ),
        seed("corrupt-req", CmScript::default().connect(A, 3, false).op(Op::Corrupt, &[40, 0x10]).all().0),
        seed(
            "unlisten",
            CmScript::default()
                .user(B, 0, 6, 0)
                .connect(A, 3, false)
                .all()
                .user(B, 0, 7, 0)
                .connect(A, 4, false)
                .all()
                .0,
        ),
        seed(
            "req-timeouts",
            CmScript::default()
                .connect(A, 3, false)
                .op(Op::Drop, &[])
                .op(Op::Advance, &[255])
                .op(Op::Advance, &[255])
                .0,
        ),
    ];
    let mut flood = CmScript::default();
    for q in 0..12u16 {
        flood = flood.connect(A, 100 + q, false);
    }
    out.push(seed("flood", flood.all().0));
    // Forged messages of every attribute aimed at a live connection, then raw MADs.
    for attr_sel in 0..9u8 {
        let mut body = vec![0u8; 232];
        body[8] = 0x40; // a message-rejected / MRAed code of 1 (REP)
        let s = handshake().op(Op::InjectForged, &[attr_sel % 2, attr_sel, 0x40]);
        let mut bytes = s.0;
        bytes.extend_from_slice(&body);
        bytes.push(Op::DeliverAll as u8);
        out.push(seed(format!("forged-{attr_sel}"), bytes));
    }
    for (label, mad) in cm_exchanges().into_iter().take(5) {
        let mut s = CmScript::default().connect(B, 5, false).all().0;
        s.push(Op::InjectRaw as u8);
        s.push(A as u8);
        put_u16(&mut s, mad.len() as u16);
        s.extend_from_slice(&mad);
        s.push(Op::NextTimer as u8);
        out.push(seed(format!("raw-{label}"), s));
    }
    out
}

// ---- o2iblnd messages ---------------------------------------------------------------------------

fn lnet_header_bytes() -> [u8; 72] {
    let src = ProcessId::new(Nid::o2ib(Ipv4Addr::new(10, 0, 0, 1)), ProcessId::PID_LUSTRE);
    let dst = ProcessId::new(Nid::o2ib(Ipv4Addr::new(10, 0, 0, 2)), ProcessId::PID_LUSTRE);
    let put =
        PutMsg { ack_wmd: WireHandle::new(1, 2), match_bits: 0x1234, hdr_data: 7, ptl_index: 4, offset: 0 };
    LnetHdr { dest: dst, src, payload_length: 4096, msg: LnetMsg::Put(put) }.encode()
}

fn o2ib_msg() -> Vec<Seed> {
    let lh = lnet_header_bytes();
    let cp = ConnParams { queue_depth: 8, max_frags: 257, max_msg_size: 4096 };
    let c = CompletionMsg { cookie: 0x0102_0304_0506_0708, status: -5 };
    let frags = |n: usize| -> Vec<RdmaFrag> {
        (0..n).map(|i| RdmaFrag::new(0x7f00_0000_1000 + 4096 * i as u64, 4096 - (i as u32 % 3))).collect()
    };
    let f1 = frags(1);
    let f3 = frags(3);
    let f16 = frags(16);
    let fmax = frags(IBLND_MAX_RDMA_FRAGS);
    let p100 = payload(100);
    let pmax = payload(IBLND_MAX_IMMEDIATE);
    let bodies: Vec<(&str, MsgBody<'_>)> = vec![
        ("connreq", MsgBody::ConnReq(cp)),
        ("connack", MsgBody::ConnAck(cp)),
        ("noop", MsgBody::Noop),
        ("immediate-0", MsgBody::Immediate(ImmediateMsg { lnet_hdr: &lh, payload: &[] })),
        ("immediate-100", MsgBody::Immediate(ImmediateMsg { lnet_hdr: &lh, payload: &p100 })),
        ("immediate-max", MsgBody::Immediate(ImmediateMsg { lnet_hdr: &lh, payload: &pmax })),
        ("putreq", MsgBody::PutReq(PutReqMsg { lnet_hdr: &lh, cookie: 0x55 })),
        ("putnak", MsgBody::PutNak(c)),
        (
            "putack-1",
            MsgBody::PutAck(PutAckMsg { src_cookie: 1, dst_cookie: 2, rd: RdmaDesc::new(0xabcd, &f1) }),
        ),
        (
            "putack-16",
            MsgBody::PutAck(PutAckMsg { src_cookie: 1, dst_cookie: 2, rd: RdmaDesc::new(0xabcd, &f16) }),
        ),
        (
            "putack-max",
            MsgBody::PutAck(PutAckMsg { src_cookie: 1, dst_cookie: 2, rd: RdmaDesc::new(1, &fmax) }),
        ),
        ("putdone", MsgBody::PutDone(CompletionMsg { status: 4096, ..c })),
        ("getreq-1", MsgBody::GetReq(GetMsg { lnet_hdr: &lh, cookie: 9, rd: RdmaDesc::new(0x77, &f1) })),
        ("getreq-3", MsgBody::GetReq(GetMsg { lnet_hdr: &lh, cookie: 9, rd: RdmaDesc::new(0x77, &f3) })),
        ("getreq-max", MsgBody::GetReq(GetMsg { lnet_hdr: &lh, cookie: 9, rd: RdmaDesc::new(0x77, &fmax) })),
        ("getdone", MsgBody::GetDone(c)),
    ];
    let hdr = MsgHeader {
        version: IBLND_MSG_VERSION_2,
        msg_type: MsgType::Noop,
        credits: 3,
        nob: 0,
        cksum: 0,
        srcnid: Nid::o2ib(Ipv4Addr::new(10, 0, 0, 1)),
        srcstamp: 0x1111_2222_3333_4444,
        dstnid: Nid::o2ib(Ipv4Addr::new(10, 0, 0, 2)),
        dststamp: 0x5555_6666_7777_8888,
    };
    let mut out = Vec::new();
    for (i, (label, body)) in bodies.into_iter().enumerate() {
        let mut variants = vec![("le", ByteOrder::Little, false, IBLND_MSG_VERSION_2)];
        // Every fourth type also big-endian, with a checksum, and as V1.
        if i % 4 == 0 || label.ends_with("-1") {
            variants.push(("be", ByteOrder::Big, false, IBLND_MSG_VERSION_2));
            variants.push(("cksum", ByteOrder::Little, true, IBLND_MSG_VERSION_2));
            variants.push(("v1", ByteOrder::Little, false, IBLND_MSG_VERSION_1));
        }
        for (v, order, cksum, version) in variants {
            let m = Msg { order, ..Msg::new(MsgHeader { version, ..hdr }, body) };
            let mut buf = vec![0u8; IBLND_MSG_SIZE];
            let n = m.encode(&mut buf, cksum).unwrap_or_else(|e| panic!("seed {label}: {e}")) as usize;
            buf.truncate(n);
            out.push(seed(format!("{label}-{v}"), buf));
        }
    }
    // A message at the front of a bigger receive buffer.
    let m = Msg::new(hdr, MsgBody::PutNak(c));
    let mut buf = vec![0xcc; 256];
    m.encode(&mut buf, false).unwrap();
    out.push(seed("putnak-in-rx-buffer", buf));
    out
}

fn kib_rej() -> Vec<Seed> {
    let cp = ConnParams { queue_depth: 8, max_frags: 257, max_msg_size: 4096 };
    let mut out = Vec::new();
    for why in 1..=10u8 {
        let r = match RejectReason::from_u8(why) {
            Some(reason) => {
                KibRej::new(IBLND_MSG_VERSION_2, reason, 0x0102_0304_0506_0708 + u64::from(why), cp)
            }
            None => KibRej { why, ..KibRej::new(IBLND_MSG_VERSION_2, RejectReason::Fatal, 1, cp) },
        };
        out.push(seed(format!("v2-why{why}"), r.encode().to_vec()));
    }
    let base = KibRej::new(IBLND_MSG_VERSION_2, RejectReason::MsgQueueSize, 42, cp);
    out.push(seed("v2-be", KibRej { order: ByteOrder::Big, ..base }.encode().to_vec()));
    let v1 = KibRej::new(IBLND_MSG_VERSION_1, RejectReason::Fatal, 0, cp).encode();
    out.push(seed("v1-short", v1[..7].to_vec()));
    out.push(seed("v1-full", v1.to_vec()));
    out.push(seed("v2-short", base.encode()[..7].to_vec()));
    out.push(seed("lnet-proto", KibRej { magic: LNET_PROTO_MAGIC, ..base }.encode().to_vec()));
    // As the IB CM delivers it: 148 bytes of REJ private data.
    let mut ib = base.encode().to_vec();
    ib.resize(148, 0);
    out.push(seed("v2-in-148", ib));
    out
}

fn lnet_hdr() -> Vec<Seed> {
    let src = ProcessId::new(Nid::o2ib(Ipv4Addr::new(10, 0, 0, 1)), ProcessId::PID_LUSTRE);
    let dst = ProcessId::new("192.168.7.9@o2ib3".parse().unwrap(), 12345);
    let h = |msg, payload_length| LnetHdr { dest: dst, src, payload_length, msg };
    let wmd = WireHandle::new(0x1111, 0x2222);
    let headers = [
        ("ack", h(LnetMsg::Ack(AckMsg { dst_wmd: wmd, match_bits: 3, mlength: 4096 }), 0)),
        (
            "put",
            h(
                LnetMsg::Put(PutMsg {
                    ack_wmd: wmd,
                    match_bits: 0xfeed,
                    hdr_data: 9,
                    ptl_index: 4,
                    offset: 12,
                }),
                1 << 20,
            ),
        ),
        (
            "put-noack",
            h(
                LnetMsg::Put(PutMsg {
                    ack_wmd: WireHandle::NONE,
                    match_bits: 1,
                    hdr_data: 0,
                    ptl_index: 0,
                    offset: 0,
                }),
                17,
            ),
        ),
        (
            "get",
            h(
                LnetMsg::Get(LnetGet {
                    return_wmd: wmd,
                    match_bits: 5,
                    ptl_index: 6,
                    src_offset: 7,
                    sink_length: 8192,
                }),
                0,
            ),
        ),
        ("reply", h(LnetMsg::Reply(ReplyMsg { dst_wmd: wmd }), 8192)),
        ("hello", h(LnetMsg::Hello(HelloMsg { incarnation: 0x1234_5678, hello_type: 2 }), 0)),
    ];
    let endpoints = [
        (
            "tcp",
            ProcessId::new("10.1.2.3@tcp1".parse().unwrap(), 0),
            ProcessId::new("0@lo".parse().unwrap(), 1),
        ),
        ("odd", ProcessId::new(Nid::from_u64(0x00ff_0001_0102_0304), u32::MAX), ProcessId::new(Nid::ANY, 7)),
    ];
    let mut out = Vec::new();
    for (label, hdr) in headers {
        let enc = hdr.encode();
        out.push(seed(label, enc.to_vec()));
        for (e, dest, src) in endpoints {
            out.push(seed(
                format!("{label}-{e}"),
                LnetHdr { dest, src, payload_length: u32::MAX, ..hdr }.encode().to_vec(),
            ));
        }
        if label == "put" {
            let mut with_payload = enc.to_vec();
            with_payload.extend_from_slice(&payload(40));
            out.push(seed("put-with-payload", with_payload));
        }
    }
    out
}

fn nid() -> Vec<Seed> {
    let texts = [
        "192.168.1.2@o2ib",
        "10.0.0.1@o2ib3",
        "10.0.0.1@o2ib65535",
        "1.2.3.4@tcp",
        "1.2.3.4@tcp12",
        "0@lo",
        "4294967295@lo",
        "255.255.255.255@o2ib0",
        "o2ib",
        "o2ib0",
        "o2ib12",
        "tcp",
        "lo",
        "10.0.0.1@o2ib,10.0.0.2@tcp1 0@lo",
        "10.0.0.1",
        "@o2ib",
        "10.0.0.1@",
        "10.0.0.1@ib0",
    ];
    let mut out: Vec<Seed> =
        texts.iter().enumerate().map(|(i, t)| seed(format!("text{i}"), t.as_bytes())).collect();
    for (label, nid) in [
        ("raw-o2ib", Nid::o2ib(Ipv4Addr::new(10, 0, 0, 1))),
        ("raw-tcp3", "1.2.3.4@tcp3".parse().unwrap()),
        ("raw-lo", "0@lo".parse().unwrap()),
        ("raw-any", Nid::ANY),
    ] {
        out.push(seed(label, nid.as_u64().to_le_bytes().to_vec()));
    }
    out
}

fn tunables() -> Vec<Seed> {
    let shipped = include_str!("../../../conf/ko2iblnd.conf");
    let texts = [
        ("shipped", shipped.to_owned()),
        ("empty", String::new()),
        (
            "docs-example",
            "# /etc/modprobe.d/ko2iblnd.conf\noptions lnet networks=\"o2ib0(ib0)\"                 # for the LNet layer\n\
             options ko2iblnd peer_credits=32 concurrent_sends=64\noptions ko2iblnd credits=1024 \\\n                 \
             ntx=2048 fmr_pool_size=2048       # continued from the line above\n\
             install ko2iblnd /usr/sbin/ko2iblnd-probe          # skipped, with a warning\n"
                .to_owned(),
        ),
        (
            "warnings",
            "options ko2iblnd peer_credits=32 peer_credits_hiw=8 concurrent_sends=100 credits=16\n\
             options ko2iblnd map_on_demand=256 pmr_pool_size=1\ninstall ko2iblnd /bin/true\n\
             options ksocklnd credits=4\noptions ko2iblnd keepalive=-1 conns_per_peer=0\noptions ko2iblnd credits=64\n"
                .to_owned(),
        ),
        ("unknown-parameter", "options ko2iblnd peer_credit=32\n".to_owned()),
        ("continuation-error", "options ko2iblnd peer_credits=32 \\\n concurent_sends=32\n".to_owned()),
        ("out-of-range", "options ko2iblnd tos=300\n".to_owned()),
        ("bad-integer", "options ko2iblnd ntx=0x\n".to_owned()),
        ("quotes", "options ko2iblnd ipif_name=\"ib0:1\" \noptions lnet ip2nets='o2ib0 10.0.0.*'\n".to_owned()),
        ("unterminated-quote", "options ko2iblnd ipif_name=\"ib0\n".to_owned()),
        ("dangling-continuation", "options ko2iblnd ntx=64 \\".to_owned()),
        ("dashes-crlf", "options ko2iblnd peer-credits=16 cksum=y\r\noptions lnet lnet-peer-discovery=0\r\n".to_owned()),
        ("two-files", "options ko2iblnd peer_credits=16\n\0options ko2iblnd peer_credits=32 ntx=1024\n".to_owned()),
        ("rendered", lnd::tunables::Tunables::default().to_modprobe_string()),
        ("missing-module", "options\n".to_owned()),
        ("unknown-directive", "option ko2iblnd ntx=512\n".to_owned()),
        (
            "lnet-timeouts",
            "options lnet lnet_transaction_timeout=30\noptions lnet lnet-transaction-timeout=0x7fffffff\n".to_owned(),
        ),
        ("lnet-timeout-zero", "options lnet networks=o2ib0(lo) lnet_transaction_timeout=0\n".to_owned()),
    ];
    texts.into_iter().map(|(label, text)| seed(label, text.into_bytes())).collect()
}

// ---- software device ---------------------------------------------------------------------------

/// Builds an operation stream for `soft_device_rx` (see [`soft_device_rx::Op`]).
#[derive(Default)]
struct DevScript(Vec<u8>);

impl DevScript {
    fn inject(mut self, flags: u8, delta: i8, offset: u16, frame: &[u8]) -> Self {
        self.0.push(soft_device_rx::Op::Inject as u8);
        self.0.push(flags);
        put_u16(&mut self.0, frame.len() as u16);
        self.0.push(delta as u8);
        put_u16(&mut self.0, offset);
        self.0.extend_from_slice(frame);
        self.op(soft_device_rx::Op::RunToDeadline, &[])
    }

    fn op(mut self, op: soft_device_rx::Op, args: &[u8]) -> Self {
        self.0.push(op as u8);
        self.0.extend_from_slice(args);
        self
    }

    fn post(self, side: u8, kind: u8, len: u16, offset: u16) -> Self {
        let [l0, l1] = len.to_le_bytes();
        let [o0, o1] = offset.to_le_bytes();
        self.op(soft_device_rx::Op::Post, &[side, kind, l0, l1, o0, o1])
    }
}

fn soft_device_rx() -> Vec<Seed> {
    use soft_device_rx::Op;
    // Frames as if from the peer; QPN, PSN, memory and ICRC are patched at injection.
    let meta = roce_packet::meta();
    let f: std::collections::HashMap<String, Vec<u8>> = frames(&meta, 0x42, 0).into_iter().collect();
    let aimed = ctl::TO_B | ctl::FROM_PEER | ctl::AIM_QP | ctl::AIM_PSN | ctl::RESEAL;
    let mut out = vec![
        seed(
            "traffic",
            DevScript::default()
                .post(0, 0, 100, 0)
                .post(0, 2, 3000, 10)
                .post(1, 1, 5000, 7)
                .op(Op::RunToDeadline, &[])
                .op(Op::Progress, &[200])
                .0,
        ),
        seed("send-only", DevScript::default().inject(aimed, 0, 0, &f["send-only-57"]).0),
        seed(
            "send-only-stale-icrc",
            DevScript::default().inject(aimed & !ctl::RESEAL, 0, 0, &f["send-only-57"]).0,
        ),
        seed(
            "send-only-stranger",
            DevScript::default().inject(aimed & !ctl::FROM_PEER, 0, 0, &f["send-only-57"]).0,
        ),
        seed("send-only-future-psn", DevScript::default().inject(aimed, 3, 0, &f["send-only-4"]).0),
        seed("send-only-old-psn", DevScript::default().inject(aimed, -1, 0, &f["send-only-4"]).0),
        seed("send-imm-gro", DevScript::default().inject(aimed | ctl::GRO, 0, 0, &f["send-only-imm"]).0),
        seed(
            "send-first-middle-last",
            DevScript::default()
                .inject(aimed, 0, 0, &f["send-first"])
                .inject(aimed, 1, 0, &f["send-middle"])
                .inject(aimed, 2, 0, &f["send-last-imm"])
                .0,
        ),
        seed("write-only", DevScript::default().inject(aimed | ctl::AIM_MEMORY, 0, 1024, &f["write-only"]).0),
        seed(
            "write-only-past-end",
            DevScript::default().inject(aimed | ctl::AIM_MEMORY, 0, 5000, &f["write-only"]).0,
        ),
        seed(
            "write-only-before-start",
            DevScript::default().inject(aimed | ctl::AIM_MEMORY, 0, 900, &f["write-only"]).0,
        ),
        seed(
            "write-read-only-region",
            DevScript::default().inject(aimed | ctl::AIM_MEMORY, 0, 0x8000 | 1024, &f["write-only"]).0,
        ),
        seed(
            "write-only-imm",
            DevScript::default().inject(aimed | ctl::AIM_MEMORY, 0, 2048, &f["write-only-imm"]).0,
        ),
        seed(
            "write-first-middle-last",
            DevScript::default()
                .inject(aimed | ctl::AIM_MEMORY, 0, 1024, &f["write-first"])
                .inject(aimed, 1, 0, &f["write-middle"])
                .inject(aimed, 2, 0, &f["write-last"])
                .0,
        ),
        seed(
            "mad-to-gsi",
            DevScript::default()
                .inject(ctl::TO_B | ctl::FROM_PEER | ctl::AIM_GSI | ctl::RESEAL, 0, 0, &f["ud-mad"])
                .0,
        ),
    ];
    // ACKs and NAKs to A while it has a SEND in flight (the PSN aims at A's send queue).
    for label in ["ack-ack", "ack-rnr", "ack-nak-seq", "ack-nak-access", "ack-nak-inv"] {
        let s = DevScript::default().post(0, 0, 64, 0).op(Op::Progress, &[0]).inject(
            ctl::FROM_PEER | ctl::AIM_QP | ctl::AIM_PSN | ctl::RESEAL,
            0,
            0,
            &f[label],
        );
        out.push(seed(format!("to-a-{label}"), s.0));
    }
    out.push(seed("garbage", DevScript::default().inject(aimed, 0, 0, &payload(64)).0));
    out.push(seed(
        "post-recv-then-send",
        DevScript::default().op(Op::PostRecv, &[1, 200]).post(0, 1, 3000, 1).op(Op::RunToDeadline, &[]).0,
    ));
    out
}

/// A `ring` input: buffer selector, head, tail (which the consumer ignores), then records
/// written from the head on.
fn ring_input(buf: u8, head: u64, records: &[Vec<u8>]) -> Vec<u8> {
    let mut v = vec![buf];
    v.extend_from_slice(&head.to_le_bytes());
    v.extend_from_slice(
        &head.wrapping_add(records.iter().map(|r| r.len() as u64).sum::<u64>()).to_le_bytes(),
    );
    for r in records {
        v.extend_from_slice(r);
    }
    v
}

fn ring() -> Vec<Seed> {
    use lnd::fabric::soft::ring::hostile_record as rec;
    let cap = lnd::fabric::soft::ring::HOSTILE_CAPACITY as u64;
    let hello: &[u8] = b"hello, frame";
    let wrap = u32::MAX;
    let big = vec![7u8; 16 << 10];
    let over = vec![7u8; (16 << 10) + 16];
    vec![
        seed("empty", ring_input(3, 0, &[])),
        seed("one-frame", ring_input(3, 0, &[rec(0, 12, hello)])),
        seed("two-frames", ring_input(3, 0, &[rec(0, 12, hello), rec(32, 12, hello)])),
        // A wrap marker in the last 16 bytes, then a frame at the start.
        seed("wrap", ring_input(3, cap - 16, &[rec(cap - 16, wrap, &[]), rec(cap, 12, hello)])),
        seed("stamped-for-another-lap", ring_input(3, 0, &[rec(cap * 2, 12, hello)])),
        seed(
            "length-past-the-end",
            ring_input(3, cap - 32, &[[&4000u32.to_le_bytes()[..], &rec(cap - 32, 12, hello)[4..]].concat()]),
        ),
        seed("frame-larger-than-buffer", ring_input(1, 0, &[rec(0, 12, hello)])),
        seed("unaligned-head", ring_input(3, 3, &[rec(3, 12, hello)])),
        seed("max-record", ring_input(4, 0, &[rec(0, 16 << 10, &big)])),
        seed("record-over-max", ring_input(5, 0, &[rec(0, (16 << 10) + 16, &over)])),
        seed("wrap-marker-at-the-start", ring_input(3, 0, &[rec(0, wrap, &[])])),
        seed("zero-length-frames", ring_input(2, 0, &[rec(0, 0, &[]), rec(16, 0, &[]), rec(32, 0, &[])])),
    ]
}
