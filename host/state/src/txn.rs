//! The per-partition batch overlay.
//!
//! A [`PartitionTxn`] buffers one partition's writes of one micro-batch in memory and reads
//! through them (read-your-writes) to the committed state. Two structures make up the
//! overlay:
//! - point writes, `key → Some(bytes)` for a put and `key → None` for a delete;
//! - range tombstones, disjoint `[start, end)` ranges hiding every committed key inside.
//!
//! **Invariant:** a point write inside a range tombstone was made after it (adding a
//! tombstone drops the points it covers), so a point always wins over a tombstone, and
//! committing tombstones before points reproduces the overlay exactly.
//!
//! Clearing a list or map uses point deletes when the committed collection is small (the
//! common case) and a range tombstone only for big ones: RocksDB pays for every range
//! tombstone on reads until compaction, so they are kept for where they save real work.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Bound::{self, Excluded, Included, Unbounded};
use std::sync::Arc;

use crate::engine::{KvEngine, ScanFn, WriteBatch};
use crate::keys::{self, check_key};
use crate::value::Header;
use crate::{Partition, Result, StoreError, StoredValue, VarId};

/// Up to this many committed entries, a clear writes point deletes instead of a range
/// tombstone.
const POINT_DELETE_LIMIT: usize = 64;
/// TTL index entries handled per scan in [`PartitionTxn::ttl_cleanup`], bounding its memory.
const TTL_CLEANUP_CHUNK: usize = 1024;

/// The batch overlay of one partition.
///
/// All state reads see the committed state plus this overlay's writes, and hide values whose
/// `expires_at_ms <= ttl_clock` when a TTL clock is set. `Send` (moved into a worker thread),
/// not shared.
pub struct PartitionTxn {
    engine: Arc<dyn KvEngine>,
    partition: Partition,
    ttl_clock: Option<i64>,
    points: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// `start → end`; disjoint and never touching, so a point lookup is one ordered search.
    tombstones: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Reused buffer for building the key of a point read, which needs no owned key.
    scratch: RefCell<Vec<u8>>,
}

