//! `lnd-bench`: an lnet_selftest-style bandwidth and latency tool for the userspace o2iblnd.
//!
//! ```text
//! lnd-bench server --nid NID [--tunables FILE]
//! lnd-bench brw --to NID --op read|write --size 4K..1M --concurrency N [--duration S | --count N] [--check none|simple|full]
//! lnd-bench ping --to NID [--size 0..4K]
//! lnd-bench local          # server and client as two processes on 127.0.0.1/127.0.0.2, a short matrix
//! lnd-bench compare        # lnd-bench next to ucx_perftest and iperf3 in one run
//! lnd-bench fabric-ping    # SEND ping-pong on the software device alone: the fabric's floor
//! ```
//! As lnet_selftest: a brw read makes the server PUT into the client's buffer, a brw write makes
//! it GET from it; the RPC request itself is a small message.

mod client;
mod compare;
mod copyloop;
mod cpu;
mod fabricping;
mod fabricturns;
mod linefloor;
mod local;
mod memlimit;
mod node;
mod proto;
mod report;
mod server;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lnet_shim::nid::{Nid, ProcessId};

use crate::client::RunSpec;
use crate::node::{Fabric, Node, NodeOptions};
use crate::proto::{Check, Op};
use crate::report::{Counters, Row};

#[derive(Parser)]
#[command(
    name = "lnd-bench",
    version,
    about = "lnet_selftest-style bandwidth and latency tests for the userspace o2iblnd"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Clone)]
