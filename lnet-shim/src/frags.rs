//! Fragments: byte ranges of buffers ([`Frag`]) and the lists of them that memory descriptors,
//! LND sends and receive sinks carry ([`Frags`]).
//!
//! Most lists have one fragment (an MD over one contiguous buffer, a message's payload cut
//! from it), so [`Frags`] keeps a single fragment inline and only a longer list on the heap:
//! building, cloning and slicing a one-fragment list allocates nothing, which matters because
//! LNet and the LND do all three for every message. A `Frags` reads as a slice
//! (`Deref<Target = [Frag]>`) and builds from a `Vec<Frag>`, a `Frag` or an iterator.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use crate::buffer::Buffer;

/// A byte range of a [`Buffer`]: `len` bytes from `offset`.
#[derive(Clone, Debug)]
pub struct Frag {
    /// The buffer (kept alive while the LND uses the fragment).
    pub buf: Arc<Buffer>,
    /// Offset of the first byte.
    pub offset: usize,
    /// Byte count.
    pub len: usize,
}

impl Frag {
    /// A fragment covering all of `buf`.
    pub fn whole(buf: Arc<Buffer>) -> Frag {
        let len = buf.len();
        Frag { buf, offset: 0, len }
    }

    /// Whether the range lies inside the buffer.
    pub fn is_valid(&self) -> bool {
        self.offset.checked_add(self.len).is_some_and(|end| end <= self.buf.len())
    }
}

/// Total bytes of a fragment list (`None` on overflow).
pub fn frags_len(frags: &[Frag]) -> Option<usize> {
    frags.iter().try_fold(0usize, |acc, f| acc.checked_add(f.len))
}

/// Copies `data` into `frags`, in order, from each fragment's start: the bytes written, or
/// `None` (nothing written) if the fragments hold fewer than `data.len()` bytes or one of them
/// lies outside its buffer.
pub fn copy_to_frags(frags: &[Frag], data: &[u8]) -> Option<usize> {
    if frags_len(frags).is_none_or(|n| n < data.len()) || !frags.iter().all(Frag::is_valid) {
        return None;
    }
    let mut at = 0;
    for f in frags {
        if at == data.len() {
            break;
        }
        let n = f.len.min(data.len() - at);
        f.buf.write(f.offset, data.get(at..at + n)?).ok()?;
        at += n;
    }
    Some(at)
}

/// A list of fragments, in order; one fragment is held inline (see the module doc).
#[derive(Clone, Default)]
pub struct Frags(Repr);

#[derive(Clone)]
enum Repr {
    One([Frag; 1]),
    /// Empty (no allocation) or two and more.
    Many(Vec<Frag>),
}

impl Default for Repr {
    fn default() -> Repr {
        Repr::Many(Vec::new())
    }
}

impl Frags {
    /// An empty list.
    pub const fn new() -> Frags {
        Frags(Repr::Many(Vec::new()))
    }

    /// Appends `f`.
    pub fn push(&mut self, f: Frag) {
        match &mut self.0 {
            Repr::Many(v) if v.is_empty() => self.0 = Repr::One([f]),
            Repr::Many(v) => v.push(f),
            Repr::One(_) => {
                let Repr::One([first]) = std::mem::take(&mut self.0) else { return };
                self.0 = Repr::Many(vec![first, f]);
            }
        }
    }

    /// The fragments as a `Vec`.
    pub fn into_vec(self) -> Vec<Frag> {
        match self.0 {
            Repr::One([f]) => vec![f],
            Repr::Many(v) => v,
        }
    }
}

impl Deref for Frags {
    type Target = [Frag];

    fn deref(&self) -> &[Frag] {
        match &self.0 {
            Repr::One(a) => a,
            Repr::Many(v) => v,
        }
    }
}

impl DerefMut for Frags {
    fn deref_mut(&mut self) -> &mut [Frag] {
        match &mut self.0 {
            Repr::One(a) => a,
            Repr::Many(v) => v,
        }
    }
}

impl std::fmt::Debug for Frags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl From<Frag> for Frags {
    fn from(f: Frag) -> Frags {
        Frags(Repr::One([f]))
    }
}

impl From<Vec<Frag>> for Frags {
    fn from(mut v: Vec<Frag>) -> Frags {
        match v.len() {
            1 => v.pop().map_or_else(Frags::new, Frags::from),
            _ => Frags(Repr::Many(v)),
        }
    }
}

impl<const N: usize> From<[Frag; N]> for Frags {
    fn from(a: [Frag; N]) -> Frags {
        a.into_iter().collect()
    }
}

impl FromIterator<Frag> for Frags {
    fn from_iter<I: IntoIterator<Item = Frag>>(iter: I) -> Frags {
        let mut out = Frags::new();
        for f in iter {
            out.push(f);
        }
        out
    }
}

