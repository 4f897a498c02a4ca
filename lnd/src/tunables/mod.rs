//! The `ko2iblnd` tunables, read from the modprobe.d files administrators already keep.
//!
//! ```text
//! # /etc/modprobe.d/ko2iblnd.conf
//! options lnet networks="o2ib0(ib0)"
//! options ko2iblnd peer_credits=32 concurrent_sends=64   # trailing comments are fine
//! options ko2iblnd credits=1024 \
//!                  ntx=2048                               # continued with a backslash
//! ```
//!
//! * Every o2iblnd module parameter is accepted under its own name with o2iblnd's default, range
//!   and clamping ([`Tunables`] documents each field). Obsolete parameters (`map_on_demand`,
//!   `pmr_pool_size`) are accepted with a [`Warning`].
//! * `options lnet ...` parameters are kept verbatim, in order, as [`LnetOption`]s for the LNet
//!   layer. Other modules' options and the `install`/`alias`/`softdep`/`blacklist`/`remove`
//!   directives are skipped with a warning, never an error.
//! * Bad input is a [`TunablesError`] naming the file, the line and the `key=value`. Parsing
//!   stops at the **first** error: syntax and per-token errors (unknown names, malformed values)
//!   in file order, then range and consistency errors in parameter-table order. Nothing may
//!   start on a refused file.
//! * Values that o2iblnd clamps are clamped the same way, and each clamp is reported as a
//!   [`Warning`] with its `file:line`.
//!
//! # Configured versus effective values
//! A [`Tunables`] holds module-parameter values; `0` in `peer_credits_hiw` and
//! `concurrent_sends` means "derive from `peer_credits`", as in o2iblnd, and
//! [`Tunables::default`] is exactly o2iblnd's module defaults. [`Tunables::finalize`] applies
//! o2iblnd's derivations and clamps (`kiblnd_tunables_setup`) and leaves the **effective**
//! values: [`ParsedConfig::tunables`] is always finalized. Finalizing is idempotent. Times are
//! kept as whole seconds, as written in the file; [`Tunables::tx_timeout`] and friends give
//! [`Duration`]s with o2iblnd's special values (`0`) resolved.
//!
//! The format rules in detail (comments, continuation lines and their line numbers, quoting,
//! `-` versus `_`) are in `docs/tunables.md`.

mod error;
mod modprobe;
mod params;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::time::Duration;

pub use error::{Location, TunablesError, Warning, WarningKind};
pub use params::{CONNS_PER_PEER_MAX, IB_MTUS, PEER_CREDITS_MAX, PEER_CREDITS_MIN};

use modprobe::Reader;
use params::{Kind, Param, Settings};

/// The LND timeout LNet computes when `timeout=0`: `(transaction_timeout - 1) /
/// (retry_count + 1)` with LNet's defaults (150 s, 2 retries).
pub const LNET_LND_TIMEOUT_SECS: u32 = 49;

/// The floor of the connection-setup timeout (`RDMA_RESOLVE_TIMEOUT`, 5 s).
pub const CONNECT_TIMEOUT_MIN: Duration = Duration::from_secs(5);

