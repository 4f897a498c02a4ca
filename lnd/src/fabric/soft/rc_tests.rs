//! The RC transport alone: two [`RcQp`]s joined by frames handed over one by one, so a test
//! can deliver packets in exactly the order it wants (the device tests go through a wire).

use std::net::Ipv4Addr;
use std::time::Duration;

use super::copier::CopyHelper;
use super::mem::MrTable;
use super::packet::{self, IcrcMeta, Opcode};
use super::place::{Placement, SingleCopy};
use super::rc::{Completion, CqSel, PlaceCtx, RcQp};
use super::sim::{SimNet, SimPort};
use super::streaming::Streaming;
use crate::fabric::{
    Access, FabricStats, Mtu, PortAddr, QpCaps, QpModify, RecvWr, SendFlags, SendOp, SendWr, Sge, WcStatus,
};
use crate::rng::Rng;
use crate::time::Instant;

/// One side: a QP, its registered buffer and what it completed.
struct End {
    qp: RcQp,
    mem: MrTable,
    buf: Vec<u8>,
    key: u32,
    ip: Ipv4Addr,
    qpn: u32,
    place: Placement,
    port: SimPort,
    stats: FabricStats,
    done: Vec<Completion>,
}

impl End {
    fn new(net: &SimNet, n: u8) -> End {
        let ip = Ipv4Addr::new(10, 0, 0, n);
        let mut mem = MrTable::new(16);
        let buf = vec![0u8; 1 << 16];
        let access = Access::REMOTE_WRITE | Access::LOCAL_WRITE;
        let key =
            mem.register(1, buf.as_ptr() as u64, buf.len() as u64, access, &mut Rng::new(n.into())).unwrap();
        let caps = QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        };
        let qpn = u32::from(n) + 1;
        End {
            qp: RcQp::new(qpn, 1, caps, false, 64),
            mem,
            buf,
            key,
            ip,
            qpn,
            place: Placement::new(
                "t",
                SingleCopy::Off,
                None,
                CopyHelper::Off,
                Duration::ZERO,
                Streaming::Off,
                true,
            ),
            port: net.attach(ip),
            stats: FabricStats::default(),
            done: Vec::new(),
        }
    }

    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge { addr: self.buf.as_ptr() as u64 + off as u64, length: len, lkey: self.key }
    }

    /// Every frame the QP wants to send now.
    fn tx(&mut self, now: Instant) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let mut b = vec![0u8; 8192];
            let Some(f) = self.qp.poll_transmit(now, &self.mem, &mut b, &mut self.stats) else { break };
            b.truncate(f.len);
            packet::seal(&IcrcMeta::new(self.ip, f.dst, 4791, 4791), &mut b).unwrap();
            out.push(b);
        }
        self.qp.take_completions(&mut self.done);
        out
    }

    fn rx(&mut self, now: Instant, src: Ipv4Addr, frame: &[u8]) {
        let pkt = packet::parse_unchecked(frame).unwrap();
        let mut ctx = PlaceCtx { place: &mut self.place, wire: &self.port };
        self.qp.on_packet(now, src, &pkt, &self.mem, &mut self.stats, &mut ctx);
        self.qp.take_completions(&mut self.done);
    }

    fn completed(&self, cq: CqSel) -> Vec<(u64, WcStatus)> {
        self.done.iter().filter(|c| c.cq == cq).map(|c| (c.wc.wr_id, c.wc.status)).collect()
    }
}

/// Two connected QPs at `mtu` with ACK timeout code `timeout` (0: none).
fn pair(mtu: Mtu, timeout: u8) -> (End, End) {
    pair_with_retries(mtu, timeout, 7)
}

