//! Response timeouts: how long an initiator waits for the ACK of a PUT or the REPLY of a GET
//! (LNet's `lnet_transaction_timeout`, 150 seconds by default).
//!
//! # The contract
//! * A response still outstanding [`LnetConfig::transaction_timeout`](super::LnetConfig) after
//!   its operation started is given up: the MD the operation used is **unlinked**, as if by
//!   [`Lnet::md_unlink`](super::Lnet::md_unlink), except that every response it still waits for
//!   ends with `-ETIMEDOUT` (after its operation's SEND event, if that is still to come) instead
//!   of `-ECANCELED`. An MD left idle then gets its [`EventKind::Unlink`] event; one a message
//!   still uses goes with that message's event (`unlinked`). A response that arrives later is
//!   dropped and counted as unexpected, as for any unlinked MD. So a waiter never hangs on a
//!   peer that stays silent (an MD with `ACK_DISABLE` at the target, a peer that died after
//!   taking the request, a REPLY lost with its connection).
//! * As in the kernel, LNet's monitor thread looks every half timeout ("a sweep"), so a
//!   response is given up between one and one and a half timeouts after its operation
//!   started: each sweep counts one more for every outstanding response, and an MD with a
//!   response counted [`EXPIRE_AFTER_SWEEPS`] times is expired. The counting takes no clock:
//!   the sweeps are the only input, and tests make them by hand.
//! * The events of an expiry are delivered by the monitor thread (as the kernel's monitor
//!   thread calls the MD's handler).
//! * Counted in [`LnetStats::response_timeouts`](super::LnetStats::response_timeouts) (the
//!   kernel's `response_timeout` health counter).
//!
//! Deviation from the kernel: its tracker is per MD and its deadline restarts with each new
//! operation on the MD; here every outstanding response counts its own sweeps, and the MD is
//! expired once its oldest response has waited the timeout.

use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Inner, Phase, State, Work};
use crate::event::Errno;

/// LNet's default `lnet_transaction_timeout`: 150 seconds.
pub const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(150);

/// Sweeps (one every half timeout) after which an outstanding response is given up: the first
/// comes within half a timeout of the operation's start, the third between one and one and a
/// half timeouts after it.
pub(super) const EXPIRE_AFTER_SWEEPS: u8 = 3;

impl State {
    /// One sweep (see the module notes): every outstanding response counts one more, and each
    /// MD with a response counted [`EXPIRE_AFTER_SWEEPS`] times is unlinked, its responses
    /// ending with `-ETIMEDOUT`. Returns how many responses were given up. Nothing once LNet
    /// is shutting down (shutdown ends every response itself, with `-ESHUTDOWN`).
    pub(super) fn sweep_responses(&mut self, work: &mut Work) -> usize {
        if self.phase != Phase::Running {
            return 0;
        }
        let mut expired = Vec::new();
        for (&id, rec) in self.mds.iter_mut() {
            for p in &mut rec.pending {
                p.sweeps = p.sweeps.saturating_add(1);
            }
            if rec.pending.iter().any(|p| p.sweeps >= EXPIRE_AFTER_SWEEPS) {
                expired.push((id, rec.pending.len()));
            }
        }
        // In MD order: the events of one sweep come out the same way every time.
        expired.sort_unstable();
        let mut given_up = 0;
        for (id, n) in expired {
            if let Some(h) = self.mds.get(&id).filter(|rec| !rec.unlinked).and_then(|rec| rec.attached) {
                // Off its portal first, as `Lnet::md_unlink` does.
                let _ = self.table.md_unlink(h);
            }
            self.unlink_md(id, Errno::ETIMEDOUT, work);
            given_up += n;
        }
        self.response_timeouts += given_up as u64;
        given_up
    }
}

/// LNet's monitor thread (the kernel's `lnet_monitor_thread`, reduced to response timeouts):
/// a sweep every half timeout while LNet runs. It holds LNet only weakly, so it never keeps
/// LNet alive; [`Monitor::stop`] ends it.
pub(super) struct Monitor {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Monitor {
    /// Starts the thread, sweeping `inner` every `timeout / 2`.
    pub(super) fn start(inner: Weak<Inner>, timeout: Duration) -> std::io::Result<Monitor> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let period = (timeout / 2).max(Duration::from_millis(1));
        let thread = std::thread::Builder::new().name("lnet-monitor".into()).spawn(move || {
            let (lock, cv) = &*flag;
            loop {
                let stopped = cv
                    .wait_timeout_while(lock.lock().unwrap_or_else(PoisonError::into_inner), period, |s| !*s)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                if *stopped {
                    return;
                }
                drop(stopped);
                let Some(inner) = inner.upgrade() else { return };
                inner.run(|st, work| st.sweep_responses(work));
            }
        })?;
        Ok(Monitor { stop, thread: Mutex::new(Some(thread)) })
    }

    /// Ends the thread and waits for it (unless called from it: an event callback of a sweep
    /// that shuts LNet down, which the thread then leaves right after).
    pub(super) fn stop(&self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(PoisonError::into_inner) = true;
        cv.notify_all();
        let handle = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(h) = handle.filter(|h| h.thread().id() != std::thread::current().id()) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
impl Monitor {
    /// Whether the thread has been stopped and joined.
    pub(super) fn is_stopped(&self) -> bool {
        self.thread.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }
}

#[cfg(test)]
impl super::Lnet {
    /// One monitor sweep, now (tests make their sweeps by hand); how many responses it gave up.
    pub(crate) fn sweep_responses(&self) -> usize {
        self.inner.run(|st, work| st.sweep_responses(work))
    }
}
