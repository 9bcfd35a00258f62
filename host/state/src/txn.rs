//! The per-partition batch overlay.
//!
//! (One file on purpose, ~970 lines: every operation below reads and writes the same
//! overlay under the same invariants — read-your-writes, cleared collections, sorted seals —
//! and splitting them by state kind would spread those invariants over several files.)
//!
//! A [`PartitionTxn`] buffers one partition's writes of one micro-batch in memory and reads
//! through them (read-your-writes) to the committed state.
//!
//! Every value, list and map operation touches the keys of one `(namespace, variable,
//! grouping key)` prefix, and every timer operation one grouping key's timers, so the overlay
//! is keyed by that locality:
//! - `vars`: a hash map from `[var][keylen][key]` to the value slot, list and map of that
//!   variable and grouping key. A point read or write is one hash lookup plus a search in a
//!   collection holding only this batch's writes to that one list or map.
//! - `timers`: a hash map from `[keylen][key]` to that grouping key's timers-by-key writes.
//! - `ordered`: the timers-by-time and TTL index writes, by full key, appended as they come
//!   and put in order when they are scanned across grouping keys
//!   ([`PartitionTxn::timers_due`], [`PartitionTxn::ttl_cleanup`]) or sealed (see
//!   [`crate::marks`]).
//!
//! Clearing a list or map turns its committed entries invisible (the collection's
//! [`Base`]); the commit removes them with point deletes when there were few (the common
//! case) and with one range tombstone for big ones: RocksDB pays for every range tombstone
//! on reads until compaction, so they are kept for where they save real work.
//!
//! [`PartitionTxn::seal`] turns the overlay into write-batch operations sorted by key (the
//! ordering work runs on the partition's worker thread, and RocksDB inserts sorted keys into
//! its memtable fastest); [`Checkpoint::commit`](crate::Checkpoint::commit) only concatenates
//! them.

use std::cell::RefCell;
use std::fmt;
use std::ops::Bound::{Excluded, Included, Unbounded};
use std::sync::Arc;

use crate::ahead::{Ahead, Shapes};
use crate::changelog::{self, Log};
use crate::engine::{KvEngine, PREFETCH_AHEAD, ScanFn, WriteOp, prefetch, prefetch_value};
use crate::keys::{self, check_key};
use crate::marks::Marks;
use crate::overlay::{Base, Coll, PrefixMap, Slot, SmallBytes, sort_by_bytes};
use crate::value::Header;
use crate::{Partition, Result, StoreError, StoredValue, VarId};

/// TTL index entries read per scan in [`PartitionTxn::ttl_cleanup`], which looks their values
/// up between scans.
const TTL_CLEANUP_CHUNK: usize = 1024;

/// Where [`PartitionTxn::timers_due_from`] resumes its reading of timers.
#[derive(Debug, Default)]
pub struct DueCursor {
    /// Committed by-time entries before this key were returned (or were deleted), and so
    /// were buffered ones written before the last page was read.
    committed_from: Option<Vec<u8>>,
    /// The overlay's settlings of timer writes when the last page was read: writes since
    /// are after them (see [`Marks::least_written_since`]).
    settlings: usize,
}

/// The batch overlay of one partition.
///
/// All state reads see the committed state plus this overlay's writes, and hide values whose
/// `expires_at_ms <= ttl_clock` when a TTL clock is set. `Send` (moved into a worker thread),
/// not shared.
pub struct PartitionTxn {
    engine: Arc<dyn KvEngine>,
    partition: Partition,
    ttl_clock: Option<i64>,
    /// Committed timers and TTL index entries before this time are known to be gone.
    time_floor: Option<i64>,
    overlay: Overlay,
    /// Set by [`Self::seal`]: the overlay as write-batch operations.
    sealed: Option<Sealed>,
    /// Reused buffer for building keys: `[ns]` followed by the overlay's hash key, then
    /// whatever suffix a backend read needs.
    scratch: RefCell<Vec<u8>>,
    /// What the batch's reads of committed values, list elements and map entries found
    /// (those not read ahead, which [`Self::ahead`] holds): the before-images the change
    /// log needs of the ones it then writes, known without reading them again at
    /// [`Self::seal`].
    reads: RefCell<Reads>,
    /// Committed state read ahead for the batch's keys, and the shapes of its reads learned
    /// for the next batch (see [`crate::ahead`]).
    ahead: RefCell<Ahead>,
}

/// Bytes [`Reads`] may hold per transaction, its list's spare room aside (at most as much
/// again). Past it a read is not kept, and the seal reads the key again if the batch wrote
/// it: a batch reading many large values does not hold a second copy of them all. Each
/// worker holds one partition's until its seal; the counter's 100k keys on 4 partitions
/// keep ~3 MiB per partition. Reads answered by the read-ahead are not kept: it holds them.
const READS_LIMIT: usize = 16 << 20;

/// The committed bytes (`None`: none) each kept read of a [`PartitionTxn`] found, by full
/// key.
#[derive(Default)]
struct Reads {
    kept: Vec<(SmallBytes, Option<SmallBytes>)>,
    /// What `kept` holds: its entries and the heap copies of long keys and values.
    bytes: usize,
}

impl Reads {
    /// Bytes a kept read of a `key_len`-byte key that found `value_len` bytes takes.
    fn cost(key_len: usize, value_len: usize) -> usize {
        size_of::<(SmallBytes, Option<SmallBytes>)>()
            + SmallBytes::heap_len(key_len)
            + SmallBytes::heap_len(value_len)
    }

    /// Keeps a copy of what a read of `key` found, if there is room.
    fn keep(&mut self, key: &[u8], found: Option<&[u8]>) {
        let cost = Self::cost(key.len(), found.map_or(0, <[u8]>::len));
        if self.bytes + cost <= READS_LIMIT {
            self.bytes += cost;
            self.kept
                .push((SmallBytes::new(key), found.map(SmallBytes::new)));
        }
    }
}

/// The buffered writes (see the module documentation).
#[derive(Default)]
struct Overlay {
    vars: PrefixMap<VarBucket>,
    timers: PrefixMap<Coll>,
    /// Full key → `true` puts the (empty) entry, `false` deletes it. Scans put it in order
    /// through a shared reference.
    ordered: RefCell<Marks>,
    /// Point writes the commit will carry, `ordered`'s aside.
    writes: usize,
    /// Grouping keys `timers` makes room for at its first write (see
    /// [`PartitionTxn::reserve`]).
    timer_keys: usize,
}

