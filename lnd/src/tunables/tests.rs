//! Tests for the ko2iblnd tunables: parsing, o2iblnd's rules, errors, rendering, fuzzing.

use std::time::Duration;

use super::modprobe::Reader;
use super::params::{self, CInt, NPARAMS, Param, Settings, edit_distance, parse_c_int};
use super::*;

const SRC: &str = "/etc/modprobe.d/ko2iblnd.conf";
const SHIPPED: &str = include_str!("../../../conf/ko2iblnd.conf");

fn parse(text: &str) -> ParsedConfig {
    Tunables::parse_str(SRC, text).unwrap_or_else(|e| panic!("refused: {e}\n--- text:\n{text}"))
}

fn err(text: &str) -> TunablesError {
    match Tunables::parse_str(SRC, text) {
        Ok(c) => panic!("accepted: {c:?}\n--- text:\n{text}"),
        Err(e) => e,
    }
}

fn line(e: &TunablesError) -> usize {
    e.location().expect("error has a location").line
}

fn defaults() -> Tunables {
    Tunables::default().finalized().expect("defaults are valid").0
}

fn kinds(w: &[Warning]) -> Vec<WarningKind> {
    w.iter().map(|w| w.kind).collect()
}

// ---------------------------------------------------------------------------------------------
// Defaults and the parameter table

#[test]
fn defaults_are_o2iblnds() {
    let t = Tunables::default();
    assert_eq!(t.service, 987);
    assert!(!t.cksum);
    assert_eq!(t.timeout, 50);
    assert_eq!(t.keepalive, 100);
    assert_eq!(t.ntx, 512);
    assert_eq!(t.credits, 256);
    assert_eq!(t.peer_credits, 8);
    assert_eq!(t.peer_credits_hiw, 0);
    assert_eq!(t.concurrent_sends, 0);
    assert_eq!(t.map_on_demand, 1);
    assert_eq!(t.fmr_pool_size, 512);
    assert_eq!(t.fmr_flush_trigger, 384);
    assert!(t.fmr_cache);
    assert!(!t.use_fastreg_gaps);
    assert_eq!(t.ib_mtu, 0);
    assert_eq!(t.retry_count, 5);
    assert_eq!(t.rnr_retry_count, 6);
    assert!(t.use_privileged_port);
    assert!(!t.require_privileged_port);
    assert_eq!(t.ipif_name, "ib0");
    assert_eq!(t.nscheds, 0);
    assert_eq!(t.conns_per_peer, 1);
    assert_eq!(t.wrq_sge, 2);
    assert_eq!(t.peer_timeout, 180);
    assert_eq!(t.peer_buffer_credits, 0);
    assert_eq!(t.dev_failover, 0);
    assert_eq!(t.tos, -1);

    // Finalizing derives hiw = Q/2 and concurrent_sends = Q, silently.
    let (f, notes) = Tunables::default().finalized().unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(f.peer_credits_hiw, 4);
    assert_eq!(f.concurrent_sends, 8);
    assert_eq!(Tunables { peer_credits_hiw: 4, concurrent_sends: 8, ..Tunables::default() }, f);

    // An empty file is the defaults.
    let c = parse("");
    assert_eq!(c.tunables, f);
    assert!(c.warnings.is_empty() && c.lnet_options.is_empty());
}

#[test]
fn parameter_table_is_consistent() {
    assert_eq!(Param::ALL.len(), NPARAMS);
    for (i, p) in Param::ALL.into_iter().enumerate() {
        assert_eq!(p as usize, i, "{p:?} out of order");
        assert_eq!(Param::from_name(p.name()), Some(p));
    }
    let mut names: Vec<&str> = Tunables::parameter_names().collect();
    assert_eq!(names.len(), NPARAMS);
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), NPARAMS, "duplicate names");
    for (removed, _) in params::REMOVED {
        assert!(Param::from_name(removed).is_none());
    }
}

// ---------------------------------------------------------------------------------------------
// The format

#[test]
fn every_parameter_is_parsed() {
    let text = "\
options ko2iblnd service=1987 cksum=1 timeout=30 keepalive=60 ntx=1024 credits=512
options ko2iblnd peer_credits=32 peer_credits_hiw=20 concurrent_sends=48 fmr_pool_size=600
options ko2iblnd fmr_flush_trigger=400 fmr_cache=0 use_fastreg_gaps=1 ib_mtu=2048 retry_count=7
options ko2iblnd rnr_retry_count=7 use_privileged_port=0 require_privileged_port=1 ipif_name=ib1
options ko2iblnd nscheds=3 conns_per_peer=4 wrq_sge=4 peer_timeout=0 peer_buffer_credits=16
options ko2iblnd dev_failover=1 tos=106 busy_poll_usec=7
options ko2iblnd accept_nids='10.0.0.2@o2ib, 10.0.0.3@o2ib1'
";
    for name in Tunables::parameter_names().filter(|&n| n != "map_on_demand") {
        assert!(text.contains(&format!(" {name}=")), "test text misses {name}");
    }
    let c = parse(text);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let t = c.tunables;
    let expected = Tunables {
        service: 1987,
        cksum: true,
        timeout: 30,
        keepalive: 60,
        ntx: 1024,
        credits: 512,
        peer_credits: 32,
        peer_credits_hiw: 20,
        concurrent_sends: 48,
        map_on_demand: 1,
        fmr_pool_size: 600,
        fmr_flush_trigger: 400,
        fmr_cache: false,
        use_fastreg_gaps: true,
        ib_mtu: 2048,
        retry_count: 7,
        rnr_retry_count: 7,
        use_privileged_port: false,
        require_privileged_port: true,
        ipif_name: "ib1".to_owned(),
        nscheds: 3,
        conns_per_peer: 4,
        wrq_sge: 4,
        peer_timeout: 0,
        peer_buffer_credits: 16,
        dev_failover: 1,
        tos: 106,
        busy_poll_usec: 7,
        accept_nids: vec!["10.0.0.2@o2ib".parse().unwrap(), "10.0.0.3@o2ib1".parse().unwrap()],
    };
    assert_eq!(t, expected);
}

#[test]
fn integers_follow_kstrtoint() {
    assert_eq!(parse_c_int("32"), CInt::Ok(32));
    assert_eq!(parse_c_int("+5"), CInt::Ok(5));
    assert_eq!(parse_c_int("-1"), CInt::Ok(-1));
    assert_eq!(parse_c_int("0x20"), CInt::Ok(32));
    assert_eq!(parse_c_int("0X1f"), CInt::Ok(31));
    assert_eq!(parse_c_int("010"), CInt::Ok(8));
    assert_eq!(parse_c_int("0"), CInt::Ok(0));
    assert_eq!(parse_c_int("32\n"), CInt::Ok(32));
    for bad in ["", "-", "0x", "08", "1e3", " 1", "1 ", "1.5", "٣", "--1", "0x-1"] {
        assert_eq!(parse_c_int(bad), CInt::Invalid, "{bad:?}");
    }
    assert_eq!(parse_c_int("99999999999999999999999"), CInt::Overflow);

    let t = parse("options ko2iblnd peer_credits=0x20 credits=0400").tunables;
    assert_eq!((t.peer_credits, t.credits), (32, 256));
}

#[test]
fn booleans_accept_the_usual_spellings() {
    for yes in ["1", "2", "-1", "y", "Y", "yes", "on", "true", "TRUE", "0x1"] {
        assert!(parse(&format!("options ko2iblnd cksum={yes}")).tunables.cksum, "{yes}");
    }
    for no in ["0", "n", "N", "no", "off", "false", "00"] {
        let t = parse(&format!("options ko2iblnd cksum=1\noptions ko2iblnd cksum={no}")).tunables;
        assert!(!t.cksum, "{no}");
    }
    // A bare flag means on, as with the kernel's bool parameters.
    assert!(parse("options ko2iblnd cksum").tunables.cksum);
    let e = err("#\noptions ko2iblnd fmr_cache=maybe");
    assert!(matches!(e, TunablesError::InvalidBool { .. }), "{e:?}");
    assert_eq!(line(&e), 2);
    assert_eq!(e.to_string(), format!("{SRC}:2: fmr_cache=maybe: not a boolean (use 1 or 0)"));
}