/// [`pair`] with `rnr_retry` RNR retries (7: forever).
fn pair_with_retries(mtu: Mtu, timeout: u8, rnr_retry: u8) -> (End, End) {
    let net = SimNet::new(1, Duration::ZERO);
    let (mut a, mut b) = (End::new(&net, 1), End::new(&net, 2));
    let (ends, psns) = ([(a.ip, a.qpn), (b.ip, b.qpn)], [100, 200]);
    for (i, x) in [&mut a, &mut b].into_iter().enumerate() {
        let (peer_ip, peer_qpn) = ends[1 - i];
        x.qp.modify(&QpModify::Init { port_num: 1, pkey_index: 0, access: Access::REMOTE_WRITE }).unwrap();
        let dest = PortAddr::from_ipv4(peer_ip);
        x.qp.modify(&QpModify::Rtr {
            path_mtu: mtu,
            dest_qpn: peer_qpn,
            rq_psn: psns[1 - i],
            dest,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 1,
        })
        .unwrap();
        let rts = QpModify::Rts { sq_psn: psns[i], timeout, retry_cnt: 7, rnr_retry, max_rd_atomic: 0 };
        x.qp.modify(&rts).unwrap();
    }
    (a, b)
}

/// A pair at MTU 256 with a receive posted at b (`wr_id` 9) and a 768-byte SEND posted at a
/// (`wr_id` 1), and the three frames a sent for it.
fn three_packet_send(timeout: u8) -> (End, End, Vec<Vec<u8>>) {
    let (mut a, mut b) = pair(Mtu::Mtu256, timeout);
    let rs = [b.sge(0, 4096)];
    b.qp.post_recv(&RecvWr { wr_id: 9, sg_list: &rs }).unwrap();
    let ss = [a.sge(0, 768)];
    let send = SendWr { wr_id: 1, op: SendOp::Send, sg_list: &ss, flags: SendFlags::SIGNALED };
    a.qp.post_send(&send, &a.mem).unwrap();
    let f = a.tx(Instant::ZERO);
    assert_eq!(f.len(), 3);
    (a, b, f)
}

fn opcodes(frames: &[Vec<u8>]) -> Vec<Opcode> {
    frames.iter().map(|x| packet::parse_unchecked(x).unwrap().headers.bth.opcode).collect()
}

/// A three-packet SEND whose MIDDLE is overtaken by its LAST: the responder discards the LAST
/// and queues a sequence NAK; the late MIDDLE then fills the gap. The NAK must still go (it
/// was withdrawn, so the requester heard nothing and waited a whole retransmission timeout,
/// or, with no timeout, forever), and the requester resends from it at once.
#[test]
fn a_reordered_middle_packet_is_recovered_by_the_sequence_nak_not_a_timeout() {
    for timeout in [14, 0] {
        let (mut a, mut b, f) = three_packet_send(timeout);
        let now = Instant::ZERO;
        assert_eq!(opcodes(&f), [Opcode::RcSendFirst, Opcode::RcSendMiddle, Opcode::RcSendLast]);
        for i in [0, 2, 1] {
            b.rx(now, a.ip, &f[i]);
        }
        for x in b.tx(now) {
            a.rx(now, b.ip, &x);
        }
        // Go-back-N from the NAK's PSN (the MIDDLE's, a duplicate by now, re-acknowledged).
        let again = a.tx(now);
        let last = again.last().map(|x| packet::parse_unchecked(x).unwrap().headers.bth.opcode);
        assert_eq!(last, Some(Opcode::RcSendLast), "timeout {timeout}: the LAST goes again without waiting");
        for x in &again {
            b.rx(now, a.ip, x);
        }
        for x in b.tx(now) {
            a.rx(now, b.ip, &x);
        }
        assert_eq!(b.completed(CqSel::Recv), [(9, WcStatus::Success)], "timeout {timeout}");
        assert_eq!(a.completed(CqSel::Send), [(1, WcStatus::Success)], "timeout {timeout}");
        assert_eq!(&b.buf[..768], &a.buf[..768]);
    }
}

/// A sequence NAK the network duplicated is one request to go back, not several: the copies
/// spend no retry and rewind nothing (as in rxe). Counted, ten copies of one NAK ran a QP
/// with `retry_cnt` 7 out of retries (`RETRY_EXC_ERR`) although nothing was lost again.
#[test]
fn copies_of_a_sequence_nak_spend_no_retries() {
    let (mut a, mut b, f) = three_packet_send(14);
    let now = Instant::ZERO;
    // The MIDDLE is lost: the LAST makes the responder NAK the MIDDLE's PSN, once.
    b.rx(now, a.ip, &f[0]);
    b.rx(now, a.ip, &f[2]);
    let naks = b.tx(now);
    assert_eq!(naks.len(), 1);
    for _ in 0..10 {
        a.rx(now, b.ip, &naks[0]);
    }
    assert_eq!(a.completed(CqSel::Send), [], "no retry ran out");
    // One go-back-N round: the MIDDLE and the LAST, once each.
    let again = a.tx(now);
    assert_eq!(opcodes(&again), [Opcode::RcSendMiddle, Opcode::RcSendLast]);
    for x in &again {
        b.rx(now, a.ip, x);
    }
    for x in b.tx(now) {
        a.rx(now, b.ip, &x);
    }
    assert_eq!(b.completed(CqSel::Recv), [(9, WcStatus::Success)]);
    assert_eq!(a.completed(CqSel::Send), [(1, WcStatus::Success)]);
    assert_eq!(&b.buf[..768], &a.buf[..768]);
}

