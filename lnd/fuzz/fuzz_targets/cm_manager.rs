#![no_main]
//! `cargo fuzz run cm_manager`: see [`lnd_fuzz::cm_manager`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| lnd_fuzz::cm_manager::run(data));