#[test]
fn comments_and_blank_lines() {
    let c = parse(
        "# whole-line comment\n   # indented comment\n\n\t\n\
         options ko2iblnd peer_credits=16 # trailing comment\n\
         options ko2iblnd credits=128#no space needed\n\
         options lnet networks=\"o2ib0(ib0)#not-a-comment\"   # a comment\n\
         #options ko2iblnd ntx=5\n",
    );
    assert_eq!(c.tunables.peer_credits, 16);
    assert_eq!(c.tunables.credits, 128);
    assert_eq!(c.tunables.ntx, 512);
    assert_eq!(c.lnet_options.len(), 1);
    assert_eq!(c.lnet_options[0].value.as_deref(), Some("o2ib0(ib0)#not-a-comment"));
    assert_eq!(c.lnet_options[0].at.line, 7);
}

#[test]
fn crlf_line_endings() {
    let c = parse("options ko2iblnd peer_credits=16\r\noptions ko2iblnd \\\r\n credits=128\r\n");
    assert_eq!((c.tunables.peer_credits, c.tunables.credits), (16, 128));
}

#[test]
fn continuation_lines() {
    let c = parse(
        "options ko2iblnd peer_credits=32 \\\n    credits=512 \\\n    ntx=1024\n\
         options ko2iblnd \\\n  tos=8\n\
         options ko2iblnd nscheds=2 \\   # a comment after the backslash\n  wrq_sge=3\n\
         options ko2iblnd fmr_pool_size=10\\\n24\n",
    );
    let t = &c.tunables;
    assert_eq!((t.peer_credits, t.credits, t.ntx, t.tos), (32, 512, 1024, 8));
    assert_eq!((t.nscheds, t.wrq_sge), (2, 3));
    // Joined with nothing in between, as kmod and the shell do.
    assert_eq!(t.fmr_pool_size, 1024);

    // A quoted value may run over a continuation.
    let c = parse("options lnet ip2nets=\"o2ib0 10.0.0.*; \\\n  tcp0 192.168.*\"\n");
    assert_eq!(c.lnet_options[0].value.as_deref(), Some("o2ib0 10.0.0.*;   tcp0 192.168.*"));
    assert_eq!((c.lnet_options[0].at.line, c.lnet_options[0].at.start_line), (1, 1));
}

#[test]
fn continuation_errors_name_the_physical_line_and_the_directive_start() {
    let e = err("# header\noptions ko2iblnd peer_credits=32 \\\n    credit=512\n");
    assert!(matches!(e, TunablesError::UnknownParameter { .. }), "{e:?}");
    let at = e.location().unwrap();
    assert_eq!((at.line, at.start_line), (3, 2));
    assert!(at.is_continuation());
    assert_eq!(
        e.to_string(),
        format!(
            "{SRC}:3: credit=512: unknown ko2iblnd parameter 'credit' (did you mean 'credits'?) \
             (in the directive starting at line 2)"
        )
    );

    // An empty continued line does not shift the count.
    let e = err("options ko2iblnd \\\n\\\n  ntx=x\n");
    assert_eq!((line(&e), e.location().unwrap().start_line), (3, 1));

    // A backslash inside a comment does not continue the line.
    let e = err("options ko2iblnd peer_credits=32 # not continued \\\ncredits=512\n");
    assert!(matches!(e, TunablesError::UnknownDirective { .. }), "{e:?}");
    assert_eq!(line(&e), 2);

    // A comment line ends a continued directive.
    let e = err("options ko2iblnd \\\n# a comment\nntx=5\n");
    assert!(matches!(e, TunablesError::UnknownDirective { .. }), "{e:?}");
    assert_eq!(line(&e), 3);
}

#[test]
fn dangling_continuation() {
    let e = err("options ko2iblnd ntx=1024 \\\n");
    assert!(matches!(e, TunablesError::DanglingContinuation { .. }), "{e:?}");
    assert_eq!(line(&e), 1);

    let e = err("# c\noptions ko2iblnd \\\n  ntx=1024 \\");
    assert!(matches!(e, TunablesError::DanglingContinuation { .. }), "{e:?}");
    let at = e.location().unwrap();
    assert_eq!((at.line, at.start_line), (3, 2));
    assert!(e.to_string().starts_with(&format!("{SRC}:3: the line ends with '\\'")), "{e}");
}

#[test]
fn quoted_values() {
    let c = parse(
        "options ko2iblnd ipif_name=\"ib2\"\n\
         options ko2iblnd \"peer_credits=16\" 'credits=64' tos='4'\n\
         options lnet networks=\"o2ib0(ib0) tcp0(eth0)\" ip2nets='o2ib 10.0.0.[1-4]'\n",
    );
    assert_eq!(c.tunables.ipif_name, "ib2");
    assert_eq!((c.tunables.peer_credits, c.tunables.credits, c.tunables.tos), (16, 64, 4));
    assert_eq!(c.lnet_options[0].value.as_deref(), Some("o2ib0(ib0) tcp0(eth0)"));
    assert_eq!(c.lnet_options[1].value.as_deref(), Some("o2ib 10.0.0.[1-4]"));

    let e = err("options ko2iblnd ntx=4\noptions ko2iblnd ipif_name=\"ib0\n");
    assert!(matches!(e, TunablesError::UnterminatedQuote { quote: '"', .. }), "{e:?}");
    assert_eq!(line(&e), 2);
    assert_eq!(e.to_string(), format!("{SRC}:2: unterminated \" quote"));

    // The quote opens on a continuation line: reported there.
    let e = err("options lnet \\\n  networks='o2ib0\n");
    assert!(matches!(e, TunablesError::UnterminatedQuote { quote: '\'', .. }), "{e:?}");
    let at = e.location().unwrap();
    assert_eq!((at.line, at.start_line), (2, 1));
}

#[test]
fn dashes_are_underscores() {
    let t = parse("options ko2iblnd peer-credits=16 conns-per-peer=2").tunables;
    assert_eq!((t.peer_credits, t.conns_per_peer), (16, 2));
}

#[test]
fn options_lines_accumulate_and_the_last_value_wins() {
    let c = parse(
        "options ko2iblnd peer_credits=16\n\
         options ko2iblnd credits=512\n\
         options ko2iblnd peer_credits=32\n",
    );
    assert_eq!((c.tunables.peer_credits, c.tunables.credits), (32, 512));
    assert_eq!(kinds(&c.warnings), [WarningKind::Overridden]);
    let w = &c.warnings[0];
    assert_eq!(w.at.as_ref().unwrap().line, 3);
    assert_eq!(
        w.to_string(),
        format!("{SRC}:3: peer_credits set again (was peer_credits=16 at line 1); the last value wins")
    );

    // A line that restated the default is overridden without a word (the shipped file lists
    // every default; appending your own line, as it suggests, must not flood warnings).
    let c =
        parse("options ko2iblnd peer_credits=8 credits=256\noptions ko2iblnd peer_credits=32 credits=1024\n");
    assert_eq!((c.tunables.peer_credits, c.tunables.credits), (32, 1024));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);

    // Across files, as modprobe reads every file of /etc/modprobe.d.
    let c = Tunables::parse_sources([
        ("a.conf", "options ko2iblnd peer_credits=16\noptions lnet networks=o2ib0(ib0)"),
        ("b.conf", "\noptions ko2iblnd peer_credits=64 credits=1024"),
    ])
    .unwrap();
    assert_eq!(c.tunables.peer_credits, 64);
    assert_eq!(c.lnet_options.len(), 1);
    assert_eq!(c.warnings.len(), 1);
    assert_eq!(
        c.warnings[0].to_string(),
        "b.conf:2: peer_credits set again (was peer_credits=16 at a.conf:1); the last value wins"
    );
}

