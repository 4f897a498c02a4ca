//! Process faults over real UDP on loopback: a server killed with SIGKILL mid-transfer and
//! restarted, a client killed while another is served, a server paused (SIGSTOP) past the LND
//! timeout and resumed. Each client re-posts what failed (`lnd-node drive --retry 1`): every
//! failure is reported exactly once (the client exits with an error on a second completion),
//! the client reconnects and finishes, and every process ends with nothing left on its device.
//!
//! Waits are bounded: the harness reads each child's stdout line by line and the tests wait for
//! the line they need with a deadline; no sleeps.

use std::time::Duration;

use lnd_tests::{Running, spawn, unique_port};

const BIN: &str = env!("CARGO_BIN_EXE_lnd-node");
/// Generous: two cores shared with other builds.
const LINE_WAIT: Duration = Duration::from_secs(60);
const NO_LEAKS: &str = "live after shutdown: qps 0 mrs 0 cqs 0 pds 0";

/// A tunables file with a small LND timeout, so faults are detected in seconds.
fn tunables_file(name: &str) -> String {
    let path = std::env::temp_dir().join(format!("lnd-faults-{}-{name}.conf", std::process::id()));
    std::fs::write(&path, "options ko2iblnd timeout=3 keepalive=1\n").unwrap();
    path.display().to_string()
}

fn server(port: &str, conf: &str) -> Running {
    let s = spawn(
        BIN,
        &[
            "serve",
            "--nid",
            "127.0.0.2@o2ib",
            "--port",
            port,
            "--tunables",
            conf,
            "--keep-going",
            "1",
            "--deadline-secs",
            "60",
        ],
    );
    assert!(s.wait_for_line("serving on", LINE_WAIT).is_some(), "the server starts");
    s
}

fn client(ip: &str, port: &str, conf: &str, count: u64, size: usize) -> Running {
    let (count, size) = (count.to_string(), size.to_string());
    spawn(
        BIN,
        &[
            "drive",
            "--nid",
            ip,
            "--to",
            "127.0.0.2@o2ib",
            "--port",
            port,
            "--tunables",
            conf,
            "--op",
            "put",
            "--size",
            &size,
            "--count",
            &count,
            "--window",
            "8",
            "--retry",
            "1",
            "--bye",
            "1",
        ],
    )
}

fn errors_reported(stdout: &str) -> usize {
    stdout.lines().filter(|l| l.starts_with("error:")).count()
}

/// After the fault and the retries: the client held no descriptor before its shutdown, and
/// neither process left anything on its software device.
fn assert_client_and_server_clean(co: &lnd_tests::Outcome, so: &lnd_tests::Outcome) {
    assert!(co.stdout.contains(&format!("client {NO_LEAKS}")), "{co:?}");
    assert!(co.stdout.contains(" descriptors 0/"), "{co:?}");
    assert!(so.stdout.contains(&format!("server {NO_LEAKS}")), "{so:?}");
}

#[test]
fn a_server_killed_mid_transfer_and_restarted_is_reconnected_and_every_put_lands() {
    let port = unique_port(0).to_string();
    let conf = tunables_file("kill-server");
    let first = server(&port, &conf);
    let c = client("127.0.0.1@o2ib", &port, &conf, 200, 256 << 10);
    assert!(c.wait_for_line("progress 20", LINE_WAIT).is_some(), "traffic flows");
    first.signal(libc::SIGKILL);
    let killed = first.wait(Duration::from_secs(10));
    assert!(!killed.success, "{killed:?}");
    assert!(c.wait_for_line("error:", LINE_WAIT).is_some(), "the client reports the failure");
    let second = server(&port, &conf);
    let co = c.wait(Duration::from_secs(180));
    let so = second.wait(Duration::from_secs(if co.timed_out { 1 } else { 90 }));
    assert!(co.success, "client {co:?}\nserver {so:?}");
    assert!(so.success, "server {so:?}");
    let errors = errors_reported(&co.stdout);
    println!("kill -9 server mid-transfer, restart: {errors} errors reported, then 200 PUTs done");
    assert!(co.stdout.contains("progress 200"), "{co:?}");
    assert!(errors >= 1, "{co:?}");
    assert_client_and_server_clean(&co, &so);
}

