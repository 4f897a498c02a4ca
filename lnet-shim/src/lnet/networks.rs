//! Network interfaces from configuration: LNet's `networks=` parameter and explicit NIDs.
//!
//! `options lnet networks="o2ib0(ib0),tcp1(eth0,eth1)"` names the networks a node joins and
//! the interfaces of each. [`parse_networks`] reads that text (with or without its quotes);
//! a CPT list after an entry (`o2ib0(ib0)[0,1]`) is accepted and ignored. Interface names
//! cannot be resolved to addresses here, so a NID is made from an explicit address:
//! [`resolve_nid`] accepts a full NID (`127.0.0.2@o2ib`) or a bare IPv4 address that takes the
//! first configured network (`o2ib0` if none is configured).

use std::net::Ipv4Addr;

use crate::nid::{Net, NetType, Nid, NidParseError};

/// One entry of `networks=`: a network and its interfaces (possibly none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkSpec {
    /// The network (`o2ib0`).
    pub net: Net,
    /// The interfaces named in parentheses (`ib0`), in order.
    pub interfaces: Vec<String>,
}

impl NetworkSpec {
    /// The first interface, if any.
    pub fn interface(&self) -> Option<&str> {
        self.interfaces.first().map(String::as_str)
    }
}

/// Why a `networks=` value or a NID specification did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NetworksError {
    /// Nothing but blanks (or quotes).
    #[error("networks '{input}' is empty: expected e.g. o2ib0(ib0)")]
    Empty {
        /// The whole value.
        input: String,
    },
    /// An entry is empty (`o2ib0,,tcp`).
    #[error("networks '{input}': empty entry at position {position}")]
    EmptyEntry {
        /// The whole value.
        input: String,
        /// 1-based entry number.
        position: usize,
    },
    /// A network name did not parse.
    #[error("networks '{input}': {source}")]
    BadNet {
        /// The whole value.
        input: String,
        /// Why.
        #[source]
        source: NidParseError,
    },
    /// Parentheses or brackets do not pair up, or text follows them.
    #[error("networks '{input}': malformed entry '{entry}' (expected NET, NET(IF[,IF...]) or NET(IF)[CPTS])")]
    Malformed {
        /// The whole value.
        input: String,
        /// The entry.
        entry: String,
    },
    /// An interface name is empty or has blanks (`o2ib0()`, `o2ib0(ib0,)`).
    #[error("networks '{input}': bad interface list in '{entry}'")]
    BadInterface {
        /// The whole value.
        input: String,
        /// The entry.
        entry: String,
    },
    /// A network appears twice.
    #[error("networks '{input}': network {net} is listed twice")]
    Duplicate {
        /// The whole value.
        input: String,
        /// The network.
        net: Net,
    },
    /// A NID specification is neither a NID nor an IPv4 address.
    #[error("bad NID '{input}': expected ADDRESS@NETWORK (e.g. 127.0.0.2@o2ib) or an IPv4 address")]
    BadNidSpec {
        /// The text.
        input: String,
    },
    /// A full NID that did not parse.
    #[error(transparent)]
    Nid(#[from] NidParseError),
}

/// Splits at top-level commas (not inside parentheses or brackets).
fn split_top(s: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => {
                depth -= 1;
                if depth < 0 {
                    return None;
                }
            }
            ',' if depth == 0 => {
                out.push(s.get(start..i)?);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return None;
    }
    out.push(s.get(start..)?);
    Some(out)
}

