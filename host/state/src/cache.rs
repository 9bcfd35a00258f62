//! A bounded cache of committed state in front of a backend: the per-key point reads a batch
//! makes (value state, list metadata, map entries, and the before-images of the timers it
//! deletes) are served from memory once a key has been read or written, instead of
//! descending RocksDB's memtables, filters and blocks every batch.
//!
//! The backend stays the durable truth. The cache answers with committed bytes only: it is
//! filled by point reads that miss and find a value and by the puts of every write, and
//! every write updates the keys it holds, so what it answers is exactly what the backend
//! would. A large write's updates run on a second thread alongside the backend's write (the
//! commit of a batch is one write on one thread); until both are done, reads go to the
//! backend and fill nothing, so nobody reads a write the backend has not accepted.
//! Writing through matters for the batch after a key's
//! first: its reads (the counter reads back every value, list length and map entry it wrote)
//! would otherwise all miss and descend RocksDB, which made that batch about twice as slow
//! as the others. Absences are not cached, except that a committed delete of a cached key
//! keeps the key as known to be absent: state that comes and goes (a timer's deadline
//! cleared when it fires, an entry removed by TTL cleanup and written again when its id
//! comes back) is read again soon, and each such read would otherwise descend RocksDB to
//! find nothing. A deleted timer is forgotten instead: it is seldom armed again at its time.
//!
//! - **Bounded**: entries are charged their key and value bytes plus a fixed overhead; each of
//!   [`SHARDS`] shards holds at most its share of the budget and evicts in sweeps that give
//!   every entry read since the last sweep a second chance (CLOCK, one turn per sweep). An
//!   entry only written has had no read: it goes first. A write caches a key it does not
//!   hold only while the shard has room: once state outgrows the cache, each batch writes
//!   more keys than it holds, and caching them would evict and copy an entry per write on
//!   the commit's path for entries the next sweep evicts (at 3M keys in a 128 MiB budget
//!   the commits took a third less time without); reads that miss still fill it.
//! - **Shards by grouping key**: a key's shard is chosen by its grouping key alone, with the
//!   hash that chooses its partition ([`keys::grouping_key_hash`]). Every cached entry of
//!   one grouping key (its values, list lengths, map entries and timers) is in one shard, so
//!   clearing a large collection (a range delete) looks at that shard only; other range
//!   deletes (dropping a variable) look at every shard. And with a partition count that
//!   divides [`SHARDS`] (the default 4 does), each shard holds one partition's keys: the
//!   workers, each calling one partition at a time, do not take each other's shard locks
//!   (the `native` counter's calls took ~10% longer when a key's variables were in
//!   different shards). Each shard is a hash map: lookups compare one key, not a path of keys
//!   with long shared prefixes.
//! - **No stale fills**: a read that missed fills the cache only if no write touched the
//!   shard meanwhile (a per-shard version), so a value read before a commit can never
//!   overwrite the one the commit wrote.
//! - **A failed write empties the cache**, as does one that panicked: whatever the backend
//!   kept of it, nothing cached can disagree with it afterwards, and reads use the cache again.
//!
//! Scans (list elements, map pages, timers, TTL, metadata) go to the backend: they are
//! ordered reads the backend's iterators already serve well.

use std::hash::BuildHasher;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use hashbrown::DefaultHashBuilder;
use hashbrown::hash_table::HashTable;

use crate::engine::{
    GetFn, GetManyFn, KvEngine, PREFETCH_AHEAD, ScanFn, WriteBatch, WriteOp, prefetch,
    prefetch_value,
};
use crate::{Result, keys};

/// Independent parts of the cache, each with its own lock and its share of the budget.
pub const SHARDS: usize = 64;

/// Bytes charged per entry besides its key and value (the map node and slot).
const ENTRY_OVERHEAD: usize = 64;

/// A shard evicts down to this fraction of its budget, so evictions come in runs.
const EVICT_TO_PERCENT: usize = 90;

/// The namespaces whose keys are cached: those the per-key state operations read point by
/// point, and timers by key, whose deletes read their before-image for the change log (a
/// timer re-armed every batch deletes the one the previous batch wrote).
fn cached(key: &[u8]) -> bool {
    matches!(
        key.first(),
        Some(&(keys::VALUE | keys::LIST_META | keys::MAP | keys::TIMER_BY_KEY))
    )
}

/// Whether a committed delete of `key` leaves it cached as absent. Not for a timer: one
/// fired or deleted is seldom armed again at the same time, and would only take room.
fn absence_kept(key: &[u8]) -> bool {
    key.first() != Some(&keys::TIMER_BY_KEY)
}

/// Whether `[start, end)` may hold a cached key.
fn range_may_hold_cached(start: &[u8], end: &[u8]) -> bool {
    // Cached namespaces are VALUE (0x02) and LIST_META (0x04) to TIMER_BY_KEY (0x06); LIST
    // (0x03) between them is not cached but a range over it is rare enough to check in full.
    let first = [keys::VALUE];
    let past = [keys::TIMER_BY_KEY + 1];
    start < end && start < &past[..] && end > &first[..]
}

/// Key and value bytes kept in the table's own slot up to this length together (value
/// state, list metadata and small map entries): a hit then touches the slot and nothing else.
/// The slot is one cache line; lengths of one byte each leave it 60 bytes of room.
const INLINE: usize = 60;

/// The length of an inline value that is absent (see [`Entry`]).
const ABSENT_INLINE: u8 = u8::MAX;

/// The length of a value on the heap that is absent (see [`Entry`]).
const ABSENT: u32 = u32::MAX;

/// A cached read: a key and its committed bytes, or no bytes for a key a commit deleted while
/// it was cached. Key and value share one buffer, in the slot when short: a lookup used to
/// follow one pointer to compare the key and another to read the value, each a likely cache
/// miss once the cache outgrows the CPU's caches. A value's length is [`ABSENT_INLINE`] or
/// [`ABSENT`] when the key has no value.
enum Entry {
    Inline {
        /// Read since the last sweep: survives the next one.
        referenced: bool,
        key_len: u8,
        value_len: u8,
        /// `[key][value]`.
        buf: [u8; INLINE],
    },
    Heap {
        referenced: bool,
        key_len: u32,
        value_len: u32,
        buf: Box<[u8]>,
    },
}

const _: () = assert!(size_of::<Entry>() == 64);

impl Entry {
    /// `None` if the key or value is too long for the layout's `u32` lengths (nothing a
    /// wasm32 guest can write): such a key is simply not cached.
    fn new(key: &[u8], value: Option<&[u8]>, referenced: bool) -> Option<Self> {
        let bytes = value.unwrap_or_default();
        let len = key.len() + bytes.len();
        if len <= INLINE {
            let mut buf = [0; INLINE];
            buf[..key.len()].copy_from_slice(key);
            buf[key.len()..len].copy_from_slice(bytes);
            return Some(Self::Inline {
                referenced,
                // Both at most `INLINE`, below `ABSENT_INLINE`.
                key_len: key.len() as u8,
                value_len: value.map_or(ABSENT_INLINE, |v| v.len() as u8),
                buf,
            });
        }
        let key_len = u32::try_from(key.len()).ok()?;
        let value_len = match value {
            Some(v) => u32::try_from(v.len()).ok().filter(|&n| n != ABSENT)?,
            None => ABSENT,
        };
        let mut buf = Vec::with_capacity(len);
        buf.extend_from_slice(key);
        buf.extend_from_slice(bytes);
        Some(Self::Heap {
            referenced,
            key_len,
            value_len,
            buf: buf.into_boxed_slice(),
        })
    }

