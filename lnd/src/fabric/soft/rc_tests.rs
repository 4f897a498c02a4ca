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
        let rts = QpModify::Rts { sq_psn: psns[i], timeout, retry_cnt: 7, rnr_retry: 7, max_rd_atomic: 0 };
        x.qp.modify(&rts).unwrap();
    }
    (a, b)
}

/// A three-packet SEND whose MIDDLE is overtaken by its LAST: the responder discards the LAST
/// and queues a sequence NAK; the late MIDDLE then fills the gap. The NAK must still go (it
/// was withdrawn, so the requester heard nothing and waited a whole retransmission timeout,
/// or, with no timeout, forever), and the requester resends from it at once.
#[test]
fn a_reordered_middle_packet_is_recovered_by_the_sequence_nak_not_a_timeout() {
    for timeout in [14, 0] {
        let (mut a, mut b) = pair(Mtu::Mtu256, timeout);
        let rs = [b.sge(0, 4096)];
        b.qp.post_recv(&RecvWr { wr_id: 9, sg_list: &rs }).unwrap();
        let ss = [a.sge(0, 768)];
        let send = SendWr { wr_id: 1, op: SendOp::Send, sg_list: &ss, flags: SendFlags::SIGNALED };
        a.qp.post_send(&send, &a.mem).unwrap();
        let now = Instant::ZERO;
        let f = a.tx(now);
        let ops: Vec<Opcode> =
            f.iter().map(|x| packet::parse_unchecked(x).unwrap().headers.bth.opcode).collect();
        assert_eq!(ops, [Opcode::RcSendFirst, Opcode::RcSendMiddle, Opcode::RcSendLast]);
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
