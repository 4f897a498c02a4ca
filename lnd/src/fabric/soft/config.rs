//! How a software device is set up: its resource limits ([`SoftLimits`], like a real HCA's)
//! and its configuration ([`SoftConfig`]), and how the environment switches that override
//! parts of it are read (`setting_from_env`).

use std::sync::Mutex;
use std::time::Duration;

use super::packet;
use super::{CopyHelper, FaultConfig, SingleCopy, Streaming};
use crate::fabric::{Mtu, PortAddr};

/// The mode the environment variable `var` names, by `parse` (which maps unset to the
/// default); a value that names no mode is reported once per variable on stderr and means
/// `fallback`, so a typo such as `LND_SOFT_SINGLE_COPY=of` is seen rather than silently
/// meaning the default.
pub(crate) fn setting_from_env<T>(
    var: &'static str,
    parse: fn(Option<&str>) -> Option<T>,
    expected: &str,
    fallback: impl FnOnce() -> T,
) -> T {
    static WARNED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let value = std::env::var(var).ok();
    parse(value.as_deref()).unwrap_or_else(|| {
        let mut warned = WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !warned.contains(&var) {
            warned.push(var);
            eprintln!("lnd: {var}={:?} is not one of {expected}; using auto", value.unwrap_or_default());
        }
        fallback()
    })
}

/// Resource limits of a software device, like those of a real HCA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftLimits {
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum WRs per send or receive queue (requests above it are clamped).
    pub max_qp_wr: u32,
    /// Maximum SGEs per WR (requests above it are clamped).
    pub max_sge: u32,
    /// Maximum entries per CQ (requests above it are clamped).
    pub max_cqe: u32,
    /// Maximum number of CQs.
    pub max_cq: u32,
    /// Maximum number of memory regions (at most 65536).
    pub max_mr: u32,
    /// Maximum bytes per memory region.
    pub max_mr_size: u64,
    /// Maximum number of protection domains.
    pub max_pd: u32,
    /// Maximum inline bytes per send WR.
    pub max_inline_data: u32,
    /// Work-queue entries all QPs together may hold (send + receive): the HCA's memory.
    pub wqe_budget: u64,
}

impl Default for SoftLimits {
    fn default() -> SoftLimits {
        SoftLimits {
            max_qp: 16_384,
            max_qp_wr: 16_384,
            max_sge: 32,
            max_cqe: 1 << 22,
            max_cq: 16_384,
            max_mr: 65_536,
            max_mr_size: 1 << 40,
            max_pd: 1024,
            max_inline_data: 256,
            wqe_budget: 1 << 26,
        }
    }
}

/// Configuration of a software device.
#[derive(Clone, Debug)]
pub struct SoftConfig {
    /// Device name reported by [`Device::name`](crate::fabric::Device::name).
    pub name: String,
    /// Resource limits.
    pub limits: SoftLimits,
    /// The port's active MTU (the largest path MTU QPs can use).
    pub mtu: Mtu,
    /// Fault injection on the wire.
    pub faults: FaultConfig,
    /// Seed for QPNs, key bits and faults.
    pub seed: u64,
    /// Unacknowledged packets a QP may have in flight.
    pub max_inflight: u32,
    /// The UDP port of the fabric (4791, RoCEv2's; tests may choose another).
    pub udp_port: u16,
    /// Whether RDMA WRITEs to ports on the same host move with one copy ([`place`](super::place)). The
    /// default is [`SingleCopy::from_env`]: `Auto` unless `LND_SOFT_SINGLE_COPY=0`.
    pub single_copy: SingleCopy,
    /// Whether the same-host path copies large WRITEs (256 KiB and up) on two cores, with a
    /// helper thread the device starts on first use (its copy engine, [`copier`](super::copier)). The
    /// default: [`CopyHelper::from_env`] (`Auto` on more than one CPU, unless
    /// `LND_SOFT_COPY_HELPER` says `off` or `always`).
    pub copy_helper: CopyHelper,
    /// How long the copy engine's idle helper keeps looking for work before it parks (the
    /// driver sets it to the `busy_poll_usec` tunable; 0 parks at once).
    pub helper_spin: Duration,
    /// Whether the copy engine's large copies may use streaming (cache-bypassing) stores
    /// ([`streaming`](super::streaming)). The default is [`Streaming::from_env`]: `Auto` unless
    /// `LND_SOFT_STREAMING` says `off` or `always`.
    pub streaming: Streaming,
    /// The GID and LID [`Device::query_port`](crate::fabric::Device::query_port) reports. `None` (the default): the IPv4-mapped
    /// GID of the device's address and the permissive LID, as a RoCEv2 port has. A value
    /// presents the port the way an InfiniBand port looks (a GID and LID that are not its IP
    /// address) while peers still reach it by its IP: the LND must then name ports by IP, never
    /// by the port's GID, as it must on InfiniBand. Nothing else in the device changes.
    pub port_addr: Option<PortAddr>,
    /// The number of the port this device drives (1; 2 stands for the second port of a
    /// dual-port HCA). A QP must be moved to INIT on this port, as on hardware.
    pub port_num: u8,
}

impl Default for SoftConfig {
    fn default() -> SoftConfig {
        SoftConfig {
            name: "soft0".to_owned(),
            limits: SoftLimits::default(),
            mtu: Mtu::Mtu4096,
            faults: FaultConfig::NONE,
            seed: crate::rng::os_seed(),
            max_inflight: 256,
            udp_port: packet::ROCEV2_UDP_PORT,
            single_copy: SingleCopy::from_env(),
            copy_helper: CopyHelper::from_env(),
            helper_spin: Duration::from_micros(200),
            streaming: Streaming::from_env(),
            port_addr: None,
            port_num: 1,
        }
    }
}
