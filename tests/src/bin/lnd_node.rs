//! `lnd-node`: one o2iblnd interface in its own process, for two-process tests over real UDP.
//!
//! ```text
//! lnd-node serve --nid 127.0.0.2@o2ib [--port P] [--tunables FILE] [--expect N] [--deadline-secs S]
//! lnd-node drive --nid 127.0.0.1@o2ib --to 127.0.0.2@o2ib --op put|get --size BYTES --count N --window W [--port P]
//! lnd-node swarm --nid 127.0.1.1@o2ib --nis N --to 127.0.0.2@o2ib [--port P]
//! ```
//! `serve` accepts any PUT into a fresh sink and checks every byte against the pattern its
//! match bits name; it answers any GET with that pattern. It exits 0 after `--expect` verified
//! PUTs and GETs (staying connected 300 ms more), or when `--expect` is 0 after a "bye" PUT and
//! once its sender has hung up (at most 3 s later; at its deadline: non-zero). With
//! `--keep-going 1` a failed receive is reported and counted instead of ending the run. `drive`
//! keeps `W` operations in flight, checks every GET's bytes, and prints the bandwidth; with
//! `--retry 1` a failed operation is reported once and posted again (progress is printed per
//! completion); `--bye 1` ends with a bye PUT. `swarm` starts `--nis` interfaces on consecutive
//! addresses from `--nid`, connects each to `--to` with one PUT, holds the connections until the
//! server closes them (or `--deadline-secs`), and exits.
//!
//! `--loss P` injects faults into the software device (loss P, as much reordering, half as much
//! duplication and corruption). Every role prints, after shutdown, the objects left on its device
//! (`live after shutdown: qps 0 mrs 0 cqs 0 pds 0` when nothing leaked). `--copy-helper
//! off|auto|always` sets the device's copy engine (`SoftConfig::copy_helper`), `--streaming
//! off|auto|always` whether its large copies use streaming stores (`SoftConfig::streaming`).

use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lnd::clock::Clock;
use lnd::driver::{Driver, DriverConfig, FabricChoice};
use lnd::fabric::soft::{CopyHelper, DirFaults, FaultConfig, SoftConfig, Streaming};
use lnd::tunables::Tunables;
use lnet_shim::buffer::Buffer;
use lnet_shim::hdr::{GetMsg, LnetHdr, LnetMsg, PutMsg, WireHandle};
use lnet_shim::lnd::{Frag, Frags, Lnd, LndError, LndSend, LndUpcalls, RecvDisposition, SendStatus};
use lnet_shim::nid::{Nid, ProcessId};

/// Word `i` of the pattern named by `tag`.
fn word(tag: u64, i: usize) -> u64 {
    (tag << 32) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x0be9_1b91
}

fn pattern(tag: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    for i in 0..len.div_ceil(8) {
        v.extend_from_slice(&word(tag, i).to_le_bytes());
    }
    v.truncate(len);
    v
}

fn check(buf: &Buffer, tag: u64, len: usize) -> bool {
    let mut got = vec![0u8; len];
    buf.read(0, &mut got).is_ok() && got == pattern(tag, len)
}

enum Done {
    Send(u64, Result<SendStatus, LndError>),
    Recv(u64, Result<usize, LndError>),
}

/// Serves PUT sinks and GET sources by match bits; reports completions on a channel.
struct Upcalls {
    sinks: Mutex<std::collections::HashMap<u64, (Arc<Buffer>, usize)>>,
    tx: Mutex<mpsc::Sender<Done>>,
    /// The peer whose bye PUT arrived.
    bye_from: Mutex<Option<Nid>>,
}

