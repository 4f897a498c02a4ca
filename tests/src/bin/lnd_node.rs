//! `lnd-node`: one o2iblnd interface in its own process, for two-process tests over real UDP.
//!
//! ```text
//! lnd-node serve --nid 127.0.0.2@o2ib [--port P] [--tunables FILE] [--expect N] [--deadline-secs S]
//! lnd-node drive --nid 127.0.0.1@o2ib --to 127.0.0.2@o2ib --op put|get --size BYTES --count N --window W [--port P]
//! ```
//! `serve` accepts any PUT into a fresh sink and checks every byte against the pattern its
//! match bits name; it answers any GET with that pattern. It exits 0 after `--expect` verified
//! PUTs and GETs (or at its deadline: non-zero). `drive` keeps `W` operations in flight, checks
//! every GET's bytes, and prints the bandwidth.

use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lnd::clock::Clock;
use lnd::driver::{Driver, DriverConfig, FabricChoice};
use lnd::fabric::soft::SoftConfig;
use lnd::tunables::Tunables;
use lnet_shim::buffer::Buffer;
use lnet_shim::hdr::{GetMsg, LnetHdr, LnetMsg, PutMsg, WireHandle};
use lnet_shim::lnd::{Frag, Lnd, LndError, LndSend, LndUpcalls, RecvDisposition, SendStatus};
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
}

impl LndUpcalls for Upcalls {
    fn recv(&self, _from: Nid, hdr: &LnetHdr, _rdma: bool) -> RecvDisposition {
        match hdr.msg {
            LnetMsg::Put(p) => {
                let len = hdr.payload_length as usize;
                let buf = Arc::new(Buffer::new(len));
                self.sinks.lock().unwrap().insert(p.match_bits, (buf.clone(), len));
                RecvDisposition::Sink { frags: vec![Frag::whole(buf)], mlength: len, token: p.match_bits }
            }
            LnetMsg::Get(g) => {
                let len = g.sink_length as usize;
                let buf = Arc::new(Buffer::from_slice(&pattern(g.match_bits, len)));
                RecvDisposition::Source { frags: vec![Frag::whole(buf)], token: g.match_bits | 1 << 63 }
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
}

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
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(a)
}

fn start(a: &Args) -> Result<(Driver, mpsc::Receiver<Done>, Arc<Upcalls>), String> {
    let tunables = match &a.tunables {
        Some(path) => Tunables::load(std::path::Path::new(path)).map_err(|e| e.to_string())?.tunables,
        None => {
            let mut t = Tunables::default();
            t.finalize().map_err(|e| e.to_string())?;
            t
        }
    };
    let (tx, rx) = mpsc::channel();
    let up = Arc::new(Upcalls { sinks: Mutex::new(Default::default()), tx: Mutex::new(tx) });
    let cfg = DriverConfig {
        nid: a.nid,
        tunables,
        fabric: FabricChoice::Soft(SoftConfig { udp_port: a.port, ..SoftConfig::default() }),
        seed: None,
    };
    let d = Driver::start(cfg, up.clone()).map_err(|e| e.to_string())?;
    Ok((d, rx, up))
}

fn serve(a: &Args) -> Result<(), String> {
    let (driver, rx, up) = start(a)?;
    println!("serving on {}", a.nid);
    let clock = Clock::new();
    let end = clock.now() + a.deadline;
    let (mut puts, mut gets) = (0u64, 0u64);
    while a.expect == 0 || puts + gets < a.expect {
        let left = end.saturating_duration_since(clock.now());
        if left.is_zero() {
            return Err(format!("deadline: verified {puts} PUTs and {gets} GETs of {}", a.expect));
        }
        match rx.recv_timeout(left) {
            Ok(Done::Recv(token, Ok(n))) if token >> 63 == 0 => {
                let (buf, len) = up.sinks.lock().unwrap().remove(&token).ok_or("unknown PUT")?;
                if n != len || !check(&buf, token, len) {
                    return Err(format!("PUT {token}: {n} of {len} bytes, content wrong"));
                }
                puts += 1;
            }
            Ok(Done::Recv(_, Ok(_))) => gets += 1,
            Ok(Done::Recv(token, Err(e))) => return Err(format!("receive {token} failed: {e}")),
            Ok(Done::Send(..)) => {}
            Err(_) => {}
        }
    }
    println!("server: verified {puts} PUTs and {gets} GETs");
    // Let the last completions reach the peer before the connection goes.
    let _ = rx.recv_timeout(Duration::from_millis(300));
    driver.shutdown();
    Ok(())
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
    let (mut posted, mut done) = (0u64, 0u64);
    let mut first_done = None;
    while done < a.count {
        while posted < a.count && posted - done < a.window {
            let tag = posted + 1;
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
                    payload: vec![],
                    get_sink: Some(vec![Frag::whole(sink)]),
                    token: tag,
                }
            } else {
                let hdr = LnetHdr {
                    dest: dst,
                    src,
                    payload_length: a.size as u32,
                    msg: LnetMsg::Put(PutMsg {
                        ack_wmd: WireHandle::NONE,
                        match_bits: tag,
                        hdr_data: 0,
                        ptl_index: 4,
                        offset: 0,
                    }),
                };
                let data = Arc::new(Buffer::from_slice(&pattern(tag, a.size)));
                LndSend { target: to, hdr, payload: vec![Frag::whole(data)], get_sink: None, token: tag }
            };
            driver.send(msg).map_err(|e| format!("send refused: {e}"))?;
            posted += 1;
        }
        let left = end.saturating_duration_since(clock.now());
        if left.is_zero() {
            return Err(format!("deadline: {done} of {} done", a.count));
        }
        match rx.recv_timeout(left) {
            Ok(Done::Send(tag, Ok(st))) => {
                if a.op == "get" {
                    let sink = sinks.remove(&tag).ok_or("unknown GET")?;
                    if st.reply_len != Some(a.size) || !check(&sink, tag, a.size) {
                        return Err(format!("GET {tag}: reply {:?}, content wrong", st.reply_len));
                    }
                }
                done += 1;
                first_done.get_or_insert_with(|| clock.now());
            }
            Ok(Done::Send(tag, Err(e))) => return Err(format!("{} {tag} failed: {e}", a.op)),
            Ok(Done::Recv(..)) | Err(_) => {}
        }
    }
    let secs = clock.now().saturating_duration_since(t0).as_secs_f64();
    let mib = (a.count * a.size as u64) as f64 / f64::from(1 << 20);
    let stats = driver.stats();
    println!(
        "{}: {} x {} bytes, window {}: {mib:.0} MiB in {secs:.3} s = {:.1} MiB/s (connect+first {:.3} s){}",
        a.op,
        a.count,
        a.size,
        a.window,
        mib / secs,
        first_done.map_or(0.0, |t| t.saturating_duration_since(t0).as_secs_f64()),
        stats
            .map(|s| format!(
                ", retransmits {}, single copy: placed {}, refused {}",
                s.fabric.retransmits,
                s.fabric.placed_sent + s.fabric.placed_writes,
                s.fabric.placed_refused
            ))
            .unwrap_or_default()
    );
    driver.shutdown();
    Ok(())
}

fn main() -> ExitCode {
    let r = parse().and_then(|a| match a.role.as_str() {
        "serve" => serve(&a),
        "drive" => drive(&a),
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
