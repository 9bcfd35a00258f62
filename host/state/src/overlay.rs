//! The building blocks of the batch overlay: short byte strings without a heap allocation,
//! and the small ordered maps that hold one collection's buffered writes.
//!
//! Everything a state operation touches lives under one `(namespace, variable, grouping key)`
//! prefix, so the overlay is a hash map from that prefix to a [`Coll`] (or a value slot) and
//! ordered structures are only ever as big as one collection's writes in one batch.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::collections::btree_map;
use std::fmt;
use std::hash::BuildHasher;
use std::ops::Bound::{self, Excluded, Included, Unbounded};
use std::ops::Deref;
use std::slice;

use hashbrown::DefaultHashBuilder;
use hashbrown::hash_table::{Entry, HashTable};
use smallvec::SmallVec;

use crate::Result;
use crate::engine::{KvEngine, PREFETCH_AHEAD, ScanFn, SlotHint, prefetch_value};
use crate::keys;

/// A buffered write: `Some(bytes)` puts, `None` deletes.
pub(crate) type Slot = Option<Vec<u8>>;

/// Bytes stored inline up to this length: a grouping key prefix of a short key, a list
/// sequence, a typical map user key.
const INLINE: usize = 30;

/// An immutable byte string, inline when short. Hashes, compares and orders like `[u8]`.
#[derive(Clone)]
pub(crate) enum SmallBytes {
    Inline { len: u8, buf: [u8; INLINE] },
    Heap(Box<[u8]>),
}

const _: () = assert!(size_of::<SmallBytes>() == 32);

impl SmallBytes {
    #[inline]
    pub(crate) fn new(bytes: &[u8]) -> Self {
        match u8::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= INLINE => {
                let mut buf = [0; INLINE];
                buf[..bytes.len()].copy_from_slice(bytes);
                Self::Inline { len, buf }
            }
            _ => Self::Heap(bytes.into()),
        }
    }

    /// The concatenation of `parts`, without a temporary buffer when it fits inline.
    #[inline]
    pub(crate) fn from_parts(parts: &[&[u8]]) -> Self {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        match u8::try_from(len) {
            Ok(short) if len <= INLINE => {
                let mut buf = [0; INLINE];
                let mut at = 0;
                for part in parts {
                    buf[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
                Self::Inline { len: short, buf }
            }
            _ => Self::Heap(parts.concat().into_boxed_slice()),
        }
    }

    /// Bytes a string of `len` bytes takes on the heap: none when it is inline.
    pub(crate) fn heap_len(len: usize) -> usize {
        if len <= INLINE { 0 } else { len }
    }

    /// The bytes as a vector: a heap string's own buffer, not a copy.
    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self {
            Self::Inline { len, buf } => buf[..usize::from(len)].to_vec(),
            Self::Heap(b) => b.into_vec(),
        }
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Self::Inline { len, buf } => &buf[..usize::from(*len)],
            Self::Heap(b) => b,
        }
    }
}

impl Deref for SmallBytes {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Borrow<[u8]> for SmallBytes {
    #[inline]
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl From<&[u8]> for SmallBytes {
    #[inline]
    fn from(bytes: &[u8]) -> Self {
        Self::new(bytes)
    }
}

impl PartialEq for SmallBytes {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for SmallBytes {}

impl PartialOrd for SmallBytes {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SmallBytes {
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            // Zero padding keeps byte order: where one string ends and the other goes on,
            // the padding byte is at most the other's byte, and on a tie the shorter sorts
            // first. Four word compares instead of a `memcmp` call.
            (Self::Inline { len: a, buf: x }, Self::Inline { len: b, buf: y }) => {
                words(x).cmp(&words(y)).then(a.cmp(b))
            }
            _ => self.as_slice().cmp(other.as_slice()),
        }
    }
}

/// The inline buffer as big-endian words; the last overlaps the third (a tie on the third
/// means the overlapped bytes are equal).
#[inline]
fn words(buf: &[u8; INLINE]) -> [u64; 4] {
    let word = |at: usize| {
        let mut w = [0; 8];
        w.copy_from_slice(&buf[at..at + 8]);
        u64::from_be_bytes(w)
    };
    [word(0), word(8), word(16), word(INLINE - 8)]
}

impl fmt::Debug for SmallBytes {
    /// Length only: keys belong to tenants and are never logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SmallBytes({} bytes)", self.len())
    }
}

/// A hash map from byte-string keys (key prefixes) to `V`, probed with borrowed keys: a key
/// is copied into the map only when it is new.
pub(crate) struct PrefixMap<V> {
    table: HashTable<(SmallBytes, V)>,
    hasher: DefaultHashBuilder,
    /// Where the table's slots are, for [`Self::prefetch`].
    slots: SlotHint,
}

impl<V> Default for PrefixMap<V> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            slots: SlotHint::default(),
        }
    }
}

