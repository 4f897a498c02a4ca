//! The same-host registry: which process owns which software-device port on this host.
//!
//! A UDP device with the single-copy path on ([`super::place`]) publishes one small file,
//! `<dir>/<ip>-<port>`, where `<dir>` is `/dev/shm/lnd-soft-<uid>` (or the temporary directory
//! when there is no `/dev/shm`). The directory is created with mode 0700 and is used only if it
//! is a real directory owned by this user with no group or other access, so only this user (and
//! root) can write entries. An entry is written to a temporary name with mode 0600 and renamed
//! into place (readers never see half an entry) and removed when the device is dropped:
//!
//! ```text
//! lnd-soft-registry 2
//! pid 4242
//! boot 0b6a...-...
//! start 123456
//! nonce 9f3c2a1b00000000
//! arena 5 7f3a00000000 400000000
//! ```
//!
//! The last line is there when the process has a buffer arena ([`lnet_shim::arena`]): its fd,
//! address and length, in hex after the fd, for peers that map it ([`super::peer_arena`]).
//!
//! An entry is believed only if its boot id is this boot's
//! (`/proc/sys/kernel/random/boot_id`) and the process with that pid has that start time
//! (`/proc/<pid>/stat` field 22), so entries left behind by a crash or a reboot, and reused
//! pids, are ignored. Lookups are for loopback ports only. The first line carries the version
//! of the same-host protocol: entries of other versions are ignored (and never swept), so two
//! processes of different versions use the wire path between them.

use std::fs;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use lnet_shim::arena::ArenaInfo;

use super::place::LocalPeer;

/// The first line of an entry: also the version of the same-host protocol (frame rings and
/// their record flags, placement requests). A process believes only entries of its own
/// version, so processes of two versions talk over UDP, which every version speaks.
/// 2: ring records may carry unsealed frames ([`super::ring`]).
const MAGIC: &str = "lnd-soft-registry 2";

/// A published entry; dropping it removes the file.
#[derive(Debug)]
pub(crate) struct Entry {
    path: PathBuf,
    pub(crate) me: LocalPeer,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The registry directory, created if needed; an error if it is not safely ours.
pub(crate) fn dir() -> io::Result<PathBuf> {
    let uid = fs::metadata("/proc/self")?.uid();
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    let dir = base.join(format!("lnd-soft-{uid}"));
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = fs::symlink_metadata(&dir)?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: not a private directory of uid {uid}", dir.display()),
        ));
    }
    Ok(dir)
}

fn boot_id() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/boot_id")?.trim().to_owned())
}

/// The start time of process `pid` in clock ticks after boot (`/proc/<pid>/stat` field 22).
fn start_time(pid: &str) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain anything: skip past it.
    let after = stat.get(stat.rfind(')')? + 1..)?;
    after.split_ascii_whitespace().nth(19)?.parse().ok()
}

fn name(ip: Ipv4Addr, port: u16) -> String {
    format!("{ip}-{port}")
}

/// Publishes this process as the owner of `ip:port` with identity `nonce` (after sweeping
/// away what crashed processes left behind).
pub(crate) fn publish(ip: Ipv4Addr, port: u16, nonce: u64) -> io::Result<Entry> {
    let dir = dir()?;
    sweep(&dir);
    let pid = std::process::id();
    let start = start_time("self").ok_or_else(|| io::Error::other("no start time in /proc/self/stat"))?;
    let mut text = format!("{MAGIC}\npid {pid}\nboot {}\nstart {start}\nnonce {nonce:016x}\n", boot_id()?);
    let arena = lnet_shim::arena::arena().map(|a| a.info());
    if let Some(a) = arena {
        text.push_str(&format!("arena {} {:x} {:x}\n", a.fd, a.base, a.len));
    }
    let path = dir.join(name(ip, port));
    let tmp = dir.join(format!(".{}.{pid}.tmp", name(ip, port)));
    let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    f.write_all(text.as_bytes())?;
    drop(f);
    fs::rename(&tmp, &path)?;
    Ok(Entry { path, me: LocalPeer { pid, nonce, arena } })
}

/// Whether the entry file `path` names a process that is gone: another boot, no such pid, or
/// a pid now held by another process. Unreadable or foreign files are left alone.
fn is_dead(path: &Path, boot: &str) -> bool {
    let Ok(text) = fs::read_to_string(path) else { return false };
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return false;
    }
    let mut field = |key: &str| lines.next()?.strip_prefix(key)?.strip_prefix(' ').map(str::to_owned);
    let (Some(pid), Some(entry_boot), Some(start)) = (field("pid"), field("boot"), field("start")) else {
        return false;
    };
    entry_boot != boot || start_time(&pid).is_none_or(|s| s.to_string() != start)
}

