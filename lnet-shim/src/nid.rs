//! Network identifiers: NIDs in LNet's 64-bit "nid4" encoding, networks, and process ids.
//!
//! A nid4 is `net << 32 | address`, where `net = lnd_type << 16 | network_number` and the
//! address is an IPv4 address in host order. `192.168.1.2@o2ib3` is net type 5 (o2ib), network
//! number 3, address 0xc0a80102. The textual forms follow LNet's: `a.b.c.d@o2ib` for network 0,
//! `a.b.c.d@o2ibN` otherwise, `0@lo` for the loopback network.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// LND type numbers LNet assigns (`enum lnet_nal` in `lnet-idl.h`); only the ones this crate
/// names are listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum NetType {
    /// The TCP socket LND (`tcp`), type 2.
    Tcp,
    /// The InfiniBand LND (`o2ib`), type 5.
    O2ib,
    /// The loopback LND (`lo`), type 9.
    Lo,
}

impl NetType {
    /// The numeric LND type carried in the upper 16 bits of a net.
    pub const fn number(self) -> u16 {
        match self {
            NetType::Tcp => 2,
            NetType::O2ib => 5,
            NetType::Lo => 9,
        }
    }

    /// The type for a numeric LND type, if this crate knows it.
    pub const fn from_number(n: u16) -> Option<NetType> {
        match n {
            2 => Some(NetType::Tcp),
            5 => Some(NetType::O2ib),
            9 => Some(NetType::Lo),
            _ => None,
        }
    }

    /// The name used in NID strings (`o2ib`, `tcp`, `lo`).
    pub const fn name(self) -> &'static str {
        match self {
            NetType::Tcp => "tcp",
            NetType::O2ib => "o2ib",
            NetType::Lo => "lo",
        }
    }

    fn from_name(s: &str) -> Option<NetType> {
        match s {
            "tcp" => Some(NetType::Tcp),
            "o2ib" => Some(NetType::O2ib),
            "lo" => Some(NetType::Lo),
            _ => None,
        }
    }
}

/// An LNet network: an LND type and a network number (`o2ib0`, `o2ib3`, `tcp1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Net(u32);

impl Net {
    /// The network of the given type and number.
    pub const fn new(net_type: NetType, number: u16) -> Net {
        Net(((net_type.number() as u32) << 16) | number as u32)
    }

    /// The raw 32-bit net value (`type << 16 | number`).
    pub const fn as_u32(self) -> u32 {
        self.0
    }

    /// A net from its raw value; the LND type may be unknown to this crate.
    pub const fn from_u32(raw: u32) -> Net {
        Net(raw)
    }

    /// The LND type, if known.
    pub const fn net_type(self) -> Option<NetType> {
        NetType::from_number((self.0 >> 16) as u16)
    }

    /// The network number (the `3` of `o2ib3`).
    pub const fn number(self) -> u16 {
        (self.0 & 0xffff) as u16
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.net_type() {
            Some(t) => write!(f, "{}{}", t.name(), self.number()),
            None => write!(f, "<{}:{}>", self.0 >> 16, self.number()),
        }
    }
}

impl FromStr for Net {
    type Err = NidParseError;

    /// Parses `o2ib`, `o2ib0`, `o2ib12`, `tcp`, `lo`.
    fn from_str(s: &str) -> Result<Net, NidParseError> {
        // The number is the trailing run of digits ("o2ib12" -> "o2ib", "12"). Split where the
        // digits start, which is a char boundary even when the name ends in a multi-byte char.
        let name_len = s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (name, digits) = s.split_at(name_len);
        let net_type = NetType::from_name(name)
            .ok_or_else(|| NidParseError::UnknownNetType { input: s.to_owned(), name: name.to_owned() })?;
        let number = if digits.is_empty() {
            0
        } else {
            digits.parse::<u16>().map_err(|_| NidParseError::BadNetNumber { input: s.to_owned() })?
        };
        Ok(Net::new(net_type, number))
    }
}

/// A 64-bit LNet network identifier (nid4): `net << 32 | address`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Nid(u64);

impl Nid {
    /// `LNET_NID_ANY`: matches any NID; never a valid source.
    pub const ANY: Nid = Nid(u64::MAX);

    /// The NID from its raw 64-bit value, as carried on the wire.
    pub const fn from_u64(raw: u64) -> Nid {
        Nid(raw)
    }