/// One variable's writes for one grouping key.
#[derive(Default)]
struct VarBucket {
    value: Option<Slot>,
    list: Option<Box<Coll>>,
    map: Option<Box<Coll>>,
}

impl VarBucket {
    /// Hints the CPU to fetch what sealing the bucket reads: the value's bytes and the
    /// collections' (each its own heap allocation, cold by the end of the batch).
    #[inline]
    fn prefetch(&self) {
        if let Some(Some(value)) = &self.value {
            prefetch(value);
        }
        for coll in [&self.list, &self.map].into_iter().flatten() {
            prefetch_value(&**coll);
        }
    }
}

/// A sealed overlay, ready for the write batch.
struct Sealed {
    ops: Vec<WriteOp>,
    point_writes: usize,
    /// Bytes of keys and values `ops` and `changes` write (see
    /// [`PartitionTxn::written_bytes`]).
    bytes: u64,
    /// The change log entries of `ops`' point writes (see [`crate::changelog`]), with their
    /// counts and chunks; the commit adds the keys `ops`' range tombstones remove. Reading
    /// the before-images may fail; the commit reports it.
    changes: Result<Log>,
}

impl PartitionTxn {
    pub(crate) fn new(engine: Arc<dyn KvEngine>, partition: Partition, shapes: Shapes) -> Self {
        Self {
            engine,
            partition,
            ttl_clock: None,
            time_floor: None,
            overlay: Overlay::default(),
            sealed: None,
            scratch: RefCell::new(Vec::with_capacity(64)),
            reads: RefCell::default(),
            ahead: RefCell::new(Ahead::new(shapes)),
        }
    }

    /// The partition this transaction belongs to.
    pub fn partition(&self) -> Partition {
        self.partition
    }

    /// Sets the TTL clock: reads hide values with `expires_at_ms <= now_ms`. `None` shows
    /// every value.
    pub fn set_ttl_clock(&mut self, now_ms: Option<i64>) {
        self.ttl_clock = now_ms;
    }

    /// Declares that no committed timer and no committed TTL index entry is earlier than
    /// `floor_ms`: the previous batch fired every timer and cleaned every expiry up to
    /// `floor_ms - 1`. [`PartitionTxn::timers_due`] and [`PartitionTxn::ttl_cleanup`] then
    /// start their scans of committed data there, instead of wading through the delete
    /// tombstones that firing and cleanup leave behind in RocksDB. Entries written in this
    /// batch are always seen.
    pub fn set_time_floor(&mut self, floor_ms: Option<i64>) {
        self.time_floor = floor_ms;
    }

    /// Where a scan of committed by-time entries may start.
    fn floor_key(&self, start: &[u8], ns_range_start: impl Fn(i64) -> Vec<u8>) -> Vec<u8> {
        match self.time_floor {
            Some(floor) => ns_range_start(floor).max(start.to_vec()),
            None => start.to_vec(),
        }
    }

    // ---- ValueState ----

    /// The value state `var` holds for grouping key `key` (canonical key bytes).
    pub fn value_get(&self, var: VarId, key: &[u8]) -> Result<Option<StoredValue>> {
        self.check_open();
        check_key(key)?;
        let mut k = self.scratch.borrow_mut();
        keys::var_key_prefix_into(&mut k, keys::VALUE, var, key);
        match self
            .overlay
            .vars
            .get(&k[1..])
            .and_then(|b| b.value.as_ref())
        {
            Some(slot) => live(slot.as_deref(), self.ttl_clock),
            None => self.get_committed(&k),
        }
    }

    /// Sets the value of value state `var` for `key`.
    pub fn value_put(&mut self, var: VarId, key: &[u8], value: StoredValue) -> Result<()> {
        self.check_open();
        check_key(key)?;
        let k = self.scratch.get_mut();
        keys::var_key_prefix_into(k, keys::VALUE, var, key);
        let o = &mut self.overlay;
        if let Some(expiry) = value.expires_at_ms {
            o.mark(index_key(keys::TTL, self.partition, expiry, k, &[]), true);
        }
        o.put_value_slot(&k[1..], Some(value.encode()));
        Ok(())
    }

    /// Removes the value of value state `var` for `key` (a no-op if there is none).
    pub fn value_delete(&mut self, var: VarId, key: &[u8]) -> Result<()> {
        self.check_open();
        check_key(key)?;
        let k = self.scratch.get_mut();
        keys::var_key_prefix_into(k, keys::VALUE, var, key);
        self.overlay.put_value_slot(&k[1..], None);
        Ok(())
    }

    // ---- ListState ----

    /// Whether list `var` of `key` has at least one live element.
    pub fn list_exists(&self, var: VarId, key: &[u8]) -> Result<bool> {
        self.check_open();
        check_key(key)?;
        let mut k = self.scratch.borrow_mut();
        keys::var_key_prefix_into(&mut k, keys::LIST, var, key);
        self.any_live(self.list(&k), &k)
    }

    /// Up to `max` live elements with sequence > `after` (`None`: from the start), ascending.
    ///
    /// Reads only as far as the page needs, so million-element lists are read page by page.
    pub fn list_page(
        &self,
        var: VarId,
        key: &[u8],
        after: Option<u64>,
        max: usize,
    ) -> Result<Vec<(u64, StoredValue)>> {
        self.list_page_within(var, key, after, max, usize::MAX)
    }

    /// Like [`list_page`](Self::list_page), but the page also ends once its payloads hold
    /// `max_bytes` (it always holds at least one element, if any is left): how the host
    /// bounds what one page of a guest's iterator costs.
    pub fn list_page_within(
        &self,
        var: VarId,
        key: &[u8],
        after: Option<u64>,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, StoredValue)>> {
        self.check_open();
        check_key(key)?;
        let first = match after.map(|s| s.checked_add(1)) {
            None => 0,
            Some(Some(first)) => first,
            Some(None) => return Ok(Vec::new()),
        };
        let mut out = Vec::with_capacity(max.min(1024));
        if max == 0 {
            return Ok(out);
        }
        let mut k = self.scratch.borrow_mut();
        keys::var_key_prefix_into(&mut k, keys::LIST, var, key);
        let clock = self.ttl_clock;
        let first = first.to_be_bytes();
        let from = if after.is_some() {
            Included(&first[..])
        } else {
            Unbounded
        };
        let mut bytes = 0usize;
        Coll::scan(self.list(&k), &*self.engine, &k, from, &mut |suffix, v| {
            let header = Header::decode(v)?;
            if header.is_live(clock) {
                let value = header.to_owned();
                bytes = bytes.saturating_add(value.payload.len());
                out.push((decode_seq(suffix)?, value));
            }
            Ok(out.len() < max && bytes < max_bytes)
        })?;
        Ok(out)
    }

