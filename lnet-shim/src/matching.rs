//! Portals, match entries (MEs) and memory descriptors (MDs): LNet's receive-side matching.
//!
//! A server posts buffers by attaching a [`MatchEntry`] to a portal index and a memory
//! descriptor ([`MdSpec`]) to that entry. An incoming PUT or GET names a portal and carries match
//! bits; [`PortalTable::match_put`] / [`PortalTable::match_get`] walk that portal's entries in
//! order and pick the first MD that accepts the message, exactly as LNet's `lnet_try_match_md`
//! (`lnet/lnet/lib-ptl.c`) does:
//!
//! 1. an MD whose threshold is used up (or whose `max_size` no longer fits) is skipped;
//! 2. the MD must allow the operation ([`MdOptions::OP_PUT`] / [`MdOptions::OP_GET`]);
//! 3. the entry's match id must equal the initiator, where [`Nid::ANY`] and
//!    [`ProcessId::PID_ANY`] match anything;
//! 4. `(match_bits ^ entry.match_bits) & !entry.ignore_bits` must be zero;
//! 5. the offset is the request's if the MD has [`MdOptions::MANAGE_REMOTE`], else the MD's own
//!    running offset; the room is `length - offset` (or `max_size`);
//! 6. a request longer than the room is cut to fit with [`MdOptions::TRUNCATE`]; without it the
//!    **message is dropped** (LNet returns `LNET_MATCHMD_DROP`, which ends the walk: later
//!    entries are not tried);
//! 7. on a match the MD's offset moves to `offset + mlength`, a finite threshold drops by one,
//!    and an MD that is now exhausted and was attached with [`Unlink::Auto`] is unlinked at once
//!    (its entry too if the entry was created with [`Unlink::Auto`]).
//!
//! A message no entry matches is dropped (LNet's "lazy" portals, which park such messages
//! until a buffer is posted, are not modelled). This module only does the bookkeeping on lengths
//! and offsets; the buffers themselves live with the caller, keyed by [`MdHandle`] or
//! [`MdSpec::user_ptr`]. An auto-unlinked MD leaves the table immediately; the caller keeps its
//! buffer until the message that used it completes (LNet's MD reference count).
//!
//! Handles are generation-checked: once an MD or ME is unlinked, its handle is refused even
//! after the slot is reused.

use std::collections::VecDeque;
use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign};

use crate::nid::{Nid, ProcessId};

/// LNet's default number of portals (`MAX_PORTALS`).
pub const DEFAULT_PORTALS: usize = 64;

/// The most portals a table may have. Lustre's LNet has a fixed 64 (`MAX_PORTALS`); the shim
/// allows more for applications that want their own, within reason: each portal is an empty
/// match list until used (4096 of them cost 128 KiB).
pub const PORTALS_MAX: usize = 4096;

/// A match id that matches every initiator: `{LNET_NID_ANY, LNET_PID_ANY}`.
pub const ANY_PROCESS: ProcessId = ProcessId::new(Nid::ANY, ProcessId::PID_ANY);

/// Memory descriptor options (`lnet_md::options`), with LNet's bit values.
///
/// `LNET_MD_MAX_SIZE` is expressed by [`MdSpec::max_size`] instead of a flag; the page-array
/// and NUMA hint options (`KIOV`, `BULK_HANDLE`, ...) concern buffers and are not modelled.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MdOptions(u32);

impl MdOptions {
    /// `LNET_MD_OP_PUT`: incoming PUTs may match.
    pub const OP_PUT: MdOptions = MdOptions(1 << 0);
    /// `LNET_MD_OP_GET`: incoming GETs may match.
    pub const OP_GET: MdOptions = MdOptions(1 << 1);
    /// `LNET_MD_MANAGE_REMOTE`: the request supplies the offset; otherwise the MD keeps a
    /// running offset that each match advances.
    pub const MANAGE_REMOTE: MdOptions = MdOptions(1 << 2);
    /// `LNET_MD_TRUNCATE`: a request larger than the room left is cut to fit instead of dropped.
    pub const TRUNCATE: MdOptions = MdOptions(1 << 4);
    /// `LNET_MD_ACK_DISABLE`: never send an ACK for PUTs into this MD, even if asked.
    pub const ACK_DISABLE: MdOptions = MdOptions(1 << 5);

    const ALL: u32 = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 4) | (1 << 5);

    /// No options.
    pub const fn empty() -> MdOptions {
        MdOptions(0)
    }

    /// The raw bits (LNet's values).
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Options from LNet bits, or `None` if a bit this type does not model is set.
    pub const fn from_bits(bits: u32) -> Option<MdOptions> {
        if bits & !Self::ALL == 0 { Some(MdOptions(bits)) } else { None }
    }

    /// Options from LNet bits, dropping bits this type does not model.
    pub const fn from_bits_truncate(bits: u32) -> MdOptions {
        MdOptions(bits & Self::ALL)
    }

    /// Whether every option in `other` is set.
    pub const fn contains(self, other: MdOptions) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any option in `other` is set.
    pub const fn intersects(self, other: MdOptions) -> bool {
        self.0 & other.0 != 0
    }

    /// Both sets of options.
    pub const fn union(self, other: MdOptions) -> MdOptions {
        MdOptions(self.0 | other.0)
    }

    /// Sets the options in `other`.
    pub fn insert(&mut self, other: MdOptions) {
        self.0 |= other.0;
    }

    /// Clears the options in `other`.
    pub fn remove(&mut self, other: MdOptions) {
        self.0 &= !other.0;
    }
}

impl BitOr for MdOptions {
    type Output = MdOptions;

    fn bitor(self, rhs: MdOptions) -> MdOptions {
        self.union(rhs)
    }
}

impl BitOrAssign for MdOptions {
    fn bitor_assign(&mut self, rhs: MdOptions) {
        self.insert(rhs);
    }
}

impl BitAnd for MdOptions {
    type Output = MdOptions;

