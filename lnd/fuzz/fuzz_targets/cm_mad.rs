#![no_main]
//! `cargo fuzz run cm_mad`: see [`lnd_fuzz::cm_mad`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| lnd_fuzz::cm_mad::run(data));