    /// Replaces all elements of list `var` of `key` with `values`, in order.
    pub fn list_put(&mut self, var: VarId, key: &[u8], values: Vec<StoredValue>) -> Result<()> {
        self.list_clear(var, key)?;
        self.list_append(var, key, values)
    }

    /// Appends `values` to list `var` of `key`, in order.
    pub fn list_append(&mut self, var: VarId, key: &[u8], values: Vec<StoredValue>) -> Result<()> {
        self.check_open();
        check_key(key)?;
        if values.is_empty() {
            return Ok(());
        }
        let k = self.scratch.get_mut();
        keys::var_key_prefix_into(k, keys::LIST, var, key);
        let Overlay {
            vars,
            ordered,
            writes,
            ..
        } = &mut self.overlay;
        let ordered = ordered.get_mut();
        let (ahead, engine, partition) = (self.ahead.get_mut(), &*self.engine, self.partition);
        let k: &[u8] = k;
        let added = vars.with_value(&k[1..], |bucket| -> Result<isize> {
            let list = bucket.list.get_or_insert_default();
            let first = match list.next_seq {
                Some(next) => next,
                None => {
                    // The metadata key differs from the prefix in its namespace byte only.
                    let meta = SmallBytes::from_parts(&[&[keys::LIST_META], &k[1..]]);
                    ahead.note(&meta);
                    let next = read_ahead_or_with(engine, ahead, &meta, decode_next_seq)?;
                    let next = next.unwrap_or(0);
                    list.committed_next = Some(next);
                    next
                }
            };
            let next = u64::try_from(values.len())
                .ok()
                .and_then(|n| first.checked_add(n))
                .ok_or_else(|| StoreError::Corrupt("list sequence overflow".into()))?;
            let mut added = 0;
            for (seq, value) in (first..).zip(values) {
                let seq = seq.to_be_bytes();
                if let Some(expiry) = value.expires_at_ms {
                    let key = index_key(keys::TTL, partition, expiry, k, &seq);
                    ordered.mark(key, true);
                }
                added += list.write(&seq, Some(value.encode()));
            }
            list.next_seq = Some(next);
            if !list.meta_dirty {
                list.meta_dirty = true;
                added += 1;
            }
            Ok(added)
        })?;
        add(writes, added);
        Ok(())
    }

    /// Removes every element of list `var` of `key`.
    pub fn list_clear(&mut self, var: VarId, key: &[u8]) -> Result<()> {
        self.check_open();
        check_key(key)?;
        let k = self.scratch.get_mut();
        keys::var_key_prefix_into(k, keys::LIST, var, key);
        let o = &mut self.overlay;
        let list = o.vars.get_or_default(&k[1..]).list.get_or_insert_default();
        let mut change = list.clear(&*self.engine, k)?;
        // With the elements gone, the sequence restarts at 0.
        list.next_seq = Some(0);
        if !list.meta_dirty {
            list.meta_dirty = true;
            change += 1;
        }
        add(&mut o.writes, change);
        Ok(())
    }

    // ---- MapState ----

    /// Whether map `var` of `key` has at least one live entry.
    pub fn map_exists(&self, var: VarId, key: &[u8]) -> Result<bool> {
        self.check_open();
        check_key(key)?;
        let mut k = self.scratch.borrow_mut();
        keys::var_key_prefix_into(&mut k, keys::MAP, var, key);
        self.any_live(self.map(&k), &k)
    }

    /// The value of `user_key` in map `var` of `key`.
    pub fn map_get(&self, var: VarId, key: &[u8], user_key: &[u8]) -> Result<Option<StoredValue>> {
        self.check_open();
        check_key(key)?;
        let mut k = self.scratch.borrow_mut();
        keys::var_key_prefix_into(&mut k, keys::MAP, var, key);
        if let Some(map) = self.map(&k) {
            if let Some(slot) = map.entries.get(user_key) {
                return live(slot.as_deref(), self.ttl_clock);
            }
            if map.is_cleared() {
                return Ok(None);
            }
        }
        k.extend_from_slice(user_key);
        self.get_committed(&k)
    }

    /// Sets `user_key` of map `var` of `key` to `value`.
    pub fn map_put(
        &mut self,
        var: VarId,
        key: &[u8],
        user_key: &[u8],
        value: StoredValue,
    ) -> Result<()> {
        self.check_open();
        check_key(key)?;
        let k = self.scratch.get_mut();
        keys::var_key_prefix_into(k, keys::MAP, var, key);
        let Overlay {
            vars,
            ordered,
            writes,
            ..
        } = &mut self.overlay;
        if let Some(expiry) = value.expires_at_ms {
            let key = index_key(keys::TTL, self.partition, expiry, k, user_key);
            ordered.get_mut().mark(key, true);
        }
        let change = vars.with_value(&k[1..], |bucket| {
            let map = bucket.map.get_or_insert_default();
            map.write(user_key, Some(value.encode()))
        });
        add(writes, change);
        Ok(())
    }

    /// Removes `user_key` from map `var` of `key` (a no-op if absent).
    pub fn map_remove(&mut self, var: VarId, key: &[u8], user_key: &[u8]) -> Result<()> {
        self.check_open();
        check_key(key)?;
        let k = self.scratch.get_mut();
        keys::var_key_prefix_into(k, keys::MAP, var, key);
        let o = &mut self.overlay;
        let map = o.vars.get_or_default(&k[1..]).map.get_or_insert_default();
        add(&mut o.writes, map.write(user_key, None));
        Ok(())
    }

