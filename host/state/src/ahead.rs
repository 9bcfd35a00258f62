//! Reading a batch's committed state ahead, all at once and in key order.
//!
//! A processor reads the same few entries of every grouping key it is called for: the
//! counter reads its value, its list's length and one map entry. Once state outgrows the
//! state cache, each of those reads that misses the cache is a point read of RocksDB that
//! finds its block in the block cache (or reads it), decompresses it, and searches it, only
//! for the next read of another key to do the same for another block. Read together and in
//! key order (RocksDB's batched `MultiGet`), the reads of a batch's keys share those steps:
//! a block is found once for all the keys it holds.
//!
//! - **What to read** is learned, not declared: a transaction notes the shape of the first
//!   point reads of committed state it makes (namespace and variable, then whatever follows
//!   the grouping key, e.g. a map entry's user key), and the checkpoint's later transactions
//!   read the shapes it read for more than one grouping key for each of their grouping keys
//!   before the first call. A shape a key does not use costs one read that finds nothing; a
//!   read no shape foresaw (a map entry named by the key's own rows) is made when it comes,
//!   as before.
//! - **Only what memory cannot answer**: the backend reads ahead just the keys a point read
//!   would not find in memory ([`KvEngine::read_ahead`]: the state cache leaves out what it
//!   holds, a backend in memory reads nothing). A sample of the first keys goes first; when
//!   nearly all of it is in memory, the rest is not looked at.
//! - **Bounded**: at most [`AHEAD_LIMIT`] bytes per transaction; keys past it are read when
//!   the processor asks for them. Freed when the transaction is sealed, once the seal has
//!   taken from it the before-images the change log needs of the keys the batch wrote
//!   (reads answered here are not kept a second time for that).
//! - **Exact**: nothing commits to a checkpoint while one of its batches runs, so what was
//!   read ahead is what a read during the batch would find. The transaction's own writes
//!   are in its overlay, which every read consults first.

use std::cell::Cell;
use std::sync::{Arc, Mutex, PoisonError};

use crate::engine::{KvEngine, PREFETCH_AHEAD};
use crate::keys;
use crate::overlay::{PrefixMap, SmallBytes};
use crate::{Result, VarId};

/// Distinct shapes a transaction learns at most.
const MAX_SHAPES: usize = 8;

/// Point reads a transaction looks at to learn shapes: the first few keys' worth.
const LEARN_READS: u32 = 64;

/// Reads made first as a sample (see [`Ahead::read`]).
const SAMPLE_READS: usize = 1024;

/// Fewer than one in this many of the sample's reads answered: the rest is not read ahead.
const SAMPLE_MISSES: usize = 16;

/// Bytes the answers read ahead may take per transaction (see [`Ahead::cost`]). Each
/// worker holds one partition's until its batch ends, beside the batch's input and overlay.
pub(crate) const AHEAD_LIMIT: usize = 128 << 20;

/// The namespaces whose point reads are learned and read ahead: value state, lists'
/// lengths, map entries.
const READ_AHEAD: [u8; 3] = [keys::VALUE, keys::LIST_META, keys::MAP];

/// Where [`Ahead::seen`] counts the reads of namespace `ns`, if it is one read ahead. Each
/// namespace has a learning window of its own: a guest holding its writes
/// (`keys.apply-writes`) appends to its lists when the held writes are sent, after many keys'
/// other reads, and a list's length, read then, fell outside a window shared by all reads.
fn learning_slot(ns: u8) -> Option<usize> {
    READ_AHEAD.iter().position(|&n| n == ns)
}

/// One kind of per-key point read: `[ns][var]`, then the grouping key with its length,
/// then `suffix`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Shape {
    ns: u8,
    var: VarId,
    suffix: SmallBytes,
}

impl Shape {
    /// The shape of `key` and its grouping key, if it is a point read of value state, a
    /// list's length or a map entry.
    fn of(key: &[u8]) -> Option<(Self, &[u8])> {
        let ns = *key.first()?;
        if !READ_AHEAD.contains(&ns) {
            return None;
        }
        let (var, grouping, suffix) = keys::decode_var_key(ns, key).ok()?;
        let suffix = SmallBytes::new(suffix);
        Some((Self { ns, var, suffix }, grouping))
    }

    /// The length of this shape's key for grouping key `key`.
    fn key_len(&self, key: &[u8]) -> usize {
        keys::VAR_KEY_OVERHEAD + key.len() + self.suffix.len()
    }

    /// Appends this shape's key for grouping key `key`.
    fn push_key(&self, out: &mut Vec<u8>, key: &[u8]) {
        keys::push_var_key(out, self.ns, self.var, key, &self.suffix);
    }
}

/// The shapes the last batch to learn any learned, shared by a checkpoint's transactions.
#[derive(Clone, Default)]
pub(crate) struct Shapes(Arc<Mutex<Arc<[Shape]>>>);

impl Shapes {
    fn get(&self) -> Arc<[Shape]> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, shapes: Vec<Shape>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = shapes.into();
    }
}