impl PartitionTxn {
    pub(crate) fn new(engine: Arc<dyn KvEngine>, partition: Partition) -> Self {
        Self {
            engine,
            partition,
            ttl_clock: None,
            points: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            scratch: RefCell::new(Vec::with_capacity(64)),
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

    // ---- ValueState ----

    /// The value state `var` holds for grouping key `key` (canonical key bytes).
    pub fn value_get(&self, var: VarId, key: &[u8]) -> Result<Option<StoredValue>> {
        check_key(key)?;
        let mut k = self.scratch.borrow_mut();
        keys::var_key_prefix_into(&mut k, keys::VALUE, var, key);
        self.get_live(&k)
    }

    /// Sets the value of value state `var` for `key`.
    pub fn value_put(&mut self, var: VarId, key: &[u8], value: StoredValue) -> Result<()> {
        check_key(key)?;
        self.put_value(keys::value_key(var, key), &value);
        Ok(())
    }

    /// Removes the value of value state `var` for `key` (a no-op if there is none).
    pub fn value_delete(&mut self, var: VarId, key: &[u8]) -> Result<()> {
        check_key(key)?;
        self.points.insert(keys::value_key(var, key), None);
        Ok(())
    }

    // ---- ListState ----

    /// Whether list `var` of `key` has at least one live element.
    pub fn list_exists(&self, var: VarId, key: &[u8]) -> Result<bool> {
        check_key(key)?;
        self.any_live(keys::prefix_range(keys::list_prefix(var, key)))
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
        check_key(key)?;
        let prefix = keys::list_prefix(var, key);
        let end = keys::prefix_successor(&prefix);
        let start = match after.map(|s| s.checked_add(1)) {
            None => prefix,
            Some(Some(first)) => {
                let mut start = prefix;
                start.extend_from_slice(&first.to_be_bytes());
                start
            }
            Some(None) => return Ok(Vec::new()),
        };
        let mut out = Vec::with_capacity(max.min(1024));
        if max == 0 {
            return Ok(out);
        }
        let clock = self.ttl_clock;
        self.scan_merged(&start, &end, &mut |k, v| {
            let header = Header::decode(v)?;
            if header.is_live(clock) {
                out.push((keys::decode_list_seq(k)?, header.to_owned()));
            }
            Ok(out.len() < max)
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
        check_key(key)?;
        if values.is_empty() {
            return Ok(());
        }
        let meta_key = keys::list_meta_key(var, key);
        let first = self.read_with(&meta_key, decode_next_seq)?.unwrap_or(0);
        let next = u64::try_from(values.len())
            .ok()
            .and_then(|n| first.checked_add(n))
            .ok_or_else(|| StoreError::Corrupt("list sequence overflow".into()))?;
        let prefix = keys::list_prefix(var, key);
        for (seq, value) in (first..).zip(&values) {
            let mut k = Vec::with_capacity(prefix.len() + keys::SEQ_LEN);
            k.extend_from_slice(&prefix);
            k.extend_from_slice(&seq.to_be_bytes());
            self.put_value(k, value);
        }
        self.points
            .insert(meta_key, Some(next.to_be_bytes().to_vec()));
        Ok(())
    }

    /// Removes every element of list `var` of `key`.
    pub fn list_clear(&mut self, var: VarId, key: &[u8]) -> Result<()> {
        check_key(key)?;
        self.clear_range(keys::prefix_range(keys::list_prefix(var, key)))?;
        // With the elements gone, the sequence restarts at 0.
        self.points.insert(keys::list_meta_key(var, key), None);
        Ok(())
    }

    // ---- MapState ----

    /// Whether map `var` of `key` has at least one live entry.
    pub fn map_exists(&self, var: VarId, key: &[u8]) -> Result<bool> {
        check_key(key)?;
        self.any_live(keys::prefix_range(keys::map_prefix(var, key)))
    }

    /// The value of `user_key` in map `var` of `key`.
    pub fn map_get(&self, var: VarId, key: &[u8], user_key: &[u8]) -> Result<Option<StoredValue>> {
        check_key(key)?;
        let mut k = self.scratch.borrow_mut();
        keys::var_key_prefix_into(&mut k, keys::MAP, var, key);
        k.extend_from_slice(user_key);
        self.get_live(&k)
    }

    /// Sets `user_key` of map `var` of `key` to `value`.
    pub fn map_put(
        &mut self,
        var: VarId,
        key: &[u8],
        user_key: &[u8],
        value: StoredValue,
    ) -> Result<()> {
        check_key(key)?;
        self.put_value(keys::map_entry_key(var, key, user_key), &value);
        Ok(())
    }

    /// Removes `user_key` from map `var` of `key` (a no-op if absent).
    pub fn map_remove(&mut self, var: VarId, key: &[u8], user_key: &[u8]) -> Result<()> {
        check_key(key)?;
        self.points
            .insert(keys::map_entry_key(var, key, user_key), None);
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
        check_key(key)?;
        let prefix = keys::map_prefix(var, key);
        let prefix_len = prefix.len();
        let end = keys::prefix_successor(&prefix);
        let start = match after {
            None => prefix,
            Some(after) => {
                let mut start = prefix;
                start.extend_from_slice(after);
                start.push(0);
                start
            }
        };
        let mut out = Vec::with_capacity(max.min(1024));
        if max == 0 {
            return Ok(out);
        }
        let clock = self.ttl_clock;
        self.scan_merged(&start, &end, &mut |k, v| {
            let header = Header::decode(v)?;
            if header.is_live(clock) {
                out.push((k[prefix_len..].to_vec(), header.to_owned()));
            }
            Ok(out.len() < max)
        })?;
        Ok(out)
    }

    /// Removes every entry of map `var` of `key`.
    pub fn map_clear(&mut self, var: VarId, key: &[u8]) -> Result<()> {
        check_key(key)?;
        self.clear_range(keys::prefix_range(keys::map_prefix(var, key)))
    }

    // ---- Timers ----

    /// Registers timer `(key, ts)`; registering an existing timer is a no-op.
    pub fn timer_register(&mut self, key: &[u8], ts: i64) -> Result<()> {
        check_key(key)?;
        self.points
            .insert(keys::timer_by_key(key, ts), Some(Vec::new()));
        self.points.insert(
            keys::timer_by_time(self.partition, ts, key),
            Some(Vec::new()),
        );
        Ok(())
    }

    /// Deletes timer `(key, ts)`; deleting a missing timer is a no-op.
    pub fn timer_delete(&mut self, key: &[u8], ts: i64) -> Result<()> {
        check_key(key)?;
        self.points.insert(keys::timer_by_key(key, ts), None);
        self.points
            .insert(keys::timer_by_time(self.partition, ts, key), None);
        Ok(())
    }

    /// The timestamps of `key`'s timers, ascending.
    pub fn timer_list(&self, key: &[u8]) -> Result<Vec<i64>> {
        check_key(key)?;
        let prefix = keys::timer_key_prefix(key);
        let prefix_len = prefix.len();
        let (start, end) = keys::prefix_range(prefix);
        let mut out = Vec::new();
        self.scan_merged(&start, &end, &mut |k, _| {
            out.push(keys::decode_timer_by_key(k, prefix_len)?);
            Ok(true)
        })?;
        Ok(out)
    }

    /// This partition's timers with `ts <= upto`, ascending by `(ts, key)`, at most `max`.
    pub fn timers_due(&self, upto: i64, max: usize) -> Result<Vec<(i64, Vec<u8>)>> {
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        let (start, end) = keys::timer_time_range_upto(self.partition, upto);
        self.scan_merged(&start, &end, &mut |k, _| {
            let (ts, key) = keys::decode_timer_by_time(k)?;
            out.push((ts, key.to_vec()));
            Ok(out.len() < max)
        })?;
        Ok(out)
    }

    // ---- TTL ----

    /// Physically removes this partition's values, list elements and map entries with
    /// `expires_at_ms <= now_ms`, through the TTL index written alongside every value with an
    /// expiry. Returns how many were removed.
    ///
    /// An index entry whose value was since overwritten (with another expiry) or removed is
    /// stale: it is dropped and the current value is left alone.
    pub fn ttl_cleanup(&mut self, now_ms: i64) -> Result<u64> {
        let (mut start, end) = keys::ttl_range_upto(self.partition, now_ms);
        let mut removed = 0;
        let mut chunk: Vec<Vec<u8>> = Vec::new();
        loop {
            chunk.clear();
            self.scan_merged(&start, &end, &mut |k, _| {
                chunk.push(k.to_vec());
                Ok(chunk.len() < TTL_CLEANUP_CHUNK)
            })?;
            for index_key in &chunk {
                let (expiry, state_key) = keys::decode_ttl_key(index_key)?;
                let current =
                    self.read_with(state_key, |v| Header::decode(v).map(|h| h.expires_at_ms))?;
                if current == Some(Some(expiry)) {
                    self.points.insert(state_key.to_vec(), None);
                    removed += 1;
                }
                self.points.insert(index_key.clone(), None);
            }
            match chunk.last() {
                Some(last) if chunk.len() == TTL_CLEANUP_CHUNK => start = keys::key_successor(last),
                _ => break,
            }
        }
        if removed > 0 {
            tracing::debug!(partition = self.partition, removed, "TTL cleanup");
        }
        Ok(removed)
    }

    /// Number of point writes buffered (for metrics and memory bounds).
    pub fn pending_writes(&self) -> usize {
        self.points.len()
    }

    // ---- Commit support ----

    /// Number of write-batch operations [`Self::write_to`] appends.
    pub(crate) fn pending_ops(&self) -> usize {
        self.points.len() + self.tombstones.len()
    }

    /// Appends the overlay to `batch`: range tombstones first, then points, which by the
    /// module invariant reproduces the overlay's view.
    pub(crate) fn write_to(self, batch: &mut WriteBatch) {
        for (start, end) in self.tombstones {
            batch.delete_range(start, end);
        }
        for (k, v) in self.points {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
        }
    }

    // ---- Internals ----

    /// Buffers a stored value and, if it expires, its TTL index entry.
    fn put_value(&mut self, state_key: Vec<u8>, value: &StoredValue) {
        if let Some(expiry) = value.expires_at_ms {
            self.points.insert(
                keys::ttl_key(self.partition, expiry, &state_key),
                Some(Vec::new()),
            );
        }
        self.points.insert(state_key, Some(value.encode()));
    }

    /// The live stored value at `key`.
    fn get_live(&self, key: &[u8]) -> Result<Option<StoredValue>> {
        let clock = self.ttl_clock;
        let found = self.read_with(key, |v| {
            let header = Header::decode(v)?;
            Ok(header.is_live(clock).then(|| header.to_owned()))
        })?;
        Ok(found.flatten())
    }

    /// Applies `f` to the bytes visible at `key` (overlay, then committed state).
    fn read_with<R>(&self, key: &[u8], f: impl FnOnce(&[u8]) -> Result<R>) -> Result<Option<R>> {
        if let Some(v) = self.points.get(key) {
            return v.as_deref().map(f).transpose();
        }
        if self.in_tombstone(key) {
            return Ok(None);
        }
        let mut f = Some(f);
        let mut out = None;
        self.engine.get_with(key, &mut |v| {
            if let Some(f) = f.take() {
                out = Some(f(v)?);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Whether `[start, end)` holds a live value.
    fn any_live(&self, (start, end): (Vec<u8>, Vec<u8>)) -> Result<bool> {
        let clock = self.ttl_clock;
        let mut found = false;
        self.scan_merged(&start, &end, &mut |_, v| {
            found = Header::decode(v)?.is_live(clock);
            Ok(!found)
        })?;
        Ok(found)
    }

    fn in_tombstone(&self, key: &[u8]) -> bool {
        !self.tombstones.is_empty()
            && self
                .tombstones
                .range::<[u8], _>((Unbounded, Included(key)))
                .next_back()
                .is_some_and(|(_, end)| key < end.as_slice())
    }

    /// The parts of `[start, end)` not covered by a range tombstone, ascending.
    fn live_segments<'a>(&'a self, start: &'a [u8], end: &'a [u8]) -> Vec<(&'a [u8], &'a [u8])> {
        let mut segments = Vec::new();
        if start >= end {
            return segments;
        }
        let mut cursor = start;
        if let Some((_, t_end)) = self
            .tombstones
            .range::<[u8], _>((Unbounded, Included(start)))
            .next_back()
        {
            cursor = cursor.max(t_end.as_slice());
        }
        for (t_start, t_end) in self
            .tombstones
            .range::<[u8], _>((Excluded(start), Excluded(end)))
        {
            if cursor < t_start.as_slice() {
                segments.push((cursor, t_start.as_slice()));
            }
            cursor = t_end;
        }
        if cursor < end {
            segments.push((cursor, end));
        }
        segments
    }

    /// Calls `f` with every visible entry in `[start, end)`, ascending, until it returns
    /// `false`: committed entries outside range tombstones, merged with the overlay's points
    /// (puts replace, deletes hide). Memory use is independent of the range's size.
    fn scan_merged(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        let bounds: (Bound<&[u8]>, Bound<&[u8]>) = (Included(start), Excluded(end));
        let mut overlay = self.points.range::<[u8], _>(bounds).peekable();
        let mut stopped = false;
        for (seg_start, seg_end) in self.live_segments(start, end) {
            self.engine.scan(seg_start, seg_end, &mut |k, v| {
                // Overlay entries sorting before this committed key come first.
                while let Some((ok, ov)) = overlay.next_if(|(ok, _)| ok.as_slice() < k) {
                    if let Some(ov) = ov
                        && !f(ok, ov)?
                    {
                        stopped = true;
                        return Ok(false);
                    }
                }
                let go_on = match overlay.next_if(|(ok, _)| ok.as_slice() == k) {
                    Some((_, Some(ov))) => f(k, ov)?,
                    Some((_, None)) => true,
                    None => f(k, v)?,
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

    /// Removes everything in `[start, end)`: buffered points, and committed entries through
    /// point deletes when there are few, else a range tombstone.
    fn clear_range(&mut self, (start, end): (Vec<u8>, Vec<u8>)) -> Result<()> {
        let doomed: Vec<Vec<u8>> = self
            .points
            .range::<[u8], _>((Included(start.as_slice()), Excluded(end.as_slice())))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &doomed {
            self.points.remove(k);
        }
        let mut committed = Vec::new();
        let mut many = false;
        for (seg_start, seg_end) in self.live_segments(&start, &end) {
            self.engine.scan(seg_start, seg_end, &mut |k, _| {
                many = committed.len() == POINT_DELETE_LIMIT;
                if !many {
                    committed.push(k.to_vec());
                }
                Ok(!many)
            })?;
            if many {
                break;
            }
        }
        if many {
            self.add_tombstone(start, end);
        } else {
            for k in committed {
                self.points.insert(k, None);
            }
        }
        Ok(())
    }

    /// Adds range tombstone `[start, end)`, merging it with those it overlaps or touches.
    /// Callers have removed the points it covers.
    fn add_tombstone(&mut self, mut start: Vec<u8>, mut end: Vec<u8>) {
        let merged: Vec<Vec<u8>> = self
            .tombstones
            .range::<[u8], _>((Unbounded, Included(end.as_slice())))
            .rev()
            .take_while(|(_, t_end)| t_end.as_slice() >= start.as_slice())
            .map(|(t_start, _)| t_start.clone())
            .collect();
        for t_start in merged {
            if let Some(t_end) = self.tombstones.remove(&t_start) {
                start = start.min(t_start);
                end = end.max(t_end);
            }
        }
        self.tombstones.insert(start, end);
    }
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
            .field("pending_writes", &self.points.len())
            .field("range_tombstones", &self.tombstones.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Checkpoint;

    fn txn() -> PartitionTxn {
        Checkpoint::in_memory().txn(0)
    }

    fn tombstones(txn: &PartitionTxn) -> Vec<(&[u8], &[u8])> {
        txn.tombstones
            .iter()
            .map(|(s, e)| (s.as_slice(), e.as_slice()))
            .collect()
    }

    #[test]
    fn tombstones_merge_when_overlapping_or_touching() {
        let mut txn = txn();
        txn.add_tombstone(b"c".to_vec(), b"e".to_vec());
        txn.add_tombstone(b"g".to_vec(), b"i".to_vec());
        assert_eq!(tombstones(&txn), [(&b"c"[..], &b"e"[..]), (b"g", b"i")]);
        txn.add_tombstone(b"e".to_vec(), b"f".to_vec());
        assert_eq!(tombstones(&txn), [(&b"c"[..], &b"f"[..]), (b"g", b"i")]);
        txn.add_tombstone(b"d".to_vec(), b"h".to_vec());
        assert_eq!(tombstones(&txn), [(&b"c"[..], &b"i"[..])]);
        txn.add_tombstone(b"a".to_vec(), b"b".to_vec());
        txn.add_tombstone(b"a".to_vec(), b"z".to_vec());
        assert_eq!(tombstones(&txn), [(&b"a"[..], &b"z"[..])]);
        assert!(txn.in_tombstone(b"a"));
        assert!(txn.in_tombstone(b"yyy"));
        assert!(!txn.in_tombstone(b"z"));
        assert!(!txn.in_tombstone(b"0"));
    }

    #[test]
    fn live_segments_skip_tombstones() {
        let mut txn = txn();
        assert_eq!(txn.live_segments(b"a", b"z"), [(&b"a"[..], &b"z"[..])]);
        assert!(txn.live_segments(b"z", b"a").is_empty());
        txn.add_tombstone(b"c".to_vec(), b"e".to_vec());
        txn.add_tombstone(b"g".to_vec(), b"i".to_vec());
        assert_eq!(
            txn.live_segments(b"a", b"z"),
            [(&b"a"[..], &b"c"[..]), (b"e", b"g"), (b"i", b"z")]
        );
        assert_eq!(txn.live_segments(b"d", b"h"), [(&b"e"[..], &b"g"[..])]);
        assert!(txn.live_segments(b"c", b"e").is_empty());
        assert!(txn.live_segments(b"cc", b"d").is_empty());
    }

    #[test]
    fn clearing_a_big_committed_collection_uses_one_range_tombstone() {
        let cp = Checkpoint::in_memory();
        let value = StoredValue {
            schema_id: 0,
            expires_at_ms: None,
            payload: b"1".to_vec(),
        };
        let mut txn = cp.txn(0);
        txn.list_append(1, b"small", vec![value.clone(); POINT_DELETE_LIMIT])
            .unwrap();
        txn.list_append(1, b"big", vec![value.clone(); POINT_DELETE_LIMIT + 1])
            .unwrap();
        cp.commit(crate::Commit {
            txns: vec![txn],
            ..Default::default()
        })
        .unwrap();

        let mut txn = cp.txn(0);
        txn.list_clear(1, b"small").unwrap();
        assert!(txn.tombstones.is_empty());
        // Point deletes for every element plus the list's metadata.
        assert_eq!(txn.pending_writes(), POINT_DELETE_LIMIT + 1);
        txn.list_clear(1, b"big").unwrap();
        assert_eq!(txn.tombstones.len(), 1);
        assert_eq!(txn.pending_writes(), POINT_DELETE_LIMIT + 2);
        // Appends after the clear live inside the tombstone as points.
        txn.list_append(1, b"big", vec![value.clone()]).unwrap();
        assert_eq!(txn.list_page(1, b"big", None, 10).unwrap(), [(0, value)]);
    }
}