#[test]
fn lnet_options_are_kept_verbatim() {
    let c = parse(
        "options ko2iblnd peer_credits=16\n\
         options lnet networks=\"o2ib0(lo)\"\n\
         options lnet ip2nets='o2ib 192.168.0.*' accept_port=988\n\
         options lnet forwarding lnet-transaction-timeout=100\n",
    );
    let got: Vec<(&str, Option<&str>, usize)> =
        c.lnet_options.iter().map(|o| (o.key.as_str(), o.value.as_deref(), o.at.line)).collect();
    assert_eq!(
        got,
        [
            ("networks", Some("o2ib0(lo)"), 2),
            ("ip2nets", Some("o2ib 192.168.0.*"), 3),
            ("accept_port", Some("988"), 3),
            ("forwarding", None, 4),
            ("lnet-transaction-timeout", Some("100"), 4),
        ]
    );
    assert_eq!(c.lnet_options[4].normalized_key(), "lnet_transaction_timeout");
    assert_eq!(c.lnet_option("networks").unwrap().value.as_deref(), Some("o2ib0(lo)"));
    assert_eq!(c.lnet_option("lnet_transaction-timeout").unwrap().at.line, 4);
    assert!(c.lnet_option("routes").is_none());
    assert!(c.warnings.is_empty());
}

