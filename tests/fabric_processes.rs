//! Two OS processes on 127.0.0.1 and 127.0.0.2 move RDMA WRITEs over the software device on real
//! UDP sockets; every byte is verified at the target.

use lnd_tests::{run_pair, unique_port};

#[test]
fn two_processes_move_256_mib_of_rdma_writes_each_named_by_a_send() {
    let port = unique_port(0);
    let size = 1 << 20;
    let messages = 256; // 256 MiB
    let common =
        ["--port", &port.to_string(), "--messages", &messages.to_string(), "--size", &size.to_string()];
    let target: Vec<&str> = ["target", "--ip", "127.0.0.2"].iter().copied().chain(common).collect();
    let initiator: Vec<&str> = ["initiator", "--ip", "127.0.0.1", "--target", "127.0.0.2", "--window", "8"]
        .iter()
        .copied()
        .chain(common)
        .collect();
    let (t, i) =
        run_pair(env!("CARGO_BIN_EXE_soft-peer"), &target, &initiator, std::time::Duration::from_secs(180));
    assert!(t.success && i.success, "target: {t:?}\ninitiator: {i:?}");
    assert!(t.stdout.contains(&format!("verified {messages} messages, {} bytes", messages * size)), "{t:?}");
    assert!(i.stdout.contains("MiB/s"), "{i:?}");
    // Same host: placed with one copy unless LND_SOFT_SINGLE_COPY=0 (or the kernel refuses).
    lnd_tests::assert_write_path(&t.stdout);
    lnd_tests::assert_mapped_copies(&t.stdout);
    lnd_tests::assert_write_path(&i.stdout);
    println!("{}", i.stdout.trim());
}