/// The same for an RNR NAK: while the requester waits out its timer it sends nothing, so
/// another RNR NAK for that PSN is a copy and spends none of `rnr_retry`.
#[test]
fn copies_of_an_rnr_nak_spend_no_rnr_retries() {
    let (mut a, mut b) = pair_with_retries(Mtu::Mtu256, 14, 1);
    let ss = [a.sge(0, 100)];
    let send = SendWr { wr_id: 1, op: SendOp::Send, sg_list: &ss, flags: SendFlags::SIGNALED };
    a.qp.post_send(&send, &a.mem).unwrap();
    let mut now = Instant::ZERO;
    // No receive posted: the responder answers with an RNR NAK, which the network triples.
    for x in a.tx(now) {
        b.rx(now, a.ip, &x);
    }
    let rnr = b.tx(now);
    assert_eq!(rnr.len(), 1);
    for _ in 0..3 {
        a.rx(now, b.ip, &rnr[0]);
    }
    assert_eq!(a.completed(CqSel::Send), [], "the one RNR retry is not spent yet");
    let rs = [b.sge(0, 4096)];
    b.qp.post_recv(&RecvWr { wr_id: 9, sg_list: &rs }).unwrap();
    // After the RNR timer the SEND goes again and lands.
    now += Duration::from_millis(700);
    a.qp.on_timer(now, &mut a.stats);
    for x in a.tx(now) {
        b.rx(now, a.ip, &x);
    }
    for x in b.tx(now) {
        a.rx(now, b.ip, &x);
    }
    assert_eq!(b.completed(CqSel::Recv), [(9, WcStatus::Success)]);
    assert_eq!(a.completed(CqSel::Send), [(1, WcStatus::Success)]);
    assert_eq!(a.stats.rnr_retries_exceeded, 0);
}

/// PSNs are assigned at post time, so the send queue may span at most 2^22 of them: a 2 GiB
/// WRITE at MTU 256 (2^23 packets) is refused. Accepted, it made PSN comparisons wrap when
/// the SEND before it was acknowledged, and the unsent WRITE completed with success.
#[test]
fn the_send_queue_never_spans_more_than_a_quarter_of_the_psn_space() {
    let (mut a, _b) = pair(Mtu::Mtu256, 14);
    let s0 = [a.sge(0, 16)];
    a.qp.post_send(&SendWr { wr_id: 1, op: SendOp::Send, sg_list: &s0, flags: SendFlags::SIGNALED }, &a.mem)
        .unwrap();
    // Four 512 MiB SGEs: the regions are checked when the data is gathered, not at post.
    let write = |len: u32| [Sge { addr: a.buf.as_ptr() as u64, length: len, lkey: a.key }; 4];
    let op = SendOp::RdmaWrite { remote_addr: 0x1000, rkey: 7 };
    let big = write(1 << 29);
    let refused = a.qp.post_send(&SendWr { wr_id: 2, op, sg_list: &big, flags: SendFlags::SIGNALED }, &a.mem);
    assert!(refused.is_err_and(|why| why.contains("2^22")), "{refused:?}");
    // Up to the limit: 1 PSN for the SEND and 2^22 - 1 for a WRITE of that many packets.
    let fits = [Sge { addr: a.buf.as_ptr() as u64, length: ((1 << 22) - 1) * 256, lkey: a.key }];
    a.qp.post_send(&SendWr { wr_id: 3, op, sg_list: &fits, flags: SendFlags::SIGNALED }, &a.mem).unwrap();
    let one_more = [a.sge(0, 1)];
    let refused =
        a.qp.post_send(&SendWr { wr_id: 4, op, sg_list: &one_more, flags: SendFlags::SIGNALED }, &a.mem);
    assert!(refused.is_err(), "the queue is full of PSNs");
}

