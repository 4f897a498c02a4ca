//! Memory descriptors: the caller's description ([`Md`]), LNet's record of it, fragment
//! slicing, and the event/unlink bookkeeping every completion goes through.

use std::sync::Arc;

use super::{LnetError, State, Work};
use crate::buffer::Buffer;
use crate::event::{Errno, Event, EventKind, EventSink};
use crate::hdr::WireHandle;
use crate::lnd::{Frag, Frags, frags_len};
use crate::matching::{MdHandle, MdOptions, MdSpec, Threshold};
use crate::nid::Nid;

/// The longest MD: 4 GiB − 2 bytes. An LNet length is 32 bits, and an ACK's `mlength` of
/// `u32::MAX` is the drop NAK ([`super::DROP_NAK_MLENGTH`]), so a PUT that filled an MD of
/// 4 GiB − 1 bytes would be ACKed with a value its initiator reads as "dropped".
pub const MD_LENGTH_MAX: u64 = u32::MAX as u64 - 1;

/// A memory descriptor over caller buffers (`struct lnet_md`).
///
/// The memory is a list of fragments (one for a contiguous buffer); LNet and the LND access it
/// only while an operation uses it, and never past the fragments.
#[derive(Clone, Debug)]
pub struct Md {
    /// The memory, in order; its length is the sum of the fragments'.
    pub frags: Frags,
    /// What incoming operations it accepts and how (for MDs attached to match entries).
    pub options: MdOptions,
    /// How many operations (events other than UNLINK) it takes part in.
    pub threshold: Threshold,
    /// `LNET_MD_MAX_SIZE` for attached MDs (see [`MdSpec::max_size`]); `None` for bound MDs.
    pub max_size: Option<u64>,
    /// A value of the caller's, returned in every event.
    pub user_ptr: u64,
    /// Where its events go; `None`: no events.
    pub events: Option<EventSink>,
}

impl Md {
    /// An MD over `frags`: no options, infinite threshold, no `max_size`, `user_ptr` 0, no
    /// events.
    pub fn new(frags: impl Into<Frags>) -> Md {
        Md {
            frags: frags.into(),
            options: MdOptions::empty(),
            threshold: Threshold::Infinite,
            max_size: None,
            user_ptr: 0,
            events: None,
        }
    }

    /// An MD over all of one buffer.
    pub fn contiguous(buf: Arc<Buffer>) -> Md {
        Md::new(Frag::whole(buf))
    }

    /// The same MD with `options`.
    pub fn with_options(mut self, options: MdOptions) -> Md {
        self.options = options;
        self
    }

    /// The same MD with `threshold`.
    pub fn with_threshold(mut self, threshold: Threshold) -> Md {
        self.threshold = threshold;
        self
    }

    /// The same MD with `max_size`.
    pub fn with_max_size(mut self, max_size: u64) -> Md {
        self.max_size = Some(max_size);
        self
    }

    /// The same MD with `user_ptr`.
    pub fn with_user_ptr(mut self, user_ptr: u64) -> Md {
        self.user_ptr = user_ptr;
        self
    }

    /// The same MD delivering its events to `sink` (an [`crate::EventQueue`] converts).
    pub fn with_events(mut self, sink: impl Into<EventSink>) -> Md {
        self.events = Some(sink.into());
        self
    }

    /// Total bytes.
    pub fn length(&self) -> u64 {
        frags_len(&self.frags).map_or(u64::MAX, |n| n as u64)
    }

    /// Checks fragments and length (and that `max_size` is only on attached MDs).
    pub(super) fn validate(&self, attached: bool) -> Result<(), LnetError> {
        if let Some(index) = self.frags.iter().position(|f| !f.is_valid()) {
            return Err(LnetError::BadFragment { index });
        }
        let length = self.length();
        if length > MD_LENGTH_MAX {
            return Err(LnetError::MdTooLong { length });
        }
        if !attached && self.max_size.is_some() {
            return Err(LnetError::MaxSizeOnBoundMd);
        }
        Ok(())
    }