    /// `[key][value]`, the key's length, and the value's length if it has one.
    #[inline]
    fn parts(&self) -> (&[u8], usize, Option<usize>) {
        match self {
            Self::Inline {
                key_len,
                value_len,
                buf,
                ..
            } => (
                buf,
                usize::from(*key_len),
                (*value_len != ABSENT_INLINE).then_some(usize::from(*value_len)),
            ),
            Self::Heap {
                key_len,
                value_len,
                buf,
                ..
            } => (
                buf,
                *key_len as usize,
                (*value_len != ABSENT).then_some(*value_len as usize),
            ),
        }
    }

    #[inline]
    fn referenced(&mut self) -> &mut bool {
        match self {
            Self::Inline { referenced, .. } | Self::Heap { referenced, .. } => referenced,
        }
    }

    #[inline]
    fn key(&self) -> &[u8] {
        let (buf, key_len, _) = self.parts();
        &buf[..key_len]
    }

    #[inline]
    fn is(&self, key: &[u8]) -> bool {
        self.key() == key
    }

    #[inline]
    fn value(&self) -> Option<&[u8]> {
        let (buf, key_len, value_len) = self.parts();
        value_len.map(|n| &buf[key_len..key_len + n])
    }

    fn charge(key: &[u8], value: Option<&[u8]>) -> usize {
        key.len() + value.map_or(0, <[u8]>::len) + ENTRY_OVERHEAD
    }

    /// What the entry charges its shard.
    fn charged(&self) -> usize {
        Self::charge(self.key(), self.value())
    }
}
/// Where `key`'s grouping key is, in its `[ns][var][keylen][key]` prefix (a timer's:
/// `[ns][keylen][key]`), if it has one.
fn grouping_key_at(key: &[u8]) -> Option<std::ops::Range<usize>> {
    let at = if key.first() == Some(&keys::TIMER_BY_KEY) {
        1
    } else {
        5
    };
    let len = key.get(at..at + 4)?;
    let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
    let end = (at + 4).checked_add(len)?;
    (end <= key.len()).then_some(at + 4..end)
}

#[derive(Default)]
struct Shard {
    table: HashTable<Entry>,
    hasher: DefaultHashBuilder,
    bytes: usize,
    /// Bumped by every write that touches the shard (see [`CachedEngine::get_with`]).
    version: u64,
}

impl Shard {
    #[inline]
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn get_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let hash = self.hash(key);
        self.table.find_mut(hash, |e| e.is(key))
    }

    /// Hints the CPU to fetch the slot where a lookup of `key` starts: hashbrown probes
    /// from the bucket at the hash modulo the bucket count (its `h1`; should that change, the
    /// hint only fetches a useless line). Holding a short key and value, the slot is the
    /// whole entry. An empty slot is not fetched: a lookup would stop at its control byte.
    #[inline]
    fn prefetch(&self, key: &[u8]) {
        let buckets = self.table.num_buckets();
        if buckets > 0
            && let Some(entry) = self
                .table
                .get_bucket(self.hash(key) as usize & (buckets - 1))
        {
            prefetch_value(entry);
        }
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.table.find(self.hash(key), |e| e.is(key)).is_some()
    }

    /// Caches `key`, which the shard does not hold: `referenced` if just read, not if just
    /// written (so eviction takes it before what batches actually read).
    fn insert(&mut self, key: &[u8], value: &[u8], referenced: bool, budget: usize) {
        let Some(entry) = Entry::new(key, Some(value), referenced) else {
            return;
        };
        self.bytes += entry.charged();
        let hash = self.hash(key);
        let hasher = &self.hasher;
        self.table
            .insert_unique(hash, entry, |e| hasher.hash_one(e.key()));
        if self.bytes > budget {
            self.evict(budget * EVICT_TO_PERCENT / 100);
        }
    }

    /// A committed write of `key` (`None`: deleted): updates the entry if the key is cached
    /// (a delete leaves it cached as absent, if [`absence_kept`]), else caches a put
    /// (write-through) if the shard has room for it without evicting; a delete of a key
    /// that is not cached stays uncached.
    fn update(&mut self, key: &[u8], value: Option<&[u8]>, budget: usize) {
        let hash = self.hash(key);
        let Ok(mut found) = self.table.find_entry(hash, |e| e.is(key)) else {
            if let Some(value) = value
                && self.bytes + Entry::charge(key, Some(value)) <= budget
            {
                self.insert(key, value, false, budget);
            }
            return;
        };
        let entry = found.get_mut();
        let old = entry.charged();
        let kept = if value.is_some() || absence_kept(key) {
            Entry::new(key, value, *entry.referenced())
        } else {
            None
        };
        match kept {
            Some(new) => {
                *entry = new;
                self.bytes = self.bytes - old + Entry::charge(key, value);
            }
            None => {
                found.remove();
                self.bytes -= old;
            }
        }
        if self.bytes > budget {
            self.evict(budget * EVICT_TO_PERCENT / 100);
        }
    }

    /// Removes the cached keys for which `doomed` holds.
    fn remove_where(&mut self, mut doomed: impl FnMut(&[u8]) -> bool) {
        let mut freed = 0;
        self.table.retain(|e| {
            let remove = doomed(e.key());
            if remove {
                freed += e.charged();
            }
            !remove
        });
        self.bytes -= freed;
    }

    fn clear(&mut self) {
        self.table.clear();
        self.bytes = 0;
    }

    /// Sweeps until the shard holds at most `target` bytes: an entry read since the last
    /// sweep loses its mark and stays, one that was not is evicted. Two sweeps at most: by
    /// the second every mark is clear.
    fn evict(&mut self, target: usize) {
        for _ in 0..2 {
            let mut bytes = self.bytes;
            self.table.retain(|e| {
                if bytes <= target {
                    return true;
                }
                if std::mem::take(e.referenced()) {
                    return true;
                }
                bytes -= e.charged();
                false
            });
            self.bytes = bytes;
            if self.bytes <= target {
                return;
            }
        }
    }
}

type Shards = [Mutex<Shard>];

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One state-cache budget for several checkpoints (the tasks of a `--group` worker): their
/// caches share `bytes`, each holding at most an equal part. A cache that joins shrinks the
/// others to their new part before it holds anything, and one that is dropped leaves its part
/// to the rest, so together they stay within the budget however many come and go. (Their
/// databases' memtables are shared apart, by [`crate::SharedMemtables`].)
pub struct SharedCacheBudget {
    bytes: usize,
    /// Caches in `members`; read on every insert, without a lock.
    caches: AtomicUsize,
    /// Their shards, to shrink when a cache joins (dropped caches are pruned then).
    members: Mutex<Vec<Weak<Shards>>>,
}

