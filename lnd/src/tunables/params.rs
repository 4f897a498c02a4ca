//! The ko2iblnd parameter table and o2iblnd's rules for each value.
//!
//! Parsing turns every `key=value` into a [`Setting`] (an integer, boolean or string plus the
//! text as written and where it was written). [`resolve`] then applies o2iblnd's rules to the
//! whole set at once, in the order `kiblnd_tunables_setup` applies them: per-value range checks
//! first, then `peer_credits` against `credits`, then `peer_credits_hiw` and `concurrent_sends`
//! against the resulting queue depth, then the pool-size check of `kiblnd_net_init_pools`.
//! [`Tunables::finalize`](super::Tunables::finalize) runs the same function on values set in
//! code, so a file and a program get identical results.

use super::Tunables;
use super::error::{Location, TunablesError, Warning, WarningKind};

/// The lowest `peer_credits` o2iblnd accepts (`IBLND_CREDITS_DEFAULT`); lower values are raised.
pub const PEER_CREDITS_MIN: u32 = 8;
/// The highest `peer_credits` o2iblnd accepts (`IBLND_CREDITS_MAX`, the 8-bit `ibm_credits`
/// wire field); higher values are lowered.
pub const PEER_CREDITS_MAX: u32 = 255;
/// The highest `conns_per_peer` this implementation accepts.
pub const CONNS_PER_PEER_MAX: u32 = 127;
/// The path MTUs `ib_mtu` may force (0 keeps the path's own MTU).
pub const IB_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

const INT_MAX: i64 = i32::MAX as i64;
const INT_MIN: i64 = i32::MIN as i64;
const C_INT: &str = "-2147483648..=2147483647 (a C int)";

/// How a parameter's value is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An integer (`kstrtoint` syntax).
    Int,
    /// A flag: o2iblnd declares these `int` and tests them for non-zero.
    Bool,
    /// A string (`charp`).
    Str,
}

/// Every current ko2iblnd parameter. The order is the rendering order of
/// [`Tunables::to_modprobe_string`](super::Tunables::to_modprobe_string).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Param {
    Service,
    Cksum,
    Timeout,
    Keepalive,
    Ntx,
    Credits,
    PeerCredits,
    PeerCreditsHiw,
    ConcurrentSends,
    MapOnDemand,
    FmrPoolSize,
    FmrFlushTrigger,
    FmrCache,
    UseFastregGaps,
    IbMtu,
    RetryCount,
    RnrRetryCount,
    UsePrivilegedPort,
    RequirePrivilegedPort,
    IpifName,
    Nscheds,
    ConnsPerPeer,
    WrqSge,
    PeerTimeout,
    PeerBufferCredits,
    DevFailover,
    Tos,
    /// lnd-rs extension (not an o2iblnd parameter).
    BusyPollUsec,
    /// lnd-rs extension (not an o2iblnd parameter).
    AcceptNids,
}

/// Number of current parameters.
pub(crate) const NPARAMS: usize = 29;

impl Param {
    pub(crate) const ALL: [Param; NPARAMS] = [
        Param::Service,
        Param::Cksum,
        Param::Timeout,
        Param::Keepalive,
        Param::Ntx,
        Param::Credits,
        Param::PeerCredits,
        Param::PeerCreditsHiw,
        Param::ConcurrentSends,
        Param::MapOnDemand,
        Param::FmrPoolSize,
        Param::FmrFlushTrigger,
        Param::FmrCache,
        Param::UseFastregGaps,
        Param::IbMtu,
        Param::RetryCount,
        Param::RnrRetryCount,
        Param::UsePrivilegedPort,
        Param::RequirePrivilegedPort,
        Param::IpifName,
        Param::Nscheds,
        Param::ConnsPerPeer,
        Param::WrqSge,
        Param::PeerTimeout,
        Param::PeerBufferCredits,
        Param::DevFailover,
        Param::Tos,
        Param::BusyPollUsec,
        Param::AcceptNids,
    ];