#[test]
fn other_modules_and_directives_are_ignored_with_a_warning() {
    // Shaped like Lustre's shipped ko2iblnd.conf plus the usual modprobe.d neighbours.
    let text = "\
alias ko2iblnd-opa ko2iblnd
options ko2iblnd-opa peer_credits=32 credits=1024
install ko2iblnd /usr/sbin/ko2iblnd-probe
options ksocklnd peer_credits=16 nconnds=8
softdep ko2iblnd pre: mlx5_ib
blacklist ib_ipoib
remove ko2iblnd /bin/true
options ko2iblnd peer_credits=16
";
    let c = parse(text);
    assert_eq!(c.tunables.peer_credits, 16);
    assert_eq!(c.tunables.credits, 256);
    assert_eq!(kinds(&c.warnings), [WarningKind::Ignored; 7]);
    let lines: Vec<usize> = c.warnings.iter().map(|w| w.at.as_ref().unwrap().line).collect();
    assert_eq!(lines, [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(
        c.warnings[3].to_string(),
        format!(
            "{SRC}:4: options for module 'ksocklnd' ignored (only ko2iblnd and lnet options are \
             read)"
        )
    );
    assert!(c.warnings[2].message.contains("'install' directive ignored"));
}

// ---------------------------------------------------------------------------------------------
// Errors

#[test]
fn unknown_parameter_suggests_the_nearest_name() {
    let e = err("# ko2iblnd\n\noptions ko2iblnd peer_credit=32\n");
    assert_eq!(
        e.to_string(),
        format!(
            "{SRC}:3: peer_credit=32: unknown ko2iblnd parameter 'peer_credit' (did you mean \
             'peer_credits'?)"
        )
    );
    assert_eq!(e.key(), Some("peer_credit"));

    let suggestion = |text: &str| match err(text) {
        TunablesError::UnknownParameter { suggestion, .. } => suggestion,
        other => panic!("{other:?}"),
    };
    assert_eq!(suggestion("options ko2iblnd concurent_sends=8"), Some("concurrent_sends"));
    assert_eq!(suggestion("options ko2iblnd peercredits_hiw=8"), Some("peer_credits_hiw"));
    assert_eq!(suggestion("options ko2iblnd PEER_CREDITS=8"), Some("peer_credits"));
    assert_eq!(suggestion("options ko2iblnd tos2=8"), Some("tos"));
    assert_eq!(suggestion("options ko2iblnd pmr_pool_sz=8"), Some("pmr_pool_size"));
    assert_eq!(suggestion("options ko2iblnd frobnicate=1"), None);
    assert_eq!(suggestion("options ko2iblnd networks=o2ib0"), None);

    let e = err("options ko2iblnd frobnicate");
    assert_eq!(e.to_string(), format!("{SRC}:1: frobnicate: unknown ko2iblnd parameter 'frobnicate'"));
}

#[test]
fn malformed_values() {
    type Check = fn(&TunablesError) -> bool;
    let cases: &[(&str, Check)] = &[
        ("peer_credits=abc", |e| matches!(e, TunablesError::InvalidInteger { .. })),
        ("peer_credits=08", |e| matches!(e, TunablesError::InvalidInteger { .. })),
        ("timeout=1.5", |e| matches!(e, TunablesError::InvalidInteger { .. })),
        ("ntx=1k", |e| matches!(e, TunablesError::InvalidInteger { .. })),
        ("use_fastreg_gaps=2x", |e| matches!(e, TunablesError::InvalidBool { .. })),
        ("ipif_name=\"ib 0\"", |e| matches!(e, TunablesError::InvalidString { .. })),
        ("ipif_name=averyveryverylongname", |e| matches!(e, TunablesError::InvalidString { .. })),
        ("ipif_name=ib0/1", |e| matches!(e, TunablesError::InvalidString { .. })),
        ("ipif_name=..", |e| matches!(e, TunablesError::InvalidString { .. })),
        ("ipif_name=\"\"", |e| matches!(e, TunablesError::MissingValue { .. })),
        ("ipif_name", |e| matches!(e, TunablesError::MissingValue { .. })),
        ("peer_credits", |e| matches!(e, TunablesError::MissingValue { .. })),
        ("peer_credits=", |e| matches!(e, TunablesError::MissingValue { .. })),
        ("peer_credits = 32", |e| matches!(e, TunablesError::MissingValue { .. })),
    ];
    for (setting, check) in cases {
        let e = err(&format!("# c\noptions ko2iblnd ntx=512 {setting} credits=64\n"));
        assert!(check(&e), "{setting}: {e:?}");
        assert_eq!(line(&e), 2, "{setting}");
        let key = setting.split(['=', ' ']).next().unwrap();
        assert_eq!(e.key(), Some(key), "{setting}");
        assert!(e.to_string().starts_with(&format!("{SRC}:2: {key}")), "{e}");
    }
    assert_eq!(
        err("options ko2iblnd peer_credits=abc").to_string(),
        format!("{SRC}:1: peer_credits=abc: not an integer")
    );
    assert_eq!(
        err("options ko2iblnd peer_credits = 32").to_string(),
        format!(
            "{SRC}:1: peer_credits: missing value (write peer_credits=VALUE, without spaces \
             around '=')"
        )
    );
    assert_eq!(
        err("options ko2iblnd ipif_name=ib0/1").to_string(),
        format!(
            "{SRC}:1: ipif_name=ib0/1: interface name contains a character Linux or LNet does \
             not allow (whitespace, / \" ' # \\ , ( ) =)"
        )
    );
    // Values are shown as written, quotes included.
    assert!(
        err("options ko2iblnd ipif_name='ib 0'")
            .to_string()
            .starts_with(&format!("{SRC}:1: ipif_name='ib 0': interface name contains")),
    );
    assert_eq!(
        err("options ko2iblnd ntx=\"1 2\"").to_string(),
        format!("{SRC}:1: ntx=\"1 2\": not an integer")
    );
    // Valid unusual interface names.
    for name in ["ib0:1", "eth-0.1", "enp65s0f1np1", "i"] {
        assert_eq!(parse(&format!("options ko2iblnd ipif_name={name}")).tunables.ipif_name, name);
    }
}

#[test]
fn refused_values_are_out_of_range() {
    let refused = [
        "ib_mtu=1500",
        "ib_mtu=8192",
        "ib_mtu=-256",
        "tos=256",
        "tos=-2",
        "retry_count=8",
        "retry_count=-1",
        "rnr_retry_count=8",
        "service=0",
        "service=65536",
        "dev_failover=3",
        "dev_failover=-1",
        "conns_per_peer=128",
        "conns_per_peer=-1",
        "wrq_sge=0",
        "credits=0",
        "credits=-5",
        "ntx=-1",
        "timeout=-1",
        "fmr_pool_size=-1",
        "fmr_flush_trigger=-1",
        "peer_credits=2147483648",
        "peer_credits_hiw=-2147483649",
        "keepalive=0x80000000",
        "peer_credits=99999999999999999999999",
    ];
    for setting in refused {
        let e = err(&format!("# c\n\noptions ko2iblnd {setting}\n"));
        assert!(matches!(e, TunablesError::OutOfRange { .. }), "{setting}: {e:?}");
        assert_eq!(line(&e), 3, "{setting}");
        assert_eq!(e.key(), setting.split('=').next(), "{setting}");
    }
    assert_eq!(
        err("options ko2iblnd ib_mtu=1500").to_string(),
        format!("{SRC}:1: ib_mtu=1500: out of range (allowed: 0 (path MTU), 256, 512, 1024, 2048 or 4096)")
    );
    assert_eq!(
        err("options ko2iblnd tos=0x100").to_string(),
        format!("{SRC}:1: tos=0x100: out of range (allowed: -1 (unset) or 0..=255)")
    );

    let accepted = [
        "tos=-1",
        "tos=255",
        "tos=0",
        "retry_count=0",
        "rnr_retry_count=7",
        "service=1",
        "service=65535",
        "conns_per_peer=127",
        "dev_failover=2",
        "wrq_sge=1",
        "timeout=0",
        "credits=1",
        "ntx=0",
        "peer_credits=2147483647",
        "peer_credits_hiw=-2147483648",
    ];
    for setting in accepted {
        let _ = parse(&format!("options ko2iblnd {setting}"));
    }
    for mtu in IB_MTUS {
        assert_eq!(parse(&format!("options ko2iblnd ib_mtu={mtu}")).tunables.path_mtu(), Some(mtu));
    }
}

#[test]
fn options_without_a_module_name() {
    for text in ["options\n", "# c\n  options   # nothing else\n", "options \\\n\n"] {
        let e = err(text);
        assert!(matches!(e, TunablesError::MissingModuleName { .. }), "{text:?}: {e:?}");
    }
    let e = err("# c\n  options   # nothing else\n");
    assert_eq!(line(&e), 2);
    assert_eq!(
        e.to_string(),
        format!("{SRC}:2: 'options' without a module name (expected: options ko2iblnd key=value ...)")
    );
    // A module with no parameters is fine.
    assert_eq!(parse("options ko2iblnd\noptions lnet").tunables, defaults());
}

#[test]
fn unknown_directive() {
    let e = err("options ko2iblnd ntx=512\noption ko2iblnd ntx=5\n");
    assert!(matches!(&e, TunablesError::UnknownDirective { directive, .. } if directive == "option"));
    assert_eq!(line(&e), 2);
    let e = err("peer_credits=32\n");
    assert!(matches!(e, TunablesError::UnknownDirective { .. }));
}

/// LNet gives a per-peer router buffer count only when it is above 0 (`lnet_peer_buffer_credits`
/// falls back to its default for 0 and for negatives): a kernel node takes
/// `peer_buffer_credits=-1` as the default, so this implementation must not refuse it.
#[test]
fn negative_peer_buffer_credits_mean_lnets_default_as_in_lnet() {
    let c = parse("options ko2iblnd peer_buffer_credits=-1\n");
    assert_eq!(c.tunables.peer_buffer_credits, 0);
    assert_eq!(kinds(&c.warnings), [WarningKind::Clamped]);
    assert_eq!(
        c.warnings[0].to_string(),
        format!("{SRC}:1: peer_buffer_credits=-1 treated as 0 (LNet's default)")
    );
    assert_eq!(parse("options ko2iblnd peer_buffer_credits=16").tunables.peer_buffer_credits, 16);
}

/// A file saved with a UTF-8 byte-order mark: before a directive the mark is invisible in the
/// message and modprobe would skip that line, so the refusal must say what it is; before a
/// comment or a blank line it is harmless.
#[test]
fn a_byte_order_mark_is_named_before_a_directive_and_harmless_before_a_comment() {
    for text in [
        "\u{feff}options ko2iblnd peer_credits=32\n",
        "\u{feff}options ko2iblnd \\\n  peer_credits=32\n",
        "\u{feff}   options ko2iblnd peer_credits=32\r\n",
    ] {
        let e = err(text);
        assert!(matches!(e, TunablesError::ByteOrderMark { .. }), "{text:?}: {e:?}");
        assert_eq!(line(&e), 1, "{text:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "{SRC}:1: the file starts with a UTF-8 byte-order mark (bytes EF BB BF): modprobe \
                 would skip this first line as an unknown directive; save the file without it"
            )
        );
    }
    for text in [
        "\u{feff}# ko2iblnd\noptions ko2iblnd peer_credits=32\n",
        "\u{feff}\noptions ko2iblnd peer_credits=32\n",
    ] {
        let c = parse(text);
        assert_eq!(c.tunables.peer_credits, 32, "{text:?}");
        assert!(c.warnings.is_empty(), "{text:?}: {:?}", c.warnings);
    }
    // Only at the very start: further in, it is an ordinary (invisible) character, shown.
    let e = err("# c\n\u{feff}options ko2iblnd peer_credits=32\n");
    assert_eq!(
        e.to_string(),
        format!(
            "{SRC}:2: unknown directive '\\u{{feff}}options' (expected options, alias, install, \
             remove, softdep, weakdep, blacklist, include, config)"
        )
    );
}

/// A no-break space or a tab inside a word looks like a plain blank in a terminal: the message
/// writes such characters as escapes, so it says why `16 ntx=512` is not an integer.
#[test]
fn messages_show_invisible_characters_as_escapes() {
    let cases = [
        ("options ko2iblnd peer_credits=16\u{a0}ntx=512", "peer_credits=16\\u{a0}ntx=512: not an integer"),
        ("options ko2iblnd cksum=\"1\t\"", "cksum=\"1\\t\": not a boolean (use 1 or 0)"),
        (
            "options ko2iblnd peer_\u{200b}credits=16",
            "peer_\\u{200b}credits=16: unknown ko2iblnd parameter 'peer_\\u{200b}credits' (did you mean \
             'peer_credits'?)",
        ),
        (
            "options ko2iblnd ipif_name=\"ib\u{a0}0\"",
            "ipif_name=\"ib\\u{a0}0\": interface name contains a character Linux or LNet does not allow \
             (whitespace, / \" ' # \\ , ( ) =)",
        ),
    ];
    for (text, message) in cases {
        assert_eq!(err(text).to_string(), format!("{SRC}:1: {message}"), "{text:?}");
    }
    // Visible text, however unusual, is left as written.
    assert_eq!(
        err("options ko2iblnd peer_credits=é").to_string(),
        format!("{SRC}:1: peer_credits=é: not an integer")
    );
    let c = parse("options ko2iblnd\u{a0}x peer_credits=16");
    assert_eq!(
        c.warnings[0].message,
        "options for module 'ko2iblnd\\u{a0}x' ignored (only ko2iblnd and lnet options are read)"
    );
}

#[test]
fn the_first_error_is_returned() {
    // Syntax errors come in file order, before range checks.
    let e = err("options ko2iblnd tos=999\noptions ko2iblnd bogus=1\n");
    assert!(matches!(e, TunablesError::UnknownParameter { .. }), "{e:?}");
    assert_eq!(line(&e), 2);
    let e = err("options ko2iblnd peer_credits=x\noptions ko2iblnd bogus=1\n");
    assert!(matches!(e, TunablesError::InvalidInteger { .. }), "{e:?}");
}

#[test]
fn load_reads_files_and_reports_io_errors() {
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let good = dir.join(format!("lnd-tunables-{pid}-good.conf"));
    let bad = dir.join(format!("lnd-tunables-{pid}-latin1.conf"));
    let missing = dir.join(format!("lnd-tunables-{pid}-missing.conf"));
    std::fs::write(&good, "options ko2iblnd peer_credits=16\noptions ko2iblnd tos=300\n").unwrap();
    std::fs::write(&bad, b"# ok\n# caf\xe9\noptions ko2iblnd ntx=1\n").unwrap();

    let e = Tunables::load(&good).unwrap_err();
    assert_eq!(e.location().unwrap().source, good.display().to_string());
    assert_eq!(
        e.to_string(),
        format!("{}:2: tos=300: out of range (allowed: -1 (unset) or 0..=255)", good.display())
    );

    std::fs::write(&good, "options ko2iblnd peer_credits=16\n").unwrap();
    assert_eq!(Tunables::load(&good).unwrap().tunables.peer_credits, 16);

    let e = Tunables::load(&bad).unwrap_err();
    assert!(matches!(e, TunablesError::NotUtf8 { .. }), "{e:?}");
    assert_eq!(line(&e), 2);

    let e = Tunables::load(&missing).unwrap_err();
    assert!(matches!(&e, TunablesError::Io { path, .. } if *path == missing), "{e:?}");
    assert!(e.location().is_none() && e.key().is_none());
    assert!(e.to_string().starts_with(&format!("{}: cannot read: ", missing.display())), "{e}");

    let _ = std::fs::remove_file(&good);
    let _ = std::fs::remove_file(&bad);
}

// ---------------------------------------------------------------------------------------------
// o2iblnd's rules

#[test]
fn peer_credits_is_clamped_and_reported() {
    let one = |text: &str| {
        let c = parse(text);
        assert_eq!(c.warnings.len(), 1, "{text}: {:?}", c.warnings);
        assert_eq!(c.warnings[0].kind, WarningKind::Clamped);
        (c.tunables, c.warnings[0].to_string())
    };
    let (t, w) = one("options ko2iblnd peer_credits=4");
    assert_eq!((t.peer_credits, t.peer_credits_hiw, t.concurrent_sends), (8, 4, 8));
    assert_eq!(w, format!("{SRC}:1: peer_credits=4 raised to 8 (o2iblnd's minimum)"));
    let (t, w) = one("options ko2iblnd peer_credits=-3");
    assert_eq!(t.peer_credits, 8);
    assert!(w.ends_with("peer_credits=-3 raised to 8 (o2iblnd's minimum)"), "{w}");
    let (t, w) = one("options ko2iblnd credits=1024 peer_credits=300");
    assert_eq!((t.peer_credits, t.peer_credits_hiw, t.concurrent_sends), (255, 127, 255));
    assert!(
        w.ends_with("peer_credits=300 lowered to 255 (o2iblnd's maximum: the wire's credit field is 8 bits)"),
        "{w}"
    );
    let (t, w) = one("options ko2iblnd credits=16\noptions ko2iblnd peer_credits=32");
    assert_eq!(t.peer_credits, 16);
    assert_eq!(w, format!("{SRC}:2: peer_credits=32 lowered to 16 (it may not exceed credits=16)"));
    // credits below the minimum wins over the minimum, as in o2iblnd. With peer_credits left at
    // its default, the warning points at the credits line that lowered it.
    let (t, w) = one("# small\noptions ko2iblnd credits=4");
    assert_eq!((t.peer_credits, t.peer_credits_hiw, t.concurrent_sends), (4, 2, 4));
    assert_eq!(w, format!("{SRC}:2: peer_credits=8 lowered to 4 (it may not exceed credits=4)"));
    // Both steps, in o2iblnd's order.
    let (t, w) = one("options ko2iblnd credits=4 peer_credits=2");
    assert_eq!(t.peer_credits, 4);
    assert_eq!(
        w,
        format!(
            "{SRC}:1: peer_credits=2 raised to 8 (o2iblnd's minimum), then lowered to 4 (it may not exceed credits=4)"
        )
    );
}

#[test]
fn peer_credits_hiw_is_clamped_to_half_and_q_minus_one() {
    let c = parse("options ko2iblnd peer_credits_hiw=2");
    assert_eq!(c.tunables.peer_credits_hiw, 4);
    assert_eq!(c.warnings.len(), 1);
    assert_eq!(
        c.warnings[0].to_string(),
        format!("{SRC}:1: peer_credits_hiw=2 raised to 4 (peer_credits/2)")
    );

    let c = parse("options ko2iblnd peer_credits=32 peer_credits_hiw=40");
    assert_eq!(c.tunables.peer_credits_hiw, 31);
    assert!(c.warnings[0].message.ends_with("peer_credits_hiw=40 lowered to 31 (peer_credits-1)"));

    let c = parse("options ko2iblnd peer_credits=32 peer_credits_hiw=-1");
    assert_eq!(c.tunables.peer_credits_hiw, 16);
    assert_eq!(c.warnings.len(), 1);

    for ok in [16, 20, 31] {
        let c = parse(&format!("options ko2iblnd peer_credits=32 peer_credits_hiw={ok}"));
        assert_eq!(c.tunables.peer_credits_hiw, ok);
        assert!(c.warnings.is_empty());
    }
    // 0 is "automatic": derived silently.
    let c = parse("options ko2iblnd peer_credits=32 peer_credits_hiw=0");
    assert_eq!(c.tunables.peer_credits_hiw, 16);
    assert!(c.warnings.is_empty());
}

#[test]
fn concurrent_sends_is_kept_between_half_and_twice_q() {
    let c = parse("options ko2iblnd peer_credits=16 concurrent_sends=100");
    assert_eq!(c.tunables.concurrent_sends, 32);
    assert_eq!(kinds(&c.warnings), [WarningKind::Clamped]);
    assert!(c.warnings[0].message.ends_with("concurrent_sends=100 lowered to 32 (2 * peer_credits)"));

    let c = parse("options ko2iblnd peer_credits=16 concurrent_sends=2");
    assert_eq!(c.tunables.concurrent_sends, 8);
    assert_eq!(kinds(&c.warnings), [WarningKind::Clamped, WarningKind::Advisory]);
    assert_eq!(
        c.warnings[1].to_string(),
        format!("{SRC}:1: concurrent_sends=8 is lower than peer_credits=16: performance may drop slightly")
    );

    let c = parse("options ko2iblnd peer_credits=16 concurrent_sends=12");
    assert_eq!(c.tunables.concurrent_sends, 12);
    assert_eq!(kinds(&c.warnings), [WarningKind::Advisory]);

    let c = parse("options ko2iblnd peer_credits=16 concurrent_sends=0");
    assert_eq!(c.tunables.concurrent_sends, 16);
    assert!(c.warnings.is_empty());

    // With Q = 1 (credits=1) o2iblnd's floor Q/2 would be 0 sends: kept at 1.
    let t = parse("options ko2iblnd credits=1 concurrent_sends=-4").tunables;
    assert_eq!((t.peer_credits, t.peer_credits_hiw, t.concurrent_sends), (1, 0, 1));
}

#[test]
fn values_o2iblnd_reads_as_off_or_auto() {
    let c = parse(
        "options ko2iblnd keepalive=-1 nscheds=-2 peer_timeout=-1 conns_per_peer=0 \
         peer_buffer_credits=-1",
    );
    let t = &c.tunables;
    assert_eq!((t.keepalive, t.nscheds, t.peer_timeout, t.conns_per_peer), (0, 0, 0, 1));
    assert_eq!(t.peer_buffer_credits, 0);
    assert_eq!(kinds(&c.warnings), [WarningKind::Clamped; 5]);
    let msgs: Vec<&str> = c.warnings.iter().map(|w| w.message.as_str()).collect();
    assert_eq!(
        msgs,
        [
            "keepalive=-1 treated as 0 (keepalives disabled)",
            "nscheds=-2 treated as 0 (automatic: one scheduler thread)",
            "peer_timeout=-1 treated as 0 (peer death detection disabled)",
            "peer_buffer_credits=-1 treated as 0 (LNet's default)",
            "conns_per_peer=0 raised to 1",
        ]
    );
}

#[test]
fn fmr_pool_size_must_cover_a_quarter_of_ntx() {
    // Only ntx set in the file: the error points at ntx.
    let e = err("# big tx pool\noptions ko2iblnd ntx=4096\n");
    assert!(matches!(e, TunablesError::Inconsistent { .. }), "{e:?}");
    assert_eq!((line(&e), e.key()), (2, Some("ntx")));
    assert_eq!(
        e.to_string(),
        format!(
            "{SRC}:2: ntx=4096: ntx/4 = 1024 exceeds fmr_pool_size=512; o2iblnd refuses to \
             start (lower ntx or raise fmr_pool_size to at least 1024)"
        )
    );
    // fmr_pool_size set: the error points at it.
    let e = err("options ko2iblnd ntx=4096\noptions ko2iblnd fmr_pool_size=1000\n");
    assert_eq!((line(&e), e.key()), (2, Some("fmr_pool_size")));
    assert!(e.to_string().contains("below ntx/4 = 1024 (ntx=4096)"), "{e}");

    let t = parse("options ko2iblnd ntx=4096 fmr_pool_size=1024").tunables;
    assert_eq!((t.ntx, t.fmr_pool_size), (4096, 1024));
}

#[test]
fn obsolete_parameters_are_accepted_with_a_warning() {
    let c = parse("options ko2iblnd map_on_demand=256\noptions ko2iblnd pmr_pool_size=512\n");
    assert_eq!(c.tunables, defaults());
    assert_eq!(kinds(&c.warnings), [WarningKind::Obsolete, WarningKind::Obsolete]);
    // Reader notes come first (file order), finalization notes after.
    assert_eq!(c.warnings[0].at.as_ref().unwrap().line, 2);
    assert!(c.warnings[0].message.starts_with("pmr_pool_size=512: obsolete ko2iblnd parameter, ignored"));
    assert_eq!(c.warnings[1].at.as_ref().unwrap().line, 1);
    assert!(
        c.warnings[1]
            .message
            .starts_with("map_on_demand=256: obsolete ko2iblnd parameter, accepted and forced to 1")
    );
    // Even map_on_demand=1 is reported: the parameter does nothing.
    assert_eq!(kinds(&parse("options ko2iblnd map_on_demand=1").warnings), [WarningKind::Obsolete]);
    // Still a C int.
    assert!(matches!(err("options ko2iblnd map_on_demand=lots"), TunablesError::InvalidInteger { .. }));
}

#[test]
fn the_opa_profile_parses() {
    let c = parse(
        "options ko2iblnd peer_credits=32 peer_credits_hiw=16 credits=1024 concurrent_sends=64 \
         ntx=2048 map_on_demand=256 fmr_pool_size=2048 fmr_flush_trigger=512 fmr_cache=1 \
         conns_per_peer=4",
    );
    let t = &c.tunables;
    assert_eq!((t.peer_credits, t.peer_credits_hiw, t.credits, t.concurrent_sends), (32, 16, 1024, 64));
    assert_eq!((t.ntx, t.map_on_demand, t.fmr_pool_size, t.fmr_flush_trigger), (2048, 1, 2048, 512));
    assert!(t.fmr_cache);
    assert_eq!(t.conns_per_peer, 4);
    assert_eq!(kinds(&c.warnings), [WarningKind::Obsolete]);
}

#[test]
fn finalize_works_on_tunables_built_in_code() {
    let mut t = Tunables { peer_credits: 32, credits: 1024, ..Tunables::default() };
    let notes = t.finalize().unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!((t.peer_credits, t.peer_credits_hiw, t.concurrent_sends), (32, 16, 32));
    // Idempotent.
    let again = t.clone().finalized().unwrap();
    assert_eq!(again, (t.clone(), vec![]));

    // Notes carry no location.
    let (f, notes) = Tunables { peer_credits_hiw: 1, map_on_demand: 0, ..t.clone() }.finalized().unwrap();
    assert_eq!(f.peer_credits_hiw, 16);
    assert_eq!(f.map_on_demand, 1);
    assert_eq!(kinds(&notes), [WarningKind::Clamped, WarningKind::Obsolete]);
    assert!(notes.iter().all(|n| n.at.is_none()));
    assert_eq!(notes[0].to_string(), "peer_credits_hiw=1 raised to 16 (peer_credits/2)");

    // Errors name <tunables>; self is left unchanged.
    let mut bad = Tunables { tos: 300, ..Tunables::default() };
    let before = bad.clone();
    let e = bad.finalize().unwrap_err();
    assert_eq!(bad, before);
    assert_eq!(e.location(), Some(&Location::program()));
    assert_eq!(e.to_string(), "<tunables>: tos=300: out of range (allowed: -1 (unset) or 0..=255)");
    let e = Tunables { ipif_name: String::new(), ..Tunables::default() }.finalized().unwrap_err();
    assert!(matches!(e, TunablesError::InvalidString { .. }), "{e:?}");
    let e = Tunables { ntx: 4096, ..Tunables::default() }.finalized().unwrap_err();
    assert_eq!(e.key(), Some("fmr_pool_size"));
}

#[test]
fn per_connection_helpers() {
    let t = defaults(); // Q = 8, hiw = 4, concurrent_sends = 8
    assert_eq!(t.peer_credits_hiw_for(8), 4);
    assert_eq!(t.peer_credits_hiw_for(4), 2);
    assert_eq!(t.peer_credits_hiw_for(2), 1);
    assert_eq!(t.peer_credits_hiw_for(1), 1);
    assert_eq!(t.peer_credits_hiw_for(0), 0);
    assert_eq!(t.peer_credits_hiw_for(16), 8);
    assert_eq!(t.concurrent_sends_for(8), 8);
    assert_eq!(t.concurrent_sends_for(3), 3);
    assert_eq!(t.concurrent_sends_for(1), 1);
    assert_eq!(t.concurrent_sends_for(0), 0);

    let t = parse("options ko2iblnd peer_credits=32 peer_credits_hiw=31 concurrent_sends=64").tunables;
    assert_eq!(t.peer_credits_hiw_for(32), 31);
    assert_eq!(t.peer_credits_hiw_for(16), 15); // LU-15828: scaled, not min(hiw, Q-1) only
    assert_eq!(t.peer_credits_hiw_for(8), 7);
    assert_eq!(t.concurrent_sends_for(32), 64);
    assert_eq!(t.concurrent_sends_for(16), 32);
    assert_eq!(t.concurrent_sends_for(1), 2);

    let t = parse("options ko2iblnd peer_credits=32 peer_credits_hiw=16 concurrent_sends=16").tunables;
    assert_eq!(t.peer_credits_hiw_for(10), 5);
    assert_eq!(t.concurrent_sends_for(10), 5);
    assert_eq!(t.concurrent_sends_for(3), 1);

    // Unfinalized values: 0 still means "derive".
    let raw = Tunables { peer_credits: 32, ..Tunables::default() };
    assert_eq!((raw.peer_credits_hiw_for(32), raw.concurrent_sends_for(32)), (16, 32));

    // At the NI's own queue depth the helpers give the NI values, for every valid Q.
    for q in 1..=255u32 {
        for (h, c) in [(0, 0), (q / 2, q / 2), (q.saturating_sub(1), 2 * q), (3 * q / 4, q)] {
            // credits = q makes even q < 8 the queue depth.
            let t = Tunables {
                credits: q,
                peer_credits: q,
                peer_credits_hiw: h,
                concurrent_sends: c,
                ..Tunables::default()
            };
            let (t, _) = t.finalized().unwrap();
            assert_eq!(t.peer_credits, q);
            if q >= 2 {
                assert_eq!(t.peer_credits_hiw_for(q), t.peer_credits_hiw, "q={q} h={h}");
            }
            assert_eq!(t.concurrent_sends_for(t.peer_credits), t.concurrent_sends, "q={q} c={c}");
        }
    }
}

#[test]
fn durations_and_derived_sizes() {
    let t = defaults();
    assert_eq!(t.tx_timeout(), Duration::from_secs(50));
    assert_eq!(t.connect_timeout(), Duration::from_secs(12), "50 / 4 in whole seconds, as o2iblnd");
    assert_eq!(parse("options ko2iblnd timeout=23").tunables.connect_timeout(), CONNECT_TIMEOUT_MIN);
    assert_eq!(parse("options ko2iblnd timeout=99").tunables.connect_timeout(), Duration::from_secs(24));
    assert_eq!(t.keepalive_interval(), Some(Duration::from_secs(100)));
    assert_eq!(t.peer_timeout_duration(), Some(Duration::from_secs(180)));
    assert_eq!(t.path_mtu(), None);
    assert_eq!(t.type_of_service(), None);

    let t = parse("options ko2iblnd timeout=0 keepalive=0 peer_timeout=0 tos=106").tunables;
    assert_eq!(t.tx_timeout(), Duration::from_secs(u64::from(LNET_LND_TIMEOUT_SECS)));
    assert_eq!(t.keepalive_interval(), None);
    assert_eq!(t.peer_timeout_duration(), None);
    assert_eq!(t.type_of_service(), Some(106));
    let t = parse("options ko2iblnd timeout=8").tunables;
    assert_eq!(t.connect_timeout(), CONNECT_TIMEOUT_MIN);

    let t = defaults();
    assert_eq!([1, 2, 3, 8, 64].map(|c| t.scheduler_threads(c)), [1, 1, 1, 1, 1]);
    let t = parse("options ko2iblnd nscheds=3").tunables;
    assert_eq!([1, 2, 8, 0].map(|c| t.scheduler_threads(c)), [1, 2, 3, 1]);
    let t = parse("options ko2iblnd ntx=4096 fmr_pool_size=4096 fmr_flush_trigger=2048").tunables;
    assert_eq!([0, 1, 4, 32].map(|n| t.tx_pool_size_per_cpt(n)), [4096, 4096, 1024, 256]);
    assert_eq!([1, 4, 32].map(|n| t.fmr_pool_size_per_cpt(n)), [4096, 1024, 256]);
    assert_eq!([1, 4, 32].map(|n| t.fmr_flush_trigger_per_cpt(n)), [2048, 512, 192]);
}

// ---------------------------------------------------------------------------------------------
// The shipped configuration and rendering

#[test]
fn the_shipped_conf_is_exactly_the_defaults() {
    let c = Tunables::parse_str("conf/ko2iblnd.conf", SHIPPED).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.tunables, defaults());
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let networks = c.lnet_option("networks").expect("networks line");
    assert_eq!(networks.value.as_deref(), Some("o2ib0(lo)"));

    // Every current parameter is written out, once, at o2iblnd's module default (0 = auto for
    // peer_credits_hiw and concurrent_sends), except the obsolete map_on_demand.
    let module_defaults = Settings::from_tunables(&Tunables::default());
    let mut settings = Settings::from_tunables(&Tunables::default());
    let (mut lnet, mut warnings) = (Vec::new(), Vec::new());
    Reader::new("conf", &mut settings, &mut lnet, &mut warnings).read(SHIPPED).unwrap();
    assert!(warnings.is_empty(), "set twice? {warnings:?}");
    for p in Param::ALL {
        let s = settings.get(p);
        assert_eq!(s.at.is_some(), !p.is_obsolete(), "{} written out?", p.name());
        assert_eq!(s.value, module_defaults.get(p).value, "{} is not at its default", p.name());
    }

    // The commented-out example profiles are valid once uncommented.
    let profiles: Vec<&str> = SHIPPED.lines().filter_map(|l| l.strip_prefix("# options ko2iblnd ")).collect();
    assert!(profiles.len() >= 3, "{profiles:?}");
    for p in profiles {
        let text = format!("{SHIPPED}\noptions ko2iblnd {p}\n");
        let c = Tunables::parse_str("conf", &text).unwrap_or_else(|e| panic!("{p}: {e}"));
        // Appended as the file suggests: no "set again" for the defaults it overrides.
        assert!(!kinds(&c.warnings).contains(&WarningKind::Overridden), "{p}: {:?}", c.warnings);
        if p == "map_on_demand=1" {
            assert_eq!(kinds(&c.warnings), [WarningKind::Obsolete]);
        } else {
            assert_ne!(c.tunables, defaults(), "{p}");
        }
    }
}