    /// Up to `max` live entries with user key > `after` (`None`: from the start), ascending
    /// by user key bytes.
    pub fn map_page(
        &self,
        var: VarId,
        key: &[u8],
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<(Vec<u8>, StoredValue)>> {
        self.map_page_within(var, key, after, max, usize::MAX)
    }

    /// Like [`map_page`](Self::map_page), but the page also ends once its user keys and
    /// payloads hold `max_bytes` (it always holds at least one entry, if any is left).
    pub fn map_page_within(
        &self,
        var: VarId,
        key: &[u8],
        after: Option<&[u8]>,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(Vec<u8>, StoredValue)>> {
        self.check_open();
        check_key(key)?;
        let mut out = Vec::with_capacity(max.min(1024));
        if max == 0 {
            return Ok(out);
        }
        let mut k = self.scratch.borrow_mut();
        keys::var_key_prefix_into(&mut k, keys::MAP, var, key);
        let clock = self.ttl_clock;
        let from = after.map_or(Unbounded, Excluded);
        let mut bytes = 0usize;
        Coll::scan(self.map(&k), &*self.engine, &k, from, &mut |suffix, v| {
            let header = Header::decode(v)?;
            if header.is_live(clock) {
                let value = header.to_owned();
                bytes = bytes.saturating_add(suffix.len() + value.payload.len());
                out.push((suffix.to_vec(), value));
            }
            Ok(out.len() < max && bytes < max_bytes)
        })?;
        Ok(out)
    }

    /// Removes every entry of map `var` of `key`.
    pub fn map_clear(&mut self, var: VarId, key: &[u8]) -> Result<()> {
        self.check_open();
        check_key(key)?;
        let k = self.scratch.get_mut();
        keys::var_key_prefix_into(k, keys::MAP, var, key);
        let o = &mut self.overlay;
        let map = o.vars.get_or_default(&k[1..]).map.get_or_insert_default();
        let change = map.clear(&*self.engine, k)?;
        add(&mut o.writes, change);
        Ok(())
    }

    // ---- Timers ----

    /// Registers timer `(key, ts)`; registering an existing timer is a no-op.
    pub fn timer_register(&mut self, key: &[u8], ts: i64) -> Result<()> {
        self.set_timer(key, ts, true)
    }

    /// Deletes timer `(key, ts)`; deleting a missing timer is a no-op.
    pub fn timer_delete(&mut self, key: &[u8], ts: i64) -> Result<()> {
        self.set_timer(key, ts, false)
    }

    /// Whether timer `(key, ts)` is registered: a point read, unlike [`PartitionTxn::timer_list`].
    pub fn timer_exists(&self, key: &[u8], ts: i64) -> Result<bool> {
        self.check_open();
        check_key(key)?;
        let mut k = self.scratch.borrow_mut();
        keys::timer_key_prefix_into(&mut k, key);
        let suffix = keys::encode_i64(ts);
        if let Some(timers) = self.overlay.timers.get(&k[1..]) {
            if let Some(slot) = timers.entries.get(&suffix) {
                return Ok(slot.is_some());
            }
            if timers.is_cleared() {
                return Ok(false);
            }
        }
        k.extend_from_slice(&suffix);
        Ok(self.engine.get(&k)?.is_some())
    }

    /// The timestamps of `key`'s timers, ascending.
    pub fn timer_list(&self, key: &[u8]) -> Result<Vec<i64>> {
        self.timer_list_upto(key, usize::MAX)
    }

    /// Like [`timer_list`](Self::timer_list), but stops after `max` timers: a caller that
    /// asks for one more than it accepts learns that there are too many without reading
    /// them all.
    pub fn timer_list_upto(&self, key: &[u8], max: usize) -> Result<Vec<i64>> {
        self.check_open();
        check_key(key)?;
        let mut k = self.scratch.borrow_mut();
        keys::timer_key_prefix_into(&mut k, key);
        let mut out = Vec::new();
        let timers = self.overlay.timers.get(&k[1..]);
        Coll::scan(timers, &*self.engine, &k, Unbounded, &mut |suffix, _| {
            out.push(keys::decode_timer_by_key(suffix, 0)?);
            Ok(out.len() < max)
        })?;
        Ok(out)
    }

    /// This partition's timers with `ts <= upto`, ascending by `(ts, key)`, at most `max`.
    pub fn timers_due(&self, upto: i64, max: usize) -> Result<Vec<(i64, Vec<u8>)>> {
        self.timers_due_from(upto, max, &mut DueCursor::default())
    }

    /// [`timers_due`](Self::timers_due) page by page, for a caller that fires (or finds
    /// deleted) every timer of a page before asking for the next: committed timers up to
    /// the last one `cursor` returned are not read again, so firing many timers reads the
    /// committed index once instead of once per page. This batch's timers are read from
    /// the cursor too, but from the least one written since the last page where that is
    /// earlier: a due timer a handler registers, however early, is returned.
    pub fn timers_due_from(
        &self,
        upto: i64,
        max: usize,
        cursor: &mut DueCursor,
    ) -> Result<Vec<(i64, Vec<u8>)>> {
        self.check_open();
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        let (start, end) = keys::timer_time_range_upto(self.partition, upto);
        let mut committed_start =
            self.floor_key(&start, |t| keys::timer_time_range_from(self.partition, t));
        // This batch's timers before the cursor were returned by the pages before, unless
        // written since the last page (a handler may register a due timer however early):
        // they are read from the least key written since, not from the start, so firing
        // page by page does not read every page's deletes again.
        let (least_written, settlings) = self
            .overlay
            .ordered
            .borrow_mut()
            .least_written_since(cursor.settlings);
        cursor.settlings = settlings;
        let mut buffered_start = start.clone();
        if let Some(after) = &cursor.committed_from {
            committed_start = committed_start.max(after.clone());
            buffered_start = match least_written {
                Some(least) if least.as_slice() < after.as_slice() => start.max(least.into_vec()),
                _ => after.clone(),
            };
        }
        let mut last = None;
        self.scan_ordered(&buffered_start, &committed_start, &end, &mut |k, _| {
            let (ts, key) = keys::decode_timer_by_time(k)?;
            out.push((ts, key.to_vec()));
            if out.len() < max {
                return Ok(true);
            }
            last = Some(keys::key_successor(k));
            Ok(false)
        })?;
        // A full page stopped at `last`: every committed entry before it was seen. A short
        // page saw every committed entry up to `upto`.
        cursor.committed_from = Some(last.unwrap_or(end));
        Ok(out)
    }

    /// Whether timer `(key, ts)`, returned as due by [`timers_due`](Self::timers_due) in
    /// this batch, is still registered. Reads only this batch's writes: the timer was
    /// registered when it was returned (the index by time, which the scan read, mirrors
    /// the one by key), so only a write since can have deleted it.
    pub fn due_timer_still_registered(&self, key: &[u8], ts: i64) -> Result<bool> {
        self.check_open();
        check_key(key)?;
        let mut k = self.scratch.borrow_mut();
        keys::timer_key_prefix_into(&mut k, key);
        let Some(timers) = self.overlay.timers.get(&k[1..]) else {
            return Ok(true);
        };
        Ok(match timers.entries.get(&keys::encode_i64(ts)) {
            Some(slot) => slot.is_some(),
            None => !timers.is_cleared(),
        })
    }

    // ---- TTL ----

    /// Physically removes this partition's values, list elements and map entries with
    /// `expires_at_ms <= now_ms`, through the TTL index written alongside every value with an
    /// expiry. Returns how many were removed.
    ///
    /// An index entry whose value was since overwritten (with another expiry) or removed is
    /// stale: it is dropped and the current value is left alone.
    pub fn ttl_cleanup(&mut self, now_ms: i64) -> Result<u64> {
        self.check_open();
        let (mut start, end) = keys::ttl_range_upto(self.partition, now_ms);
        let committed_start = self.floor_key(&start, |t| keys::ttl_range_from(self.partition, t));
        let mut removed = 0;
        let mut chunk: Vec<SmallBytes> = Vec::new();
        // The index entries looked at, deleted once the scan is over: each chunk's scan
        // starts past the last, so none needs to see an earlier one's deletes, and the
        // overlay then puts them in order once instead of at every chunk.
        let mut seen: Vec<SmallBytes> = Vec::new();
        loop {
            let engine_start = committed_start.clone().max(start.clone());
            self.scan_ordered(&start, &engine_start, &end, &mut |k, _| {
                chunk.push(SmallBytes::new(k));
                Ok(chunk.len() < TTL_CLEANUP_CHUNK)
            })?;
            for index_key in &chunk {
                let (expiry, state_key) = keys::decode_ttl_key(index_key)?;
                if self.state_expiry(state_key)? == Some(Some(expiry)) {
                    self.delete_state(state_key)?;
                    removed += 1;
                }
            }
            let next = match chunk.last() {
                Some(last) if chunk.len() == TTL_CLEANUP_CHUNK => Some(keys::key_successor(last)),
                _ => None,
            };
            seen.append(&mut chunk);
            match next {
                Some(next) => start = next,
                None => break,
            }
        }
        for index_key in seen {
            self.overlay.mark(index_key, false);
        }
        if removed > 0 {
            tracing::debug!(partition = self.partition, removed, "TTL cleanup");
        }
        Ok(removed)
    }

    /// Reads ahead, for each of the batch's grouping keys `keys` (in the order they will be
    /// called), the committed state the batches before read for theirs, where the backend
    /// would not answer it from memory (see the `ahead` module). Call it before the batch's
    /// first read; the reads then find it without a trip to the backend each.
    pub fn read_ahead<'k>(&mut self, keys: impl Iterator<Item = &'k [u8]>) -> Result<()> {
        self.check_open();
        self.ahead.get_mut().read(&*self.engine, keys)
    }

    /// Hints that grouping key `key`'s state is read next: the backend may bring the slots
    /// of the reads a key made in earlier batches into the CPU's caches (see
    /// [`KvEngine::prefetch`]). Changes nothing a read returns.
    pub fn prefetch(&mut self, key: &[u8]) {
        let buf = self.scratch.get_mut();
        self.ahead.get_mut().prefetch(&*self.engine, key, buf);
    }

    /// Reads [`Self::read_ahead`] keeps.
    #[cfg(test)]
    pub(crate) fn read_ahead_len(&self) -> usize {
        self.ahead.borrow().len()
    }

    /// Makes room for writes to `keys` grouping keys' state, `vars_per_key` variables each,
    /// when the caller knows about how many the batch will write: buffering them then does
    /// not grow (and rehash) the write buffer again and again as the batch goes. The room
    /// for their timers is made when the first timer is written, so a processor without
    /// timers pays nothing for it. A hint: room that cannot be allocated is not made.
    pub fn reserve(&mut self, keys: usize, vars_per_key: usize) {
        self.check_open();
        self.overlay.vars.reserve(keys.saturating_mul(vars_per_key));
        self.overlay.timer_keys = keys;
    }

    /// Number of point writes buffered (for metrics and memory bounds).
    pub fn pending_writes(&self) -> usize {
        match &self.sealed {
            Some(sealed) => sealed.point_writes,
            None => self.overlay.writes + self.overlay.ordered.borrow_mut().len(),
        }
    }

    // ---- Commit support ----

    /// Prepares the transaction for [`Checkpoint::commit`](crate::Checkpoint::commit): turns
    /// the overlay into write-batch operations sorted by key. Call it on the partition's
    /// worker thread once the batch's reads and writes are done, so the commit (which seals
    /// any transaction not yet sealed) only concatenates. Also builds the change log
    /// entries of the point writes. Idempotent.
    ///
    /// # Panics
    ///
    /// Reading or writing state through a sealed transaction panics: its writes are no
    /// longer readable.
    pub fn seal(&mut self) {
        if self.sealed.is_none() {
            let mut overlay = std::mem::take(&mut self.overlay);
            let point_writes = overlay.writes + overlay.ordered.get_mut().len();
            let new_timers_from = if overlay.timers.is_empty() {
                None
            } else {
                self.new_timers_from()
            };
            let (ops, fresh) = overlay.into_ops(new_timers_from);
            let reads = sort_by_bytes(std::mem::take(&mut self.reads.get_mut().kept), |(k, _)| k);
            let ahead = self.ahead.get_mut();
            let known = known_befores(&ops, &fresh, &reads, ahead);
            let op_bytes: usize = ops
                .iter()
                .map(|op| match op {
                    WriteOp::Put(k, v) => k.len() + v.len(),
                    WriteOp::Delete(k) => k.len(),
                    WriteOp::DeleteRange(start, end) => start.len() + end.len(),
                })
                .sum();
            // Room for every operation logged with a before-image as large as its value: the
            // log is built once, not copied as it doubles.
            let mut changes = Log::with_capacity(2 * op_bytes + ops.len() * LOG_ENTRY_OVERHEAD);
            // Counted and cut into chunks here, on the partition's thread, rather than by
            // reading the log again on the committing one.
            let changes =
                changelog::push_ops(&mut changes, &ops, &known, &*self.engine).map(|()| changes);
            drop(known);
            ahead.finish();
            let log_bytes = changes.as_ref().map_or(0, |log| log.bytes.len());
            self.sealed = Some(Sealed {
                ops,
                point_writes,
                bytes: (op_bytes + log_bytes) as u64,
                changes,
            });
        }
    }

    /// The write-batch operations reproducing the overlay, sealing it first if needed.
    #[cfg(test)]
    pub(crate) fn into_ops(self) -> Vec<WriteOp> {
        self.into_parts().0
    }

    /// The write-batch operations and the point writes' change log, sealing first if
    /// needed.
    pub(crate) fn into_parts(mut self) -> (Vec<WriteOp>, Result<Log>) {
        self.seal();
        self.sealed
            .map_or_else(|| (Vec::new(), Ok(Log::default())), |s| (s.ops, s.changes))
    }

    /// Bytes the commit writes for this transaction, sealing it first if needed: the keys
    /// and values of its operations (a delete counts its key, a range delete its bounds)
    /// and of its point writes' change log. What a state quota is checked against before
    /// the commit; the change log of keys that range deletes remove, which the commit adds,
    /// is not counted (it only records what is being removed).
    pub fn written_bytes(&mut self) -> u64 {
        self.seal();
        self.sealed.as_ref().map_or(0, |s| s.bytes)
    }

    /// Number of write-batch operations [`Self::into_ops`] gives (an estimate before
    /// sealing: range tombstones are not counted).
    pub(crate) fn pending_ops(&self) -> usize {
        match &self.sealed {
            Some(sealed) => sealed.ops.len(),
            None => self.overlay.writes + self.overlay.ordered.borrow().len_bound(),
        }
    }

    // ---- Internals ----

    /// The time from which this partition has no committed timer: every committed timer of
    /// the partition is earlier (its by-time index ends before it), so a timer written at or
    /// after it had no committed value and the change log needs no read of its before-image.
    /// Timers are mostly armed past every armed one (now plus a timeout), and such a key is
    /// otherwise never in the state cache: each would cost a read of the database to find
    /// nothing. `None` when unknown (the index ends at the last time, or reading it failed:
    /// the before-images are then all read, and that read reports a failure).
    ///
    /// Sound because a grouping key's timers are all in its partition's by-time index: a key
    /// belongs to one partition for the life of a checkpoint.
    fn new_timers_from(&self) -> Option<i64> {
        let (start, end) = keys::prefix_range(keys::timer_time_prefix(self.partition));
        match self.engine.last_key_in(&start, &end).ok()? {
            None => Some(i64::MIN),
            Some(last) => keys::decode_timer_by_time(&last)
                .ok()
                .and_then(|(ts, _)| ts.checked_add(1)),
        }
    }

    fn check_open(&self) {
        assert!(
            self.sealed.is_none(),
            "state accessed through a sealed PartitionTxn"
        );
    }

    /// The buffered list whose key prefix is in `k`.
    fn list(&self, k: &[u8]) -> Option<&Coll> {
        self.overlay.vars.get(&k[1..])?.list.as_deref()
    }

    /// The buffered map whose key prefix is in `k`.
    fn map(&self, k: &[u8]) -> Option<&Coll> {
        self.overlay.vars.get(&k[1..])?.map.as_deref()
    }

    /// The live committed value at `key`.
    fn get_committed(&self, key: &[u8]) -> Result<Option<StoredValue>> {
        self.ahead.borrow_mut().note(key);
        let clock = self.ttl_clock;
        let found = self.read_committed(key, |v| {
            let header = Header::decode(v)?;
            Ok(header.is_live(clock).then(|| header.to_owned()))
        })?;
        Ok(found.flatten())
    }

    /// `f` of the committed bytes at `key` (a value, list element or map entry), if any.
    /// What was committed there is kept in `reads` as the key's before-image, if it has
    /// room, unless it was read ahead: the seal finds it there.
    fn read_committed<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> Result<R>,
    ) -> Result<Option<R>> {
        if let Some(found) = self.ahead.borrow().get(key) {
            return found.map(f).transpose();
        }
        let keep = |v: &[u8]| {
            self.reads.borrow_mut().keep(key, Some(v));
            f(v)
        };
        let found = read_with(&*self.engine, key, keep)?;
        if found.is_none() {
            self.reads.borrow_mut().keep(key, None);
        }
        Ok(found)
    }

