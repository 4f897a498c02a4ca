//! Shared harness for the end-to-end tests: running processes with bounded waits.
//!
//! Waits are bounded without sleeping: a thread owns each child and reports its output on a
//! channel; the test waits on the channel with a timeout and kills the child if it expires.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How a child process ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Exit status 0.
    pub success: bool,
    /// The exit code, if it exited (not killed by a signal).
    pub code: Option<i32>,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
    /// Whether the harness killed it because the deadline passed.
    pub timed_out: bool,
}

/// A started child whose output is being collected.
pub struct Running {
    pid: u32,
    rx: mpsc::Receiver<Outcome>,
    lines: mpsc::Receiver<String>,
}

/// Starts `bin` with `args`, capturing stdout and stderr.
///
/// # Panics
/// If the binary cannot be started (a broken test setup).
pub fn spawn(bin: &str, args: &[&str]) -> Running {
    spawn_with(Command::new(bin).args(args))
}

/// Starts a prepared command, capturing stdout and stderr.
///
/// # Panics
/// If the command cannot be started (a broken test setup).
pub fn spawn_with(cmd: &mut Command) -> Running {
    let mut child: Child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let (line_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        let mut stdout = String::new();
        let mut stderr = String::new();
        let out = child.stdout.take();
        let err = child.stderr.take();
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut e) = err {
                let _ = e.read_to_string(&mut s);
            }
            s
        });
        if let Some(o) = out {
            // Line by line, so a test can wait for a line while the child runs.
            for line in BufReader::new(o).lines() {
                let Ok(line) = line else { break };
                stdout.push_str(&line);
                stdout.push('\n');
                let _ = line_tx.send(line);
            }
        }
        stderr.push_str(&err_reader.join().unwrap_or_default());
        let status = child.wait().ok();
        let _ = tx.send(Outcome {
            success: status.is_some_and(|s| s.success()),
            code: status.and_then(|s| s.code()),
            stdout,
            stderr,
            timed_out: false,
        });
    });
    Running { pid, rx, lines }
}