    /// The module parameter name.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Param::Service => "service",
            Param::Cksum => "cksum",
            Param::Timeout => "timeout",
            Param::Keepalive => "keepalive",
            Param::Ntx => "ntx",
            Param::Credits => "credits",
            Param::PeerCredits => "peer_credits",
            Param::PeerCreditsHiw => "peer_credits_hiw",
            Param::ConcurrentSends => "concurrent_sends",
            Param::MapOnDemand => "map_on_demand",
            Param::FmrPoolSize => "fmr_pool_size",
            Param::FmrFlushTrigger => "fmr_flush_trigger",
            Param::FmrCache => "fmr_cache",
            Param::UseFastregGaps => "use_fastreg_gaps",
            Param::IbMtu => "ib_mtu",
            Param::RetryCount => "retry_count",
            Param::RnrRetryCount => "rnr_retry_count",
            Param::UsePrivilegedPort => "use_privileged_port",
            Param::RequirePrivilegedPort => "require_privileged_port",
            Param::IpifName => "ipif_name",
            Param::Nscheds => "nscheds",
            Param::ConnsPerPeer => "conns_per_peer",
            Param::WrqSge => "wrq_sge",
            Param::PeerTimeout => "peer_timeout",
            Param::PeerBufferCredits => "peer_buffer_credits",
            Param::DevFailover => "dev_failover",
            Param::Tos => "tos",
            Param::BusyPollUsec => "busy_poll_usec",
            Param::AcceptNids => "accept_nids",
        }
    }

    pub(crate) const fn kind(self) -> Kind {
        match self {
            Param::Cksum
            | Param::FmrCache
            | Param::UseFastregGaps
            | Param::UsePrivilegedPort
            | Param::RequirePrivilegedPort => Kind::Bool,
            Param::IpifName | Param::AcceptNids => Kind::Str,
            _ => Kind::Int,
        }
    }

    /// Whether the parameter is obsolete (accepted with a warning, has no effect).
    pub(crate) const fn is_obsolete(self) -> bool {
        matches!(self, Param::MapOnDemand)
    }

    pub(crate) fn from_name(name: &str) -> Option<Param> {
        Param::ALL.into_iter().find(|p| p.name() == name)
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// Parameters o2iblnd once had and no longer has: accepted with a warning, no effect.
pub(crate) const REMOVED: &[(&str, &str)] = &[(
    "pmr_pool_size",
    "physical MR pools were removed from o2iblnd; FastReg pools are sized by fmr_pool_size",
)];

/// A parsed value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value {
    Int(i64),
    Bool(bool),
    Str(String),
}

/// One parameter's value, its text as written and where it was written (`None`: a default or a
/// value set in code).
#[derive(Clone, Debug)]
pub(crate) struct Setting {
    pub value: Value,
    pub text: String,
    pub at: Option<Location>,
}

/// A value for every parameter.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    slots: Vec<Setting>,
}

impl Settings {
    /// The values of `t`, marked as set in code.
    pub(crate) fn from_tunables(t: &Tunables) -> Settings {
        let slots = Param::ALL
            .iter()
            .map(|&p| {
                let value = field_value(t, p);
                let text = match &value {
                    Value::Int(i) => i.to_string(),
                    Value::Bool(b) => u8::from(*b).to_string(),
                    Value::Str(s) => s.clone(),
                };
                Setting { value, text, at: None }
            })
            .collect();
        Settings { slots }
    }

    pub(crate) fn get(&self, p: Param) -> &Setting {
        &self.slots[p.index()]
    }

    /// Replaces `p`'s setting, returning the previous one.
    pub(crate) fn set(&mut self, p: Param, s: Setting) -> Setting {
        std::mem::replace(&mut self.slots[p.index()], s)
    }
}

fn field_value(t: &Tunables, p: Param) -> Value {
    let int = |v: u32| Value::Int(i64::from(v));
    match p {
        Param::Service => int(u32::from(t.service)),
        Param::Cksum => Value::Bool(t.cksum),
        Param::Timeout => int(t.timeout),
        Param::Keepalive => int(t.keepalive),
        Param::Ntx => int(t.ntx),
        Param::Credits => int(t.credits),
        Param::PeerCredits => int(t.peer_credits),
        Param::PeerCreditsHiw => int(t.peer_credits_hiw),
        Param::ConcurrentSends => int(t.concurrent_sends),
        Param::MapOnDemand => int(t.map_on_demand),
        Param::FmrPoolSize => int(t.fmr_pool_size),
        Param::FmrFlushTrigger => int(t.fmr_flush_trigger),
        Param::FmrCache => Value::Bool(t.fmr_cache),
        Param::UseFastregGaps => Value::Bool(t.use_fastreg_gaps),
        Param::IbMtu => int(t.ib_mtu),
        Param::RetryCount => int(u32::from(t.retry_count)),
        Param::RnrRetryCount => int(u32::from(t.rnr_retry_count)),
        Param::UsePrivilegedPort => Value::Bool(t.use_privileged_port),
        Param::RequirePrivilegedPort => Value::Bool(t.require_privileged_port),
        Param::IpifName => Value::Str(t.ipif_name.clone()),
        Param::Nscheds => int(t.nscheds),
        Param::ConnsPerPeer => int(t.conns_per_peer),
        Param::WrqSge => int(t.wrq_sge),
        Param::PeerTimeout => int(t.peer_timeout),
        Param::PeerBufferCredits => int(t.peer_buffer_credits),
        Param::DevFailover => int(t.dev_failover),
        Param::Tos => Value::Int(i64::from(t.tos)),
        Param::BusyPollUsec => int(t.busy_poll_usec),
        Param::AcceptNids => {
            Value::Str(t.accept_nids.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
        }
    }
}

/// Result of reading an integer the way the kernel's `kstrtoint(s, 0, ..)` does.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CInt {
    Ok(i64),
    /// Not an integer.
    Invalid,
    /// An integer too large for 64 bits (certainly out of range).
    Overflow,
}