impl SharedCacheBudget {
    /// A budget of `bytes` shared by the caches made with [`CachedEngine::sharing`].
    pub fn new(bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            bytes,
            caches: AtomicUsize::new(0),
            members: Mutex::new(Vec::new()),
        })
    }

    /// The whole budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// How many caches share the budget now.
    pub fn caches(&self) -> usize {
        self.caches.load(Ordering::SeqCst)
    }

    /// One shard's part when `caches` share the budget.
    fn shard_part(&self, caches: usize) -> usize {
        (self.bytes / caches.max(1) / SHARDS).max(1)
    }

    /// Adds `shards` as a cache of this budget and shrinks every other cache to its new part.
    fn join(&self, shards: &Arc<Shards>) {
        let mut members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        members.retain(|m| m.strong_count() > 0);
        members.push(Arc::downgrade(shards));
        self.caches.store(members.len(), Ordering::SeqCst);
        let part = self.shard_part(members.len());
        for other in members.iter().filter_map(Weak::upgrade) {
            for shard in other.iter() {
                let mut shard = lock(shard);
                if shard.bytes > part {
                    shard.evict(part * EVICT_TO_PERCENT / 100);
                }
            }
        }
    }

    /// Removes `shards`' cache: the others' parts grow.
    fn leave(&self, shards: &Arc<Shards>) {
        let mut members = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        members.retain(|m| m.strong_count() > 0 && !std::ptr::eq(m.as_ptr(), Arc::as_ptr(shards)));
        self.caches.store(members.len(), Ordering::SeqCst);
    }
}

impl std::fmt::Debug for SharedCacheBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCacheBudget")
            .field("bytes", &self.bytes)
            .field("caches", &self.caches.load(Ordering::SeqCst))
            .finish()
    }
}

/// What a cache may hold.
enum Budget {
    /// Its own budget: each shard's part.
    Own(usize),
    /// A part of a shared one.
    Shared(Arc<SharedCacheBudget>),
}

/// A [`KvEngine`] with a bounded cache of committed point reads in front of `inner` (see the
/// [module docs](self)).
pub struct CachedEngine<E> {
    inner: E,
    shards: Arc<Shards>,
    /// Writes in flight: while one is, the cache may be ahead of the backend (the write's
    /// updates are applied alongside it), so reads go to the backend and fill nothing.
    /// Checked under the shard's lock, which orders it with the updates.
    writing: AtomicUsize,
    budget: Budget,
}

impl<E: KvEngine> CachedEngine<E> {
    /// Caches `inner`'s point reads in at most about `budget_bytes` of memory.
    pub fn new(inner: E, budget_bytes: usize) -> Self {
        Self::with_budget(inner, Budget::Own((budget_bytes / SHARDS).max(1)))
    }

    /// Caches `inner`'s point reads in an equal part of `budget` (see [`SharedCacheBudget`]).
    pub fn sharing(inner: E, budget: &Arc<SharedCacheBudget>) -> Self {
        let cache = Self::with_budget(inner, Budget::Shared(Arc::clone(budget)));
        budget.join(&cache.shards);
        cache
    }

    fn with_budget(inner: E, budget: Budget) -> Self {
        Self {
            inner,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            writing: AtomicUsize::new(0),
            budget,
        }
    }

    /// What one shard may hold now.
    fn shard_budget(&self) -> usize {
        match &self.budget {
            Budget::Own(part) => *part,
            Budget::Shared(shared) => shared.shard_part(shared.caches.load(Ordering::SeqCst)),
        }
    }

    /// Bytes the cache holds now (keys, values and per-entry overhead).
    pub fn cached_bytes(&self) -> usize {
        (0..SHARDS).map(|i| self.shard(i).bytes).sum()
    }

    /// The shard of a cached key: chosen by its grouping key, so one grouping key's entries
    /// share a shard, and a shard holds one partition's keys (see the [module docs](self)).
    fn shard_of(&self, key: &[u8]) -> usize {
        let grouping = grouping_key_at(key).map_or(key, |at| &key[at]);
        (keys::grouping_key_hash(grouping) % SHARDS as u64) as usize
    }

    fn shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        lock(&self.shards[i])
    }

    /// Hints the CPU to fetch the cache slot of `key` (see [`Shard::prefetch`]): in passes
    /// over many keys, [`SLOT_AHEAD`] keys ahead, so the slot's cache miss overlaps the work
    /// on the keys before it (the key's own bytes asked for earlier, [`PREFETCH_AHEAD`]:
    /// hashing it reads them); and before a grouping key's handler ([`KvEngine::prefetch`]).
    fn prefetch_slot(&self, key: &[u8]) {
        if cached(key) {
            self.shard(self.shard_of(key)).prefetch(key);
        }
    }

    /// In a pass over `keys`, at the `i`th: asks for the bytes of the key
    /// [`PREFETCH_AHEAD`] after it and the slot of the one [`SLOT_AHEAD`] after it.
    #[inline]
    fn prefetch_ahead_of(&self, keys: &[&[u8]], i: usize) {
        if let Some(ahead) = keys.get(i + PREFETCH_AHEAD) {
            prefetch(ahead);
        }
        if let Some(ahead) = keys.get(i + SLOT_AHEAD) {
            self.prefetch_slot(ahead);
        }
    }

    /// The cached read of `key`: a hit (after calling `f` with the bytes, if the key is
    /// known to have any), or a miss (and the shard's version).
    fn lookup(&self, key: &[u8], f: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<Lookup> {
        let mut shard = self.shard(self.shard_of(key));
        if self.writing.load(Ordering::SeqCst) > 0 {
            return Ok(Lookup::Miss(NO_FILL));
        }
        match shard.get_mut(key) {
            Some(entry) => {
                *entry.referenced() = true;
                match entry.value() {
                    Some(value) => {
                        f(value)?;
                        Ok(Lookup::Hit(true))
                    }
                    None => Ok(Lookup::Hit(false)),
                }
            }
            None => Ok(Lookup::Miss(shard.version)),
        }
    }

    /// Whether a point read of `key` would be answered from the cache.
    fn holds(&self, key: &[u8]) -> bool {
        cached(key)
            && self.writing.load(Ordering::SeqCst) == 0
            && self.shard(self.shard_of(key)).contains(key)
    }

    /// Caches what a read that missed at shard version `version` found, unless a write
    /// touched the shard since.
    fn fill(&self, key: &[u8], value: Option<&[u8]>, version: u64) {
        // An absence is not cached: a new key's reads miss until its first commit writes it,
        // and caching them would only add work to every first batch.
        let Some(value) = value else {
            return;
        };
        if version == NO_FILL {
            return;
        }
        let mut shard = self.shard(self.shard_of(key));
        if shard.version == version
            && self.writing.load(Ordering::SeqCst) == 0
            && !shard.contains(key)
        {
            shard.insert(key, value, true, self.shard_budget());
        }
    }

    fn clear(&self) {
        for i in 0..SHARDS {
            let mut shard = self.shard(i);
            shard.clear();
            shard.version += 1;
        }
    }

    /// Applies a committed write to the cache, in the batch's order.
    fn apply(&self, batch: &WriteBatch) {
        let mut touched = [false; SHARDS];
        let ops = batch.ops();
        for (n, op) in ops.iter().enumerate() {
            if let Some(ahead) = ops.get(n + PREFETCH_AHEAD) {
                ahead.prefetch();
            }
            if let Some(WriteOp::Put(key, _) | WriteOp::Delete(key)) = ops.get(n + SLOT_AHEAD) {
                self.prefetch_slot(key);
            }
            match op {
                WriteOp::Put(k, v) if cached(k) => {
                    let i = self.shard_of(k);
                    touched[i] = true;
                    // Read per write: a cache that joins a shared budget meanwhile shrinks
                    // this one's part at once.
                    self.shard(i).update(k, Some(v), self.shard_budget());
                }
                WriteOp::Delete(k) if cached(k) => {
                    let i = self.shard_of(k);
                    touched[i] = true;
                    self.shard(i).update(k, None, self.shard_budget());
                }
                WriteOp::DeleteRange(start, end) if range_may_hold_cached(start, end) => {
                    let one_collection = cached(start)
                        && grouping_key_at(start).is_some_and(|at| at.end == start.len())
                        && *end == keys::prefix_successor(start);
                    if one_collection {
                        // Every key of the range starts with `start`, and all are in its shard.
                        let i = self.shard_of(start);
                        touched[i] = true;
                        self.shard(i).remove_where(|k| k.starts_with(start));
                    } else {
                        for (i, t) in touched.iter_mut().enumerate() {
                            *t = true;
                            self.shard(i)
                                .remove_where(|k| start.as_slice() <= k && k < end.as_slice());
                        }
                    }
                }
                _ => {}
            }
        }
        for (i, t) in touched.iter().enumerate() {
            if *t {
                self.shard(i).version += 1;
            }
        }
    }
}

