//! The real-NIC fabric: [`crate::fabric::Device`] on libibverbs, for InfiniBand and RoCE HCAs.
//!
//! Built on `ibverbs-sys` (raw FFI; the safe `ibverbs` 0.9.2 API has no RDMA WRITE, no
//! registration of caller memory and no completion channel). Behind the cargo feature `verbs`,
//! off by default; `docs/verbs.md` says how to build, configure and smoke-test it.
//!
//! **Status: built and unit-tested on machines without RDMA; never run on hardware.** The code
//! follows `verbs.h` and the man pages call by call; the pure parts (value mappings, attribute
//! masks, GID choice, the MAD side channel) are tested here, the rest is tested only by the
//! `#[ignore]`d hardware tests in `tests.rs`.
//!
//! # Contract (on top of the one in [`crate::fabric`])
//! * **Opening** ([`VerbsDevice::open`]): the named device, or the first device with an ACTIVE
//!   port whose GID table has a usable GID ([`gid`]). Anything that leaves no usable port is
//!   [`FabricError::NoDevice`] with the cause, e.g. `no RDMA device: libibverbs found no
//!   devices (ENOSYS: the kernel has no RDMA support)`. Never a panic.
//! * **Progress**: the hardware runs the transport, so [`Device::progress`] only drives the
//!   MAD side channel ([`side`]) and drains async events. [`Device::pollable_fds`] is one fd:
//!   an internal `mio::Poll` holding the side channel's sockets and the device's async-event
//!   fd (made non-blocking). Completion channels are per CQ ([`CompletionQueue::event_fd`](crate::fabric::CompletionQueue::event_fd),
//!   non-blocking).
//! * **Completions**: `poll` calls the provider's `poll_cq` in batches of 32; `req_notify`
//!   is `ibv_req_notify_cq`; `get_event` is `ibv_get_cq_event` + `ibv_ack_cq_events` and
//!   returns false on `EAGAIN`. Arm, get the event, re-arm, re-poll, as the trait says.
//! * **Memory**: `reg_mr` registers caller memory with `ibv_reg_mr`. Posting is safe because
//!   the HCA checks every lkey and range; the one case the CPU touches memory at post time,
//!   **inline** sends, is checked here against the table of live registrations (held locked
//!   across the post so a region cannot be deregistered mid-copy).
//! * **Queue pairs**: RC. Requested capacities are clamped to the device limits (the inline
//!   limit is probed once at open: `ibv_device_attr` has none); the provider's actual
//!   capacities are reported. `ENOMEM`/`EAGAIN`/`EINVAL` from `ibv_create_qp` are
//!   [`FabricError::Resource`]. `modify` builds the attribute masks of [`map::modify_attr`];
//!   `post_send`/`post_recv` chain the WRs and call the provider through `(*context).ops`; a
//!   refused WR is [`FabricError::Post`] with its index (earlier WRs were posted).
//! * **Lifetimes**: every object keeps its parents alive ([`raw`]); drops never panic.
//!
//! # Addresses
//! The CM names every peer by [`PortAddr::from_ipv4`] of its IPv4 address, on both link
//! layers: [`Device::resolve`] returns it and [`Device::recv_mad`] reports senders that way.
//! * **RoCEv2**: that *is* the peer's address: its GID is `::ffff:a.b.c.d` (each side picks
//!   exactly that GID), and RTR builds a GRH to it (hop limit 64, our GID index).
//! * **InfiniBand**: an IP says nothing about a LID without an SA path query (what
//!   `rdma_resolve_route` does through the kernel). Instead, every side-channel frame carries
//!   its sender's real GID and LID; the device learns them per IPv4 address, and RTR to an
//!   IPv4-named destination (LID `0xffff`) uses the learned LID (and a GRH only across
//!   subnets). A peer is always learned before RTR: the active side has received the REP, the
//!   passive side the REQ. An RTR to a peer never heard from is [`FabricError::NotFound`].
//!   A destination given with a real LID is used as is.
//!
//! # Statistics
//! [`Device::stats`] reads the port's sysfs counters ([`gid::sysfs_port_counters`]: packets,
//! bytes, duplicates, ACK timeouts, for the whole port, all processes) and the side channel's
//! MAD counters; the other fields are zero.