    fn bitand(self, rhs: MdOptions) -> MdOptions {
        MdOptions(self.0 & rhs.0)
    }
}

impl fmt::Debug for MdOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(MdOptions, &str); 5] = [
            (MdOptions::OP_PUT, "OP_PUT"),
            (MdOptions::OP_GET, "OP_GET"),
            (MdOptions::MANAGE_REMOTE, "MANAGE_REMOTE"),
            (MdOptions::TRUNCATE, "TRUNCATE"),
            (MdOptions::ACK_DISABLE, "ACK_DISABLE"),
        ];
        f.write_str("MdOptions(")?;
        let mut first = true;
        for (flag, name) in NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

/// How many operations an MD accepts before it goes inactive (`lnet_md::threshold`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Threshold {
    /// This many more operations; at 0 the MD no longer matches.
    Count(u32),
    /// No limit (`LNET_MD_THRESH_INF`).
    Infinite,
}

impl Threshold {
    /// Whether no operations are left.
    pub const fn is_exhausted(self) -> bool {
        matches!(self, Threshold::Count(0))
    }

    /// LNet's `int` form: the count, or `LNET_MD_THRESH_INF` (-1).
    pub const fn as_lnet(self) -> i64 {
        match self {
            Threshold::Count(n) => n as i64,
            Threshold::Infinite => -1,
        }
    }

    fn consume(&mut self) {
        if let Threshold::Count(n) = self {
            *n = n.saturating_sub(1);
        }
    }
}

/// Whether an object goes away by itself (`enum lnet_unlink`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unlink {
    /// `LNET_RETAIN`: stays until unlinked explicitly. An exhausted MD stays attached but
    /// inactive; an entry stays (empty) when its MD is unlinked.
    Retain,
    /// `LNET_UNLINK`: an MD unlinks itself when exhausted; an entry unlinks itself when its MD
    /// is unlinked.
    Auto,
}

/// Where a new match entry goes in its portal's list (`enum lnet_ins_pos`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InsertPos {
    /// `LNET_INS_BEFORE`: at the head, tried before the existing entries.
    Before,
    /// `LNET_INS_AFTER`: at the tail, tried after the existing entries.
    After,
}

/// A match entry: which requests on a portal may reach the MD attached to it
/// (`LNetMEAttach` arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatchEntry {
    /// The initiator to accept; [`Nid::ANY`] / [`ProcessId::PID_ANY`] are wildcards
    /// ([`ANY_PROCESS`] accepts everyone).
    pub match_id: ProcessId,
    /// Bits compared with the request's match bits.
    pub match_bits: u64,
    /// Bits excluded from the comparison.
    pub ignore_bits: u64,
    /// Whether the entry unlinks itself when its MD is unlinked.
    pub unlink: Unlink,
    /// Head or tail of the portal's list.
    pub position: InsertPos,
}

impl MatchEntry {
    /// An entry for exactly `match_bits` from `match_id`: no ignore bits, retained, appended.
    pub const fn new(match_id: ProcessId, match_bits: u64) -> MatchEntry {
        MatchEntry {
            match_id,
            match_bits,
            ignore_bits: 0,
            unlink: Unlink::Retain,
            position: InsertPos::After,
        }
    }

    /// The same entry with `ignore_bits`.
    pub const fn ignoring(mut self, ignore_bits: u64) -> MatchEntry {
        self.ignore_bits = ignore_bits;
        self
    }

    /// The same entry with the given unlink behaviour.
    pub const fn with_unlink(mut self, unlink: Unlink) -> MatchEntry {
        self.unlink = unlink;
        self
    }

    /// The same entry inserted at `position`.
    pub const fn at(mut self, position: InsertPos) -> MatchEntry {
        self.position = position;
        self
    }

    /// Whether a request from `initiator` with `match_bits` passes this entry (steps 3 and 4 of
    /// the module description).
    pub const fn accepts(&self, initiator: ProcessId, match_bits: u64) -> bool {
        let nid_ok = self.match_id.nid.is_any() || self.match_id.nid.as_u64() == initiator.nid.as_u64();
        let pid_ok = self.match_id.pid == ProcessId::PID_ANY || self.match_id.pid == initiator.pid;
        nid_ok && pid_ok && (self.match_bits ^ match_bits) & !self.ignore_bits == 0
    }
}

/// What a memory descriptor looks like to matching (`struct lnet_md` minus the memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MdSpec {
    /// Total bytes of the buffer (the sum of its fragments).
    pub length: u64,
    /// Operations and behaviour.
    pub options: MdOptions,
    /// How many operations it accepts.
    pub threshold: Threshold,
    /// `LNET_MD_MAX_SIZE`: if set, every match gets exactly this much room (requests are cut
    /// or dropped against it), and the MD counts as exhausted once `offset + max_size` exceeds
    /// `length`. Must not exceed `length`.
    pub max_size: Option<u64>,
    /// A value of the caller's, returned in matches and events (`lnet_md::user_ptr`).
    pub user_ptr: u64,
}

impl MdSpec {
    /// An MD of `length` bytes with `options` and `threshold`, no `max_size`, `user_ptr` 0.
    pub const fn new(length: u64, options: MdOptions, threshold: Threshold) -> MdSpec {
        MdSpec { length, options, threshold, max_size: None, user_ptr: 0 }
    }

    /// The same MD with `user_ptr`.
    pub const fn with_user_ptr(mut self, user_ptr: u64) -> MdSpec {
        self.user_ptr = user_ptr;
        self
    }

    /// The same MD with `max_size` (`LNET_MD_MAX_SIZE`).
    pub const fn with_max_size(mut self, max_size: u64) -> MdSpec {
        self.max_size = Some(max_size);
        self
    }
}

