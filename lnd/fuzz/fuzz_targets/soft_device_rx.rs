#![no_main]
//! `cargo fuzz run soft_device_rx`: see [`lnd_fuzz::soft_device_rx`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| lnd_fuzz::soft_device_rx::run(data));