impl<V: Default> PrefixMap<V> {
    pub(crate) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    #[inline]
    pub(crate) fn get(&self, key: &[u8]) -> Option<&V> {
        let hash = self.hasher.hash_one(key);
        self.table
            .find(hash, |(k, _)| k.as_slice() == key)
            .map(|(_, v)| v)
    }

    /// Hints the CPU to fetch the slot where a lookup (or an insert) of `key` starts (see
    /// [`SlotHint`]), for a lookup a little later.
    #[inline]
    pub(crate) fn prefetch(&self, key: &[u8]) {
        self.slots.follow(&self.table);
        self.slots
            .prefetch::<(SmallBytes, V)>(self.hasher.hash_one(key));
    }

    /// The value at `key`, inserting a default one if there is none.
    #[inline]
    pub(crate) fn get_or_default(&mut self, key: &[u8]) -> &mut V {
        match self.entry(key) {
            Entry::Occupied(e) => &mut e.into_mut().1,
            Entry::Vacant(e) => &mut e.insert((SmallBytes::new(key), V::default())).into_mut().1,
        }
    }

    /// Applies `f` to the value at `key`, a default one if the key is new. A new value is
    /// built outside the table and written into its slot after `f`, never read back from it:
    /// a new entry's slot is a cold line, and reading it right after writing it waited for
    /// the line the write was still fetching (in a profile of `bench timers`, nearly all of
    /// a value write's own time).
    #[inline]
    pub(crate) fn with_value<R>(&mut self, key: &[u8], f: impl FnOnce(&mut V) -> R) -> R {
        match self.entry(key) {
            Entry::Occupied(mut e) => f(&mut e.get_mut().1),
            Entry::Vacant(e) => {
                let mut value = V::default();
                let out = f(&mut value);
                e.insert((SmallBytes::new(key), value));
                out
            }
        }
    }

    /// The table's entry for `key`.
    #[inline]
    fn entry(&mut self, key: &[u8]) -> Entry<'_, (SmallBytes, V)> {
        let hasher = &self.hasher;
        self.table.entry(
            hasher.hash_one(key),
            |(k, _)| k.as_slice() == key,
            |(k, _)| hasher.hash_one(k.as_slice()),
        )
    }

    /// Makes room for `additional` more entries, so inserting them does not grow the
    /// table (each growth rehashes every entry in it). A hint: if the room cannot be had,
    /// nothing changes.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let hasher = &self.hasher;
        // Failing is harmless: inserts grow the table as they need.
        let _ = self
            .table
            .try_reserve(additional, |(k, _)| hasher.hash_one(k.as_slice()));
    }

    /// Every entry, ascending by key, consumed.
    pub(crate) fn into_sorted(self) -> Vec<(SmallBytes, V)> {
        let all: Vec<(SmallBytes, V)> = self.table.into_iter().collect();
        sort_by_bytes(all, |(k, _)| k)
    }
}