fn headers(frame: &[u8]) -> packet::Headers {
    packet::parse_unchecked(frame).unwrap().headers
}

/// A SEND answered by a SEND posted before the responder transmits (a ping's reply): the
/// responder's ACK rides on the reply as a piggybacked ACK, no ACK frame goes, and the
/// requester's SEND completes from it. Posted later, the reply finds the ACK already gone in
/// a frame of its own and carries none.
#[test]
fn the_ack_rides_on_a_reply_sent_in_the_same_call() {
    let (mut a, mut b) = pair(Mtu::Mtu1024, 14);
    let now = Instant::ZERO;
    for (round, reply_first) in [(0u64, true), (1, false)] {
        let ra = [a.sge(4096, 64)];
        a.qp.post_recv(&RecvWr { wr_id: 10 + round, sg_list: &ra }).unwrap();
        let rb = [b.sge(4096, 64)];
        b.qp.post_recv(&RecvWr { wr_id: 20 + round, sg_list: &rb }).unwrap();
        let ss = [a.sge(0, 32)];
        a.qp.post_send(
            &SendWr { wr_id: round, op: SendOp::Send, sg_list: &ss, flags: SendFlags::SIGNALED },
            &a.mem,
        )
        .unwrap();
        let req = a.tx(now);
        assert_eq!(req.len(), 1);
        assert_eq!(headers(&req[0]).piggy, None, "round {round}: nothing to acknowledge yet");
        b.rx(now, a.ip, &req[0]);
        let reply = [b.sge(0, 16)];
        let wr = SendWr { wr_id: 30 + round, op: SendOp::Send, sg_list: &reply, flags: SendFlags::SIGNALED };
        let mut out = Vec::new();
        if !reply_first {
            out = b.tx(now);
        }
        b.qp.post_send(&wr, &b.mem).unwrap();
        out.extend(b.tx(now));
        let ops: Vec<Opcode> = out.iter().map(|f| headers(f).bth.opcode).collect();
        let piggy = headers(out.last().unwrap()).piggy;
        if reply_first {
            assert_eq!(ops, [Opcode::RcSendOnly], "no ACK frame");
            assert_eq!(piggy.map(|p| p.psn), Some(100), "the reply acknowledges PSN 100");
        } else {
            assert_eq!(ops, [Opcode::RcAck, Opcode::RcSendOnly]);
            assert_eq!(piggy, None);
        }
        for f in &out {
            a.rx(now, b.ip, f);
        }
        assert_eq!(a.completed(CqSel::Send).last(), Some(&(round, WcStatus::Success)), "round {round}");
        assert_eq!(a.completed(CqSel::Recv).last(), Some(&(10 + round, WcStatus::Success)));
        // a's ACK for the reply goes in a frame (a has nothing to send).
        let ack = a.tx(now);
        assert_eq!(ack.iter().map(|f| headers(f).bth.opcode).collect::<Vec<_>>(), [Opcode::RcAck]);
        b.rx(now, a.ip, &ack[0]);
        assert_eq!(b.completed(CqSel::Send).last(), Some(&(30 + round, WcStatus::Success)));
    }
    assert_eq!((b.stats.acks_piggybacked, a.stats.acks_piggybacked), (1, 0));
}

