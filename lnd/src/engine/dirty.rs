//! The connections whose queues need looking at in this poll (`kiblnd_check_sends` is due):
//! a set of connection keys taken smallest first, as the `BTreeSet` it replaces did.
//!
//! It holds a handful of keys at a time (usually one: the connection a message just arrived
//! on or was queued for), so it is a vector kept sorted from largest to smallest: taking the
//! smallest is a pop, and inserting is a short search. Every message marks its connection at
//! least twice; a B-tree's node walk cost more than the rest of that bookkeeping.

/// Connection keys, each at most once, taken in ascending order.
#[derive(Debug, Default)]
pub(super) struct Dirty {
    /// Descending.
    keys: Vec<usize>,
}

impl Dirty {
    /// Marks connection `key` (once, however often it is marked).
    pub(super) fn insert(&mut self, key: usize) {
        // Descending order: the first position whose key is not greater than `key`.
        let at = self.keys.partition_point(|&k| k > key);
        if self.keys.get(at) != Some(&key) {
            self.keys.insert(at, key);
        }
    }

    /// Takes the smallest key.
    pub(super) fn pop_first(&mut self) -> Option<usize> {
        self.keys.pop()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::Dirty;

    #[test]
    fn keys_come_out_once_each_smallest_first_as_from_a_sorted_set() {
        let mut d = Dirty::default();
        assert!(d.is_empty());
        let mut rng = crate::rng::Rng::new(7);
        let mut model = std::collections::BTreeSet::new();
        for round in 0..2000 {
            if round % 3 == 2 {
                assert_eq!(d.pop_first(), model.pop_first(), "round {round}");
            } else {
                let k = rng.below(12) as usize;
                d.insert(k);
                model.insert(k);
            }
            assert_eq!(d.is_empty(), model.is_empty(), "round {round}");
        }
        while let Some(k) = model.pop_first() {
            assert_eq!(d.pop_first(), Some(k));
        }
        assert_eq!(d.pop_first(), None);
    }
}