#[test]
fn to_modprobe_string_round_trips() {
    let check = |t: &Tunables| {
        let line = t.to_modprobe_string();
        assert!(line.starts_with("options ko2iblnd ") && !line.contains('\n'), "{line}");
        let back = Tunables::parse_str("rendered", &line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(&back.tunables, t, "{line}");
        assert!(back.warnings.iter().all(|w| w.kind == WarningKind::Advisory), "{:?}", back.warnings);
    };
    let d = defaults();
    check(&d);
    assert_eq!(
        d.to_modprobe_string(),
        "options ko2iblnd service=987 cksum=0 timeout=50 keepalive=100 ntx=512 credits=256 \
         peer_credits=8 peer_credits_hiw=4 concurrent_sends=8 fmr_pool_size=512 \
         fmr_flush_trigger=384 fmr_cache=1 use_fastreg_gaps=0 ib_mtu=0 retry_count=5 \
         rnr_retry_count=6 use_privileged_port=1 require_privileged_port=0 ipif_name=ib0 \
         nscheds=0 conns_per_peer=1 wrq_sge=2 peer_timeout=180 peer_buffer_credits=0 \
         dev_failover=0 tos=-1 busy_poll_usec=200 accept_nids=\"\""
    );
    check(
        &parse(
            "options ko2iblnd peer_credits=32 peer_credits_hiw=16 credits=1024 concurrent_sends=64 \
             ntx=2048 fmr_pool_size=2048 conns_per_peer=4 ipif_name=ib0:1",
        )
        .tunables,
    );

    // Random valid configurations.
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for _ in 0..500 {
        let t = random_tunables(&mut rng);
        match t.finalized() {
            Ok((t, _)) => check(&t),
            Err(e) => assert!(matches!(e, TunablesError::Inconsistent { .. }), "{e:?}"),
        }
    }

    // A bad name is quoted so that it reads back as the same (refused) word.
    let t = Tunables { ipif_name: "ib 0".to_owned(), ..defaults() };
    assert!(t.to_modprobe_string().contains("ipif_name=\"ib 0\""));
    let e = Tunables::parse_str("rendered", &t.to_modprobe_string()).unwrap_err();
    assert!(matches!(e, TunablesError::InvalidString { .. }), "{e:?}");
}

// ---------------------------------------------------------------------------------------------
// Fuzzing

/// xorshift64*: deterministic, no dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next() % u64::from(hi - lo + 1)) as u32
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn word<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

fn random_tunables(rng: &mut Rng) -> Tunables {
    let names = ["ib0", "ib1", "eth0", "ib0:1", "enp1s0f0"];
    let credits = rng.range(1, 4096);
    Tunables {
        service: rng.range(1, 65535) as u16,
        cksum: rng.below(2) == 1,
        timeout: rng.range(0, 3600),
        keepalive: rng.range(0, 3600),
        ntx: rng.range(0, 8192),
        credits,
        peer_credits: rng.range(0, 300),
        peer_credits_hiw: rng.range(0, 300),
        concurrent_sends: rng.range(0, 600),
        map_on_demand: 1,
        fmr_pool_size: rng.range(0, 8192),
        fmr_flush_trigger: rng.range(0, 8192),
        fmr_cache: rng.below(2) == 1,
        use_fastreg_gaps: rng.below(2) == 1,
        ib_mtu: *rng.pick(&[0, 256, 512, 1024, 2048, 4096]),
        retry_count: rng.range(0, 7) as u8,
        rnr_retry_count: rng.range(0, 7) as u8,
        use_privileged_port: rng.below(2) == 1,
        require_privileged_port: rng.below(2) == 1,
        ipif_name: (*rng.pick(&names)).to_owned(),
        nscheds: rng.range(0, 64),
        conns_per_peer: rng.range(0, 127),
        wrq_sge: rng.range(1, 32),
        peer_timeout: rng.range(0, 3600),
        peer_buffer_credits: rng.range(0, 1024),
        dev_failover: rng.range(0, 2),
        tos: rng.range(0, 256) as i32 - 1,
        busy_poll_usec: rng.range(0, 1000),
        accept_nids: (0..rng.range(0, 3)).map(|i| format!("10.0.0.{i}@o2ib").parse().unwrap()).collect(),
    }
}

/// Parses `text`; must not panic; checks the invariants of whatever comes back. Returns whether
/// the text was accepted.
fn parse_anything(text: &str) -> bool {
    let nlines = text.lines().count();
    match Tunables::parse_str("fuzz", text) {
        Ok(c) => {
            for w in &c.warnings {
                let _ = w.to_string();
                if let Some(at) = &w.at {
                    assert!(at.line >= 1 && at.line <= nlines && at.start_line <= at.line, "{w:?}\n{text:?}");
                }
            }
            let line = c.tunables.to_modprobe_string();
            let back = Tunables::parse_str("fuzz-rendered", &line)
                .unwrap_or_else(|e| panic!("{e}\n{line}\nfrom {text:?}"));
            assert_eq!(back.tunables, c.tunables, "{text:?}");
            true
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("fuzz:"), "{msg}");
            let at = e.location().expect("parse errors have a location");
            assert!(at.line >= 1 && at.line <= nlines.max(1), "{e:?}\n{text:?}");
            assert!(at.start_line >= 1 && at.start_line <= at.line, "{e:?}\n{text:?}");
            false
        }
    }
}