    /// Whether the collection under `prefix` holds a live value.
    fn any_live(&self, coll: Option<&Coll>, prefix: &[u8]) -> Result<bool> {
        let clock = self.ttl_clock;
        let mut found = false;
        Coll::scan(coll, &*self.engine, prefix, Unbounded, &mut |_, v| {
            found = Header::decode(v)?.is_live(clock);
            Ok(!found)
        })?;
        Ok(found)
    }

    fn set_timer(&mut self, key: &[u8], ts: i64, register: bool) -> Result<()> {
        self.check_open();
        check_key(key)?;
        let k = self.scratch.get_mut();
        keys::timer_key_prefix_into(k, key);
        let o = &mut self.overlay;
        if o.timer_keys > 0 {
            o.timers.reserve(std::mem::take(&mut o.timer_keys));
        }
        let change = o.timers.with_value(&k[1..], |timers| {
            timers.write(&keys::encode_i64(ts), register.then(Vec::new))
        });
        add(&mut o.writes, change);
        o.mark(
            index_key(keys::TIMER_BY_TIME, self.partition, ts, key, &[]),
            register,
        );
        Ok(())
    }

    /// Calls `f` with every visible timers-by-time or TTL index entry in `[start, end)`,
    /// ascending, until it returns `false`.
    /// Scans `[start, end)` of the ordered namespaces (timers by time, TTL index): buffered
    /// entries from `start`, committed ones from `committed_start` (see
    /// [`PartitionTxn::set_time_floor`]).
    fn scan_ordered(
        &self,
        start: &[u8],
        committed_start: &[u8],
        end: &[u8],
        f: &mut ScanFn<'_>,
    ) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        self.overlay.ordered.borrow_mut().settle();
        let ordered = self.overlay.ordered.borrow();
        let mut overlay = ordered.range(start, end).peekable();
        let mut stopped = false;
        let committed_start = committed_start.max(start);
        if committed_start >= end {
            for (ok, put) in overlay {
                if put && !f(ok, &[])? {
                    break;
                }
            }
            return Ok(());
        }
        self.engine.scan(committed_start, end, &mut |k, v| {
            while let Some((ok, put)) = overlay.next_if(|&(ok, _)| ok < k) {
                if put && !f(ok, &[])? {
                    stopped = true;
                    return Ok(false);
                }
            }
            let go_on = match overlay.next_if(|&(ok, _)| ok == k) {
                Some((_, true)) => f(k, &[])?,
                Some((_, false)) => true,
                None => f(k, v)?,
            };
            stopped = !go_on;
            Ok(go_on)
        })?;
        if !stopped {
            for (ok, put) in overlay {
                if put && !f(ok, &[])? {
                    break;
                }
            }
        }
        Ok(())
    }

    /// The expiry of the value, list element or map entry at `state_key`: `None` if there
    /// is none, `Some(None)` if it never expires.
    fn state_expiry(&self, state_key: &[u8]) -> Result<Option<Option<i64>>> {
        let (ns, prefix_len) = keys::split_state_key(state_key)?;
        let (hkey, suffix) = state_key[1..].split_at(prefix_len - 1);
        let expiry = |v: &[u8]| Header::decode(v).map(|h| h.expires_at_ms);
        if let Some(bucket) = self.overlay.vars.get(hkey) {
            let buffered = match ns {
                keys::VALUE => bucket.value.as_ref().map(Slot::as_deref),
                _ => {
                    let coll = if ns == keys::LIST {
                        bucket.list.as_deref()
                    } else {
                        bucket.map.as_deref()
                    };
                    match coll {
                        Some(c) => match c.entries.get(suffix) {
                            Some(slot) => Some(slot.as_deref()),
                            None if c.is_cleared() => Some(None),
                            None => None,
                        },
                        None => None,
                    }
                }
            };
            if let Some(bytes) = buffered {
                return bytes.map(expiry).transpose();
            }
        }
        self.read_committed(state_key, expiry)
    }

    /// Deletes the value, list element or map entry at `state_key`.
    fn delete_state(&mut self, state_key: &[u8]) -> Result<()> {
        let (ns, prefix_len) = keys::split_state_key(state_key)?;
        let (hkey, suffix) = state_key[1..].split_at(prefix_len - 1);
        let o = &mut self.overlay;
        if ns == keys::VALUE {
            o.put_value_slot(hkey, None);
            return Ok(());
        }
        let bucket = o.vars.get_or_default(hkey);
        let coll = if ns == keys::LIST {
            &mut bucket.list
        } else {
            &mut bucket.map
        };
        let change = coll.get_or_insert_default().write(suffix, None);
        add(&mut o.writes, change);
        Ok(())
    }
}

