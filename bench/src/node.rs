//! One benchmark node: LNet with one o2iblnd interface, from a tunables file.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;

use lnd::driver::{Driver, DriverConfig, DriverStats, FabricChoice};
use lnd::fabric::soft::SoftConfig;
use lnd::tunables::{ParsedConfig, Tunables};
use lnet_shim::lnd::Lnd;
use lnet_shim::nid::{Nid, ProcessId};
use lnet_shim::parse_networks;
use lnet_shim::{Lnet, LnetConfig};

/// The default configuration, built in so the tool runs from any directory.
const DEFAULT_CONF: &str = include_str!("../../conf/ko2iblnd.conf");

/// Which fabric to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fabric {
    /// The software RC device over UDP (RoCEv2 framing).
    Soft,
    /// A real RDMA NIC through libibverbs (build with `--features verbs`).
    Verbs,
}

/// Where and how a node runs.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// The node's NID.
    pub nid: Nid,
    /// A tunables file; `None` is the built-in conf/ko2iblnd.conf.
    pub tunables: Option<String>,
    /// The fabric.
    pub fabric: Fabric,
    /// UDP port of the software fabric (RoCEv2's 4791 by default).
    pub port: u16,
    /// Print the tunables file's warnings (off where another process or an earlier step of
    /// this one printed them already: `local`'s server and client).
    pub tunables_warnings: bool,
}

/// A running node.
pub struct Node {
    /// LNet.
    pub lnet: Lnet,
    /// The o2iblnd interface under it.
    pub driver: Arc<Driver>,
    /// Its NID.
    pub nid: Nid,
}

/// Reads the tunables (the file, or the built-in defaults) and LNet's configuration from its
/// `options lnet` lines (`lnet_transaction_timeout`); with `warn`, prints the file's
/// warnings to stderr, and one for each of `nids` whose network the file's
/// `options lnet networks=` leaves out (lnd-bench runs on the NIDs it is given, so such a
/// line is not what it uses).
pub fn load_config(path: Option<&str>, nids: &[Nid], warn: bool) -> Result<(Tunables, LnetConfig), String> {
    let parsed = match path {
        Some(p) => Tunables::load(Path::new(p)).map_err(|e| e.to_string())?,
        None => {
            Tunables::parse_str("conf/ko2iblnd.conf (built in)", DEFAULT_CONF).map_err(|e| e.to_string())?
        }
    };
    if path.is_some() && warn {
        for w in file_warnings(&parsed, nids) {
            eprintln!("lnd-bench: warning: {w}");
        }
    }
    let lnet = parsed.lnet_config().map_err(|e| e.to_string())?;
    Ok((parsed.tunables, lnet))
}

/// The warnings of a tunables file: its own, then one for each of `nids` whose network its
/// `options lnet networks=` leaves out, each at `file:line`.
fn file_warnings(parsed: &ParsedConfig, nids: &[Nid]) -> Vec<String> {
    let mut out: Vec<String> = parsed.warnings.iter().map(ToString::to_string).collect();
    let Some((at, value)) = parsed.lnet_option("networks").and_then(|o| Some((&o.at, o.value.as_deref()?)))
    else {
        return out;
    };
    match parse_networks(value) {
        Err(e) => out.push(format!("{at}: options lnet {e}; lnd-bench uses --nid")),
        Ok(nets) => {
            for nid in nids.iter().filter(|n| !nets.iter().any(|s| s.net == n.net())) {
                out.push(format!(
                    "{at}: options lnet networks=\"{value}\" does not include {} (the network of \
                     {nid}); lnd-bench runs on the NID it is given",
                    nid.net()
                ));
            }
        }
    }
    out
}

/// The start error, with what to do about the two common cases of the software fabric (see
/// [`bind_hint`]).
fn start_error(e: &(dyn std::error::Error + 'static), opts: &NodeOptions) -> String {
    match opts.fabric {
        Fabric::Soft => {
            bind_hint(e, opts.nid.addr(), opts.port).map_or_else(|| e.to_string(), |h| format!("{e} ({h})"))
        }
        _ => e.to_string(),
    }
}

/// What to do when the software fabric could not bind `ip:port`, for the two common causes
/// found in `e`'s chain: the UDP port already bound by another LND or lnd-bench on this host,
/// and an address that is not one of this host's. `None` for anything else.
pub(crate) fn bind_hint(e: &(dyn std::error::Error + 'static), ip: Ipv4Addr, port: u16) -> Option<String> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        match c.downcast_ref::<std::io::Error>().map(std::io::Error::kind) {
            Some(std::io::ErrorKind::AddrInUse) => {
                return Some(format!(
                    "another LND or lnd-bench on this host holds UDP port {port} on {ip}: \
                     stop it, or pick another --port (the same for both sides)"
                ));
            }
            Some(std::io::ErrorKind::AddrNotAvailable) => {
                return Some(format!(
                    "{ip} is not an address of this host: the software fabric binds the \
                     NID's IPv4 address; on one machine use 127.0.0.x@o2ib"
                ));
            }
            _ => cause = c.source(),
        }
    }
    None
}

impl Node {
    /// Starts LNet and the LND on `opts.nid`.
    pub fn start(opts: &NodeOptions) -> Result<Node, String> {
        Node::start_with(opts, |_| Ok(())).map(|(node, ())| node)
    }

