//! `tunables`: the modprobe.d tunables file (`lnd::tunables::Tunables::parse_str`).
//!
//! Input: file text, read as UTF-8 (lossily). A NUL byte splits it into several files, parsed
//! as one configuration with [`Tunables::parse_sources`] (later files override earlier ones).
//!
//! Contract checked (`lnd::tunables`'s documentation):
//! * parsing never panics;
//! * an error names a source given and a line inside it (`start_line <= line`), and its message
//!   starts with `file:line`;
//! * every warning's location lies inside its source;
//! * an accepted configuration is finalized (finalizing again changes nothing), and its
//!   [`Tunables::to_modprobe_string`] line parses back to the same tunables;
//! * its LNet configuration (`ParsedConfig::lnet_config`) has a transaction timeout of 1 to
//!   2^31 - 1 seconds, or is refused with the location of its `lnet_transaction_timeout`.

use lnd::tunables::{Location, Tunables};

/// The fuzz target.
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let parts: Vec<&str> = text.split('\0').collect();
    let names: Vec<String> = (0..parts.len()).map(|i| format!("fuzz{i}.conf")).collect();
    let sources: Vec<(&str, &str)> = names.iter().map(String::as_str).zip(parts.iter().copied()).collect();
    let lines_in = |at: &Location| -> usize {
        let i =
            names.iter().position(|n| *n == at.source).unwrap_or_else(|| panic!("unknown source in {at:?}"));
        parts[i].lines().count()
    };
    match Tunables::parse_sources(sources.iter().copied()) {
        Ok(c) => {
            for w in &c.warnings {
                let _ = w.to_string();
                if let Some(at) = &w.at {
                    if at.line != 0 {
                        let n = lines_in(at);
                        assert!(
                            at.line <= n && at.start_line >= 1 && at.start_line <= at.line,
                            "{w:?} ({n} lines)"
                        );
                    }
                }
            }
            let again =
                c.tunables.clone().finalized().unwrap_or_else(|e| panic!("finalized tunables refused: {e}"));
            assert_eq!(again.0, c.tunables, "finalizing twice changed the tunables");
            let line = c.tunables.to_modprobe_string();
            let back = Tunables::parse_str("rendered", &line).unwrap_or_else(|e| panic!("{e}\n{line}"));
            assert_eq!(back.tunables, c.tunables, "{line}");
            for o in &c.lnet_options {
                let _ = o.normalized_key();
                assert!(o.at.line >= 1 && o.at.line <= lines_in(&o.at), "{o:?}");
            }
            match c.lnet_config() {
                Ok(lnet) => {
                    let secs = lnet.transaction_timeout.map(|d| d.as_secs());
                    assert!(secs.is_some_and(|s| (1..=i32::MAX as u64).contains(&s)), "{secs:?}");
                }
                Err(e) => {
                    let at =
                        e.location().unwrap_or_else(|| panic!("lnet_config error without a location: {e:?}"));
                    let o = c.lnet_option("lnet_transaction_timeout").expect("refused without the parameter");
                    assert_eq!(at, &o.at, "{e}");
                    assert!(e.to_string().starts_with(&format!("{at}:")), "{e}");
                }
            }
            let _ = (c.tunables.tx_timeout(), c.tunables.connect_timeout(), c.tunables.keepalive_interval());
            let _ = (c.tunables.peer_credits_hiw_for(7), c.tunables.concurrent_sends_for(300));
        }
        Err(e) => {
            let msg = e.to_string();
            let at = e.location().unwrap_or_else(|| panic!("parse error without a location: {e:?}"));
            assert!(msg.starts_with(&format!("{at}:")), "{msg:?} does not start with {at}");
            let n = lines_in(at);
            assert!(at.line >= 1 && at.line <= n.max(1), "{e:?} ({n} lines)");
            assert!(at.start_line >= 1 && at.start_line <= at.line, "{e:?}");
            let _ = e.key();
        }
    }
}
