//! The example storage server (`lnd-objstore`) with several clients, each in its own process,
//! over the software fabric on 127.0.0.x: every object verified by the clients, and a client
//! killed (SIGKILL) mid-transfer while others complete.
//!
//! The binary under test is built by this package from the very source of `lnd-bench`'s
//! `lnd-objstore` (see the `[[bin]]` entry in Cargo.toml): `CARGO_BIN_EXE_<name>` is only
//! defined for a package's own binaries, and on stable Cargo a dependency cannot provide its
//! binary's path (artifact dependencies are unstable), while looking in `target/` could run a
//! stale build.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lnd_tests::{Outcome, spawn, unique_port};

const BIN: &str = env!("CARGO_BIN_EXE_objstore-under-test");

/// A child whose stdout is read line by line while it runs.
struct LineChild {
    pid: u32,
    lines: Receiver<String>,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    exit: Receiver<Option<ExitStatus>>,
}

impl LineChild {
    fn spawn(args: &[String]) -> LineChild {
        let mut child = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        let pid = child.id();
        let (tx, lines) = mpsc::channel();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let (o2, e2) = (stdout.clone(), stderr.clone());
        let readers = std::thread::spawn(move || {
            let e = std::thread::spawn(move || {
                let mut s = String::new();
                let _ = BufReader::new(err).read_to_string(&mut s);
                e2.lock().unwrap().push_str(&s);
            });
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                o2.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
            let _ = e.join();
        });
        let (etx, exit) = mpsc::channel();
        std::thread::spawn(move || {
            let status = child.wait().ok();
            let _ = readers.join();
            let _ = etx.send(status);
        });
        LineChild { pid, lines, stdout, stderr, exit }
    }

    /// Waits for a stdout line containing `needle`, at most `gap` between lines.
    fn wait_for(&self, needle: &str, gap: Duration) -> bool {
        while let Ok(line) = self.lines.recv_timeout(gap) {
            if line.contains(needle) {
                return true;
            }
        }
        false
    }