impl LndUpcalls for Upcalls {
    fn recv(&self, from: Nid, hdr: &LnetHdr, _rdma: bool) -> RecvDisposition {
        match hdr.msg {
            LnetMsg::Put(p) => {
                if p.match_bits == BYE {
                    *self.bye_from.lock().unwrap() = Some(from);
                }
                let len = hdr.payload_length as usize;
                let buf = Arc::new(Buffer::new(len));
                self.sinks.lock().unwrap().insert(p.match_bits, (buf.clone(), len));
                RecvDisposition::Sink { frags: Frag::whole(buf).into(), mlength: len, token: p.match_bits }
            }
            LnetMsg::Get(g) => {
                let len = g.sink_length as usize;
                let buf = Arc::new(Buffer::from_slice(&pattern(g.match_bits, len)));
                RecvDisposition::Source { frags: Frag::whole(buf).into(), token: g.match_bits | 1 << 63 }
            }
            _ => RecvDisposition::Drop,
        }
    }

    fn recv_done(&self, token: u64, result: Result<usize, LndError>) {
        let _ = self.tx.lock().unwrap().send(Done::Recv(token, result));
    }

    fn send_done(&self, token: u64, result: Result<SendStatus, LndError>) {
        let _ = self.tx.lock().unwrap().send(Done::Send(token, result));
    }
}

struct Args {
    role: String,
    nid: Nid,
    to: Option<Nid>,
    port: u16,
    tunables: Option<String>,
    op: String,
    size: usize,
    count: u64,
    window: u64,
    expect: u64,
    deadline: Duration,
    retry: bool,
    bye: bool,
    keep_going: bool,
    loss: f64,
    nis: u32,
    copy_helper: CopyHelper,
    streaming: Streaming,
}