struct Common {
    /// ko2iblnd tunables file (modprobe.d format); default: the built-in conf/ko2iblnd.conf.
    #[arg(long, value_name = "FILE")]
    tunables: Option<String>,
    /// Fabric: the software RC device over UDP, or a real RDMA NIC (verbs feature).
    #[arg(long, value_enum, default_value_t = Fabric::Soft)]
    fabric: Fabric,
    /// UDP port of the software fabric.
    #[arg(long, default_value_t = 4791)]
    port: u16,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve brw and ping sessions until stopped (Ctrl-C).
    Server {
        /// This node's NID.
        #[arg(long)]
        nid: Nid,
        #[command(flatten)]
        common: Common,
        /// Exit when standard input closes (used by `local`).
        #[arg(long, hide = true)]
        exit_on_stdin_eof: bool,
    },
    /// Bulk read/write RPCs against a server (lst brw).
    Brw {
        #[command(flatten)]
        target: Target,
        /// read: the server PUTs into our buffer; write: the server GETs from it.
        #[arg(long, value_enum)]
        op: BrwOp,
        /// Bytes per RPC: 4K..1M (1 byte to 16M accepted).
        #[arg(long, default_value = "4K", value_parser = parse_brw_size)]
        size: usize,
        /// RPCs in flight (1 or more).
        #[arg(long, default_value_t = 1, value_parser = parse_concurrency)]
        concurrency: usize,
        /// Data stamping and verification.
        #[arg(long, value_enum, default_value_t = Check::None)]
        check: Check,
        #[command(flatten)]
        how_long: HowLong,
        #[command(flatten)]
        common: Common,
        /// Print one JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Round-trip latency (lst ping).
    Ping {
        #[command(flatten)]
        target: Target,
        /// Payload bytes each way: 0..4K.
        #[arg(long, default_value = "8", value_parser = parse_ping_size)]
        size: usize,
        /// Pings in flight (1 or more).
        #[arg(long, default_value_t = 1, value_parser = parse_concurrency)]
        concurrency: usize,
        #[command(flatten)]
        how_long: HowLong,
        #[command(flatten)]
        common: Common,
        /// Print one JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Server and client as two processes on 127.0.0.1@o2ib and 127.0.0.2@o2ib: brw write and
    /// read at 4K, 64K and 1M, then ping; every byte verified.
    Local(local::LocalArgs),
    /// lnd-bench next to ucx_perftest and iperf3 (when installed), with ratios.
    Compare(compare::CompareArgs),
    /// SEND ping-pong on the software device between two processes (127.0.0.1 and 127.0.0.2),
    /// with no LND or LNet above it: the floor under `ping` (like perftest's ib_send_lat).
    FabricPing {
        /// Bytes per SEND: 8..4K (the first 8 are a sequence number the echo must carry).
        #[arg(long, default_value = "8", value_parser = parse_fabric_ping_size)]
        size: usize,
        /// Seconds to ping.
        #[arg(long, default_value_t = 2.0, value_parser = parse_seconds)]
        duration: f64,
        /// UDP port of the software fabric.
        #[arg(long, default_value_t = 4791)]
        port: u16,
    },
    /// fabric-ping's SEND ping-pong between two devices in this process, driven in turn by one
    /// thread: the devices' own work per round trip, with no core-to-core transfer, wait or
    /// wake-up (under valgrind --tool=callgrind: a repeatable instruction count)
    FabricTurns {
        /// Bytes per SEND: 8..4K (the first 8 are a sequence number the echo must carry).
        #[arg(long, default_value = "8", value_parser = parse_fabric_ping_size)]
        size: usize,
        /// Round trips to measure (after 1000 not measured).
        #[arg(long, default_value_t = 1_000_000, value_parser = parse_count)]
        count: u64,
        /// UDP port of the software fabric.
        #[arg(long, default_value_t = 4791)]
        port: u16,
    },
    /// One cache line each way between two processes through shared memory, nothing else:
    /// the machine's floor under any same-host round trip (under `fabric-ping` and `ping`).
    LinePing {
        /// Seconds to ping.
        #[arg(long, default_value_t = 2.0, value_parser = parse_seconds)]
        duration: f64,
    },
    /// The line ping's echoing process (started by `line-ping` and `compare`; its standard
    /// input is the shared page).
    #[command(hide = true)]
    LinePong {
        /// Seconds after which it gives up.
        #[arg(long)]
        seconds: f64,
    },
    /// The fabric ping's echoing process (started by `fabric-ping` and `compare`).
    #[command(hide = true)]
    FabricPong {
        /// The device's address.
        #[arg(long)]
        ip: std::net::Ipv4Addr,
        /// UDP port of the software fabric.
        #[arg(long)]
        port: u16,
    },
    /// The copy loop's target process (started by `compare`).
    #[command(hide = true)]
    CopyTarget {
        /// Bytes of the buffer to hold.
        #[arg(long, value_parser = parse_size)]
        size: usize,
    },
}

#[derive(Args, Clone)]
struct Target {
    /// The server's NID.
    #[arg(long)]
    to: Nid,
    /// This node's NID (default: 127.0.0.2@o2ib, or 127.0.0.3@o2ib if that is the server).
    #[arg(long)]
    nid: Option<Nid>,
}

#[derive(Args, Clone)]
struct HowLong {
    /// Run for this many seconds (default 10).
    #[arg(long, conflicts_with = "count", value_parser = parse_seconds)]
    duration: Option<f64>,
    /// Run this many RPCs (1 or more).
    #[arg(long, value_parser = parse_count)]
    count: Option<u64>,
    /// Fail an RPC that has not completed after this many seconds.
    #[arg(long, default_value_t = 60.0, value_parser = parse_seconds)]
    timeout: f64,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum BrwOp {
    Read,
    Write,
}

/// `4K`, `64k`, `1M`, `4096` → bytes.
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1usize << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = num.parse().map_err(|_| format!("'{s}' is not a size (e.g. 4K, 64K, 1M)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("'{s}' is too large"))
}

/// A [`parse_size`] in `lo..=hi`: out of range is an argument error that quotes the value as
/// typed (`invalid value '5G' for '--size <SIZE>': must be 1 to 16M`), not its byte count.
fn size_within(s: &str, lo: usize, hi: usize) -> Result<usize, String> {
    let n = parse_size(s)?;
    if (lo..=hi).contains(&n) {
        Ok(n)
    } else {
        Err(format!("must be {} to {}", report::size_name(lo), report::size_name(hi)))
    }
}

/// brw `--size`: bulk bytes per RPC, 1 byte to 16M.
fn parse_brw_size(s: &str) -> Result<usize, String> {
    size_within(s, 1, BRW_MAX_SIZE)
}

/// ping `--size`: payload bytes each way, at most [`proto::MAX_PING`].
fn parse_ping_size(s: &str) -> Result<usize, String> {
    size_within(s, 0, proto::MAX_PING)
}

/// fabric-ping `--size`: bytes per SEND, [`fabricping::MIN_SIZE`] to [`fabricping::MAX_SIZE`].
fn parse_fabric_ping_size(s: &str) -> Result<usize, String> {
    size_within(s, fabricping::MIN_SIZE, fabricping::MAX_SIZE)
}

/// The largest brw `--size`.
const BRW_MAX_SIZE: usize = 16 << 20;

/// `--count`: RPCs (or round trips) to run, at least one (none would measure nothing and fail
/// the run).
fn parse_count(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{s}' is not a whole number")),
    }
}

/// A number of seconds: finite and above zero (at most a year).
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= 365.0 * 86400.0 => Ok(x),
        Ok(_) => Err(format!("'{s}' is not a number of seconds above 0 (e.g. 2 or 0.5)")),
        Err(_) => Err(format!("'{s}' is not a number of seconds")),
    }
}

/// `--concurrency`: RPCs in flight, at least one (lst's `--concurrency` starts at 1 too).
fn parse_concurrency(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{s}' is not a number of RPCs")),
    }
}