/// How many keys ahead a pass over many keys asks for a key's cache slot
/// ([`CachedEngine::prefetch_slot`]): fewer than [`PREFETCH_AHEAD`], so the key's bytes,
/// asked for then, are there to hash.
const SLOT_AHEAD: usize = PREFETCH_AHEAD / 2;

/// Where [`CachedEngine::get_many`] keeps a key's answer until its turn.
enum Answer {
    Absent,
    /// `(start, len)` in the answers' buffer.
    At(usize, usize),
}

enum Lookup {
    /// Cached: whether the key has a value.
    Hit(bool),
    Miss(u64),
}

impl<E: KvEngine> KvEngine for CachedEngine<E> {
    fn disk_bytes(&self) -> u64 {
        self.inner.disk_bytes()
    }

    fn snapshot_to(&self, dir: &Path) -> Result<bool> {
        self.inner.snapshot_to(dir)
    }

    fn get_with(&self, key: &[u8], f: &mut GetFn<'_>) -> Result<bool> {
        if !cached(key) {
            return self.inner.get_with(key, f);
        }
        let version = match self.lookup(key, &mut |v| f(v))? {
            Lookup::Hit(found) => return Ok(found),
            Lookup::Miss(version) => version,
        };
        // Filled from inside the backend's callback, before `f` sees the bytes: no copy of
        // them is made besides the cache's own.
        self.inner.get_with(key, &mut |v| {
            self.fill(key, Some(v), version);
            f(v)
        })
    }

    fn get_many(&self, keys: &[&[u8]], f: &mut GetManyFn<'_>) -> Result<()> {
        // Hits are answered from the cache; misses are read from the backend together (in
        // the order given, which keeps its batched lookups fast); then every key is answered
        // in order. Answers wait in one buffer, not an allocation per key.
        let mut data: Vec<u8> = Vec::new();
        let mut answers: Vec<Answer> = Vec::with_capacity(keys.len());
        let mut misses: Vec<(usize, u64)> = Vec::new();
        let keep = |data: &mut Vec<u8>, v: Option<&[u8]>| match v {
            Some(v) => {
                let start = data.len();
                data.extend_from_slice(v);
                Answer::At(start, v.len())
            }
            None => Answer::Absent,
        };
        for (i, key) in keys.iter().enumerate() {
            self.prefetch_ahead_of(keys, i);
            if !cached(key) {
                answers.push(Answer::Absent);
                misses.push((i, NO_FILL));
                continue;
            }
            let mut hit = Answer::Absent;
            match self.lookup(key, &mut |v| {
                hit = keep(&mut data, Some(v));
                Ok(())
            })? {
                Lookup::Hit(_) => answers.push(hit),
                Lookup::Miss(version) => {
                    answers.push(Answer::Absent);
                    misses.push((i, version));
                }
            }
        }
        if !misses.is_empty() {
            let wanted: Vec<&[u8]> = misses.iter().map(|&(i, _)| keys[i]).collect();
            self.inner.get_many(&wanted, &mut |j, v| {
                let (i, version) = misses[j];
                self.fill(keys[i], v, version);
                answers[i] = keep(&mut data, v);
                Ok(())
            })?;
        }
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Answer::At(start, len) => f(i, Some(&data[start..start + len]))?,
                Answer::Absent => f(i, None)?,
            }
        }
        Ok(())
    }

    fn prefetch(&self, key: &[u8]) {
        self.prefetch_slot(key);
    }

    fn read_ahead(&self, keys: &[&[u8]], f: &mut GetManyFn<'_>) -> Result<()> {
        let mut misses: Vec<&[u8]> = Vec::new();
        let mut at: Vec<usize> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            self.prefetch_ahead_of(keys, i);
            if !self.holds(key) {
                misses.push(key);
                at.push(i);
            }
        }
        // Not filled into the cache: the batch reads each once, and its commit caches what
        // it writes.
        self.inner.read_ahead(&misses, &mut |j, v| f(at[j], v))
    }

    fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
        self.inner.scan(start, end, f)
    }

    fn last_key_in(&self, start: &[u8], end: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.last_key_in(start, end)
    }

    fn write(&self, batch: &WriteBatch) -> Result<()> {
        let mut in_flight = InFlight::start(self);
        // A large write's cache updates go alongside the backend's write, on a second
        // thread: a batch's commit is one write on one thread, the updates of a 400k-write
        // batch took a fifth as long again, and the partitions' workers are idle meanwhile.
        // Small writes, or no thread to spare: the updates follow the write here.
        let written = std::thread::scope(|s| {
            let applying = (batch.len() >= PARALLEL_APPLY_OPS)
                .then(|| {
                    std::thread::Builder::new()
                        .name("statebox-cache".into())
                        .spawn_scoped(s, || self.apply(batch))
                        .ok()
                })
                .flatten();
            let written = self.inner.write(batch);
            match applying {
                Some(applying) => {
                    if let Err(panic) = applying.join() {
                        std::panic::resume_unwind(panic);
                    }
                }
                None if written.is_ok() => self.apply(batch),
                None => {}
            }
            written
        });
        in_flight.succeeded = written.is_ok();
        written
    }
}

/// A write in flight (counted in [`CachedEngine::writing`]) until dropped. Unless it
/// succeeded, which a write that failed or panicked (in the backend, or in the thread
/// updating the cache) did not, the cache is emptied first: nothing cached can then disagree
/// with whatever the backend kept, and reads use the cache again once the count is down.
struct InFlight<'a, E: KvEngine> {
    cache: &'a CachedEngine<E>,
    succeeded: bool,
}

impl<'a, E: KvEngine> InFlight<'a, E> {
    fn start(cache: &'a CachedEngine<E>) -> Self {
        cache.writing.fetch_add(1, Ordering::SeqCst);
        Self {
            cache,
            succeeded: false,
        }
    }
}

impl<E> Drop for CachedEngine<E> {
    fn drop(&mut self) {
        if let Budget::Shared(shared) = &self.budget {
            shared.leave(&self.shards);
        }
    }
}

