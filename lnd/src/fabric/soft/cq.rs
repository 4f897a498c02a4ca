//! Completion queues of the software device, with an eventfd as the completion channel.
//!
//! The device pushes work completions under its own lock; consumers poll without touching the
//! device. Arming (`req_notify`) is one-shot, as in verbs: the next completion writes the
//! eventfd and disarms. A CQ that would hold more than its size overruns: the completion is
//! lost and the device raises `CQ_ERR` and moves the CQ's QPs to the error state, which is what
//! a real HCA does when a consumer sizes its CQ too small.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::fabric::{CompletionQueue, FabricError, Wc};

/// The eventfd that serves as a completion channel.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> Result<EventFd, FabricError> {
        // SAFETY: eventfd takes no pointers; a negative return is an error and checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(FabricError::io("eventfd", io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the fd readable.
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own. A failure (EAGAIN when
        // the counter is saturated) still leaves the fd readable, which is all we need.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Consumes the readability; true if the fd had been signalled.
    pub(crate) fn drain(&self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd we own.
        let n = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        n == 8 && v > 0
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[derive(Debug)]
struct CqInner {
    entries: VecDeque<Wc>,
    /// `Some(solicited_only)` while armed.
    armed: Option<bool>,
    overrun: bool,
}

/// State shared between the device (producer) and the CQ handle (consumer).
#[derive(Debug)]
pub(crate) struct CqShared {
    pub(crate) id: u32,
    pub(crate) cqe: u32,
    inner: Mutex<CqInner>,
    channel: EventFd,
}

/// The CQ overran; the completion was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overrun;

impl CqShared {
    pub(crate) fn new(id: u32, cqe: u32) -> Result<CqShared, FabricError> {
        Ok(CqShared {
            id,
            cqe,
            inner: Mutex::new(CqInner { entries: VecDeque::new(), armed: None, overrun: false }),
            channel: EventFd::new()?,
        })
    }

    fn lock(&self) -> MutexGuard<'_, CqInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The completion channel's fd.
    pub(crate) fn event_fd(&self) -> RawFd {
        self.channel.raw()
    }

    /// Adds a completion; `solicited` says whether it satisfies a solicited-only arm. True if
    /// it signalled the completion channel.
    pub(crate) fn push(&self, wc: Wc, solicited: bool) -> Result<bool, Overrun> {
        let mut inner = self.lock();
        if inner.overrun || inner.entries.len() >= self.cqe as usize {
            inner.overrun = true;
            return Err(Overrun);
        }
        inner.entries.push_back(wc);
        let notify = match inner.armed {
            Some(solicited_only) => {
                !solicited_only || solicited || wc.status != crate::fabric::WcStatus::Success
            }
            None => false,
        };
        if notify {
            inner.armed = None;
            drop(inner);
            self.channel.signal();
        }
        Ok(notify)
    }
}

/// A completion queue of the software device.
#[derive(Debug, Clone)]
pub struct SoftCq {
    pub(crate) shared: Arc<CqShared>,
}

impl CompletionQueue for SoftCq {
    fn id(&self) -> u32 {
        self.shared.id
    }

    fn cqe(&self) -> u32 {
        self.shared.cqe
    }

    fn poll(&self, out: &mut [Wc]) -> usize {
        let mut inner = self.shared.lock();
        let n = out.len().min(inner.entries.len());
        for (slot, wc) in out.iter_mut().zip(inner.entries.drain(..n)) {
            *slot = wc;
        }
        n
    }

    fn req_notify(&self, solicited_only: bool) -> Result<(), FabricError> {
        let mut inner = self.shared.lock();
        if inner.overrun {
            return Err(FabricError::InvalidArgument { what: "CQ has overrun" });
        }
        inner.armed = Some(solicited_only);
        Ok(())
    }

    fn event_fd(&self) -> RawFd {
        self.shared.channel.raw()
    }

    fn get_event(&self) -> bool {
        self.shared.channel.drain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::WcStatus;

    fn wc(id: u64) -> Wc {
        Wc { wr_id: id, ..Wc::default() }
    }

    #[test]
    fn arm_is_one_shot_and_poll_is_fifo() {
        let cq = SoftCq { shared: Arc::new(CqShared::new(1, 4).unwrap()) };
        cq.shared.push(wc(1), false).unwrap();
        assert!(!cq.get_event(), "not armed: no notification");
        cq.req_notify(false).unwrap();
        cq.shared.push(wc(2), false).unwrap();
        assert!(cq.get_event());
        cq.shared.push(wc(3), false).unwrap();
        assert!(!cq.get_event(), "disarmed after one notification");
        let mut out = [Wc::default(); 8];
        assert_eq!(cq.poll(&mut out), 3);
        assert_eq!(out[..3].iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(cq.poll(&mut out), 0);
    }

    #[test]
    fn solicited_only_arm_waits_for_a_solicited_or_failed_completion() {
        let cq = SoftCq { shared: Arc::new(CqShared::new(1, 8).unwrap()) };
        cq.req_notify(true).unwrap();
        cq.shared.push(wc(1), false).unwrap();
        assert!(!cq.get_event());
        cq.shared.push(Wc { status: WcStatus::WrFlushErr, ..wc(2) }, false).unwrap();
        assert!(cq.get_event());
    }

    #[test]
    fn overrun_loses_the_completion_and_sticks() {
        let cq = SoftCq { shared: Arc::new(CqShared::new(1, 2).unwrap()) };
        cq.shared.push(wc(1), false).unwrap();
        cq.shared.push(wc(2), false).unwrap();
        assert_eq!(cq.shared.push(wc(3), false), Err(Overrun));
        assert!(cq.req_notify(false).is_err());
        assert_eq!(cq.poll(&mut [Wc::default(); 4]), 2);
    }
}
