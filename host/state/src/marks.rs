//! A batch's writes to the ordered index namespaces (timers by time, the TTL index):
//! appended as they come, put in order only when something reads them in order.
//!
//! A batch writes these entries in no useful order (each key's timer at its own time, each
//! value's index entry at its own expiry) and reads them in order only to fire timers, to
//! clean up TTL and at its seal. A B-tree kept them in order on every write: a descent
//! through its nodes comparing whole keys, most of them on the heap for the TTL index
//! (`BTreeMap::insert` was 6.8% of `bench ttl`'s samples). Here a write is a push onto the
//! *recent* run. A reader sorts that run (stably, so the last write of a key wins) and merges
//! it into the *settled* run once it has grown past an eighth of it, so a write is sorted once
//! and merged a few times; a batch that never reads them in order sorts them at its seal.
//! The recent run is also settled when it outgrows the settled one past a few thousand
//! writes, so a processor writing one timer over and over holds a bounded number of copies.

use std::cmp::Ordering;

use crate::overlay::SmallBytes;

/// A recent run this long is settled when it is at least as long as the settled one.
const RECENT_SETTLE: usize = 4096;

/// The recent run is merged into the settled one when it is longer than the settled one's
/// length divided by this.
const MERGE_RATIO: usize = 8;

/// One entry: its key, and `true` to put it (empty) or `false` to delete it.
type Mark = (SmallBytes, bool);

/// The ordered index writes of one batch (see the module documentation).
#[derive(Default)]
pub(crate) struct Marks {
    /// Ascending, one entry per key.
    settled: Vec<Mark>,
    /// In write order; ascending with one entry per key once `recent_sorted`.
    recent: Vec<Mark>,
    recent_sorted: bool,
}

impl Marks {
    /// Puts (`true`) or deletes the entry at `key`; a later write of a key replaces an
    /// earlier one.
    pub(crate) fn mark(&mut self, key: SmallBytes, put: bool) {
        self.recent.push((key, put));
        self.recent_sorted = false;
        if self.recent.len() >= RECENT_SETTLE && self.recent.len() >= self.settled.len() {
            self.settle();
        }
    }

    /// At least the number of distinct keys written, counting a key written twice since
    /// the last settling twice.
    pub(crate) fn len_bound(&self) -> usize {
        self.settled.len() + self.recent.len()
    }

    /// Puts the writes in order for [`Self::range`].
    pub(crate) fn settle(&mut self) {
        if !self.recent_sorted {
            // Stable: of a key's writes, the last stays last.
            self.recent.sort_by(|a, b| a.0.cmp(&b.0));
            self.recent.dedup_by(|later, kept| {
                let same = later.0 == kept.0;
                if same {
                    kept.1 = later.1;
                }
                same
            });
            self.recent_sorted = true;
        }
        if self.recent.len() * MERGE_RATIO > self.settled.len() {
            self.merge();
        }
    }

    /// The number of distinct keys written.
    pub(crate) fn len(&mut self) -> usize {
        self.settle();
        self.merge();
        self.settled.len()
    }

    /// The entries with `start <= key < end`, ascending. Call [`Self::settle`] first.
    pub(crate) fn range<'a>(&'a self, start: &[u8], end: &[u8]) -> Range<'a> {
        debug_assert!(
            self.recent_sorted || self.recent.is_empty(),
            "marks not settled"
        );
        let within = |run: &'a [Mark]| {
            let from = run.partition_point(|(k, _)| k.as_slice() < start);
            let to = from + run[from..].partition_point(|(k, _)| k.as_slice() < end);
            &run[from..to]
        };
        Range {
            settled: within(&self.settled),
            recent: within(&self.recent),
        }
    }

    /// Every entry, ascending, one per key.
    pub(crate) fn into_sorted(mut self) -> Vec<Mark> {
        self.settle();
        self.merge();
        self.settled
    }

    /// Merges the (sorted) recent run into the settled one; a key in both keeps its recent
    /// write.
    fn merge(&mut self) {
        debug_assert!(self.recent_sorted || self.recent.is_empty());
        if self.recent.is_empty() {
            return;
        }
        if self.settled.is_empty() {
            std::mem::swap(&mut self.settled, &mut self.recent);
            return;
        }
        let mut merged = Vec::with_capacity(self.settled.len() + self.recent.len());
        let mut settled = std::mem::take(&mut self.settled).into_iter().peekable();
        for mark in self.recent.drain(..) {
            while let Some(old) = settled.next_if(|(k, _)| *k < mark.0) {
                merged.push(old);
            }
            settled.next_if(|(k, _)| *k == mark.0);
            merged.push(mark);
        }
        merged.extend(settled);
        self.settled = merged;
    }
}

