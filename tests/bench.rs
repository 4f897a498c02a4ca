//! `lnd-bench` as users run it: a server process and a brw/ping client process on
//! 127.0.0.1/127.0.0.2 over the software fabric; failures give a one-line error and a non-zero
//! exit, never a hang.

use std::time::Duration;

use lnd_tests::{Running, spawn, unique_port};

const BIN: &str = env!("CARGO_BIN_EXE_lnd-bench-under-test");

/// Starts `lnd-bench server` on 127.0.0.1@o2ib (clients retry connecting until it listens).
fn server(port: u16) -> Running {
    spawn(BIN, &["server", "--nid", "127.0.0.1@o2ib", "--port", &port.to_string()])
}

fn client(port: u16, args: &[&str]) -> lnd_tests::Outcome {
    let port = port.to_string();
    let mut all = args.to_vec();
    all.extend(["--nid", "127.0.0.2@o2ib", "--to", "127.0.0.1@o2ib", "--port", &port]);
    spawn(BIN, &all).wait(Duration::from_secs(120))
}

fn stop(s: Running) -> lnd_tests::Outcome {
    s.signal(libc::SIGTERM);
    s.wait(Duration::from_secs(20))
}

fn data_row(out: &str, test: &str) -> Vec<String> {
    out.lines()
        .find(|l| l.starts_with(test))
        .unwrap_or_else(|| panic!("no '{test}' row in:\n{out}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Runs `brw` write then read with `size`, `concurrency`, `count` and `check` against the
/// server on `port`; returns each run's data row after asserting that the client succeeded.
fn brw_both_ways(port: u16, size: &str, concurrency: &str, count: &str, check: &str) -> Vec<Vec<String>> {
    ["write", "read"]
        .into_iter()
        .map(|op| {
            let args = [
                "brw",
                "--op",
                op,
                "--size",
                size,
                "--concurrency",
                concurrency,
                "--count",
                count,
                "--check",
                check,
            ];
            let c = client(port, &args);
            assert!(c.success, "brw {op}: {c:?}");
            data_row(&c.stdout, &format!("brw {op}"))
        })
        .collect()
}

#[test]
fn brw_write_and_read_with_full_checking() {
    let port = unique_port(0);
    let s = server(port);
    for row in brw_both_ways(port, "64K", "4", "300", "full") {
        // test(2 words) size conc MiB/s RPC/s p50 p99 p99.9 max errors ...
        assert_eq!(row[2], "64K", "{row:?}");
        assert_eq!(row[10], "0", "no errors: {row:?}");
        assert!(row[4].parse::<f64>().unwrap() > 0.0, "{row:?}");
    }
    let p = client(port, &["ping", "--size", "4K", "--count", "200", "--json"]);
    assert!(p.success, "{p:?}");
    assert!(p.stdout.contains("\"op\": \"ping\"") && p.stdout.contains("\"verified\": true"), "{p:?}");
    let o = stop(s);
    assert!(o.success, "server exits cleanly on SIGTERM: {o:?}");
    assert!(o.stderr.contains("0 errors, 0 corrupt"), "{o:?}");
    // Neither the clients nor the server left a same-host registry entry or ring behind
    // (their LNet buffers' cached registrations outlive the driver's shutdown).
    assert_eq!(lnd_tests::same_host_leftovers(port), Vec::<String>::new());
}

/// `check=none` brw RPCs are served in the LND's event callbacks on both sides (no data to
/// check): every RPC must still be answered, counted, and leave nothing behind.
#[test]
fn brw_without_checking_is_served_in_the_callbacks() {
    let port = unique_port(3);
    let s = server(port);
    for row in brw_both_ways(port, "1M", "8", "400", "none") {
        assert_eq!((row[2].as_str(), row[10].as_str()), ("1M", "0"), "no errors: {row:?}");
    }
    let o = stop(s);
    assert!(o.success, "server exits cleanly on SIGTERM: {o:?}");
    // 800 measured brw RPCs, each run's warm-up (100 ms of the same RPCs) and the clients'
    // STATS requests (two per run): every one answered, none failed.
    let served: u64 = o
        .stderr
        .split("lnd-bench server: ")
        .nth(1)
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(served > 804, "{o:?}");
    assert!(o.stderr.contains(&format!("lnd-bench server: {served} RPCs, 0 errors, 0 corrupt")), "{o:?}");
    assert_eq!(lnd_tests::same_host_leftovers(port), Vec::<String>::new());
}

/// The server's request buffers take many requests each (LNet's `MAX_SIZE`) and are posted
/// again only when full and every request in them is read. 5000 4 KiB pings (answered in the
/// callback) fill all of them several times over while a second client's fully checked brw
/// RPCs (read on the server thread) land in the same buffers: every RPC is answered, none lost.
#[test]
fn request_buffers_fill_and_are_posted_again_under_mixed_requests() {
    let port = unique_port(5);
    let s = server(port);
    let p = port.to_string();
    let common = |nid: &'static str| ["--nid", nid, "--to", "127.0.0.1@o2ib", "--port"];
    let mut ping_args = vec!["ping", "--size", "4K", "--count", "5000", "--concurrency", "4"];
    ping_args.extend(common("127.0.0.2@o2ib"));
    ping_args.push(&p);
    let mut brw_args = vec![
        "brw",
        "--op",
        "write",
        "--size",
        "64K",
        "--concurrency",
        "4",
        "--count",
        "600",
        "--check",
        "full",
    ];
    brw_args.extend(common("127.0.0.3@o2ib"));
    brw_args.push(&p);
    let (ping, brw) = (spawn(BIN, &ping_args), spawn(BIN, &brw_args));
    let (ping, brw) = (ping.wait(Duration::from_secs(120)), brw.wait(Duration::from_secs(120)));
    assert!(ping.success, "{ping:?}");
    assert!(brw.success, "{brw:?}");
    // ping size conc MiB/s RPC/s p50 p99 p99.9 max errors ...; brw's test name is two words.
    assert_eq!(data_row(&ping.stdout, "ping")[9], "0", "no ping errors: {ping:?}");
    assert_eq!(data_row(&brw.stdout, "brw write")[10], "0", "no brw errors: {brw:?}");
    let o = stop(s);
    assert!(o.success, "server exits cleanly on SIGTERM: {o:?}");
    assert!(o.stderr.contains(" 0 errors, 0 corrupt"), "{o:?}");
}

#[test]
fn a_killed_server_makes_the_client_fail_with_a_clear_error() {
    let port = unique_port(1);
    let s = server(port);
    let c = spawn(
        BIN,
        &[
            "brw",
            "--op",
            "write",
            "--size",
            "1M",
            "--concurrency",
            "4",
            "--duration",
            "60",
            "--timeout",
            "5",
            "--nid",
            "127.0.0.2@o2ib",
            "--to",
            "127.0.0.1@o2ib",
            "--port",
            &port.to_string(),
        ],
    );
    // Let traffic flow, then kill the server without warning.
    assert!(c.try_wait_for(Duration::from_secs(2)).is_none(), "the client is running");
    s.signal(libc::SIGKILL);
    let _ = s.wait(Duration::from_secs(5));
    let o = c.wait(Duration::from_secs(60));
    assert!(!o.timed_out, "the client does not hang: {o:?}");
    assert!(!o.success, "{o:?}");
    let last = o.stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("lnd-bench: "), "one clear error line: {o:?}");
}

#[test]
fn bad_arguments_give_one_line_and_exit_2() {
    for args in [
        &["brw", "--to", "bogus", "--op", "write"][..],
        &["brw", "--to", "127.0.0.1@o2ib", "--op", "sideways"],
        &["brw", "--to", "127.0.0.1@o2ib", "--op", "read", "--size", "lots"],
        &["ping", "--to", "127.0.0.1@o2ib", "--duration", "1", "--count", "2"],
        &["frobnicate"],
    ] {
        let o = spawn(BIN, args).wait(Duration::from_secs(20));
        assert_eq!(o.code, Some(2), "{args:?}: {o:?}");
        assert_eq!(o.stderr.trim().lines().count(), 1, "{args:?}: {o:?}");
        assert!(o.stderr.starts_with("lnd-bench: "), "{args:?}: {o:?}");
    }
    // A size out of range is refused with the arguments, quoted as typed.
    let o = spawn(BIN, &["ping", "--to", "127.0.0.1@o2ib", "--size", "5000"]).wait(Duration::from_secs(20));
    assert_eq!(o.code, Some(2), "{o:?}");
    assert!(o.stderr.contains("invalid value '5000' for '--size <SIZE>': must be 0 to 4K"), "{o:?}");
    let o = spawn(BIN, &["brw", "--to", "127.0.0.1@o2ib", "--op", "read", "--size", "5G"])
        .wait(Duration::from_secs(20));
    assert_eq!(o.code, Some(2), "{o:?}");
    assert!(o.stderr.contains("invalid value '5G' for '--size <SIZE>': must be 1 to 16M"), "{o:?}");
    // No command at all: one line naming the commands (it was the tool's description).
    let o = spawn(BIN, &[]).wait(Duration::from_secs(20));
    assert_eq!(o.code, Some(2), "{o:?}");
    assert_eq!(o.stderr.trim().lines().count(), 1, "{o:?}");
    assert!(o.stderr.starts_with("lnd-bench: no command given: one of server, brw, ping, local"), "{o:?}");
    // The line names what is wrong: the missing argument, the value out of range.
    let o = spawn(BIN, &["brw", "--to", "127.0.0.1@o2ib"]).wait(Duration::from_secs(20));
    assert_eq!(o.code, Some(2), "{o:?}");
    assert!(o.stderr.contains("not provided: --op <OP>"), "{o:?}");
    for cmd in [
        &["brw", "--to", "127.0.0.1@o2ib", "--op", "write"][..],
        &["ping", "--to", "127.0.0.1@o2ib"],
        &["local"],
    ] {
        let mut args = cmd.to_vec();
        args.extend(["--concurrency", "0"]);
        let o = spawn(BIN, &args).wait(Duration::from_secs(20));
        assert_eq!(o.code, Some(2), "{args:?}: {o:?}");
        assert!(o.stderr.contains("'--concurrency <CONCURRENCY>': must be at least 1"), "{args:?}: {o:?}");
    }
    // Seconds that are not a positive finite number (they panicked in Duration::from_secs_f64).
    for args in [
        &["ping", "--to", "127.0.0.1@o2ib", "--duration=-1"][..],
        &["ping", "--to", "127.0.0.1@o2ib", "--duration", "nan"],
        &["brw", "--to", "127.0.0.1@o2ib", "--op", "read", "--timeout", "0"],
        &["local", "--duration", "inf"],
        &["compare", "--duration=-0.5"],
        &["fabric-ping", "--duration", "NaN"],
    ] {
        let o = spawn(BIN, args).wait(Duration::from_secs(20));
        assert_eq!(o.code, Some(2), "{args:?}: {o:?}");
        assert!(o.stderr.contains("is not a number of seconds above 0"), "{args:?}: {o:?}");
    }
}

#[test]
fn more_buffers_than_half_the_memory_are_refused_before_anything_starts() {
    // 100,000 RPCs in flight: 1.5 TiB on each side at 16 MiB, 98 GiB at `local`'s 1 MiB.
    for args in [
        &["brw", "--to", "127.0.0.1@o2ib", "--op", "write", "--size", "16M", "--concurrency", "100000"][..],
        &["local", "--concurrency", "100000"],
    ] {
        let o = spawn(BIN, args).wait(Duration::from_secs(20));
        assert_eq!(o.code, Some(1), "{args:?}: {o:?}");
        assert!(
            o.stderr.contains("of buffers on each side, more than half of this host's"),
            "{args:?}: {o:?}"
        );
    }
}

#[test]
fn a_client_aimed_at_its_own_nid_is_refused_at_once() {
    // LNet would keep the request inside the client's process, where no server answers.
    for cmd in ["ping", "brw"] {
        let mut args = vec![cmd, "--to", "127.0.0.1@o2ib", "--nid", "127.0.0.1@o2ib", "--count", "1"];
        if cmd == "brw" {
            args.extend(["--op", "read"]);
        }
        let o = spawn(BIN, &args).wait(Duration::from_secs(20));
        assert_eq!(o.code, Some(1), "{o:?}");
        assert_eq!(o.stderr.trim().lines().count(), 1, "{o:?}");
        assert!(
            o.stderr.contains("is this client's own NID") && o.stderr.contains("127.0.0.2@o2ib"),
            "{o:?}"
        );
    }
}

#[test]
fn a_bad_tunables_file_names_file_line_and_key() {
    let dir = std::env::temp_dir().join(format!("lnd-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.conf");
    std::fs::write(&path, "# comment\noptions ko2iblnd peer_credit=32\n").unwrap();
    let p = path.to_string_lossy().into_owned();
    let o =
        spawn(BIN, &["server", "--nid", "127.0.0.1@o2ib", "--tunables", &p]).wait(Duration::from_secs(20));
    assert_eq!(o.code, Some(1), "{o:?}");
    let err = o.stderr.trim();
    assert_eq!(err.lines().count(), 1, "{o:?}");
    assert!(
        err.contains("bad.conf:2")
            && err.contains("peer_credit")
            && err.contains("did you mean 'peer_credits'"),
        "{err}"
    );
    let missing =
        spawn(BIN, &["server", "--nid", "127.0.0.1@o2ib", "--tunables", "/nonexistent/ko2iblnd.conf"])
            .wait(Duration::from_secs(20));
    assert_eq!(missing.code, Some(1), "{missing:?}");
    assert!(missing.stderr.contains("/nonexistent/ko2iblnd.conf"), "{missing:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `local` checks its tunables file before starting its server: a bad one is one line and no
/// process starts; a file with warnings has each printed once, not by the server and the
/// client each.
#[test]
fn local_checks_its_tunables_once_before_starting() {
    let dir = std::env::temp_dir().join(format!("lnd-bench-local-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (bad, warn) = (dir.join("bad.conf"), dir.join("warn.conf"));
    std::fs::write(&bad, "options ko2iblnd peer_credit=32\n").unwrap();
    let text = "options ko2iblnd credits=64 peer_credits=128\noptions lnet networks=\"tcp0(eth0)\"\n";
    std::fs::write(&warn, text).unwrap();
    let port = unique_port(7).to_string();
    let run = |conf: &std::path::Path| {
        let c = conf.to_string_lossy().into_owned();
        spawn(BIN, &["local", "--tunables", &c, "--port", &port, "--duration", "0.05", "--json"])
            .wait(Duration::from_secs(120))
    };
    let o = run(&bad);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert_eq!(o.stderr.trim().lines().count(), 1, "{o:?}");
    assert!(o.stderr.contains("bad.conf:1") && o.stderr.contains("peer_credit"), "{o:?}");
    let o = run(&warn);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.success, "{o:?}");
    let warnings: Vec<&str> = o.stderr.lines().filter(|l| l.contains("warning:")).collect();
    // The clamp, and the networks line that leaves out the server's and the client's network.
    assert_eq!(warnings.len(), 3, "{o:?}");
    assert!(warnings[0].contains("warn.conf:1: peer_credits=128 lowered to 64"), "{o:?}");
    for nid in ["127.0.0.1@o2ib", "127.0.0.2@o2ib"] {
        let w = format!("does not include o2ib0 (the network of {nid})");
        assert!(warnings.iter().any(|l| l.contains(&w)), "{w}: {o:?}");
    }
}

#[test]
fn a_fabric_port_already_taken_or_an_address_not_of_this_host_says_what_to_do() {
    let port = unique_port(2);
    // Whatever holds the port, the LND cannot bind its RoCEv2 socket there.
    let _holder = std::net::UdpSocket::bind(("127.0.0.1", port)).unwrap();
    let p = port.to_string();
    let server =
        spawn(BIN, &["server", "--nid", "127.0.0.1@o2ib", "--port", &p]).wait(Duration::from_secs(20));
    assert_eq!(server.code, Some(1), "{server:?}");
    let err = server.stderr.trim();
    assert_eq!(err.lines().count(), 1, "{server:?}");
    assert!(
        err.contains(&format!("127.0.0.1:{port}"))
            && err.contains("Address already in use")
            && err.contains("another --port"),
        "{err}"
    );
    // `local` starts that server as a child and says how it ended, at once.
    let local = spawn(BIN, &["local", "--port", &p, "--duration", "0.2"]).wait(Duration::from_secs(20));
    assert_eq!(local.code, Some(1), "{local:?}");
    assert!(local.stderr.contains("another --port"), "{local:?}");
    assert!(
        local.stderr.contains("the server process exited (exit status: 1) before it was ready"),
        "{local:?}"
    );
    // fabric-ping binds the device alone on 127.0.0.1 and 127.0.0.2: the same advice.
    let fp = spawn(BIN, &["fabric-ping", "--port", &p, "--duration", "0.2"]).wait(Duration::from_secs(20));
    assert_eq!(fp.code, Some(1), "{fp:?}");
    assert!(
        fp.stderr.contains(&format!("127.0.0.1:{port}")) && fp.stderr.contains("another --port"),
        "{fp:?}"
    );
    // A NID whose address this host does not have (TEST-NET-1, never local).
    let o = spawn(BIN, &["server", "--nid", "192.0.2.1@o2ib", "--port", &p]).wait(Duration::from_secs(20));
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(o.stderr.contains("192.0.2.1 is not an address of this host"), "{o:?}");
}

/// A server that refuses the client (its `accept_nids` leaves the client out) is running: the
/// client's error says the peer refused it, and does not ask whether the server runs.
#[test]
fn a_client_the_server_refuses_is_told_so() {
    let port = unique_port(4);
    let dir = std::env::temp_dir().join(format!("lnd-bench-refuse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("only-9.conf");
    std::fs::write(&path, "options ko2iblnd accept_nids=127.0.0.9@o2ib\n").unwrap();
    let p = path.to_string_lossy().into_owned();
    let s = spawn(BIN, &["server", "--nid", "127.0.0.1@o2ib", "--port", &port.to_string(), "--tunables", &p]);
    let o = client(port, &["ping", "--count", "1", "--timeout", "20"]);
    let _ = stop(s);
    let _ = std::fs::remove_dir_all(dir);
    assert!(!o.timed_out && !o.success, "{o:?}");
    let last = o.stderr.trim().lines().last().unwrap_or_default().to_owned();
    assert!(last.contains("ECONNREFUSED") && last.contains("refused the connection"), "{o:?}");
    assert!(!last.contains("running?"), "{o:?}");
}

#[test]
fn an_unreachable_peer_fails_in_bounded_time() {
    let port = unique_port(2);
    let o = spawn(
        BIN,
        &[
            "ping",
            "--nid",
            "127.0.0.2@o2ib",
            "--to",
            "127.0.0.9@o2ib",
            "--count",
            "1",
            "--timeout",
            "20",
            "--port",
            &port.to_string(),
        ],
    )
    .wait(Duration::from_secs(60));
    assert!(!o.timed_out && !o.success, "{o:?}");
    assert!(o.stderr.trim().lines().last().unwrap_or_default().starts_with("lnd-bench: "), "{o:?}");
}

/// The line a fabric command printed that starts with `prefix`, split into words; it exited 0.
fn fabric_words(o: &lnd_tests::Outcome, prefix: &str) -> Vec<String> {
    assert_eq!(o.code, Some(0), "{o:?}");
    let line = o.stdout.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{o:?}"));
    line.split_whitespace().map(str::to_owned).collect()
}

/// `fabric-ping` (two processes) and `fabric-turns` (both devices in one process, driven in
/// turn) on the same port, one after the other (the port is this test's): every echo is
/// verified; in the turns each ACK rides on the next SEND (one frame per round trip from the
/// pinger), and once the rings are open every frame goes through them.
#[test]
fn fabric_ping_and_fabric_turns_echo_verified_sends() {
    for size in ["8", "4K"] {
        let port = unique_port(6).to_string();
        let o = spawn(BIN, &["fabric-ping", "--size", size, "--duration", "0.2", "--port", &port])
            .wait(Duration::from_secs(120));
        let words = fabric_words(&o, "fabric ping ");
        let line = words.join(" ");
        let trips: u64 = words[4].parse().unwrap_or_else(|_| panic!("{line}"));
        let p50: f64 = words[8].parse().unwrap_or_else(|_| panic!("{line}"));
        assert!(trips > 0 && p50 > 0.0, "{line}");
        assert!(line.contains(if size == "8" { "ping 8 B:" } else { "ping 4096 B:" }), "{line}");

        let o = spawn(BIN, &["fabric-turns", "--size", size, "--count", "2000", "--port", &port])
            .wait(Duration::from_secs(120));
        let words = fabric_words(&o, "fabric turns ");
        let line = words.join(" ");
        assert_eq!(words[4], "2000", "{line}");
        let ns: f64 = words[7].parse().unwrap_or_else(|_| panic!("{line}"));
        assert!(ns > 0.0, "{line}");
        assert!(line.contains(", 1.00 frames sent per round trip, 2.00 through rings"), "{line}");
    }
    let o = spawn(BIN, &["fabric-ping", "--size", "4"]).wait(Duration::from_secs(20));
    assert_eq!(o.code, Some(2), "{o:?}");
    assert!(
        o.stderr.starts_with("lnd-bench: invalid value '4' for '--size <SIZE>': must be 8 to 4K"),
        "{o:?}"
    );
    let o = spawn(BIN, &["fabric-turns", "--count", "0"]).wait(Duration::from_secs(20));
    assert_eq!(o.code, Some(2), "{o:?}");
    assert!(o.stderr.contains("'--count <COUNT>': must be at least 1"), "{o:?}");
}

#[test]
fn line_ping_reports_the_cache_line_floor() {
    let o = spawn(BIN, &["line-ping", "--duration", "0.2"]).wait(Duration::from_secs(60));
    assert_eq!(o.code, Some(0), "{o:?}");
    let line = o.stdout.lines().find(|l| l.starts_with("line ping: ")).unwrap_or_else(|| panic!("{o:?}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let trips: u64 = words[2].parse().unwrap_or_else(|_| panic!("{line}"));
    let p50: f64 = words[6].parse().unwrap_or_else(|_| panic!("{line}"));
    let p99: f64 = words[9].parse().unwrap_or_else(|_| panic!("{line}"));
    // Whole batches of 64, after a warm-up.
    assert!(trips > 0 && trips % 64 == 0, "{line}");
    assert!(p50 > 0.0 && p99 >= p50, "{line}");
}

#[test]
fn a_line_pong_that_is_never_stopped_gives_up_at_its_deadline() {
    // A page as the pong's standard input, as `line-ping` passes it a memfd.
    let path = std::env::temp_dir().join(format!("lnd-line-pong-{}", std::process::id()));
    std::fs::write(&path, vec![0u8; 4096]).expect("page file");
    let page = std::fs::File::options().read(true).write(true).open(&path).expect("page file");
    let pong = |stdin: std::process::Stdio| {
        let child = std::process::Command::new(BIN)
            .args(["line-pong", "--seconds", "0.3"])
            .stdin(stdin)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("line-pong runs");
        // A bounded wait: the pong must leave by itself.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(child.wait_with_output()));
        rx.recv_timeout(Duration::from_secs(30)).expect("line-pong left by its deadline").expect("output")
    };
    let o = pong(page.into());
    let bytes = std::fs::read(&path).expect("page file");
    let _ = std::fs::remove_file(&path);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("line-pong: not told to stop within 0.3 s"), "{o:?}");
    // It said it was ready (u64::MAX - 1 in its line, 128 bytes in).
    assert_eq!(bytes[128..136], (u64::MAX - 1).to_ne_bytes(), "the pong's line");
    // Without a page it fails at once, clearly.
    let o = pong(std::process::Stdio::null());
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot map the shared page"), "{o:?}");
}
