#![no_main]
//! `cargo fuzz run ring`: see [`lnd_fuzz::ring`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| lnd_fuzz::ring::run(data));
