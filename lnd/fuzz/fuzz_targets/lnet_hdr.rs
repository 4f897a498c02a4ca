#![no_main]
//! `cargo fuzz run lnet_hdr`: see [`lnd_fuzz::lnet_hdr`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| lnd_fuzz::lnet_hdr::run(data));