/// One transaction's reads ahead: what it learns for the next batch, and what it read for
/// this one.
pub(crate) struct Ahead {
    shapes: Shapes,
    /// Point reads looked at so far, per namespace read ahead (up to [`LEARN_READS`] each;
    /// see [`learning_slot`]).
    seen: [u32; READ_AHEAD.len()],
    /// Shapes seen, each with the first grouping key it was seen for, and whether it was
    /// seen for another key too.
    learned: Vec<(Shape, SmallBytes, bool)>,
    /// Committed bytes (`None`: none) by full key.
    found: PrefixMap<Option<SmallBytes>>,
    /// The shapes [`Self::read`] read ahead (those learned before the batch): what
    /// [`Self::prefetch`] asks for.
    reading: Vec<Shape>,
}

impl Ahead {
    pub(crate) fn new(shapes: Shapes) -> Self {
        Self {
            shapes,
            seen: [0; READ_AHEAD.len()],
            learned: Vec::new(),
            found: PrefixMap::default(),
            reading: Vec::new(),
        }
    }

    /// Bytes one answer takes besides a long value's heap copy: its table slot (and an
    /// eighth more for the table's free slots), its control byte, a long key's heap copy;
    /// and while the read runs, the key in the read's buffer and in its list of keys.
    fn cost(key_len: usize) -> usize {
        size_of::<(SmallBytes, Option<SmallBytes>)>() * 9 / 8
            + 1
            + SmallBytes::heap_len(key_len)
            + key_len
            + size_of::<usize>()
            + size_of::<&[u8]>()
    }

    /// Notes a point read of committed state at `key`, while learning.
    #[inline]
    pub(crate) fn note(&mut self, key: &[u8]) {
        let Some(slot) = key.first().copied().and_then(learning_slot) else {
            return;
        };
        if self.seen[slot] >= LEARN_READS {
            return;
        }
        self.seen[slot] += 1;
        let Some((shape, grouping)) = Shape::of(key) else {
            return;
        };
        let full = self.learned.len() >= MAX_SHAPES;
        match self.learned.iter_mut().find(|(s, _, _)| *s == shape) {
            Some((_, first, again)) => *again |= **first != *grouping,
            None if !full => self.learned.push((shape, SmallBytes::new(grouping), false)),
            None => {}
        }
    }

    /// Ends the batch's reads: frees what was read ahead, and hands the shapes this
    /// transaction read for more than one grouping key to the checkpoint's next
    /// transactions. A shape seen for one key only is left out: its suffix may be that
    /// key's own (a map keyed by the event's id, as `dedup-ttl`'s), which no other key
    /// reads. A batch that learned nothing (read nothing committed, or one key only) leaves
    /// the last shapes.
    pub(crate) fn finish(&mut self) {
        self.found = PrefixMap::default();
        let shapes: Vec<Shape> = std::mem::take(&mut self.learned)
            .into_iter()
            .filter_map(|(shape, _, again)| again.then_some(shape))
            .collect();
        if !shapes.is_empty() {
            self.shapes.set(shapes);
        }
    }