    fn kill(&self) {
        let pid = libc::pid_t::try_from(self.pid).unwrap_or(0);
        if pid > 0 {
            // SAFETY: kill(2) takes plain integers; a stale pid at worst signals nothing.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pid).unwrap_or(0);
        if pid > 0 {
            // SAFETY: as in `kill`.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// Waits for the exit (killing the child after `timeout`).
    fn wait(self, timeout: Duration) -> Outcome {
        let status = match self.exit.recv_timeout(timeout) {
            Ok(s) => (s, false),
            Err(_) => {
                self.kill();
                (self.exit.recv_timeout(Duration::from_secs(10)).ok().flatten(), true)
            }
        };
        Outcome {
            success: status.0.is_some_and(|s| s.success()),
            code: status.0.and_then(|s| s.code()),
            stdout: self.stdout.lock().unwrap().join("\n"),
            stderr: self.stderr.lock().unwrap().clone(),
            timed_out: status.1,
        }
    }
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// A fresh directory for one test's objects.
fn object_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lnd-objstore-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn start_server(dir: &Path, port: u16, max_clients: u32, extra: &[&str]) -> LineChild {
    let mut a = args(&[
        "server",
        "--nid",
        "127.0.0.1@o2ib",
        "--dir",
        dir.to_str().unwrap(),
        "--port",
        &port.to_string(),
        "--max-clients",
        &max_clients.to_string(),
        "--exit-after",
        "240",
    ]);
    a.extend(args(extra));
    let server = LineChild::spawn(&a);
    assert!(server.wait_for("ready", Duration::from_secs(60)), "server never became ready");
    server
}

fn client_args(addr: &str, port: u16, objects: u32, size: &str) -> Vec<String> {
    args(&[
        "client",
        "--nid",
        &format!("{addr}@o2ib"),
        "--server",
        "127.0.0.1@o2ib",
        "--objects",
        &objects.to_string(),
        "--size",
        size,
        "--port",
        &port.to_string(),
    ])
}

fn run_client(a: &[String]) -> lnd_tests::Running {
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    spawn(BIN, &refs)
}

#[test]
fn server_and_four_clients_in_separate_processes_every_object_verified() {
    let port = unique_port(0);
    let dir = object_dir("four");
    let server = start_server(&dir, port, 4, &[]);
    // IMMEDIATE-sized, unaligned, and RDMA-sized objects, one shape per client.
    let shapes = [
        ("127.0.0.2", 8, "1M"),
        ("127.0.0.3", 20, "3000"),
        ("127.0.0.4", 10, "65537"),
        ("127.0.0.5", 8, "300K"),
    ];
    let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/ko2iblnd.conf");
    let clients: Vec<_> = shapes
        .iter()
        .map(|(addr, n, size)| {
            let mut a = client_args(addr, port, *n, size);
            if *addr == "127.0.0.3" {
                // A bare address on the network of the shipped conf's networks="o2ib0(lo)".
                a[2] = (*addr).to_owned();
                a.extend(args(&["--tunables", conf]));
            }
            run_client(&a)
        })
        .collect();
    for (c, (addr, n, _)) in clients.into_iter().zip(shapes) {
        let o = c.wait(Duration::from_secs(180));
        assert!(o.success, "client {addr}: {o:?}");
        assert!(o.stdout.contains(&format!("wrote and read back {n} objects")), "client {addr}: {o:?}");
        assert!(o.stdout.contains("all verified"), "client {addr}: {o:?}");
        println!("{}", o.stdout.trim());
    }
    let s = server.wait(Duration::from_secs(60));
    assert!(s.success, "server: {s:?}");
    assert!(s.stdout.contains("stopped (max clients): 4 clients, 46 writes, 46 reads"), "server: {s:?}");
    assert!(s.stdout.contains(" 0 failed, 0 aborted"), "server: {s:?}");
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files, 46, "one file per object");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn server_survives_a_client_killed_mid_transfer() {
    let port = unique_port(1);
    let dir = object_dir("kill");
    // A short LND timeout: a transfer the dead client will never finish (its GET_DONE or
    // PUT_DONE never comes, while the connection looks idle) fails after 3 s, as o2iblnd's
    // "Timed out tx" would after `timeout` seconds.
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("ko2iblnd.conf");
    std::fs::write(&conf, "options lnet networks=\"o2ib0(lo)\"\noptions ko2iblnd timeout=3\n").unwrap();
    let server = start_server(&dir, port, 2, &["--tunables", conf.to_str().unwrap()]);
    let mut victim_args = client_args("127.0.0.2", port, 200, "1M");
    victim_args.extend(args(&["--progress", "--concurrency", "4"]));
    let victim = LineChild::spawn(&victim_args);
    let survivor = run_client(&client_args("127.0.0.3", port, 12, "256K"));
    // Kill the victim once a few of its RPCs are done and more are in flight.
    assert!(victim.wait_for("progress 3/", Duration::from_secs(60)), "victim made no progress");
    victim.kill();
    let v = victim.wait(Duration::from_secs(30));
    assert!(!v.success && v.code.is_none(), "victim should die by the signal: {v:?}");
    let o = survivor.wait(Duration::from_secs(180));
    assert!(o.success && o.stdout.contains("all verified"), "survivor: {o:?}");
    // The server still serves new clients after the kill.
    let late = run_client(&client_args("127.0.0.4", port, 5, "100K")).wait(Duration::from_secs(180));
    assert!(late.success && late.stdout.contains("all verified"), "late client: {late:?}");
    let s = server.wait(Duration::from_secs(60));
    assert!(s.success, "server: {s:?}");
    assert!(s.stdout.contains("stopped (max clients): 3 clients"), "server: {s:?}");
    // The victim's operations in flight at the kill failed (reported, not fatal) within the
    // LND timeout, so none was left to abort at the exit.
    assert!(s.stdout.contains(" 0 aborted"), "server: {s:?}");
    println!("{}", s.stdout.trim());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn server_stops_cleanly_on_sigterm_and_bad_arguments_are_one_line_errors() {
    let port = unique_port(2);
    let dir = object_dir("sigterm");
    let server = start_server(&dir, port, 100, &[]);
    server.signal(libc::SIGTERM);
    let s = server.wait(Duration::from_secs(30));
    assert!(s.success, "server: {s:?}");
    assert!(s.stdout.contains("stopped (signal): 0 clients"), "server: {s:?}");
    let _ = std::fs::remove_dir_all(&dir);

    for (bad, expect) in [
        (client_args("127.0.0.2", port, 1, "0"), "size '0'"),
        (client_args("127.0.0.2x", port, 1, "1K"), "bad NID '127.0.0.2x@o2ib'"),
        (args(&["server", "--nid", "1.2.3.4@ib", "--dir", "/tmp"]), "unknown network type"),
        (
            args(&["client", "--nid", "127.0.0.2", "--server", "x", "--objects", "1", "--size", "1"]),
            "bad NID 'x'",
        ),
    ] {
        let o = run_client(&bad).wait(Duration::from_secs(30));
        assert!(!o.success && o.code.is_some(), "{bad:?}: {o:?}");
        assert!(o.stderr.contains(expect), "{bad:?}: {o:?}");
        assert!(!o.stderr.contains("panicked"), "{bad:?}: {o:?}");
    }
}