/// Sorts `items` ascending by the byte string `key` gives each, stably: items with equal
/// keys keep their order.
///
/// An index sort: each key's first 16 bytes as two big-endian words beside its position
/// (24 bytes an entry) are sorted, by a radix sort over the bytes that differ when there
/// are many ([`sort_words`]), runs of entries that tie go on by their next 16 bytes, and
/// the items are then moved into that order once. Sealing a batch sorts one entry per
/// variable and grouping key written (~75k a partition in the counter workload), and
/// sorting those in place moved ~70-byte entries at every swap and compared four words and
/// the lengths each time (`bench/HISTORY.md`, "Seal sorts by index").
pub(crate) fn sort_by_bytes<T>(mut items: Vec<T>, key: impl Fn(&T) -> &[u8]) -> Vec<T> {
    let Ok(len) = u32::try_from(items.len()) else {
        items.sort_by(|a, b| key(a).cmp(key(b)));
        return items;
    };
    let mut order: Vec<(u64, u64, u32)> = (0..len)
        .map(|i| {
            let (hi, lo) = words_from(key(&items[i as usize]), 0);
            (hi, lo, i)
        })
        .collect();
    sort_ties_from(&mut order, &|i| key(&items[i as usize]), 0);
    // Gathered in order into a new vector: each item moves once, and the next ones are
    // fetched ahead (in place, following the permutation's cycles, every swap was two
    // cache misses).
    let mut slots: Vec<Option<T>> = items.into_iter().map(Some).collect();
    let mut sorted = Vec::with_capacity(slots.len());
    for (n, &(_, _, i)) in order.iter().enumerate() {
        if let Some(&(_, _, ahead)) = order.get(n + PREFETCH_AHEAD) {
            prefetch_value(&slots[ahead as usize]);
        }
        sorted.extend(slots[i as usize].take());
    }
    sorted
}

/// Past this many bytes of tied prefixes, the entries still tied are sorted by comparing
/// their whole keys: a bound on the recursion for long keys that share long prefixes.
const TIE_DEPTH_MAX: usize = 256;

/// Sorts `order`, whose words hold the keys' bytes from `depth` on, by key, then position.
fn sort_ties_from<'k>(order: &mut [(u64, u64, u32)], key: &impl Fn(u32) -> &'k [u8], depth: usize) {
    sort_words(order);
    let mut rest = order;
    while let [(hi, lo, _), ..] = *rest {
        let run = rest
            .iter()
            .position(|&(h, l, _)| (h, l) != (hi, lo))
            .unwrap_or(rest.len());
        let (tied, after) = std::mem::take(&mut rest).split_at_mut(run);
        rest = after;
        if tied.len() < 2 {
            continue;
        }
        // Equal through `next`, counting the zero padding past a key's end.
        let next = depth + 16;
        if tied.iter().all(|e| key(e.2).len() <= next) {
            // Then each is the others' prefix, zeros beyond: the shorter sorts first.
            tied.sort_unstable_by_key(|e| (key(e.2).len(), e.2));
        } else if next >= TIE_DEPTH_MAX {
            tied.sort_unstable_by(|a, b| key(a.2).cmp(key(b.2)).then(a.2.cmp(&b.2)));
        } else {
            for e in tied.iter_mut() {
                (e.0, e.1) = words_from(key(e.2), next);
            }
            sort_ties_from(tied, key, next);
        }
    }
}

/// From this many entries on, [`sort_words`] sorts by radix.
const RADIX_MIN: usize = 256;

/// Sorts `order` by its words, then its positions.
///
/// Many entries are sorted by radix, least significant byte first, one pass per byte that
/// is not the same in every entry: a seal's keys share most of their first 16 bytes (the
/// variable's number and the key's length, the JSON text's opening), so the variable and
/// a few bytes of the key tell them apart. Each pass counts the entries of each value of
/// its byte, then moves each entry once. The passes are stable, and [`sort_ties_from`]
/// hands over entries in ascending positions (all of them at first; then each run of ties,
/// as the sort before left it), so equal words stay in position order; entries in any
/// other order take the comparison sort, which compares the positions too.
fn sort_words(order: &mut [(u64, u64, u32)]) {
    if order.len() < RADIX_MIN || !order.is_sorted_by_key(|e| e.2) {
        order.sort_unstable();
        return;
    }
    let (hi0, lo0, _) = order[0];
    let (mut hi_differs, mut lo_differs) = (0u64, 0u64);
    for &(hi, lo, _) in order.iter() {
        hi_differs |= hi ^ hi0;
        lo_differs |= lo ^ lo0;
    }
    // The bytes that differ somewhere, least significant first: `(word, shift)`, word 1
    // the low one.
    let digits: Vec<(usize, u32)> = [(1, lo_differs), (0, hi_differs)]
        .into_iter()
        .flat_map(|(word, differs)| {
            (0..64)
                .step_by(8)
                .filter(move |shift| (differs >> shift) & 0xff != 0)
                .map(move |shift| (word, shift))
        })
        .collect();
    let mut spare = order.to_vec();
    let mut in_spare = false;
    for (word, shift) in digits {
        let (from, to) = if in_spare {
            (&spare[..], &mut order[..])
        } else {
            (&order[..], &mut spare[..])
        };
        if word == 0 {
            radix_pass(from, to, |e| (e.0 >> shift) as u8);
        } else {
            radix_pass(from, to, |e| (e.1 >> shift) as u8);
        }
        in_spare = !in_spare;
    }
    if in_spare {
        order.copy_from_slice(&spare);
    }
}