    /// The raw 64-bit value.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// The NID of an IPv4 address on a network.
    pub const fn new(net: Net, addr: Ipv4Addr) -> Nid {
        let a = addr.octets();
        let ip = ((a[0] as u32) << 24) | ((a[1] as u32) << 16) | ((a[2] as u32) << 8) | a[3] as u32;
        Nid(((net.0 as u64) << 32) | ip as u64)
    }

    /// Shorthand for an `@o2ib` NID on network 0.
    pub const fn o2ib(addr: Ipv4Addr) -> Nid {
        Nid::new(Net::new(NetType::O2ib, 0), addr)
    }

    /// The network part.
    pub const fn net(self) -> Net {
        Net((self.0 >> 32) as u32)
    }

    /// The address part as an IPv4 address.
    pub const fn addr(self) -> Ipv4Addr {
        let ip = self.0 as u32;
        Ipv4Addr::new((ip >> 24) as u8, (ip >> 16) as u8, (ip >> 8) as u8, ip as u8)
    }

    /// Whether this is `LNET_NID_ANY`.
    pub const fn is_any(self) -> bool {
        self.0 == u64::MAX
    }
}

impl fmt::Display for Nid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_any() {
            return f.write_str("<?>");
        }
        let net = self.net();
        let number = net.number();
        match net.net_type() {
            // The loopback address is a plain number; the network number follows the name as
            // for any other type (`libcfs_nid2str`: `0@lo`, `0@lo1`).
            Some(NetType::Lo) if number == 0 => write!(f, "{}@lo", self.0 as u32),
            Some(NetType::Lo) => write!(f, "{}@lo{}", self.0 as u32, number),
            Some(t) if number == 0 => write!(f, "{}@{}", self.addr(), t.name()),
            Some(t) => write!(f, "{}@{}{}", self.addr(), t.name(), number),
            None => write!(f, "{}@<{}:{}>", self.addr(), net.0 >> 16, number),
        }
    }
}

impl fmt::Debug for Nid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nid({self})")
    }
}

impl FromStr for Nid {
    type Err = NidParseError;

    /// Parses `a.b.c.d@o2ib`, `a.b.c.d@o2ibN`, `a.b.c.d@tcpN` and `0@lo`.
    fn from_str(s: &str) -> Result<Nid, NidParseError> {
        let (addr, net) =
            s.split_once('@').ok_or_else(|| NidParseError::MissingAt { input: s.to_owned() })?;
        let net: Net = net.parse().map_err(|e| match e {
            NidParseError::UnknownNetType { name, .. } => {
                NidParseError::UnknownNetType { input: s.to_owned(), name }
            }
            _ => NidParseError::BadNetNumber { input: s.to_owned() },
        })?;
        if net.net_type() == Some(NetType::Lo) {
            let n: u32 = addr.parse().map_err(|_| NidParseError::BadAddress { input: s.to_owned() })?;
            return Ok(Nid(((net.0 as u64) << 32) | n as u64));
        }
        let ip: Ipv4Addr = addr.parse().map_err(|_| NidParseError::BadAddress { input: s.to_owned() })?;
        Ok(Nid::new(net, ip))
    }
}

/// Why a NID or network string did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NidParseError {
    /// No `@` separates the address from the network.
    #[error("bad NID '{input}': expected ADDRESS@NETWORK, e.g. 192.168.1.2@o2ib")]
    MissingAt {
        /// The text that failed to parse.
        input: String,
    },
    /// The network type is not one LNet knows.
    #[error("bad NID '{input}': unknown network type '{name}' (expected o2ib, tcp or lo)")]
    UnknownNetType {
        /// The text that failed to parse.
        input: String,
        /// The unrecognised network type name.
        name: String,
    },
    /// The network number is not a number in 0..=65535.
    #[error("bad NID '{input}': network number must be 0..65535")]
    BadNetNumber {
        /// The text that failed to parse.
        input: String,
    },
    /// The address is not a dotted-quad IPv4 address.
    #[error("bad NID '{input}': address must be an IPv4 address a.b.c.d")]
    BadAddress {
        /// The text that failed to parse.
        input: String,
    },
}

/// A process id: LNet's `{nid, pid}` pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessId {
    /// The node.
    pub nid: Nid,
    /// The process on that node.
    pub pid: u32,
}