/// The `ko2iblnd` module parameters, one typed field per parameter, named as in o2iblnd.
///
/// Each field documents its default, the values accepted, and what o2iblnd (and this
/// implementation) does with values outside them: *refused* means parsing or
/// [`finalize`](Tunables::finalize) fails with [`TunablesError::OutOfRange`]; *clamped* means the
/// value is changed and a [`Warning`] says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tunables {
    /// The rdma_cm port (within `RDMA_PS_TCP`) the listener binds and peers connect to.
    /// Default 987; 1..=65535, else refused.
    pub service: u16,
    /// Checksum every message (not RDMA data) with o2iblnd's `ibm_cksum`. Default off.
    pub cksum: bool,
    /// Seconds before a queued or in-flight tx times out and closes its connection; 0 uses
    /// LNet's LND timeout ([`LNET_LND_TIMEOUT_SECS`]). Default 50; negative refused. The
    /// connection-setup timeout is derived from it ([`Tunables::connect_timeout`]).
    pub timeout: u32,
    /// Seconds without a send after which a NOOP keepalive goes out; 0 disables. Default 100;
    /// negative treated as 0 (o2iblnd disables keepalives for any value <= 0).
    pub keepalive: u32,
    /// Tx descriptors across all CPU partitions; each partition's pool holds
    /// `max(256, ntx / ncpts)` ([`Tunables::tx_pool_size_per_cpt`]) and grows on demand.
    /// Default 512; negative refused.
    pub ntx: u32,
    /// LNet's per-interface send credits (messages in flight over this NI). Default 256;
    /// at least 1, else refused. Caps `peer_credits`.
    pub credits: u32,
    /// The queue depth Q of a connection: messages in flight to one peer, receive buffers
    /// (2Q + 2 per connection) and LNet's per-peer credits. Default 8; clamped to 8..=255
    /// ([`PEER_CREDITS_MIN`]..=[`PEER_CREDITS_MAX`]) and then to at most `credits`.
    pub peer_credits: u32,
    /// Outstanding (unreturned) credits at which a NOOP is sent to return them. 0 means Q/2;
    /// other values are clamped to [Q/2, Q-1]. Default 0. Per connection it scales with the
    /// negotiated queue depth: [`Tunables::peer_credits_hiw_for`].
    pub peer_credits_hiw: u32,
    /// Sends posted at once on one connection. 0 means Q; other values are clamped to
    /// [Q/2, 2Q]; below Q an [`WarningKind::Advisory`] warning is given. Default 0. Per
    /// connection: [`Tunables::concurrent_sends_for`].
    pub concurrent_sends: u32,
    /// Obsolete: always 1 (bulk buffers are always mapped on demand). Any value is accepted
    /// with a [`WarningKind::Obsolete`] warning and forced to 1.
    pub map_on_demand: u32,
    /// Memory-registration (FastReg) descriptors across all CPU partitions; each partition's
    /// pool holds `max(256, fmr_pool_size / ncpts)`. Default 512; must be at least `ntx / 4`,
    /// else refused ([`TunablesError::Inconsistent`]), as o2iblnd refuses to start.
    pub fmr_pool_size: u32,
    /// Dirty registrations that trigger a pool flush; per partition
    /// `max(192, fmr_flush_trigger / ncpts)`. Default 384.
    pub fmr_flush_trigger: u32,
    /// Cache registrations for reuse. Default on.
    pub fmr_cache: bool,
    /// Allow registrations whose fragments do not meet at page boundaries (SG_GAPS memory
    /// regions: slower). Without it such a transfer fails with `-EPROTONOSUPPORT`. Default off.
    pub use_fastreg_gaps: bool,
    /// Force this path MTU in bytes: 256, 512, 1024, 2048 or 4096; 0 keeps the path's own.
    /// Default 0; other values refused.
    pub ib_mtu: u32,
    /// Transport retries of an unacknowledged packet before the QP fails (CM `retry_count`).
    /// Default 5; 0..=7, else refused.
    pub retry_count: u8,
    /// Retries after a receiver-not-ready NAK (CM `rnr_retry_count`; 7 retries forever).
    /// Default 6; 0..=7, else refused.
    pub rnr_retry_count: u8,
    /// Bind active connections to a source port below 1024 (tried from 1023 down). Default on.
    pub use_privileged_port: bool,
    /// Refuse passive connections from a source port of 1024 or above. Default off.
    pub require_privileged_port: bool,
    /// The interface used when `networks=o2ibN` names none. Default `ib0`; a valid interface
    /// name (1..=15 bytes, no blanks, `/`, quotes, `#`, `\`, `,`, `(`, `)`, `=`), else refused.
    pub ipif_name: String,
    /// Scheduler (progress) threads per CPU partition; 0 picks automatically
    /// ([`Tunables::scheduler_threads`]: one). Default 0; negative treated as 0.
    pub nscheds: u32,
    /// Connections (QPs) the active side opens to each peer; sends round-robin over them.
    /// Default 1; 0 is raised to 1; 1..=[`CONNS_PER_PEER_MAX`], else refused.
    pub conns_per_peer: u32,
    /// Scatter/gather elements per RDMA work request (`max_send_sge`). Default 2; at least 1,
    /// else refused; the device clamps it to its `max_send_sge` when the QP is created.
    pub wrq_sge: u32,
    /// **lnd-rs extension** (no o2iblnd equivalent): microseconds the scheduler keeps polling
    /// the device after its last piece of work before it sleeps in the poller. Trades CPU for
    /// latency while traffic flows; an idle interface still sleeps. Default 200; 0..=1000000.
    pub busy_poll_usec: u32,
    /// **lnd-rs extension** (no o2iblnd equivalent): the peer NIDs allowed to connect to this
    /// interface; a connection request from any other NID is rejected with o2iblnd's FATAL
    /// reason and counted. Empty (the default) accepts every peer of the network. Written as
    /// a comma-separated list: `accept_nids="10.0.0.2@o2ib,10.0.0.3@o2ib"`.
    pub accept_nids: Vec<lnet_shim::nid::Nid>,
    /// Seconds without news before LNet declares a peer (router) dead; 0 disables. Default
    /// 180; negative treated as 0.
    pub peer_timeout: u32,
    /// Router buffer credits per peer; 0 uses LNet's default. Default 0; negative treated as 0
    /// (LNet uses the value only when it is above 0).
    pub peer_buffer_credits: u32,
    /// Failover between bonded HCAs: 0 off, 1 on, 2 forced (debugging). Default 0; other
    /// values refused.
    pub dev_failover: u32,
    /// RoCE type of service for connections; -1 leaves it unset. Default -1; -1..=255, else
    /// refused.
    pub tos: i32,
}