impl Overlay {
    /// Sets the value slot of `hkey`.
    fn put_value_slot(&mut self, hkey: &[u8], slot: Slot) {
        if self
            .vars
            .with_value(hkey, |bucket| bucket.value.replace(slot).is_none())
        {
            self.writes += 1;
        }
    }

    /// Puts (`true`) or deletes a timers-by-time or TTL index entry.
    fn mark(&mut self, key: SmallBytes, put: bool) {
        self.ordered.get_mut().mark(key, put);
    }

    /// The write-batch operations reproducing the overlay, ascending by key (range
    /// tombstones just before the keys they cover, so a put inside one survives), and the
    /// indexes (ascending) of the operations on keys known to have had no committed value:
    /// list elements appended past the committed ones, and timers at or after
    /// `new_timers_from` (see [`PartitionTxn::new_timers_from`]).
    fn into_ops(self, new_timers_from: Option<i64>) -> (Vec<WriteOp>, Vec<usize>) {
        let ordered = self.ordered.into_inner().into_sorted();
        let mut ops = Vec::with_capacity(self.writes + ordered.len() + 16);
        let mut fresh = Vec::new();
        // One sort serves every namespace: within each, keys order by `[var][keylen][key]`,
        // then suffix; and no such prefix is a prefix of another. One pass over the sorted
        // buckets writes each namespace's operations to its own vector, appended in
        // namespace order after it: a list or map is read once, not once per namespace, and
        // freed while at hand (each read of a collection was a cache miss).
        let mut vars = self.vars.into_sorted();
        let (mut lists, mut metas, mut maps) = (Vec::new(), Vec::new(), Vec::new());
        let mut fresh_lists = Vec::new();
        for n in 0..vars.len() {
            if let Some((_, ahead)) = vars.get(n + PREFETCH_AHEAD) {
                ahead.prefetch();
            }
            let (hkey, bucket) = &mut vars[n];
            if let Some(slot) = bucket.value.take() {
                push_op(&mut ops, state_key(keys::VALUE, hkey, &[]), slot);
            }
            if let Some(mut list) = bucket.list.take() {
                let new_from = list
                    .committed_next
                    .filter(|_| !list.is_cleared())
                    .map(u64::to_be_bytes);
                let start = lists.len();
                coll_ops(&mut lists, keys::LIST, hkey, &mut list);
                if let Some(new_from) = new_from {
                    // Sequences are fixed-width, so suffix order is sequence order.
                    let first_new = start
                        + lists[start..]
                            .partition_point(|op| op_key(op)[1 + hkey.len()..] < new_from[..]);
                    fresh_lists.extend(first_new..lists.len());
                }
                if list.meta_dirty {
                    let key = state_key(keys::LIST_META, hkey, &[]);
                    let next = list.next_seq.unwrap_or(0);
                    push_op(
                        &mut metas,
                        key,
                        (next > 0).then(|| next.to_be_bytes().to_vec()),
                    );
                }
            }
            if let Some(mut map) = bucket.map.take() {
                coll_ops(&mut maps, keys::MAP, hkey, &mut map);
            }
        }
        let lists_at = ops.len();
        fresh.extend(fresh_lists.into_iter().map(|i| lists_at + i));
        ops.append(&mut lists);
        ops.append(&mut metas);
        ops.append(&mut maps);
        drop(vars);
        let new_timers_from = new_timers_from.map(keys::encode_i64);
        for (hkey, timers) in &mut self.timers.into_sorted() {
            let start = ops.len();
            coll_ops(&mut ops, keys::TIMER_BY_KEY, hkey, timers);
            if let Some(from) = new_timers_from {
                // Times are encoded order-preserving, so suffix order is time order.
                let first_new = start
                    + ops[start..].partition_point(|op| op_key(op)[1 + hkey.len()..] < from[..]);
                fresh.extend(first_new..ops.len());
            }
        }
        for (key, put) in ordered {
            push_op(&mut ops, key.into_vec(), put.then(Vec::new));
        }
        (ops, fresh)
    }
}