/// Removes the entries of processes that are gone, and the same-host rings
/// (`ring-<ip>-<port>-to-<dst>`, [`super::ring`]) whose producer's entry is gone or dead:
/// what crashed processes leave behind (a ring holds up to 4 MiB of shared memory).
pub(crate) fn sweep(dir: &Path) {
    let Ok(boot) = boot_id() else { return };
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let dead = match name.strip_prefix("ring-").and_then(|r| r.split_once("-to-")) {
            Some((producer, _)) => {
                let owner = dir.join(producer);
                !owner.exists() || is_dead(&owner, &boot)
            }
            None if name.starts_with('.') => false,
            None => is_dead(&e.path(), &boot),
        };
        if dead {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// The live process that published `ip:port`, if any.
pub(crate) fn lookup(ip: Ipv4Addr, port: u16) -> Option<LocalPeer> {
    let text = fs::read_to_string(dir().ok()?.join(name(ip, port))).ok()?;
    parse(&text, &boot_id().ok()?, start_time)
}

/// Reads an entry; `start_of` gives a live process's start time.
fn parse(text: &str, boot: &str, start_of: impl Fn(&str) -> Option<u64>) -> Option<LocalPeer> {
    let mut lines = text.lines();
    if lines.next()? != MAGIC {
        return None;
    }
    let mut field = |key: &str| lines.next()?.strip_prefix(key)?.strip_prefix(' ').map(str::to_owned);
    let pid = field("pid")?;
    let entry_boot = field("boot")?;
    let start: u64 = field("start")?.parse().ok()?;
    let nonce = u64::from_str_radix(&field("nonce")?, 16).ok()?;
    let pid_n: u32 = pid.parse().ok()?;
    if pid_n == 0 || entry_boot != boot || start_of(&pid)? != start {
        return None;
    }
    // Optional; a malformed arena line only means no arena.
    let arena = field("arena").and_then(|a| {
        let mut w = a.split(' ');
        let fd = w.next()?.parse().ok().filter(|&fd: &i32| fd >= 0)?;
        let base = u64::from_str_radix(w.next()?, 16).ok()?;
        let len = u64::from_str_radix(w.next()?, 16).ok()?;
        w.next().is_none().then_some(ArenaInfo { fd, base, len })
    });
    Some(LocalPeer { pid: pid_n, nonce, arena })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_other_boots_dead_or_reused_pids_are_ignored() {
        let text = "lnd-soft-registry 2\npid 42\nboot b1\nstart 7\nnonce 00000000000000ff\n";
        let alive = |pid: &str| (pid == "42").then_some(7);
        assert_eq!(parse(text, "b1", alive), Some(LocalPeer { pid: 42, nonce: 0xff, arena: None }));
        let with = format!("{text}arena 5 7f0000001000 400000000\n");
        let arena = Some(ArenaInfo { fd: 5, base: 0x7f00_0000_1000, len: 0x4_0000_0000 });
        assert_eq!(parse(&with, "b1", alive), Some(LocalPeer { pid: 42, nonce: 0xff, arena }));
        for bad in ["arena -1 1000 1000", "arena 5 zz 1000", "arena 5 1000", "arena 5 1000 1000 1"] {
            let t = format!("{text}{bad}\n");
            assert_eq!(
                parse(&t, "b1", alive),
                Some(LocalPeer { pid: 42, nonce: 0xff, arena: None }),
                "{bad}"
            );
        }
        assert_eq!(parse(text, "b2", alive), None, "another boot");
        let older = text.replace("registry 2", "registry 1");
        assert_eq!(parse(&older, "b1", alive), None, "another version of the same-host protocol");
        assert_eq!(parse(text, "b1", |_| None), None, "dead");
        assert_eq!(parse(text, "b1", |_| Some(8)), None, "pid reused");
        assert_eq!(parse(&text.replace("pid 42", "pid 0"), "b1", |_| Some(7)), None);
        assert_eq!(parse(&text.replace("nonce 0000", "nonce zz00"), "b1", alive), None);
        assert_eq!(parse(&text.replace("nonce 00000000000000ff\n", ""), "b1", alive), None, "truncated");
        assert_eq!(parse("", "b1", alive), None);
    }

    #[test]
    fn publish_then_lookup_then_drop_removes() {
        // Port 1 on an address no test binds: this test's own entry.
        let ip = Ipv4Addr::new(127, 77, 0, 1);
        let entry = publish(ip, 1, 0x1234).unwrap();
        let arena = lnet_shim::arena::arena().map(|a| a.info());
        assert_eq!(lookup(ip, 1), Some(LocalPeer { pid: std::process::id(), nonce: 0x1234, arena }));
        let m = fs::metadata(&entry.path).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        drop(entry);
        assert_eq!(lookup(ip, 1), None);
    }

    #[test]
    fn sweeping_removes_what_dead_processes_left_and_keeps_the_living() {
        let dir = std::env::temp_dir().join(format!("lnd-sweep-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let boot = boot_id().unwrap();
        let me = start_time("self").unwrap();
        let entry = |pid: u32, start: u64| {
            format!("{MAGIC}\npid {pid}\nboot {boot}\nstart {start}\nnonce 00000000000000ff\n")
        };
        let pid = std::process::id();
        fs::write(dir.join("127.9.0.1-1"), entry(pid, me)).unwrap(); // alive: this process
        fs::write(dir.join("127.9.0.2-1"), entry(pid, me + 1)).unwrap(); // pid reused
        fs::write(dir.join("127.9.0.3-1"), "something else").unwrap(); // not an entry
        fs::write(dir.join("ring-127.9.0.1-1-to-127.9.0.9"), "").unwrap(); // live producer
        fs::write(dir.join("ring-127.9.0.2-1-to-127.9.0.9"), "").unwrap(); // dead producer
        fs::write(dir.join("ring-127.9.0.4-1-to-127.9.0.9"), "").unwrap(); // no producer entry
        sweep(&dir);
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["127.9.0.1-1", "127.9.0.3-1", "ring-127.9.0.1-1-to-127.9.0.9"]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