impl Default for Tunables {
    /// o2iblnd's module-parameter defaults (`o2iblnd_modparams.c`, Lustre master).
    fn default() -> Self {
        Tunables {
            service: 987,
            cksum: false,
            timeout: 50,
            keepalive: 100,
            ntx: 512,
            credits: 256,
            peer_credits: 8,
            peer_credits_hiw: 0,
            concurrent_sends: 0,
            map_on_demand: 1,
            fmr_pool_size: 512,
            fmr_flush_trigger: 384,
            fmr_cache: true,
            use_fastreg_gaps: false,
            ib_mtu: 0,
            retry_count: 5,
            rnr_retry_count: 6,
            use_privileged_port: true,
            require_privileged_port: false,
            ipif_name: "ib0".to_owned(),
            nscheds: 0,
            conns_per_peer: 1,
            wrq_sge: 2,
            busy_poll_usec: 200,
            accept_nids: Vec::new(),
            peer_timeout: 180,
            peer_buffer_credits: 0,
            dev_failover: 0,
            tos: -1,
        }
    }
}

/// One `options lnet key=value` parameter, kept for the LNet layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LnetOption {
    /// The parameter name as written (`networks`, `ip2nets`, ...).
    pub key: String,
    /// The value with one pair of outer quotes removed (`o2ib0(lo)`), `None` for a bare name.
    pub value: Option<String>,
    /// Where it was written; `at.line` is the line holding the `key=value`.
    pub at: Location,
}

impl LnetOption {
    /// The name with `-` turned into `_`: the kernel matches parameter names that way.
    pub fn normalized_key(&self) -> String {
        self.key.replace('-', "_")
    }
}

/// The result of reading a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedConfig {
    /// The effective ko2iblnd tunables (finalized).
    pub tunables: Tunables,
    /// Every `options lnet` parameter, in file order.
    pub lnet_options: Vec<LnetOption>,
    /// Notes: clamped values, obsolete parameters, ignored directives and modules, overridden
    /// values, advisories. In file order, then finalization notes in parameter order.
    pub warnings: Vec<Warning>,
}

impl ParsedConfig {
    /// The last `options lnet` parameter named `key` (`-` and `_` compare equal), if any.
    pub fn lnet_option(&self, key: &str) -> Option<&LnetOption> {
        let key = key.replace('-', "_");
        self.lnet_options.iter().rev().find(|o| o.normalized_key() == key)
    }

    /// LNet's configuration: lnet-shim's defaults ([`lnet_shim::LnetConfig`]) with what the
    /// file's `options lnet` parameters set of it, `lnet_transaction_timeout` (seconds, 1 to
    /// 2^31 - 1, LNet's default 150: how long an ACK or REPLY is waited for). A bad value is
    /// refused with its place in the file. The other parameters (`networks`, ...) are the
    /// caller's to read.
    pub fn lnet_config(&self) -> Result<lnet_shim::LnetConfig, TunablesError> {
        let mut config = lnet_shim::LnetConfig::default();
        if let Some(o) = self.lnet_option("lnet_transaction_timeout") {
            let key = o.normalized_key();
            let Some(value) = o.value.clone() else {
                return Err(TunablesError::MissingValue { at: o.at.clone(), key });
            };
            let secs = match params::parse_c_int(&value) {
                params::CInt::Ok(n) => n,
                params::CInt::Overflow => i64::MAX,
                params::CInt::Invalid => {
                    return Err(TunablesError::InvalidInteger { at: o.at.clone(), key, value });
                }
            };
            let secs = u64::try_from(secs).ok().filter(|s| (1..=i64::from(i32::MAX) as u64).contains(s));
            let Some(secs) = secs else {
                return Err(TunablesError::OutOfRange {
                    at: o.at.clone(),
                    key,
                    value,
                    allowed: "1 to 2147483647 seconds",
                });
            };
            config.transaction_timeout = Some(std::time::Duration::from_secs(secs));
        }
        Ok(config)
    }
}