/// Appends the operations of one collection: its range tombstone or the point deletes of
/// its committed entries, merged in key order with its buffered writes.
fn coll_ops(ops: &mut Vec<WriteOp>, ns: u8, hkey: &[u8], coll: &mut Coll) {
    let entries = std::mem::take(&mut coll.entries).into_sorted();
    match std::mem::take(&mut coll.base) {
        Base::Committed => {
            for (suffix, slot) in entries {
                push_op(ops, state_key(ns, hkey, &suffix), slot);
            }
        }
        Base::ClearedRange => {
            let start = state_key(ns, hkey, &[]);
            let end = keys::prefix_successor(&start);
            ops.push(WriteOp::DeleteRange(start, end));
            for (suffix, slot) in entries {
                push_op(ops, state_key(ns, hkey, &suffix), slot);
            }
        }
        Base::ClearedPoints(deletes) => {
            let mut deletes = deletes.into_iter().peekable();
            for (suffix, slot) in entries {
                while let Some(d) = deletes.next_if(|d| *d < suffix) {
                    ops.push(WriteOp::Delete(state_key(ns, hkey, &d)));
                }
                deletes.next_if(|d| *d == suffix);
                push_op(ops, state_key(ns, hkey, &suffix), slot);
            }
            for d in deletes {
                ops.push(WriteOp::Delete(state_key(ns, hkey, &d)));
            }
        }
    }
}

