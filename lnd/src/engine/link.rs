//! The port's link as the engine sees it: what `PORT_ERR`, `PORT_ACTIVE` and `DEVICE_FATAL`
//! do to sends and connections.
//!
//! o2iblnd marks its NI fatal on `IB_EVENT_PORT_ERR` and `IB_EVENT_DEVICE_FATAL` and clears
//! the mark on `IB_EVENT_PORT_ACTIVE`; LNet then sends nothing through that NI. The engine is
//! that NI, so it keeps the mark itself ([`LinkState`]) and acts on it:
//! * **Down** (`PORT_ERR`, or a port not active when the engine starts): [`Engine::send`]
//!   refuses every send at once (`-ENETDOWN`, a local error). Transmits waiting for a
//!   connection fail with it, and so do connections still being set up, whose CM exchange
//!   cannot finish. Established connections stay: their RC retries ride out a short outage,
//!   and a longer one fails their sends when the retries run out (`RETRY_EXC_ERR`), which
//!   closes them as any failed send does.
//! * **Active** again (`PORT_ACTIVE`): sends are taken again; connections are made as they
//!   need them.
//! * **Fatal** (`DEVICE_FATAL`): every connection closes at once (`-EIO`: its QP is gone),
//!   what waits for a connection fails and every send is refused (`-ENODEV`) and no event brings the link back: the interface has to
//!   be started again on a reopened device.

use lnet_shim::event::Errno;
use lnet_shim::lnd::{Health, LndError};

use super::{Engine, err};
use crate::fabric::{Device, PortState};
use crate::time::Instant;

/// The port's link, as the engine last heard of it ([`Engine::link`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Traffic flows.
    Active,
    /// The port is down (`PORT_ERR`): sends are refused until it is active again.
    Down,
    /// The device failed (`DEVICE_FATAL`): sends are refused for good.
    Fatal,
}

impl LinkState {
    /// The state of a port in `state` when the engine starts.
    pub(super) fn at_start(state: PortState) -> LinkState {
        if state == PortState::Active { LinkState::Active } else { LinkState::Down }
    }

    /// The error a send meets in this state; `None` when the link is active.
    pub(super) fn refusal(self) -> Option<LndError> {
        match self {
            LinkState::Active => None,
            LinkState::Down => Some(err(Errno::ENETDOWN, Health::LocalError)),
            LinkState::Fatal => Some(err(Errno::ENODEV, Health::LocalError)),
        }
    }
}

impl<D: Device> Engine<D> {
    /// The port's link, as the last async event left it.
    pub fn link(&self) -> LinkState {
        self.link
    }

    /// `PORT_ERR`: refuse sends, and end what waits for a connection (module notes).
    pub(super) fn port_down(&mut self, now: Instant) {
        if self.link != LinkState::Active {
            return;
        }
        self.link = LinkState::Down;
        self.stats.port_errors += 1;
        self.end_setups(now, err(Errno::ENETDOWN, Health::LocalError));
    }

    /// `PORT_ACTIVE`: sends are taken again (a failed device stays failed).
    pub(super) fn port_up(&mut self) {
        if self.link == LinkState::Down {
            self.link = LinkState::Active;
            self.stats.port_recoveries += 1;
        }
    }

    /// `DEVICE_FATAL`: close every connection and refuse sends for good.
    pub(super) fn device_fatal(&mut self, now: Instant) {
        if self.link == LinkState::Fatal {
            return;
        }
        self.link = LinkState::Fatal;
        self.stats.device_fatal += 1;
        self.end_setups(now, err(Errno::ENODEV, Health::LocalError));
        let e = err(Errno::EIO, Health::LocalError);
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            self.close_conn(now, key, e);
        }
    }

    /// Closes every connection still being set up with `e`, and fails every transmit waiting
    /// for a connection with it.
    fn end_setups(&mut self, now: Instant, e: LndError) {
        let setting_up: Vec<usize> =
            self.conns.iter().filter(|(_, c)| c.state.is_setting_up()).map(|(k, _)| k).collect();
        for key in setting_up {
            self.close_conn(now, key, e);
        }
        let waiting: Vec<lnet_shim::nid::Nid> =
            self.peers.iter().filter(|(_, p)| !p.pending.is_empty()).map(|(n, _)| *n).collect();
        for peer in waiting {
            self.fail_pending(peer, e);
        }
    }
}
