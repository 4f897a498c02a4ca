//! `lnd-bench`: an lnet_selftest-style bandwidth and latency tool.

fn main() {
    eprintln!("lnd-bench: not implemented yet");
    std::process::exit(2);
}