/// `[ns][hkey][suffix]`.
fn state_key(ns: u8, hkey: &[u8], suffix: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + hkey.len() + suffix.len());
    k.push(ns);
    k.extend_from_slice(hkey);
    k.extend_from_slice(suffix);
    k
}

/// The key an operation sorts by: a range delete's start.
fn op_key(op: &WriteOp) -> &[u8] {
    match op {
        WriteOp::Put(k, _) | WriteOp::Delete(k) | WriteOp::DeleteRange(k, _) => k,
    }
}

fn push_op(ops: &mut Vec<WriteOp>, key: Vec<u8>, slot: Slot) {
    ops.push(match slot {
        Some(v) => WriteOp::Put(key, v),
        None => WriteOp::Delete(key),
    });
}

/// The key of a timers-by-time (`rest`: the grouping key) or TTL index entry (`rest`: the
/// state key, in up to two parts): `[ns][partition][time][rest]`.
fn index_key(ns: u8, partition: Partition, time: i64, rest: &[u8], more: &[u8]) -> SmallBytes {
    let head = keys::partition_head(ns, partition);
    SmallBytes::from_parts(&[&head, &keys::encode_i64(time), rest, more])
}

fn add(writes: &mut usize, change: isize) {
    *writes = writes.saturating_add_signed(change);
}

/// Applies `f` to the committed bytes at `key`.
fn read_with<R>(
    engine: &dyn KvEngine,
    key: &[u8],
    f: impl FnOnce(&[u8]) -> Result<R>,
) -> Result<Option<R>> {
    let mut f = Some(f);
    let mut out = None;
    engine.get_with(key, &mut |v| {
        if let Some(f) = f.take() {
            out = Some(f(v)?);
        }
        Ok(())
    })?;
    Ok(out)
}

/// Applies `f` to the committed bytes at `key`: what was read ahead for it, if it was,
/// else what the engine has.
fn read_ahead_or_with<R>(
    engine: &dyn KvEngine,
    ahead: &Ahead,
    key: &[u8],
    f: impl FnOnce(&[u8]) -> Result<R>,
) -> Result<Option<R>> {
    match ahead.get(key) {
        Some(found) => found.map(f).transpose(),
        None => read_with(engine, key, f),
    }
}

/// Bytes a change log entry adds to its key and values (lengths and tags).
const LOG_ENTRY_OVERHEAD: usize = 14;

/// The operations among `ops` (ascending by key, as [`Overlay::into_ops`] makes them) whose
/// before-image is known without a read, ascending by index: those at the indexes in
/// `fresh` had no committed value, those on a key the batch read from the engine had what
/// `reads` holds for it, and those on a key read ahead had what `ahead` holds (read ahead,
/// a key's reads are not kept: past [`READS_LIMIT`], as state outgrows the cache, they
/// would be read again here, from disk); `reads` is sorted by key. A key the batch read and
/// then wrote was read before its first write (the overlay answers every later read), and
/// nothing commits while a batch runs, so both hold what the batch started from; an
/// operation left out is simply read at the seal.
fn known_befores<'a>(
    ops: &[WriteOp],
    fresh: &[usize],
    reads: &'a [(SmallBytes, Option<SmallBytes>)],
    ahead: &'a Ahead,
) -> Vec<(usize, Option<&'a [u8]>)> {
    let mut known = Vec::with_capacity(fresh.len() + reads.len());
    let mut fresh = fresh.iter().copied().peekable();
    let mut next_read = 0;
    for (i, op) in ops.iter().enumerate() {
        if fresh.next_if_eq(&i).is_some() {
            known.push((i, None));
            continue;
        }
        let key = match op {
            WriteOp::Put(k, _) | WriteOp::Delete(k) => k.as_slice(),
            WriteOp::DeleteRange(..) => continue,
        };
        // The change log has no entry for it (a list's length, a timer by time): its
        // before-image is not needed, and looking it up would be a cache miss for nothing.
        if !key.first().is_some_and(|&ns| changelog::logged(ns)) {
            continue;
        }
        while reads
            .get(next_read)
            .is_some_and(|(k, _)| k.as_slice() < key)
        {
            next_read += 1;
        }
        if let Some((k, before)) = reads.get(next_read)
            && k.as_slice() == key
        {
            known.push((i, before.as_deref()));
        } else if let Some(before) = ahead.get(key) {
            known.push((i, before));
        }
    }
    known
}

/// The stored value in `bytes` if it is live at `clock`.
fn live(bytes: Option<&[u8]>, clock: Option<i64>) -> Result<Option<StoredValue>> {
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    let header = Header::decode(bytes)?;
    Ok(header.is_live(clock).then(|| header.to_owned()))
}

fn decode_seq(suffix: &[u8]) -> Result<u64> {
    <[u8; 8]>::try_from(suffix)
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt("malformed list element key".into()))
}

fn decode_next_seq(v: &[u8]) -> Result<u64> {
    <[u8; 8]>::try_from(v)
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt("malformed list metadata".into()))
}

impl fmt::Debug for PartitionTxn {
    /// Shows sizes only: keys and values belong to tenants and are never logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartitionTxn")
            .field("partition", &self.partition)
            .field("ttl_clock", &self.ttl_clock)
            .field("pending_writes", &self.pending_writes())
            .field("sealed", &self.sealed.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
