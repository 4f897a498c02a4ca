#![no_main]
//! `cargo fuzz run tunables`: see [`lnd_fuzz::tunables`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| lnd_fuzz::tunables::run(data));