/// Every RPC in flight holds a buffer of `size` on each side: refuse more than half of this
/// host's memory at once, rather than let the client or the server be killed for it.
fn fits_in_memory(size: usize, concurrency: usize) -> Result<(), String> {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let total = u64::try_from(pages).unwrap_or(0).saturating_mul(u64::try_from(page).unwrap_or(0));
    let need = (size as u64).saturating_mul(concurrency as u64);
    if total > 0 && need > total / 2 {
        let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
        return Err(format!(
            "--concurrency {concurrency} x --size {} needs {:.1} GiB of buffers on each side, more \
             than half of this host's {:.1} GiB: lower one of them",
            report::size_name(size),
            gib(need),
            gib(total)
        ));
    }
    Ok(())
}

/// A seed for RPC ids from the OS (runs must not collide across restarts).
pub fn seed() -> u64 {
    lnd::rng::os_seed()
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs an async-signal-safe handler (one atomic store) for a standard
        // signal; the function pointer has the signature signal(2) expects.
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

fn default_nid(to: Nid) -> Nid {
    let mine: Nid = Nid::new(to.net(), std::net::Ipv4Addr::new(127, 0, 0, 2));
    if mine == to { Nid::new(to.net(), std::net::Ipv4Addr::new(127, 0, 0, 3)) } else { mine }
}

/// How long each measurement warms up first (its RPCs are not counted).
const WARMUP: Duration = Duration::from_millis(100);

/// Runs one client measurement with progress lines and counters, after a [`WARMUP`].
pub fn measure(node: &Node, spec: &RunSpec, label: &str) -> Row {
    if spec.progress {
        eprintln!("[{label}]");
    }
    // A warm-up, measured by nothing: the first RPCs of a run wake schedulers, fault pages in
    // and fill caches (the first ping of a run took 100-270 µs, the next thousand ran slower
    // than the rest), which a short `--count` run would otherwise report as its rate.
    let warm = RunSpec { duration: Some(WARMUP), count: None, progress: false, ..spec.clone() };
    let warmed = client::run(node, &warm);
    if warmed.first_error.is_some() {
        // Failed already (no server, say): that is the result, without a second wait for it.
        return Row { run: warmed, counters: Counters::default() };
    }
    let before = node.lnd_stats();
    let server_before = client::fetch_stats(node, spec.server);
    let cpu_before = cpu::used_us(cpu::Who::Process);
    let run = client::run(node, spec);
    let client_cpu_us = cpu::used_us(cpu::Who::Process).saturating_sub(cpu_before);
    let after = node.lnd_stats();
    // Without the first answer there is nothing to subtract from, so no second 5 s wait.
    let server_after = server_before.as_ref().and_then(|_| client::fetch_stats(node, spec.server));
    let delta = |k: &str| match (&server_before, &server_after) {
        (Some(a), Some(b)) => b.get(k).copied().unwrap_or(0).saturating_sub(a.get(k).copied().unwrap_or(0)),
        _ => 0,
    };
    let counters = Counters {
        retransmits: after.fabric.retransmits.saturating_sub(before.fabric.retransmits)
            + delta("retransmits"),
        credit_stalls: after.engine.credit_stalls.saturating_sub(before.engine.credit_stalls)
            + delta("credit_stalls"),
        noops: after.engine.noops.saturating_sub(before.engine.noops) + delta("noops"),
        client_cpu_us,
        server_cpu_us: server_after.as_ref().map(|_| delta("cpu_us")),
    };
    Row { run, counters }
}

fn run_client(target: &Target, common: &Common, mut spec: RunSpec, json: bool) -> Result<bool, String> {
    let nid = target.nid.unwrap_or_else(|| default_nid(target.to));
    if nid.net() != target.to.net() {
        return Err(different_networks("--to", target.to, "--nid", nid));
    }
    if nid == target.to {
        // LNet keeps a message to one of its own NIDs inside the process (the lo LND's job),
        // and no server runs in this one: every RPC would wait out its timeout.
        return Err(format!(
            "--to {nid} is this client's own NID (--nid): LNet delivers that inside this process, \
             where no server runs; give the client another NID (the default is {})",
            default_nid(target.to)
        ));
    }
    let node = Node::start(&NodeOptions {
        nid,
        tunables: common.tunables.clone(),
        fabric: common.fabric,
        port: common.port,
        tunables_warnings: true,
    })?;
    spec.server = ProcessId::new(target.to, ProcessId::PID_LUSTRE);
    let label =
        format!("{} {} c{}", report::op_name(spec.op), report::size_name(spec.size), spec.concurrency);
    let row = measure(&node, &spec, &label);
    node.shutdown();
    let ok = row.run.errors == 0 && row.run.corrupt == 0 && row.run.rpcs > 0;
    if json {
        print!("{}", report::json(std::slice::from_ref(&row), ok));
    } else {
        print!("{}", report::table(std::slice::from_ref(&row)));
    }
    if let Some(e) = &row.run.first_error {
        return Err(unreachable_hint(e, row.run.rpcs, &target.to, common));
    }
    if !ok {
        return Err(format!("{} RPCs completed, {} corrupt", row.run.rpcs, row.run.corrupt));
    }
    Ok(true)
}

/// Why a client on `client` cannot reach a server on `server`: lnd-bench routes nothing, so
/// both must be on one LNet network.
pub fn different_networks(server_arg: &str, server: Nid, client_arg: &str, client: Nid) -> String {
    format!(
        "{server_arg} {server} and {client_arg} {client} are on different LNet networks ({} and {}): \
         with no router between them no RPC can pass; put both on one network",
        server.net(),
        client.net()
    )
}

/// The first error, with a hint when nothing ever got through: when the peer did not answer,
/// the usual cause is no `lnd-bench server` at that NID, or one on another `--port`; when it
/// refused the connection (a CM REJ), it runs but will not take this client.
fn unreachable_hint(e: &str, rpcs: u64, to: &Nid, common: &Common) -> String {
    if rpcs > 0 {
        return e.to_owned();
    }
    if e.contains("ECONNREFUSED") {
        return format!(
            "{e}; no RPC completed: {to} refused the connection (does its `accept_nids` let this NID in? \
             are its tunables compatible?)"
        );
    }
    if !["ETIMEDOUT", "EHOSTUNREACH"].iter().any(|c| e.contains(c)) {
        return e.to_owned();
    }
    let on = match common.fabric {
        Fabric::Soft => format!(" --port {}", common.port),
        _ => String::new(),
    };
    format!("{e}; no RPC completed: is `lnd-bench server --nid {to}{on}` running?")
}

fn how_long(h: &HowLong) -> (Option<Duration>, Option<u64>) {
    match (h.duration, h.count) {
        (None, None) => (Some(Duration::from_secs(10)), None),
        (d, c) => (d.map(Duration::from_secs_f64), c),
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::Server { nid, common, exit_on_stdin_eof } => {
            catch_signals();
            // A server started by `local` (`--exit-on-stdin-eof`): `local` checked the tunables
            // file and printed its warnings before starting it.
            // The request buffers go on before the NI comes up: no request can find none.
            let opts = NodeOptions {
                nid,
                tunables: common.tunables,
                fabric: common.fabric,
                port: common.port,
                tunables_warnings: !exit_on_stdin_eof,
            };
            let (node, posted) = Node::start_with(&opts, server::post_requests)?;
            println!("lnd-bench server ready on {nid}");
            let eof = std::sync::Arc::new(AtomicBool::new(false));
            if exit_on_stdin_eof {
                let flag = eof.clone();
                std::thread::spawn(move || {
                    let mut sink = Vec::new();
                    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
                    flag.store(true, Ordering::SeqCst);
                });
            }
            let counters =
                server::serve(&node, posted, || STOP.load(Ordering::SeqCst) || eof.load(Ordering::SeqCst))?;
            let f = node.lnd_stats().fabric;
            let lazy = node.lnet.stats().lazy;
            node.shutdown();
            eprintln!(
                "lnd-bench server: {} RPCs, {} errors, {} corrupt; same-host WRITEs placed {} (split {}, overlapped {}, streamed {}), retransmits {}; frames sent {}, ACKs piggybacked {}; requests that waited for a buffer {}",
                counters.rpcs,
                counters.errors,
                counters.corrupt,
                f.placed_writes,
                f.placed_split,
                f.placed_overlapped,
                f.placed_streamed,
                f.retransmits,
                f.tx_packets,
                f.acks_piggybacked,
                lazy.delayed
            );
            Ok(())
        }
        Cmd::Brw { target, op, size, concurrency, check, how_long: h, common, json } => {
            fits_in_memory(size, concurrency)?;
            let (duration, count) = how_long(&h);
            let spec = RunSpec {
                op: match op {
                    BrwOp::Read => Op::BrwRead,
                    BrwOp::Write => Op::BrwWrite,
                },
                size,
                concurrency,
                duration,
                count,
                check,
                server: ProcessId::new(target.to, ProcessId::PID_LUSTRE),
                progress: !json,
                rpc_timeout: Duration::from_secs_f64(h.timeout.max(0.001)),
            };
            run_client(&target, &common, spec, json).map(|_| ())
        }
        Cmd::Ping { target, size, concurrency, how_long: h, common, json } => {
            let (duration, count) = how_long(&h);
            let spec = RunSpec {
                op: Op::Ping,
                size,
                concurrency,
                duration,
                count,
                check: Check::Full,
                server: ProcessId::new(target.to, ProcessId::PID_LUSTRE),
                progress: !json,
                rpc_timeout: Duration::from_secs_f64(h.timeout.max(0.001)),
            };
            run_client(&target, &common, spec, json).map(|_| ())
        }
        Cmd::Local(args) => local::run(&args),
        Cmd::Compare(args) => compare::run(&args),
        Cmd::CopyTarget { size } => copyloop::target(size),
        Cmd::FabricPing { size, duration, port } => {
            let r = fabricping::measure(size, Duration::from_secs_f64(duration.max(0.01)), port)?;
            println!(
                "fabric ping {} B: {} round trips, p50 {:.2} us, p99 {:.2} us, {:.2} frames sent per round trip (software device alone, SEND ping-pong between two processes)",
                size, r.pings, r.p50_us, r.p99_us, r.frames_per_ping
            );
            Ok(())
        }
        Cmd::FabricPong { ip, port } => fabricping::pong(ip, port),
        Cmd::FabricTurns { size, count, port } => {
            let r = fabricturns::measure(size, count, port)?;
            println!(
                "fabric turns {} B: {} round trips, {:.0} ns of work per round trip, {:.2} frames sent per round trip, {:.2} through rings (two software devices driven in turn by one thread: no transfer between cores, no waiting)",
                size,
                r.round_trips,
                r.ns_per_round_trip,
                r.frames_per_round_trip,
                r.ring_frames_per_round_trip
            );
            Ok(())
        }
        Cmd::LinePing { duration } => {
            let r = linefloor::measure(Duration::from_secs_f64(duration.max(0.01)))?;
            println!(
                "line ping: {} round trips, p50 {:.3} us, p99 {:.3} us (one cache line each way between two processes: the floor under any same-host round trip)",
                r.round_trips, r.p50_us, r.p99_us
            );
            Ok(())
        }
        Cmd::LinePong { seconds } => linefloor::pong(seconds),
    }
}

/// clap's message as one line: its first line and the indented lines under it (the missing
/// arguments), without the usage and hint lines after the first blank one.
fn one_line(text: &str) -> String {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("bad arguments").trim_start_matches("error: ").trim_end();
    let under: Vec<&str> = lines.take_while(|l| l.starts_with(' ')).map(str::trim).collect();
    if under.is_empty() { first.to_owned() } else { format!("{first} {}", under.join(", ")) }
}

/// The one line printed for a command line clap refused.
fn argument_error(e: &clap::Error) -> String {
    if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // No command at all: clap's "error" is the whole help, whose first line is the tool's
        // description, which read as an error says nothing.
        let commands: Vec<String> = <Cli as clap::CommandFactory>::command()
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| c.get_name().to_owned())
            .collect();
        return format!("no command given: one of {} (see lnd-bench --help)", commands.join(", "));
    }
    format!("{} (see lnd-bench --help)", one_line(&e.render().to_string()))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            // --help, --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("lnd-bench: {}", argument_error(&e));
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lnd-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(args: &[&str]) -> String {
        let mut all = vec!["lnd-bench"];
        all.extend(args);
        match Cli::try_parse_from(&all) {
            Ok(_) => panic!("{args:?} accepted"),
            Err(e) => argument_error(&e),
        }
    }

    /// `lnd-bench` alone printed its own description as the error
    /// ("lnd-bench: lnet_selftest-style bandwidth and latency tests ...").
    #[test]
    fn no_command_says_so_and_lists_the_commands() {
        assert_eq!(
            refused(&[]),
            "no command given: one of server, brw, ping, local, compare, fabric-ping, fabric-turns, \
             line-ping (see lnd-bench --help)"
        );
    }

    /// `--count 0` ran nothing and then failed with "0 RPCs completed, 0 corrupt".
    #[test]
    fn a_count_of_zero_is_refused_with_the_arguments() {
        for cmd in
            [&["brw", "--to", "127.0.0.1@o2ib", "--op", "read"][..], &["ping", "--to", "127.0.0.1@o2ib"]]
        {
            let mut args = cmd.to_vec();
            args.extend(["--count", "0"]);
            assert_eq!(
                refused(&args),
                "invalid value '0' for '--count <COUNT>': must be at least 1 (see lnd-bench --help)"
            );
        }
        let ok = Cli::try_parse_from(["lnd-bench", "ping", "--to", "127.0.0.1@o2ib", "--count", "1"]);
        assert!(ok.is_ok());
    }

    /// A size out of range names the value as typed: `--size 5G` was reported as
    /// "--size 5368709120: must be 1 byte to 16M".
    #[test]
    fn sizes_out_of_range_are_refused_as_typed() {
        let brw = |size: &str| refused(&["brw", "--to", "127.0.0.1@o2ib", "--op", "read", "--size", size]);
        assert_eq!(
            brw("5G"),
            "invalid value '5G' for '--size <SIZE>': must be 1 to 16M (see lnd-bench --help)"
        );
        assert_eq!(
            brw("0"),
            "invalid value '0' for '--size <SIZE>': must be 1 to 16M (see lnd-bench --help)"
        );
        assert_eq!(
            brw("1.5M"),
            "invalid value '1.5M' for '--size <SIZE>': '1.5M' is not a size (e.g. 4K, 64K, 1M) \
             (see lnd-bench --help)"
        );
        assert_eq!(
            refused(&["ping", "--to", "127.0.0.1@o2ib", "--size", "5000"]),
            "invalid value '5000' for '--size <SIZE>': must be 0 to 4K (see lnd-bench --help)"
        );
        assert_eq!(
            refused(&["fabric-ping", "--size", "7"]),
            "invalid value '7' for '--size <SIZE>': must be 8 to 4K (see lnd-bench --help)"
        );
        assert_eq!(
            refused(&["compare", "--sizes", "1M,32M"]),
            "invalid value '32M' for '--sizes <SIZES>': must be 1 to 16M (see lnd-bench --help)"
        );
        for (args, size) in [
            (&["brw", "--to", "127.0.0.1@o2ib", "--op", "read", "--size", "16M"][..], 16 << 20),
            (&["brw", "--to", "127.0.0.1@o2ib", "--op", "read", "--size", "1"], 1),
            (&["ping", "--to", "127.0.0.1@o2ib", "--size", "0"], 0),
            (&["ping", "--to", "127.0.0.1@o2ib", "--size", "4K"], 4096),
        ] {
            let mut all = vec!["lnd-bench"];
            all.extend(args);
            let got = match Cli::try_parse_from(&all).map(|c| c.cmd) {
                Ok(Cmd::Brw { size, .. } | Cmd::Ping { size, .. }) => size,
                _ => panic!("{args:?} refused"),
            };
            assert_eq!(got, size, "{args:?}");
        }
    }

    #[test]
    fn different_networks_are_named() {
        let (s, c): (Nid, Nid) = ("127.0.0.1@o2ib".parse().unwrap(), "127.0.0.2@o2ib1".parse().unwrap());
        assert_eq!(
            different_networks("--to", s, "--nid", c),
            "--to 127.0.0.1@o2ib and --nid 127.0.0.2@o2ib1 are on different LNet networks (o2ib0 and \
             o2ib1): with no router between them no RPC can pass; put both on one network"
        );
    }
}
