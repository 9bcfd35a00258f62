//! The storage backend abstraction: an ordered byte-key store with atomic batched writes.
//!
//! Deliberately small (TiKV `engine_traits` style) so that the RocksDB and in-memory backends
//! share every line of logic above it and one conformance suite. Reads hand out borrowed
//! bytes through callbacks, which lets RocksDB serve pinned blocks without copying.
//!
//! **API boundary:** the trait knows nothing about the key layout; [`crate::keys`] does.

use std::path::Path;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use hashbrown::hash_table::HashTable;

use crate::Result;

/// A point read's callback: receives the stored bytes.
pub type GetFn<'a> = dyn FnMut(&[u8]) -> Result<()> + 'a;

/// A multi-key read's callback: receives the index of a key and its stored bytes, if any.
pub type GetManyFn<'a> = dyn FnMut(usize, Option<&[u8]>) -> Result<()> + 'a;

/// A scan's callback: receives `(key, value)` and returns whether to continue.
pub type ScanFn<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool> + 'a;

/// An ordered key-value backend.
///
/// A callback may run while the backend holds a lock or an open iterator, so callbacks must
/// not call the backend.
pub trait KvEngine: Send + Sync + 'static {
    /// Bytes the backend keeps on disk (0 for backends in memory).
    fn disk_bytes(&self) -> u64 {
        0
    }

    /// Writes a consistent copy of the committed data into the new directory `dir`, cheaply
    /// (a RocksDB checkpoint hard-links the immutable files). Returns `false` if the backend
    /// cannot (backends in memory).
    fn snapshot_to(&self, dir: &Path) -> Result<bool> {
        let _ = dir;
        Ok(false)
    }

    /// Calls `f` with the value stored at `key`, if there is one; returns whether there was.
    fn get_with(&self, key: &[u8], f: &mut GetFn<'_>) -> Result<bool>;

    /// Calls `f` with the index and stored value (if any) of each of `keys`, in order. Faster
    /// than one [`get_with`](Self::get_with) per key on backends that batch lookups,
    /// especially for keys in ascending order.
    fn get_many(&self, keys: &[&[u8]], f: &mut GetManyFn<'_>) -> Result<()> {
        for (i, key) in keys.iter().enumerate() {
            if !self.get_with(key, &mut |v| f(i, Some(v)))? {
                f(i, None)?;
            }
        }
        Ok(())
    }

    /// Hints that `key` is about to be read. A backend whose reads look in a table in memory
    /// may ask the CPU for the key's slot, so the read that follows does not wait for it;
    /// nothing else changes. The default does nothing.
    fn prefetch(&self, _key: &[u8]) {}

    /// Reads ahead: calls `f` with the index and stored value (if any) of each of `keys`
    /// that a point read would not answer from memory, in any order, reading them together
    /// (on RocksDB, sorted and batched). Keys a backend would answer from memory are left
    /// out, so the caller keeps no copy of them. The default reads none (a backend held in
    /// memory).
    fn read_ahead(&self, keys: &[&[u8]], f: &mut GetManyFn<'_>) -> Result<()> {
        let _ = (keys, f);
        Ok(())
    }

    /// Calls `f` for every entry with `start <= key < end`, in ascending key order, until `f`
    /// returns `false`. Memory use is bounded regardless of how many entries the range holds.
    fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()>;

    /// The greatest key with `start <= key < end`, if there is one. Backends with ordered
    /// iterators find it with one seek from the end; this default scans the range.
    fn last_key_in(&self, start: &[u8], end: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut last: Option<Vec<u8>> = None;
        self.scan(start, end, &mut |k, _| {
            let last = last.get_or_insert_with(Vec::new);
            last.clear();
            last.extend_from_slice(k);
            Ok(true)
        })?;
        Ok(last)
    }

    /// Applies `batch` atomically and durably (fsynced before returning), operations in order:
    /// a put after a range delete covering its key survives.
    fn write(&self, batch: &WriteBatch) -> Result<()>;

    /// The value stored at `key`, copied out.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut out = None;
        self.get_with(key, &mut |v| {
            out = Some(v.to_vec());
            Ok(())
        })?;
        Ok(out)
    }
}

/// One operation of a [`WriteBatch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOp {
    /// Sets `key` to `value`.
    Put(Vec<u8>, Vec<u8>),
    /// Removes `key` (a no-op if absent).
    Delete(Vec<u8>),
    /// Removes every key with `start <= key < end`.
    DeleteRange(Vec<u8>, Vec<u8>),
}

impl WriteOp {
    /// Hints the CPU to fetch the start of the operation's key and value (see [`prefetch`]).
    #[inline]
    pub(crate) fn prefetch(&self) {
        match self {
            Self::Put(key, value) | Self::DeleteRange(key, value) => {
                prefetch(key);
                prefetch(value);
            }
            Self::Delete(key) => prefetch(key),
        }
    }
}