/// Moves `from`'s entries into `to` ordered by the byte `byte` gives each, stably.
#[inline]
fn radix_pass(
    from: &[(u64, u64, u32)],
    to: &mut [(u64, u64, u32)],
    byte: impl Fn(&(u64, u64, u32)) -> u8,
) {
    let mut places = [0u32; 256];
    for e in from {
        places[usize::from(byte(e))] += 1;
    }
    // Each byte's first place.
    let mut at = 0;
    for p in &mut places {
        (*p, at) = (at, at + *p);
    }
    for e in from {
        let place = &mut places[usize::from(byte(e))];
        to[*place as usize] = *e;
        *place += 1;
    }
}

/// Bytes `at..at + 16` of `bytes` as two big-endian words, zero past its end.
#[inline]
fn words_from(bytes: &[u8], at: usize) -> (u64, u64) {
    let tail = bytes.get(at..).unwrap_or_default();
    if let Some((hi, rest)) = tail.split_first_chunk::<8>()
        && let Some((lo, _)) = rest.split_first_chunk::<8>()
    {
        return (u64::from_be_bytes(*hi), u64::from_be_bytes(*lo));
    }
    let mut buf = [0u8; 16];
    let n = tail.len().min(16);
    buf[..n].copy_from_slice(&tail[..n]);
    let (hi, lo) = buf.split_at(8);
    (
        u64::from_be_bytes(hi.try_into().expect("8 bytes")),
        u64::from_be_bytes(lo.try_into().expect("8 bytes")),
    )
}

/// Up to this many entries a collection's writes live in a sorted vector; beyond, in a
/// B-tree (so a batch that fills one huge map stays `O(n log n)`).
const SMALL_MAX: usize = 32;

/// A collection's entries while few: the first in the collection itself. A batch mostly
/// writes one entry per collection and key (an appended element, a map entry), and reaching it
/// through a vector of its own cost a cache miss per collection when the batch is sealed.
pub(crate) type SmallEntries = SmallVec<[(SmallBytes, Slot); 1]>;

/// One collection's buffered writes, by key suffix (after the collection's prefix).
#[derive(Debug)]
pub(crate) enum Entries {
    Small(SmallEntries),
    Large(BTreeMap<SmallBytes, Slot>),
}

impl Default for Entries {
    fn default() -> Self {
        Self::Small(SmallEntries::new())
    }
}

impl Entries {
    pub(crate) fn get(&self, suffix: &[u8]) -> Option<&Slot> {
        match self {
            Self::Small(v) => v
                .binary_search_by(|(k, _)| k.as_slice().cmp(suffix))
                .ok()
                .map(|i| &v[i].1),
            Self::Large(m) => m.get(suffix),
        }
    }

    /// Sets `suffix` to `slot`; returns whether the suffix was new.
    pub(crate) fn insert(&mut self, suffix: &[u8], slot: Slot) -> bool {
        match self {
            Self::Small(v) => {
                // Appends (list elements, ascending sequences) hit the first branch.
                let pos = match v.last() {
                    Some((last, _)) if last.as_slice() < suffix => Err(v.len()),
                    None => Err(0),
                    Some(_) => v.binary_search_by(|(k, _)| k.as_slice().cmp(suffix)),
                };
                match pos {
                    Ok(i) => {
                        v[i].1 = slot;
                        false
                    }
                    Err(i) => {
                        if v.len() < SMALL_MAX {
                            v.insert(i, (SmallBytes::new(suffix), slot));
                        } else {
                            let mut m: BTreeMap<SmallBytes, Slot> =
                                std::mem::take(v).into_iter().collect();
                            m.insert(SmallBytes::new(suffix), slot);
                            *self = Self::Large(m);
                        }
                        true
                    }
                }
            }
            Self::Large(m) => match m.get_mut(suffix) {
                Some(old) => {
                    *old = slot;
                    false
                }
                None => {
                    m.insert(SmallBytes::new(suffix), slot);
                    true
                }
            },
        }
    }