/// The match bits of the PUT that ends a `serve` run without `--expect`.
const BYE: u64 = 1 << 62;
/// How long a server stays connected after its last expected message.
const LINGER: Duration = Duration::from_millis(300);
/// After a bye, the longest it waits for the peer to hang up.
const BYE_LINGER_MAX: Duration = Duration::from_secs(3);
/// How often it looks whether the peer hung up.
const LINGER_LOOK: Duration = Duration::from_millis(5);

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let role = it.next().ok_or("usage: lnd-node serve|drive [options]")?;
    let mut a = Args {
        role,
        nid: Nid::o2ib(std::net::Ipv4Addr::LOCALHOST),
        to: None,
        port: 4791,
        tunables: None,
        op: "put".into(),
        size: 1 << 20,
        count: 16,
        window: 8,
        expect: 0,
        deadline: Duration::from_secs(120),
        retry: false,
        bye: false,
        keep_going: false,
        loss: 0.0,
        nis: 1,
        copy_helper: CopyHelper::from_env(),
        streaming: Streaming::from_env(),
    };
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = || format!("bad value for {flag}: {v}");
        match flag.as_str() {
            "--nid" => a.nid = v.parse().map_err(|e| format!("{e}"))?,
            "--to" => a.to = Some(v.parse().map_err(|e| format!("{e}"))?),
            "--port" => a.port = v.parse().map_err(|_| bad())?,
            "--tunables" => a.tunables = Some(v),
            "--op" => a.op = v,
            "--size" => a.size = v.parse().map_err(|_| bad())?,
            "--count" => a.count = v.parse().map_err(|_| bad())?,
            "--window" => a.window = v.parse().map_err(|_| bad())?,
            "--expect" => a.expect = v.parse().map_err(|_| bad())?,
            "--deadline-secs" => a.deadline = Duration::from_secs(v.parse().map_err(|_| bad())?),
            "--retry" => a.retry = v == "1",
            "--bye" => a.bye = v == "1",
            "--keep-going" => a.keep_going = v == "1",
            "--loss" => a.loss = v.parse().map_err(|_| bad())?,
            "--nis" => a.nis = v.parse().map_err(|_| bad())?,
            "--copy-helper" => {
                a.copy_helper = off_auto_always(&v, [CopyHelper::Off, CopyHelper::Auto, CopyHelper::Always])
                    .ok_or_else(bad)?
            }
            "--streaming" => {
                a.streaming = off_auto_always(&v, [Streaming::Off, Streaming::Auto, Streaming::Always])
                    .ok_or_else(bad)?
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(a)
}

/// The mode `off`, `auto` or `always` names, from `[off, auto, always]`; `None` for any other word.
fn off_auto_always<T>(v: &str, [off, auto, always]: [T; 3]) -> Option<T> {
    match v {
        "off" => Some(off),
        "auto" => Some(auto),
        "always" => Some(always),
        _ => None,
    }
}

fn load_tunables(a: &Args) -> Result<Tunables, String> {
    Ok(match &a.tunables {
        Some(path) => Tunables::load(std::path::Path::new(path)).map_err(|e| e.to_string())?.tunables,
        None => {
            let mut t = Tunables::default();
            t.finalize().map_err(|e| e.to_string())?;
            t
        }
    })
}

fn start(a: &Args) -> Result<(Driver, mpsc::Receiver<Done>, Arc<Upcalls>), String> {
    start_ni(a, a.nid, load_tunables(a)?)
}

fn start_ni(
    a: &Args,
    nid: Nid,
    tunables: Tunables,
) -> Result<(Driver, mpsc::Receiver<Done>, Arc<Upcalls>), String> {
    let (tx, rx) = mpsc::channel();
    let up = Arc::new(Upcalls {
        sinks: Mutex::new(Default::default()),
        tx: Mutex::new(tx),
        bye_from: Mutex::new(None),
    });
    let p = a.loss;
    let faults = FaultConfig {
        tx: DirFaults { drop: p, reorder: p, duplicate: p / 2.0, corrupt: p / 2.0, ..DirFaults::NONE },
        rx: DirFaults::NONE,
    };
    let cfg = DriverConfig {
        nid,
        tunables,
        fabric: FabricChoice::Soft(SoftConfig {
            udp_port: a.port,
            faults,
            copy_helper: a.copy_helper,
            streaming: a.streaming,
            ..SoftConfig::default()
        }),
        seed: None,
    };
    let d = Driver::start(cfg, up.clone()).map_err(|e| e.to_string())?;
    Ok((d, rx, up))
}

/// Prints the driver's counters, shuts it down and prints what is left on its device.
fn finish(driver: &Driver, who: &str) {
    let per: Vec<String> = driver
        .scheduler_stats()
        .iter()
        .map(|s| s.map_or_else(|| "?".to_owned(), |s| s.engine.conns_established.to_string()))
        .collect();
    println!("{who} schedulers {}: connections established per scheduler [{}]", per.len(), per.join(", "));
    if let Some(st) = driver.stats() {
        let e = st.engine;
        println!(
            "{who} stats: connections {} descriptors {}/{} cm_live {} established {} closed {} \
             protocol_errors {} stale_msgs {} tx_timeouts {} send_errors {} accepts_rejected {} \
             tx_pool_waits {} retransmits {} bad_icrc {} rx_msgs {} tx_msgs {} stale_completions {} \
             placed_stale {}",
            st.connections,
            st.tx_descriptors.0,
            st.tx_descriptors.1,
            st.cm_live,
            e.conns_established,
            e.conns_closed,
            e.protocol_errors,
            e.stale_msgs,
            e.tx_timeouts,
            e.send_errors,
            e.accepts_rejected,
            e.tx_pool_waits,
            st.fabric.retransmits,
            st.fabric.bad_icrc,
            e.rx_msgs,
            e.tx_msgs,
            e.stale_completions,
            st.fabric.placed_stale
        );
    }
    driver.shutdown();
    if let Some(l) = driver.soft_live_counts() {
        println!("{who} live after shutdown: qps {} mrs {} cqs {} pds {}", l.qps, l.mrs, l.cqs, l.pds);
    }
}

/// The resident set size of this process in KiB (Linux `/proc/self/status`).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn serve(a: &Args) -> Result<(), String> {
    let (driver, rx, up) = start(a)?;
    let rss_start = rss_kib();
    println!("serving on {} (rss {rss_start} KiB)", a.nid);
    let clock = Clock::new();
    let end = clock.now() + a.deadline;
    let (mut puts, mut gets, mut errors) = (0u64, 0u64, 0u64);
    let mut bye = false;
    while !bye && (a.expect == 0 || puts + gets < a.expect) {
        let left = end.saturating_duration_since(clock.now());
        if left.is_zero() {
            finish(&driver, "server");
            return Err(format!("deadline: verified {puts} PUTs and {gets} GETs of {}", a.expect));
        }
        match rx.recv_timeout(left) {
            Ok(Done::Recv(BYE, Ok(_))) if a.expect == 0 => bye = true,
            Ok(Done::Recv(token, Ok(n))) if token >> 63 == 0 => {
                let (buf, len) = up.sinks.lock().unwrap().remove(&token).ok_or("unknown PUT")?;
                if n != len || !check(&buf, token, len) {
                    return Err(format!("PUT {token}: {n} of {len} bytes, content wrong"));
                }
                puts += 1;
            }
            Ok(Done::Recv(_, Ok(_))) => gets += 1,
            Ok(Done::Recv(token, Err(e))) if a.keep_going => {
                up.sinks.lock().unwrap().remove(&token);
                errors += 1;
                println!("server: receive {token} failed: {e}");
            }
            Ok(Done::Recv(token, Err(e))) => return Err(format!("receive {token} failed: {e}")),
            Ok(Done::Send(..)) => {}
            Err(_) => {}
        }
    }
    let rss_end = rss_kib();
    let conns = driver.stats().map_or(0, |s| s.connections);
    println!(
        "server: verified {puts} PUTs and {gets} GETs, {errors} receive errors; {conns} connections, \
         rss {rss_end} KiB (+{} KiB since start)",
        rss_end.saturating_sub(rss_start)
    );
    // Let the last completions reach the peer before the connection goes: stay connected a
    // while (several RC retransmission intervals, 67 ms each), so that a peer whose last
    // message's ACK was lost gets it on the retransmission instead of a disconnect. A peer
    // that said bye hangs up once its bye completed: wait for that (it cannot know its bye
    // arrived before the ACK does), up to a bound for a hang-up lost on the way.
    let bye_from = *up.bye_from.lock().unwrap();
    let linger = clock.now() + if bye_from.is_some() { BYE_LINGER_MAX } else { LINGER };
    let connected = |nid: Nid| driver.peers().iter().any(|p| p.nid == nid && p.conns > 0);
    loop {
        let left = linger.saturating_duration_since(clock.now());
        if left.is_zero() || bye_from.is_some_and(|nid| !connected(nid)) {
            break;
        }
        let _ = rx.recv_timeout(left.min(LINGER_LOOK));
    }
    up.sinks.lock().unwrap().clear();
    finish(&driver, "server");
    Ok(())
}

