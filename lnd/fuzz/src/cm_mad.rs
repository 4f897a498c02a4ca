//! `cm_mad`: the CM MAD codec (`lnd::cm::mad`) and the IP CM header (`lnd::cm::ip_cm`).
//!
//! Input: the bytes of one received MAD (256 for a real one; any length is tried).
//!
//! Contract checked (the modules' "Contract" sections):
//! * [`CmMad::decode`] and [`MadHeader::decode`] never panic; `decode` accepts exactly 256 bytes;
//! * what decodes re-encodes ([`CmMad::encode`] cannot fail on a decoded value), the encoding
//!   decodes to the same value, and it equals the input with reserved bits (and the header's
//!   Status, ClassSpecific and AttributeModifier) cleared: every bit set in the re-encoding is
//!   set in the input, and the fields the header carries are byte-identical;
//! * [`split_req_private_data`] and [`CmaHeader::decode`] never panic; a header that decodes
//!   re-encodes into a subset of the input's bits and decodes to the same value, and
//!   [`req_private_data`] rebuilds the 92 bytes the same way.

use lnd::cm::ip_cm::{
    CMA_HEADER_LEN, CmaHeader, parse_ip_service_id, req_private_data, split_req_private_data,
};
use lnd::cm::mad::{CmMad, CmMessage, MAD_LEN, MadError, MadHeader, REQ_PRIVATE_DATA_LEN};

/// The fuzz target.
pub fn run(data: &[u8]) {
    let header = MadHeader::decode(data);
    match CmMad::decode(data) {
        Ok(m) => {
            assert_eq!(data.len(), MAD_LEN, "decode accepted a {}-byte MAD", data.len());
            assert!(header.is_ok(), "CmMad decoded but its header did not: {header:?}");
            check_mad(data, &m);
        }
        Err(e) => {
            let _ = e.to_string();
            match e {
                MadError::Truncated(n) | MadError::TooLong(n) => assert_eq!(n, data.len()),
                _ => assert_eq!(data.len(), MAD_LEN),
            }
        }
    }

    // The REQ private-data splitter and the IP CM header on whatever the tail holds.
    let mut pd = [0u8; REQ_PRIVATE_DATA_LEN];
    let tail = &data[data.len().saturating_sub(REQ_PRIVATE_DATA_LEN)..];
    pd[..tail.len()].copy_from_slice(tail);
    check_private_data(&pd);
    let _ = CmaHeader::decode(data);
    if data.len() >= 8 {
        let _ = parse_ip_service_id(u64::from_be_bytes(data[..8].try_into().unwrap()));
    }
}

fn check_mad(data: &[u8], m: &CmMad) {
    let enc = m.encode().unwrap_or_else(|e| panic!("decoded {} does not re-encode: {e}", m.msg.name()));
    let again =
        CmMad::decode(&enc).unwrap_or_else(|e| panic!("re-encoded {} does not decode: {e}", m.msg.name()));
    assert_eq!(&again, m, "re-encoded MAD decodes differently");
    // Only reserved bits (and Status, ClassSpecific, AttributeModifier) may be dropped.
    for (i, (&e, &d)) in enc.iter().zip(data).enumerate() {
        assert_eq!(
            e & !d,
            0,
            "re-encoding set bits at byte {i} the input did not have: {e:#04x} vs {d:#04x}"
        );
    }
    // Base version, class, class version, method, TID and attribute ID are kept exactly.
    assert_eq!(enc[..4], data[..4]);
    assert_eq!(enc[8..18], data[8..18]);
    assert_eq!(m.msg.attr_id(), u16::from_be_bytes([data[16], data[17]]));
    let _ = (m.msg.local_comm_id(), m.msg.remote_comm_id());
    match &m.msg {
        CmMessage::Req(req) => {
            check_private_data(&req.private_data);
            let _ = req.primary_path.is_zero();
        }
        CmMessage::Rej(rej) => {
            assert!(rej.ari_bytes().len() <= rej.ari.len());
            let _ = (rej.reason.to_string(), rej.reason.ibta_name(), u16::from(rej.reason));
        }
        _ => {}
    }
}

fn check_private_data(pd: &[u8; REQ_PRIVATE_DATA_LEN]) {
    let Ok((hdr, consumer)) = split_req_private_data(pd) else {
        return;
    };
    let decoded = CmaHeader::decode(&pd[..CMA_HEADER_LEN]).expect("split accepted the header");
    assert_eq!(decoded, hdr);
    let enc = hdr.encode();
    assert_eq!(CmaHeader::decode(&enc), Ok(hdr), "IP CM header does not round trip");
    let rebuilt = req_private_data(&hdr, consumer).expect("56 bytes of consumer data fit");
    assert_eq!(rebuilt[..CMA_HEADER_LEN], enc);
    assert_eq!(rebuilt[CMA_HEADER_LEN..], consumer[..]);
    for (i, (&e, &d)) in rebuilt.iter().zip(pd).enumerate() {
        assert_eq!(e & !d, 0, "IP CM header re-encoding set bits at byte {i}");
    }
}