#[test]
fn fuzz_random_text_never_panics() {
    let pieces = [
        "options",
        "options",
        " ",
        " ",
        "  ",
        "\t",
        "\n",
        "\n",
        "\r\n",
        "ko2iblnd",
        "ko2iblnd",
        "lnet",
        "ksocklnd",
        "=",
        "=",
        "\"",
        "'",
        "\\",
        "\\\n",
        "#",
        "peer_credits",
        "credits",
        "peer_credits_hiw",
        "concurrent_sends",
        "map_on_demand",
        "pmr_pool_size",
        "ipif_name",
        "ntx",
        "fmr_pool_size",
        "tos",
        "ib_mtu",
        "conns_per_peer",
        "cksum",
        "install",
        "alias",
        "0",
        "1",
        "8",
        "32",
        "255",
        "256",
        "-1",
        "0x",
        "ff",
        "4096",
        "99999999999",
        "é",
        "\u{0}",
        "ib0",
        "o2ib0(lo)",
        "networks",
        "y",
        "off",
        "-",
    ];
    let mut rng = Rng(0x00c0_ffee_d00d_f00d);
    let mut accepted = 0;
    for _ in 0..10_000 {
        let n = rng.below(40);
        let text: String = (0..n).map(|_| *rng.pick(&pieces)).collect();
        accepted += usize::from(parse_anything(&text));
    }
    assert!(accepted > 100, "free-form: only {accepted} accepted");

    // Structured: real directives with random names and values, so that many are accepted and
    // the clamping and round-trip paths run.
    let names: Vec<&str> =
        Tunables::parameter_names().chain(["pmr_pool_size", "peer-credits", "bogus"]).collect();
    let values = [
        "0", "1", "-1", "2", "4", "7", "8", "16", "32", "64", "255", "256", "300", "987", "1024", "2048",
        "4096", "0x10", "010", "y", "off", "ib0", "\"ib1\"", "'x'", "", "-3",
    ];
    let mut accepted = 0;
    let mut rejected = 0;
    for _ in 0..10_000 {
        let mut text = String::new();
        for _ in 0..1 + rng.below(4) {
            text.push_str(rng.word(&["options ko2iblnd", "options lnet", "# c", "install x y"]));
            for _ in 0..rng.below(6) {
                text.push(' ');
                text.push_str(rng.word(&names));
                if rng.below(8) != 0 {
                    text.push('=');
                    text.push_str(rng.word(&values));
                }
                if rng.below(10) == 0 {
                    text.push_str(" \\\n ");
                }
            }
            text.push_str(rng.word(&["\n", "\n", " # t\n", "\r\n"]));
        }
        if parse_anything(&text) {
            accepted += 1;
        } else {
            rejected += 1;
        }
    }
    assert!(accepted > 1_000 && rejected > 1_000, "{accepted} accepted, {rejected} rejected");
}

