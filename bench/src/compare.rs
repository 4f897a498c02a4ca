//! `lnd-bench compare`: our figures next to peers measured in the same run, as ratios.
//!
//! Ours: brw write and read at each `--sizes` and `--concurrencies`, ping at 8 B and 4 KiB,
//! and the small-message rate (8-byte pings, 32 in flight), with the CPU time of both
//! processes per GB moved. Peers, each run only if installed, one after the other (never
//! concurrently with ours): `ucx_perftest` with `UCX_TLS=tcp` and `UCX_TLS=sm,self`
//! (`ucp_put_bw` at each size, `ucp_am_lat` at 8 B and 4 KiB, `ucp_am_bw` at 8 B for the
//! message rate), `iperf3` (one TCP stream, `-l` the size), and two same-host limits: a
//! `process_vm_writev` copy loop (see [`crate::copyloop`]), and `memcpy` on every core at once
//! over as many buffer pairs as brw has in flight ([`crate::memlimit`]: what the CPUs can copy
//! over brw's working set, which no transport that copies each byte once can beat), and under
//! the pings, `lnd-bench fabric-ping` (the software device alone, see [`crate::fabricping`]:
//! what our ping costs below the LND) and, at 8 B, `lnd-bench line-ping` (one cache line each
//! way between two processes, see [`crate::linefloor`]: the machine's floor under any of
//! them). UCX
//! latency tests report one-way latency (half a round trip); our ping is a round trip, so the
//! table compares our round trip with twice UCX's figure. The peers' CPU time is `getrusage(RUSAGE_CHILDREN)` around their
//! run: both processes of the pair. The last line says how much CPU time the hypervisor stole
//! while ours ran and while the peers ran ([`cpu::HostTimes`]): on a busy host that, more than
//! anything measured, moves the ratios between runs. Issue 8's targets are judged twice: from
//! the table's figures ([`targets`]), and over `--rounds` paired rounds that measure the
//! targets' figures, ours and the peers' (UCX's when installed, the copy loop), back to back
//! ([`rounds`]), so drift between the table's first and last minutes does not enter their
//! ratios.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod rounds;
mod targets;

use crate::cpu;
use crate::local::{Case, LocalArgs, measure_matrix};
use crate::node::Fabric;
use crate::proto::{Check, Op};
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
    /// Seconds per measurement of ours (and of the copy loop and iperf3).
    #[arg(long, default_value_t = 2.0, value_parser = crate::parse_seconds)]
    pub duration: f64,
    /// brw sizes, comma separated (each 1 byte to 16M, as brw's `--size`).
    #[arg(long, value_delimiter = ',', default_value = "64K,1M,4M", value_parser = crate::parse_brw_size)]
    pub sizes: Vec<usize>,
    /// brw concurrencies, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32", value_parser = crate::parse_concurrency)]
    pub concurrencies: Vec<usize>,
    /// The concurrency whose brw figures are set against the peers.
    #[arg(long, default_value_t = 8, value_parser = crate::parse_concurrency)]
    pub concurrency: usize,
    /// How our brw stamps and checks its data. Default `none`, like the peers, which never
    /// touch the bytes they move (and like lnet_selftest's default); `full` stamps and verifies
    /// every byte on both sides.
    #[arg(long, value_enum, default_value_t = Check::None)]
    pub check: Check,
    /// Paired rounds after the table: each measures our brw write 1M c8 and ping 8 B, UCX
    /// `sm`'s `ucp_put_bw` 1M and `ucp_am_lat` 8 B (when installed) and the copy loop at 1M
    /// back to back (the order alternating), and the targets are judged again by the median
    /// of the rounds' ratios. 0: none.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
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

