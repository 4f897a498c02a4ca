//! Two OS processes, each an o2iblnd interface on the software fabric over real UDP
//! (127.0.0.1 and 127.0.0.2): connection setup, and 1 GiB moved by PUT and by GET with every
//! byte verified on the receiving side.

use std::time::Duration;

use lnd_tests::{spawn, unique_port};

const BIN: &str = env!("CARGO_BIN_EXE_lnd-node");

fn pair(
    port: u16,
    op: &str,
    size: usize,
    count: u64,
    window: u64,
) -> (lnd_tests::Outcome, lnd_tests::Outcome) {
    let port = port.to_string();
    let (size_s, count_s, window_s) = (size.to_string(), count.to_string(), window.to_string());
    let server = spawn(BIN, &["serve", "--nid", "127.0.0.2@o2ib", "--port", &port, "--expect", &count_s]);
    let client = spawn(
        BIN,
        &[
            "drive",
            "--nid",
            "127.0.0.1@o2ib",
            "--to",
            "127.0.0.2@o2ib",
            "--port",
            &port,
            "--op",
            op,
            "--size",
            &size_s,
            "--count",
            &count_s,
            "--window",
            &window_s,
        ],
    );
    let c = client.wait(Duration::from_secs(300));
    let s = server.wait(Duration::from_secs(if c.timed_out { 1 } else { 60 }));
    (s, c)
}

#[test]
fn two_processes_connect_over_real_udp() {
    let (s, c) = pair(unique_port(0), "put", 100, 10, 4);
    assert!(s.success && c.success, "server {s:?}\nclient {c:?}");
    assert!(s.stdout.contains("verified 10 PUTs"), "{s:?}");
}

#[test]
fn two_processes_move_1_gib_by_put_verified() {
    let (s, c) = pair(unique_port(1), "put", 1 << 20, 1024, 8);
    assert!(s.success && c.success, "server {s:?}\nclient {c:?}");
    assert!(s.stdout.contains("verified 1024 PUTs"), "{s:?}");
    lnd_tests::assert_write_path(&c.stdout);
    println!("{}", c.stdout.trim());
}

#[test]
fn two_processes_move_1_gib_by_get_verified() {
    let (s, c) = pair(unique_port(2), "get", 1 << 20, 1024, 8);
    assert!(s.success && c.success, "server {s:?}\nclient {c:?}");
    assert!(s.stdout.contains("and 1024 GETs"), "{s:?}");
    lnd_tests::assert_write_path(&c.stdout);
    println!("{}", c.stdout.trim());
}
