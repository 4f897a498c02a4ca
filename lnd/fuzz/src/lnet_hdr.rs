//! `lnet_hdr`: the 72-byte LNet header (`lnet_shim::hdr::LnetHdr`).
//!
//! Input: the bytes at the start of an LNet message (header, then payload).
//!
//! Contract checked (`lnet_shim::hdr`'s documentation):
//! * [`LnetHdr::decode`] never panics; it fails exactly on fewer than 72 bytes or an unknown
//!   type, and reads nothing past byte 72;
//! * a decoded header re-encodes to the input's first 72 bytes, except that union bytes the
//!   type does not use become zero, and the encoding decodes to the same header.

use lnet_shim::hdr::{HdrError, LNET_HDR_SIZE, LnetHdr, LnetMsgType};

/// The fuzz target.
pub fn run(data: &[u8]) {
    match LnetHdr::decode(data) {
        Ok(h) => {
            assert!(data.len() >= LNET_HDR_SIZE);
            let enc = h.encode();
            assert_eq!(enc[..32], data[..32], "fixed fields re-encoded differently");
            for (i, (&e, &d)) in enc.iter().zip(data).enumerate().skip(32) {
                assert!(e == d || e == 0, "union byte {i}: {e:#04x} vs {d:#04x}");
            }
            assert_eq!(LnetHdr::decode(&enc), Ok(h), "re-encoded header decodes differently");
            // Only the first 72 bytes matter.
            assert_eq!(LnetHdr::decode(&data[..LNET_HDR_SIZE]), Ok(h));
            let _ =
                (h.dest.to_string(), h.src.to_string(), h.msg_type().to_string(), h.msg.msg_type().name());
        }
        Err(e) => {
            let _ = e.to_string();
            match e {
                HdrError::Short { len } => assert!(len < LNET_HDR_SIZE && len == data.len()),
                HdrError::UnknownType { raw } => {
                    assert!(data.len() >= LNET_HDR_SIZE);
                    assert_eq!(LnetMsgType::from_u32(raw), None);
                    assert_eq!(raw.to_le_bytes(), data[24..28]);
                }
                other => panic!("unexpected error {other:?}"),
            }
        }
    }
}