impl ProcessId {
    /// `LNET_PID_ANY`.
    pub const PID_ANY: u32 = u32::MAX;
    /// `LNET_PID_LUSTRE`, the pid Lustre services use.
    pub const PID_LUSTRE: u32 = 12345;

    /// A process id.
    pub const fn new(nid: Nid, pid: u32) -> ProcessId {
        ProcessId { nid, pid }
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "12345-{}", self.nid)
            .and_then(|_| if self.pid == ProcessId::PID_LUSTRE { Ok(()) } else { write!(f, "/{}", self.pid) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nid4_encoding_matches_lnet() {
        let nid: Nid = "192.168.1.2@o2ib".parse().unwrap();
        assert_eq!(nid.as_u64(), 0x0005_0000_c0a8_0102);
        let nid: Nid = "10.0.0.1@o2ib3".parse().unwrap();
        assert_eq!(nid.as_u64(), 0x0005_0003_0a00_0001);
        let nid: Nid = "10.0.0.1@tcp".parse().unwrap();
        assert_eq!(nid.as_u64(), 0x0002_0000_0a00_0001);
        let nid: Nid = "0@lo".parse().unwrap();
        assert_eq!(nid.as_u64(), 0x0009_0000_0000_0000);
    }

    #[test]
    fn display_round_trips() {
        for s in ["127.0.0.1@o2ib", "127.0.0.2@o2ib7", "10.1.2.3@tcp", "0@lo"] {
            let nid: Nid = s.parse().unwrap();
            assert_eq!(nid.to_string(), s);
            assert_eq!(Nid::from_u64(nid.as_u64()), nid);
        }
        // Regression (found by the `nid` fuzz target): a loopback NID on a network other than 0
        // printed without its network number, so `9@lo9` printed as `9@lo`, another NID.
        for s in ["9@lo9", "65536@lo1", "4294967295@lo65535"] {
            let nid: Nid = s.parse().unwrap();
            assert_eq!(nid.to_string(), s);
            assert_eq!(nid.to_string().parse::<Nid>(), Ok(nid));
        }
        assert_eq!("o2ib0".parse::<Net>().unwrap().to_string(), "o2ib0");
        assert_eq!("o2ib".parse::<Net>().unwrap(), "o2ib0".parse::<Net>().unwrap());
    }

    #[test]
    fn bad_nids_give_clear_errors() {
        assert!(matches!("127.0.0.1".parse::<Nid>(), Err(NidParseError::MissingAt { .. })));
        assert!(matches!("127.0.0.1@ib".parse::<Nid>(), Err(NidParseError::UnknownNetType { .. })));
        assert!(matches!("127.0.0.1@o2ib99999".parse::<Nid>(), Err(NidParseError::BadNetNumber { .. })));
        assert!(matches!("1.2.3@o2ib".parse::<Nid>(), Err(NidParseError::BadAddress { .. })));
        assert!(matches!("@o2ib".parse::<Nid>(), Err(NidParseError::BadAddress { .. })));
        let msg = "x@o2ib".parse::<Nid>().unwrap_err().to_string();
        assert!(msg.contains("x@o2ib"), "{msg}");
    }

    #[test]
    fn arbitrary_strings_never_panic() {
        let samples =
            ["", "@", "@@", "1.2.3.4@", "1.2.3.4@o2ib-1", "\u{0}@o2ib", "9@lo9", "a@lo", "é", "1@é", "o2ibé"];
        for s in samples {
            let _ = s.parse::<Nid>();
            let _ = s.parse::<Net>();
        }
        // Regression (found by the `nid` fuzz target): a name ending in a multi-byte character
        // used to be split inside that character, and `split_at` panicked.
        for s in ["é", "o2ibé", "o2ibé5", "\u{fffd}\u{fffd}", "1.2.3.4@é", "1.2.3.4@\u{fffd}7", "0@loé"]
        {
            assert!(matches!(s.parse::<Net>(), Err(NidParseError::UnknownNetType { .. })), "{s}");
            assert!(s.parse::<Nid>().is_err(), "{s}");
        }
        // Unknown LND types still print.
        let n = Nid::from_u64(0x00ff_0001_0102_0304);
        assert_eq!(n.to_string(), "1.2.3.4@<255:1>");
    }
}