macro_rules! handle_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name {
            index: u32,
            generation: u32,
        }

        impl $name {
            /// The handle as one 64-bit cookie (generation in the upper half, slot in the
            /// lower), e.g. for the object cookie of a [`WireHandle`](crate::hdr::WireHandle).
            /// Never 0 and never all ones.
            pub const fn cookie(self) -> u64 {
                ((self.generation as u64) << 32) | self.index as u64
            }

            /// The handle a cookie from [`Self::cookie`] stands for. Any value is accepted;
            /// one that names no live object is refused when used.
            pub const fn from_cookie(cookie: u64) -> $name {
                $name {
                    index: cookie as u32,
                    generation: (cookie >> 32) as u32,
                }
            }
        }
    };
}

handle_type!(
    /// A generation-checked handle to a memory descriptor in a [`PortalTable`]
    /// (`struct lnet_handle_md`).
    MdHandle
);

handle_type!(
    /// A generation-checked handle to a match entry in a [`PortalTable`].
    MeHandle
);

/// Why a portal-table call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MatchError {
    /// The portal index is not below the table's portal count.
    #[error("portal {portal} out of range (table has {nportals} portals)")]
    BadPortal {
        /// The requested index.
        portal: u32,
        /// The table's portal count.
        nportals: usize,
    },
    /// The handle names no live object (never valid, or unlinked since).
    #[error("stale or invalid {what} handle")]
    StaleHandle {
        /// `"MD"` or `"ME"`.
        what: &'static str,
    },
    /// The match entry already has an MD attached.
    #[error("match entry already has a memory descriptor attached")]
    MeInUse,
    /// The MD allows neither PUT nor GET, so it could never match.
    #[error("memory descriptor allows neither PUT nor GET")]
    NoOperation,
    /// `max_size` exceeds the MD's length.
    #[error("max_size {max_size} exceeds MD length {length}")]
    MaxSizeTooBig {
        /// The requested `max_size`.
        max_size: u64,
        /// The MD's length.
        length: u64,
    },
}

/// The operation an incoming request wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatchOp {
    /// An incoming PUT (needs [`MdOptions::OP_PUT`]).
    Put,
    /// An incoming GET (needs [`MdOptions::OP_GET`]).
    Get,
}

impl MatchOp {
    const fn required(self) -> MdOptions {
        match self {
            MatchOp::Put => MdOptions::OP_PUT,
            MatchOp::Get => MdOptions::OP_GET,
        }
    }
}

/// A successful match: where the request's data goes (PUT) or comes from (GET).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Matched {
    /// The matched MD. Stale already if [`Matched::unlinked`].
    pub md: MdHandle,
    /// The entry it hangs on. Stale already if [`Matched::me_unlinked`].
    pub me: MeHandle,
    /// Byte offset into the MD.
    pub offset: u64,
    /// Bytes to move (`min(rlength, room)`; smaller than `rlength` only with TRUNCATE).
    pub mlength: u64,
    /// Bytes the request asked for.
    pub rlength: u64,
    /// The MD's [`MdSpec::user_ptr`].
    pub user_ptr: u64,
    /// The MD's options (e.g. [`MdOptions::ACK_DISABLE`] for the ACK decision).
    pub options: MdOptions,
    /// The MD accepts no further operations (threshold used up or `max_size` no longer fits).
    pub exhausted: bool,
    /// The MD was exhausted and attached with [`Unlink::Auto`], so it was unlinked; the event
    /// for this operation is its last and carries `unlinked`.
    pub unlinked: bool,
    /// The entry was unlinked with the MD (it was created with [`Unlink::Auto`]).
    pub me_unlinked: bool,
}

impl Matched {
    /// Whether the MD suppresses ACKs ([`MdOptions::ACK_DISABLE`]).
    pub const fn ack_disabled(&self) -> bool {
        self.options.contains(MdOptions::ACK_DISABLE)
    }
}

/// Why a request was dropped. Counted separately by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The portal index is out of range ("Invalid portal").
    BadPortal,
    /// No entry on the portal accepted the request.
    NoMatch,
    /// An MD accepted the request but it does not fit and the MD does not allow truncation.
    /// LNet drops the message here without trying later entries.
    TooLong {
        /// The MD that refused.
        md: MdHandle,
        /// Bytes requested.
        rlength: u64,
        /// Room the MD had.
        available: u64,
    },
}

/// Outcome of matching an incoming PUT or GET.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatchResult {
    /// An MD took the request.
    Matched(Matched),
    /// The request is dropped.
    Dropped(DropReason),
}

impl MatchResult {
    /// The match, if any.
    pub const fn matched(&self) -> Option<&Matched> {
        match self {
            MatchResult::Matched(m) => Some(m),
            MatchResult::Dropped(_) => None,
        }
    }
}

/// A snapshot of an MD's matching state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MdStatus {
    /// The MD as attached.
    pub spec: MdSpec,
    /// The running offset (next byte for an MD without MANAGE_REMOTE).
    pub offset: u64,
    /// Operations left.
    pub threshold: Threshold,
    /// Whether it no longer matches.
    pub exhausted: bool,
    /// The entry it is attached to.
    pub me: MeHandle,
}

/// What an explicit unlink removed, for building an `UNLINK` event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnlinkedMd {
    /// The MD's (now stale) handle.
    pub md: MdHandle,
    /// Its [`MdSpec::user_ptr`].
    pub user_ptr: u64,
    /// Its running offset when unlinked.
    pub offset: u64,
    /// The entry removed with it, if any.
    pub me_unlinked: Option<MeHandle>,
}

/// Slot storage with generation-checked indices.
#[derive(Debug)]
struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

impl<T> Slab<T> {
    fn new() -> Slab<T> {
        Slab { slots: Vec::new(), free: Vec::new() }
    }

    /// Stores `value`; returns (index, generation).
    fn insert(&mut self, value: T) -> (u32, u32) {
        if let Some(index) = self.free.pop() {
            if let Some(slot) = self.slots.get_mut(index as usize) {
                slot.value = Some(value);
                return (index, slot.generation);
            }
        }
        let index = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        self.slots.push(Slot { generation: 1, value: Some(value) });
        (index, 1)
    }