/// Parses an integer like `kstrtoint(s, 0, ..)`: optional `+`/`-`, then `0x`/`0X` hexadecimal,
/// a leading `0` octal, or decimal; one trailing newline allowed; nothing else.
pub(crate) fn parse_c_int(s: &str) -> CInt {
    let s = s.strip_suffix('\n').unwrap_or(s);
    let (neg, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (radix, digits) = if let Some(hex) = digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        (16, hex)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits)
    };
    if digits.is_empty() {
        return CInt::Invalid;
    }
    let mut acc: i64 = 0;
    let mut overflow = false;
    for c in digits.chars() {
        let Some(d) = c.to_digit(radix) else {
            return CInt::Invalid;
        };
        match acc.checked_mul(i64::from(radix)).and_then(|a| a.checked_add(i64::from(d))) {
            Some(a) => acc = a,
            None => overflow = true,
        }
    }
    if overflow {
        CInt::Overflow
    } else if neg {
        CInt::Ok(-acc)
    } else {
        CInt::Ok(acc)
    }
}

/// Parses a flag: any integer (non-zero is true, as o2iblnd's `int` flags), or `y`/`n`,
/// `yes`/`no`, `true`/`false`, `on`/`off` in any case.
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    match parse_c_int(s) {
        CInt::Ok(i) => return Some(i != 0),
        CInt::Overflow => return Some(true),
        CInt::Invalid => {}
    }
    match s.to_ascii_lowercase().as_str() {
        "y" | "yes" | "true" | "on" => Some(true),
        "n" | "no" | "false" | "off" => Some(false),
        _ => None,
    }
}

/// Why `name` is not an acceptable `ipif_name`, if it is not.
fn bad_ifname(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("empty interface name");
    }
    if name.len() > 15 {
        return Some("interface name longer than 15 bytes (IFNAMSIZ - 1)");
    }
    if name == "." || name == ".." {
        return Some("not an interface name");
    }
    let bad = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || matches!(c, '/' | '"' | '\'' | '#' | '\\' | ',' | '(' | ')' | '=')
    };
    if name.chars().any(bad) {
        return Some(
            "interface name contains a character Linux or LNet does not allow \
             (whitespace, / \" ' # \\ , ( ) =)",
        );
    }
    None
}

/// Parses `accept_nids`: NIDs separated by commas (blanks around them allowed); empty is the
/// empty list; `None` if any entry is not a NID.
fn parse_nid_list(s: &str) -> Option<Vec<lnet_shim::nid::Nid>> {
    if s.trim().is_empty() {
        return Some(Vec::new());
    }
    s.split(',').map(|n| n.trim().parse().ok()).collect()
}

/// Applies o2iblnd's rules to a complete set of values.
pub(crate) fn resolve(s: &Settings) -> Result<(Tunables, Vec<Warning>), TunablesError> {
    let mut r = Rules { s, warnings: Vec::new() };
    let t = r.run()?;
    Ok((t, r.warnings))
}

struct Rules<'a> {
    s: &'a Settings,
    warnings: Vec<Warning>,
}