    /// Starts LNet, calls `before_ni` with it (to attach MEs: nothing can arrive yet), then
    /// adds the NI and starts the LND; the node and what `before_ni` returned. A server
    /// makes its request portal lazy and attaches its request buffers there, so that the first
    /// requests find buffers posted.
    pub fn start_with<T>(
        opts: &NodeOptions,
        before_ni: impl FnOnce(&Lnet) -> Result<T, String>,
    ) -> Result<(Node, T), String> {
        let (tunables, lnet_config) =
            load_config(opts.tunables.as_deref(), &[opts.nid], opts.tunables_warnings)?;
        let fabric = match opts.fabric {
            Fabric::Soft => FabricChoice::Soft(SoftConfig { udp_port: opts.port, ..SoftConfig::default() }),
            #[cfg(feature = "verbs")]
            Fabric::Verbs => FabricChoice::Verbs(lnd::fabric::verbs::VerbsConfig {
                ipv4: Some(opts.nid.addr()),
                mad_port: tunables.service,
                use_privileged_port: tunables.use_privileged_port,
                require_privileged_port: tunables.require_privileged_port,
                ..Default::default()
            }),
            #[cfg(not(feature = "verbs"))]
            Fabric::Verbs => {
                return Err("--fabric verbs needs a build with the `verbs` feature \
                            (cargo build --release -p lnd-bench --features verbs)"
                    .to_owned());
            }
        };
        let (credits, peer_credits) = (tunables.credits, tunables.peer_credits);
        let cfg = DriverConfig { nid: opts.nid, tunables, fabric, seed: None };
        let lnet = Lnet::new(lnet_config).map_err(|e| e.to_string())?;
        let hooked = before_ni(&lnet)?;
        let mut driver = None;
        lnet.add_ni(opts.nid, credits, peer_credits, |up| {
            let d = Arc::new(Driver::start(cfg, up)?);
            driver = Some(d.clone());
            Ok::<_, lnd::driver::DriverError>(d as Arc<dyn Lnd>)
        })
        .map_err(|e| start_error(&e, opts))?;
        let driver = driver.ok_or("the LND did not start")?;
        Ok((Node { lnet, driver, nid: opts.nid }, hooked))
    }

    /// This node's process id.
    pub fn pid(&self) -> ProcessId {
        ProcessId::new(self.nid, ProcessId::PID_LUSTRE)
    }

    /// The LND's counters (zeros if it does not answer).
    pub fn lnd_stats(&self) -> DriverStats {
        self.driver.stats().unwrap_or_default()
    }

    /// Stops LNet and the LND.
    pub fn shutdown(&self) {
        self.lnet.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `networks=` warnings named the file without its line ("x.conf: options lnet ..."),
    /// unlike every other warning of the file.
    #[test]
    fn network_warnings_name_the_line() {
        let text = "# c\noptions ko2iblnd peer_credits=8\noptions lnet networks=\"tcp0(eth0)\"\n";
        let parsed = Tunables::parse_str("x.conf", text).unwrap();
        let nid: Nid = "127.0.0.2@o2ib".parse().unwrap();
        let w = file_warnings(&parsed, &[nid]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("x.conf:3: options lnet networks=\"tcp0(eth0)\" does not include o2ib"),
            "{w:?}"
        );
        let parsed = Tunables::parse_str("x.conf", "\noptions lnet networks=garbage((\n").unwrap();
        let w = file_warnings(&parsed, &[nid]);
        assert!(w.len() == 1 && w[0].starts_with("x.conf:2: options lnet networks"), "{w:?}");
        let parsed = Tunables::parse_str("x.conf", "options lnet networks=o2ib0(ib0)\n").unwrap();
        assert!(file_warnings(&parsed, &[nid]).is_empty());
    }

    /// `options lnet lnet_transaction_timeout=` in the tunables file reaches LNet; a bad value
    /// stops the start with its place in the file; without a file, LNet's default.
    #[test]
    fn the_tunables_file_sets_lnets_transaction_timeout() {
        let dir = std::env::temp_dir().join(format!("lnd-bench-node-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.conf");
        std::fs::write(&good, "options ko2iblnd peer_credits=16\noptions lnet lnet_transaction_timeout=7\n")
            .unwrap();
        let bad = dir.join("bad.conf");
        std::fs::write(&bad, "options lnet lnet_transaction_timeout=0\n").unwrap();
        let nid: Nid = "127.0.0.1@o2ib".parse().unwrap();
        let (t, lnet) = load_config(good.to_str(), &[nid], false).unwrap();
        assert_eq!((t.peer_credits, lnet.transaction_timeout), (16, Some(std::time::Duration::from_secs(7))));
        let e = load_config(bad.to_str(), &[nid], false).unwrap_err();
        assert!(e.contains("bad.conf:1: lnet_transaction_timeout=0: out of range"), "{e}");
        let (_, lnet) = load_config(None, &[nid], false).unwrap();
        assert_eq!(lnet.transaction_timeout, Some(lnet_shim::DEFAULT_TRANSACTION_TIMEOUT));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `start_with`'s hook runs before the NI exists (so an ME it attaches is there before
    /// any message can arrive), and its error ends the start with no NI added.
    #[test]
    fn the_hook_runs_before_the_ni_and_its_error_stops_the_start() {
        let nid: Nid = "127.0.34.1@o2ib".parse().unwrap();
        let port = 47_000 + (std::process::id() % 1000) as u16;
        let opts = NodeOptions { nid, tunables: None, fabric: Fabric::Soft, port, tunables_warnings: false };
        let (node, seen) = Node::start_with(&opts, |lnet| Ok(lnet.nids())).unwrap();
        assert_eq!(seen, vec![], "NIs when the hook ran");
        assert_eq!(node.lnet.nids(), vec![nid]);
        node.shutdown();
        let mut ni_then = None;
        let e = Node::start_with(&opts, |lnet| -> Result<(), String> {
            ni_then = Some(lnet.nids());
            Err("hook failed".to_owned())
        })
        .err();
        assert_eq!(e.as_deref(), Some("hook failed"));
        assert_eq!(ni_then, Some(vec![]));
    }
}