    fn get(&self, index: u32, generation: u32) -> Option<&T> {
        self.slots.get(index as usize).filter(|s| s.generation == generation).and_then(|s| s.value.as_ref())
    }

    fn get_mut(&mut self, index: u32, generation: u32) -> Option<&mut T> {
        self.slots
            .get_mut(index as usize)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.value.as_mut())
    }

    /// Removes the value and bumps the slot's generation so old handles go stale.
    fn remove(&mut self, index: u32, generation: u32) -> Option<T> {
        let slot = self.slots.get_mut(index as usize)?;
        if slot.generation != generation {
            return None;
        }
        let value = slot.value.take()?;
        // Generations cycle through 1..u32::MAX so cookies are never 0 or all ones.
        slot.generation = if slot.generation >= u32::MAX - 1 { 1 } else { slot.generation + 1 };
        self.free.push(index);
        Some(value)
    }
}

#[derive(Debug)]
struct MeState {
    portal: u32,
    entry: MatchEntry,
    md: Option<MdHandle>,
}

#[derive(Debug)]
struct MdState {
    spec: MdSpec,
    offset: u64,
    threshold: Threshold,
    auto_unlink: bool,
    me: MeHandle,
}

impl MdState {
    /// `lnet_md_exhausted`.
    fn exhausted(&self) -> bool {
        self.threshold.is_exhausted()
            || self.spec.max_size.is_some_and(|max| self.offset.saturating_add(max) > self.spec.length)
    }
}

/// The portals of one LNet instance with their match entries and attached MDs.
#[derive(Debug)]
pub struct PortalTable {
    /// Per portal, ME slot indices in match order.
    portals: Vec<VecDeque<MeHandle>>,
    mes: Slab<MeState>,
    mds: Slab<MdState>,
}

impl Default for PortalTable {
    /// A table with [`DEFAULT_PORTALS`] portals.
    fn default() -> PortalTable {
        PortalTable::new(DEFAULT_PORTALS)
    }
}

impl PortalTable {
    /// A table with `nportals` empty portals (indices `0..nportals`); at most
    /// [`PORTALS_MAX`] are made (callers check the number they are given:
    /// [`crate::lnet::Lnet::new`] refuses more).
    pub fn new(nportals: usize) -> PortalTable {
        let nportals = nportals.min(PORTALS_MAX);
        PortalTable {
            portals: (0..nportals).map(|_| VecDeque::new()).collect(),
            mes: Slab::new(),
            mds: Slab::new(),
        }
    }

    /// The number of portals.
    pub fn nportals(&self) -> usize {
        self.portals.len()
    }

    /// The match entries on `portal`, in match order (empty for an out-of-range portal).
    pub fn entries(&self, portal: u32) -> Vec<MeHandle> {
        self.portals.get(portal as usize).map(|list| list.iter().copied().collect()).unwrap_or_default()
    }

    /// Adds a match entry, without an MD, to `portal` (`LNetMEAttach`). It matches nothing
    /// until an MD is attached with [`PortalTable::md_attach`].
    pub fn me_attach(&mut self, portal: u32, entry: MatchEntry) -> Result<MeHandle, MatchError> {
        let nportals = self.portals.len();
        if self.portals.get(portal as usize).is_none() {
            return Err(MatchError::BadPortal { portal, nportals });
        }
        let (index, generation) = self.mes.insert(MeState { portal, entry, md: None });
        let handle = MeHandle { index, generation };
        if let Some(list) = self.portals.get_mut(portal as usize) {
            match entry.position {
                InsertPos::Before => list.push_front(handle),
                InsertPos::After => list.push_back(handle),
            }
        }
        Ok(handle)
    }

    /// Attaches an MD to an entry that has none (`LNetMDAttach`). With [`Unlink::Auto`] the MD
    /// unlinks itself once exhausted.
    pub fn md_attach(&mut self, me: MeHandle, md: MdSpec, unlink: Unlink) -> Result<MdHandle, MatchError> {
        Self::validate(&md)?;
        let me_state = self.mes.get(me.index, me.generation).ok_or(MatchError::StaleHandle { what: "ME" })?;
        if me_state.md.is_some() {
            return Err(MatchError::MeInUse);
        }
        let (index, generation) = self.mds.insert(MdState {
            spec: md,
            offset: 0,
            threshold: md.threshold,
            auto_unlink: unlink == Unlink::Auto,
            me,
        });
        let handle = MdHandle { index, generation };
        if let Some(me_state) = self.mes.get_mut(me.index, me.generation) {
            me_state.md = Some(handle);
        }
        Ok(handle)
    }

    /// Adds an entry to `portal` and attaches `md` to it in one step; nothing is added if
    /// either part is invalid.
    pub fn attach(
        &mut self,
        portal: u32,
        entry: MatchEntry,
        md: MdSpec,
        md_unlink: Unlink,
    ) -> Result<(MeHandle, MdHandle), MatchError> {
        Self::validate(&md)?;
        let me = self.me_attach(portal, entry)?;
        let md = self.md_attach(me, md, md_unlink)?;
        Ok((me, md))
    }

    fn validate(md: &MdSpec) -> Result<(), MatchError> {
        if !md.options.intersects(MdOptions::OP_PUT.union(MdOptions::OP_GET)) {
            return Err(MatchError::NoOperation);
        }
        match md.max_size {
            Some(max_size) if max_size > md.length => {
                Err(MatchError::MaxSizeTooBig { max_size, length: md.length })
            }
            _ => Ok(()),
        }
    }

    /// The current state of an MD, or `None` if the handle is stale.
    pub fn md_status(&self, md: MdHandle) -> Option<MdStatus> {
        self.mds.get(md.index, md.generation).map(|s| MdStatus {
            spec: s.spec,
            offset: s.offset,
            threshold: s.threshold,
            exhausted: s.exhausted(),
            me: s.me,
        })
    }