impl Extend<Frag> for Frags {
    fn extend<I: IntoIterator<Item = Frag>>(&mut self, iter: I) {
        for f in iter {
            self.push(f);
        }
    }
}

impl<'a> IntoIterator for &'a Frags {
    type Item = &'a Frag;
    type IntoIter = std::slice::Iter<'a, Frag>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The owning iterator of a [`Frags`].
pub struct IntoIter(IterRepr);

enum IterRepr {
    One(std::array::IntoIter<Frag, 1>),
    Many(std::vec::IntoIter<Frag>),
}

impl Iterator for IntoIter {
    type Item = Frag;

    fn next(&mut self) -> Option<Frag> {
        match &mut self.0 {
            IterRepr::One(i) => i.next(),
            IterRepr::Many(i) => i.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            IterRepr::One(i) => i.size_hint(),
            IterRepr::Many(i) => i.size_hint(),
        }
    }
}

impl IntoIterator for Frags {
    type Item = Frag;
    type IntoIter = IntoIter;

    fn into_iter(self) -> IntoIter {
        IntoIter(match self.0 {
            Repr::One(a) => IterRepr::One(a.into_iter()),
            Repr::Many(v) => IterRepr::Many(v.into_iter()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(buf: &Arc<Buffer>, offset: usize) -> Frag {
        Frag { buf: buf.clone(), offset, len: 1 }
    }

    fn offsets(f: &[Frag]) -> Vec<usize> {
        f.iter().map(|f| f.offset).collect()
    }

    #[test]
    fn a_list_grows_from_empty_to_one_inline_to_many_and_reads_as_a_slice() {
        let buf = Arc::new(Buffer::new(16));
        let mut l = Frags::new();
        assert!(l.is_empty() && l.iter().next().is_none());
        l.push(frag(&buf, 0));
        assert!(matches!(l.0, Repr::One(_)), "one fragment is inline");
        l.push(frag(&buf, 1));
        l.extend([frag(&buf, 2), frag(&buf, 3)]);
        assert_eq!(offsets(&l), [0, 1, 2, 3]);
        assert_eq!(frags_len(&l), Some(4));
        l[1].len = 5;
        assert_eq!(frags_len(&l), Some(8));
        let owned: Vec<usize> = l.clone().into_iter().map(|f| f.offset).collect();
        assert_eq!(owned, [0, 1, 2, 3]);
        assert_eq!(offsets(&l.into_vec()), [0, 1, 2, 3]);
    }

    #[test]
    fn a_copy_fills_the_fragments_in_order_or_writes_nothing() {
        let (x, y) = (Arc::new(Buffer::new(8)), Arc::new(Buffer::new(8)));
        let frags = [Frag { buf: x.clone(), offset: 6, len: 2 }, Frag { buf: y.clone(), offset: 1, len: 5 }];
        assert_eq!(copy_to_frags(&frags, b"abcd"), Some(4));
        assert_eq!((x.to_vec(6, 2).unwrap(), y.to_vec(1, 2).unwrap()), (b"ab".to_vec(), b"cd".to_vec()));
        assert_eq!(copy_to_frags(&frags, b""), Some(0));
        assert_eq!(copy_to_frags(&frags, b"12345678"), None, "7 bytes of room");
        let outside = [Frag { buf: x.clone(), offset: 7, len: 2 }];
        assert_eq!(copy_to_frags(&outside, b"z"), None, "a fragment past its buffer's end");
        assert_eq!(x.to_vec(6, 2).unwrap(), b"ab", "nothing written");
    }

    #[test]
    fn conversions_keep_order_and_put_a_single_fragment_inline() {
        let buf = Arc::new(Buffer::new(16));
        let one = Frags::from(vec![frag(&buf, 7)]);
        assert!(matches!(one.0, Repr::One(_)));
        assert_eq!(offsets(&one), [7]);
        assert_eq!(one.clone().into_iter().map(|f| f.offset).collect::<Vec<_>>(), [7]);
        assert!(Frags::from(Vec::new()).is_empty());
        let many: Frags = (0..5).map(|i| frag(&buf, i)).collect();
        assert_eq!(offsets(&many), [0, 1, 2, 3, 4]);
        assert_eq!(offsets(&Frags::from([frag(&buf, 9), frag(&buf, 8)])), [9, 8]);
        assert_eq!(format!("{:?}", Frags::new()), "[]");
        // Cloning a one-fragment list shares the buffer, it does not copy it.
        let before = Arc::strong_count(&buf);
        let c = one.clone();
        assert_eq!(Arc::strong_count(&buf), before + 1);
        drop(c);
    }
}
