//! `lnd-objstore`: an example object server and client on `lnet-shim` over the userspace
//! o2iblnd, following Lustre's RPC pattern.
//!
//! ```text
//! lnd-objstore server --nid 127.0.0.1@o2ib --dir DIR [--tunables FILE] [--port UDP]
//!                     [--max-clients N] [--exit-after SECS]
//! lnd-objstore client --nid 127.0.0.2@o2ib --server 127.0.0.1@o2ib --objects N --size BYTES
//!                     [--tunables FILE] [--port UDP] [--concurrency C] [--timeout SECS] [--progress]
//! ```
//!
//! Each RPC is a 64-byte request PUT (with ACK) to the server's request portal naming the
//! operation, the object, its length, the client's bulk match bits and reply match bits. The
//! client posts its bulk buffer (and a reply buffer) first. For a WRITE the server pulls the
//! data with a GET from the client's bulk MD, checks the client's CRC-32 and stores the object
//! as a file; for a READ it pushes the file with a PUT (with ACK) into the client's bulk MD.
//! Then it replies with a 32-byte PUT (status, length, CRC-32) to the client's reply portal.
//! The client writes N objects, reads them back, verifies every CRC and every byte, says BYE,
//! and exits 0 only if all verified. The server serves any number of clients at once, keeps
//! going when one dies mid-transfer (that client's operations fail and are counted), and stops
//! cleanly on SIGINT/SIGTERM, after `--max-clients` BYEs, or after `--exit-after` seconds.
//! See docs/lnet-shim.md.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lnd::clock::Clock;
use lnd::driver::{Driver, DriverConfig, FabricChoice};
use lnd::fabric::soft::SoftConfig;
use lnd::tunables::{Tunables, TunablesError};
use lnet_shim::buffer::Buffer;
use lnet_shim::event::{Errno, Event, EventKind, EventQueue};
use lnet_shim::lnd::Lnd;
use lnet_shim::matching::MdHandle;
use lnet_shim::matching::{ANY_PROCESS, MatchEntry, MdOptions, Threshold, Unlink};
use lnet_shim::nid::{Nid, ProcessId};
use lnet_shim::{
    AckReq, Lnet, LnetConfig, LnetError, Md, NetworkSpec, NetworksError, parse_networks, resolve_nid,
};

/// Requests arrive here (Lustre's `OST_IO_PORTAL`).
const REQUEST_PORTAL: u32 = 6;
/// Clients post reply buffers here (`OSC_REPLY_PORTAL`).
const REPLY_PORTAL: u32 = 4;
/// Clients post bulk buffers here (`OST_BULK_PORTAL`).
const BULK_PORTAL: u32 = 8;
const REQ_MAGIC: u32 = 0x4f42_4a31; // "OBJ1"
const REP_MAGIC: u32 = 0x4f42_4a52; // "OBJR"
const REQ_SIZE: usize = 64;
const REP_SIZE: usize = 32;
/// One request buffer holds this many requests (Lustre's request buffer descriptors).
const REQS_PER_BUFFER: usize = 1024;
/// Request buffers kept posted.
const REQ_BUFFERS: usize = 2;
const MAX_SIZE: u64 = 64 << 20;
/// How often the server looks at signals and deadlines.
const TICK: Duration = Duration::from_millis(100);
/// How long the server lets in-flight operations finish once `--max-clients` said BYE.
const DRAIN: Duration = Duration::from_secs(30);

#[derive(Parser)]
#[command(
    name = "lnd-objstore",
    version,
    about = "An example object store on lnet-shim over the userspace o2iblnd"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve objects stored as files in a directory.
    Server(ServerArgs),
    /// Write objects to a server, read them back and verify them.
    Client(ClientArgs),
}

#[derive(Args)]
struct NetArgs {
    /// This node's NID (127.0.0.1@o2ib), or an IPv4 address on the network of the tunables
    /// file's `networks=` (o2ib0 without one).
    #[arg(long)]
    nid: String,
    /// A ko2iblnd.conf (modprobe.d format) with the LND tunables and `options lnet networks=`.
    #[arg(long)]
    tunables: Option<PathBuf>,
    /// The software fabric's UDP port (RoCEv2's 4791 by default); every node must use the same.
    #[arg(long, default_value_t = 4791)]
    port: u16,
}

#[derive(Args)]
struct ServerArgs {
    #[command(flatten)]
    net: NetArgs,
    /// Where objects are kept (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// Stop after this many clients said BYE.
    #[arg(long)]
    max_clients: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    exit_after: Option<u64>,
}

