//! Two OS processes, each an o2iblnd interface on the software fabric over real UDP
//! (127.0.0.1 and 127.0.0.2): connection setup, and 1 GiB moved by PUT and by GET with every
//! byte verified on the receiving side. Then a server with two scheduler threads (`nscheds=2`)
//! serving two client processes whose addresses fall on different schedulers.

use std::time::Duration;

use lnd_tests::{spawn, unique_port};

const BIN: &str = env!("CARGO_BIN_EXE_lnd-node");

fn pair(
    port: u16,
    op: &str,
    size: usize,
    count: u64,
    window: u64,
    client_extra: &[&str],
) -> (lnd_tests::Outcome, lnd_tests::Outcome) {
    let port = port.to_string();
    let (size_s, count_s, window_s) = (size.to_string(), count.to_string(), window.to_string());
    let server = spawn(BIN, &["serve", "--nid", "127.0.0.2@o2ib", "--port", &port, "--expect", &count_s]);
    let client = spawn(
        BIN,
        &[
            &lnd_tests::DRIVE_FROM_1_TO_2[..],
            &["--port", &port, "--op", op, "--size", &size_s, "--count", &count_s, "--window", &window_s],
            client_extra,
        ]
        .concat(),
    );
    let c = client.wait(Duration::from_secs(300));
    let s = server.wait(Duration::from_secs(if c.timed_out { 1 } else { 60 }));
    (s, c)
}

#[test]
fn two_processes_connect_over_real_udp() {
    let (s, c) = pair(unique_port(0), "put", 100, 10, 4, &[]);
    assert!(s.success && c.success, "server {s:?}\nclient {c:?}");
    assert!(s.stdout.contains("verified 10 PUTs"), "{s:?}");
}

#[test]
fn two_processes_move_1_gib_by_put_verified() {
    let (s, c) = pair(unique_port(1), "put", 1 << 20, 1024, 8, &[]);
    assert!(s.success && c.success, "server {s:?}\nclient {c:?}");
    assert!(s.stdout.contains("verified 1024 PUTs"), "{s:?}");
    lnd_tests::assert_write_path(&c.stdout);
    // Clean exits leave no registry entry and no ring behind.
    let port = unique_port(1);
    assert_eq!(lnd_tests::same_host_leftovers(port), Vec::<String>::new());
    println!("{}", c.stdout.trim());
}

#[test]
fn two_processes_move_1_gib_by_get_verified() {
    // The client's copy engine takes part in every large copy (`always`), deterministically,
    // and every large copy uses streaming stores (`always`; by default 8 MiB in flight fits
    // in the cache budget and would not).
    let (s, c) =
        pair(unique_port(2), "get", 1 << 20, 1024, 8, &["--copy-helper", "always", "--streaming", "always"]);
    assert!(s.success && c.success, "server {s:?}\nclient {c:?}");
    assert!(s.stdout.contains("and 1024 GETs"), "{s:?}");
    lnd_tests::assert_write_path(&c.stdout);
    // The server's RDMA WRITEs land in the client: it copied them from the server's arena,
    // each 1 MiB copy shared with its copy engine's helper thread, and left running on it
    // while the client's device went on (every byte still checked).
    lnd_tests::assert_mapped_copies(&c.stdout);
    let counter = |name| lnd_tests::counter(&c.stdout, name).unwrap_or_else(|| panic!("no {name} in {c:?}"));
    assert_eq!(counter("split"), counter("mapped"), "{}", c.stdout);
    assert_eq!(counter("overlapped"), counter("mapped"), "{}", c.stdout);
    let streamed = if lnd::fabric::soft::streaming::AVAILABLE { counter("mapped") } else { 0 };
    assert_eq!(counter("streamed"), streamed, "{}", c.stdout);
    println!("{}", c.stdout.trim());
}

#[test]
fn a_server_with_two_schedulers_serves_clients_on_both() {
    use lnd::driver::shard::shard_of;
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        println!("skipped: nscheds is capped at the CPUs, and this machine has one");
        return;
    }
    let clients = ["127.0.0.1", "127.0.0.3"];
    let ips: Vec<std::net::Ipv4Addr> = clients.iter().map(|c| c.parse().unwrap()).collect();
    assert_ne!(shard_of(ips[0], 2), shard_of(ips[1], 2), "the clients must fall on different schedulers");
    let conf = std::env::temp_dir().join(format!("lnd-nscheds-{}.conf", std::process::id()));
    std::fs::write(&conf, "options ko2iblnd nscheds=2\n").unwrap();
    let conf = conf.display().to_string();
    let port = unique_port(3).to_string();
    let server = spawn(
        BIN,
        &["serve", "--nid", "127.0.0.2@o2ib", "--port", &port, "--tunables", &conf, "--expect", "200"],
    );
    assert!(server.wait_for_line("serving on", Duration::from_secs(30)).is_some(), "the server starts");
    let drivers: Vec<_> = clients
        .iter()
        .map(|ip| {
            let nid = format!("{ip}@o2ib");
            let args = ["drive", "--nid", &nid, "--to", "127.0.0.2@o2ib", "--port", &port];
            let rest = ["--op", "put", "--size", "262144", "--count", "100", "--window", "8"];
            spawn(BIN, &[&args[..], &rest[..]].concat())
        })
        .collect();
    let outcomes: Vec<_> = drivers.into_iter().map(|d| d.wait(Duration::from_secs(120))).collect();
    let s = server.wait(Duration::from_secs(60));
    for c in &outcomes {
        assert!(c.success, "client {c:?}\nserver {s:?}");
    }
    assert!(s.success && s.stdout.contains("verified 200 PUTs"), "{s:?}");
    assert!(s.stdout.contains("server schedulers 2: connections established per scheduler [1, 1]"), "{s:?}");
    println!("{}", s.stdout.lines().find(|l| l.contains("schedulers")).unwrap_or_default());
}