    /// What matching sees of it; `id` rides in `user_ptr` so a match names our record.
    pub(super) fn spec(&self, id: u64) -> MdSpec {
        MdSpec {
            length: self.length(),
            options: self.options,
            threshold: self.threshold,
            max_size: self.max_size,
            user_ptr: id,
        }
    }
}

/// A response (ACK or REPLY) an initiator MD waits for.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    /// Token of the PUT/GET that expects it.
    pub(super) op: u64,
    /// [`EventKind::Ack`] or [`EventKind::Reply`].
    pub(super) kind: EventKind,
    /// Who must send it.
    pub(super) peer: Nid,
    /// The operation's match bits (an ACK carries them back).
    pub(super) match_bits: u64,
    /// The response event, to be completed.
    pub(super) template: Event,
    /// Monitor sweeps it has waited through (`lnet/timeout.rs`).
    pub(super) sweeps: u8,
}

/// A response event that arrived before its operation's SEND event; it is emitted right
/// after the SEND.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    op: u64,
    kind: EventKind,
    template: Event,
    status: Result<(), Errno>,
}

/// LNet's record of an MD.
pub(super) struct MdRecord {
    pub(super) frags: Frags,
    pub(super) length: u64,
    pub(super) options: MdOptions,
    pub(super) user_ptr: u64,
    pub(super) events: Option<EventSink>,
    /// Operations left, for bound MDs (the portal table counts for attached ones).
    pub(super) threshold: Threshold,
    /// The portal-table handle of an attached MD.
    pub(super) attached: Option<MdHandle>,
    pub(super) auto_unlink: bool,
    /// Messages using it plus responses it waits for.
    pub(super) refs: u32,
    /// Unlinked (explicitly or automatically): it goes when `refs` reaches 0.
    pub(super) unlinked: bool,
    pub(super) pending: Vec<Pending>,
    /// Responses waiting for their operation's SEND event.
    pub(super) held: Vec<Held>,
}

impl MdRecord {
    pub(super) fn new(md: Md, attached: Option<MdHandle>, auto_unlink: bool) -> MdRecord {
        MdRecord {
            length: md.length(),
            frags: md.frags,
            options: md.options,
            user_ptr: md.user_ptr,
            events: md.events,
            threshold: md.threshold,
            attached,
            auto_unlink,
            refs: 0,
            unlinked: false,
            pending: Vec::new(),
            held: Vec::new(),
        }
    }

    /// Whether it goes away once idle.
    fn unlinkable(&self) -> bool {
        self.unlinked || (self.auto_unlink && self.attached.is_none() && self.threshold.is_exhausted())
    }

    /// Operations left (`u32::MAX` for infinite).
    pub(super) fn ops_left(&self) -> u32 {
        match self.threshold {
            Threshold::Count(n) => n,
            Threshold::Infinite => u32::MAX,
        }
    }

    /// Uses `n` operations of a bound MD.
    pub(super) fn consume(&mut self, n: u32) {
        if let Threshold::Count(c) = &mut self.threshold {
            *c = c.saturating_sub(n);
        }
    }
}

/// The part of `frags` from byte `offset`, `len` bytes long (shorter if the fragments end).
pub(super) fn slice_frags(frags: &[Frag], offset: u64, len: u64) -> Frags {
    let mut out = Frags::new();
    let mut skip = offset;
    let mut left = len;
    for f in frags {
        if left == 0 {
            break;
        }
        let flen = f.len as u64;
        if skip >= flen {
            skip -= flen;
            continue;
        }
        let n = (flen - skip).min(left);
        out.push(Frag { buf: f.buf.clone(), offset: f.offset + skip as usize, len: n as usize });
        left -= n;
        skip = 0;
    }
    out
}