    /// Reads kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.found.len()
    }

    /// What was read ahead at `key`: `Some(None)` when it was read and found nothing,
    /// `None` when it was not read ahead.
    #[inline]
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        if self.found.is_empty() {
            return None;
        }
        self.found.get(key).map(|v| v.as_deref())
    }

    /// Hints `engine` that grouping key `key`'s learned shapes are read next
    /// ([`KvEngine::prefetch`]), building each key in `buf`, and asks for their slots among
    /// the answers read ahead. Called for the next key while the current one's handler runs,
    /// the reads of the next find their slots in the CPU's caches: a processor reads each
    /// key's state once per batch, and every such read was a cache miss.
    pub(crate) fn prefetch(&self, engine: &dyn KvEngine, key: &[u8], buf: &mut Vec<u8>) {
        for shape in &self.reading {
            buf.clear();
            shape.push_key(buf, key);
            engine.prefetch(buf);
            // Past the cache, the read is answered from what was read ahead.
            if !self.found.is_empty() {
                self.found.prefetch(buf);
            }
        }
    }

    /// Reads ahead the learned shapes for each of `grouping_keys` (in the order they will
    /// be called) that the backend cannot answer from memory. Replaces what an earlier call
    /// read.
    ///
    /// The first few keys go first, as a sample: when the backend answers nearly all of
    /// them from memory (the whole state is cached), the rest is not looked at, and the
    /// batch pays for a few hundred lookups only.
    pub(crate) fn read<'k>(
        &mut self,
        engine: &dyn KvEngine,
        grouping_keys: impl Iterator<Item = &'k [u8]>,
    ) -> Result<()> {
        self.found = PrefixMap::default();
        let mut shapes = self.shapes.get().to_vec();
        self.reading.clone_from(&shapes);
        if shapes.is_empty() {
            return Ok(());
        }
        // The store's order: by namespace and variable first.
        shapes.sort_unstable_by(|a, b| (a.ns, a.var, &*a.suffix).cmp(&(b.ns, b.var, &*b.suffix)));
        // Keys are charged as they are taken, values as they arrive.
        let room = Cell::new(AHEAD_LIMIT);
        let mut grouping_keys = grouping_keys.take_while(|key| {
            let cost: usize = shapes.iter().map(|s| Self::cost(s.key_len(key))).sum();
            let left = room.get().checked_sub(cost);
            room.set(left.unwrap_or(0));
            left.is_some()
        });
        let sample: Vec<&[u8]> = grouping_keys
            .by_ref()
            .take(SAMPLE_READS.div_ceil(shapes.len()))
            .collect();
        let asked = sample.len() * shapes.len();
        let answered = self.read_keys(engine, &shapes, &sample, &room)?;
        if sample.is_empty() || answered * SAMPLE_MISSES < asked {
            return Ok(());
        }
        let mut rest: Vec<&[u8]> = grouping_keys.collect();
        // Sorted as the layout orders grouping keys (by length first): consecutive reads of
        // one shape then go to consecutive keys of the store.
        rest.sort_unstable_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        // Room for as many answers per key as the sample had, made once.
        self.found.reserve(rest.len() * answered / sample.len());
        self.read_keys(engine, &shapes, &rest, &room)?;
        Ok(())
    }

    /// Reads ahead `shapes` (sorted) for each of `grouping_keys`, shape by shape, keeping
    /// what the backend answers while `room` lasts. Returns how many keys it answered.
    fn read_keys(
        &mut self,
        engine: &dyn KvEngine,
        shapes: &[Shape],
        grouping_keys: &[&[u8]],
        room: &Cell<usize>,
    ) -> Result<usize> {
        // Every key in one buffer, not an allocation each.
        let mut buf = Vec::new();
        let mut ends = Vec::with_capacity(grouping_keys.len() * shapes.len());
        for shape in shapes {
            for key in grouping_keys {
                shape.push_key(&mut buf, key);
                ends.push(buf.len());
            }
        }
        let mut keys = Vec::with_capacity(ends.len());
        let mut start = 0;
        for &end in &ends {
            keys.push(&buf[start..end]);
            start = end;
        }
        let found = &mut self.found;
        let mut answered = 0;
        engine.read_ahead(&keys, &mut |i, v| {
            // The answers come in order: the slot of one a few ahead overlaps this one's.
            if let Some(ahead) = keys.get(i + PREFETCH_AHEAD) {
                found.prefetch(ahead);
            }
            answered += 1;
            let heap = SmallBytes::heap_len(v.map_or(0, <[u8]>::len));
            if let Some(left) = room.get().checked_sub(heap) {
                room.set(left);
                *found.get_or_default(keys[i]) = v.map(SmallBytes::new);
            }
            Ok(())
        })?;
        Ok(answered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_key(var: u32, key: &[u8], user_key: &[u8]) -> Vec<u8> {
        let mut k = keys::var_key_prefix(keys::MAP, var, key);
        k.extend_from_slice(user_key);
        k
    }

    #[test]
    fn shapes_read_for_one_grouping_key_only_are_not_learned() {
        let shapes = Shapes::default();
        let mut ahead = Ahead::new(shapes.clone());
        for key in [&b"a"[..], b"b", b"c"] {
            ahead.note(&keys::var_key_prefix(keys::VALUE, 1, key));
            // A map entry every key reads, and one named by the key itself.
            ahead.note(&map_key(2, key, b"calls"));
            ahead.note(&map_key(3, key, key));
        }
        // A timer is no per-key read of state.
        ahead.note(&keys::timer_by_key(b"a", 5));
        ahead.finish();
        let learned: Vec<Vec<u8>> = shapes
            .get()
            .iter()
            .map(|s| {
                let mut k = Vec::new();
                s.push_key(&mut k, b"z");
                k
            })
            .collect();
        assert_eq!(
            learned,
            [
                keys::var_key_prefix(keys::VALUE, 1, b"z"),
                map_key(2, b"z", b"calls")
            ]
        );

        // A batch that read for one key only leaves what the last one learned.
        let mut one = Ahead::new(shapes.clone());
        one.note(&keys::var_key_prefix(keys::VALUE, 7, b"a"));
        one.note(&keys::var_key_prefix(keys::VALUE, 7, b"a"));
        one.finish();
        assert_eq!(shapes.get().len(), 2);
    }

    #[test]
    fn a_namespace_first_read_late_in_the_batch_is_still_learned() {
        // As a guest holding its writes reads: every key's value and map entry first, the
        // lists' lengths only when the held appends are sent.
        let shapes = Shapes::default();
        let mut ahead = Ahead::new(shapes.clone());
        let keys: Vec<Vec<u8>> = (0..2 * LEARN_READS).map(|i| i.to_string().into()).collect();
        for key in &keys {
            ahead.note(&keys::var_key_prefix(keys::VALUE, 1, key));
            ahead.note(&map_key(3, key, b"calls"));
        }
        for key in &keys[..3] {
            ahead.note(&keys::var_key_prefix(keys::LIST_META, 2, key));
        }
        ahead.finish();
        let namespaces: Vec<(u8, u32)> = shapes.get().iter().map(|s| (s.ns, s.var)).collect();
        assert_eq!(
            namespaces,
            [(keys::VALUE, 1), (keys::MAP, 3), (keys::LIST_META, 2)]
        );
    }
}