fn put_msg(src: ProcessId, dst: ProcessId, to: Nid, tag: u64, size: usize) -> LndSend {
    let hdr = LnetHdr {
        dest: dst,
        src,
        payload_length: size as u32,
        msg: LnetMsg::Put(PutMsg {
            ack_wmd: WireHandle::NONE,
            match_bits: tag,
            hdr_data: 0,
            ptl_index: 4,
            offset: 0,
        }),
    };
    let data = Arc::new(Buffer::from_slice(&pattern(tag, size)));
    LndSend { target: to, hdr, payload: Frag::whole(data).into(), get_sink: None, token: tag }
}

fn drive(a: &Args) -> Result<(), String> {
    let to = a.to.ok_or("--to is required")?;
    let (driver, rx, _up) = start(a)?;
    let clock = Clock::new();
    let t0 = clock.now();
    let end = t0 + a.deadline;
    let src = ProcessId::new(a.nid, ProcessId::PID_LUSTRE);
    let dst = ProcessId::new(to, ProcessId::PID_LUSTRE);
    let mut sinks: std::collections::HashMap<u64, Arc<Buffer>> = Default::default();
    let (mut posted, mut done, mut errors) = (0u64, 0u64, 0u64);
    let mut outstanding: std::collections::HashSet<u64> = Default::default();
    let mut first_done = None;
    while done < a.count {
        // A failed operation is redone under a fresh tag: a late failure report for the old
        // one at the server can then never be mistaken for the new one.
        while done + (outstanding.len() as u64) < a.count && (outstanding.len() as u64) < a.window {
            posted += 1;
            // Tags unique across clients of one server: the address, then a count.
            let tag = (u64::from(u32::from(a.nid.addr())) << 20) + posted;
            let msg = if a.op == "get" {
                let sink = Arc::new(Buffer::new(a.size));
                sinks.insert(tag, sink.clone());
                let hdr = LnetHdr {
                    dest: dst,
                    src,
                    payload_length: 0,
                    msg: LnetMsg::Get(GetMsg {
                        return_wmd: WireHandle::new(1, tag),
                        match_bits: tag,
                        ptl_index: 4,
                        src_offset: 0,
                        sink_length: a.size as u32,
                    }),
                };
                LndSend {
                    target: to,
                    hdr,
                    payload: Frags::new(),
                    get_sink: Some(Frag::whole(sink).into()),
                    token: tag,
                }
            } else {
                put_msg(src, dst, to, tag, a.size)
            };
            driver.send(msg).map_err(|e| format!("send refused: {e}"))?;
            outstanding.insert(tag);
        }
        let left = end.saturating_duration_since(clock.now());
        if left.is_zero() {
            return Err(format!("deadline: {done} of {} done, {errors} errors", a.count));
        }
        match rx.recv_timeout(left) {
            Ok(Done::Send(tag, r)) => {
                if !outstanding.remove(&tag) {
                    return Err(format!("{} {tag} completed twice (or was never sent)", a.op));
                }
                match r {
                    Ok(st) => {
                        if a.op == "get" {
                            let sink = sinks.remove(&tag).ok_or("unknown GET")?;
                            if st.reply_len != Some(a.size) || !check(&sink, tag, a.size) {
                                return Err(format!("GET {tag}: reply {:?}, content wrong", st.reply_len));
                            }
                        }
                        done += 1;
                        first_done.get_or_insert_with(|| clock.now());
                        if a.retry {
                            println!("progress {done}");
                        }
                    }
                    Err(e) if a.retry => {
                        errors += 1;
                        println!("error: {} {tag} failed: {e}", a.op);
                        sinks.remove(&tag);
                    }
                    Err(e) => return Err(format!("{} {tag} failed: {e}", a.op)),
                }
            }
            Ok(Done::Recv(..)) | Err(_) => {}
        }
    }
    let secs = clock.now().saturating_duration_since(t0).as_secs_f64();
    let mib = (a.count * a.size as u64) as f64 / f64::from(1 << 20);
    let stats = driver.stats();
    println!(
        "{}: {} x {} bytes, window {}: {mib:.0} MiB in {secs:.3} s = {:.1} MiB/s (connect+first {:.3} s){}, {errors} errors",
        a.op,
        a.count,
        a.size,
        a.window,
        mib / secs,
        first_done.map_or(0.0, |t| t.saturating_duration_since(t0).as_secs_f64()),
        stats
            .map(|s| format!(
                ", retransmits {}, single copy: placed {}, mapped {}, split {}, overlapped {}, streamed {}, refused {}, ring frames {} (doorbells {})",
                s.fabric.retransmits,
                s.fabric.placed_sent + s.fabric.placed_writes,
                s.fabric.placed_mapped,
                s.fabric.placed_split,
                s.fabric.placed_overlapped,
                s.fabric.placed_streamed,
                s.fabric.placed_refused,
                s.fabric.ring_frames_sent + s.fabric.ring_frames_received,
                s.fabric.ring_doorbells
            ))
            .unwrap_or_default()
    );
    if a.bye {
        driver.send(put_msg(src, dst, to, BYE, 0)).map_err(|e| format!("send refused: {e}"))?;
        loop {
            let left = end.saturating_duration_since(clock.now());
            match rx.recv_timeout(left) {
                Ok(Done::Send(BYE, r)) => {
                    r.map_err(|e| format!("bye failed: {e}"))?;
                    break;
                }
                Ok(_) => {}
                Err(_) => return Err("bye never completed".into()),
            }
        }
    }
    sinks.clear();
    finish(&driver, "client");
    Ok(())
}

