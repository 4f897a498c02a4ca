//! `nid`: NID and network strings (`lnet_shim::nid::{Nid, Net}`).
//!
//! Input: any bytes, read as UTF-8 (lossily: invalid sequences become U+FFFD), so the parsers
//! see arbitrary text, multi-byte characters included. The first 8 bytes are also read as a raw
//! nid4.
//!
//! Contract checked (`lnet_shim::nid`'s documentation):
//! * `str::parse::<Nid>()` and `str::parse::<Net>()` never panic, on the whole text and on
//!   each `@`- and whitespace-separated piece;
//! * what parses prints back as text that parses to the same value (the printed form is
//!   LNet's: `a.b.c.d@o2ibN`, `N@lo`);
//! * any raw nid4 or net prints without panicking, and one of a type this crate knows prints
//!   as text that parses back to it.

use lnet_shim::nid::{Net, Nid, ProcessId};

/// The fuzz target.
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    check_text(&text);
    for piece in text.split(['@', ' ', '\n', ',']) {
        check_text(piece);
    }
    if let Some(raw) = data.first_chunk::<8>() {
        let nid = Nid::from_u64(u64::from_le_bytes(*raw));
        let printed = nid.to_string();
        let _ = (format!("{nid:?}"), ProcessId::new(nid, 12345).to_string());
        if nid.net().net_type().is_some() && !nid.is_any() {
            assert_eq!(printed.parse::<Nid>(), Ok(nid), "{nid:?} prints as {printed:?}");
        }
        let net = nid.net();
        let printed = net.to_string();
        if net.net_type().is_some() {
            assert_eq!(printed.parse::<Net>(), Ok(net), "{net:?} prints as {printed:?}");
        }
    }
}

fn check_text(text: &str) {
    match text.parse::<Nid>() {
        Ok(nid) => {
            assert!(!nid.is_any());
            let printed = nid.to_string();
            assert_eq!(printed.parse::<Nid>(), Ok(nid), "{text:?} -> {nid:?} prints as {printed:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    match text.parse::<Net>() {
        Ok(net) => {
            let printed = net.to_string();
            assert_eq!(printed.parse::<Net>(), Ok(net), "{text:?} -> {net:?} prints as {printed:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}