impl State {
    /// Emits a `kind` event on MD `id` from `template` with `status`; `release` first drops the
    /// reference the finishing message or response held. When the MD is unlinkable and no
    /// reference remains, the event says `unlinked` and the MD goes.
    pub(super) fn md_event(
        &mut self,
        id: u64,
        kind: EventKind,
        template: &Event,
        status: Result<(), Errno>,
        release: bool,
        work: &mut Work,
    ) {
        let Some(rec) = self.mds.get_mut(&id) else { return };
        if release {
            rec.refs = rec.refs.saturating_sub(1);
        }
        let done = rec.refs == 0 && rec.unlinkable();
        if let Some(sink) = &rec.events {
            let mut ev = *template;
            ev.kind = kind;
            ev.status = status;
            ev.unlinked = done;
            ev.md_handle = MdHandle::from_cookie(id);
            ev.user_ptr = rec.user_ptr;
            work.events.push((sink.clone(), ev));
        }
        if done {
            self.mds.remove(&id);
        }
    }

    /// Emits response event `kind` of operation `op` on MD `id`, releasing the response's
    /// reference; if the operation's send has not been reported yet, the event waits for it
    /// (so SEND always comes first and the response is the operation's last event).
    pub(super) fn response_event(
        &mut self,
        id: u64,
        op: u64,
        kind: EventKind,
        template: &Event,
        status: Result<(), Errno>,
        work: &mut Work,
    ) {
        if self.msgs.contains_key(&op) {
            if let Some(rec) = self.mds.get_mut(&id) {
                rec.held.push(Held { op, kind, template: *template, status });
                return;
            }
        }
        self.md_event(id, kind, template, status, true, work);
    }

    /// Emits the responses of operation `op` that waited for its SEND event.
    pub(super) fn release_held(&mut self, id: u64, op: u64, work: &mut Work) {
        let held: Vec<Held> = match self.mds.get_mut(&id) {
            Some(rec) if rec.held.iter().any(|h| h.op == op) => {
                let (mine, rest) = std::mem::take(&mut rec.held).into_iter().partition(|h| h.op == op);
                rec.held = rest;
                mine
            }
            _ => return,
        };
        for h in held {
            self.md_event(id, h.kind, &h.template, h.status, true, work);
        }
    }

    /// The length of MD `id` (0 once it is gone).
    pub(super) fn md_length(&self, id: u64) -> u64 {
        self.mds.get(&id).map_or(0, |rec| rec.length)
    }

    /// Records that operation `p.op` on MD `id` waits for its response.
    pub(super) fn push_pending(&mut self, id: u64, p: Pending) {
        if let Some(rec) = self.mds.get_mut(&id) {
            self.awaiting.insert(p.op, id);
            rec.pending.push(p);
        }
    }

    /// Takes the response `op` waits for on MD `id`, if still outstanding.
    pub(super) fn take_pending_of(&mut self, id: u64, op: u64) -> Option<Pending> {
        let rec = self.mds.get_mut(&id)?;
        let at = rec.pending.iter().position(|p| p.op == op)?;
        self.awaiting.remove(&op);
        Some(rec.pending.remove(at))
    }

    /// The response a peer's wire handle names: the outstanding one of that operation, if it
    /// is ours, of `kind` and expected from `from` (with `match_bits`, for an ACK). Taken.
    pub(super) fn take_pending_for_wire(
        &mut self,
        wmd: WireHandle,
        kind: EventKind,
        from: Nid,
        match_bits: Option<u64>,
    ) -> Option<(u64, Pending)> {
        if wmd.interface_cookie != self.cookie {
            return None;
        }
        let op = wmd.object_cookie;
        let id = *self.awaiting.get(&op)?;
        let p = self.mds.get(&id)?.pending.iter().find(|p| p.op == op)?;
        if p.kind != kind || p.peer != from || match_bits.is_some_and(|b| b != p.match_bits) {
            return None;
        }
        self.take_pending_of(id, op).map(|p| (id, p))
    }