/// Several SENDs received before the responder transmits are acknowledged by one ACK frame
/// for the last (ACKs are cumulative); a NAK queued behind positive ACKs never rides on a
/// request, and everything before it is still acknowledged first.
#[test]
fn queued_acks_leave_as_one_frame_and_a_nak_never_rides() {
    let (mut a, mut b) = pair(Mtu::Mtu1024, 14);
    let now = Instant::ZERO;
    for i in 0..4u64 {
        let rb = [b.sge(4096 + 64 * i as usize, 64)];
        b.qp.post_recv(&RecvWr { wr_id: 20 + i, sg_list: &rb }).unwrap();
        let ss = [a.sge(0, 32)];
        a.qp.post_send(
            &SendWr { wr_id: i, op: SendOp::Send, sg_list: &ss, flags: SendFlags::SIGNALED },
            &a.mem,
        )
        .unwrap();
    }
    let req = a.tx(now);
    assert_eq!(req.len(), 4);
    for f in &req[..3] {
        b.rx(now, a.ip, f);
    }
    let acks = b.tx(now);
    assert_eq!(acks.len(), 1, "one ACK frame for three SENDs");
    let h = headers(&acks[0]);
    assert_eq!((h.bth.opcode, h.bth.psn), (Opcode::RcAck, 102));
    a.rx(now, b.ip, &acks[0]);
    assert_eq!(
        a.completed(CqSel::Send),
        [(0, WcStatus::Success), (1, WcStatus::Success), (2, WcStatus::Success)]
    );

    // No receive posted for a fifth SEND: an RNR NAK behind the fourth SEND's ACK. b has a
    // SEND of its own ready, which must not carry the ACK past the NAK.
    let ss = [a.sge(0, 32)];
    a.qp.post_send(&SendWr { wr_id: 4, op: SendOp::Send, sg_list: &ss, flags: SendFlags::SIGNALED }, &a.mem)
        .unwrap();
    let fifth = a.tx(now);
    b.rx(now, a.ip, &req[3]);
    b.rx(now, a.ip, &fifth[0]);
    let ra = [a.sge(4096, 64)];
    a.qp.post_recv(&RecvWr { wr_id: 40, sg_list: &ra }).unwrap();
    let mine = [b.sge(0, 16)];
    b.qp.post_send(
        &SendWr { wr_id: 50, op: SendOp::Send, sg_list: &mine, flags: SendFlags::SIGNALED },
        &b.mem,
    )
    .unwrap();
    let out = b.tx(now);
    let kinds: Vec<(Opcode, bool)> =
        out.iter().map(|f| (headers(f).bth.opcode, headers(f).piggy.is_some())).collect();
    assert_eq!(kinds, [(Opcode::RcAck, false), (Opcode::RcAck, false), (Opcode::RcSendOnly, false)]);
    let syndromes: Vec<_> =
        out[..2].iter().map(|f| (headers(f).aeth.unwrap().syndrome, headers(f).bth.psn)).collect();
    assert!(
        matches!(
            syndromes[..],
            [(packet::Syndrome::Ack { .. }, 103), (packet::Syndrome::RnrNak { .. }, 104)]
        ),
        "{syndromes:?}"
    );
    assert_eq!(b.stats.acks_piggybacked, 0);
}

/// The request that was to carry the queued ACK fails locally (a bad local key): the ACK
/// still leaves, in a frame of its own, and the requester's SEND completes.
#[test]
fn an_ack_whose_carrier_fails_locally_still_leaves() {
    let (mut a, mut b) = pair(Mtu::Mtu1024, 14);
    let now = Instant::ZERO;
    let rb = [b.sge(4096, 64)];
    b.qp.post_recv(&RecvWr { wr_id: 20, sg_list: &rb }).unwrap();
    let ss = [a.sge(0, 32)];
    a.qp.post_send(&SendWr { wr_id: 1, op: SendOp::Send, sg_list: &ss, flags: SendFlags::SIGNALED }, &a.mem)
        .unwrap();
    let req = a.tx(now);
    b.rx(now, a.ip, &req[0]);
    let bad = [Sge { lkey: b.key ^ 0xdead, ..b.sge(0, 16) }];
    b.qp.post_send(
        &SendWr { wr_id: 30, op: SendOp::Send, sg_list: &bad, flags: SendFlags::SIGNALED },
        &b.mem,
    )
    .unwrap();
    let out = b.tx(now);
    assert_eq!(out.iter().map(|f| headers(f).bth.opcode).collect::<Vec<_>>(), [Opcode::RcAck]);
    assert_eq!(b.completed(CqSel::Send).first(), Some(&(30, WcStatus::LocProtErr)));
    a.rx(now, b.ip, &out[0]);
    assert_eq!(a.completed(CqSel::Send), [(1, WcStatus::Success)]);
}