    /// Removes `suffix`; returns whether it was there.
    pub(crate) fn remove(&mut self, suffix: &[u8]) -> bool {
        match self {
            Self::Small(v) => match v.binary_search_by(|(k, _)| k.as_slice().cmp(suffix)) {
                Ok(i) => {
                    v.remove(i);
                    true
                }
                Err(_) => false,
            },
            Self::Large(m) => m.remove(suffix).is_some(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Small(v) => v.len(),
            Self::Large(m) => m.len(),
        }
    }

    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }

    /// Entries with suffix after `from`, ascending.
    pub(crate) fn range(&self, from: Bound<&[u8]>) -> EntriesIter<'_> {
        match self {
            Self::Small(v) => {
                let start = match from {
                    Unbounded => 0,
                    Included(s) => v.partition_point(|(k, _)| k.as_slice() < s),
                    Excluded(s) => v.partition_point(|(k, _)| k.as_slice() <= s),
                };
                EntriesIter::Small(v[start..].iter())
            }
            Self::Large(m) => EntriesIter::Large(m.range::<[u8], _>((from, Unbounded))),
        }
    }

    /// Every entry, ascending, consumed.
    pub(crate) fn into_sorted(self) -> SmallEntries {
        match self {
            Self::Small(v) => v,
            Self::Large(m) => m.into_iter().collect(),
        }
    }
}

/// Iterator of [`Entries::range`].
pub(crate) enum EntriesIter<'a> {
    Small(slice::Iter<'a, (SmallBytes, Slot)>),
    Large(btree_map::Range<'a, SmallBytes, Slot>),
}

impl<'a> Iterator for EntriesIter<'a> {
    type Item = (&'a [u8], &'a Slot);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Self::Small(it) => it.next().map(|(k, v)| (k.as_slice(), v)),
            Self::Large(it) => it.next().map(|(k, v)| (k.as_slice(), v)),
        }
    }
}

/// What a collection's committed entries look like through the overlay.
#[derive(Debug, Default)]
pub(crate) enum Base {
    /// Committed entries show through wherever no buffered write covers them.
    #[default]
    Committed,
    /// Cleared in this batch; the committed entries (these suffixes, ascending) get point
    /// deletes at commit.
    ClearedPoints(Vec<SmallBytes>),
    /// Cleared in this batch; one range tombstone over the prefix removes the committed
    /// entries at commit.
    ClearedRange,
}

/// Up to this many committed entries, a clear writes point deletes instead of a range
/// tombstone: RocksDB pays for every range tombstone on reads until compaction, so they are
/// kept for where they save real work.
pub(crate) const POINT_DELETE_LIMIT: usize = 64;

/// The buffered writes of one list, map, or grouping key's timers.
///
/// **Invariant:** while the base is cleared, `entries` holds puts only (a delete just drops
/// the buffered put, since nothing committed is visible under it).
#[derive(Debug, Default)]
pub(crate) struct Coll {
    pub(crate) base: Base,
    pub(crate) entries: Entries,
    /// Lists only: the next element sequence, once read or set in this batch.
    pub(crate) next_seq: Option<u64>,
    /// Lists only: the list's metadata key must be written at commit.
    pub(crate) meta_dirty: bool,
    /// Lists only: the committed next sequence, once read. Every committed element's
    /// sequence is below it (a list's metadata is written with its elements and removed only
    /// with all of them), so while the base is [`Base::Committed`] an element at or after it
    /// had no value before the batch: the change log knows its before-image without a read.
    pub(crate) committed_next: Option<u64>,
}

impl Coll {
    pub(crate) fn is_cleared(&self) -> bool {
        !matches!(self.base, Base::Committed)
    }

    /// Buffers `slot` at `suffix`; returns the change in point writes (see
    /// [`Self::point_writes`]).
    pub(crate) fn write(&mut self, suffix: &[u8], slot: Slot) -> isize {
        let committed_delete = |deletes: &[SmallBytes]| {
            deletes
                .binary_search_by(|d| d.as_slice().cmp(suffix))
                .is_ok()
        };
        match (&self.base, slot) {
            (Base::Committed, slot) => isize::from(self.entries.insert(suffix, slot)),
            (Base::ClearedRange, Some(v)) => isize::from(self.entries.insert(suffix, Some(v))),
            (Base::ClearedRange, None) => -isize::from(self.entries.remove(suffix)),
            (Base::ClearedPoints(d), Some(v)) => {
                let shadowed = committed_delete(d);
                isize::from(self.entries.insert(suffix, Some(v)) && !shadowed)
            }
            (Base::ClearedPoints(d), None) => {
                let shadowed = committed_delete(d);
                -isize::from(self.entries.remove(suffix) && !shadowed)
            }
        }
    }