impl Tunables {
    /// The names of every current ko2iblnd parameter, in [`Tunables::to_modprobe_string`] order
    /// (the obsolete `map_on_demand`, which that line leaves out, included).
    pub fn parameter_names() -> impl Iterator<Item = &'static str> {
        Param::ALL.into_iter().map(Param::name)
    }

    /// Parses modprobe.d text. `source_name` is used in locations (normally the file path).
    pub fn parse_str(source_name: &str, text: &str) -> Result<ParsedConfig, TunablesError> {
        Tunables::parse_sources([(source_name, text)])
    }

    /// Parses several modprobe.d texts as one configuration, in order (as modprobe reads every
    /// file under `/etc/modprobe.d`): later settings override earlier ones, with a warning.
    pub fn parse_sources<'a>(
        sources: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<ParsedConfig, TunablesError> {
        let mut settings = Settings::from_tunables(&Tunables::default());
        let mut lnet_options = Vec::new();
        let mut warnings = Vec::new();
        for (name, text) in sources {
            Reader::new(name, &mut settings, &mut lnet_options, &mut warnings).read(text)?;
        }
        let (tunables, notes) = params::resolve(&settings)?;
        warnings.extend(notes);
        Ok(ParsedConfig { tunables, lnet_options, warnings })
    }

    /// Reads and parses a modprobe.d file; locations name it by `path`.
    pub fn load(path: &Path) -> Result<ParsedConfig, TunablesError> {
        let bytes =
            std::fs::read(path).map_err(|source| TunablesError::Io { path: path.to_owned(), source })?;
        let name = path.display().to_string();
        match std::str::from_utf8(&bytes) {
            Ok(text) => Tunables::parse_str(&name, text),
            Err(e) => {
                let line = 1 + bytes[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count();
                Err(TunablesError::NotUtf8 { at: Location::new(name, line, line) })
            }
        }
    }

    /// Applies o2iblnd's derived defaults and clamps (`kiblnd_tunables_setup`) to values set in
    /// code, exactly as for a file: on success the fields hold the effective values and the
    /// notes are returned (without locations); on error `self` is unchanged and the error's
    /// location is [`Location::program`]. Idempotent.
    pub fn finalize(&mut self) -> Result<Vec<Warning>, TunablesError> {
        let (t, notes) = params::resolve(&Settings::from_tunables(self))?;
        *self = t;
        Ok(notes)
    }

    /// [`Tunables::finalize`] by value.
    pub fn finalized(mut self) -> Result<(Tunables, Vec<Warning>), TunablesError> {
        let notes = self.finalize()?;
        Ok((self, notes))
    }

    /// The values as one `options ko2iblnd ...` line (no newline), every current parameter in
    /// table order; obsolete `map_on_demand` is left out. Parsing the line gives back these
    /// values; call it on finalized tunables to render the effective configuration.
    pub fn to_modprobe_string(&self) -> String {
        let settings = Settings::from_tunables(self);
        let mut out = String::from("options ko2iblnd");
        for p in Param::ALL {
            if p.is_obsolete() {
                continue;
            }
            let text = &settings.get(p).text;
            out.push(' ');
            out.push_str(p.name());
            out.push('=');
            if p.kind() == Kind::Str && needs_quotes(text) {
                let q = if text.contains('"') { '\'' } else { '"' };
                out.push(q);
                out.push_str(text);
                out.push(q);
            } else {
                out.push_str(text);
            }
        }
        out
    }

    /// The NOOP high-water mark of a connection whose negotiated queue depth is `queue_depth`:
    /// `queue_depth * peer_credits_hiw / peer_credits` (LU-15828: a peer that negotiated a
    /// smaller queue returns credits proportionally earlier), kept in
    /// `[max(1, Q/2), max(1, Q-1)]` so a NOOP is never due with nothing to return. Equals
    /// `peer_credits_hiw` when `queue_depth == peer_credits` (Q >= 2); 0 for a zero queue.
    pub fn peer_credits_hiw_for(&self, queue_depth: u32) -> u32 {
        if queue_depth == 0 {
            return 0;
        }
        let pc = self.peer_credits.max(1);
        let hiw = if self.peer_credits_hiw == 0 { pc / 2 } else { self.peer_credits_hiw };
        let scaled = scale(queue_depth, hiw, pc);
        scaled.clamp((queue_depth / 2).max(1), (queue_depth - 1).max(1))
    }

    /// The posted-sends limit of a connection whose negotiated queue depth is `queue_depth`:
    /// `queue_depth * concurrent_sends / peer_credits`, kept in `[max(1, Q/2), 2Q]` (the
    /// NI-wide rule applied per connection). Equals `concurrent_sends` when
    /// `queue_depth == peer_credits`. o2iblnd itself uses the NI-wide value unchanged on V2
    /// connections, which can exceed 2Q on a connection whose queue was reduced; scaling keeps
    /// the invariant. 0 for a zero queue.
    pub fn concurrent_sends_for(&self, queue_depth: u32) -> u32 {
        if queue_depth == 0 {
            return 0;
        }
        let pc = self.peer_credits.max(1);
        let cs = if self.concurrent_sends == 0 { pc } else { self.concurrent_sends };
        let scaled = scale(queue_depth, cs, pc);
        scaled.clamp((queue_depth / 2).max(1), queue_depth.saturating_mul(2))
    }

    /// The tx timeout: `timeout` seconds, or [`LNET_LND_TIMEOUT_SECS`] when it is 0.
    pub fn tx_timeout(&self) -> Duration {
        let secs = if self.timeout == 0 { LNET_LND_TIMEOUT_SECS } else { self.timeout };
        Duration::from_secs(u64::from(secs))
    }

    /// The connection-setup timeout: `max(5 s, tx_timeout / 4)` in whole seconds, as o2iblnd
    /// divides its integer seconds (LU-17480): 12 s for the default 50 s.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.tx_timeout().as_secs() / 4).max(CONNECT_TIMEOUT_MIN)
    }

    /// The idle time before a keepalive NOOP, `None` when keepalives are disabled.
    pub fn keepalive_interval(&self) -> Option<Duration> {
        (self.keepalive > 0).then(|| Duration::from_secs(u64::from(self.keepalive)))
    }

    /// LNet's peer-death timeout, `None` when disabled.
    pub fn peer_timeout_duration(&self) -> Option<Duration> {
        (self.peer_timeout > 0).then(|| Duration::from_secs(u64::from(self.peer_timeout)))
    }

    /// The forced path MTU, `None` to keep the path's own.
    pub fn path_mtu(&self) -> Option<u32> {
        (self.ib_mtu != 0).then_some(self.ib_mtu)
    }

    /// The type of service to set on connections, `None` when unset (`tos = -1`).
    pub fn type_of_service(&self) -> Option<u8> {
        u8::try_from(self.tos).ok()
    }

    /// Scheduler threads the driver runs for an interface on a machine of `cpus` CPUs:
    /// `min(nscheds, cpus)` when `nscheds` is set, else 1; never below one.
    ///
    /// o2iblnd's automatic count is `min(max(2, cpus / 2), cpus)` per CPU partition. Here a
    /// scheduler busy-polls and owns whole peers, and on the software device frames arrive
    /// through one socket that the first scheduler reads, so a second scheduler only pays off
    /// with many peers and spare cores: it is started only when asked for. (Measured on two
    /// CPUs with one peer: two schedulers moved 4 KiB RPCs at half the rate of one.)
    pub fn scheduler_threads(&self, cpus: u32) -> u32 {
        if self.nscheds > 0 { self.nscheds.min(cpus).max(1) } else { 1 }
    }

    /// Initial tx descriptors per CPU partition: `max(256, ntx / ncpts)`.
    pub fn tx_pool_size_per_cpt(&self, ncpts: u32) -> u32 {
        (self.ntx / ncpts.max(1)).max(256)
    }

    /// Initial registration descriptors per CPU partition: `max(256, fmr_pool_size / ncpts)`.
    pub fn fmr_pool_size_per_cpt(&self, ncpts: u32) -> u32 {
        (self.fmr_pool_size / ncpts.max(1)).max(256)
    }

    /// Dirty registrations that flush a partition's pool: `max(192, fmr_flush_trigger / ncpts)`.
    pub fn fmr_flush_trigger_per_cpt(&self, ncpts: u32) -> u32 {
        (self.fmr_flush_trigger / ncpts.max(1)).max(192)
    }
}

/// `q * v / pc` in 64 bits, saturated to `u32`.
fn scale(q: u32, v: u32, pc: u32) -> u32 {
    u32::try_from(u64::from(q) * u64::from(v) / u64::from(pc.max(1))).unwrap_or(u32::MAX)
}

/// Whether a string value must be quoted to read back as one word.
fn needs_quotes(s: &str) -> bool {
    s.is_empty() || s.chars().any(|c| c.is_whitespace() || matches!(c, '#' | '"' | '\'' | '\\'))
}
