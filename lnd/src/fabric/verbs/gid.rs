//! GID selection and the sysfs files the backend reads.
//!
//! # Choosing the source GID
//! The GID table is read with `_ibv_query_gid_table` (the exported function behind
//! `ibv_query_gid_table`, libibverbs ≥ v32): one call returns every valid entry of every port
//! with its index and **type** (IB, RoCE v1, RoCE v2). When that call fails (old kernel
//! without the ioctl and without the library's sysfs fallback), the backend scans the port's
//! table with `ibv_query_gid` and reads each entry's type from
//! `/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<index>` ("RoCE v2",
//! "IB/RoCE v1"). `ibv_query_gid_type` itself is private to the library and not used.
//!
//! Then [`choose_gid`] picks:
//! * **Ethernet (RoCE)**: the RoCE v2 entry equal to `::ffff:<ipv4>` for the configured
//!   address; with no address configured, the first RoCE v2 IPv4-mapped entry (and the NID
//!   address becomes that IPv4). RoCE v1 and IPv6 entries are never chosen: peers address this
//!   port as `::ffff:a.b.c.d`, which is exactly the GID the kernel creates for an IPv4 address
//!   on the netdev.
//! * **InfiniBand**: index 0 (the port GID: subnet prefix + port GUID).
//! * A configured index overrides both, but must hold a valid GID, be RoCE v2 on Ethernet and,
//!   if an address is configured on RoCE, be that address's GID.

use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;

use super::map::LinkLayer;
use crate::fabric::{FabricStats, Gid};

/// Where the kernel publishes RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// The type of a GID table entry (`enum ibv_gid_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GidKind {
    /// An InfiniBand GID.
    Ib,
    /// A RoCE v1 GID (Ethernet L2 only).
    RoceV1,
    /// A RoCE v2 GID (UDP/IP).
    RoceV2,
    /// Unknown (neither the library nor sysfs said).
    Unknown,
}

impl GidKind {
    /// `enum ibv_gid_type` (`IBV_GID_TYPE_*`) as reported by `_ibv_query_gid_table`.
    pub fn from_ibv(t: u32) -> GidKind {
        match t {
            ibverbs_sys::IBV_GID_TYPE_IB => GidKind::Ib,
            ibverbs_sys::IBV_GID_TYPE_ROCE_V1 => GidKind::RoceV1,
            ibverbs_sys::IBV_GID_TYPE_ROCE_V2 => GidKind::RoceV2,
            _ => GidKind::Unknown,
        }
    }

    /// The contents of a sysfs `gid_attrs/types/<index>` file: "RoCE v2" or "IB/RoCE v1"
    /// (the latter is IB on an InfiniBand port, RoCE v1 on Ethernet).
    pub fn from_sysfs(text: &str, link: LinkLayer) -> GidKind {
        let t = text.trim();
        if t.eq_ignore_ascii_case("RoCE v2") {
            GidKind::RoceV2
        } else if t.eq_ignore_ascii_case("IB/RoCE v1") {
            match link {
                LinkLayer::Infiniband => GidKind::Ib,
                LinkLayer::Ethernet => GidKind::RoceV1,
            }
        } else {
            GidKind::Unknown
        }
    }
}

/// One valid GID table entry of the port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's GID table (the `sgid_index` of address vectors).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// Its type.
    pub kind: GidKind,
}

fn describe(table: &[GidEntry]) -> String {
    if table.is_empty() {
        return "the GID table is empty".to_owned();
    }
    let list: Vec<String> = table.iter().map(|e| format!("[{}] {:?} {:?}", e.index, e.gid, e.kind)).collect();
    format!("GID table: {}", list.join(", "))
}

/// Picks the source GID of a port (see the module docs); the error says why none fits and
/// lists the table.
pub fn choose_gid(
    link: LinkLayer,
    table: &[GidEntry],
    ipv4: Option<Ipv4Addr>,
    forced: Option<u8>,
) -> Result<GidEntry, String> {
    let valid = |e: &&GidEntry| e.gid != Gid::default();
    if let Some(index) = forced {
        let e = table
            .iter()
            .filter(valid)
            .find(|e| e.index == u32::from(index))
            .ok_or_else(|| format!("GID index {index} holds no valid GID ({})", describe(table)))?;
        if link == LinkLayer::Ethernet {
            if e.kind != GidKind::RoceV2 {
                return Err(format!(
                    "GID index {index} is {:?}, not RoCE v2 (this backend speaks RoCEv2)",
                    e.kind
                ));
            }
            if let Some(ip) = ipv4 {
                if e.gid != Gid::from_ipv4(ip) {
                    return Err(format!("GID index {index} is {:?}, not the GID of {ip}", e.gid));
                }
            }
        }
        return Ok(*e);
    }
    match link {
        LinkLayer::Infiniband => table
            .iter()
            .filter(valid)
            .find(|e| e.index == 0)
            .copied()
            .ok_or_else(|| format!("GID index 0 holds no valid GID ({})", describe(table))),
        LinkLayer::Ethernet => {
            let v2 = |e: &&GidEntry| e.kind == GidKind::RoceV2;
            let found = match ipv4 {
                Some(ip) => table.iter().filter(v2).find(|e| e.gid == Gid::from_ipv4(ip)),
                None => table.iter().filter(v2).find(|e| e.gid.to_ipv4().is_some()),
            };
            found.copied().ok_or_else(|| match ipv4 {
                Some(ip) => format!(
                    "no RoCE v2 GID for {ip} (is the address configured on this port's netdev?); {}",
                    describe(table)
                ),
                None => format!(
                    "no RoCE v2 IPv4 GID (configure an IPv4 address on the netdev); {}",
                    describe(table)
                ),
            })
        }
    }
}

