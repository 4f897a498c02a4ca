//! `lnd-bench compare`: our figures next to peers measured in the same run, as ratios.
//!
//! Peers, each run only if installed: `ucx_perftest` with `UCX_TLS=tcp` and `UCX_TLS=sm,self`
//! (`ucp_put_bw` at the brw size, `ucp_am_lat` at 8 bytes) and `iperf3` (one TCP stream,
//! `-l` the brw size). UCX latency tests report one-way latency (half a round trip); our ping
//! is a round trip, so the table compares our round trip with twice UCX's figure.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::local::{LocalArgs, measure_matrix};
use crate::node::Fabric;
use crate::proto::Op;
use crate::report::{self, Row};

/// Options of `lnd-bench compare`.
#[derive(clap::Args, Clone)]
pub struct CompareArgs {
    /// ko2iblnd tunables file; default: the built-in conf/ko2iblnd.conf.
    #[arg(long, value_name = "FILE")]
    pub tunables: Option<String>,
    /// UDP port of the software fabric.
    #[arg(long, default_value_t = 4791)]
    pub port: u16,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    pub duration: f64,
    /// brw size.
    #[arg(long, default_value = "1M", value_parser = crate::parse_size)]
    pub size: usize,
    /// brw concurrency.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
}

/// A started background process, killed when dropped.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn installed(cmd: &str) -> bool {
    Command::new(cmd).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
        || Command::new(cmd).arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Runs `cmd` to completion within `timeout`; its stdout, or `None`.
fn run_bounded(mut cmd: Command, timeout: Duration) -> Option<String> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().ok()?;
    let mut out = child.stdout.take()?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    let r = rx.recv_timeout(timeout).ok();
    let _ = child.kill();
    let _ = child.wait();
    r
}

/// Starts a server and waits (at most 10 s) until it prints a line containing `ready`.
fn spawn_ready(mut cmd: Command, ready: &'static str) -> Option<Background> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().ok()?;
    let out = child.stdout.take()?;
    let bg = Background(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if line.contains(ready) {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10)).ok().map(|()| bg)
}

/// `Final:` line of ucx_perftest: (p50 latency us, overall bandwidth MiB/s).
fn ucx(tls: &str, test: &str, size: usize, port: u16) -> Option<(f64, f64)> {
    let mut server = Command::new("ucx_perftest");
    server.env("UCX_TLS", tls).args(["-p", &port.to_string()]);
    let _srv = spawn_ready(server, "Waiting for connection")?;
    let iters = if test.ends_with("lat") { "100000" } else { "2000" };
    let mut client = Command::new("ucx_perftest");
    client.env("UCX_TLS", tls).args([
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-t",
        test,
        "-s",
        &size.to_string(),
        "-n",
        iters,
    ]);
    let out = run_bounded(client, Duration::from_secs(60))?;
    let fin = out.lines().find(|l| l.trim_start().starts_with("Final:"))?;
    let f: Vec<f64> = fin.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // iterations, p50 lat, avg lat, overall lat, avg bw, overall bw, avg rate, overall rate
    Some((*f.get(1)?, *f.get(4)?))
}

/// iperf3, one TCP stream of `len`-byte writes for 3 s: received MiB/s.
fn iperf3(len: usize, port: u16) -> Option<f64> {
    let mut server = Command::new("iperf3");
    server.args(["-s", "-1", "-B", "127.0.0.2", "-p", &port.to_string()]);
    let _srv = spawn_ready(server, "Server listening")?;
    let mut client = Command::new("iperf3");
    client.args([
        "-c",
        "127.0.0.2",
        "-B",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-t",
        "3",
        "-l",
        &len.to_string(),
        "-J",
    ]);
    let out = run_bounded(client, Duration::from_secs(30))?;
    let key = "\"sum_received\"";
    let at = out.find(key)?;
    let rest = &out[at..];
    let b = rest.find("\"bits_per_second\"")?;
    let num: String = rest[b + 17..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 'e' || *c == '+')
        .collect();
    num.parse::<f64>().ok().map(|bps| bps / 8.0 / f64::from(1 << 20))
}

fn row(rows: &[Row], op: Op) -> Option<&Row> {
    rows.iter().find(|r| r.run.op == op)
}

/// Runs the comparison and prints it.
pub fn run(args: &CompareArgs) -> Result<(), String> {
    let local = LocalArgs {
        tunables: args.tunables.clone(),
        fabric: Fabric::Soft,
        port: args.port,
        duration: args.duration,
        concurrency: args.concurrency,
        server: "127.0.0.1@o2ib".parse().map_err(|e| format!("{e}"))?,
        client: "127.0.0.2@o2ib".parse().map_err(|e| format!("{e}"))?,
        json: false,
    };
    let matrix = [(Op::BrwWrite, args.size), (Op::BrwRead, args.size), (Op::Ping, 8)];
    let (rows, ok) = measure_matrix(&local, &matrix)?;
    print!("{}", report::table(&rows));
    if !ok {
        return Err("our own runs failed verification; no comparison".to_owned());
    }
    let write = row(&rows, Op::BrwWrite).map_or(0.0, |r| r.run.mib_s());
    let read = row(&rows, Op::BrwRead).map_or(0.0, |r| r.run.mib_s());
    let ping = row(&rows, Op::Ping).map_or(0.0, |r| r.run.lat_us(0.5));
    let base = 20_000 + (crate::seed() % 20_000) as u16;
    println!();
    println!("{:<44} {:>14} {:>14} {:>8}", "peer (same run)", "peer", "ours", "ratio");
    let line = |what: &str, peer: Option<f64>, ours: f64, unit: &str, higher_better: bool| match peer {
        Some(p) if p > 0.0 => {
            let ratio = if higher_better { ours / p } else { p / ours.max(1e-9) };
            println!("{what:<44} {:>10.1} {unit:<3} {:>10.1} {unit:<3} {:>7.2}x", p, ours, ratio);
        }
        _ => println!("{what:<44} {:>14} {:>10.1} {unit:<3} {:>8}", "not installed", ours, "-"),
    };
    let size = report::size_name(args.size);
    let have_ucx = installed("ucx_perftest");
    for (i, tls) in ["tcp", "sm,self"].iter().enumerate() {
        let bw =
            if have_ucx { ucx(tls, "ucp_put_bw", args.size, base + 2 * i as u16).map(|r| r.1) } else { None };
        line(&format!("UCX_TLS={tls} ucp_put_bw {size} vs brw write"), bw, write, "MiB/s", true);
        line(&format!("UCX_TLS={tls} ucp_put_bw {size} vs brw read"), bw, read, "MiB/s", true);
        let lat = if have_ucx {
            ucx(tls, "ucp_am_lat", 8, base + 2 * i as u16 + 1).map(|r| 2.0 * r.0)
        } else {
            None
        };
        line(&format!("UCX_TLS={tls} ucp_am_lat 8B x2 vs ping p50"), lat, ping, "us", false);
    }
    let tcp = if installed("iperf3") { iperf3(args.size, base + 10) } else { None };
    line(&format!("iperf3 TCP -l {size} vs brw write"), tcp, write, "MiB/s", true);
    println!("\nratio: ours/peer for bandwidth, peer/ours for latency (above 1 = ours better)");
    Ok(())
}