    /// Removes every entry: buffered writes, and committed entries through point deletes
    /// when there are few, else a range tombstone over `prefix`. Returns the change in point
    /// writes.
    pub(crate) fn clear(&mut self, engine: &dyn KvEngine, prefix: &[u8]) -> Result<isize> {
        let before = self.point_writes();
        if !self.is_cleared() {
            let end = keys::prefix_successor(prefix);
            let mut committed = Vec::new();
            let mut many = false;
            engine.scan(prefix, &end, &mut |k, _| {
                many = committed.len() == POINT_DELETE_LIMIT;
                if !many {
                    committed.push(SmallBytes::new(&k[prefix.len()..]));
                }
                Ok(!many)
            })?;
            self.base = if many {
                Base::ClearedRange
            } else {
                Base::ClearedPoints(committed)
            };
        }
        self.entries.clear();
        Ok(delta(before, self.point_writes()))
    }

    /// Point writes this collection adds to the commit (range tombstones and list metadata
    /// not counted).
    pub(crate) fn point_writes(&self) -> usize {
        match &self.base {
            Base::Committed | Base::ClearedRange => self.entries.len(),
            Base::ClearedPoints(d) => {
                let shadowed = d.iter().filter(|s| self.entries.get(s).is_some()).count();
                self.entries.len() + d.len() - shadowed
            }
        }
    }

    /// Calls `f(suffix, value)` for every visible entry whose suffix lies after `from`,
    /// ascending, until it returns `false`: committed entries under `prefix` (unless
    /// cleared) merged with the buffered writes (puts replace, deletes hide). Memory use is
    /// independent of the collection's size.
    pub(crate) fn scan(
        coll: Option<&Self>,
        engine: &dyn KvEngine,
        prefix: &[u8],
        from: Bound<&[u8]>,
        f: &mut ScanFn<'_>,
    ) -> Result<()> {
        let mut overlay = coll
            .map(|c| c.entries.range(from))
            .into_iter()
            .flatten()
            .peekable();
        if !coll.is_some_and(Self::is_cleared) {
            let mut start = Vec::with_capacity(prefix.len() + 16);
            start.extend_from_slice(prefix);
            match from {
                Unbounded => {}
                Included(s) => start.extend_from_slice(s),
                Excluded(s) => {
                    start.extend_from_slice(s);
                    start.push(0);
                }
            }
            let end = keys::prefix_successor(prefix);
            let mut stopped = false;
            engine.scan(&start, &end, &mut |k, v| {
                let suffix = &k[prefix.len()..];
                // Buffered entries sorting before this committed key come first.
                while let Some((ok, ov)) = overlay.next_if(|(ok, _)| *ok < suffix) {
                    if let Some(ov) = ov
                        && !f(ok, ov)?
                    {
                        stopped = true;
                        return Ok(false);
                    }
                }
                let go_on = match overlay.next_if(|(ok, _)| *ok == suffix) {
                    Some((_, Some(ov))) => f(suffix, ov)?,
                    Some((_, None)) => true,
                    None => f(suffix, v)?,
                };
                stopped = !go_on;
                Ok(go_on)
            })?;
            if stopped {
                return Ok(());
            }
        }
        for (ok, ov) in overlay {
            if let Some(ov) = ov
                && !f(ok, ov)?
            {
                break;
            }
        }
        Ok(())
    }
}

