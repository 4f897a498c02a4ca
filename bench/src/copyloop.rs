//! The same-host limit: a plain `process_vm_writev(2)` copy loop between two processes.
//!
//! `lnd-bench compare` starts this executable as `copy-target --size N` (a hidden command: it
//! allocates N bytes, prints its pid and the buffer's address, and waits for standard input to
//! close), then writes `size` bytes into that buffer from its own, back to back, for the
//! duration. One copy per byte by the kernel and nothing else: no protocol, no completions, no
//! wake-ups, so no transport that copies once can beat it on the same cores.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use lnd::clock::Clock;

use crate::cpu;

/// What the copy loop achieved.
#[derive(Clone, Copy, Debug)]
pub struct CopyResult {
    /// Bytes copied per second, in MiB/s.
    pub mib_s: f64,
    /// CPU seconds per GB (10^9 bytes) of the copying thread.
    pub cpu_s_per_gb: Option<f64>,
}

/// The hidden `copy-target` command: holds a buffer until standard input closes.
pub fn target(size: usize) -> Result<(), String> {
    let buf = vec![0u8; size.max(1)];
    println!("copy-target {} {:#x}", std::process::id(), buf.as_ptr() as usize);
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    std::hint::black_box(&buf);
    Ok(())
}

/// Runs the copy loop at `size` for `duration`; an error says why it could not run (EPERM
/// when the kernel forbids cross-process copies, e.g. Yama's ptrace_scope).
pub fn measure(size: usize, duration: Duration) -> Result<CopyResult, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
    let mut child = Command::new(exe)
        .args(["copy-target", "--size", &size.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the copy target: {e}"))?;
    let line = child.stdout.take().and_then(|out| BufReader::new(out).lines().next()).and_then(Result::ok);
    let result = match line.as_deref().and_then(parse_ready) {
        Some((pid, addr)) => copy_for(pid, addr, size, duration),
        None => Err("the copy target did not start".to_owned()),
    };
    drop(child.stdin.take());
    let _ = child.wait();
    result
}

fn parse_ready(line: &str) -> Option<(libc::pid_t, usize)> {
    let mut it = line.split_whitespace();
    (it.next()? == "copy-target").then_some(())?;
    let pid = it.next()?.parse().ok()?;
    let addr = usize::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
    Some((pid, addr))
}

fn copy_for(pid: libc::pid_t, addr: usize, size: usize, duration: Duration) -> Result<CopyResult, String> {
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let clock = Clock::new();
    let cpu_before = cpu::used_us(cpu::Who::Thread);
    let start = clock.now();
    let mut bytes = 0u64;
    loop {
        let local = libc::iovec { iov_base: src.as_ptr() as *mut libc::c_void, iov_len: size };
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: size };
        // SAFETY: `local` describes our own live buffer, only read by the call; `remote` is an
        // address in the target process, which the kernel checks (EFAULT if unmapped) and
        // which the target holds allocated until we close its standard input.
        let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("process_vm_writev: {e}"));
        }
        bytes += n as u64;
        let elapsed = clock.now().saturating_duration_since(start);
        if elapsed >= duration {
            let secs = elapsed.as_secs_f64();
            let cpu_us = cpu::used_us(cpu::Who::Thread).saturating_sub(cpu_before);
            return Ok(CopyResult {
                mib_s: bytes as f64 / secs / f64::from(1 << 20),
                cpu_s_per_gb: cpu::secs_per_gb(cpu_us, bytes),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_parses() {
        assert_eq!(parse_ready("copy-target 42 0x7f00"), Some((42, 0x7f00)));
        assert_eq!(parse_ready("something else"), None);
        assert_eq!(parse_ready("copy-target x 0x10"), None);
    }
}