pub mod gid;
pub mod map;
mod objects;
pub mod raw;
pub mod side;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use ibverbs_sys as sys;

use self::gid::{GidEntry, GidKind, SYSFS_ROOT};
use self::map::{LinkLayer, PERMISSIVE_LID, PathParams};
use self::raw::{Context, DeviceList, RawCq, RawMr, RawPd, RawQp};
use self::side::{FrameHeader, SideChannel};
use crate::fabric::{
    Access, AsyncEvent, Device, DeviceAttr, FabricError, FabricStats, Gid, Mad, Mtu, PortAddr, PortAttr,
    PortState, QpCaps, QpInitAttr, QpState,
};
use crate::time::Instant;

pub use self::objects::{VerbsCq, VerbsMr, VerbsPd, VerbsQp};
pub use self::side::DEFAULT_MAD_PORT;

/// Work completions moved per provider `poll_cq` call.
pub const POLL_BATCH: usize = 32;
/// Async events kept before the oldest are dropped.
const EVENT_QUEUE_MAX: usize = 4096;
/// Inline sizes tried, largest first, when probing the device's inline limit.
const INLINE_PROBE: [u32; 5] = [512, 256, 128, 64, 32];

/// How to choose and use the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Device name (`mlx5_0`, as `ibv_devices` lists it); `None`: the first device with an
    /// ACTIVE port that has a usable GID.
    pub device: Option<String>,
    /// Port number; `None`: the first ACTIVE port (a named device whose ports are all down
    /// falls back to its first port with a usable GID, which may come up later).
    pub port: Option<u8>,
    /// The NID's IPv4 address. RoCE: selects the GID (`::ffff:a.b.c.d`, RoCE v2); `None`
    /// takes the port's first RoCE v2 IPv4 GID. Both link layers: the side channel listens on
    /// it (else on all addresses) and names this node by it in every frame.
    pub ipv4: Option<Ipv4Addr>,
    /// Source GID index, overriding the choice above (checked; see [`gid`]).
    pub gid_index: Option<u8>,
    /// TCP port of the MAD side channel, to listen on and to connect to
    /// ([`DEFAULT_MAD_PORT`], 987, the o2iblnd service port; below 1024 needs root or
    /// `CAP_NET_BIND_SERVICE`; 0 listens on an ephemeral port, for tests).
    pub mad_port: u16,
    /// GRH traffic class (RoCEv2: the IP DSCP/ECN byte).
    pub traffic_class: u8,
    /// Service level of the address vector.
    pub service_level: u8,
    /// o2iblnd's `use_privileged_port`: open side-channel connections from a reserved port
    /// (needs root or `CAP_NET_BIND_SERVICE`; without it, an ordinary port, counted).
    pub use_privileged_port: bool,
    /// o2iblnd's `require_privileged_port`: refuse side-channel connections from ports ≥ 1024.
    pub require_privileged_port: bool,
}

impl Default for VerbsConfig {
    fn default() -> VerbsConfig {
        VerbsConfig {
            device: None,
            port: None,
            ipv4: None,
            gid_index: None,
            mad_port: DEFAULT_MAD_PORT,
            traffic_class: 0,
            service_level: 0,
            use_privileged_port: true,
            require_privileged_port: false,
        }
    }
}

/// Registered regions by lkey: `(addr, len)`, consulted for inline sends.
type MrTable = HashMap<u32, (u64, u64)>;

/// What every object of the device shares.
struct Core {
    ctx: Arc<Context>,
    name: String,
    path: PathParams,
    mrs: RwLock<MrTable>,
    learned: Arc<Mutex<side::Learned>>,
}

impl Core {
    fn mrs_read(&self) -> std::sync::RwLockReadGuard<'_, MrTable> {
        self.mrs.read().unwrap_or_else(|p| p.into_inner())
    }

    fn mrs_write(&self) -> std::sync::RwLockWriteGuard<'_, MrTable> {
        self.mrs.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The path parameters with the port's current active MTU.
    fn path_now(&self) -> PathParams {
        let mut p = self.path;
        if let Some(m) = self.ctx.query_port(p.port_num).ok().and_then(|a| map::mtu_from_ibv(a.active_mtu)) {
            p.active_mtu = m;
        }
        p
    }
}