/// `after - before` as a signed change.
pub(crate) fn delta(before: usize, after: usize) -> isize {
    isize::try_from(after).unwrap_or(isize::MAX) - isize::try_from(before).unwrap_or(isize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xorshift;

    #[test]
    fn small_bytes_behave_like_slices() {
        let short = SmallBytes::new(b"abc");
        let long = SmallBytes::new(&[7; 100]);
        assert!(matches!(short, SmallBytes::Inline { .. }));
        assert!(matches!(long, SmallBytes::Heap(_)));
        assert_eq!(&*short, b"abc");
        assert_eq!(long.len(), 100);
        assert_eq!(&*SmallBytes::new(&[1; INLINE]), &[1; INLINE]);
        assert!(SmallBytes::new(b"ab") < short && short < SmallBytes::new(b"b"));
        // Ordering equals slice ordering across lengths, zero bytes and the inline limit.
        let mut all: Vec<Vec<u8>> = vec![vec![], vec![0], vec![0, 0], vec![1], vec![0xff]];
        for len in [7, 8, 9, 21, 22, 23, 24, 29, 30, 31, 40] {
            for fill in [0u8, 1, 0xff] {
                let mut v = vec![5; len];
                all.push(v.clone());
                v[len - 1] = fill;
                all.push(v.clone());
                v[len / 2] = fill;
                all.push(v);
            }
        }
        for a in &all {
            for b in &all {
                assert_eq!(
                    SmallBytes::new(a).cmp(&SmallBytes::new(b)),
                    a.cmp(b),
                    "{a:?} {b:?}"
                );
            }
        }
        // Built from parts, inline or not, it is the concatenation.
        for (a, b) in [
            (&b"ts"[..], &b"key"[..]),
            (&[1; 8], &[2; 22]),
            (&[1; 8], &[2; 23]),
        ] {
            let joined = SmallBytes::from_parts(&[a, &[], b]);
            assert_eq!(&*joined, [a, b].concat());
            assert_eq!(
                joined.len() <= INLINE,
                matches!(joined, SmallBytes::Inline { .. })
            );
            assert_eq!(joined, SmallBytes::new(&[a, b].concat()));
            assert_eq!(joined.into_vec(), [a, b].concat());
        }
    }

    #[test]
    fn prefix_map_finds_inserts_and_sorts() {
        let mut m: PrefixMap<u32> = PrefixMap::default();
        assert_eq!(m.get(b"a"), None);
        *m.get_or_default(b"b") += 2;
        *m.get_or_default(b"a") += 1;
        *m.get_or_default(&[9; 40]) += 5;
        *m.get_or_default(b"b") += 2;
        // A new key's value starts from the default and is kept; an existing key's is
        // updated in place. Either way `with_value` returns what its function returned.
        assert_eq!(m.with_value(b"c", |v| std::mem::replace(v, 7)), 0);
        assert_eq!(m.with_value(b"c", |v| std::mem::replace(v, 8)), 7);
        assert_eq!(m.with_value(b"b", |v| *v), 4);
        assert_eq!(m.get(b"c"), Some(&8));
        assert_eq!(m.get(b"b"), Some(&4));
        assert_eq!(m.get(&[9; 40]), Some(&5));
        let sorted: Vec<(Vec<u8>, u32)> = m
            .into_sorted()
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v))
            .collect();
        assert_eq!(
            sorted,
            [
                (vec![9; 40], 5),
                (b"a".to_vec(), 1),
                (b"b".to_vec(), 4),
                (b"c".to_vec(), 8)
            ]
        );
    }

    #[test]
    fn sort_by_bytes_orders_as_bytes_do() {
        // Keys that tie in their first 16 bytes and beyond (one shared prefix past the depth
        // where ties are compared whole), that end in zeros or are prefixes of others, empty,
        // and short; each with a copy of itself as payload, which must move with the key.
        let mut keys: Vec<Vec<u8>> = vec![vec![], vec![0], vec![0, 0], vec![0xff; 3]];
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        for shared in [
            0,
            5,
            15,
            16,
            17,
            31,
            32,
            40,
            TIE_DEPTH_MAX - 1,
            TIE_DEPTH_MAX + 20,
        ] {
            for _ in 0..40 {
                let rng = next();
                let mut k = vec![7; shared];
                // A short tail of few distinct bytes, zeros among them: many keys are others'
                // prefixes, and many differ only past a word boundary.
                k.extend((0..rng % 5).map(|i| [0, 1, 0xff][(rng >> (8 * i)) as usize % 3]));
                keys.push(k);
            }
        }
        keys.sort();
        keys.dedup();
        let mut want = keys.clone();
        // Shuffled, then sorted with the key's rank carried along.
        for i in (1..keys.len()).rev() {
            keys.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        let items: Vec<(SmallBytes, Vec<u8>)> = keys
            .iter()
            .map(|k| (SmallBytes::new(k), k.clone()))
            .collect();
        let items = sort_by_bytes(items, |(k, _)| k);
        for (k, payload) in &items {
            assert_eq!(k.as_slice(), payload.as_slice());
        }
        let got: Vec<Vec<u8>> = items.into_iter().map(|(k, _)| k.to_vec()).collect();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn sort_by_bytes_keeps_equal_keys_in_order_and_sorts_many_as_few() {
        // Many keys (the radix sort's side of `RADIX_MIN`) shaped as a seal's: a variable's
        // number, a length, a JSON array's text, so most of the first 16 bytes are shared;
        // some written twice or more, each with its place in the input, which must stay
        // ascending among equal keys. Then the same keys fewer than `RADIX_MIN` at a time,
        // keys of random bytes, where every byte differs somewhere, and keys that differ in
        // length only.
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let mut shaped = Vec::new();
        for _ in 0..5000 {
            let n = next();
            let text = format!("[\"k{}\"]", n % 3000);
            let mut k = ((n >> 40) % 3).to_be_bytes()[4..].to_vec();
            k.extend_from_slice(&(text.len() as u32).to_be_bytes());
            k.extend_from_slice(text.as_bytes());
            shaped.push(k);
        }
        let random: Vec<Vec<u8>> = (0..3000)
            .map(|_| {
                let n = next();
                let len = (n % 40) as usize;
                (0..len).map(|i| (next() >> (i % 8)) as u8).collect()
            })
            .collect();
        let cases = [
            shaped.clone(),
            shaped[..RADIX_MIN - 1].to_vec(),
            shaped[..RADIX_MIN].to_vec(),
            random,
            vec![b"same".to_vec(); 600],
            // Equal through their padding, told apart by length only, many times over.
            (0..900).map(|i| vec![0; i % 3]).collect(),
        ];
        for keys in cases {
            let items: Vec<(Vec<u8>, usize)> = keys.into_iter().zip(0..).collect();
            let mut want = items.clone();
            want.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(sort_by_bytes(items, |(k, _)| k), want);
        }
    }

    #[test]
    fn sort_words_sorts_by_words_then_position() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        // Words that differ in every byte, in the high word only, in one byte, not at all;
        // and positions out of order, which the radix sort must not take.
        let shapes: [fn(u64) -> (u64, u64); 4] = [
            |n| (n.rotate_left(17), n),
            |n| (n & 0xff00_ff00_0000_00ff, 7),
            |n| (1, (n & 0xf) << 24),
            |_| (3, 3),
        ];
        for shape in shapes {
            for len in [0, 1, RADIX_MIN - 1, RADIX_MIN, 4000] {
                let mut order: Vec<(u64, u64, u32)> = (0..len as u32)
                    .map(|i| {
                        let (hi, lo) = shape(next());
                        (hi, lo, i)
                    })
                    .collect();
                let mut want = order.clone();
                want.sort_unstable();
                sort_words(&mut order);
                assert_eq!(order, want);
                if len > 1 {
                    order.reverse();
                    sort_words(&mut order);
                    assert_eq!(order, want);
                }
            }
        }
    }

    #[test]
    fn entries_stay_sorted_across_the_switch_to_a_btree() {
        let mut e = Entries::default();
        let mut model = BTreeMap::new();
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        for i in 0..500u32 {
            let k = (next() % 97).to_be_bytes();
            let slot = (i % 3 != 0).then(|| i.to_be_bytes().to_vec());
            if i % 11 == 0 {
                assert_eq!(e.remove(&k), model.remove(&k).is_some());
            } else {
                assert_eq!(e.insert(&k, slot.clone()), model.insert(k, slot).is_none());
            }
            assert_eq!(e.len(), model.len());
            let from = 40u64.to_be_bytes();
            let got: Vec<_> = e
                .range(Excluded(&from))
                .map(|(k, v)| (k.to_vec(), v.clone()))
                .collect();
            let want: Vec<_> = model
                .range::<[u8], _>((Excluded(&from[..]), Unbounded))
                .map(|(k, v)| (k.to_vec(), v.clone()))
                .collect();
            assert_eq!(got, want);
        }
        assert!(matches!(e, Entries::Large(_)));
        let all: Vec<_> = e
            .into_sorted()
            .into_iter()
            .map(|(k, _)| k.to_vec())
            .collect();
        assert_eq!(all, model.keys().map(|k| k.to_vec()).collect::<Vec<_>>());
    }
}
