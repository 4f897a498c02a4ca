//! `lnd-bench local`: the embedded default run.
//!
//! Starts `lnd-bench server` as a child process on 127.0.0.1@o2ib, runs the client here on
//! 127.0.0.2@o2ib over the software fabric with the tunables (by default the built-in
//! conf/ko2iblnd.conf), measures brw write and read at 4K, 64K and 1M and ping, prints the
//! table, and succeeds only if every RPC completed and every byte verified (`check=full`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lnet_shim::nid::{Nid, ProcessId};

use crate::client::RunSpec;
use crate::node::{Fabric, Node, NodeOptions};
use crate::proto::{Check, Op};
use crate::report::{self, Row};

/// Options of `lnd-bench local`.
#[derive(clap::Args, Clone)]
pub struct LocalArgs {
    /// ko2iblnd tunables file; default: the built-in conf/ko2iblnd.conf.
    #[arg(long, value_name = "FILE")]
    pub tunables: Option<String>,
    /// Fabric (the default software device, or verbs with the feature).
    #[arg(long, value_enum, default_value_t = Fabric::Soft)]
    pub fabric: Fabric,
    /// UDP port of the software fabric.
    #[arg(long, default_value_t = 4791)]
    pub port: u16,
    /// Seconds per test.
    #[arg(long, default_value_t = 2.0, value_parser = crate::parse_seconds)]
    pub duration: f64,
    /// RPCs in flight per test (1 or more).
    #[arg(long, default_value_t = 8, value_parser = crate::parse_concurrency)]
    pub concurrency: usize,
    /// The server's NID.
    #[arg(long, default_value = "127.0.0.1@o2ib")]
    pub server: Nid,
    /// The client's NID.
    #[arg(long, default_value = "127.0.0.2@o2ib")]
    pub client: Nid,
    /// How brw stamps and checks its bulk data (lnet_selftest's `check=`).
    #[arg(long, value_enum, default_value_t = Check::Full)]
    pub check: Check,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The server process; killed if still running when dropped.
pub struct ServerProcess {
    child: Option<Child>,
}

/// Waits at most `limit` for `child` to exit and returns how it ended; a child still running
/// then is killed, and the answer is `None`.
fn exit_within(mut child: Child, limit: Duration) -> Option<std::io::Result<std::process::ExitStatus>> {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx.recv_timeout(limit).ok();
    if status.is_none() {
        // SAFETY: kill(2) with the pid of our own child; at worst it signals nothing.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
    status
}

impl ServerProcess {
    /// Starts `lnd-bench server` (this same executable) and waits for it to be ready.
    pub fn start(
        nid: Nid,
        tunables: Option<&str>,
        fabric: Fabric,
        port: u16,
    ) -> Result<ServerProcess, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.args(["server", "--nid", &nid.to_string(), "--port", &port.to_string(), "--exit-on-stdin-eof"]);
        cmd.args(["--fabric", if fabric == Fabric::Verbs { "verbs" } else { "soft" }]);
        if let Some(t) = tunables {
            cmd.args(["--tunables", t]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the server process: {e}"))?;
        let out = child.stdout.take().ok_or("no server stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut server = ServerProcess { child: Some(child) };
        loop {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(line) if line.contains("ready") => return Ok(server),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Its stdout closed: the server is exiting (it closes stdout only then), and
                    // may not have been reaped yet, so wait for its status (at most 5 s).
                    let status = server
                        .child
                        .take()
                        .and_then(|c| exit_within(c, Duration::from_secs(5)))
                        .and_then(Result::ok);
                    return Err(match status {
                        Some(s) => format!("the server process exited ({s}) before it was ready"),
                        None => "the server process closed its output before it was ready".to_owned(),
                    });
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err("the server process did not get ready in 20 s".to_owned());
                }
            }
        }
    }

    /// Asks the server to exit (closes its stdin) and waits up to 10 s, then kills it.
    pub fn stop(mut self) {
        let Some(mut child) = self.child.take() else { return };
        drop(child.stdin.take());
        if exit_within(child, Duration::from_secs(10)).is_none() {
            eprintln!("lnd-bench: the server did not exit in 10 s; killed it");
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One measurement of a matrix: what, how big, how many in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    /// The test.
    pub op: Op,
    /// Bytes per RPC (brw) or per ping.
    pub size: usize,
    /// RPCs in flight.
    pub concurrency: usize,
}

/// The default matrix: (op, size); brw runs at `--concurrency`, ping at 1.
pub const MATRIX: [(Op, usize); 7] = [
    (Op::BrwWrite, 4 << 10),
    (Op::BrwWrite, 64 << 10),
    (Op::BrwWrite, 1 << 20),
    (Op::BrwRead, 4 << 10),
    (Op::BrwRead, 64 << 10),
    (Op::BrwRead, 1 << 20),
    (Op::Ping, 8),
];

/// Runs the local matrix.
pub fn run(args: &LocalArgs) -> Result<(), String> {
    let cases: Vec<Case> = MATRIX
        .iter()
        .map(|&(op, size)| Case { op, size, concurrency: if op == Op::Ping { 1 } else { args.concurrency } })
        .collect();
    let (rows, ok) = measure_matrix(args, &cases)?;
    if args.json {
        print!("{}", report::json(&rows, ok));
    } else {
        print!("{}", report::table(&rows));
    }
    if ok {
        if !args.json {
            match args.check {
                Check::Full => println!("every RPC completed and every byte verified"),
                c => println!("every RPC completed (brw check={c:?}; pings verified)"),
            }
        }
        Ok(())
    } else {
        Err(failure(&rows))
    }
}

/// What went wrong in a matrix that did not pass: "verification failed" only when data was
/// found corrupt; a transport error or a timeout is named with the test it stopped.
pub fn failure(rows: &[Row]) -> String {
    let bad = rows.iter().find(|r| r.run.errors > 0 || r.run.corrupt > 0 || r.run.rpcs == 0);
    let Some(r) = bad else { return "some RPCs failed".to_owned() };
    let x = &r.run;
    let label = format!("{} {} c{}", report::op_name(x.op), report::size_name(x.size), x.concurrency);
    match (&x.first_error, x.corrupt > 0) {
        (Some(e), true) => format!("verification failed in {label}: {e}"),
        (None, true) => format!("verification failed in {label}: {} RPCs corrupt", x.corrupt),
        (Some(e), false) => format!("{label} failed: {e}"),
        (None, false) => format!("{label}: no RPC completed"),
    }
}

/// The server and client NIDs must be two NIDs of one network: the same NID would make both
/// bind one address (and the client's own NID never leaves its process), and lnd-bench routes
/// nothing between networks.
pub fn check_nids(server: Nid, client: Nid) -> Result<(), String> {
    if server == client {
        return Err(format!(
            "--server and --client are both {server}: the two processes need a NID each (the \
             defaults are 127.0.0.1@o2ib and 127.0.0.2@o2ib)"
        ));
    }
    if server.net() != client.net() {
        return Err(crate::different_networks("--server", server, "--client", client));
    }
    Ok(())
}

/// Starts the server process and the client node and runs `matrix`; (rows, all verified).
pub fn measure_matrix(args: &LocalArgs, matrix: &[Case]) -> Result<(Vec<Row>, bool), String> {
    check_nids(args.server, args.client)?;
    for c in matrix {
        crate::fits_in_memory(c.size, c.concurrency)?;
    }
    // The tunables file is checked here, once: a bad one is one line before any process
    // starts, and its warnings are printed once (not by the server and the client each).
    crate::node::load_config(args.tunables.as_deref(), &[args.server, args.client], true)?;
    let server = ServerProcess::start(args.server, args.tunables.as_deref(), args.fabric, args.port)?;
    let node = Node::start(&NodeOptions {
        nid: args.client,
        tunables: args.tunables.clone(),
        fabric: args.fabric,
        port: args.port,
        tunables_warnings: false,
    })?;
    let mut rows = Vec::new();
    let mut ok = true;
    for &Case { op, size, concurrency } in matrix {
        let spec = RunSpec {
            op,
            size,
            concurrency,
            duration: Some(Duration::from_secs_f64(args.duration)),
            count: None,
            check: if op == Op::Ping { Check::Full } else { args.check },
            server: ProcessId::new(args.server, ProcessId::PID_LUSTRE),
            progress: !args.json,
            rpc_timeout: Duration::from_secs(30),
        };
        let label = format!("{} {} c{}", report::op_name(op), report::size_name(size), spec.concurrency);
        let row = crate::measure(&node, &spec, &label);
        ok &= row.run.errors == 0 && row.run.corrupt == 0 && row.run.rpcs > 0;
        let failed = row.run.first_error.is_some();
        rows.push(row);
        if failed {
            break;
        }
    }
    node.shutdown();
    server.stop();
    Ok((rows, ok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::RunResult;
    use crate::report::Counters;

    fn row(op: Op, rpcs: u64, errors: u64, corrupt: u64, first_error: Option<&str>) -> Row {
        Row {
            run: RunResult {
                op,
                check: Check::Full,
                size: 4096,
                concurrency: 8,
                rpcs,
                bytes: rpcs * 4096,
                secs: 1.0,
                latency: hdrhistogram::Histogram::new(3).unwrap(),
                errors,
                corrupt,
                first_error: first_error.map(str::to_owned),
            },
            counters: Counters::default(),
        }
    }

    /// A transport error was reported as "verification failed: cannot send the request ...".
    #[test]
    fn a_failed_matrix_says_which_test_failed_and_how() {
        let sent = "cannot send the request: no network interface reaches 12345-127.0.0.1@o2ib";
        let rows = [row(Op::BrwWrite, 100, 0, 0, None), row(Op::BrwRead, 0, 8, 0, Some(sent))];
        assert_eq!(failure(&rows), format!("brw read 4K c8 failed: {sent}"));
        let rows = [row(Op::BrwRead, 10, 0, 1, Some("read data failed verification"))];
        assert_eq!(failure(&rows), "verification failed in brw read 4K c8: read data failed verification");
        assert_eq!(failure(&[row(Op::BrwWrite, 0, 0, 0, None)]), "brw write 4K c8: no RPC completed");
    }

    /// `--server X --client X` failed with "another LND or lnd-bench on this host holds UDP port
    /// 4791 ... stop it", the other being its own server; `--client` on another network failed
    /// every RPC with "verification failed".
    #[test]
    fn server_and_client_need_two_nids_of_one_network() {
        let nid = |s: &str| s.parse::<Nid>().unwrap();
        let e = check_nids(nid("127.0.0.1@o2ib"), nid("127.0.0.1@o2ib")).unwrap_err();
        assert!(e.starts_with("--server and --client are both 127.0.0.1@o2ib: "), "{e}");
        let e = check_nids(nid("127.0.0.1@o2ib"), nid("127.0.0.2@o2ib1")).unwrap_err();
        assert!(e.contains("are on different LNet networks"), "{e}");
        check_nids(nid("127.0.0.1@o2ib"), nid("127.0.0.2@o2ib")).unwrap();
        check_nids(nid("127.0.0.1@o2ib3"), nid("127.0.0.5@o2ib3")).unwrap();
    }
}