    /// Takes every response MD `id` waits for.
    fn take_all_pending(&mut self, id: u64) -> Vec<Pending> {
        let pending = self.mds.get_mut(&id).map(|rec| std::mem::take(&mut rec.pending)).unwrap_or_default();
        for p in &pending {
            self.awaiting.remove(&p.op);
        }
        pending
    }

    /// Ends every response MD `id` waits for with `errno`.
    pub(super) fn cancel_pending(&mut self, id: u64, errno: Errno, work: &mut Work) {
        for p in self.take_all_pending(id) {
            self.md_event(id, p.kind, &p.template, Err(errno), true, work);
        }
    }

    /// Unlinks MD `id` (already removed from the portal table): outstanding responses end with
    /// `errno` (`-ECANCELED` for [`Lnet::md_unlink`](super::Lnet::md_unlink), `-ETIMEDOUT`
    /// for a response timeout), after their operation's SEND event if that is still to come
    /// (the response stays the operation's last event); an idle MD goes at once with an
    /// UNLINK event.
    pub(super) fn unlink_md(&mut self, id: u64, errno: Errno, work: &mut Work) {
        match self.mds.get_mut(&id) {
            Some(rec) => rec.unlinked = true,
            None => return,
        }
        for p in self.take_all_pending(id) {
            if self.msgs.contains_key(&p.op) {
                // Still sending (a PUT's payload may still be read, a GET's reply still
                // written): cancelled, but reported after the SEND, by `release_held`.
                if let Some(rec) = self.mds.get_mut(&id) {
                    let status = Err(errno);
                    rec.held.push(Held { op: p.op, kind: p.kind, template: p.template, status });
                }
                continue;
            }
            // Not the MD's last event: that is the UNLINK below or a message's completion.
            if let Some(rec) = self.mds.get_mut(&id) {
                rec.refs = rec.refs.saturating_sub(1);
                if let Some(sink) = &rec.events {
                    let mut ev = p.template;
                    ev.kind = p.kind;
                    ev.status = Err(errno);
                    ev.md_handle = MdHandle::from_cookie(id);
                    ev.user_ptr = rec.user_ptr;
                    work.events.push((sink.clone(), ev));
                }
            }
        }
        let Some(rec) = self.mds.get(&id) else { return };
        if rec.refs == 0 {
            if let Some(sink) = &rec.events {
                let ev = Event {
                    kind: EventKind::Unlink,
                    initiator: crate::matching::ANY_PROCESS,
                    target: crate::matching::ANY_PROCESS,
                    portal: 0,
                    match_bits: 0,
                    rlength: 0,
                    mlength: 0,
                    offset: 0,
                    md_handle: MdHandle::from_cookie(id),
                    user_ptr: rec.user_ptr,
                    hdr_data: 0,
                    msg_type: None,
                    status: Ok(()),
                    unlinked: true,
                };
                work.events.push((sink.clone(), ev));
            }
            self.mds.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cross_fragments() {
        let a = Arc::new(Buffer::new(100));
        let b = Arc::new(Buffer::new(50));
        let frags = vec![Frag { buf: a.clone(), offset: 10, len: 90 }, Frag::whole(b.clone())];
        let s = slice_frags(&frags, 80, 30);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].offset, s[0].len), (90, 10));
        assert_eq!((s[1].offset, s[1].len), (0, 20));
        assert!(slice_frags(&frags, 0, 0).is_empty());
        assert!(slice_frags(&frags, 500, 10).is_empty());
        let all = slice_frags(&frags, 0, 1000);
        assert_eq!(frags_len(&all), Some(140));
    }

    #[test]
    fn validation() {
        let buf = Arc::new(Buffer::new(10));
        let bad = Md::new(vec![Frag { buf: buf.clone(), offset: 5, len: 6 }]);
        assert!(matches!(bad.validate(false), Err(LnetError::BadFragment { index: 0 })));
        let ok = Md::contiguous(buf).with_max_size(4);
        assert!(ok.validate(true).is_ok());
        assert!(matches!(ok.validate(false), Err(LnetError::MaxSizeOnBoundMd)));
    }
}
