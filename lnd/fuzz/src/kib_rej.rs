//! `kib_rej`: the o2iblnd reject private data (`lnd::wire::KibRej`) and connection parameters
//! (`lnd::wire::ConnParams`).
//!
//! Input: the private data of a received CM REJ (any length; a real one is 24 to 148 bytes).
//!
//! Contract checked (`lnd::wire::rej`'s documentation):
//! * [`KibRej::decode`] never panics, and fails exactly when fewer than 7 bytes are given, the
//!   magic is neither o2iblnd's nor LNet's (in either byte order), or the version is not V1/V2;
//! * the incarnation and parameters are present exactly for a full 24-byte V2 reject;
//! * the 24-byte encoding decodes to the same reject (for one without incarnation: to the same
//!   order, magic, version and reason) and repeats the input's bytes, except the padding byte
//!   (and the fields a short or V1 reject does not carry);
//! * [`ConnParams`] round trip through their 8 bytes in both byte orders.

use lnd::wire::{
    ByteOrder, CONN_PARAMS_SIZE, ConnParams, IBLND_MSG_VERSION_1, IBLND_MSG_VERSION_2, KIB_REJ_SIZE, KibRej,
    WireError,
};

/// The fuzz target.
pub fn run(data: &[u8]) {
    match KibRej::decode(data) {
        Ok(r) => {
            assert!(data.len() >= 7);
            assert!(r.version == IBLND_MSG_VERSION_1 || r.version == IBLND_MSG_VERSION_2);
            let full_v2 = data.len() >= KIB_REJ_SIZE && r.version == IBLND_MSG_VERSION_2;
            assert_eq!(r.incarnation.is_some(), full_v2, "incarnation presence: {r:?}");
            assert_eq!(r.cp.is_some(), full_v2, "parameters presence: {r:?}");
            let _ = (r.reason().map(|w| w.to_string()), r.is_lnet_proto());
            let enc = r.encode();
            assert_eq!(enc[..7], data[..7], "magic, version or reason re-encoded differently");
            assert_eq!(enc[7], 0, "padding not zero");
            let again =
                KibRej::decode(&enc).unwrap_or_else(|e| panic!("re-encoded reject does not decode: {e}"));
            if full_v2 {
                assert_eq!(again, r);
                assert_eq!(enc[8..], data[8..KIB_REJ_SIZE]);
            } else {
                assert_eq!(
                    (again.order, again.magic, again.version, again.why),
                    (r.order, r.magic, r.version, r.why)
                );
            }
        }
        Err(e) => {
            let _ = e.to_string();
            match e {
                WireError::RejTooShort { len } => assert!(len < 7 && len == data.len()),
                WireError::BadMagic { .. } | WireError::BadVersion { .. } => assert!(data.len() >= 7),
                other => panic!("unexpected reject decode error {other:?}"),
            }
        }
    }

    let mut cp = [0u8; CONN_PARAMS_SIZE];
    for (d, s) in cp.iter_mut().zip(data.iter().skip(16)) {
        *d = *s;
    }
    for order in [ByteOrder::Little, ByteOrder::Big] {
        let p = ConnParams::decode(cp, order);
        assert_eq!(p.encode(order), cp, "ConnParams do not round trip");
        assert_eq!(ConnParams::decode(p.encode(order), order), p);
    }
}