/// A peer tool's server, with its standard output line-buffered (`stdbuf -oL`, when coreutils
/// has it) so that its "listening" line reaches us through the pipe before it exits.
fn server_command(program: &str) -> Command {
    if installed("stdbuf") {
        let mut c = Command::new("stdbuf");
        c.args(["-oL", program]);
        c
    } else {
        Command::new(program)
    }
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

/// A ucx_perftest result: its `Final:` line and the CPU time of both processes.
#[derive(Clone, Copy, Debug)]
struct Ucx {
    /// Typical (median) latency, µs, one way.
    lat_us: f64,
    /// Overall bandwidth, MiB/s.
    mib_s: f64,
    /// Overall message rate, per second.
    rate: f64,
    /// CPU seconds per GB, server and client together (bandwidth tests).
    cpu_s_per_gb: Option<f64>,
}

/// Warm-up iterations of every ucx_perftest run: fixed, so that two runs of different lengths
/// differ by their measured iterations only (its default is min(10000, iters/10)).
const UCX_WARMUP: u64 = 1000;

/// Runs one ucx_perftest pair on loopback. The CPU per GB of a bandwidth test is marginal, as
/// ours is (measured over the run only): the CPU of both processes is known only from their
/// start to their exit, which includes loading transports and connecting (about 0.25 CPU-s a
/// pair here, a quarter of a 4 GiB run's), so a second, short run is subtracted.
fn ucx(tls: &str, test: &str, size: usize, port: u16) -> Option<Ucx> {
    let iters: u64 = if test.ends_with("lat") {
        100_000
    } else if test == "ucp_am_bw" {
        1_000_000
    } else {
        ((4u64 << 30) / size.max(1) as u64).clamp(1000, 100_000)
    };
    let (out, cpu_us) = ucx_run(tls, test, size, port, iters)?;
    let fin = out.lines().find(|l| l.trim_start().starts_with("Final:"))?;
    let f: Vec<f64> = fin.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let cpu_s_per_gb = if test.ends_with("_bw") && test != "ucp_am_bw" {
        let short = iters / 8;
        let (_, short_cpu_us) = ucx_run(tls, test, size, port, short)?;
        cpu::secs_per_gb(cpu_us.saturating_sub(short_cpu_us), (iters - short) * size as u64)
    } else {
        None
    };
    // iterations, typical lat, avg lat, overall lat, avg bw, overall bw, avg rate, overall rate
    Some(Ucx { lat_us: *f.get(1)?, mib_s: *f.get(5)?, rate: *f.get(7)?, cpu_s_per_gb })
}

/// One ucx_perftest server and client of `iters` iterations: the client's output and the CPU
/// microseconds both processes used, start to exit.
fn ucx_run(tls: &str, test: &str, size: usize, port: u16, iters: u64) -> Option<(String, u64)> {
    let cpu_before = cpu::used_us(cpu::Who::Children);
    let mut server = server_command("ucx_perftest");
    server.env("UCX_TLS", tls).args(["-p", &port.to_string()]);
    let srv = spawn_ready(server, "Waiting for connection")?;
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
        &iters.to_string(),
        "-w",
        &UCX_WARMUP.to_string(),
    ]);
    let out = run_bounded(client, Duration::from_secs(120))?;
    drop(srv);
    Some((out, cpu::used_us(cpu::Who::Children).saturating_sub(cpu_before)))
}

/// iperf3, one TCP stream of `len`-byte writes: (received MiB/s, CPU s/GB of both processes).
fn iperf3(len: usize, secs: f64, port: u16) -> Option<(f64, Option<f64>)> {
    let cpu_before = cpu::used_us(cpu::Who::Children);
    let mut server = server_command("iperf3");
    server.args(["-s", "-1", "-B", "127.0.0.2", "-p", &port.to_string()]);
    let srv = spawn_ready(server, "Server listening")?;
    let mut client = Command::new("iperf3");
    client.args([
        "-c",
        "127.0.0.2",
        "-B",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-t",
        &format!("{}", secs.ceil().max(1.0)),
        "-l",
        &len.to_string(),
        "-J",
    ]);
    let out = run_bounded(client, Duration::from_secs(60))?;
    drop(srv);
    let cpu_us = cpu::used_us(cpu::Who::Children).saturating_sub(cpu_before);
    let at = out.find("\"sum_received\"")?;
    let rest = &out[at..];
    let bps = json_number(rest, "\"bits_per_second\"")?;
    let bytes = json_number(rest, "\"bytes\"")?;
    Some((bps / 8.0 / f64::from(1 << 20), cpu::secs_per_gb(cpu_us, bytes as u64)))
}