struct SideState {
    channel: SideChannel,
    events: VecDeque<AsyncEvent>,
    local: FrameHeader,
}

struct Shared {
    // Declared first: the sockets and the poll close before the context can.
    side: Mutex<SideState>,
    core: Arc<Core>,
    attr: DeviceAttr,
    port0: PortAttr,
    next_cq_id: AtomicU32,
}

impl Shared {
    fn side(&self) -> MutexGuard<'_, SideState> {
        self.side.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A device port on libibverbs. Cheap to clone (a handle).
#[derive(Clone)]
pub struct VerbsDevice {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for VerbsDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.shared.core.path;
        f.debug_struct("VerbsDevice")
            .field("name", &self.shared.core.name)
            .field("port", &p.port_num)
            .field("link", &p.link)
            .field("gid_index", &p.sgid_index)
            .field("gid", &p.sgid)
            .finish()
    }
}

/// A port that can be opened.
struct Candidate {
    ctx: Arc<Context>,
    name: String,
    port: u8,
    dattr: sys::ibv_device_attr,
    pattr: sys::ibv_port_attr,
    link: LinkLayer,
    gid: GidEntry,
}

/// The valid GIDs of `port`: `_ibv_query_gid_table`, else `ibv_query_gid` + sysfs types.
fn read_gid_table(
    ctx: &Context,
    name: &str,
    port: u8,
    link: LinkLayer,
    tbl_len: u32,
    ports: u8,
) -> Vec<GidEntry> {
    let max = (tbl_len.max(1024) as usize).saturating_mul(usize::from(ports.max(1)));
    if let Ok(entries) = ctx.query_gid_table(max) {
        return entries
            .iter()
            .filter(|e| e.port_num == u32::from(port))
            .map(|e| GidEntry {
                index: e.gid_index,
                // SAFETY: `raw` is the byte view of the 16-byte GID union; any bits are valid.
                gid: Gid(unsafe { e.gid.raw }),
                kind: GidKind::from_ibv(e.gid_type),
            })
            .collect();
    }
    (0..tbl_len)
        .filter_map(|index| {
            let raw = ctx.query_gid(port, index).ok()?;
            if raw == [0u8; 16] {
                return None;
            }
            let kind =
                gid::sysfs_gid_kind(Path::new(SYSFS_ROOT), name, port, index, link).unwrap_or(match link {
                    LinkLayer::Infiniband => GidKind::Ib,
                    LinkLayer::Ethernet => GidKind::Unknown,
                });
            Some(GidEntry { index, gid: Gid(raw), kind })
        })
        .collect()
}

/// The largest inline size the device accepts, found by creating throwaway QPs (verbs has
/// no attribute for it); 0 if even 32 bytes fail.
fn probe_max_inline(ctx: &Arc<Context>) -> u32 {
    let Ok(pd) = RawPd::alloc(ctx) else { return 0 };
    let Ok(cq) = RawCq::create(ctx, 1, 0, 0) else { return 0 };
    let (pd, cq) = (Arc::new(pd), Arc::new(cq));
    for want in INLINE_PROBE {
        let cap = sys::ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: want,
        };
        if let Ok((_qp, actual)) = RawQp::create(&pd, &cq, &cq, cap, false) {
            return actual.max_inline_data.max(want);
        }
    }
    0
}

/// Reads the element an async event names (valid until the event is acknowledged).
fn raw_event(ev: &sys::ibv_async_event) -> map::RawEvent {
    use map::{EventElement, RawEvent};
    let t = ev.event_type;
    match map::event_element(t) {
        EventElement::Qp => {
            // SAFETY: for QP events the union holds `qp`, live until the event is acked.
            let qp = unsafe { ev.element.qp };
            if qp.is_null() {
                RawEvent::Other(t)
            } else {
                // SAFETY: non-null QP pointer, live until the ack (see above).
                RawEvent::Qp(t, unsafe { (*qp).qp_num })
            }
        }
        EventElement::Cq => {
            // SAFETY: for CQ events the union holds `cq`, live until the event is acked.
            let cq = unsafe { ev.element.cq };
            if cq.is_null() {
                RawEvent::Other(t)
            } else {
                // SAFETY: non-null CQ pointer, live until the ack; its context is our id.
                let id = unsafe { (*cq).cq_context } as usize;
                RawEvent::Cq(t, u32::try_from(id).unwrap_or(0))
            }
        }
        // SAFETY: for port events the union holds the port number (a plain int).
        EventElement::Port => RawEvent::Port(t, u8::try_from(unsafe { ev.element.port_num }).unwrap_or(0)),
        EventElement::Device => RawEvent::Device(t),
        EventElement::Other => RawEvent::Other(t),
    }
}