/// Empties `ops` in order, asking for the next few operations' bytes while one is freed:
/// freeing a key or value writes to its block, as cold as the copies [`prefetch`] is for.
pub(crate) fn clear_ops(ops: &mut Vec<WriteOp>) {
    for n in 0..ops.len() {
        if let Some(ahead) = ops.get(n + PREFETCH_AHEAD) {
            ahead.prefetch();
        }
        // An empty vector holds no allocation: replacing frees the operation's buffers.
        ops[n] = WriteOp::Delete(Vec::new());
    }
    ops.clear();
}

/// How many operations ahead a pass over a commit's operations asks for the next ones'
/// bytes ([`WriteOp::prefetch`]): far enough for a fetch from memory to arrive in time.
pub(crate) const PREFETCH_AHEAD: usize = 8;

/// Hints the CPU to bring the first bytes of `bytes` into its caches. A commit's keys and
/// values are each their own heap buffer, written while the batch ran and cold by the time
/// the commit copies them (into a table file, the change log, the state cache): without the
/// hint each copy waits on its own cache miss, with it the next ones' misses overlap.
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    prefetch_at(bytes.as_ptr());
}

/// [`prefetch`] for the first bytes of a value behind a pointer (a boxed collection).
#[inline]
pub(crate) fn prefetch_value<T>(value: &T) {
    prefetch_at(std::ptr::from_ref(value).cast());
}