    /// The entry behind a handle and the MD attached to it, or `None` if the handle is stale.
    pub fn me_status(&self, me: MeHandle) -> Option<(u32, MatchEntry, Option<MdHandle>)> {
        self.mes.get(me.index, me.generation).map(|s| (s.portal, s.entry, s.md))
    }

    /// Unlinks an MD (`LNetMDUnlink`); its entry goes too if created with [`Unlink::Auto`],
    /// otherwise the entry stays, empty. The handle is stale afterwards.
    pub fn md_unlink(&mut self, md: MdHandle) -> Result<UnlinkedMd, MatchError> {
        self.remove_md(md).ok_or(MatchError::StaleHandle { what: "MD" })
    }

    /// Unlinks an entry and the MD attached to it, if any (`LNetMEUnlink`). Returns what was
    /// removed of the MD.
    pub fn me_unlink(&mut self, me: MeHandle) -> Result<Option<UnlinkedMd>, MatchError> {
        let state = self.mes.remove(me.index, me.generation).ok_or(MatchError::StaleHandle { what: "ME" })?;
        self.remove_from_portal(state.portal, me);
        Ok(state.md.and_then(|md| {
            self.mds.remove(md.index, md.generation).map(|s| UnlinkedMd {
                md,
                user_ptr: s.spec.user_ptr,
                offset: s.offset,
                me_unlinked: Some(me),
            })
        }))
    }

    fn remove_from_portal(&mut self, portal: u32, me: MeHandle) {
        if let Some(list) = self.portals.get_mut(portal as usize) {
            // A handle is in its list once. The entry that matched is usually at the front
            // (servers post many like entries and the first one takes each message): no scan.
            if let Some(at) = list.iter().position(|h| *h == me) {
                list.remove(at);
            }
        }
    }

    /// `lnet_md_unlink`: detach from the entry, and unlink the entry if it says so.
    fn remove_md(&mut self, md: MdHandle) -> Option<UnlinkedMd> {
        let state = self.mds.remove(md.index, md.generation)?;
        let me = state.me;
        let mut me_unlinked = None;
        let auto = match self.mes.get_mut(me.index, me.generation) {
            Some(me_state) => {
                me_state.md = None;
                Some((me_state.entry.unlink, me_state.portal))
            }
            None => None,
        };
        if let Some((Unlink::Auto, portal)) = auto {
            self.mes.remove(me.index, me.generation);
            self.remove_from_portal(portal, me);
            me_unlinked = Some(me);
        }
        Some(UnlinkedMd { md, user_ptr: state.spec.user_ptr, offset: state.offset, me_unlinked })
    }

    /// Matches an incoming PUT of `rlength` bytes at remote offset `roffset`
    /// (the header's `payload_length` and `offset`).
    pub fn match_put(
        &mut self,
        initiator: ProcessId,
        portal: u32,
        match_bits: u64,
        rlength: u64,
        roffset: u64,
    ) -> MatchResult {
        self.match_md(MatchOp::Put, initiator, portal, match_bits, rlength, roffset)
    }

    /// Matches an incoming GET for `rlength` bytes at remote offset `roffset`
    /// (the header's `sink_length` and `src_offset`).
    pub fn match_get(
        &mut self,
        initiator: ProcessId,
        portal: u32,
        match_bits: u64,
        rlength: u64,
        roffset: u64,
    ) -> MatchResult {
        self.match_md(MatchOp::Get, initiator, portal, match_bits, rlength, roffset)
    }

