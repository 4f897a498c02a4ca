//! `o2ib_msg`: o2iblnd messages (`lnd::wire::unpack`, `check_conn`) and the RDMA descriptors of
//! PUT_ACK and GET_REQ.
//!
//! Input: the receive buffer (a message, possibly followed by more bytes, as in a 4 KiB rx
//! buffer).
//!
//! Contract checked (`lnd::wire`'s "Contract" section and `unpack`'s documentation):
//! * [`unpack`] never panics; what it returns lies inside `ibm_nob`, which lies inside the
//!   buffer and within 48..=4096 bytes; the type's fixed body fits;
//! * a descriptor has 1..=257 fragments, all inside `ibm_nob`; iterating it forwards, backwards
//!   and by index agrees; its size is the checked sum of the fragment sizes ([`rd_size`]);
//! * [`check_conn`] accepts the identity the header names and refuses any other with a
//!   `Stale*` error;
//! * a decoded message re-encodes in the sender's byte order (checksum recomputed if it had
//!   one) into at most `ibm_nob` bytes and decodes to the same message (same order, header
//!   fields and body; `ibm_nob` may cover bytes past a fixed-size body, which the re-encoding
//!   leaves out); when it is as long as the input's `ibm_nob`, it is the input byte for byte;
//! * [`ConnParams`] round trip through their 8 bytes in both byte orders.

use lnd::wire::{
    ByteOrder, CONN_PARAMS_SIZE, ConnIdentity, ConnParams, GetMsg, IBLND_MAX_RDMA_FRAGS, IBLND_MSG_SIZE,
    MSG_HDR_SIZE, MsgBody, MsgHeader, PutAckMsg, RDMA_DESC_HDR_SIZE, RdmaDesc, RdmaFrag, check_conn, rd_size,
    unpack,
};
use lnet_shim::Nid;

/// Offset of the descriptor in a PUT_ACK (after two cookies).
const PUTACK_RD: usize = MSG_HDR_SIZE + 16;
/// Offset of the descriptor in a GET_REQ (after the LNet header and the cookie).
const GET_RD: usize = MSG_HDR_SIZE + 72 + 8;

/// The fuzz target.
pub fn run(data: &[u8]) {
    match unpack(data) {
        Ok(m) => {
            let nob = m.hdr.nob as usize;
            assert!((MSG_HDR_SIZE..=IBLND_MSG_SIZE).contains(&nob), "nob {nob}");
            assert!(nob <= data.len(), "nob {nob} past the {} bytes received", data.len());
            assert!(nob >= m.hdr.msg_type.min_size(), "nob {nob} below the {} body", m.hdr.msg_type);
            assert_eq!(m.body.msg_type(), m.hdr.msg_type);
            assert!(!m.hdr.srcnid.is_any());
            let msg = &data[..nob];
            match &m.body {
                MsgBody::PutAck(PutAckMsg { rd, .. }) => check_rd(rd, PUTACK_RD, nob),
                MsgBody::GetReq(GetMsg { rd, .. }) => check_rd(rd, GET_RD, nob),
                MsgBody::Immediate(imm) => {
                    assert_eq!(MSG_HDR_SIZE + 72 + imm.payload.len(), nob);
                    assert_eq!(imm.payload, &msg[MSG_HDR_SIZE + 72..]);
                }
                _ => {}
            }
            check_identity(&m.hdr);

            let mut out = vec![0u8; IBLND_MSG_SIZE];
            let n2 = m
                .encode(&mut out, m.hdr.cksum != 0)
                .unwrap_or_else(|e| panic!("decoded {m:?} does not re-encode: {e}"))
                as usize;
            // `ibm_nob` may cover bytes past a fixed-size body (o2iblnd only checks it is not
            // short); the re-encoding is the minimal message.
            assert!(n2 <= nob, "re-encoded to {n2} bytes, more than nob {nob}");
            let again =
                unpack(&out[..n2]).unwrap_or_else(|e| panic!("re-encoded message does not decode: {e}"));
            let fixed = |h: MsgHeader| MsgHeader { nob: 0, cksum: 0, ..h };
            assert_eq!(
                (again.order, again.body),
                (m.order, m.body),
                "re-encoded message decodes differently"
            );
            assert_eq!(fixed(again.hdr), fixed(m.hdr), "re-encoded header decodes differently");
            assert_eq!(again.hdr.cksum != 0, m.hdr.cksum != 0);
            if n2 == nob {
                assert_eq!(again, m);
                assert_eq!(&out[..n2], msg, "re-encoded bytes differ");
            }
        }
        Err(e) => {
            let _ = (e.to_string(), e.is_stale());
        }
    }

    let mut cp = [0u8; CONN_PARAMS_SIZE];
    for (d, s) in cp.iter_mut().zip(data.iter().skip(MSG_HDR_SIZE)) {
        *d = *s;
    }
    for order in [ByteOrder::Little, ByteOrder::Big] {
        assert_eq!(ConnParams::decode(cp, order).encode(order), cp, "ConnParams do not round trip");
    }
}

/// The descriptor at `offset` of a message of `nob` bytes.
fn check_rd(rd: &RdmaDesc<'_>, offset: usize, nob: usize) {
    let n = rd.nfrags();
    assert!((1..=IBLND_MAX_RDMA_FRAGS).contains(&n), "{n} fragments");
    assert_eq!(rd.wire_size(), RDMA_DESC_HDR_SIZE + 12 * n);
    assert!(offset + rd.wire_size() <= nob, "descriptor ends past nob {nob}");
    let frags: Vec<RdmaFrag> = rd.iter().collect();
    assert_eq!(frags.len(), n);
    assert_eq!(rd.iter().len(), n);
    let mut back: Vec<RdmaFrag> = rd.iter().rev().collect();
    back.reverse();
    assert_eq!(back, frags, "iterating backwards disagrees");
    for (i, f) in frags.iter().enumerate() {
        assert_eq!(rd.frag(i), Some(*f), "frag({i}) disagrees with iter()");
    }
    assert_eq!(rd.frag(n), None);
    let sum = frags.iter().try_fold(0u32, |s, f| s.checked_add(f.nob));
    assert_eq!(rd.size(), sum);
    assert_eq!(rd_size(&frags), sum);
    // A descriptor over the same fragments held natively is equal to the decoded one.
    assert_eq!(RdmaDesc::new(rd.key(), &frags), *rd);
    let _ = format!("{rd:?}");
}

/// `check_conn` accepts exactly the identity the header carries.
fn check_identity(hdr: &MsgHeader) {
    let id = ConnIdentity {
        peer_nid: hdr.srcnid,
        peer_incarnation: hdr.srcstamp,
        my_nid: hdr.dstnid,
        my_incarnation: hdr.dststamp,
    };
    assert_eq!(check_conn(hdr, &id), Ok(()), "check_conn refused the header's own identity");
    let others = [
        ConnIdentity { peer_nid: Nid::from_u64(hdr.srcnid.as_u64() ^ 1), ..id },
        ConnIdentity { my_nid: Nid::from_u64(hdr.dstnid.as_u64() ^ 1), ..id },
        ConnIdentity { peer_incarnation: hdr.srcstamp ^ 1, ..id },
        ConnIdentity { my_incarnation: hdr.dststamp ^ 1, ..id },
    ];
    for other in others {
        match check_conn(hdr, &other) {
            Err(e) => assert!(e.is_stale(), "check_conn refused with a non-stale error: {e}"),
            Ok(()) => panic!("check_conn accepted a foreign identity {other:?}"),
        }
    }
}