#[test]
fn fuzz_garbled_shipped_conf_never_panics() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let noise = ['"', '\'', '\\', '#', '=', '\n', ' ', '-', '0', '9', 'x', 'é', '\u{0}'];
    for _ in 0..300 {
        let mut chars: Vec<char> = SHIPPED.chars().collect();
        for _ in 0..1 + rng.below(8) {
            let i = rng.below(chars.len());
            match rng.below(3) {
                0 => {
                    chars.remove(i);
                }
                1 => chars.insert(i, *rng.pick(&noise)),
                _ => chars[i] = *rng.pick(&noise),
            }
        }
        let text: String = chars.into_iter().collect();
        parse_anything(&text);
    }
}

#[test]
fn fuzz_finalize_never_panics() {
    let mut rng = Rng(42);
    let wild = [0, 1, 2, 7, 8, 255, 256, u32::MAX / 2, i32::MAX as u32, u32::MAX];
    for _ in 0..5_000 {
        let mut t = random_tunables(&mut rng);
        t.credits = *rng.pick(&wild);
        t.peer_credits = *rng.pick(&wild);
        t.peer_credits_hiw = *rng.pick(&wild);
        t.concurrent_sends = *rng.pick(&wild);
        t.ntx = *rng.pick(&wild);
        t.timeout = *rng.pick(&wild);
        let _ = t.peer_credits_hiw_for(*rng.pick(&wild));
        let _ = t.concurrent_sends_for(*rng.pick(&wild));
        if let Ok((f, _)) = t.finalized() {
            assert_eq!(f.clone().finalized().unwrap().0, f);
            assert!(f.peer_credits <= f.credits && f.peer_credits <= PEER_CREDITS_MAX);
            assert!(f.concurrent_sends >= 1 && f.concurrent_sends <= 2 * f.peer_credits);
            assert!(f.peer_credits_hiw < f.peer_credits || f.peer_credits == 1);
            for q in [0, 1, 2, f.peer_credits, 255, u32::MAX] {
                let _ = (f.peer_credits_hiw_for(q), f.concurrent_sends_for(q));
            }
            let _ = (f.tx_timeout(), f.connect_timeout(), f.scheduler_threads(*rng.pick(&wild)));
        }
    }
}