#[test]
fn a_killed_client_leaves_the_server_serving_another() {
    let port = unique_port(1).to_string();
    let conf = tunables_file("kill-client");
    let s = server(&port, &conf);
    let victim = client("127.0.0.1@o2ib", &port, &conf, 1_000_000, 256 << 10);
    assert!(victim.wait_for_line("progress 20", LINE_WAIT).is_some(), "the victim's traffic flows");
    victim.signal(libc::SIGKILL);
    let _ = victim.wait(Duration::from_secs(10));
    let other = client("127.0.0.3@o2ib", &port, &conf, 100, 256 << 10);
    let oo = other.wait(Duration::from_secs(120));
    let so = s.wait(Duration::from_secs(if oo.timed_out { 1 } else { 90 }));
    assert!(oo.success, "other client {oo:?}\nserver {so:?}");
    assert!(so.success, "server {so:?}");
    assert_eq!(errors_reported(&oo.stdout), 0, "{oo:?}");
    assert!(oo.stdout.contains(&format!("client {NO_LEAKS}")), "{oo:?}");
    assert!(so.stdout.contains(&format!("server {NO_LEAKS}")), "{so:?}");
    println!("kill -9 client: the other client moved 100 x 256 KiB with no error");
}

#[test]
fn a_server_paused_past_the_timeout_then_resumed_is_reconnected_and_traffic_resumes() {
    let port = unique_port(2).to_string();
    let conf = tunables_file("pause");
    let s = server(&port, &conf);
    let c = client("127.0.0.1@o2ib", &port, &conf, 300, 64 << 10);
    assert!(c.wait_for_line("progress 20", LINE_WAIT).is_some(), "traffic flows");
    s.signal(libc::SIGSTOP);
    // The client's transmits time out (timeout=3) while the server is stopped.
    let first_error = c.wait_for_line("error:", LINE_WAIT);
    // Keep it stopped past the LND timeout (3 s): the pause itself is the fault, so this is
    // a fixed duration, not a wait for a condition.
    let _ = c.wait_for_line("a line no client prints", Duration::from_secs(4));
    s.signal(libc::SIGCONT);
    assert!(first_error.is_some(), "the client reports the stall");
    let co = c.wait(Duration::from_secs(180));
    let so = s.wait(Duration::from_secs(if co.timed_out { 1 } else { 30 }));
    assert!(co.success, "client {co:?}\nserver {so:?}");
    assert!(so.success, "server {so:?}");
    let errors = errors_reported(&co.stdout);
    // On the single-copy path, requests the server executed after the client had given up
    // on them are dropped as stale (never a reused buffer copied as their data).
    let stale = lnd_tests::counter(&so.stdout, "placed_stale").unwrap_or(0);
    println!(
        "SIGSTOP server past the timeout, SIGCONT: {errors} errors reported, {stale} stale placements \
         dropped, then 300 PUTs done"
    );
    assert!(co.stdout.contains("progress 300"), "{co:?}");
    assert_client_and_server_clean(&co, &so);
}

#[test]
fn two_processes_under_5_percent_injected_loss_and_corruption_verify_every_byte() {
    let port = unique_port(3).to_string();
    let conf = tunables_file("loss");
    let s = spawn(
        BIN,
        &[
            "serve",
            "--nid",
            "127.0.0.2@o2ib",
            "--port",
            &port,
            "--tunables",
            &conf,
            "--keep-going",
            "1",
            "--loss",
            "0.05",
        ],
    );
    assert!(s.wait_for_line("serving on", LINE_WAIT).is_some(), "the server starts");
    let drive = |op: &str| {
        spawn(
            BIN,
            &[
                &lnd_tests::DRIVE_FROM_1_TO_2[..],
                &[
                    "--port",
                    &port,
                    "--tunables",
                    &conf,
                    "--op",
                    op,
                    "--size",
                    "262144",
                    "--count",
                    "64",
                    "--window",
                    "8",
                    "--loss",
                    "0.05",
                    "--bye",
                    if op == "get" { "1" } else { "0" },
                ],
            ]
            .concat(),
        )
        .wait(Duration::from_secs(180))
    };
    let put = drive("put");
    let get = drive("get");
    let so = s.wait(Duration::from_secs(if get.timed_out { 1 } else { 30 }));
    assert!(put.success && get.success, "put {put:?}\nget {get:?}\nserver {so:?}");
    // The clients verified every GET; the server verified every PUT. A GET source may end with
    // ECONNABORTED at the server when the client, having its data, disconnects before the
    // GET_DONE's acknowledgement survives the loss: the server cannot know it arrived.
    assert!(so.success && so.stdout.contains("verified 64 PUTs"), "{so:?}");
    assert!(so.stdout.contains(&format!("server {NO_LEAKS}")), "{so:?}");
    let stats = so.stdout.lines().find(|l| l.starts_with("server stats")).unwrap_or_default().to_owned();
    println!("5% loss over UDP: 64 PUTs + 64 GETs of 256 KiB verified; {stats}");
    assert!(!stats.contains("retransmits 0 "), "faults were injected: {stats}");
}