impl<E: KvEngine> Drop for InFlight<'_, E> {
    fn drop(&mut self) {
        if !self.succeeded {
            self.cache.clear();
        }
        self.cache.writing.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The version a read that must not fill the cache carries (no shard reaches it).
const NO_FILL: u64 = u64::MAX;

/// Writes of at least this many operations update the cache on a second thread while the
/// backend writes; smaller ones after it, where a thread would cost more than it saves.
const PARALLEL_APPLY_OPS: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemEngine;

    fn value_key(i: u32) -> Vec<u8> {
        keys::var_key_prefix(keys::VALUE, 1, format!("k{i}").as_bytes())
    }

    fn put(e: &impl KvEngine, k: &[u8], v: &[u8]) {
        let mut b = WriteBatch::new();
        b.put(k.to_vec(), v.to_vec());
        e.write(&b).unwrap();
    }

    #[test]
    fn reading_ahead_leaves_out_what_the_cache_holds() {
        /// A backend in memory that reads ahead as one on disk does: every key asked.
        struct Disk(MemEngine);
        impl KvEngine for Disk {
            fn get_with(&self, key: &[u8], f: &mut GetFn<'_>) -> Result<bool> {
                self.0.get_with(key, f)
            }
            fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
                self.0.scan(start, end, f)
            }
            fn write(&self, batch: &WriteBatch) -> Result<()> {
                self.0.write(batch)
            }
            fn read_ahead(&self, keys: &[&[u8]], f: &mut GetManyFn<'_>) -> Result<()> {
                self.0.get_many(keys, f)
            }
        }
        let e = CachedEngine::new(Disk(MemEngine::default()), 1 << 20);
        let ks: Vec<Vec<u8>> = (0..6).map(value_key).collect();
        // 0 and 1 written through the cache; 2 and 3 behind its back, 2 then read (cached);
        // 4 has no value; 5 was deleted through the cache (cached as absent).
        put(&e, &ks[0], b"0");
        put(&e, &ks[1], b"1");
        put(&e.inner, &ks[2], b"2");
        put(&e.inner, &ks[3], b"3");
        assert_eq!(e.get(&ks[2]).unwrap().as_deref(), Some(&b"2"[..]));
        put(&e, &ks[5], b"5");
        let mut b = WriteBatch::new();
        b.delete(ks[5].clone());
        e.write(&b).unwrap();
        let refs: Vec<&[u8]> = ks.iter().map(Vec::as_slice).collect();
        let mut answered = Vec::new();
        e.read_ahead(&refs, &mut |i, v| {
            answered.push((i, v.map(<[u8]>::to_vec)));
            Ok(())
        })
        .unwrap();
        assert_eq!(answered, [(3, Some(b"3".to_vec())), (4, None)]);
        // Nothing read ahead was cached: the batch's commit caches what it writes.
        assert!(!e.holds(&ks[3]));
    }

    #[test]
    fn reads_are_served_from_the_cache_after_the_first() {
        let e = CachedEngine::new(MemEngine::default(), 1 << 20);
        let k = value_key(1);
        assert_eq!(e.get(&k).unwrap(), None);
        assert_eq!(e.cached_bytes(), 0, "an absence is not cached");
        // A committed put is cached (written through).
        put(&e, &k, b"v0");
        assert_eq!(e.cached_bytes(), k.len() + 2 + ENTRY_OVERHEAD);
        put(&e.inner, &k, b"behind the cache's back");
        assert_eq!(
            e.get(&k).unwrap().as_deref(),
            Some(&b"v0"[..]),
            "a written key is a hit"
        );
        // A key that was read is cached too.
        let other = CachedEngine::new(MemEngine::default(), 1 << 20);
        put(&other.inner, &k, b"r");
        assert_eq!(other.get(&k).unwrap().as_deref(), Some(&b"r"[..]));
        put(&other.inner, &k, b"behind the cache's back");
        assert_eq!(
            other.get(&k).unwrap().as_deref(),
            Some(&b"r"[..]),
            "a read key is a hit"
        );
        // A committed write updates the cached key; a delete keeps it cached as absent
        // (charged its key and overhead), and a later write of it is cached again.
        put(&e, &k, b"v1");
        assert_eq!(e.get(&k).unwrap().as_deref(), Some(&b"v1"[..]));
        let mut b = WriteBatch::new();
        b.delete(k.clone());
        e.write(&b).unwrap();
        assert_eq!(e.get(&k).unwrap(), None);
        assert_eq!(e.cached_bytes(), k.len() + ENTRY_OVERHEAD);
        put(&e.inner, &k, b"behind the cache's back");
        assert_eq!(e.get(&k).unwrap(), None, "a cached absence");
        assert_eq!(
            get_many(&e, std::slice::from_ref(&k)),
            vec![(0, None)],
            "get_many answers it from the cache too"
        );
        put(&e, &k, b"v2");
        assert_eq!(e.get(&k).unwrap().as_deref(), Some(&b"v2"[..]));
        assert_eq!(e.cached_bytes(), k.len() + 2 + ENTRY_OVERHEAD);
    }

    #[test]
    fn entries_in_the_slot_and_on_the_heap_answer_the_same() {
        // Key and value lengths around the slot's room (`INLINE`), and a value whose length
        // is the slot's absence marker (255, so held on the heap): each is cached when
        // written, answers what was written, is updated across the boundary, and is cached
        // as absent once deleted.
        let key = |i: usize| keys::var_key_prefix(keys::VALUE, 1, format!("k{i:08}").as_bytes());
        let room = INLINE - key(0).len();
        let lens = [0, 1, room - 1, room, room + 1, 200, 255, 256];
        let e = CachedEngine::new(MemEngine::default(), 1 << 24);
        for (i, &len) in lens.iter().enumerate() {
            let k = key(i);
            let v = vec![b'a' + i as u8; len];
            put(&e, &k, &v);
            assert!(e.holds(&k), "value of {len} bytes");
            put(&e.inner, &k, b"behind the cache's back");
            assert_eq!(e.get(&k).unwrap(), Some(v.clone()), "value of {len} bytes");
            for &other in &lens {
                let w = vec![b'z'; other];
                put(&e, &k, &w);
                assert_eq!(e.get(&k).unwrap(), Some(w), "{len} then {other} bytes");
            }
            let mut b = WriteBatch::new();
            b.delete(k.clone());
            e.write(&b).unwrap();
            assert!(e.holds(&k));
            assert_eq!(e.get(&k).unwrap(), None, "deleted after {len} bytes");
        }
        let cached = lens.len() * (key(0).len() + ENTRY_OVERHEAD);
        assert_eq!(e.cached_bytes(), cached, "absences charge their key only");
    }

    #[test]
    fn a_grouping_keys_entries_share_one_shard_of_its_partition() {
        let e = CachedEngine::new(MemEngine::default(), 1 << 20);
        let mut shards_of_partition = [const { Vec::new() }; 4];
        for i in 0..1000 {
            let key = format!("[\"k{i}\"]");
            let key = key.as_bytes();
            let shard = e.shard_of(&keys::value_key(1, key));
            for other in [
                keys::value_key(2, key),
                keys::list_meta_key(3, key),
                keys::map_entry_key(4, key, b"\"user\""),
                keys::map_prefix(4, key),
                keys::timer_by_key(key, 1_000),
            ] {
                assert_eq!(e.shard_of(&other), shard, "{other:?}");
            }
            // The engine's partition of the key, with 4 partitions.
            let partition = (keys::grouping_key_hash(key) % 4) as usize;
            shards_of_partition[partition].push(shard);
        }
        for (p, shards) in shards_of_partition.iter().enumerate() {
            for (q, others) in shards_of_partition.iter().enumerate() {
                if p != q {
                    assert!(
                        shards.iter().all(|s| !others.contains(s)),
                        "partitions {p} and {q} share a shard"
                    );
                }
            }
        }
    }

    #[test]
    fn a_range_delete_removes_the_cached_keys_in_its_range_only() {
        let e = CachedEngine::new(MemEngine::default(), 1 << 20);
        for i in 0..100 {
            put(&e, &value_key(i), b"v");
            // Read once, so the cache holds it.
            assert!(e.get(&value_key(i)).unwrap().is_some());
        }
        let (start, end) = (value_key(10), value_key(20));
        let mut b = WriteBatch::new();
        b.delete_range(start.clone(), end.clone());
        e.write(&b).unwrap();
        for i in 0..100 {
            let k = value_key(i);
            let want = !(start <= k && k < end);
            assert_eq!(e.get(&k).unwrap().is_some(), want, "key {i}");
        }
    }

    #[test]
    fn clearing_one_collection_removes_its_cached_entries_only() {
        let e = CachedEngine::new(MemEngine::default(), 1 << 20);
        let map_key = |key: &str, user: &str| {
            let mut k = keys::var_key_prefix(keys::MAP, 3, key.as_bytes());
            k.extend_from_slice(user.as_bytes());
            k
        };
        for key in ["a", "b"] {
            for user in ["x", "y", "z"] {
                put(&e, &map_key(key, user), b"v");
                assert!(e.get(&map_key(key, user)).unwrap().is_some());
            }
        }
        let start = keys::var_key_prefix(keys::MAP, 3, b"a");
        let mut b = WriteBatch::new();
        b.delete_range(start.clone(), keys::prefix_successor(&start));
        e.write(&b).unwrap();
        for user in ["x", "y", "z"] {
            assert_eq!(e.get(&map_key("a", user)).unwrap(), None, "a/{user}");
            assert!(e.get(&map_key("b", user)).unwrap().is_some(), "b/{user}");
        }
    }

    #[test]
    fn timers_are_cached_when_written_and_forgotten_when_deleted() {
        let e = CachedEngine::new(MemEngine::default(), 1 << 20);
        let timer = |key: &[u8], ts| keys::timer_by_key(key, ts);
        let (a, b) = (timer(b"a", 5), timer(b"b", 5));
        put(&e, &a, b"");
        put(&e, &b, b"");
        assert_eq!(e.cached_bytes(), a.len() + b.len() + 2 * ENTRY_OVERHEAD);
        // The next batch's delete reads the before-image: a hit.
        let mut behind = WriteBatch::new();
        behind.delete(a.clone());
        e.inner.write(&behind).unwrap();
        assert_eq!(
            get_many(&e, std::slice::from_ref(&a)),
            vec![(0, Some(vec![]))]
        );
        // A committed delete forgets the timer rather than keeping it as absent.
        let mut deleted = WriteBatch::new();
        deleted.delete(a.clone());
        e.write(&deleted).unwrap();
        assert_eq!(e.cached_bytes(), b.len() + ENTRY_OVERHEAD);
        put(&e.inner, &a, b"behind the cache's back");
        assert_eq!(
            e.get(&a).unwrap().as_deref(),
            Some(&b"behind the cache's back"[..])
        );
        // A key's timers are one collection: removing them all leaves other keys' cached.
        put(&e, &timer(b"a", 6), b"");
        let start = keys::timer_key_prefix(b"a");
        let mut cleared = WriteBatch::new();
        cleared.delete_range(start.clone(), keys::prefix_successor(&start));
        e.write(&cleared).unwrap();
        assert_eq!(e.get(&timer(b"a", 6)).unwrap(), None);
        assert_eq!(e.cached_bytes(), b.len() + ENTRY_OVERHEAD);
    }

    #[test]
    fn the_cache_stays_within_its_budget_and_keeps_what_is_read() {
        let budget = 64 * 1024;
        let e = CachedEngine::new(MemEngine::default(), budget);
        let hot = value_key(0);
        put(&e, &hot, b"hot");
        assert!(e.get(&hot).unwrap().is_some());
        // The other keys are only written: write-through caches them while a shard has
        // room, and a full shard takes no more, so writing them cannot push the hot key
        // out (which entries a read's fill evicts: the next test).
        for i in 1..20_000 {
            put(&e, &value_key(i), &[7; 40]);
            // Read the hot key now and then: CLOCK gives it a second chance every turn.
            if i % 16 == 0 {
                assert!(e.get(&hot).unwrap().is_some());
            }
            assert!(
                e.cached_bytes() <= budget + SHARDS * 200,
                "{}",
                e.cached_bytes()
            );
        }
        put(&e.inner, &hot, b"changed behind the cache");
        assert_eq!(
            e.get(&hot).unwrap().as_deref(),
            Some(&b"hot"[..]),
            "the hot key stayed cached"
        );
        // Every key still reads right (evicted ones from the backend).
        for i in 1..20_000 {
            assert_eq!(
                e.get(&value_key(i)).unwrap().as_deref(),
                Some(&[7u8; 40][..])
            );
        }
    }

    #[test]
    fn a_full_cache_takes_no_written_keys_but_updates_the_ones_it_holds() {
        let budget = 64 * 1024;
        let e = CachedEngine::new(MemEngine::default(), budget);
        for i in 0..20_000 {
            put(&e, &value_key(i), b"first");
        }
        // Written only: the cache filled up to its budget and then took no more.
        let full = e.cached_bytes();
        assert!(full > budget * 3 / 4 && full <= budget, "{full}");
        // So the first keys of each shard stayed, and the last went to the backend only.
        assert!(e.holds(&value_key(0)));
        assert!(!e.holds(&value_key(19_999)));
        // A write of a key it holds updates it.
        put(&e, &value_key(0), b"second");
        put(&e.inner, &value_key(0), b"behind the cache");
        assert_eq!(
            e.get(&value_key(0)).unwrap().as_deref(),
            Some(&b"second"[..])
        );
        // A read that misses still fills it, evicting what was only written.
        assert_eq!(
            e.get(&value_key(19_999)).unwrap().as_deref(),
            Some(&b"first"[..])
        );
        assert!(e.holds(&value_key(19_999)));

        // Within one shard: fills evict what was only written (or not read since the last
        // sweep) before what was read since, so a key read before each fill stays (CLOCK
        // gives it a second chance every sweep). Had every entry been read since the last
        // sweep, the first pass would clear every mark and the second evict in table
        // order, that key among them or not: CLOCK keeps what is read more than the rest.
        let hot = value_key(0);
        let shard = e.shard_of(&hot);
        let in_shard = |k: &Vec<u8>| e.shard_of(k) == shard;
        let written: Vec<Vec<u8>> = (1..20_000)
            .map(value_key)
            .filter(|k| in_shard(k) && e.holds(k))
            .collect();
        let uncached: Vec<Vec<u8>> = (1..20_000)
            .map(value_key)
            .filter(|k| in_shard(k) && !e.holds(k))
            .take(3)
            .collect();
        // Fewer fills than written-only entries: every sweep finds one to evict.
        assert!(written.len() > 2 * uncached.len(), "{}", written.len());
        for k in &uncached {
            assert!(e.get(&hot).unwrap().is_some());
            assert_eq!(e.get(k).unwrap().as_deref(), Some(&b"first"[..]));
            assert!(e.holds(k), "a fill stays through its own sweep");
        }
        assert!(e.holds(&hot), "the key read before every fill stayed");
        assert!(
            written.iter().any(|k| !e.holds(k)),
            "fills evicted keys only written"
        );
        assert!(e.cached_bytes() <= budget, "{}", e.cached_bytes());
    }

    #[test]
    fn caches_sharing_a_budget_stay_within_it_together() {
        let budget = 256 * 1024;
        // A shard may overshoot its part by one entry before it sweeps.
        let slack = SHARDS * 200;
        let shared = SharedCacheBudget::new(budget);
        let fill = |e: &CachedEngine<MemEngine>, keys: std::ops::Range<u32>| {
            for i in keys {
                put(e, &value_key(i), &[7; 40]);
            }
        };
        let a = CachedEngine::sharing(MemEngine::default(), &shared);
        fill(&a, 0..20_000);
        // Alone, a cache has the whole budget.
        assert!(a.cached_bytes() > budget * 3 / 4, "{}", a.cached_bytes());
        assert!(a.cached_bytes() <= budget + slack, "{}", a.cached_bytes());
        // A second cache joining shrinks the first to half before it holds anything.
        let b = CachedEngine::sharing(MemEngine::default(), &shared);
        assert!(a.cached_bytes() <= budget / 2, "{}", a.cached_bytes());
        fill(&b, 0..20_000);
        fill(&a, 20_000..40_000);
        assert!(b.cached_bytes() > budget * 3 / 8, "{}", b.cached_bytes());
        assert!(a.cached_bytes() + b.cached_bytes() <= budget + slack);
        // A third: a third each, at once.
        let c = CachedEngine::sharing(MemEngine::default(), &shared);
        assert!(a.cached_bytes() <= budget / 3 && b.cached_bytes() <= budget / 3);
        fill(&c, 0..20_000);
        let all = a.cached_bytes() + b.cached_bytes() + c.cached_bytes();
        assert!(all <= budget + slack, "{all}");
        // Caches that go leave their parts to the rest.
        drop((b, c));
        fill(&a, 40_000..60_000);
        assert!(a.cached_bytes() > budget * 3 / 4, "{}", a.cached_bytes());
        assert!(a.cached_bytes() <= budget + slack, "{}", a.cached_bytes());
        // Whatever was evicted reads right, from the backend.
        for i in (0..60_000).step_by(97) {
            assert_eq!(
                a.get(&value_key(i)).unwrap().as_deref(),
                Some(&[7u8; 40][..])
            );
        }
    }

    #[test]
    fn a_read_that_raced_a_write_does_not_cache_the_older_value() {
        let e = CachedEngine::new(MemEngine::default(), 1 << 20);
        let k = value_key(1);
        put(&e, &k, b"old");
        let i = e.shard_of(&k);
        e.shard(i).clear();
        // A reader misses at this version and reads "old" from the backend...
        let Lookup::Miss(version) = e.lookup(&k, &mut |_| Ok(())).unwrap() else {
            panic!("expected a miss");
        };
        // ... a commit writes "new" meanwhile ...
        put(&e, &k, b"new");
        // ... and the reader's fill is refused.
        e.fill(&k, Some(b"old"), version);
        assert_eq!(e.get(&k).unwrap().as_deref(), Some(&b"new"[..]));
    }

    #[test]
    fn a_failed_write_empties_the_cache() {
        struct Failing(MemEngine);
        impl KvEngine for Failing {
            fn get_with(&self, key: &[u8], f: &mut GetFn<'_>) -> Result<bool> {
                self.0.get_with(key, f)
            }
            fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
                self.0.scan(start, end, f)
            }
            fn write(&self, batch: &WriteBatch) -> Result<()> {
                if batch.len() > 1 {
                    // Half applied, then failed.
                    let mut first = WriteBatch::new();
                    first.append(batch.ops()[..1].to_vec());
                    self.0.write(&first)?;
                    return Err(crate::StoreError::Storage("injected".into()));
                }
                self.0.write(batch)
            }
        }
        let e = CachedEngine::new(Failing(MemEngine::default()), 1 << 20);
        let (a, b) = (value_key(1), value_key(2));
        put(&e, &a, b"a0");
        put(&e, &b, b"b0");
        assert!(e.get(&a).unwrap().is_some() && e.get(&b).unwrap().is_some());
        assert!(e.cached_bytes() > 0);
        let mut batch = WriteBatch::new();
        batch.put(a.clone(), b"a1".to_vec());
        batch.put(b.clone(), b"b1".to_vec());
        assert!(e.write(&batch).is_err());
        assert_eq!(e.cached_bytes(), 0);
        // Reads now agree with whatever the backend kept.
        assert_eq!(e.get(&a).unwrap().as_deref(), Some(&b"a1"[..]));
        assert_eq!(e.get(&b).unwrap().as_deref(), Some(&b"b0"[..]));
    }

    #[test]
    fn a_write_that_panics_empties_the_cache_and_reads_use_it_again() {
        struct Panicking(MemEngine);
        impl KvEngine for Panicking {
            fn get_with(&self, key: &[u8], f: &mut GetFn<'_>) -> Result<bool> {
                self.0.get_with(key, f)
            }
            fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
                self.0.scan(start, end, f)
            }
            fn write(&self, batch: &WriteBatch) -> Result<()> {
                assert!(batch.len() == 1, "injected panic");
                self.0.write(batch)
            }
        }
        let e = CachedEngine::new(Panicking(MemEngine::default()), 1 << 20);
        let (a, b) = (value_key(1), value_key(2));
        put(&e, &a, b"a0");
        assert!(e.cached_bytes() > 0);
        let mut batch = WriteBatch::new();
        batch.put(a.clone(), b"a1".to_vec());
        batch.put(b.clone(), b"b1".to_vec());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.write(&batch)));
        assert!(panicked.is_err());
        assert_eq!(e.cached_bytes(), 0);
        assert_eq!(e.writing.load(Ordering::SeqCst), 0, "the write is over");
        // The cache serves reads again: a read fills it, and a hit no longer asks the backend.
        assert_eq!(e.get(&a).unwrap().as_deref(), Some(&b"a0"[..]));
        put(&e.inner, &a, b"behind the cache's back");
        assert_eq!(e.get(&a).unwrap().as_deref(), Some(&b"a0"[..]));
    }

    /// What `get_many` answers for `keys`, in the order it answers.
    fn get_many(e: &impl KvEngine, keys: &[Vec<u8>]) -> Vec<(usize, Option<Vec<u8>>)> {
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let mut got = Vec::new();
        e.get_many(&refs, &mut |i, v| {
            got.push((i, v.map(<[u8]>::to_vec)));
            Ok(())
        })
        .unwrap();
        got
    }

    #[test]
    fn get_many_mixes_hits_misses_and_uncached_keys_in_order() {
        let e = CachedEngine::new(MemEngine::default(), 1 << 20);
        let meta = keys::meta_key("m");
        put(&e, &value_key(1), b"one");
        put(&e.inner, &value_key(2), b"two");
        put(&e, &meta, b"meta");
        let ks = [value_key(1), value_key(2), value_key(3), meta];
        assert_eq!(
            get_many(&e, &ks),
            vec![
                (0, Some(b"one".to_vec())),
                (1, Some(b"two".to_vec())),
                (2, None),
                (3, Some(b"meta".to_vec())),
            ]
        );
    }

    #[test]
    fn get_many_answers_keys_of_every_shard_in_order_and_fills_its_misses() {
        let e = CachedEngine::new(MemEngine::default(), 1 << 20);
        let mut ks = Vec::new();
        let mut want = Vec::new();
        // The hasher's seed is random: 1,800 cached keys leave a shard empty with odds of
        // about 1 in 10^10 (450 keys did about once in 18 runs).
        const KEYS: u32 = 2400;
        for i in 0..KEYS {
            let k = value_key(i);
            match i % 4 {
                // A hit.
                0 => {
                    put(&e, &k, format!("c{i}").as_bytes());
                    want.push(Some(format!("c{i}").into_bytes()));
                }
                // A miss that finds a value.
                1 => {
                    put(&e.inner, &k, format!("b{i}").as_bytes());
                    want.push(Some(format!("b{i}").into_bytes()));
                }
                // A miss that finds none.
                2 => want.push(None),
                // A key the cache never holds.
                _ => {
                    let k = keys::meta_key(&format!("m{i}"));
                    put(&e, &k, b"meta");
                    ks.push(k);
                    want.push(Some(b"meta".to_vec()));
                    continue;
                }
            }
            ks.push(k);
        }
        let shards: std::collections::HashSet<usize> = ks
            .iter()
            .filter(|k| cached(k))
            .map(|k| e.shard_of(k))
            .collect();
        assert_eq!(shards.len(), SHARDS, "the keys are in every shard");
        let want: Vec<_> = want.into_iter().enumerate().collect();
        assert_eq!(get_many(&e, &ks), want);
        // What the misses found was cached: the backend is no longer asked.
        for i in (1..KEYS).step_by(4) {
            put(&e.inner, &value_key(i), b"behind the cache's back");
            let found = e.get(&value_key(i)).unwrap();
            assert_eq!(found, Some(format!("b{i}").into_bytes()), "key {i}");
        }
    }

    #[test]
    fn a_write_applies_its_operations_in_order() {
        let e = CachedEngine::new(MemEngine::default(), 1 << 20);
        let (start, end) = (value_key(100), value_key(200));
        let mut batch = WriteBatch::new();
        for i in 0..300 {
            batch.put(value_key(i), b"old".to_vec());
        }
        // A range over many collections, so over every shard, then puts into it again.
        batch.delete_range(start.clone(), end.clone());
        for i in (100..200).step_by(3) {
            batch.put(value_key(i), b"new".to_vec());
        }
        e.write(&batch).unwrap();
        for i in 0..300 {
            let k = value_key(i);
            put(&e.inner, &k, b"behind the cache's back");
            let want: &[u8] = if !(start <= k && k < end) {
                b"old"
            } else if (i - 100) % 3 == 0 {
                b"new"
            } else {
                // Removed from the cache by the range delete: read from the backend.
                b"behind the cache's back"
            };
            assert_eq!(e.get(&k).unwrap().as_deref(), Some(want), "key {i}");
        }
    }

    /// A backend whose large writes wait for a signal, counting the reads that reach it.
    struct Gated {
        inner: MemEngine,
        started: Mutex<std::sync::mpsc::Sender<()>>,
        go: Mutex<std::sync::mpsc::Receiver<()>>,
        fail: bool,
        reads: AtomicUsize,
    }

    /// The seeded key of [`gated_cache`], and its committed value.
    const SEEDED: (u32, &[u8]) = (1, b"a0");

    /// A cache over a [`Gated`] backend (failing its large writes if `fail`), with
    /// [`SEEDED`] written and read back into the cache; and the backend's signals: a large
    /// write started, go on.
    fn gated_cache(
        fail: bool,
    ) -> (
        CachedEngine<Gated>,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel();
        let gated = Gated {
            inner: MemEngine::default(),
            started: Mutex::new(started_tx),
            go: Mutex::new(go_rx),
            fail,
            reads: AtomicUsize::new(0),
        };
        let e = CachedEngine::new(gated, 64 << 20);
        let (key, value) = SEEDED;
        put(&e, &value_key(key), value);
        assert_eq!(e.get(&value_key(key)).unwrap().as_deref(), Some(value));
        (e, started_rx, go_tx)
    }

    impl KvEngine for Gated {
        fn get_with(&self, key: &[u8], f: &mut GetFn<'_>) -> Result<bool> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.inner.get_with(key, f)
        }
        fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
            self.inner.scan(start, end, f)
        }
        fn write(&self, batch: &WriteBatch) -> Result<()> {
            if batch.len() > 1 {
                self.started.lock().unwrap().send(()).unwrap();
                self.go.lock().unwrap().recv().unwrap();
                if self.fail {
                    return Err(crate::StoreError::Storage("injected".into()));
                }
            }
            self.inner.write(batch)
        }
    }

    /// A batch large enough for the parallel updates: `first` set to `value`, then other keys.
    fn large_batch(first: &[u8], value: &[u8]) -> WriteBatch {
        let mut batch = WriteBatch::new();
        batch.put(first.to_vec(), value.to_vec());
        for i in 10..10 + PARALLEL_APPLY_OPS as u32 {
            batch.put(value_key(i), b"x".to_vec());
        }
        batch
    }

    /// Waits until the cache holds at least `bytes` (the parallel updates are done).
    fn wait_for_cached(e: &CachedEngine<Gated>, bytes: usize) {
        let started = std::time::Instant::now();
        while e.cached_bytes() < bytes {
            assert!(
                started.elapsed().as_secs() < 30,
                "the cache's updates never ran"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn a_large_write_is_read_from_the_backend_until_the_backend_accepted_it() {
        let (e, started, go) = gated_cache(false);
        let a = value_key(SEEDED.0);
        let batch = large_batch(&a, b"a1");
        let (during, reads_during) = std::thread::scope(|s| {
            let writer = s.spawn(|| e.write(&batch));
            started.recv().unwrap();
            // The updates ran alongside the write, which the backend has not accepted yet.
            wait_for_cached(&e, PARALLEL_APPLY_OPS * ENTRY_OVERHEAD);
            let reads = e.inner.reads.load(Ordering::SeqCst);
            let during = (e.get(&a).unwrap(), e.get(&value_key(10)).unwrap());
            let reads_during = e.inner.reads.load(Ordering::SeqCst) - reads;
            // Released before asserting, so a failure fails the test instead of hanging it.
            go.send(()).unwrap();
            writer.join().unwrap().unwrap();
            (during, reads_during)
        });
        assert_eq!(during, (Some(SEEDED.1.to_vec()), None));
        assert_eq!(reads_during, 2, "both reads went to the backend");
        // Accepted: now answered by the cache, which the reads during the write left as
        // the write made it.
        let reads = e.inner.reads.load(Ordering::SeqCst);
        assert_eq!(e.get(&a).unwrap().as_deref(), Some(&b"a1"[..]));
        assert_eq!(e.get(&value_key(10)).unwrap().as_deref(), Some(&b"x"[..]));
        assert_eq!(e.inner.reads.load(Ordering::SeqCst), reads);
    }

    #[test]
    fn a_failed_large_write_empties_the_cache_its_updates_ran_ahead_on() {
        let (e, started, go) = gated_cache(true);
        let a = value_key(SEEDED.0);
        let batch = large_batch(&a, b"a1");
        std::thread::scope(|s| {
            let writer = s.spawn(|| e.write(&batch));
            started.recv().unwrap();
            wait_for_cached(&e, PARALLEL_APPLY_OPS * ENTRY_OVERHEAD);
            go.send(()).unwrap();
            assert!(writer.join().unwrap().is_err());
        });
        assert_eq!(e.cached_bytes(), 0);
        assert_eq!(e.get(&a).unwrap().as_deref(), Some(SEEDED.1));
        assert_eq!(e.get(&value_key(10)).unwrap(), None);
    }
}
