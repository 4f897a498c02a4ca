#![no_main]
//! `cargo fuzz run o2ib_msg`: see [`lnd_fuzz::o2ib_msg`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| lnd_fuzz::o2ib_msg::run(data));