impl VerbsDevice {
    /// Opens a device port (see the module docs for how it is chosen). Fails with
    /// [`FabricError::NoDevice`] when no device or port fits, naming the cause; with
    /// [`FabricError::Io`] when the side channel cannot listen.
    pub fn open(config: VerbsConfig) -> Result<VerbsDevice, FabricError> {
        let list = DeviceList::get()?;
        let names: Vec<String> = (0..list.len()).map(|i| list.name(i)).collect();
        let indices: Vec<usize> = match &config.device {
            Some(want) => {
                let i = names.iter().position(|n| n == want).ok_or_else(|| FabricError::NoDevice {
                    reason: format!("no RDMA device named {want} (found: {})", names.join(", ")),
                })?;
                vec![i]
            }
            None => (0..names.len()).collect(),
        };
        let mut reasons = Vec::new();
        let mut fallback = None;
        for i in indices {
            let name = names.get(i).cloned().unwrap_or_default();
            let ctx = match list.open(i) {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    reasons.push(format!("{name}: ibv_open_device: {e}"));
                    continue;
                }
            };
            let dattr = match ctx.query_device() {
                Ok(a) => a,
                Err(e) => {
                    reasons.push(format!("{name}: ibv_query_device: {e}"));
                    continue;
                }
            };
            let ports: Vec<u8> = match config.port {
                Some(p) => vec![p],
                None => (1..=dattr.phys_port_cnt).collect(),
            };
            for port in ports {
                let pattr = match ctx.query_port(port) {
                    Ok(a) => a,
                    Err(e) => {
                        reasons.push(format!("{name} port {port}: ibv_query_port: {e}"));
                        continue;
                    }
                };
                let link = LinkLayer::from_ibv(pattr.link_layer);
                let tbl_len = map::c_uint(pattr.gid_tbl_len);
                let table = read_gid_table(&ctx, &name, port, link, tbl_len, dattr.phys_port_cnt);
                let gid = match gid::choose_gid(link, &table, config.ipv4, config.gid_index) {
                    Ok(g) if g.index <= u32::from(u8::MAX) => g,
                    Ok(g) => {
                        reasons.push(format!("{name} port {port}: GID index {} does not fit a GRH", g.index));
                        continue;
                    }
                    Err(e) => {
                        reasons.push(format!("{name} port {port} ({}): {e}", link.name()));
                        continue;
                    }
                };
                let state = map::port_state_from_ibv(pattr.state);
                let cand = Candidate { ctx: ctx.clone(), name: name.clone(), port, dattr, pattr, link, gid };
                if state == PortState::Active {
                    return VerbsDevice::build(cand, &config);
                }
                reasons.push(format!("{name} port {port}: {state:?}, not ACTIVE"));
                if config.device.is_some() && fallback.is_none() {
                    fallback = Some(cand);
                }
            }
        }
        if let Some(cand) = fallback {
            return VerbsDevice::build(cand, &config);
        }
        Err(FabricError::NoDevice { reason: format!("no usable RDMA port: {}", reasons.join("; ")) })
    }

    fn build(c: Candidate, config: &VerbsConfig) -> Result<VerbsDevice, FabricError> {
        let lid = match c.link {
            LinkLayer::Infiniband => c.pattr.lid,
            LinkLayer::Ethernet => PERMISSIVE_LID,
        };
        let ipv4 = config.ipv4.or(match c.link {
            LinkLayer::Ethernet => c.gid.gid.to_ipv4(),
            LinkLayer::Infiniband => None,
        });
        let active_mtu = map::mtu_from_ibv(c.pattr.active_mtu).unwrap_or(Mtu::Mtu256);
        let max_mtu = map::mtu_from_ibv(c.pattr.max_mtu).unwrap_or(active_mtu);
        let path = PathParams {
            port_num: c.port,
            link: c.link,
            sgid_index: u8::try_from(c.gid.index).unwrap_or(0),
            sgid: c.gid.gid,
            traffic_class: config.traffic_class,
            service_level: config.service_level,
            active_mtu,
        };
        let d = &c.dattr;
        let attr = DeviceAttr {
            node_guid: u64::from_be(d.node_guid),
            max_qp: map::c_uint(d.max_qp),
            max_qp_wr: map::c_uint(d.max_qp_wr),
            max_sge: map::c_uint(d.max_sge),
            max_cqe: map::c_uint(d.max_cqe),
            max_cq: map::c_uint(d.max_cq),
            max_mr_size: d.max_mr_size,
            max_mr: map::c_uint(d.max_mr),
            max_pd: map::c_uint(d.max_pd),
            max_qp_rd_atom: map::c_uint(d.max_qp_rd_atom),
            max_inline_data: probe_max_inline(&c.ctx),
        };
        let port0 = PortAttr {
            port_num: c.port,
            state: map::port_state_from_ibv(c.pattr.state),
            max_mtu,
            active_mtu,
            addr: PortAddr { gid: c.gid.gid, lid },
        };
        raw::set_nonblocking(c.ctx.async_fd())
            .map_err(|e| FabricError::io("fcntl(async fd, O_NONBLOCK)", e))?;
        let learned = Arc::new(Mutex::new(side::Learned::new()));
        let local = FrameHeader { ip: ipv4.unwrap_or(Ipv4Addr::UNSPECIFIED), gid: c.gid.gid, lid };
        let listen = SocketAddr::from((ipv4.unwrap_or(Ipv4Addr::UNSPECIFIED), config.mad_port));
        let mut channel =
            SideChannel::bind(listen, config.mad_port, local, learned.clone()).map_err(|e| {
                FabricError::io(
                    "listen for the MAD side channel",
                    io::Error::new(e.kind(), format!("{listen}: {e}")),
                )
            })?;
        channel.register_extra(c.ctx.async_fd()).map_err(|e| FabricError::io("epoll_ctl(async fd)", e))?;
        channel.set_port_policy(side::PortPolicy {
            use_privileged: config.use_privileged_port,
            require_privileged: config.require_privileged_port,
        });
        let core =
            Arc::new(Core { ctx: c.ctx, name: c.name, path, mrs: RwLock::new(HashMap::new()), learned });
        Ok(VerbsDevice {
            shared: Arc::new(Shared {
                side: Mutex::new(SideState { channel, events: VecDeque::new(), local }),
                core,
                attr,
                port0,
                next_cq_id: AtomicU32::new(1),
            }),
        })
    }

    /// The port's link layer.
    pub fn link_layer(&self) -> LinkLayer {
        self.shared.core.path.link
    }

    /// The source GID index every address vector uses.
    pub fn gid_index(&self) -> u8 {
        self.shared.core.path.sgid_index
    }

    /// The side channel's listening address.
    pub fn mad_listen_addr(&self) -> io::Result<SocketAddr> {
        self.shared.side().channel.local_addr()
    }

    fn owns(&self, ctx: &Arc<Context>) -> bool {
        Arc::ptr_eq(ctx, &self.shared.core.ctx)
    }

    /// Reads every pending async event (acknowledging each) into the queue.
    fn drain_async(&self, side: &mut SideState) {
        let core = &self.shared.core;
        let port = core.path.port_num;
        while let Some(ev) = core.ctx.next_async_event(raw_event) {
            if map::event_refreshes_port(ev, port) && core.path.link == LinkLayer::Infiniband {
                if let Ok(a) = core.ctx.query_port(port) {
                    if a.lid != side.local.lid {
                        side.local.lid = a.lid;
                        let local = side.local;
                        side.channel.set_local(local);
                    }
                }
            }
            if let Some(e) = map::async_event(ev, port) {
                if side.events.len() >= EVENT_QUEUE_MAX {
                    side.events.pop_front();
                }
                side.events.push_back(e);
            }
        }
    }
}