impl Rules<'_> {
    fn at(&self, p: Param) -> Location {
        self.s.get(p).at.clone().unwrap_or_else(Location::program)
    }

    fn text(&self, p: Param) -> &str {
        &self.s.get(p).text
    }

    fn note(&mut self, p: Param, kind: WarningKind, message: String) {
        let at = self.s.get(p).at.clone();
        self.warnings.push(Warning::new(at, kind, message));
    }

    fn out_of_range(&self, p: Param, allowed: &'static str) -> TunablesError {
        TunablesError::OutOfRange {
            at: self.at(p),
            key: p.name().to_owned(),
            value: self.text(p).to_owned(),
            allowed,
        }
    }

    /// The integer value of `p` (a `Bool` reads as 0/1, a `Str` as 0: kinds always match here).
    fn raw_int(&self, p: Param) -> i64 {
        match &self.s.get(p).value {
            Value::Int(i) => *i,
            Value::Bool(b) => i64::from(*b),
            Value::Str(_) => 0,
        }
    }

    fn int_in(&self, p: Param, lo: i64, hi: i64, allowed: &'static str) -> Result<i64, TunablesError> {
        let v = self.raw_int(p);
        if (lo..=hi).contains(&v) { Ok(v) } else { Err(self.out_of_range(p, allowed)) }
    }

    /// A `u32` in `lo..=hi` (the caller keeps `lo >= 0`).
    fn uint_in(&self, p: Param, lo: i64, hi: i64, allowed: &'static str) -> Result<u32, TunablesError> {
        let v = self.int_in(p, lo, hi, allowed)?;
        Ok(u32::try_from(v).unwrap_or(u32::MAX))
    }

    /// A C int where o2iblnd reads every value <= 0 as "off"/"auto": negatives become 0 with a
    /// note saying what 0 means.
    fn int_or_zero(&mut self, p: Param, zero_means: &str) -> Result<u32, TunablesError> {
        let v = self.int_in(p, INT_MIN, INT_MAX, C_INT)?;
        if v < 0 {
            let msg = format!("{}={} treated as 0 ({zero_means})", p.name(), self.text(p));
            self.note(p, WarningKind::Clamped, msg);
            return Ok(0);
        }
        Ok(u32::try_from(v).unwrap_or(u32::MAX))
    }

    fn flag(&self, p: Param) -> bool {
        self.raw_int(p) != 0
    }

    fn run(&mut self) -> Result<Tunables, TunablesError> {
        use Param as P;

        // Values checked on their own, in table order.
        let service = self.uint_in(P::Service, 1, 65535, "1..=65535 (a port number)")?;
        let cksum = self.flag(P::Cksum);
        let timeout =
            self.uint_in(P::Timeout, 0, INT_MAX, "0 (LNet's LND timeout) or 1..=2147483647 seconds")?;
        let keepalive = self.int_or_zero(P::Keepalive, "keepalives disabled")?;
        let ntx = self.uint_in(P::Ntx, 0, INT_MAX, "0..=2147483647")?;
        let credits = self.int_in(P::Credits, 1, INT_MAX, "1..=2147483647")?;
        let peer_credits = self.int_in(P::PeerCredits, INT_MIN, INT_MAX, C_INT)?;
        let hiw = self.int_in(P::PeerCreditsHiw, INT_MIN, INT_MAX, C_INT)?;
        let concurrent_sends = self.int_in(P::ConcurrentSends, INT_MIN, INT_MAX, C_INT)?;
        let map_on_demand = self.int_in(P::MapOnDemand, INT_MIN, INT_MAX, C_INT)?;
        let fmr_pool_size = self.uint_in(P::FmrPoolSize, 0, INT_MAX, "0..=2147483647")?;
        let fmr_flush_trigger = self.uint_in(P::FmrFlushTrigger, 0, INT_MAX, "0..=2147483647")?;
        let fmr_cache = self.flag(P::FmrCache);
        let use_fastreg_gaps = self.flag(P::UseFastregGaps);
        let ib_mtu = self.raw_int(P::IbMtu);
        if ib_mtu != 0 && !IB_MTUS.iter().any(|&m| i64::from(m) == ib_mtu) {
            return Err(self.out_of_range(P::IbMtu, "0 (path MTU), 256, 512, 1024, 2048 or 4096"));
        }
        let retry_count = self.uint_in(P::RetryCount, 0, 7, "0..=7 (a 3-bit CM field)")?;
        let rnr_retry_count =
            self.uint_in(P::RnrRetryCount, 0, 7, "0..=7 (a 3-bit CM field, 7 = forever)")?;
        let use_privileged_port = self.flag(P::UsePrivilegedPort);
        let require_privileged_port = self.flag(P::RequirePrivilegedPort);
        let ipif_name = match &self.s.get(P::IpifName).value {
            Value::Str(s) => s.clone(),
            _ => String::new(),
        };
        if let Some(reason) = bad_ifname(&ipif_name) {
            return Err(TunablesError::InvalidString {
                at: self.at(P::IpifName),
                key: P::IpifName.name().to_owned(),
                value: self.text(P::IpifName).to_owned(),
                reason,
            });
        }
        let nscheds = self.int_or_zero(P::Nscheds, "automatic: one scheduler thread")?;
        let mut conns_per_peer =
            self.uint_in(P::ConnsPerPeer, 0, i64::from(CONNS_PER_PEER_MAX), "1..=127 (0 means 1)")?;
        let wrq_sge = self.uint_in(P::WrqSge, 1, INT_MAX, "1..=2147483647")?;
        let peer_timeout = self.int_or_zero(P::PeerTimeout, "peer death detection disabled")?;
        // LNet uses a per-peer router buffer credit count only when it is above 0
        // (`lnet_peer_buffer_credits`): 0 and negatives alike mean its default.
        let peer_buffer_credits = self.int_or_zero(P::PeerBufferCredits, "LNet's default")?;
        let dev_failover =
            self.uint_in(P::DevFailover, 0, 2, "0 (off), 1 (on) or 2 (forced, for debugging)")?;
        let tos = self.int_in(P::Tos, -1, 255, "-1 (unset) or 0..=255")?;
        let busy_poll_usec = self.uint_in(P::BusyPollUsec, 0, 1_000_000, "0 (never spin) ..= 1000000")?;
        let accept_nids = match &self.s.get(P::AcceptNids).value {
            Value::Str(s) => parse_nid_list(s).ok_or_else(|| TunablesError::InvalidString {
                at: self.at(P::AcceptNids),
                key: P::AcceptNids.name().to_owned(),
                value: self.text(P::AcceptNids).to_owned(),
                reason: "not a comma-separated list of NIDs (e.g. 10.0.0.2@o2ib,10.0.0.3@o2ib)",
            })?,
            _ => Vec::new(),
        };

        // peer_credits (the queue depth Q): at least IBLND_CREDITS_DEFAULT, at most
        // IBLND_CREDITS_MAX, and never above credits; in that order, as o2iblnd.
        // Each step is reported ("raised to 8 (...), then lowered to 4 (...)"); the warning points
        // at peer_credits' line, or at credits' when only credits was set and lowered it.
        let mut q = peer_credits;
        let mut steps: Vec<String> = Vec::new();
        let mut step = |q: &mut i64, to: i64, why: String| {
            let dir = if to > *q { "raised" } else { "lowered" };
            steps.push(format!("{dir} to {to} ({why})"));
            *q = to;
        };
        if q < i64::from(PEER_CREDITS_MIN) {
            step(&mut q, i64::from(PEER_CREDITS_MIN), "o2iblnd's minimum".to_owned());
        }
        if q > i64::from(PEER_CREDITS_MAX) {
            let why = "o2iblnd's maximum: the wire's credit field is 8 bits".to_owned();
            step(&mut q, i64::from(PEER_CREDITS_MAX), why);
        }
        let by_credits = q > credits;
        if by_credits {
            step(&mut q, credits, format!("it may not exceed credits={credits}"));
        }
        if !steps.is_empty() {
            let msg = format!("peer_credits={} {}", self.text(P::PeerCredits), steps.join(", then "));
            let at = match self.s.get(P::PeerCredits).at.clone() {
                None if by_credits => self.s.get(P::Credits).at.clone(),
                at => at,
            };
            self.warnings.push(Warning::new(at, WarningKind::Clamped, msg));
        }

        // peer_credits_hiw: 0 means Q/2; otherwise kept in [Q/2, Q-1].
        let mut h = if hiw == 0 { q / 2 } else { hiw };
        let mut why = "";
        if h < q / 2 {
            h = q / 2;
            why = "peer_credits/2";
        }
        if h >= q {
            h = q - 1;
            why = "peer_credits-1";
        }
        if hiw != 0 && h != hiw {
            let dir = if h > hiw { "raised" } else { "lowered" };
            let msg = format!("peer_credits_hiw={} {dir} to {h} ({why})", self.text(P::PeerCreditsHiw));
            self.note(P::PeerCreditsHiw, WarningKind::Clamped, msg);
        }

        // concurrent_sends: 0 means Q; otherwise kept in [Q/2, 2Q].
        let mut c = if concurrent_sends == 0 { q } else { concurrent_sends };
        let mut why = "";
        if c > q * 2 {
            c = q * 2;
            why = "2 * peer_credits";
        }
        // o2iblnd's floor is Q/2; with Q = 1 that would allow 0 sends, so keep at least 1.
        let floor = (q / 2).max(1);
        if c < floor {
            c = floor;
            why = "peer_credits/2";
        }
        if concurrent_sends != 0 && c != concurrent_sends {
            let dir = if c > concurrent_sends { "raised" } else { "lowered" };
            let msg = format!("concurrent_sends={} {dir} to {c} ({why})", self.text(P::ConcurrentSends));
            self.note(P::ConcurrentSends, WarningKind::Clamped, msg);
        }
        if c < q {
            let msg =
                format!("concurrent_sends={c} is lower than peer_credits={q}: performance may drop slightly");
            self.note(P::ConcurrentSends, WarningKind::Advisory, msg);
        }

        // map_on_demand: obsolete, always 1 (o2iblnd maps every bulk buffer on demand).
        let mod_set_in_file = self.s.get(P::MapOnDemand).at.is_some();
        if mod_set_in_file || map_on_demand != 1 {
            let msg = format!(
                "map_on_demand={}: obsolete ko2iblnd parameter, accepted and forced to 1 \
                 (bulk buffers are always mapped on demand)",
                self.text(P::MapOnDemand)
            );
            self.note(P::MapOnDemand, WarningKind::Obsolete, msg);
        }

        // conns_per_peer: 0 means 1.
        if conns_per_peer == 0 {
            conns_per_peer = 1;
            let msg = format!("conns_per_peer={} raised to 1", self.text(P::ConnsPerPeer));
            self.note(P::ConnsPerPeer, WarningKind::Clamped, msg);
        }

        // kiblnd_net_init_pools refuses an MR pool smaller than ntx / 4.
        if fmr_pool_size < ntx / 4 {
            // Point at the value the file set (fmr_pool_size first), else at fmr_pool_size.
            let blame_ntx = self.s.get(P::FmrPoolSize).at.is_none() && self.s.get(P::Ntx).at.is_some();
            let (p, reason) = if blame_ntx {
                (
                    P::Ntx,
                    format!(
                        "ntx/4 = {} exceeds fmr_pool_size={fmr_pool_size}; o2iblnd refuses to \
                         start (lower ntx or raise fmr_pool_size to at least {})",
                        ntx / 4,
                        ntx / 4
                    ),
                )
            } else {
                (
                    P::FmrPoolSize,
                    format!(
                        "below ntx/4 = {} (ntx={ntx}); o2iblnd refuses to start (raise \
                         fmr_pool_size to at least {} or lower ntx)",
                        ntx / 4,
                        ntx / 4
                    ),
                )
            };
            return Err(TunablesError::Inconsistent {
                at: self.at(p),
                key: p.name().to_owned(),
                value: self.text(p).to_owned(),
                reason,
            });
        }

        let to_u32 = |v: i64| u32::try_from(v).unwrap_or(0);
        Ok(Tunables {
            service: u16::try_from(service).unwrap_or(u16::MAX),
            cksum,
            timeout,
            keepalive,
            ntx,
            credits: to_u32(credits),
            peer_credits: to_u32(q),
            peer_credits_hiw: to_u32(h),
            concurrent_sends: to_u32(c),
            map_on_demand: 1,
            fmr_pool_size,
            fmr_flush_trigger,
            fmr_cache,
            use_fastreg_gaps,
            ib_mtu: to_u32(ib_mtu),
            retry_count: u8::try_from(retry_count).unwrap_or(7),
            rnr_retry_count: u8::try_from(rnr_retry_count).unwrap_or(7),
            use_privileged_port,
            require_privileged_port,
            ipif_name,
            nscheds,
            conns_per_peer,
            wrq_sge,
            peer_timeout,
            peer_buffer_credits,
            dev_failover,
            tos: i32::try_from(tos).unwrap_or(-1),
            busy_poll_usec,
            accept_nids,
        })
    }
}

/// Levenshtein distance between two ASCII-ish strings (by bytes).
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, &ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The known parameter name closest to `key`, if reasonably close: at most a third of the
/// name's length away (at least 1, at most 3 edits), compared case-insensitively.
pub(crate) fn suggest(key: &str) -> Option<&'static str> {
    let key = key.to_ascii_lowercase();
    let names = Param::ALL.iter().map(|p| p.name()).chain(REMOVED.iter().map(|(n, _)| *n));
    let (best, d) = names.map(|n| (n, edit_distance(&key, n))).min_by_key(|&(_, d)| d)?;
    let limit = (key.len() / 3).clamp(1, 3);
    (d <= limit).then_some(best)
}