#[inline]
fn prefetch_at(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it reads nothing the program sees and cannot fault.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Where lookups in a hash table start, kept beside the table so that a key's slot can be
/// asked for ([`prefetch`]) without reading the table first: a hint that reads the bucket's
/// control byte to find the entry (as `get_bucket` does) waits on that miss itself. Its
/// fields are atomics so that a shared reference can update them.
///
/// It follows hashbrown's layout: a lookup of `hash` starts at bucket `hash & (buckets - 1)`,
/// whose control byte is that many bytes after the table's control bytes and whose entry is
/// the `(i + 1)`th entry below them. Should hashbrown change either, the hints fetch useless
/// lines; nothing reads through them, so no answer depends on it. A stale location (the
/// table grew since) is as harmless: a prefetch of any address cannot fault.
#[derive(Debug, Default)]
pub(crate) struct SlotHint {
    /// The table's control bytes; null when it has no entry to locate them by.
    ctrl: AtomicPtr<u8>,
    /// Its bucket count when they were located.
    buckets: AtomicUsize,
}

impl SlotHint {
    /// Locates `table`'s slots again if its bucket count changed since they were last
    /// located (a table moves only to grow: clearing and removing keep its memory).
    #[inline]
    pub(crate) fn follow<T>(&self, table: &HashTable<T>) {
        let buckets = table.num_buckets();
        if buckets != self.buckets.load(Ordering::Relaxed) {
            self.locate(table, buckets);
        }
    }

    #[cold]
    fn locate<T>(&self, table: &HashTable<T>, buckets: usize) {
        if table.is_empty() {
            // No entry to locate the slots by (a table made room for before its first
            // insert): looked at again by the next call.
            self.ctrl.store(std::ptr::null_mut(), Ordering::Relaxed);
            self.buckets.store(0, Ordering::Relaxed);
            return;
        }
        // Any full bucket tells where the control bytes are: the first is a few buckets in.
        let ctrl = (0..buckets)
            .find_map(|i| {
                let entry = std::ptr::from_ref(table.get_bucket(i)?).cast::<u8>();
                Some(entry.wrapping_add((i + 1) * size_of::<T>()))
            })
            .unwrap_or(std::ptr::null());
        self.ctrl.store(ctrl.cast_mut(), Ordering::Relaxed);
        self.buckets.store(buckets, Ordering::Relaxed);
    }

    /// Hints the CPU to fetch the control bytes and the entry where a lookup of `hash` in a
    /// table of `T`s starts: a short key's entry holds all a lookup compares.
    #[inline]
    pub(crate) fn prefetch<T>(&self, hash: u64) {
        if let Some((ctrl, entry)) = self.start::<T>(hash) {
            prefetch_at(ctrl);
            prefetch_at(entry);
        }
    }

    /// Where a lookup of `hash` starts: its control byte and its entry.
    #[inline]
    fn start<T>(&self, hash: u64) -> Option<(*const u8, *const u8)> {
        let ctrl = self.ctrl.load(Ordering::Relaxed).cast_const();
        if ctrl.is_null() {
            return None;
        }
        let at = hash as usize & self.buckets.load(Ordering::Relaxed).wrapping_sub(1);
        Some((
            ctrl.wrapping_add(at),
            ctrl.wrapping_sub((at + 1) * size_of::<T>()),
        ))
    }
}

/// An ordered list of writes applied atomically by [`KvEngine::write`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<WriteOp>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// A batch of `ops`, in order (the vector's spare room is kept for more).
    pub fn from_ops(ops: Vec<WriteOp>) -> Self {
        Self { ops }
    }

    /// Appends `op`.
    pub fn push(&mut self, op: WriteOp) {
        self.ops.push(op);
    }

    /// Appends a put.
    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.ops.push(WriteOp::Put(key, value));
    }

    /// Appends a point delete.
    pub fn delete(&mut self, key: Vec<u8>) {
        self.ops.push(WriteOp::Delete(key));
    }

    /// Appends a delete of `[start, end)`.
    pub fn delete_range(&mut self, start: Vec<u8>, end: Vec<u8>) {
        self.ops.push(WriteOp::DeleteRange(start, end));
    }

    /// Appends `ops`, in order.
    pub fn append(&mut self, mut ops: Vec<WriteOp>) {
        if self.ops.is_empty() {
            // Adopt the vector instead of copying it (keeping the bigger allocation).
            if ops.capacity() >= self.ops.capacity() {
                self.ops = ops;
                return;
            }
        }
        self.ops.append(&mut ops);
    }

    /// Reserves room for `additional` more operations.
    pub fn reserve(&mut self, additional: usize) {
        self.ops.reserve(additional);
    }

    /// The operations, in application order.
    pub fn ops(&self) -> &[WriteOp] {
        &self.ops
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch holds no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The operations, consumed, in application order.
    pub fn into_ops(self) -> Vec<WriteOp> {
        self.ops
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

    use super::*;

    /// The hint's reading of hashbrown's layout: should an update change it, this fails
    /// (the hints would fetch useless lines; see [`SlotHint`]).
    #[test]
    fn slot_hint_finds_where_lookups_start() {
        // A fixed hash (SipHash with zero keys), not hashbrown's randomly seeded one: how
        // many keys sit where their lookup starts varies with the seed.
        let hasher = BuildHasherDefault::<DefaultHasher>::default();
        let mut table: HashTable<(u64, [u8; 56])> = HashTable::new();
        let hint = SlotHint::default();
        hint.follow(&table);
        assert_eq!(hint.start::<(u64, [u8; 56])>(1), None, "an empty table");
        for n in 0..1000u64 {
            table.insert_unique(hasher.hash_one(n), (n, [0; 56]), |e| hasher.hash_one(e.0));
            hint.follow(&table);
        }
        let mut at_start = 0;
        for n in 0..1000u64 {
            let hash = hasher.hash_one(n);
            let index = table.find_bucket_index(hash, |e| e.0 == n).unwrap();
            let (_, entry) = hint.start::<(u64, [u8; 56])>(hash).unwrap();
            if index == hash as usize & (table.num_buckets() - 1) {
                at_start += 1;
                let found = std::ptr::from_ref(table.get_bucket(index).unwrap()).cast::<u8>();
                assert_eq!(entry, found, "key {n}");
            }
        }
        // Most keys sit in the bucket their lookup starts at.
        assert!(at_start > 500, "{at_start} of 1000");

        // A table given room before its first insert is located once it has an entry.
        let mut table: HashTable<(u64, [u8; 56])> = HashTable::with_capacity(100);
        let hint = SlotHint::default();
        hint.follow(&table);
        assert_eq!(
            hint.start::<(u64, [u8; 56])>(1),
            None,
            "nothing to locate it by"
        );
        let hash = hasher.hash_one(7u64);
        table.insert_unique(hash, (7, [0; 56]), |e| hasher.hash_one(e.0));
        hint.follow(&table);
        let index = table.find_bucket_index(hash, |e| e.0 == 7).unwrap();
        let found = std::ptr::from_ref(table.get_bucket(index).unwrap()).cast::<u8>();
        assert_eq!(hint.start::<(u64, [u8; 56])>(hash).unwrap().1, found);
    }

    #[test]
    fn clear_ops_empties_lists_of_every_length_and_keeps_their_room() {
        for len in [
            0,
            1,
            PREFETCH_AHEAD - 1,
            PREFETCH_AHEAD,
            PREFETCH_AHEAD + 1,
            50,
        ] {
            let mut ops: Vec<WriteOp> = (0..len)
                .map(|i| {
                    let key = vec![i as u8; 40];
                    match i % 3 {
                        0 => WriteOp::Put(key, vec![7; 100]),
                        1 => WriteOp::Delete(key),
                        _ => WriteOp::DeleteRange(Vec::new(), key),
                    }
                })
                .collect();
            let room = ops.capacity();
            clear_ops(&mut ops);
            assert!(ops.is_empty(), "{len} operations");
            assert_eq!(ops.capacity(), room, "{len} operations");
        }
    }
}