impl Running {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits at most `timeout` for a stdout line containing `needle` (lines before it are
    /// consumed); the line, or `None` if the deadline passed or the child closed its stdout.
    pub fn wait_for_line(&self, needle: &str, timeout: Duration) -> Option<String> {
        let clock = lnd::clock::Clock::new();
        let deadline = clock.now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(clock.now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    /// Sends `signal` to the child.
    pub fn signal(&self, signal: i32) {
        let pid = libc::pid_t::try_from(self.pid).unwrap_or(0);
        if pid > 0 {
            // SAFETY: kill(2) takes plain integers; a stale pid at worst signals nothing.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// Waits at most `timeout` for the child to exit; kills it (SIGKILL) if it does not.
    pub fn wait(self, timeout: Duration) -> Outcome {
        match self.rx.recv_timeout(timeout) {
            Ok(o) => o,
            Err(_) => {
                self.signal(libc::SIGKILL);
                let mut o = self.rx.recv_timeout(Duration::from_secs(10)).unwrap_or(Outcome {
                    success: false,
                    code: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    timed_out: true,
                });
                o.timed_out = true;
                o
            }
        }
    }

    /// Waits up to `timeout` for the child to exit; `None` (child still running) otherwise.
    pub fn try_wait_for(&self, timeout: Duration) -> Option<Outcome> {
        self.rx.recv_timeout(timeout).ok()
    }
}

/// Runs two instances of `bin` (the first started first), waits for both within `timeout`.
pub fn run_pair(bin: &str, first: &[&str], second: &[&str], timeout: Duration) -> (Outcome, Outcome) {
    let a = spawn(bin, first);
    let b = spawn(bin, second);
    let ob = b.wait(timeout);
    let oa = a.wait(if ob.timed_out { Duration::from_secs(1) } else { timeout });
    (oa, ob)
}

/// The start of an `lnd-node drive` command line: 127.0.0.1@o2ib driving a node serving on
/// 127.0.0.2@o2ib (the options that follow, `--port` first, are the test's own).
pub const DRIVE_FROM_1_TO_2: [&str; 5] = ["drive", "--nid", "127.0.0.1@o2ib", "--to", "127.0.0.2@o2ib"];

/// A UDP port for one test, distinct across concurrently running test processes: derived from
/// the process id, plus `offset` for tests within one process.
pub fn unique_port(offset: u16) -> u16 {
    let slot = (std::process::id() % 5000) as u16;
    20_000 + slot * 8 + offset % 8
}

/// What the software device's same-host path should do between two test processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePath {
    /// RDMA WRITEs placed with one copy (`LND_SOFT_SINGLE_COPY` unset or 1).
    SingleCopy,
    /// The kernel forbids sibling processes to read each other (Yama `ptrace_scope` ≥ 1) and
    /// copies cannot come from a mapped arena: the single-copy path is tried, refused, and the
    /// WRITEs go by the wire.
    Refused,
    /// Everything on the wire (`LND_SOFT_SINGLE_COPY=0`).
    Wire,
}

/// The path this environment should take (see [`WritePath`]).
pub fn expected_write_path() -> WritePath {
    if lnd::fabric::soft::SingleCopy::from_env() == lnd::fabric::soft::SingleCopy::Off {
        return WritePath::Wire;
    }
    let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok();
    match yama.as_deref().map(str::trim) {
        None | Some("0") => WritePath::SingleCopy,
        // Yama restricts only ptrace attach (`process_vm_readv`), not opening another
        // process's fds: copies from a mapped buffer arena still work.
        Some(_) if arena_copies_expected() => WritePath::SingleCopy,
        Some(_) => WritePath::Refused,
    }
}

/// Whether same-host copies should come from the peer's mapped buffer arena: the default,
/// unless `LND_SOFT_SINGLE_COPY=syscall` or there is no arena (`LNET_BUFFER_ARENA=0`, which
/// the test processes inherit).
fn arena_copies_expected() -> bool {
    use lnd::fabric::soft::SingleCopy;
    SingleCopy::from_env() == SingleCopy::Auto && lnet_shim::arena::arena().is_some()
}

/// The number after `key ` in `text` (e.g. `placed 12` → 12), if there is one.
pub fn counter(text: &str, key: &str) -> Option<u64> {
    let at = text.find(&format!("{key} "))? + key.len() + 1;
    text.get(at..)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Asserts that the placement counters a test process printed (`placed N`, `refused N`,
/// `ring frames N`) match
/// the path this environment should take, so a silently skipped single-copy path fails.
///
/// # Panics
/// When they do not.
pub fn assert_write_path(output: &str) {
    let placed = counter(output, "placed").unwrap_or_else(|| panic!("no placement counter in {output:?}"));
    let refused = counter(output, "refused").unwrap_or_else(|| panic!("no refusal counter in {output:?}"));
    let ring = counter(output, "ring frames").unwrap_or_else(|| panic!("no ring counter in {output:?}"));
    match expected_write_path() {
        WritePath::SingleCopy => {
            assert!(placed > 0 && refused == 0 && ring > 0, "single copy or rings not taken: {output}")
        }
        // The rings need no ptrace permission: they are used all the same.
        WritePath::Refused => assert!(refused > 0 && ring > 0, "single copy not tried: {output}"),
        WritePath::Wire => {
            assert_eq!(
                (placed, refused, ring),
                (0, 0, 0),
                "same-host path with LND_SOFT_SINGLE_COPY=0: {output}"
            )
        }
    }
}

/// Asserts that a process that received same-host WRITEs (the responder) copied them from its
/// peer's mapped buffer arena (`mapped N` in its output), unless this environment turned that
/// off (`LND_SOFT_SINGLE_COPY=syscall` or `LNET_BUFFER_ARENA=0`), or placement is not taken.
///
/// # Panics
/// When the copies did not take the expected way.
pub fn assert_mapped_copies(output: &str) {
    let mapped = counter(output, "mapped").unwrap_or_else(|| panic!("no mapped counter in {output:?}"));
    let want_mapped = expected_write_path() == WritePath::SingleCopy && arena_copies_expected();
    if want_mapped {
        assert!(mapped > 0, "no copy from a mapped arena: {output}");
    } else {
        assert_eq!(mapped, 0, "copies from a mapped arena in this environment: {output}");
    }
}

/// The same-host registry files (entries `<ip>-<port>` and rings `ring-<ip>-<port>-to-<ip>`)
/// that processes on UDP port `port` left behind; empty after clean exits.
pub fn same_host_leftovers(port: u16) -> Vec<String> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    let dir = base.join(format!("lnd-soft-{uid}"));
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let tag = format!("-{port}");
    entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(&tag) || n.contains(&format!("{tag}-to-")))
        .collect()
}