/// Parses a `networks=` value such as `o2ib0(lo)` or `"o2ib0(ib0),tcp1(eth0, eth1)"`.
pub fn parse_networks(text: &str) -> Result<Vec<NetworkSpec>, NetworksError> {
    let input = text.to_owned();
    let trimmed = text.trim();
    let unquoted = trimmed
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .or_else(|| trimmed.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
        .unwrap_or(trimmed)
        .trim();
    if unquoted.is_empty() {
        return Err(NetworksError::Empty { input });
    }
    let malformed = |entry: &str| NetworksError::Malformed { input: input.clone(), entry: entry.to_owned() };
    let entries = split_top(unquoted).ok_or_else(|| malformed(unquoted))?;
    let mut specs: Vec<NetworkSpec> = Vec::new();
    for (i, raw) in entries.iter().enumerate() {
        let entry = raw.trim();
        if entry.is_empty() {
            return Err(NetworksError::EmptyEntry { input, position: i + 1 });
        }
        // NET [ "(" IFS ")" ] [ "[" CPTS "]" ]
        let (head, rest) = match entry.find(['(', '[']) {
            Some(at) => entry.split_at(at),
            None => (entry, ""),
        };
        let net: Net =
            head.trim().parse().map_err(|source| NetworksError::BadNet { input: input.clone(), source })?;
        let mut interfaces = Vec::new();
        let mut rest = rest.trim();
        if let Some(after) = rest.strip_prefix('(') {
            let close = after.find(')').ok_or_else(|| malformed(entry))?;
            let (list, tail) = after.split_at(close);
            for name in list.split(',') {
                let name = name.trim();
                if name.is_empty() || name.contains(char::is_whitespace) || name.contains(['(', '[', ']']) {
                    return Err(NetworksError::BadInterface { input, entry: entry.to_owned() });
                }
                interfaces.push(name.to_owned());
            }
            rest = tail.get(1..).unwrap_or_default().trim();
        }
        if let Some(after) = rest.strip_prefix('[') {
            // A CPT list: accepted, not used.
            let close = after.find(']').ok_or_else(|| malformed(entry))?;
            rest = after.get(close + 1..).unwrap_or_default().trim();
        }
        if !rest.is_empty() {
            return Err(malformed(entry));
        }
        if specs.iter().any(|s| s.net == net) {
            return Err(NetworksError::Duplicate { input, net });
        }
        specs.push(NetworkSpec { net, interfaces });
    }
    Ok(specs)
}

/// The NID a node uses: `spec` as a full NID (`127.0.0.2@o2ib`), or a bare IPv4 address on the
/// first of `networks` (on `o2ib0` when `networks` is empty).
pub fn resolve_nid(spec: &str, networks: &[NetworkSpec]) -> Result<Nid, NetworksError> {
    let spec = spec.trim();
    if spec.contains('@') {
        return Ok(spec.parse::<Nid>()?);
    }
    let addr: Ipv4Addr = spec.parse().map_err(|_| NetworksError::BadNidSpec { input: spec.to_owned() })?;
    let net = networks.first().map_or(Net::new(NetType::O2ib, 0), |n| n.net);
    Ok(Nid::new(net, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lnet_network_lists() {
        let n = parse_networks("o2ib0(lo)").unwrap();
        assert_eq!(n, vec![NetworkSpec { net: "o2ib0".parse().unwrap(), interfaces: vec!["lo".into()] }]);
        assert_eq!(n[0].interface(), Some("lo"));
        let n = parse_networks(" \"o2ib3(ib0), tcp1(eth0, eth1)[0,1],o2ib\" ").unwrap();
        assert_eq!(n.len(), 3);
        assert_eq!(n[0].net.to_string(), "o2ib3");
        assert_eq!(n[1].interfaces, vec!["eth0".to_owned(), "eth1".to_owned()]);
        assert_eq!(n[2].net.to_string(), "o2ib0");
        assert!(n[2].interfaces.is_empty());
    }

    #[test]
    fn bad_network_lists_are_clear_errors() {
        let cases = [
            ("", "empty"),
            ("\"\"", "empty"),
            ("o2ib0(lo", "malformed"),
            ("o2ib0)lo(", "malformed"),
            ("o2ib0(lo)x", "malformed"),
            ("o2ib0(lo)[1", "malformed"),
            ("o2ib0(),tcp", "interface"),
            ("o2ib0(a b)", "interface"),
            ("o2ib0(lo),,tcp", "empty entry"),
            ("ib0(lo)", "unknown network type"),
            ("o2ib99999", "network number"),
            ("o2ib0,o2ib", "listed twice"),
        ];
        for (input, expect) in cases {
            let e = parse_networks(input).unwrap_err().to_string();
            assert!(e.contains(expect), "{input:?}: {e}");
        }
    }

    #[test]
    fn resolves_nids() {
        let nets = parse_networks("o2ib2(lo)").unwrap();
        assert_eq!(resolve_nid("127.0.0.2", &nets).unwrap().to_string(), "127.0.0.2@o2ib2");
        assert_eq!(resolve_nid("127.0.0.2", &[]).unwrap().to_string(), "127.0.0.2@o2ib");
        assert_eq!(resolve_nid("127.0.0.1@o2ib", &nets).unwrap().to_string(), "127.0.0.1@o2ib");
        assert!(matches!(resolve_nid("localhost", &nets), Err(NetworksError::BadNidSpec { .. })));
        assert!(matches!(resolve_nid("1.2.3.4@ib", &nets), Err(NetworksError::Nid(_))));
    }

    #[test]
    fn arbitrary_input_never_panics() {
        for s in ["(", ")", "[", "]", "((", "o2ib(()", "\"", "'o2ib'", "o2ib[]", "é(ü)", ",", "o2ib0(lo)[]()"]
        {
            let _ = parse_networks(s);
            let _ = resolve_nid(s, &[]);
        }
    }
}