/// The entries of [`Marks::range`]: its two runs' entries in the range, merged.
pub(crate) struct Range<'a> {
    settled: &'a [Mark],
    recent: &'a [Mark],
}

impl<'a> Iterator for Range<'a> {
    type Item = (&'a [u8], bool);

    fn next(&mut self) -> Option<Self::Item> {
        let from_recent = match (self.settled.first(), self.recent.first()) {
            (None, None) => return None,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(old), Some(new)) => match old.0.cmp(&new.0) {
                Ordering::Less => false,
                Ordering::Greater => true,
                Ordering::Equal => {
                    // The recent write of the key replaces the settled one.
                    self.settled = &self.settled[1..];
                    true
                }
            },
        };
        let run = if from_recent {
            &mut self.recent
        } else {
            &mut self.settled
        };
        let ((key, put), rest) = run.split_first()?;
        *run = rest;
        Some((key.as_slice(), *put))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A small deterministic generator (xorshift).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn key(n: u64, long: bool) -> SmallBytes {
        // Long keys live on the heap, short ones inline: both orders must agree.
        let mut k = n.to_be_bytes().to_vec();
        if long {
            k.extend_from_slice(&[7; 40]);
        }
        SmallBytes::new(&k)
    }

    /// Writes, reads of ranges and the final order agree with a B-tree given the same
    /// writes, whatever the mix of repeated keys, reads between writes and run lengths
    /// around the settling thresholds.
    #[test]
    fn marks_read_and_end_as_a_btree_of_the_same_writes() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for round in 0..40 {
            let mut marks = Marks::default();
            let mut model: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
            let writes = [10, 1000, 5000, 20_000][round % 4];
            let keys = [5, 300, 4000, 50_000][(round / 4) % 4];
            let long = round % 3 == 0;
            for i in 0..writes {
                let k = key(rng.below(keys), long);
                let put = rng.below(3) != 0;
                model.insert(k.to_vec(), put);
                marks.mark(k, put);
                if rng.below(writes / 4 + 1) == 0 || i + 1 == writes {
                    marks.settle();
                    let (a, b) = (rng.below(keys + 2), rng.below(keys + 2));
                    let (start, end) = (key(a.min(b), long), key(a.max(b), long));
                    let got: Vec<(Vec<u8>, bool)> = marks
                        .range(&start, &end)
                        .map(|(k, put)| (k.to_vec(), put))
                        .collect();
                    let want: Vec<(Vec<u8>, bool)> = model
                        .range(start.to_vec()..end.to_vec())
                        .map(|(k, put)| (k.clone(), *put))
                        .collect();
                    assert_eq!(got, want, "round {round}, after {i} writes");
                    assert!(marks.len_bound() >= model.len());
                }
            }
            assert_eq!(marks.len(), model.len(), "round {round}");
            let all: Vec<(Vec<u8>, bool)> = marks
                .into_sorted()
                .into_iter()
                .map(|(k, put)| (k.into_vec(), put))
                .collect();
            let want: Vec<(Vec<u8>, bool)> = model.into_iter().collect();
            assert_eq!(all, want, "round {round}");
        }
    }

    /// One key written over and over keeps a bounded number of copies, not one per write.
    #[test]
    fn a_key_written_again_and_again_is_not_kept_once_per_write() {
        let mut marks = Marks::default();
        for i in 0..1_000_000u64 {
            marks.mark(key(1, true), i % 2 == 0);
        }
        assert!(marks.len_bound() <= RECENT_SETTLE, "{}", marks.len_bound());
        assert_eq!(marks.into_sorted(), [(key(1, true), false)]);
    }
}