#[derive(Args)]
struct ClientArgs {
    #[command(flatten)]
    net: NetArgs,
    /// The server's NID.
    #[arg(long)]
    server: String,
    /// Objects to write and read back.
    #[arg(long)]
    objects: u64,
    /// Bytes per object (suffixes K and M for KiB and MiB), 1..=64M.
    #[arg(long, value_parser = parse_size)]
    size: u64,
    /// RPCs in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Seconds without progress before giving up.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Print a line per finished RPC.
    #[arg(long)]
    progress: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.strip_suffix(['K', 'k']) {
        Some(d) => (d, 1 << 10),
        None => match s.strip_suffix(['M', 'm']) {
            Some(d) => (d, 1 << 20),
            None => (s, 1),
        },
    };
    let n: u64 = digits.parse().map_err(|_| format!("'{s}' is not a size (e.g. 4096, 64K, 1M)"))?;
    match n.checked_mul(unit) {
        Some(v) if (1..=MAX_SIZE).contains(&v) => Ok(v),
        _ => Err(format!("size '{s}' must be 1 byte to 64M")),
    }
}

/// Why the program stopped.
#[derive(Debug, thiserror::Error)]
enum ObjError {
    #[error(transparent)]
    Tunables(#[from] TunablesError),
    #[error(transparent)]
    Networks(#[from] NetworksError),
    #[error("LNet: {0}")]
    Lnet(#[from] LnetError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot install the signal handlers")]
    Signals,
    #[error("no progress for {secs} s ({done}/{total} RPCs done)")]
    Timeout { secs: u64, done: u64, total: u64 },
    #[error("{failed} of {total} RPCs failed; first: {first}")]
    Failed { failed: u64, total: u64, first: String },
}

// ---- wire format of the RPCs (little-endian) ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write = 1,
    Read = 2,
    Bye = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Request {
    op: Op,
    xid: u64,
    object: u64,
    length: u64,
    bulk_bits: u64,
    reply_bits: u64,
    cksum: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reply {
    status: i32,
    xid: u64,
    length: u64,
    cksum: u32,
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn le64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Request {
    fn encode(&self) -> [u8; REQ_SIZE] {
        let mut b = [0u8; REQ_SIZE];
        b[0..4].copy_from_slice(&REQ_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&(self.op as u32).to_le_bytes());
        b[8..16].copy_from_slice(&self.xid.to_le_bytes());
        b[16..24].copy_from_slice(&self.object.to_le_bytes());
        b[24..32].copy_from_slice(&self.length.to_le_bytes());
        b[32..40].copy_from_slice(&self.bulk_bits.to_le_bytes());
        b[40..48].copy_from_slice(&self.reply_bits.to_le_bytes());
        b[48..52].copy_from_slice(&self.cksum.to_le_bytes());
        b
    }

    /// Decodes a request; `None` if it is not one (bad magic, unknown op, short).
    fn decode(b: &[u8]) -> Option<Request> {
        if le32(b, 0)? != REQ_MAGIC {
            return None;
        }
        let op = match le32(b, 4)? {
            1 => Op::Write,
            2 => Op::Read,
            3 => Op::Bye,
            _ => return None,
        };
        Some(Request {
            op,
            xid: le64(b, 8)?,
            object: le64(b, 16)?,
            length: le64(b, 24)?,
            bulk_bits: le64(b, 32)?,
            reply_bits: le64(b, 40)?,
            cksum: le32(b, 48)?,
        })
    }
}

impl Reply {
    fn encode(&self) -> [u8; REP_SIZE] {
        let mut b = [0u8; REP_SIZE];
        b[0..4].copy_from_slice(&REP_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.status.to_le_bytes());
        b[8..16].copy_from_slice(&self.xid.to_le_bytes());
        b[16..24].copy_from_slice(&self.length.to_le_bytes());
        b[24..28].copy_from_slice(&self.cksum.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Reply> {
        if le32(b, 0)? != REP_MAGIC {
            return None;
        }
        Some(Reply {
            status: i32::from_le_bytes(le32(b, 4)?.to_le_bytes()),
            xid: le64(b, 8)?,
            length: le64(b, 16)?,
            cksum: le32(b, 24)?,
        })
    }
}

fn crc(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// The content of object `object` of client `nid`: reproducible, different per object.
fn object_data(nid: Nid, object: u64, len: usize) -> Vec<u8> {
    let mut x = (nid.as_u64() ^ object.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

// ---- common setup ----

/// The node's NID and LND tunables from the arguments (and the tunables file).
struct NodeConfig {
    nid: Nid,
    tunables: Tunables,
    /// From the file's `options lnet` lines (`lnet_transaction_timeout`).
    lnet: LnetConfig,
    notes: Vec<String>,
}

fn configure(net: &NetArgs) -> Result<NodeConfig, ObjError> {
    let mut notes = Vec::new();
    let (tunables, lnet, networks) = match &net.tunables {
        Some(path) => {
            let parsed = Tunables::load(path)?;
            for w in &parsed.warnings {
                notes.push(format!("warning: {w}"));
            }
            let networks = match parsed.lnet_option("networks").and_then(|o| o.value.clone()) {
                Some(v) => parse_networks(&v)?,
                None => Vec::new(),
            };
            let lnet = parsed.lnet_config()?;
            (parsed.tunables, lnet, networks)
        }
        None => {
            let mut t = Tunables::default();
            t.finalize()?;
            (t, LnetConfig::default(), Vec::new())
        }
    };
    let nid = resolve_nid(&net.nid, &networks)?;
    Ok(NodeConfig { nid, tunables, lnet, notes })
}

/// Starts LNet with one o2ib NI on the software fabric; LNet's credits are the tunables'
/// `credits` and `peer_credits`, as with ko2iblnd. With `lazy`, that portal is made lazy
/// before the NI comes up (the server's request portal, as ptlrpc's: a request that arrives
/// before the server has posted its buffers, or while they are all full, waits for one
/// instead of being dropped).
fn start_lnet(node: NodeConfig, port: u16, lazy: Option<u32>) -> Result<Lnet, ObjError> {
    let nid = node.nid;
    let (credits, peer_credits) = (node.tunables.credits, node.tunables.peer_credits);
    let config = DriverConfig {
        nid,
        tunables: node.tunables,
        fabric: FabricChoice::Soft(SoftConfig { udp_port: port, ..SoftConfig::default() }),
        seed: None,
    };
    let lnet = Lnet::new(node.lnet)?;
    if let Some(portal) = lazy {
        lnet.set_lazy_portal(portal)?;
    }
    lnet.add_ni(nid, credits, peer_credits, |up| {
        Driver::start(config, up).map(|d| Arc::new(d) as Arc<dyn Lnd>)
    })?;
    Ok(lnet)
}

/// What an event's `user_ptr` names: an RPC (or server operation) and which of its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Request,
    Bulk,
    Reply,
}

fn tag(id: u64, part: Part) -> u64 {
    (id << 2)
        | match part {
            Part::Request => 0,
            Part::Bulk => 1,
            Part::Reply => 2,
        }
}

fn untag(user_ptr: u64) -> (u64, Option<Part>) {
    let part = match user_ptr & 3 {
        0 => Some(Part::Request),
        1 => Some(Part::Bulk),
        2 => Some(Part::Reply),
        _ => None,
    };
    (user_ptr >> 2, part)
}

fn mib_per_s(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 { bytes as f64 / (1 << 20) as f64 / secs } else { 0.0 }
}

// ---- server ----

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() -> Result<(), ObjError> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler = on_signal as extern "C" fn(libc::c_int);
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let old = unsafe { libc::signal(sig, handler as libc::sighandler_t) };
        if old == libc::SIG_ERR {
            return Err(ObjError::Signals);
        }
    }
    Ok(())
}

/// One request being served.
struct ServerOp {
    client: ProcessId,
    req: Request,
    /// The bulk buffer (object data).
    data: Option<Arc<Buffer>>,
    /// Set once the reply has been sent; the operation ends with the reply's SEND event.
    replied: Option<i32>,
}

struct Server {
    lnet: Lnet,
    dir: PathBuf,
    q: EventQueue,
    ops: HashMap<u64, ServerOp>,
    next_op: u64,
    /// Posted request buffers by id.
    rq_buffers: HashMap<u64, Arc<Buffer>>,
    next_rqbd: u64,
    writes: u64,
    reads: u64,
    bytes: u64,
    failed: u64,
    byes: u64,
    clients: std::collections::HashSet<Nid>,
}

/// Request buffer ids live in their own range of `user_ptr` values.
const RQBD_BASE: u64 = 1 << 62;

impl Server {
    /// Posts a request buffer: a large MD on the request portal, each request taking
    /// `REQ_SIZE` bytes (`max_size`), unlinked when full.
    fn post_request_buffer(&mut self) -> Result<(), ObjError> {
        let id = self.next_rqbd;
        self.next_rqbd += 1;
        let buf = Arc::new(Buffer::new(REQ_SIZE * REQS_PER_BUFFER));
        let md = Md::contiguous(buf.clone())
            .with_options(MdOptions::OP_PUT)
            .with_max_size(REQ_SIZE as u64)
            .with_user_ptr(RQBD_BASE | id)
            .with_events(self.q.clone());
        let entry = MatchEntry::new(ANY_PROCESS, 0).ignoring(u64::MAX).with_unlink(Unlink::Auto);
        self.lnet.attach(REQUEST_PORTAL, entry, md, Unlink::Auto)?;
        self.rq_buffers.insert(id, buf);
        Ok(())
    }

    fn handle(&mut self, e: Event) -> Result<(), ObjError> {
        if e.user_ptr & RQBD_BASE != 0 {
            let id = e.user_ptr & !RQBD_BASE;
            if e.kind == EventKind::Put && e.status.is_ok() {
                let bytes = self
                    .rq_buffers
                    .get(&id)
                    .and_then(|b| b.to_vec(e.offset as usize, (e.mlength as usize).min(REQ_SIZE)).ok());
                match bytes.as_deref().and_then(Request::decode) {
                    Some(req) => self.start(e.initiator, req),
                    None => eprintln!("server: malformed request from {}", e.initiator.nid),
                }
            }
            if e.unlinked {
                self.rq_buffers.remove(&id);
                self.post_request_buffer()?;
            }
            return Ok(());
        }
        let (id, part) = untag(e.user_ptr);
        match part {
            Some(Part::Bulk) => self.bulk_event(id, &e),
            Some(Part::Reply) => self.reply_event(id, &e),
            _ => {}
        }
        Ok(())
    }

    fn start(&mut self, client: ProcessId, req: Request) {
        let id = self.next_op;
        self.next_op += 1;
        self.clients.insert(client.nid);
        self.ops.insert(id, ServerOp { client, req, data: None, replied: None });
        let r = match req.op {
            Op::Bye => {
                self.byes += 1;
                Err(0)
            }
            Op::Write => self.start_write(id),
            Op::Read => self.start_read(id),
        };
        if let Err(status) = r {
            self.reply(id, status, 0, 0);
        }
    }

    fn bind_bulk(&mut self, id: u64, data: Arc<Buffer>) -> Result<MdHandle, i32> {
        let md = Md::contiguous(data.clone())
            .with_threshold(Threshold::Count(2))
            .with_user_ptr(tag(id, Part::Bulk))
            .with_events(self.q.clone());
        let h = self.lnet.md_bind(md, Unlink::Auto).map_err(|_| Errno::ENOMEM.as_i32())?;
        if let Some(op) = self.ops.get_mut(&id) {
            op.data = Some(data);
        }
        Ok(h)
    }

    /// WRITE: pull the client's data with a GET from its bulk MD.
    fn start_write(&mut self, id: u64) -> Result<(), i32> {
        let op = self.ops.get(&id).ok_or(Errno::EINVAL.as_i32())?;
        let (client, req) = (op.client, op.req);
        if req.length == 0 || req.length > MAX_SIZE {
            return Err(Errno::EINVAL.as_i32());
        }
        let h = self.bind_bulk(id, Arc::new(Buffer::new(req.length as usize)))?;
        let started = self.lnet.get(h, client, BULK_PORTAL, req.bulk_bits, 0);
        self.unbind_unless_started(h, started)
    }

    /// The result of starting a bulk transfer on MD `h`; an MD nothing started on is unlinked
    /// (LNet leaves it bound, and its buffer with it).
    fn unbind_unless_started(&self, h: MdHandle, started: Result<(), LnetError>) -> Result<(), i32> {
        started.map_err(|_| {
            // Refused too only once LNet is shut down, when its MDs go with it.
            let _ = self.lnet.md_unlink(h);
            Errno::EIO.as_i32()
        })
    }

    /// READ: push the stored object into the client's bulk MD with a PUT (ACK requested).
    fn start_read(&mut self, id: u64) -> Result<(), i32> {
        let op = self.ops.get(&id).ok_or(Errno::EINVAL.as_i32())?;
        let (client, req) = (op.client, op.req);
        let path = self.object_path(client.nid, req.object);
        let data = std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Errno::ENOENT.as_i32(),
            _ => Errno::EIO.as_i32(),
        })?;
        if data.len() as u64 > req.length {
            return Err(Errno::EOVERFLOW.as_i32());
        }
        let h = self.bind_bulk(id, Arc::new(Buffer::from_slice(&data)))?;
        let started = self.lnet.put(h, AckReq::Ack, client, BULK_PORTAL, req.bulk_bits, 0, 0);
        self.unbind_unless_started(h, started)
    }

    fn object_path(&self, client: Nid, object: u64) -> PathBuf {
        self.dir.join(format!("{client}-{object}.obj"))
    }

    /// The bulk transfer's final event (REPLY of the GET, ACK of the PUT).
    fn bulk_event(&mut self, id: u64, e: &Event) {
        let final_event = matches!(e.kind, EventKind::Reply | EventKind::Ack);
        if !final_event {
            return;
        }
        let Some(op) = self.ops.get(&id) else { return };
        let (client, req) = (op.client, op.req);
        let data = op.data.clone();
        let result = match (e.status, req.op) {
            (Err(errno), _) => {
                eprintln!(
                    "server: {:?} of object {} for {}: bulk failed: {errno}",
                    req.op, req.object, client.nid
                );
                Err(errno.as_i32())
            }
            (Ok(()), Op::Write) => self.finish_write(client.nid, req, e.mlength, data),
            (Ok(()), _) => {
                let len = data.as_ref().map_or(0, |d| d.len());
                let bytes = data.and_then(|d| d.to_vec(0, len).ok()).unwrap_or_default();
                self.reads += 1;
                self.bytes += len as u64;
                Ok((len as u64, crc(&bytes)))
            }
        };
        match result {
            Ok((len, sum)) => self.reply(id, 0, len, sum),
            Err(status) => self.reply(id, status, 0, 0),
        }
    }

    fn finish_write(
        &mut self,
        client: Nid,
        req: Request,
        got: u64,
        data: Option<Arc<Buffer>>,
    ) -> Result<(u64, u32), i32> {
        let data = data.ok_or(Errno::EIO.as_i32())?;
        if got != req.length {
            return Err(Errno::EPROTO.as_i32());
        }
        let bytes = data.to_vec(0, got as usize).map_err(|_| Errno::EIO.as_i32())?;
        let sum = crc(&bytes);
        if sum != req.cksum {
            eprintln!(
                "server: object {} from {client}: checksum {sum:#010x}, client said {:#010x}",
                req.object, req.cksum
            );
            return Err(Errno::EIO.as_i32());
        }
        let path = self.object_path(client, req.object);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path)).map_err(|e| {
            eprintln!("server: cannot store {}: {e}", path.display());
            Errno::EIO.as_i32()
        })?;
        self.writes += 1;
        self.bytes += got;
        Ok((got, sum))
    }

    /// Sends the reply PUT; the operation ends with its SEND event.
    fn reply(&mut self, id: u64, status: i32, length: u64, cksum: u32) {
        let Some(op) = self.ops.get_mut(&id) else { return };
        op.replied = Some(status);
        let (client, req) = (op.client, op.req);
        let rep = Reply { status, xid: req.xid, length, cksum };
        let md = Md::contiguous(Arc::new(Buffer::from_slice(&rep.encode())))
            .with_threshold(Threshold::Count(1))
            .with_user_ptr(tag(id, Part::Reply))
            .with_events(self.q.clone());
        let sent = self.lnet.md_bind(md, Unlink::Auto).and_then(|h| {
            self.lnet.put(h, AckReq::NoAck, client, REPLY_PORTAL, req.reply_bits, 0, 0).inspect_err(|_| {
                let _ = self.lnet.md_unlink(h);
            })
        });
        if let Err(e) = sent {
            eprintln!("server: cannot reply to {}: {e}", client.nid);
            self.end(id, false);
        }
    }

    fn reply_event(&mut self, id: u64, e: &Event) {
        if e.kind != EventKind::Send {
            return;
        }
        let status = self.ops.get(&id).and_then(|o| o.replied).unwrap_or(0);
        if let Err(errno) = e.status {
            if let Some(op) = self.ops.get(&id) {
                eprintln!("server: reply to {} for xid {} failed: {errno}", op.client.nid, op.req.xid);
            }
        }
        self.end(id, e.status.is_ok() && status == 0);
    }

    fn end(&mut self, id: u64, ok: bool) {
        if let Some(op) = self.ops.remove(&id) {
            if !ok && op.req.op != Op::Bye {
                self.failed += 1;
            }
        }
    }
}

fn run_server(args: &ServerArgs) -> Result<(), ObjError> {
    std::fs::create_dir_all(&args.dir).map_err(|source| ObjError::Io {
        what: "cannot create",
        path: args.dir.clone(),
        source,
    })?;
    install_signal_handlers()?;
    let node = configure(&args.net)?;
    for n in &node.notes {
        eprintln!("server: {n}");
    }
    let nid = node.nid;
    let lnet = start_lnet(node, args.net.port, Some(REQUEST_PORTAL))?;
    let mut s = Server {
        lnet: lnet.clone(),
        dir: args.dir.clone(),
        q: EventQueue::new(1 << 16),
        ops: HashMap::new(),
        next_op: 1,
        rq_buffers: HashMap::new(),
        next_rqbd: 0,
        writes: 0,
        reads: 0,
        bytes: 0,
        failed: 0,
        byes: 0,
        clients: std::collections::HashSet::new(),
    };
    for _ in 0..REQ_BUFFERS {
        s.post_request_buffer()?;
    }
    let clock = Clock::new();
    let deadline = args.exit_after.map(|secs| Duration::from_secs(secs).as_nanos() as u64);
    println!("objstore server {nid} ready, objects in {}", args.dir.display());
    // Once the last expected client said BYE, operations still in flight (its BYE reply, or
    // those of clients that died) get DRAIN to finish.
    let mut drain_until: Option<u64> = None;
    let why = loop {
        let now = clock.now().as_nanos();
        if STOP.load(Ordering::SeqCst) {
            break "signal";
        }
        if args.max_clients.is_some_and(|n| s.byes >= n) {
            let until = *drain_until.get_or_insert(now + DRAIN.as_nanos() as u64);
            if s.ops.is_empty() || now >= until {
                break "max clients";
            }
        }
        if deadline.is_some_and(|d| now >= d) {
            break "exit-after";
        }
        if let Some(e) = s.q.wait(TICK) {
            s.handle(e)?;
            while let Some(e) = s.q.poll() {
                s.handle(e)?;
            }
        }
        if s.q.take_overflow() > 0 {
            eprintln!("server: event queue overflowed; some operations may be lost");
        }
    };
    let in_flight = s.ops.len() as u64;
    eprint!("{}", lnet.stats());
    lnet.shutdown();
    println!(
        "objstore server {nid} stopped ({why}): {} clients, {} writes, {} reads, {} MiB, {} failed, {in_flight} aborted",
        s.clients.len(),
        s.writes,
        s.reads,
        s.bytes >> 20,
        s.failed,
    );
    Ok(())
}

// ---- client ----

/// One RPC of the client.
struct Rpc {
    req: Request,
    /// The bulk buffer (WRITE: the data; READ: where it lands).
    bulk: Option<Arc<Buffer>>,
    reply_buf: Arc<Buffer>,
    /// Events still expected: request SEND + ACK, bulk GET/PUT, reply PUT.
    waiting: u32,
    reply: Option<Reply>,
    bulk_len: Option<u64>,
    error: Option<String>,
    /// The bulk and reply MDs, unlinked when the RPC ends (already gone if it went well).
    posted: Vec<MdHandle>,
}

struct Client {
    lnet: Lnet,
    nid: Nid,
    server: ProcessId,
    q: EventQueue,
    rpcs: HashMap<u64, Rpc>,
    next_xid: u64,
    size: u64,
}

impl Client {
    /// Posts the RPC's buffers, then sends its request.
    fn start(&mut self, op: Op, object: u64) -> Result<u64, ObjError> {
        let xid = self.next_xid;
        self.next_xid += 1;
        let len = if op == Op::Bye { 0 } else { self.size };
        let data = (op == Op::Write).then(|| object_data(self.nid, object, len as usize));
        let cksum = data.as_deref().map_or(0, crc);
        let req = Request { op, xid, object, length: len, bulk_bits: xid, reply_bits: xid, cksum };
        let mut waiting = 3; // request SEND + ACK, reply
        let bulk = match (op, data) {
            (Op::Write, Some(d)) => Some((Arc::new(Buffer::from_slice(&d)), MdOptions::OP_GET)),
            (Op::Read, _) => Some((Arc::new(Buffer::new(len as usize)), MdOptions::OP_PUT)),
            _ => None,
        };
        let only_server = MatchEntry::new(self.server, xid).with_unlink(Unlink::Auto);
        let mut posted = Vec::new();
        if let Some((buf, options)) = &bulk {
            let md = Md::contiguous(buf.clone())
                .with_options(*options)
                .with_threshold(Threshold::Count(1))
                .with_user_ptr(tag(xid, Part::Bulk))
                .with_events(self.q.clone());
            match self.lnet.attach(BULK_PORTAL, only_server, md, Unlink::Auto) {
                Ok((_, h)) => posted.push(h),
                Err(e) => return Err(self.unpost(&posted, e)),
            }
            waiting += 1;
        }
        let reply_buf = Arc::new(Buffer::new(REP_SIZE));
        let md = Md::contiguous(reply_buf.clone())
            .with_options(MdOptions::OP_PUT)
            .with_threshold(Threshold::Count(1))
            .with_user_ptr(tag(xid, Part::Reply))
            .with_events(self.q.clone());
        match self.lnet.attach(REPLY_PORTAL, only_server, md, Unlink::Auto) {
            Ok((_, h)) => posted.push(h),
            Err(e) => return Err(self.unpost(&posted, e)),
        }
        let md = Md::contiguous(Arc::new(Buffer::from_slice(&req.encode())))
            .with_threshold(Threshold::Count(2))
            .with_user_ptr(tag(xid, Part::Request))
            .with_events(self.q.clone());
        let h = match self.lnet.md_bind(md, Unlink::Auto) {
            Ok(h) => h,
            Err(e) => return Err(self.unpost(&posted, e)),
        };
        if let Err(e) = self.lnet.put(h, AckReq::Ack, self.server, REQUEST_PORTAL, 0, 0, 0) {
            posted.push(h);
            return Err(self.unpost(&posted, e));
        }
        self.rpcs.insert(
            xid,
            Rpc {
                req,
                bulk: bulk.map(|(b, _)| b),
                reply_buf,
                waiting,
                reply: None,
                bulk_len: None,
                error: None,
                posted,
            },
        );
        Ok(xid)
    }

    /// Takes down the MDs of an RPC that could not be started (LNet leaves them posted), and
    /// hands back why.
    fn unpost(&self, posted: &[MdHandle], e: LnetError) -> ObjError {
        for h in posted {
            // Refused only once LNet is shut down, when its MDs go with it.
            let _ = self.lnet.md_unlink(*h);
        }
        e.into()
    }

    /// Applies an event; returns the xid of an RPC that is now complete.
    fn handle(&mut self, e: &Event) -> Option<u64> {
        let (xid, part) = untag(e.user_ptr);
        let rpc = self.rpcs.get_mut(&xid)?;
        rpc.waiting = rpc.waiting.saturating_sub(1);
        if let Err(errno) = e.status {
            let what = match (part, e.kind) {
                (Some(Part::Request), EventKind::Ack) if errno == Errno::ENODATA => {
                    "request dropped by the server".to_owned()
                }
                _ => format!("{:?} {:?} failed", part.unwrap_or(Part::Request), e.kind),
            };
            rpc.error.get_or_insert(format!("{what}: {errno}"));
            // A request that never arrived gets no bulk and no reply: stop waiting for them.
            if part == Some(Part::Request) {
                rpc.waiting = 0;
            }
        }
        match (part, e.kind) {
            (Some(Part::Bulk), EventKind::Get | EventKind::Put) => rpc.bulk_len = Some(e.mlength),
            (Some(Part::Reply), EventKind::Put) if e.status.is_ok() => {
                let bytes = rpc.reply_buf.to_vec(0, REP_SIZE).unwrap_or_default();
                rpc.reply = Reply::decode(&bytes);
                if let Some(r) = rpc.reply {
                    if r.status != 0 {
                        // An error reply: the server did not touch the bulk buffer.
                        if rpc.bulk.is_some() && rpc.bulk_len.is_none() {
                            rpc.waiting = rpc.waiting.saturating_sub(1);
                        }
                    }
                }
            }
            _ => {}
        }
        (rpc.waiting == 0).then_some(xid)
    }

    /// Checks a finished RPC: `Ok` with the bytes moved, or why it failed.
    fn verify(&mut self, xid: u64) -> Result<u64, String> {
        let rpc = self.rpcs.remove(&xid).ok_or("unknown RPC")?;
        for h in &rpc.posted {
            // Still there only if the RPC failed: take it down (a stale handle is fine).
            let _ = self.lnet.md_unlink(*h);
        }
        let req = rpc.req;
        if let Some(e) = rpc.error {
            return Err(format!("{:?} object {}: {e}", req.op, req.object));
        }
        let rep = rpc.reply.ok_or_else(|| format!("{:?} object {}: malformed reply", req.op, req.object))?;
        if rep.xid != xid {
            return Err(format!("reply for xid {} carries xid {}", xid, rep.xid));
        }
        if rep.status != 0 {
            let errno = Errno::from_raw(rep.status).map_or(rep.status.to_string(), |e| e.to_string());
            return Err(format!("{:?} object {}: server says {errno}", req.op, req.object));
        }
        match req.op {
            Op::Bye => Ok(0),
            Op::Write => {
                if rep.length != req.length || rep.cksum != req.cksum {
                    return Err(format!(
                        "WRITE object {}: server stored {} bytes with CRC {:#010x}, sent {} with {:#010x}",
                        req.object, rep.length, rep.cksum, req.length, req.cksum
                    ));
                }
                Ok(req.length)
            }
            Op::Read => {
                let len = rpc.bulk_len.unwrap_or(0);
                let got = rpc.bulk.and_then(|b| b.to_vec(0, len as usize).ok()).unwrap_or_default();
                let want = object_data(self.nid, req.object, req.length as usize);
                if len != req.length || rep.length != req.length {
                    return Err(format!(
                        "READ object {}: {len} bytes arrived, expected {}",
                        req.object, req.length
                    ));
                }
                if crc(&got) != rep.cksum || rep.cksum != crc(&want) {
                    return Err(format!("READ object {}: CRC mismatch", req.object));
                }
                if got != want {
                    return Err(format!("READ object {}: bytes differ", req.object));
                }
                Ok(len)
            }
        }
    }

    /// Runs `ops` keeping `window` RPCs in flight; counts verified and failed ones.
    fn run(&mut self, ops: &[(Op, u64)], args: &ClientArgs, tally: &mut Tally) -> Result<(), ObjError> {
        let mut next = 0;
        let mut in_flight = 0usize;
        let window = args.concurrency.max(1);
        while next < ops.len() || in_flight > 0 {
            while next < ops.len() && in_flight < window {
                let (op, object) = ops[next];
                self.start(op, object)?;
                next += 1;
                in_flight += 1;
            }
            let Some(e) = self.q.wait(Duration::from_secs(args.timeout)) else {
                return Err(ObjError::Timeout { secs: args.timeout, done: tally.done, total: tally.total });
            };
            if let Some(xid) = self.handle(&e) {
                in_flight -= 1;
                tally.done += 1;
                match self.verify(xid) {
                    Ok(bytes) => {
                        tally.bytes += bytes;
                        tally.verified += 1;
                    }
                    Err(why) => {
                        eprintln!("client {}: {why}", self.nid);
                        tally.first_error.get_or_insert(why);
                        tally.failed += 1;
                    }
                }
                if args.progress {
                    println!("progress {}/{}", tally.done, tally.total);
                }
            }
        }
        Ok(())
    }
}

#[derive(Default)]
struct Tally {
    total: u64,
    done: u64,
    verified: u64,
    failed: u64,
    bytes: u64,
    first_error: Option<String>,
}

fn run_client(args: &ClientArgs) -> Result<(), ObjError> {
    let node = configure(&args.net)?;
    for n in &node.notes {
        eprintln!("client: {n}");
    }
    let nid = node.nid;
    let own_net = [NetworkSpec { net: nid.net(), interfaces: Vec::new() }];
    let server_nid = resolve_nid(&args.server, &own_net)?;
    let lnet = start_lnet(node, args.net.port, None)?;
    let mut c = Client {
        lnet: lnet.clone(),
        nid,
        server: ProcessId::new(server_nid, ProcessId::PID_LUSTRE),
        q: EventQueue::new(1 << 16),
        rpcs: HashMap::new(),
        next_xid: 1,
        size: args.size,
    };
    let clock = Clock::new();
    let mut tally = Tally { total: 2 * args.objects + 1, ..Tally::default() };
    let writes: Vec<(Op, u64)> = (0..args.objects).map(|o| (Op::Write, o)).collect();
    let reads: Vec<(Op, u64)> = (0..args.objects).map(|o| (Op::Read, o)).collect();
    // Writes complete before any read starts (a read may otherwise overtake its write).
    c.run(&writes, args, &mut tally)?;
    c.run(&reads, args, &mut tally)?;
    c.run(&[(Op::Bye, 0)], args, &mut tally)?;
    let secs = clock.now().as_nanos() as f64 / 1e9;
    lnet.shutdown();
    if tally.failed > 0 {
        return Err(ObjError::Failed {
            failed: tally.failed,
            total: tally.total,
            first: tally.first_error.unwrap_or_default(),
        });
    }
    println!(
        "objstore client {nid}: wrote and read back {} objects of {} bytes, all verified (CRC-32 and bytes); {} MiB in {secs:.2} s ({:.1} MiB/s)",
        args.objects,
        args.size,
        tally.bytes >> 20,
        mib_per_s(tally.bytes, secs)
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.cmd {
        Cmd::Server(a) => run_server(a),
        Cmd::Client(a) => run_client(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lnd-objstore: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_reject_garbage() {
        let req = Request {
            op: Op::Read,
            xid: 7,
            object: 9,
            length: 1 << 20,
            bulk_bits: 7,
            reply_bits: 7,
            cksum: 0xdead_beef,
        };
        assert_eq!(Request::decode(&req.encode()), Some(req));
        let rep = Reply { status: -5, xid: 7, length: 3, cksum: 1 };
        assert_eq!(Reply::decode(&rep.encode()), Some(rep));
        assert_eq!(Request::decode(&[0; 10]), None);
        assert_eq!(Request::decode(&rep.encode()), None);
        let mut bad = req.encode();
        bad[4] = 9;
        assert_eq!(Request::decode(&bad), None);
    }

    #[test]
    fn an_rpc_that_cannot_start_leaves_no_md_behind() {
        // No interface reaches the server: the buffers are posted, the request's PUT is refused.
        let lnet = Lnet::new(LnetConfig::default()).unwrap();
        let server = ProcessId::new("127.0.0.9@o2ib".parse().unwrap(), ProcessId::PID_LUSTRE);
        let mut client = Client {
            lnet: lnet.clone(),
            nid: "127.0.0.8@o2ib".parse().unwrap(),
            server,
            q: EventQueue::new(16),
            rpcs: HashMap::new(),
            next_xid: 1,
            size: 4096,
        };
        for op in [Op::Write, Op::Read, Op::Bye] {
            match client.start(op, 1) {
                Err(ObjError::Lnet(LnetError::NoRoute { target })) => assert_eq!(target, server),
                other => panic!("{op:?}: {other:?}"),
            }
            assert_eq!(lnet.stats().mds, 0, "{op:?}: MDs left bound");
            assert!(client.rpcs.is_empty());
        }
    }

    #[test]
    fn sizes_and_tags() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("65M").is_err());
        assert!(parse_size("x").is_err());
        for part in [Part::Request, Part::Bulk, Part::Reply] {
            assert_eq!(untag(tag(12345, part)), (12345, Some(part)));
        }
        let nid: Nid = "127.0.0.2@o2ib".parse().unwrap();
        assert_eq!(object_data(nid, 1, 100), object_data(nid, 1, 100));
        assert_ne!(object_data(nid, 1, 100), object_data(nid, 2, 100));
        assert_eq!(object_data(nid, 1, 13).len(), 13);
    }
}
