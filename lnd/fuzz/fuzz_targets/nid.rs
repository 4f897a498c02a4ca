#![no_main]
//! `cargo fuzz run nid`: see [`lnd_fuzz::nid`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| lnd_fuzz::nid::run(data));
