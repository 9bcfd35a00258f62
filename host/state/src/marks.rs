//! A batch's writes to the ordered index namespaces (timers by time, the TTL index):
//! appended as they come, put in order only when something reads them in order.
//!
//! A batch writes these entries in no useful order (each key's timer at its own time, each
//! value's index entry at its own expiry) and reads them in order only to fire timers, to
//! clean up TTL and at its seal. A B-tree kept them in order on every write: a descent
//! through its nodes comparing whole keys, most of them on the heap for the TTL index
//! (`BTreeMap::insert` was 6.8% of `bench ttl`'s samples). Here a write is a push onto a
//! list of recent writes. A reader (or every few thousand writes) sorts that list, stably so
//! that the last write of a key wins, into a sorted run of its own, and merges runs of
//! similar length as a binary counter adds: a batch holds about log2 of its entries' number
//! of runs, a write is merged about as many times, and a reader merges the runs' heads as
//! it goes. Firing a million timers page by page (each page's deletes written before the
//! next page is read) thus costs O(n log n), not a merge of everything per page.

use crate::overlay::{SmallBytes, sort_by_bytes};

/// Writes the recent run takes before it is sorted into a run of its own.
const RECENT_SETTLE: usize = 4096;

/// One entry: its key, and `true` to put it (empty) or `false` to delete it.
type Mark = (SmallBytes, bool);

/// The ordered index writes of one batch (see the module documentation).
#[derive(Default)]
pub(crate) struct Marks {
    /// Sorted runs, one entry per key each, oldest first; each more than twice as long as
    /// the next, so there are at most about log2 of the entries. A key in several runs has
    /// the write of the newest.
    runs: Vec<Vec<Mark>>,
    /// The writes since the last settling, in write order.
    recent: Vec<Mark>,
    /// The least key of each settling's writes, in settling order (see
    /// [`Self::least_written_since`]).
    settlings: Vec<SmallBytes>,
}

impl Marks {
    /// Puts (`true`) or deletes the entry at `key`; a later write of a key replaces an
    /// earlier one.
    pub(crate) fn mark(&mut self, key: SmallBytes, put: bool) {
        self.recent.push((key, put));
        if self.recent.len() >= RECENT_SETTLE {
            self.settle();
        }
    }

    /// At least the number of distinct keys written: a key in several runs counts once
    /// per run.
    pub(crate) fn len_bound(&self) -> usize {
        self.runs.iter().map(Vec::len).sum::<usize>() + self.recent.len()
    }

    /// Puts the writes in order for [`Self::range`]: the recent ones are sorted into a run
    /// of their own, merged with the runs before it while it is at least half as long as
    /// the one before (so each write is merged about log2 times over a batch).
    pub(crate) fn settle(&mut self) {
        if self.recent.is_empty() {
            return;
        }
        // Stable: of a key's writes, the last stays last.
        let mut run = sort_by_bytes(std::mem::take(&mut self.recent), |(k, _)| k);
        run.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = later.1;
            }
            same
        });
        if let Some((least, _)) = run.first() {
            self.settlings.push(least.clone());
        }
        self.runs.push(run);
        while let [.., older, newer] = &self.runs[..] {
            if newer.len() * 2 < older.len() {
                break;
            }
            self.merge_newest_two();
        }
    }

    /// Settles, then returns the least key written since the settling numbered `from`
    /// (`None`: nothing was), and the number of settlings so far, to pass as `from` the
    /// next time.
    pub(crate) fn least_written_since(&mut self, from: usize) -> (Option<SmallBytes>, usize) {
        self.settle();
        let least = self
            .settlings
            .get(from..)
            .and_then(|s| s.iter().min())
            .cloned();
        (least, self.settlings.len())
    }

    /// The number of distinct keys written.
    pub(crate) fn len(&mut self) -> usize {
        self.settle_all();
        self.runs.first().map_or(0, Vec::len)
    }

    /// The entries with `start <= key < end`, ascending. Call [`Self::settle`] first.
    pub(crate) fn range<'a>(&'a self, start: &[u8], end: &[u8]) -> Range<'a> {
        debug_assert!(self.recent.is_empty(), "marks not settled");
        let runs = self
            .runs
            .iter()
            .map(|run| {
                let from = run.partition_point(|(k, _)| k.as_slice() < start);
                let to = from + run[from..].partition_point(|(k, _)| k.as_slice() < end);
                &run[from..to]
            })
            .filter(|run| !run.is_empty())
            .collect();
        Range { runs }
    }

    /// Every entry, ascending, one per key.
    pub(crate) fn into_sorted(mut self) -> Vec<Mark> {
        self.settle_all();
        self.runs.pop().unwrap_or_default()
    }

    /// Settles the recent writes and merges every run into one.
    fn settle_all(&mut self) {
        self.settle();
        while self.runs.len() > 1 {
            self.merge_newest_two();
        }
    }

    /// Merges the two newest runs into one.
    fn merge_newest_two(&mut self) {
        let newer = self.runs.pop().unwrap_or_default();
        let older = self.runs.pop().unwrap_or_default();
        self.runs.push(merge(older, newer));
    }
}

/// Two sorted runs as one; a key in both keeps its write in `newer`.
fn merge(older: Vec<Mark>, newer: Vec<Mark>) -> Vec<Mark> {
    if older.is_empty() {
        return newer;
    }
    let mut merged = Vec::with_capacity(older.len() + newer.len());
    let mut older = older.into_iter().peekable();
    for mark in newer {
        while let Some(old) = older.next_if(|(k, _)| *k < mark.0) {
            merged.push(old);
        }
        older.next_if(|(k, _)| *k == mark.0);
        merged.push(mark);
    }
    merged.extend(older);
    merged
}

/// The entries of [`Marks::range`]: the runs' entries in the range, merged; of a key in
/// several runs, the newest run's.
pub(crate) struct Range<'a> {
    /// Oldest first, none empty.
    runs: Vec<&'a [Mark]>,
}

impl<'a> Iterator for Range<'a> {
    type Item = (&'a [u8], bool);

    fn next(&mut self) -> Option<Self::Item> {
        // The least key at the runs' heads, from the newest run holding it.
        let mut least: Option<&'a Mark> = None;
        for run in &self.runs {
            let head = &run[0];
            if least.is_none_or(|l| head.0 <= l.0) {
                least = Some(head);
            }
        }
        let (key, put) = least?;
        // Past that key in every run holding it.
        for run in &mut self.runs {
            if run[0].0 == *key {
                *run = &run[1..];
            }
        }
        self.runs.retain(|run| !run.is_empty());
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
    /// writes, whatever the mix of repeated keys, reads between writes (each settling the
    /// writes before it into a run) and run lengths around the settling threshold.
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
                    // Each run is more than twice as long as the next.
                    let bound = usize::BITS - marks.len_bound().leading_zeros();
                    assert!(
                        marks.runs.len() as u32 <= bound,
                        "{} runs",
                        marks.runs.len()
                    );
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