impl Device for VerbsDevice {
    type Pd = VerbsPd;
    type Cq = VerbsCq;
    type Qp = VerbsQp;
    type Mr = VerbsMr;

    fn name(&self) -> &str {
        &self.shared.core.name
    }

    fn query_device(&self) -> DeviceAttr {
        self.shared.attr.clone()
    }

    /// Queried live (state, MTUs, LID); the open-time attributes if the query fails.
    fn query_port(&self) -> PortAttr {
        let core = &self.shared.core;
        let port = core.path.port_num;
        let Ok(a) = core.ctx.query_port(port) else { return self.shared.port0.clone() };
        let active_mtu = map::mtu_from_ibv(a.active_mtu).unwrap_or(self.shared.port0.active_mtu);
        let lid = match core.path.link {
            LinkLayer::Infiniband => a.lid,
            LinkLayer::Ethernet => PERMISSIVE_LID,
        };
        PortAttr {
            port_num: port,
            state: map::port_state_from_ibv(a.state),
            max_mtu: map::mtu_from_ibv(a.max_mtu).unwrap_or(self.shared.port0.max_mtu),
            active_mtu,
            addr: PortAddr { gid: core.path.sgid, lid },
        }
    }

    /// `PortAddr::from_ipv4(ip)` on both link layers (see "Addresses" in the module docs).
    fn resolve(&self, ip: Ipv4Addr) -> Result<PortAddr, FabricError> {
        if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return Err(FabricError::InvalidArgument { what: "address is not a unicast IPv4 address" });
        }
        Ok(PortAddr::from_ipv4(ip))
    }

    /// RoCE: the port's GID is `ip`'s IPv4-mapped GID. InfiniBand: `ip` is
    /// [`VerbsConfig::ipv4`], the address the side channel names this node by; without one,
    /// the side channel listens on every address and peers name this node by the source
    /// address of its frames, so any address is taken.
    fn owns_ipv4(&self, ip: Ipv4Addr) -> bool {
        let core = &self.shared.core;
        match core.path.link {
            LinkLayer::Ethernet => core.path.sgid == Gid::from_ipv4(ip),
            LinkLayer::Infiniband => {
                let local = self.shared.side().local.ip;
                local.is_unspecified() || local == ip
            }
        }
    }

    fn alloc_pd(&self) -> Result<VerbsPd, FabricError> {
        let raw = RawPd::alloc(&self.shared.core.ctx).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOMEM) => FabricError::Resource { what: "protection domains" },
            _ => FabricError::io("ibv_alloc_pd", e),
        })?;
        Ok(VerbsPd { raw: Arc::new(raw) })
    }

    fn create_cq(&self, cqe: u32) -> Result<VerbsCq, FabricError> {
        if cqe == 0 {
            return Err(FabricError::InvalidArgument { what: "cqe must be at least 1" });
        }
        let max = self.shared.attr.max_cqe;
        let cqe = if max > 0 { cqe.min(max) } else { cqe };
        let id = self.shared.next_cq_id.fetch_add(1, Ordering::Relaxed).max(1);
        let ctx = &self.shared.core.ctx;
        let raw = RawCq::create(ctx, cqe, id, id % ctx.num_comp_vectors())?;
        Ok(VerbsCq { raw: Arc::new(raw), id })
    }

    unsafe fn reg_mr(
        &self,
        pd: &VerbsPd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<VerbsMr, FabricError> {
        if !self.owns(pd.raw.context()) {
            return Err(FabricError::InvalidArgument { what: "protection domain of another device" });
        }
        map::check_access(access)?;
        if len as u64 > self.shared.attr.max_mr_size && self.shared.attr.max_mr_size > 0 {
            return Err(FabricError::InvalidArgument { what: "region longer than max_mr_size" });
        }
        let base = addr as usize as u64;
        if base.checked_add(len as u64).is_none() {
            return Err(FabricError::InvalidArgument { what: "region wraps the address space" });
        }
        // SAFETY: the caller promises (this function's contract) that the memory stays valid
        // for the device while the region lives; RawMr deregisters before it can be freed.
        let raw = unsafe { RawMr::register(&pd.raw, addr, len, map::access_to_ibv(access)) }
            .map_err(map::reg_mr_error)?;
        let (lkey, rkey) = raw.keys();
        self.shared.core.mrs_write().insert(lkey, (base, len as u64));
        Ok(VerbsMr { _raw: raw, core: self.shared.core.clone(), lkey, rkey, addr: base, len, access })
    }

    fn create_qp(
        &self,
        pd: &VerbsPd,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        attr: &QpInitAttr,
    ) -> Result<VerbsQp, FabricError> {
        if !self.owns(pd.raw.context())
            || !self.owns(send_cq.raw.context())
            || !self.owns(recv_cq.raw.context())
        {
            return Err(FabricError::InvalidArgument { what: "PD or CQ of another device" });
        }
        let req = attr.cap;
        if req.max_send_wr == 0 && req.max_recv_wr == 0 {
            return Err(FabricError::InvalidArgument { what: "a QP needs a send or a receive queue" });
        }
        let a = &self.shared.attr;
        let cap = sys::ibv_qp_cap {
            max_send_wr: req.max_send_wr.min(a.max_qp_wr),
            max_recv_wr: req.max_recv_wr.min(a.max_qp_wr),
            max_send_sge: req.max_send_sge.clamp(1, a.max_sge.max(1)),
            max_recv_sge: req.max_recv_sge.clamp(1, a.max_sge.max(1)),
            max_inline_data: req.max_inline_data.min(a.max_inline_data),
        };
        let (raw, actual) = RawQp::create(&pd.raw, &send_cq.raw, &recv_cq.raw, cap, attr.sq_sig_all)
            .map_err(map::create_qp_error)?;
        let caps = QpCaps {
            max_send_wr: actual.max_send_wr,
            max_recv_wr: actual.max_recv_wr,
            max_send_sge: actual.max_send_sge,
            max_recv_sge: actual.max_recv_sge,
            max_inline_data: actual.max_inline_data,
        };
        Ok(VerbsQp { raw, core: self.shared.core.clone(), caps, state: Mutex::new(QpState::Reset) })
    }

    /// Queues the MAD for the side channel to the destination's IPv4 address (an IPv4-mapped
    /// GID, or a learned InfiniBand GID). Never blocks; sent by `progress`.
    fn send_mad(&self, dest: &PortAddr, mad: &Mad) -> Result<(), FabricError> {
        let ip = match dest.gid.to_ipv4() {
            Some(ip) => ip,
            None => {
                let learned = self.shared.core.learned.lock().unwrap_or_else(|p| p.into_inner());
                learned.ip_of_gid(&dest.gid).ok_or(FabricError::InvalidArgument {
                    what: "destination is neither IPv4-named nor a known peer",
                })?
            }
        };
        if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return Err(FabricError::InvalidArgument { what: "destination is not a unicast IPv4 address" });
        }
        self.shared.side().channel.send(ip, mad);
        Ok(())
    }

    fn recv_mad(&self) -> Option<(PortAddr, Mad)> {
        self.shared.side().channel.recv().map(|(ip, mad)| (PortAddr::from_ipv4(ip), mad))
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        let mut side = self.shared.side();
        if side.events.is_empty() {
            self.drain_async(&mut side);
        }
        side.events.pop_front()
    }

    fn progress(&self, now: Instant) -> Result<(), FabricError> {
        let mut side = self.shared.side();
        let ready =
            side.channel.progress(now).map_err(|e| FabricError::io("epoll_wait (MAD side channel)", e))?;
        if ready.extra {
            self.drain_async(&mut side);
        }
        Ok(())
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.shared.side().channel.next_deadline()
    }

    fn pollable_fds(&self) -> Vec<RawFd> {
        vec![self.shared.side().channel.fd()]
    }

    fn stats(&self) -> FabricStats {
        let core = &self.shared.core;
        let mut s = gid::sysfs_port_counters(Path::new(SYSFS_ROOT), &core.name, core.path.port_num);
        let side = self.shared.side().channel.stats();
        s.mads_sent = side.sent;
        s.mads_received = side.received;
        // A frame naming someone else as its sender is as unusable as one that does not parse.
        s.malformed = side.malformed.saturating_add(side.spoofed);
        s
    }
}

#[cfg(test)]
mod tests;
