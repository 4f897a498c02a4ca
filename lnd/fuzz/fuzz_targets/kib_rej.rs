#![no_main]
//! `cargo fuzz run kib_rej`: see [`lnd_fuzz::kib_rej`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| lnd_fuzz::kib_rej::run(data));