/// What a `progress_receive` may leave for the next call: only the positive ACK of a single
/// SEND (its answer will carry it). Two SENDs, an RDMA WRITE, a duplicate and an RNR NAK
/// must be answered at once; once sent, nothing is owed.
#[test]
fn only_the_ack_of_one_send_may_wait_for_a_reply() {
    let (mut a, mut b) = pair(Mtu::Mtu1024, 14);
    let now = Instant::ZERO;
    let send = |a: &mut End, id: u64| {
        let ss = [a.sge(0, 32)];
        a.qp.post_send(
            &SendWr { wr_id: id, op: SendOp::Send, sg_list: &ss, flags: SendFlags::SIGNALED },
            &a.mem,
        )
        .unwrap();
    };
    for i in 0..4u64 {
        let rb = [b.sge(4096 + 64 * i as usize, 64)];
        b.qp.post_recv(&RecvWr { wr_id: 20 + i, sg_list: &rb }).unwrap();
    }
    assert!(!b.qp.must_respond_now(), "nothing received");

    send(&mut a, 0);
    let one = a.tx(now);
    b.rx(now, a.ip, &one[0]);
    assert!(!b.qp.must_respond_now(), "one SEND: its ACK may wait");
    assert_eq!(b.tx(now).len(), 1);
    assert!(!b.qp.must_respond_now(), "sent: nothing owed");

    b.rx(now, a.ip, &one[0]);
    assert!(b.qp.must_respond_now(), "a duplicate is re-acknowledged at once");
    b.tx(now);

    send(&mut a, 1);
    send(&mut a, 2);
    for f in a.tx(now) {
        b.rx(now, a.ip, &f);
    }
    assert!(b.qp.must_respond_now(), "two SENDs: a stream");
    b.tx(now);

    let target = b.buf.as_ptr() as u64 + 8192;
    let ss = [a.sge(0, 2048)];
    let op = SendOp::RdmaWrite { remote_addr: target, rkey: b.key };
    a.qp.post_send(&SendWr { wr_id: 3, op, sg_list: &ss, flags: SendFlags::SIGNALED }, &a.mem).unwrap();
    let write = a.tx(now);
    assert_eq!(write.len(), 2, "two packets at MTU 1024");
    b.rx(now, a.ip, &write[0]);
    assert!(!b.qp.must_respond_now(), "the first packet of a WRITE asks for no ACK");
    b.rx(now, a.ip, &write[1]);
    assert!(b.qp.must_respond_now(), "a WRITE's ACK: the requester waits for it");
    b.tx(now);

    send(&mut a, 4);
    b.rx(now, a.ip, &a.tx(now)[0]);
    send(&mut a, 5);
    b.rx(now, a.ip, &a.tx(now)[0]);
    assert!(b.qp.must_respond_now(), "no receive posted for the second: an RNR NAK");
}

/// A reply carrying a piggybacked ACK yields a receive completion and a send completion:
/// the receive is reported first (the peer is waiting on it), each queue in its own order.
#[test]
fn a_reply_carrying_an_ack_completes_the_receive_first() {
    let (mut a, mut b) = pair(Mtu::Mtu1024, 14);
    let now = Instant::ZERO;
    let ra = [a.sge(4096, 64)];
    a.qp.post_recv(&RecvWr { wr_id: 10, sg_list: &ra }).unwrap();
    let rb = [b.sge(4096, 64)];
    b.qp.post_recv(&RecvWr { wr_id: 20, sg_list: &rb }).unwrap();
    let ss = [a.sge(0, 32)];
    a.qp.post_send(&SendWr { wr_id: 1, op: SendOp::Send, sg_list: &ss, flags: SendFlags::SIGNALED }, &a.mem)
        .unwrap();
    b.rx(now, a.ip, &a.tx(now)[0]);
    let reply = [b.sge(0, 16)];
    b.qp.post_send(
        &SendWr { wr_id: 30, op: SendOp::Send, sg_list: &reply, flags: SendFlags::SIGNALED },
        &b.mem,
    )
    .unwrap();
    let out = b.tx(now);
    assert_eq!(out.len(), 1);
    assert!(headers(&out[0]).piggy.is_some());
    a.rx(now, b.ip, &out[0]);
    let order: Vec<(CqSel, u64)> = a.done.iter().map(|c| (c.cq, c.wc.wr_id)).collect();
    assert_eq!(order, [(CqSel::Recv, 10), (CqSel::Send, 1)]);
}