/// The type of GID `index` of `dev`/`port` from sysfs, if the file exists.
pub fn sysfs_gid_kind(root: &Path, dev: &str, port: u8, index: u32, link: LinkLayer) -> Option<GidKind> {
    let p =
        root.join(dev).join("ports").join(port.to_string()).join("gid_attrs/types").join(index.to_string());
    fs::read_to_string(p).ok().map(|t| GidKind::from_sysfs(&t, link))
}

fn read_counter(dir: &Path, name: &str) -> Option<u64> {
    fs::read_to_string(dir.join(name)).ok().and_then(|s| s.trim().parse().ok())
}

/// The port's counters from sysfs, as [`FabricStats`] fields. These count **all** traffic of
/// the port (every process, every QP), not only this device object's:
/// * `counters/port_xmit_packets`, `port_rcv_packets` → `tx_packets`, `rx_packets`;
/// * `counters/port_xmit_data`, `port_rcv_data` (in 4-byte words, per IBTA) → `tx_bytes`,
///   `rx_bytes`;
/// * `hw_counters/duplicate_request` → `duplicates`, `hw_counters/local_ack_timeout_err` →
///   `timeouts`, `hw_counters/req_transport_retries_exceeded` → `retries_exceeded`,
///   `hw_counters/req_rnr_retries_exceeded` → `rnr_retries_exceeded` (present on mlx5 and
///   some others).
///
/// Missing files read as zero; the other fields stay zero (hardware hides them).
pub fn sysfs_port_counters(root: &Path, dev: &str, port: u8) -> FabricStats {
    let base = root.join(dev).join("ports").join(port.to_string());
    let c = base.join("counters");
    let hw = base.join("hw_counters");
    let get = |dir: &Path, name: &str| read_counter(dir, name).unwrap_or(0);
    FabricStats {
        tx_packets: get(&c, "port_xmit_packets"),
        rx_packets: get(&c, "port_rcv_packets"),
        tx_bytes: get(&c, "port_xmit_data").saturating_mul(4),
        rx_bytes: get(&c, "port_rcv_data").saturating_mul(4),
        duplicates: get(&hw, "duplicate_request"),
        timeouts: get(&hw, "local_ack_timeout_err"),
        retries_exceeded: get(&hw, "req_transport_retries_exceeded"),
        rnr_retries_exceeded: get(&hw, "req_rnr_retries_exceeded"),
        ..FabricStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: Gid, kind: GidKind) -> GidEntry {
        GidEntry { index, gid, kind }
    }

    fn link_local() -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..].copy_from_slice(&[0x02, 0x42, 0xac, 0xff, 0xfe, 0x11, 0x00, 0x02]);
        Gid(g)
    }

    /// What an mlx5 RoCE port with one IPv4 address and its link-local IPv6 address shows.
    fn roce_table() -> Vec<GidEntry> {
        let ip = Gid::from_ipv4(Ipv4Addr::new(192, 168, 7, 5));
        vec![
            entry(0, link_local(), GidKind::RoceV1),
            entry(1, link_local(), GidKind::RoceV2),
            entry(2, ip, GidKind::RoceV1),
            entry(3, ip, GidKind::RoceV2),
        ]
    }

    #[test]
    fn roce_picks_the_v2_gid_of_the_address() {
        let t = roce_table();
        let ip = Ipv4Addr::new(192, 168, 7, 5);
        let e = choose_gid(LinkLayer::Ethernet, &t, Some(ip), None).unwrap();
        assert_eq!((e.index, e.gid, e.kind), (3, Gid::from_ipv4(ip), GidKind::RoceV2));
        let any = choose_gid(LinkLayer::Ethernet, &t, None, None).unwrap();
        assert_eq!(any.index, 3, "without an address: the first RoCE v2 IPv4 GID");
        let err = choose_gid(LinkLayer::Ethernet, &t, Some(Ipv4Addr::new(10, 1, 1, 1)), None).unwrap_err();
        assert!(err.contains("no RoCE v2 GID for 10.1.1.1"), "{err}");
        assert!(err.contains("[3] Gid(::ffff:192.168.7.5) RoceV2"), "{err}");
        let v1_only: Vec<_> = t.iter().copied().filter(|e| e.kind == GidKind::RoceV1).collect();
        assert!(choose_gid(LinkLayer::Ethernet, &v1_only, Some(ip), None).is_err());
        assert!(choose_gid(LinkLayer::Ethernet, &[], None, None).unwrap_err().contains("empty"));
    }

    #[test]
    fn a_forced_index_is_checked() {
        let t = roce_table();
        let ip = Ipv4Addr::new(192, 168, 7, 5);
        assert_eq!(choose_gid(LinkLayer::Ethernet, &t, Some(ip), Some(3)).unwrap().index, 3);
        assert!(choose_gid(LinkLayer::Ethernet, &t, Some(ip), Some(2)).unwrap_err().contains("not RoCE v2"));
        assert!(
            choose_gid(LinkLayer::Ethernet, &t, Some(ip), Some(1)).unwrap_err().contains("not the GID of")
        );
        assert_eq!(choose_gid(LinkLayer::Ethernet, &t, None, Some(1)).unwrap().index, 1);
        assert!(choose_gid(LinkLayer::Ethernet, &t, None, Some(9)).unwrap_err().contains("no valid GID"));
    }

    #[test]
    fn infiniband_uses_index_zero_unless_configured() {
        let mut other = link_local();
        other.0[15] = 0x77;
        let t = vec![entry(0, link_local(), GidKind::Ib), entry(1, other, GidKind::Ib)];
        assert_eq!(choose_gid(LinkLayer::Infiniband, &t, None, None).unwrap().gid, link_local());
        assert_eq!(
            choose_gid(LinkLayer::Infiniband, &t, Some(Ipv4Addr::new(10, 0, 0, 1)), None).unwrap().index,
            0
        );
        assert_eq!(choose_gid(LinkLayer::Infiniband, &t, None, Some(1)).unwrap().gid, other);
        let zero = vec![entry(0, Gid::default(), GidKind::Ib)];
        assert!(choose_gid(LinkLayer::Infiniband, &zero, None, None).is_err());
    }

    #[test]
    fn gid_types_parse() {
        assert_eq!(GidKind::from_sysfs("RoCE v2\n", LinkLayer::Ethernet), GidKind::RoceV2);
        assert_eq!(GidKind::from_sysfs("IB/RoCE v1\n", LinkLayer::Ethernet), GidKind::RoceV1);
        assert_eq!(GidKind::from_sysfs("IB/RoCE v1\n", LinkLayer::Infiniband), GidKind::Ib);
        assert_eq!(GidKind::from_sysfs("", LinkLayer::Infiniband), GidKind::Unknown);
        assert_eq!(GidKind::from_ibv(ibverbs_sys::IBV_GID_TYPE_ROCE_V2), GidKind::RoceV2);
        assert_eq!(GidKind::from_ibv(ibverbs_sys::IBV_GID_TYPE_ROCE_V1), GidKind::RoceV1);
        assert_eq!(GidKind::from_ibv(ibverbs_sys::IBV_GID_TYPE_IB), GidKind::Ib);
        assert_eq!(GidKind::from_ibv(17), GidKind::Unknown);
    }

    /// A scratch directory under the system temp dir, removed on drop.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let p = std::env::temp_dir().join(format!("lnd-verbs-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn sysfs_files_are_read_from_a_fake_tree() {
        let root = TempDir::new("sysfs");
        let port = root.0.join("mlx5_0/ports/1");
        fs::create_dir_all(port.join("gid_attrs/types")).unwrap();
        fs::create_dir_all(port.join("counters")).unwrap();
        fs::create_dir_all(port.join("hw_counters")).unwrap();
        fs::write(port.join("gid_attrs/types/3"), "RoCE v2\n").unwrap();
        fs::write(port.join("counters/port_xmit_packets"), "10\n").unwrap();
        fs::write(port.join("counters/port_rcv_packets"), "20\n").unwrap();
        fs::write(port.join("counters/port_xmit_data"), "100\n").unwrap();
        fs::write(port.join("counters/port_rcv_data"), "garbage\n").unwrap();
        fs::write(port.join("hw_counters/duplicate_request"), "3\n").unwrap();
        fs::write(port.join("hw_counters/req_transport_retries_exceeded"), "2\n").unwrap();
        assert_eq!(sysfs_gid_kind(&root.0, "mlx5_0", 1, 3, LinkLayer::Ethernet), Some(GidKind::RoceV2));
        assert_eq!(sysfs_gid_kind(&root.0, "mlx5_0", 1, 4, LinkLayer::Ethernet), None);
        let s = sysfs_port_counters(&root.0, "mlx5_0", 1);
        assert_eq!((s.tx_packets, s.rx_packets, s.tx_bytes, s.rx_bytes), (10, 20, 400, 0));
        assert_eq!((s.duplicates, s.timeouts, s.mads_sent), (3, 0, 0));
        assert_eq!((s.retries_exceeded, s.rnr_retries_exceeded), (2, 0));
        assert_eq!(sysfs_port_counters(&root.0, "nope", 1), FabricStats::default());
    }
}