/// The number after `key` in a JSON text.
fn json_number(text: &str, key: &str) -> Option<f64> {
    let at = text.find(key)? + key.len();
    let num: String = text[at..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
        .collect();
    num.parse().ok()
}

fn find(rows: &[Row], op: Op, size: usize, concurrency: usize) -> Option<&Row> {
    rows.iter().find(|r| r.run.op == op && r.run.size == size && r.run.concurrency == concurrency)
}

/// Our measurements, in the order they run.
fn our_cases(args: &CompareArgs) -> Vec<Case> {
    let mut cases = Vec::new();
    for op in [Op::BrwWrite, Op::BrwRead] {
        for &size in &args.sizes {
            for &concurrency in &args.concurrencies {
                cases.push(Case { op, size, concurrency });
            }
        }
    }
    cases.push(Case { op: Op::Ping, size: 8, concurrency: 1 });
    cases.push(Case { op: Op::Ping, size: 4096, concurrency: 1 });
    cases.push(Case { op: Op::Ping, size: 8, concurrency: 32 });
    cases
}

/// One line of the peers table.
struct Line {
    what: String,
    peer: Option<f64>,
    ours: f64,
    unit: &'static str,
    higher_better: bool,
    peer_cpu: Option<f64>,
    our_cpu: Option<f64>,
}

fn print_line(l: &Line) {
    // Three decimals: on a fast host both sides spend a few hundredths of a second per GB.
    let cpu = |c: Option<f64>| c.map_or("-".to_owned(), |c| format!("{c:.3}"));
    // Round trips of a microsecond or less need the second decimal.
    let digits = if l.unit == "us" { 2 } else { 1 };
    let (peer, ratio) = match l.peer {
        Some(p) if p > 0.0 => {
            let r = if l.higher_better { l.ours / p } else { p / l.ours.max(1e-9) };
            (format!("{p:.digits$}"), format!("{r:.2}x"))
        }
        _ => ("not run".to_owned(), "-".to_owned()),
    };
    println!(
        "{:<50} {:>10} {:>10.digits$} {:<6} {:>7} {:>9} {:>9}",
        l.what,
        peer,
        l.ours,
        l.unit,
        ratio,
        cpu(l.peer_cpu),
        cpu(l.our_cpu)
    );
}

/// Steal above this share of the CPU time makes `compare` warn that its ratios are unsteady.
const STEADY_STEAL: f64 = 0.05;

/// The host line under the table: how much CPU time the hypervisor took while ours ran and
/// while the peers ran (`/proc/stat`), with a warning when either was above [`STEADY_STEAL`].
fn steal_note(ours: Option<f64>, peers: Option<f64>) -> String {
    let mut note = format!(
        "host steal (the machine's CPU time the hypervisor gave to other guests, /proc/stat): {} \
         while ours ran, {} while the peers ran",
        cpu::steal_text(ours),
        cpu::steal_text(peers)
    );
    if ours.into_iter().chain(peers).any(|s| s > STEADY_STEAL) {
        note.push_str(&format!(
            "; above {:.0}%, each figure depends on how much was stolen while it ran, so ratios \
             move from run to run: compare several runs, or run on a quieter moment",
            100.0 * STEADY_STEAL
        ));
    }
    note
}

/// Runs the comparison and prints it.
pub fn run(args: &CompareArgs) -> Result<(), String> {
    if args.sizes.is_empty() || args.concurrencies.is_empty() {
        return Err("--sizes and --concurrencies need at least one value".to_owned());
    }
    if !args.concurrencies.contains(&args.concurrency) {
        return Err(format!(
            "--concurrency {} (the brw runs set against the peers) is not among --concurrencies {:?}",
            args.concurrency, args.concurrencies
        ));
    }
    let local = LocalArgs {
        tunables: args.tunables.clone(),
        fabric: Fabric::Soft,
        port: args.port,
        duration: args.duration,
        concurrency: args.concurrency,
        server: "127.0.0.1@o2ib".parse().map_err(|e| format!("{e}"))?,
        client: "127.0.0.2@o2ib".parse().map_err(|e| format!("{e}"))?,
        check: args.check,
        json: false,
    };
    println!("ours: brw check={} (--check), pings verified", format!("{:?}", args.check).to_lowercase());
    let ours_from = cpu::HostTimes::now();
    let (rows, ok) = measure_matrix(&local, &our_cases(args))?;
    let ours_steal = cpu::HostTimes::stolen_since(ours_from);
    print!("{}", report::table(&rows));
    if !ok {
        return Err("our own runs failed verification; no comparison".to_owned());
    }
    let base = 20_000 + (crate::seed() % 20_000) as u16;
    let have_ucx = installed("ucx_perftest");
    let have_iperf = installed("iperf3");
    for (have, program, package) in
        [(have_ucx, "ucx_perftest", "ucx-utils"), (have_iperf, "iperf3", "iperf3")]
    {
        if !have {
            eprintln!(
                "lnd-bench compare: {program} is not installed, so its rows say `not run` \
                 (Debian: apt-get install {package})"
            );
        }
    }
    let duration = Duration::from_secs_f64(args.duration.max(0.1));
    let c = args.concurrency;
    let peers_from = cpu::HostTimes::now();
    println!();
    println!(
        "{:<50} {:>10} {:>10} {:<6} {:>7} {:>9} {:>9}",
        "ours vs peer (same run)", "peer", "ours", "unit", "ratio", "peer CPU", "our CPU"
    );
    let mut figures = targets::Figures::default();
    let mut port = base;
    let mut next_port = || {
        port += 1;
        port
    };
    for &size in &args.sizes {
        let sz = report::size_name(size);
        let ours = |op, conc| find(&rows, op, size, conc);
        let mib = |r: Option<&Row>| r.map_or(0.0, |r| r.run.mib_s());
        let ours_cpu = |r: Option<&Row>| r.and_then(Row::cpu_s_per_gb);
        let w = ours(Op::BrwWrite, c);
        let copy = match crate::copyloop::measure(size, duration) {
            Ok(x) => Some(x),
            Err(e) => {
                eprintln!("lnd-bench compare: copy loop at {sz}: {e}");
                None
            }
        };
        if size == targets::SIZE {
            figures.copy_loop = copy.as_ref().map(|x| x.mib_s);
        }
        // Our brw write and read at concurrency `conc` next to one bandwidth peer: (MiB/s,
        // CPU s/GB).
        let both_at = |conc: usize, peer: &str, figure: Option<(f64, Option<f64>)>| {
            for (name, row) in [("write", ours(Op::BrwWrite, conc)), ("read", ours(Op::BrwRead, conc))] {
                print_line(&Line {
                    what: format!("brw {name} {sz} c{conc} vs {peer}"),
                    peer: figure.map(|f| f.0),
                    ours: mib(row),
                    unit: "MiB/s",
                    higher_better: true,
                    peer_cpu: figure.and_then(|f| f.1),
                    our_cpu: ours_cpu(row),
                });
            }
        };
        let both = |peer: &str, figure| both_at(c, peer, figure);
        both("process_vm_writev loop", copy.map(|x| (x.mib_s, x.cpu_s_per_gb)));
        let limit = crate::memlimit::measure(size, c, duration);
        both(
            &format!("{}-core memcpy, its {} bufs", limit.threads, report::size_name(limit.working_set)),
            Some((limit.mib_s, limit.cpu_s_per_gb)),
        );
        if size == targets::SIZE && c == targets::CONCURRENCY {
            figures.memcpy = Some(limit);
        }
        // ucp_put_bw moves one buffer to one buffer over and over; brw at concurrency 1 does
        // too (one source, one sink), so a pair of rows at c1 compares the transports on the
        // same working set, where the rows at `c` also compare cache footprints.
        let c1_rows = c != 1 && [Op::BrwWrite, Op::BrwRead].into_iter().any(|op| ours(op, 1).is_some());
        for tls in ["sm,self", "tcp"] {
            let bw = if have_ucx { ucx(tls, "ucp_put_bw", size, next_port()) } else { None };
            let figure = bw.map(|x| (x.mib_s, x.cpu_s_per_gb));
            if tls == "sm,self" && size == targets::SIZE {
                figures.ucx_bw = figure;
            }
            both(&format!("UCX_TLS={tls} ucp_put_bw"), figure);
            if tls == "sm,self" && c1_rows {
                both_at(1, &format!("UCX_TLS={tls} 1 buf each"), figure);
            }
        }
        // iperf3 writes at most 1 MiB per call (-l).
        let len = size.min(1 << 20);
        let tcp = if have_iperf { iperf3(len, args.duration, next_port()) } else { None };
        print_line(&Line {
            what: format!("brw write {sz} c{c} vs iperf3 TCP -l {}", report::size_name(len)),
            peer: tcp.map(|x| x.0),
            ours: mib(w),
            unit: "MiB/s",
            higher_better: true,
            peer_cpu: tcp.and_then(|x| x.1),
            our_cpu: ours_cpu(w),
        });
    }
    // (line-ping, UCX sm's round trip, fabric-ping, ours) at 8 B, for the note under the table.
    let mut floor = None;
    for (size, name) in [(8usize, "8B"), (4096, "4K")] {
        let ping = find(&rows, Op::Ping, size, 1).map_or(0.0, |r| r.run.lat_us(0.5));
        let lat_line = |what: String, peer: Option<f64>, ours: f64| Line {
            what,
            peer,
            ours,
            unit: "us",
            higher_better: false,
            peer_cpu: None,
            our_cpu: None,
        };
        let mut sm = None;
        for tls in ["sm,self", "tcp"] {
            let lat = if have_ucx { ucx(tls, "ucp_am_lat", size, next_port()) } else { None };
            let rtt = lat.map(|x| 2.0 * x.lat_us);
            if tls == "sm,self" {
                sm = rtt;
                if size == 8 {
                    figures.ucx_rtt_us = rtt;
                }
            }
            print_line(&lat_line(format!("ping {name} p50 vs UCX_TLS={tls} ucp_am_lat x2"), rtt, ping));
        }
        // The software device alone: the floor under our ping, against the same UCX figure.
        let mut device = None;
        match crate::fabricping::measure(size, duration, args.port) {
            Ok(floor) => {
                device = Some(floor.p50_us);
                if size == 8 {
                    figures.fabric_ping_us = device;
                }
                print_line(&lat_line(
                    format!("ping {name} p50 vs fabric-ping (device alone)"),
                    Some(floor.p50_us),
                    ping,
                ));
                print_line(&lat_line(
                    format!("fabric-ping {name} p50 vs UCX_TLS=sm,self x2"),
                    sm,
                    floor.p50_us,
                ));
            }
            Err(e) => eprintln!("lnd-bench compare: fabric-ping at {name}: {e}"),
        }
        if size == 8 {
            // The machine's floor: one cache line each way between two processes.
            match crate::linefloor::measure(duration) {
                Ok(line) => {
                    let vs = |what: &str, ours: f64| {
                        print_line(&lat_line(
                            format!("{what} vs line-ping (cache-line floor)"),
                            Some(line.p50_us),
                            ours,
                        ));
                    };
                    vs("ping 8B p50", ping);
                    if let Some(d) = device {
                        vs("fabric-ping 8B p50", d);
                    }
                    floor = Some((line.p50_us, sm, device, ping));
                }
                Err(e) => eprintln!("lnd-bench compare: line-ping: {e}"),
            }
        }
    }
    // Requests per second, one direction as ucp_am_bw counts its messages (each of ours is
    // also answered: the machine moves twice as many messages as this counts).
    let rate = find(&rows, Op::Ping, 8, 32).map_or(0.0, |r| r.run.rpc_s());
    for tls in ["sm,self", "tcp"] {
        let bw = if have_ucx { ucx(tls, "ucp_am_bw", 8, next_port()) } else { None };
        print_line(&Line {
            what: format!("8B requests/s (ping c32) vs UCX_TLS={tls} ucp_am_bw"),
            peer: bw.map(|x| x.rate),
            ours: rate,
            unit: "msg/s",
            higher_better: true,
            peer_cpu: None,
            our_cpu: None,
        });
    }
    if let Some((line, sm, device, ours)) = floor.filter(|f| f.0 > 0.0) {
        let times = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{:.1}x", x / line));
        println!(
            "\nfloor: a cache line there and back between two processes takes {line:.3} us (line-ping); \
             at 8 B, UCX_TLS=sm,self ucp_am_lat x2 takes {} that, 1.5x UCX {}, fabric-ping {}, our ping {}",
            times(sm),
            times(sm.map(|u| 1.5 * u)),
            times(device),
            times(Some(ours)),
        );
    }
    println!(
        "\nratio: ours/peer for bandwidth and rate, peer/ours for latency (above 1 = ours better); \
         CPU: seconds per GB, both processes (ours: client + server; p99 of ours in the table above)"
    );
    let peers_steal = cpu::HostTimes::stolen_since(peers_from);
    println!("{}", steal_note(ours_steal, peers_steal));
    figures.brw = find(&rows, Op::BrwWrite, targets::SIZE, targets::CONCURRENCY)
        .map(|r| (r.run.mib_s(), r.cpu_s_per_gb()));
    figures.ping_us = find(&rows, Op::Ping, 8, 1).map(|r| r.run.lat_us(0.5));
    println!();
    for line in targets::verdict(&figures) {
        println!("{line}");
    }
    if args.rounds > 0 {
        println!();
        if !have_ucx {
            println!("(ucx_perftest is not installed: the rounds judge the copy-loop target only)");
        }
        for line in rounds::judge(&rounds::measure(&local, args.rounds, have_ucx, &mut next_port)) {
            println!("{line}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_line_warns_only_when_steal_is_high() {
        let quiet = steal_note(Some(0.01), Some(0.02));
        assert!(quiet.contains("1.0% while ours ran, 2.0% while the peers ran"), "{quiet}");
        assert!(!quiet.contains("above 5%"), "{quiet}");
        for noisy in [steal_note(Some(0.30), Some(0.01)), steal_note(None, Some(0.06))] {
            assert!(noisy.contains("above 5%"), "{noisy}");
        }
        let unknown = steal_note(None, None);
        assert!(unknown.contains("unknown while ours ran, unknown while the peers ran"), "{unknown}");
        assert!(!unknown.contains("above 5%"), "{unknown}");
    }
}