/// Many interfaces in one process, each holding one connection to the server.
fn swarm(a: &Args) -> Result<(), String> {
    let to = a.to.ok_or("--to is required")?;
    let mut tunables = load_tunables(a)?;
    // Idle clients: a small transmit pool each.
    tunables.ntx = 16;
    let first = u32::from(a.nid.addr());
    let clock = Clock::new();
    let end = clock.now() + a.deadline;
    // Idle interfaces sleep instead of spinning: hundreds share two cores.
    tunables.busy_poll_usec = 0;
    let mut nis: Vec<(Driver, mpsc::Receiver<Done>)> = Vec::new();
    // Connect in waves of 25, so that hundreds of handshakes do not all compete at once.
    let mut i = 0u32;
    while i < a.nis {
        let wave_end = (i + 25).min(a.nis);
        let wave_start = nis.len();
        for j in i..wave_end {
            let nid = Nid::o2ib(std::net::Ipv4Addr::from(first + j));
            let (d, rx, _up) = start_ni(a, nid, tunables.clone())?;
            let src = ProcessId::new(nid, ProcessId::PID_LUSTRE);
            let dst = ProcessId::new(to, ProcessId::PID_LUSTRE);
            // Tags unique across swarm processes: the interface's address.
            let tag = u64::from(u32::from(nid.addr()));
            d.send(put_msg(src, dst, to, tag, 100)).map_err(|e| format!("send refused: {e}"))?;
            nis.push((d, rx));
        }
        for (k, (_, rx)) in nis.iter().enumerate().skip(wave_start) {
            let left = end.saturating_duration_since(clock.now());
            match rx.recv_timeout(left) {
                Ok(Done::Send(_, Ok(_))) => {}
                Ok(Done::Send(_, Err(e))) => return Err(format!("NI {k}: PUT failed: {e}")),
                _ => return Err(format!("NI {k}: no completion")),
            }
        }
        i = wave_end;
    }
    println!("swarm: {} connected", nis.len());
    // Hold until the server has closed every connection (it shuts down when it has counted).
    for (i, (d, _)) in nis.iter().enumerate() {
        loop {
            let conns = d.stats().map_or(0, |s| s.connections);
            if conns == 0 {
                break;
            }
            if clock.now() >= end {
                return Err(format!("NI {i}: still connected at the deadline"));
            }
            let _ = nis[i].1.recv_timeout(Duration::from_millis(50));
        }
    }
    let mut leaks = 0;
    for (d, _) in &nis {
        d.shutdown();
        let l = d.soft_live_counts().unwrap_or_default();
        leaks += l.qps + l.cqs + l.mrs as usize + l.pds as usize;
    }
    println!("swarm: {} released, live objects after shutdown {leaks}", nis.len());
    Ok(())
}

fn main() -> ExitCode {
    let r = parse().and_then(|a| match a.role.as_str() {
        "serve" => serve(&a),
        "drive" => drive(&a),
        "swarm" => swarm(&a),
        r => Err(format!("unknown role {r}")),
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lnd-node: {e}");
            ExitCode::FAILURE
        }
    }
}