    /// Matches an incoming request (`lnet_ptl_match_md` / `lnet_try_match_md`); see the module
    /// description for the rules.
    pub fn match_md(
        &mut self,
        op: MatchOp,
        initiator: ProcessId,
        portal: u32,
        match_bits: u64,
        rlength: u64,
        roffset: u64,
    ) -> MatchResult {
        let Some(list) = self.portals.get(portal as usize) else {
            return MatchResult::Dropped(DropReason::BadPortal);
        };
        let mut found = None;
        for &me in list {
            let Some(me_state) = self.mes.get(me.index, me.generation) else {
                continue;
            };
            let Some(md) = me_state.md else {
                continue; // ME without an MD yet
            };
            let Some(md_state) = self.mds.get(md.index, md.generation) else {
                continue;
            };
            if md_state.exhausted()
                || !md_state.spec.options.contains(op.required())
                || !me_state.entry.accepts(initiator, match_bits)
            {
                continue;
            }
            // This MD matches: check the length, then commit or drop.
            let spec = &md_state.spec;
            let offset =
                if spec.options.contains(MdOptions::MANAGE_REMOTE) { roffset } else { md_state.offset };
            let room = spec.length.saturating_sub(offset);
            // LNet gives a MAX_SIZE MD exactly max_size of room; capped here by what is left
            // of the buffer so a remote offset can never point past its end.
            let available = spec.max_size.map_or(room, |max| max.min(room));
            if rlength > available && !spec.options.contains(MdOptions::TRUNCATE) {
                return MatchResult::Dropped(DropReason::TooLong { md, rlength, available });
            }
            found = Some((me, md, offset, rlength.min(available)));
            break;
        }
        let Some((me, md, offset, mlength)) = found else {
            return MatchResult::Dropped(DropReason::NoMatch);
        };
        let Some(md_state) = self.mds.get_mut(md.index, md.generation) else {
            return MatchResult::Dropped(DropReason::NoMatch);
        };
        md_state.offset = offset.saturating_add(mlength);
        md_state.threshold.consume();
        let exhausted = md_state.exhausted();
        let auto_unlink = md_state.auto_unlink;
        let user_ptr = md_state.spec.user_ptr;
        let options = md_state.spec.options;
        let (unlinked, me_unlinked) = if exhausted && auto_unlink {
            let removed = self.remove_md(md);
            (true, removed.and_then(|r| r.me_unlinked).is_some())
        } else {
            (false, false)
        };
        MatchResult::Matched(Matched {
            md,
            me,
            offset,
            mlength,
            rlength,
            user_ptr,
            options,
            exhausted,
            unlinked,
            me_unlinked,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(s: &str, pid: u32) -> ProcessId {
        ProcessId::new(s.parse().unwrap(), pid)
    }

    fn client() -> ProcessId {
        pid("10.0.0.7@o2ib", ProcessId::PID_LUSTRE)
    }

    const PUT: MdOptions = MdOptions::OP_PUT;

    fn matched(r: MatchResult) -> Matched {
        match r {
            MatchResult::Matched(m) => m,
            MatchResult::Dropped(d) => panic!("expected a match, got {d:?}"),
        }
    }

    #[test]
    fn match_bits_and_ignore_bits() {
        let mut t = PortalTable::default();
        let entry = MatchEntry::new(ANY_PROCESS, 0xab00).ignoring(0x00ff);
        let md = MdSpec::new(4096, PUT, Threshold::Infinite);
        t.attach(4, entry, md, Unlink::Retain).unwrap();
        for bits in [0xab00, 0xab01, 0xabff] {
            assert!(t.match_put(client(), 4, bits, 1, 0).matched().is_some(), "{bits:#x}");
        }
        for bits in [0xaa00, 0x1ab00, 0xac00] {
            assert_eq!(
                t.match_put(client(), 4, bits, 1, 0),
                MatchResult::Dropped(DropReason::NoMatch),
                "{bits:#x}"
            );
        }
        // Another portal sees nothing; an out-of-range one is its own reason.
        assert_eq!(t.match_put(client(), 5, 0xab00, 1, 0), MatchResult::Dropped(DropReason::NoMatch));
        assert_eq!(t.match_put(client(), 64, 0xab00, 1, 0), MatchResult::Dropped(DropReason::BadPortal));
    }

    #[test]
    fn wildcard_and_specific_ids() {
        let mut t = PortalTable::new(8);
        let md = MdSpec::new(100, PUT, Threshold::Infinite);
        let a = pid("10.0.0.1@o2ib", 12345);
        let exact = MatchEntry::new(a, 1);
        let any_pid = MatchEntry::new(ProcessId::new(a.nid, ProcessId::PID_ANY), 2);
        let any_nid = MatchEntry::new(ProcessId::new(Nid::ANY, 12345), 3);
        t.attach(0, exact, md, Unlink::Retain).unwrap();
        t.attach(0, any_pid, md, Unlink::Retain).unwrap();
        t.attach(0, any_nid, md, Unlink::Retain).unwrap();
        let same_node_other_pid = ProcessId::new(a.nid, 7);
        let other_node = pid("10.0.0.2@o2ib", 12345);
        let ok = |t: &mut PortalTable, who, bits| t.match_put(who, 0, bits, 1, 0).matched().is_some();
        assert!(ok(&mut t, a, 1));
        assert!(!ok(&mut t, same_node_other_pid, 1));
        assert!(!ok(&mut t, other_node, 1));
        assert!(ok(&mut t, same_node_other_pid, 2));
        assert!(!ok(&mut t, other_node, 2));
        assert!(ok(&mut t, other_node, 3));
        assert!(!ok(&mut t, ProcessId::new(other_node.nid, 1), 3));
    }

    #[test]
    fn op_flags() {
        let mut t = PortalTable::default();
        let e = MatchEntry::new(ANY_PROCESS, 9);
        t.attach(1, e, MdSpec::new(10, MdOptions::OP_GET, Threshold::Infinite), Unlink::Retain).unwrap();
        assert_eq!(t.match_put(client(), 1, 9, 1, 0), MatchResult::Dropped(DropReason::NoMatch));
        assert!(t.match_get(client(), 1, 9, 1, 0).matched().is_some());
        // An MD with neither operation is refused up front, and nothing is left behind.
        assert_eq!(
            t.attach(1, e, MdSpec::new(10, MdOptions::TRUNCATE, Threshold::Infinite), Unlink::Retain),
            Err(MatchError::NoOperation)
        );
        assert_eq!(t.entries(1).len(), 1);
        let both = MdOptions::OP_PUT | MdOptions::OP_GET;
        t.attach(2, e, MdSpec::new(10, both, Threshold::Infinite), Unlink::Retain).unwrap();
        assert!(t.match_put(client(), 2, 9, 1, 0).matched().is_some());
        assert!(t.match_get(client(), 2, 9, 1, 0).matched().is_some());
    }

    #[test]
    fn local_offsets_advance_and_remote_offsets_do_not() {
        let mut t = PortalTable::default();
        let e = MatchEntry::new(ANY_PROCESS, 0);
        let (_, local) = t.attach(0, e, MdSpec::new(1000, PUT, Threshold::Infinite), Unlink::Retain).unwrap();
        let m1 = matched(t.match_put(client(), 0, 0, 300, 999));
        let m2 = matched(t.match_put(client(), 0, 0, 300, 999));
        assert_eq!((m1.md, m1.offset, m1.mlength), (local, 0, 300));
        assert_eq!((m2.offset, m2.mlength), (300, 300));
        assert_eq!(t.md_status(local).unwrap().offset, 600);

        let remote = MdOptions::OP_PUT | MdOptions::MANAGE_REMOTE;
        t.attach(1, e, MdSpec::new(1000, remote, Threshold::Infinite), Unlink::Retain).unwrap();
        let m = matched(t.match_put(client(), 1, 0, 100, 500));
        assert_eq!((m.offset, m.mlength), (500, 100));
        let m = matched(t.match_put(client(), 1, 0, 100, 20));
        assert_eq!((m.offset, m.mlength), (20, 100));
    }

    #[test]
    fn truncation_allowed_and_refused() {
        let mut t = PortalTable::default();
        let e = MatchEntry::new(ANY_PROCESS, 0);
        let trunc = MdOptions::OP_PUT | MdOptions::TRUNCATE;
        t.attach(0, e, MdSpec::new(100, trunc, Threshold::Infinite), Unlink::Retain).unwrap();
        let m = matched(t.match_put(client(), 0, 0, 60, 0));
        assert_eq!((m.offset, m.mlength, m.rlength), (0, 60, 60));
        let m = matched(t.match_put(client(), 0, 0, 60, 0));
        assert_eq!((m.offset, m.mlength, m.rlength), (60, 40, 60));
        let m = matched(t.match_put(client(), 0, 0, 60, 0));
        assert_eq!((m.offset, m.mlength), (100, 0));

        // Without TRUNCATE an oversized request drops the message; the later entry, which
        // would fit, is not tried (LNET_MATCHMD_DROP ends the walk).
        let (_, small) = t.attach(1, e, MdSpec::new(100, PUT, Threshold::Infinite), Unlink::Retain).unwrap();
        t.attach(1, e, MdSpec::new(10_000, PUT, Threshold::Infinite), Unlink::Retain).unwrap();
        assert_eq!(
            t.match_put(client(), 1, 0, 101, 0),
            MatchResult::Dropped(DropReason::TooLong { md: small, rlength: 101, available: 100 })
        );
        // A refused request changes nothing.
        let s = t.md_status(small).unwrap();
        assert_eq!((s.offset, s.threshold), (0, Threshold::Infinite));
        assert_eq!(matched(t.match_put(client(), 1, 0, 100, 0)).md, small);

        // A remote offset past the end leaves no room (never wraps).
        let remote = MdOptions::OP_GET | MdOptions::MANAGE_REMOTE;
        t.attach(2, e, MdSpec::new(100, remote, Threshold::Infinite), Unlink::Retain).unwrap();
        assert!(matches!(
            t.match_get(client(), 2, 0, 1, 200),
            MatchResult::Dropped(DropReason::TooLong { available: 0, .. })
        ));
    }

    #[test]
    fn max_size() {
        let mut t = PortalTable::default();
        let e = MatchEntry::new(ANY_PROCESS, 0);
        assert_eq!(
            t.attach(0, e, MdSpec::new(100, PUT, Threshold::Infinite).with_max_size(101), Unlink::Retain),
            Err(MatchError::MaxSizeTooBig { max_size: 101, length: 100 })
        );
        let md = MdSpec::new(100, PUT, Threshold::Infinite).with_max_size(40);
        let (_, h) = t.attach(0, e, md, Unlink::Auto).unwrap();
        let m = matched(t.match_put(client(), 0, 0, 30, 0));
        assert_eq!((m.offset, m.mlength, m.exhausted), (0, 30, false));
        assert!(matches!(
            t.match_put(client(), 0, 0, 41, 0),
            MatchResult::Dropped(DropReason::TooLong { available: 40, .. })
        ));
        // 30 + 40 = 70 <= 100 fits; after it, 70 + 40 > 100: exhausted and auto-unlinked.
        let m = matched(t.match_put(client(), 0, 0, 40, 0));
        assert_eq!((m.offset, m.mlength, m.exhausted, m.unlinked), (30, 40, true, true));
        assert_eq!(t.md_status(h), None);
    }

    #[test]
    fn threshold_counts_and_infinite() {
        let mut t = PortalTable::default();
        let e = MatchEntry::new(ANY_PROCESS, 0);
        let (_, h) = t.attach(0, e, MdSpec::new(1 << 20, PUT, Threshold::Count(2)), Unlink::Retain).unwrap();
        let m = matched(t.match_put(client(), 0, 0, 1, 0));
        assert!(!m.exhausted);
        assert_eq!(t.md_status(h).unwrap().threshold, Threshold::Count(1));
        let m = matched(t.match_put(client(), 0, 0, 1, 0));
        assert!(m.exhausted && !m.unlinked);
        // Retained but inactive: it stays attached and matches nothing.
        assert!(t.md_status(h).unwrap().exhausted);
        assert_eq!(t.match_put(client(), 0, 0, 1, 0), MatchResult::Dropped(DropReason::NoMatch));

        let (_, inf) = t.attach(1, e, MdSpec::new(1 << 30, PUT, Threshold::Infinite), Unlink::Auto).unwrap();
        for _ in 0..1000 {
            let m = matched(t.match_put(client(), 1, 0, 1, 0));
            assert!(!m.exhausted && !m.unlinked);
        }
        assert_eq!(t.md_status(inf).unwrap().threshold, Threshold::Infinite);
        assert_eq!(Threshold::Infinite.as_lnet(), -1);

        // A zero threshold never matches.
        t.attach(2, e, MdSpec::new(10, PUT, Threshold::Count(0)), Unlink::Retain).unwrap();
        assert_eq!(t.match_put(client(), 2, 0, 1, 0), MatchResult::Dropped(DropReason::NoMatch));
    }

    #[test]
    fn exhausted_mds_are_skipped_for_later_entries() {
        let mut t = PortalTable::default();
        let e = MatchEntry::new(ANY_PROCESS, 0);
        let md = MdSpec::new(10, PUT, Threshold::Count(1));
        let (_, first) = t.attach(0, e, md.with_user_ptr(1), Unlink::Retain).unwrap();
        let (_, second) = t.attach(0, e, md.with_user_ptr(2), Unlink::Retain).unwrap();
        let m = matched(t.match_put(client(), 0, 0, 5, 0));
        assert_eq!((m.md, m.user_ptr), (first, 1));
        let m = matched(t.match_put(client(), 0, 0, 5, 0));
        assert_eq!((m.md, m.user_ptr), (second, 2));
    }

    #[test]
    fn auto_unlink_versus_retain() {
        let mut t = PortalTable::default();
        let md = MdSpec::new(10, PUT, Threshold::Count(1));
        // MD auto-unlinks, ME created with Auto goes with it.
        let e_auto = MatchEntry::new(ANY_PROCESS, 1).with_unlink(Unlink::Auto);
        let (me, h) = t.attach(0, e_auto, md, Unlink::Auto).unwrap();
        let m = matched(t.match_put(client(), 0, 1, 5, 0));
        assert!(m.exhausted && m.unlinked && m.me_unlinked);
        assert_eq!(t.md_status(h), None);
        assert_eq!(t.me_status(me), None);
        assert!(t.entries(0).is_empty());

        // MD auto-unlinks, ME created with Retain stays, empty, and can take a new MD.
        let e_keep = MatchEntry::new(ANY_PROCESS, 2);
        let (me, h) = t.attach(0, e_keep, md, Unlink::Auto).unwrap();
        let m = matched(t.match_put(client(), 0, 2, 5, 0));
        assert!(m.unlinked && !m.me_unlinked);
        assert_eq!(t.md_status(h), None);
        assert_eq!(t.me_status(me), Some((0, e_keep, None)));
        assert_eq!(t.match_put(client(), 0, 2, 5, 0), MatchResult::Dropped(DropReason::NoMatch));
        let h2 = t.md_attach(me, md, Unlink::Retain).unwrap();
        assert_eq!(matched(t.match_put(client(), 0, 2, 5, 0)).md, h2);
        assert_eq!(t.md_attach(me, md, Unlink::Retain), Err(MatchError::MeInUse));
    }

    #[test]
    fn unlink_by_handle_and_stale_handles() {
        let mut t = PortalTable::default();
        let md = MdSpec::new(10, PUT, Threshold::Infinite).with_user_ptr(77);
        let e = MatchEntry::new(ANY_PROCESS, 0).with_unlink(Unlink::Auto);
        let (me, h) = t.attach(3, e, md, Unlink::Retain).unwrap();
        matched(t.match_put(client(), 3, 0, 4, 0));
        let u = t.md_unlink(h).unwrap();
        assert_eq!(u, UnlinkedMd { md: h, user_ptr: 77, offset: 4, me_unlinked: Some(me) });
        assert_eq!(t.md_unlink(h), Err(MatchError::StaleHandle { what: "MD" }));
        assert_eq!(t.me_unlink(me), Err(MatchError::StaleHandle { what: "ME" }));
        assert_eq!(t.match_put(client(), 3, 0, 4, 0), MatchResult::Dropped(DropReason::NoMatch));

        // Slots are reused, old handles stay refused.
        let (me2, h2) = t.attach(3, e, md, Unlink::Retain).unwrap();
        assert_eq!((me2.index, h2.index), (me.index, h.index));
        assert_ne!(h2, h);
        assert_eq!(t.md_status(h), None);
        assert_eq!(t.md_attach(me, md, Unlink::Retain), Err(MatchError::StaleHandle { what: "ME" }));
        assert_eq!(MdHandle::from_cookie(h2.cookie()), h2);
        assert_ne!(h2.cookie(), 0);

        // Unlinking the entry takes its MD with it.
        let removed = t.me_unlink(me2).unwrap().unwrap();
        assert_eq!(removed.md, h2);
        assert_eq!(t.md_status(h2), None);
        assert!(t.entries(3).is_empty());
        // Forged cookies are refused, never panic.
        assert!(t.md_unlink(MdHandle::from_cookie(u64::MAX)).is_err());
        assert!(t.md_unlink(MdHandle::from_cookie(0)).is_err());
        assert_eq!(t.me_attach(99, e), Err(MatchError::BadPortal { portal: 99, nportals: 64 }));
    }

    #[test]
    fn insert_before_and_after() {
        let mut t = PortalTable::default();
        let md = |u| MdSpec::new(10, PUT, Threshold::Count(1)).with_user_ptr(u);
        let e = MatchEntry::new(ANY_PROCESS, 0);
        t.attach(0, e, md(1), Unlink::Auto).unwrap();
        t.attach(0, e.at(InsertPos::After), md(2), Unlink::Auto).unwrap();
        t.attach(0, e.at(InsertPos::Before), md(3), Unlink::Auto).unwrap();
        t.attach(0, e.at(InsertPos::Before), md(4), Unlink::Auto).unwrap();
        let order: Vec<u64> = (0..4).map(|_| matched(t.match_put(client(), 0, 0, 1, 0)).user_ptr).collect();
        assert_eq!(order, [4, 3, 1, 2]);
        assert_eq!(t.match_put(client(), 0, 0, 1, 0), MatchResult::Dropped(DropReason::NoMatch));
    }

    #[test]
    fn options_bits_match_lnet() {
        assert_eq!(MdOptions::OP_PUT.bits(), 0x01);
        assert_eq!(MdOptions::OP_GET.bits(), 0x02);
        assert_eq!(MdOptions::MANAGE_REMOTE.bits(), 0x04);
        assert_eq!(MdOptions::TRUNCATE.bits(), 0x10);
        assert_eq!(MdOptions::ACK_DISABLE.bits(), 0x20);
        assert_eq!(MdOptions::from_bits(0x80), None); // LNET_MD_MAX_SIZE is MdSpec::max_size
        assert_eq!(MdOptions::from_bits_truncate(0x83), MdOptions::OP_PUT | MdOptions::OP_GET);
        let mut o = MdOptions::OP_PUT | MdOptions::ACK_DISABLE;
        assert_eq!(format!("{o:?}"), "MdOptions(OP_PUT | ACK_DISABLE)");
        o.remove(MdOptions::ACK_DISABLE);
        assert_eq!(o, MdOptions::OP_PUT);
        let mut t = PortalTable::default();
        let e = MatchEntry::new(ANY_PROCESS, 0);
        t.attach(0, e, MdSpec::new(8, PUT | MdOptions::ACK_DISABLE, Threshold::Infinite), Unlink::Retain)
            .unwrap();
        assert!(matched(t.match_put(client(), 0, 0, 8, 0)).ack_disabled());
    }
}