#[test]
fn edit_distance_is_levenshtein() {
    assert_eq!(edit_distance("", ""), 0);
    assert_eq!(edit_distance("abc", ""), 3);
    assert_eq!(edit_distance("peer_credit", "peer_credits"), 1);
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("ntx", "tos"), 3);
}

#[test]
fn accept_nids_is_a_comma_separated_nid_list_and_empty_accepts_everyone() {
    let t = parse("options ko2iblnd accept_nids=10.0.0.2@o2ib,10.0.0.3@o2ib").tunables;
    assert_eq!(t.accept_nids.len(), 2);
    assert!(parse("options ko2iblnd accept_nids=\"\"").tunables.accept_nids.is_empty());
    let e = Tunables::parse_str("f", "options ko2iblnd accept_nids=10.0.0.2@o2ib,bogus").unwrap_err();
    assert!(e.to_string().contains("accept_nids"), "{e}");
    assert!(e.to_string().contains("not a comma-separated list of NIDs"), "{e}");
}

/// `options lnet lnet_transaction_timeout=N` sets LNet's response timeout (seconds); LNet's
/// default without it; a bad value is refused with its place in the file.
#[test]
fn the_lnet_transaction_timeout_comes_from_options_lnet() {
    use std::time::Duration;
    let timeout = |text: &str| {
        Tunables::parse_str("t.conf", text).unwrap().lnet_config().map(|c| c.transaction_timeout)
    };
    assert_eq!(timeout("options ko2iblnd peer_credits=16\n").unwrap(), Some(Duration::from_secs(150)));
    assert_eq!(timeout("options lnet lnet_transaction_timeout=30\n").unwrap(), Some(Duration::from_secs(30)));
    assert_eq!(
        timeout("options lnet lnet-transaction-timeout=100 networks=o2ib0(lo)\noptions lnet lnet_transaction_timeout=0x10\n").unwrap(),
        Some(Duration::from_secs(16))
    );
    for (text, want) in [
        (
            "options lnet lnet_transaction_timeout=0\n",
            "t.conf:1: lnet_transaction_timeout=0: out of range (allowed: 1 to 2147483647 seconds)",
        ),
        (
            "options lnet lnet_transaction_timeout=-5\n",
            "t.conf:1: lnet_transaction_timeout=-5: out of range (allowed: 1 to 2147483647 seconds)",
        ),
        (
            "\noptions lnet lnet_transaction_timeout=2147483648\n",
            "t.conf:2: lnet_transaction_timeout=2147483648: out of range (allowed: 1 to 2147483647 seconds)",
        ),
        (
            "options lnet lnet_transaction_timeout=1s\n",
            "t.conf:1: lnet_transaction_timeout=1s: not an integer",
        ),
    ] {
        assert_eq!(timeout(text).unwrap_err().to_string(), want, "{text}");
    }
    assert!(matches!(
        timeout("options lnet lnet_transaction_timeout\n"),
        Err(TunablesError::MissingValue { .. })
    ));
}
