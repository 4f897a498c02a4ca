//! Result tables and the JSON document.

use std::fmt::Write as _;

use crate::client::RunResult;
use crate::proto::Op;

/// Transport counters for one run (client and server together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets retransmitted by the fabric.
    pub retransmits: u64,
    /// Times a send waited for a credit.
    pub credit_stalls: u64,
    /// NOOPs sent.
    pub noops: u64,
    /// CPU time (user + system) of the client process during the run, in microseconds.
    pub client_cpu_us: u64,
    /// CPU time of the server process during the run (from its stats), in microseconds;
    /// `None` when the server's stats did not come (then there is no CPU per GB either).
    pub server_cpu_us: Option<u64>,
}

impl Row {
    /// CPU seconds per GB (10^9 bytes) moved, both processes together; `None` for pings.
    pub fn cpu_s_per_gb(&self) -> Option<f64> {
        crate::cpu::secs_per_gb(self.counters.client_cpu_us + self.counters.server_cpu_us?, self.run.bytes)
    }
}

/// One row: a run and the counters it moved.
#[derive(Clone, Debug)]
pub struct Row {
    /// The measurement.
    pub run: RunResult,
    /// Counters during it.
    pub counters: Counters,
}

/// lnet_selftest's name of a `check=` mode.
fn check_name(c: crate::proto::Check) -> &'static str {
    match c {
        crate::proto::Check::None => "none",
        crate::proto::Check::Simple => "simple",
        crate::proto::Check::Full => "full",
    }
}

/// The test's name as lnet_selftest would say it.
pub fn op_name(op: Op) -> &'static str {
    match op {
        Op::BrwWrite => "brw write",
        Op::BrwRead => "brw read",
        Op::Ping => "ping",
        Op::Stats => "stats",
    }
}

/// A size the way lst writes it (4K, 1M).
pub fn size_name(n: usize) -> String {
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{}K", n >> 10)
    } else {
        format!("{n}")
    }
}

/// The human-readable table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:>5} {:>4} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>7} {:>7} {:>6} {:>8}",
        "test",
        "size",
        "conc",
        "MiB/s",
        "RPC/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "errors",
        "retrans",
        "stalls",
        "noops",
        "CPU s/GB"
    );
    for r in rows {
        let x = &r.run;
        let _ = writeln!(
            out,
            "{:<10} {:>5} {:>4} {:>10.1} {:>9.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6} {:>7} {:>7} {:>6} {:>8}",
            op_name(x.op),
            size_name(x.size),
            x.concurrency,
            x.mib_s(),
            x.rpc_s(),
            x.lat_us(0.50),
            x.lat_us(0.99),
            x.lat_us(0.999),
            x.latency.max() as f64 / 1000.0,
            x.errors + x.corrupt,
            r.counters.retransmits,
            r.counters.credit_stalls,
            r.counters.noops,
            r.cpu_s_per_gb().map_or("-".to_owned(), |c| format!("{c:.2}"))
        );
    }
    out
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// One JSON document: a record per run. `completed`: every RPC completed and none found its
/// data corrupt; `verified`: that, with the data of every run checked (`check` not `none`).
pub fn json(rows: &[Row], completed: bool) -> String {
    let verified = completed && rows.iter().all(|r| r.run.check != crate::proto::Check::None);
    let mut out = String::from("{\n  \"runs\": [\n");
    for (i, r) in rows.iter().enumerate() {
        let x = &r.run;
        let _ = write!(
            out,
            "    {{\"op\": {}, \"size\": {}, \"concurrency\": {}, \"check\": {}, \"rpcs\": {}, \"bytes\": {}, \"seconds\": {:.6}, \
             \"mib_s\": {:.3}, \"rpc_s\": {:.3}, \"latency_us\": {{\"p50\": {:.3}, \"p99\": {:.3}, \"p99_9\": {:.3}, \"max\": {:.3}}}, \
             \"errors\": {}, \"corrupt\": {}, \"first_error\": {}, \
             \"stats\": {{\"retransmits\": {}, \"credit_stalls\": {}, \"noops\": {}}}, \
             \"cpu\": {{\"client_s\": {:.3}, \"server_s\": {}, \"s_per_gb\": {}}}}}",
            json_str(op_name(x.op)),
            x.size,
            x.concurrency,
            json_str(check_name(x.check)),
            x.rpcs,
            x.bytes,
            x.secs,
            x.mib_s(),
            x.rpc_s(),
            x.lat_us(0.50),
            x.lat_us(0.99),
            x.lat_us(0.999),
            x.latency.max() as f64 / 1000.0,
            x.errors,
            x.corrupt,
            x.first_error.as_deref().map_or("null".to_owned(), json_str),
            r.counters.retransmits,
            r.counters.credit_stalls,
            r.counters.noops,
            r.counters.client_cpu_us as f64 / 1e6,
            r.counters.server_cpu_us.map_or("null".to_owned(), |us| format!("{:.3}", us as f64 / 1e6)),
            r.cpu_s_per_gb().map_or("null".to_owned(), |c| format!("{c:.4}"))
        );
        out.push_str(if i + 1 < rows.len() { ",\n" } else { "\n" });
    }
    let _ = write!(out, "  ],\n  \"completed\": {completed},\n  \"verified\": {verified}\n}}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_like_lst() {
        assert_eq!(size_name(4096), "4K");
        assert_eq!(size_name(1 << 20), "1M");
        assert_eq!(size_name(8), "8");
        assert_eq!(size_name(5000), "5000");
    }

    #[test]
    fn json_escapes_strings() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
