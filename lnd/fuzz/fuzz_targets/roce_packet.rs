#![no_main]
//! `cargo fuzz run roce_packet`: see [`lnd_fuzz::roce_packet`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| lnd_fuzz::roce_packet::run(data));
