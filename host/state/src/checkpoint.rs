//! The checkpoint: the committed state plus the one atomic way to change it.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crate::ahead::Shapes;
use crate::cache::{CachedEngine, SharedCacheBudget};
use crate::changelog::{ChangeStats, Log};
use crate::engine::{KvEngine, PREFETCH_AHEAD, ScanFn, WriteBatch, WriteOp, clear_ops, prefetch};
use crate::mem::MemEngine;
use crate::rocks::{RocksEngine, SharedMemtables};
use crate::txn::PartitionTxn;
use crate::{Partition, Result, StoreError, StoredValue, VarId, changelog, keys};

/// A per-variable scan's callback: `(grouping key, key suffix, value)`.
type VarScanFn<'a> = dyn FnMut(&[u8], &[u8], StoredValue) -> Result<bool> + 'a;

/// Name of the database subdirectory inside a checkpoint directory; the engine keeps its own
/// files next to it.
const DB_DIR: &str = "state";

/// Committed state a checkpoint opened for writing keeps in memory by default (see
/// [`crate::cache`]): the per-key state of a few million keys of the counter workload. The
/// state cache's share of [`crate::DEFAULT_STATE_MEMORY_BYTES`].
pub const DEFAULT_STATE_CACHE_BYTES: usize = 240 << 20;

/// The state cache in front of the database of a checkpoint opened for writing (see
/// [`crate::cache`]).
#[derive(Clone, Debug)]
pub enum StateCache {
    /// Its own, of at most this many bytes (0: none).
    Own(usize),
    /// An equal part of a budget shared with other checkpoints.
    Shared(Arc<SharedCacheBudget>),
}

/// A durable checkpoint (one RocksDB database in a directory), or an in-memory one for tests.
///
/// Cheap to clone: clones share the database.
#[derive(Clone)]
pub struct Checkpoint {
    engine: Arc<dyn KvEngine>,
    /// The last commit's operation list, emptied, kept for its room (see [`Spare`]).
    spare: Spare,
    /// The snapshot being taken on a thread of its own, if one is (see
    /// [`snapshot_in_background`](Self::snapshot_in_background)); shared by the clones.
    snapshotting: Arc<Mutex<Option<JoinHandle<()>>>>,
    /// The per-key reads its batches make, learned by one batch for the next (see
    /// [`crate::ahead`]); shared by the clones.
    read_shapes: Shapes,
}

/// Per state key, its stored bytes at an earlier batch (`None`: absent then), overriding the
/// committed state; made by [`Checkpoint::undo_since`].
#[derive(Debug, Default)]
pub struct Undo {
    entries: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl Undo {
    /// Number of keys whose value differs from the committed one.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is undone.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Everything one micro-batch changes, applied atomically by [`Checkpoint::commit`].
#[derive(Debug, Default)]
pub struct Commit {
    /// Variables whose data (value, list and map entries, for every grouping key) is removed.
    /// Dropping a variable that has no data is a no-op.
    pub drop_vars: Vec<VarId>,
    /// Partition overlays, applied after `drop_vars`, in order. Transactions not yet
    /// [sealed](PartitionTxn::seal) are sealed by the commit, on the committing thread.
    pub txns: Vec<PartitionTxn>,
    /// Metadata writes, applied last; `None` deletes. They carry the batch's commit record.
    pub meta: Vec<(String, Option<Vec<u8>>)>,
    /// Records the batch's change log in the same write (see [`crate::changelog`]).
    pub changelog: Option<ChangelogWrite>,
}

/// Maps a grouping key to its partition.
pub type PartitionOf = dyn Fn(&[u8]) -> Partition + Send + Sync;

/// How a commit records its batch's change log.
pub struct ChangelogWrite {
    /// The batch being committed.
    pub batch_id: u64,
    /// The change logs of batches before this one are removed in the same write.
    pub retain_from: u64,
    /// The partition of a grouping key: the deletes of dropped variables' entries are
    /// logged under their key's partition.
    pub partition_of: Box<PartitionOf>,
}

impl fmt::Debug for ChangelogWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangelogWrite")
            .field("batch_id", &self.batch_id)
            .field("retain_from", &self.retain_from)
            .finish_non_exhaustive()
    }
}

impl Checkpoint {
    /// Opens the checkpoint in `dir`, creating the directory and database if missing.
    ///
    /// The database lives in `dir/state/`. A checkpoint already open (in this or another
    /// process) gives [`StoreError::Locked`].
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with_cache(dir, DEFAULT_STATE_CACHE_BYTES)
    }

    /// Like [`open`](Self::open), with at most `cache_bytes` of committed state kept in memory
    /// in front of the database (see [`crate::cache`]; 0 turns the cache off).
    pub fn open_with_cache(dir: &Path, cache_bytes: usize) -> Result<Self> {
        Self::open_with_memory(dir, &StateCache::Own(cache_bytes), None)
    }

    /// Like [`open`](Self::open), with `cache` in front of the database and, given
    /// `memtables`, the database's memtables an equal part of the room it gives the databases
    /// sharing it (a `--group` worker's tasks, a tenant's pipelines in `statebox serve`).
    pub fn open_with_memory(
        dir: &Path,
        cache: &StateCache,
        memtables: Option<&Arc<SharedMemtables>>,
    ) -> Result<Self> {
        let db_dir = Self::db_dir(dir)?;
        let engine = match memtables {
            Some(share) => RocksEngine::open_sharing(&db_dir, share)?,
            None => RocksEngine::open(&db_dir)?,
        };
        tracing::debug!(
            dir = %dir.display(),
            ?cache,
            memtables_shared_by = memtables.map(|m| m.databases()),
            "opened checkpoint"
        );
        Ok(Self::with_engine(match cache {
            StateCache::Own(0) => Arc::new(engine),
            StateCache::Own(bytes) => Arc::new(CachedEngine::new(engine, *bytes)),
            StateCache::Shared(budget) => Arc::new(CachedEngine::sharing(engine, budget)),
        }))
    }

    /// The database directory of the checkpoint in `dir`, created if missing.
    fn db_dir(dir: &Path) -> Result<std::path::PathBuf> {
        let db_dir = dir.join(DB_DIR);
        std::fs::create_dir_all(&db_dir)
            .map_err(|e| io_error("creating checkpoint directory", &db_dir, e))?;
        Ok(db_dir)
    }

    /// Opens an existing checkpoint in `dir` for reading only, without taking its lock: it
    /// can be read while a pipeline runs on it, and shows the state committed at opening.
    /// Writes through it fail.
    pub fn open_read_only(dir: &Path) -> Result<Self> {
        let db_dir = dir.join(DB_DIR);
        if !db_dir.join("CURRENT").exists() {
            return Err(StoreError::Storage(format!(
                "{} is not a Statebox checkpoint (no state database in {})",
                dir.display(),
                db_dir.display()
            )));
        }
        let engine = RocksEngine::open_read_only(&db_dir)?;
        Ok(Self::with_engine(Arc::new(engine)))
    }

    /// Writes a snapshot of the committed state (everything a checkpoint holds) to `dir`,
    /// which must not exist, as a checkpoint that [`open_read_only`](Self::open_read_only)
    /// opens. Built in a temporary sibling directory and renamed into place, so `dir` is
    /// complete or absent. Returns `false` (writing nothing) for checkpoints in memory.
    pub fn snapshot(&self, dir: &Path) -> Result<bool> {
        snapshot(&*self.engine, dir)
    }

    /// Takes [`snapshot`](Self::snapshot) on a thread of its own and calls `done` there
    /// with its result, so that a caller can go on to its next batch meanwhile: a
    /// snapshot of RocksDB first flushes the memtables (110–270 ms in `bench timers` and
    /// `bench ttl`), which the batch that took it waited for.
    ///
    /// The snapshot holds the state of the last commit: the next commit (through any clone)
    /// waits for it to finish first. Metadata written outside a commit meanwhile (the next
    /// batch's plan) may or may not be in it. [`wait_for_snapshot`](Self::wait_for_snapshot)
    /// waits for it; so does dropping the checkpoint. A snapshot still being taken is
    /// waited for before this one starts. If no thread can be started, it is taken here.
    pub fn snapshot_in_background(
        &self,
        dir: PathBuf,
        done: impl FnOnce(Result<bool>) + Send + 'static,
    ) {
        let mut pending = self.pending_snapshot();
        join_snapshot(pending.take());
        // Handed back if no thread can be started, to take the snapshot here.
        let job = Arc::new(Mutex::new(Some((dir, done))));
        let on_thread = Arc::clone(&job);
        let engine = Arc::clone(&self.engine);
        let spawned = std::thread::Builder::new()
            .name("statebox-snapshot".into())
            .spawn(move || {
                if let Some((dir, done)) = take_slot(&on_thread) {
                    done(snapshot(&*engine, &dir));
                }
            });
        match spawned {
            Ok(thread) => *pending = Some(thread),
            Err(e) => {
                if let Some((dir, done)) = take_slot(&job) {
                    tracing::debug!("no thread for the snapshot ({e}): taking it here");
                    done(snapshot(&*self.engine, &dir));
                }
            }
        }
    }

    /// Removes from `dir` what snapshots interrupted by a crash left there (their temporary
    /// directories; a complete snapshot has been renamed into place), and says how many it
    /// removed. Their hard links would otherwise keep the state's old files on disk for good.
    /// Only for the checkpoint's writer, before it takes a snapshot into `dir`.
    pub fn remove_partial_snapshots(dir: &Path) -> Result<usize> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_error("reading", dir, e)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| io_error("reading", dir, e))?;
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(PARTIAL_SNAPSHOT)
            {
                let path = entry.path();
                std::fs::remove_dir_all(&path).map_err(|e| io_error("removing", &path, e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Waits until the snapshot [`snapshot_in_background`](Self::snapshot_in_background)
    /// is taking, if any, is written (and its `done` called).
    pub fn wait_for_snapshot(&self) {
        join_snapshot(self.pending_snapshot().take());
    }

    fn pending_snapshot(&self) -> std::sync::MutexGuard<'_, Option<JoinHandle<()>>> {
        self.snapshotting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The backend, for tests that need to plant bytes or observe reads.
    #[cfg(test)]
    pub(crate) fn engine(&self) -> &Arc<dyn KvEngine> {
        &self.engine
    }

    /// A fresh, empty checkpoint held in memory.
    pub fn in_memory() -> Self {
        Self::with_engine(Arc::new(MemEngine::default()))
    }

    /// A checkpoint over any backend.
    pub fn with_engine(engine: Arc<dyn KvEngine>) -> Self {
        Self {
            engine,
            spare: Spare::default(),
            snapshotting: Arc::default(),
            read_shapes: Shapes::default(),
        }
    }

    /// A small named metadata blob (query config, variable catalog, commit log).
    pub fn get_meta(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.engine.get(&keys::meta_key(name))
    }

    /// All metadata whose name starts with `prefix`, ascending by name.
    pub fn scan_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let (start, end) = keys::meta_range(prefix);
        let mut out = Vec::new();
        self.engine.scan(&start, &end, &mut |k, v| {
            out.push((keys::decode_meta_key(k)?.to_owned(), v.to_vec()));
            Ok(true)
        })?;
        Ok(out)
    }

    /// Calls `f` with every metadata blob whose name starts with `prefix`, ascending by
    /// name, until `f` returns `false`; unlike [`scan_meta`](Self::scan_meta) it holds one
    /// blob at a time.
    pub fn for_each_meta(
        &self,
        prefix: &str,
        mut f: impl FnMut(&str, &[u8]) -> Result<bool>,
    ) -> Result<()> {
        let (start, end) = keys::meta_range(prefix);
        self.engine
            .scan(&start, &end, &mut |k, v| f(keys::decode_meta_key(k)?, v))
    }

    /// Calls `f` with every committed value of value variable `var` as `(grouping key,
    /// value)`, ascending by grouping key bytes, until `f` returns `false`. Expired values not
    /// yet removed by TTL cleanup are included. Memory use is bounded (one entry at a time).
    pub fn scan_values(
        &self,
        var: VarId,
        f: impl FnMut(&[u8], StoredValue) -> Result<bool>,
    ) -> Result<()> {
        self.scan_values_at(var, &Undo::default(), f)
    }

    /// [`scan_values`](Self::scan_values) of the state committed at an earlier batch:
    /// the committed state with `undo` (see [`undo_since`](Self::undo_since)) applied.
    pub fn scan_values_at(
        &self,
        var: VarId,
        undo: &Undo,
        mut f: impl FnMut(&[u8], StoredValue) -> Result<bool>,
    ) -> Result<()> {
        self.scan_var(keys::VALUE, var, undo, &mut |key, suffix, value| {
            if !suffix.is_empty() {
                return Err(StoreError::Corrupt("malformed value state key".into()));
            }
            f(key, value)
        })
    }

    /// Calls `f` with every committed element of list variable `var` as `(grouping key,
    /// sequence, element)`, grouped by grouping key and in list order within a key, until
    /// `f` returns `false`. Expired elements not yet removed are included.
    pub fn scan_list(
        &self,
        var: VarId,
        f: impl FnMut(&[u8], u64, StoredValue) -> Result<bool>,
    ) -> Result<()> {
        self.scan_list_at(var, &Undo::default(), f)
    }

    /// [`scan_list`](Self::scan_list) of the state committed at an earlier batch (see
    /// [`scan_values_at`](Self::scan_values_at)).
    pub fn scan_list_at(
        &self,
        var: VarId,
        undo: &Undo,
        mut f: impl FnMut(&[u8], u64, StoredValue) -> Result<bool>,
    ) -> Result<()> {
        self.scan_var(keys::LIST, var, undo, &mut |key, suffix, value| {
            let seq = <[u8; keys::SEQ_LEN]>::try_from(suffix)
                .map_err(|_| StoreError::Corrupt("malformed list element key".into()))?;
            f(key, u64::from_be_bytes(seq), value)
        })
    }

    /// Calls `f` with every committed entry of map variable `var` as `(grouping key, user
    /// key, value)`, grouped by grouping key and ascending by user key bytes within a key,
    /// until `f` returns `false`. Expired entries not yet removed are included.
    pub fn scan_map(
        &self,
        var: VarId,
        f: impl FnMut(&[u8], &[u8], StoredValue) -> Result<bool>,
    ) -> Result<()> {
        self.scan_map_at(var, &Undo::default(), f)
    }

    /// [`scan_map`](Self::scan_map) of the state committed at an earlier batch (see
    /// [`scan_values_at`](Self::scan_values_at)).
    pub fn scan_map_at(
        &self,
        var: VarId,
        undo: &Undo,
        mut f: impl FnMut(&[u8], &[u8], StoredValue) -> Result<bool>,
    ) -> Result<()> {
        self.scan_var(keys::MAP, var, undo, &mut |key, user_key, value| {
            f(key, user_key, value)
        })
    }

    /// Calls `f` with every committed timer as `(grouping key, timestamp)`, grouped by
    /// grouping key and ascending by time within a key, until `f` returns `false`.
    pub fn scan_timers(&self, mut f: impl FnMut(&[u8], i64) -> Result<bool>) -> Result<()> {
        let (start, end) = keys::timers_by_key_range();
        self.engine.scan(&start, &end, &mut |k, _| {
            let (key, ts) = keys::decode_timer_key(k)?;
            f(key, ts)
        })
    }

    /// Calls `f` with every committed timer as `(grouping key, timestamp)` as of an earlier
    /// batch: the committed timers with `undo` (see [`undo_timers_since`](Self::undo_timers_since))
    /// applied. Ordered as [`scan_timers`](Self::scan_timers).
    pub fn scan_timers_at(
        &self,
        undo: &Undo,
        mut f: impl FnMut(&[u8], i64) -> Result<bool>,
    ) -> Result<()> {
        let (start, end) = keys::timers_by_key_range();
        self.scan_merged(&start, &end, undo, &mut |k, _| {
            let (key, ts) = keys::decode_timer_key(k)?;
            f(key, ts)
        })
    }

    /// Scans one variable's entries in namespace `ns`: `(grouping key, suffix, value)`,
    /// merging `undo`'s entries over the committed ones in key order.
    fn scan_var(&self, ns: u8, var: VarId, undo: &Undo, f: &mut VarScanFn<'_>) -> Result<()> {
        let (start, end) = keys::var_range(ns, var);
        self.scan_merged(&start, &end, undo, &mut |k, v| {
            let (_, key, suffix) = keys::decode_var_key(ns, k)?;
            f(key, suffix, StoredValue::decode(v)?)
        })
    }

    /// Scans `[start, end)` with `undo`'s entries merged over the committed ones in key
    /// order: an undo entry replaces the committed value at its key, or hides it (`None`).
    fn scan_merged(
        &self,
        start: &[u8],
        end: &[u8],
        undo: &Undo,
        emit: &mut ScanFn<'_>,
    ) -> Result<()> {
        let mut pending = undo
            .entries
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
            .peekable();
        let mut stopped = false;
        self.engine.scan(start, end, &mut |k, v| {
            while let Some((uk, uv)) = pending.next_if(|(uk, _)| uk.as_slice() < k) {
                if let Some(uv) = uv
                    && !emit(uk, uv)?
                {
                    stopped = true;
                    return Ok(false);
                }
            }
            let go_on = match pending.next_if(|(uk, _)| uk.as_slice() == k) {
                Some((_, Some(uv))) => emit(k, uv)?,
                Some((_, None)) => true,
                None => emit(k, v)?,
            };
            stopped = !go_on;
            Ok(go_on)
        })?;
        if !stopped {
            for (uk, uv) in pending {
                if let Some(uv) = uv
                    && !emit(uk, uv)?
                {
                    break;
                }
            }
        }
        Ok(())
    }

    /// What undoes, for variable `var`, the batches after `batch` up to the latest committed
    /// one, `latest`: per key they changed, its before-image in the first of them that
    /// changed it. Scanning with it (e.g. [`scan_values_at`](Self::scan_values_at)) shows the
    /// state committed at `batch`. Memory grows with the keys changed since `batch`.
    ///
    /// The change logs of batches `batch + 1..=latest` must be retained (the caller checks
    /// the range); a log written without before-images is an error.
    pub fn undo_since(&self, var: VarId, batch: u64, latest: u64) -> Result<Undo> {
        let ranges: Vec<(Vec<u8>, Vec<u8>)> = [keys::VALUE, keys::LIST, keys::MAP]
            .into_iter()
            .map(|ns| keys::var_range(ns, var))
            .collect();
        self.undo_ranges(&ranges, batch, latest)
    }

    /// What undoes the registered timers (of every key) of the batches after `batch` up to
    /// `latest`, for [`scan_timers_at`](Self::scan_timers_at); as
    /// [`undo_since`](Self::undo_since).
    pub fn undo_timers_since(&self, batch: u64, latest: u64) -> Result<Undo> {
        self.undo_ranges(&[keys::timers_by_key_range()], batch, latest)
    }

    fn undo_ranges(&self, ranges: &[(Vec<u8>, Vec<u8>)], batch: u64, latest: u64) -> Result<Undo> {
        let mut undo = Undo::default();
        if batch >= latest {
            return Ok(undo);
        }
        self.scan_changelog(batch + 1, latest, |logged_batch, _, log| {
            for change in changelog::decode(log) {
                let change = change?;
                if !ranges
                    .iter()
                    .any(|(s, e)| change.key >= s.as_slice() && change.key < e.as_slice())
                {
                    continue;
                }
                let Some(before) = change.before else {
                    return Err(StoreError::Corrupt(format!(
                        "the change log of batch {logged_batch} has no before-images (written \
                         by an older Statebox), so earlier batches cannot be reconstructed"
                    )));
                };
                undo.entries
                    .entry(change.key.to_vec())
                    .or_insert_with(|| before.map(<[u8]>::to_vec));
            }
            Ok(true)
        })?;
        Ok(undo)
    }

    /// Durably (fsynced) writes one metadata blob outside any batch, e.g. the query's
    /// config when it is first opened.
    pub fn put_meta_sync(&self, name: &str, value: &[u8]) -> Result<()> {
        let mut batch = WriteBatch::new();
        batch.put(keys::meta_key(name), value.to_vec());
        self.engine.write(&batch)
    }

    /// The plan logged for `batch` by [`put_plan_sync`](Self::put_plan_sync), if any.
    pub fn get_plan(&self, batch: u64) -> Result<Option<Vec<u8>>> {
        self.engine.get(&keys::plan_key(batch))
    }

    /// Durably (fsynced) logs the plan of `batch` before the batch runs, and removes the
    /// plan of the batch before it in the same write: that batch is committed, since
    /// batches run in order.
    ///
    /// A commit does not remove its own batch's plan. Plans live in a namespace below every
    /// other ([`keys::PLAN`]), and a commit writes nothing there. So a large commit's table
    /// files never cover the logged plan, and RocksDB ingests them without flushing the
    /// memtable that holds it first.
    pub fn put_plan_sync(&self, batch: u64, plan: &[u8]) -> Result<()> {
        let mut write = WriteBatch::new();
        if let Some(before) = batch.checked_sub(1) {
            write.delete(keys::plan_key(before));
        }
        write.put(keys::plan_key(batch), plan.to_vec());
        self.engine.write(&write)
    }

    /// Durably removes the plan of `batch`, e.g. of a batch that failed and will be
    /// planned again.
    pub fn withdraw_plan(&self, batch: u64) -> Result<()> {
        let mut write = WriteBatch::new();
        write.delete(keys::plan_key(batch));
        self.engine.write(&write)
    }

    /// Bytes of state on disk (RocksDB SST files; 0 in memory).
    pub fn disk_bytes(&self) -> u64 {
        self.engine.disk_bytes()
    }

    /// A new transaction for one partition of the batch being run: an in-memory overlay
    /// over the committed state with read-your-writes.
    pub fn txn(&self, partition: Partition) -> PartitionTxn {
        PartitionTxn::new(
            Arc::clone(&self.engine),
            partition,
            self.read_shapes.clone(),
        )
    }

    /// Atomically (one fsynced write batch) applies the variable drops, every partition's
    /// overlay and the metadata writes. After a crash either all of it is visible or none.
    ///
    /// The transactions must come from this checkpoint (their reads were of its state).
    pub fn commit(&self, commit: Commit) -> Result<()> {
        self.commit_with(commit, |_| Vec::new()).map(|_| ())
    }

    /// [`commit`](Self::commit), with metadata that depends on what the batch changed:
    /// `finish` is called with the counts of the change log (all zero without one) before
    /// the write, and its metadata writes are applied with the commit's own. Returns the
    /// counts.
    pub fn commit_with(
        &self,
        commit: Commit,
        finish: impl FnOnce(&ChangeStats) -> Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<ChangeStats> {
        let Commit {
            drop_vars,
            txns,
            meta,
            changelog,
        } = commit;
        // The snapshot being taken is of the last commit's state.
        self.wait_for_snapshot();
        // Change log per partition, ascending by partition.
        let mut logs: BTreeMap<Partition, Log> = BTreeMap::new();
        let logging = changelog.is_some();
        let mut batch = self.spare.take();
        batch.reserve(
            drop_vars.len() * keys::VAR_NAMESPACES.len()
                + txns.iter().map(PartitionTxn::pending_ops).sum::<usize>()
                + meta.len(),
        );
        for var in &drop_vars {
            for ns in keys::VAR_NAMESPACES {
                let (start, end) = keys::var_range(ns, *var);
                if let Some(cl) = changelog.as_ref().filter(|_| changelog::logged(ns)) {
                    self.engine.scan(&start, &end, &mut |k, v| {
                        let (_, key, _) = keys::decode_var_key(ns, k)?;
                        let log = logs.entry((cl.partition_of)(key)).or_default();
                        log.push(k, None, Some(v));
                        Ok(true)
                    })?;
                }
                batch.delete_range(start, end);
            }
        }
        let txn_count = txns.len();
        let mut runs = Vec::with_capacity(txns.len());
        for txn in txns {
            let partition = txn.partition();
            let (ops, changes) = txn.into_parts();
            if logging {
                let log = logs.entry(partition).or_default();
                log.append(changes?);
                self.log_range_deletes(&ops, log)?;
            }
            runs.push(ops);
        }
        merge_runs(runs, &mut batch);
        // The counts of what the commit logs: each entry was counted as it was logged, most
        // of them as their partitions' transactions were sealed.
        let mut stats = ChangeStats::default();
        for log in logs.values() {
            stats.add(&log.stats);
        }
        for (name, value) in meta.into_iter().chain(finish(&stats)) {
            let key = keys::meta_key(&name);
            match value {
                Some(v) => batch.put(key, v),
                None => batch.delete(key),
            }
        }
        if let Some(cl) = &changelog {
            if cl.retain_from > 0 {
                let (start, end) = keys::changelog_range(0, cl.retain_from.min(cl.batch_id));
                batch.delete_range(start, end);
            }
            batch.put(keys::changelog_marker(cl.batch_id), Vec::new());
            for (partition, log) in logs {
                for (n, chunk) in log.chunks().enumerate() {
                    // At most one chunk per entry, and a log has fewer than 2^32 entries.
                    let key = keys::changelog_chunk_key(cl.batch_id, partition, n as u32);
                    batch.put(key, chunk.to_vec());
                }
            }
        }
        let ops = batch.len();
        self.engine.write(&batch)?;
        self.spare.recycle(batch);
        tracing::debug!(
            dropped_vars = drop_vars.len(),
            txns = txn_count,
            ops,
            "committed batch"
        );
        Ok(stats)
    }

    /// Logs deletes for the committed keys that `ops`' range tombstones over value, list
    /// and map entries remove and that `ops` (ascending by key) does not put again.
    fn log_range_deletes(&self, ops: &[WriteOp], log: &mut Log) -> Result<()> {
        for op in ops {
            let WriteOp::DeleteRange(start, end) = op else {
                continue;
            };
            if !start.first().is_some_and(|&ns| changelog::logged(ns)) {
                continue;
            }
            self.engine.scan(start, end, &mut |k, v| {
                let put_again = ops
                    .binary_search_by(|op| op_key(op).cmp(k))
                    .is_ok_and(|i| matches!(ops[i], WriteOp::Put(..)));
                if !put_again {
                    log.push(k, None, Some(v));
                }
                Ok(true)
            })?;
        }
        Ok(())
    }

    /// The first batch whose change log is retained, if any is.
    pub fn changelog_first_batch(&self) -> Result<Option<u64>> {
        let (start, end) = keys::changelog_range_from(0);
        let mut first = None;
        self.engine.scan(&start, &end, &mut |k, _| {
            first = Some(keys::decode_changelog_key(k)?.0);
            Ok(false)
        })?;
        Ok(first)
    }

    /// Whether batch `batch`'s change log is retained.
    pub fn has_changelog(&self, batch: u64) -> Result<bool> {
        Ok(self.engine.get(&keys::changelog_marker(batch))?.is_some())
    }

    /// Calls `f` with the stored change log of every partition that changed state in
    /// batches `from..=to`, as `(batch, partition, log)` ascending by batch then partition,
    /// until `f` returns `false`; a log stored in chunks comes chunk by chunk, in order,
    /// each a whole number of entries. Decode a log with [`changelog::decode`].
    pub fn scan_changelog(
        &self,
        from: u64,
        to: u64,
        mut f: impl FnMut(u64, Partition, &[u8]) -> Result<bool>,
    ) -> Result<()> {
        let (start, end) = match to.checked_add(1) {
            Some(end) => keys::changelog_range(from, end),
            None => keys::changelog_range_from(from),
        };
        self.engine.scan(
            &start,
            &end,
            &mut |k, v| match keys::decode_changelog_key(k)? {
                (batch, Some(partition)) => f(batch, partition, v),
                (_, None) => Ok(true),
            },
        )
    }
}

/// Appends the sealed transactions' operation lists (each ascending by key) to `out`,
/// merged into one ascending run, ties in transaction order, when that applies the same as
/// running them one after the other; else one after the other.
///
/// RocksDB inserts a batch into its memtable key by key, and each insert starts its search
/// where the previous one ended: one ascending run costs far fewer key comparisons than one
/// run per partition, each spanning the whole key space.
///
/// Merging moves a transaction's range delete ahead of any later-sorting key of an earlier
/// transaction, so it is only done when no range delete covers a key an earlier transaction
/// writes (partitions own disjoint grouping keys, so in practice none does).
fn merge_runs(mut runs: Vec<Vec<WriteOp>>, out: &mut WriteBatch) {
    runs.retain(|run| !run.is_empty());
    if runs.len() <= 1 || !merge_keeps_meaning(&runs) {
        runs.into_iter().for_each(|run| out.append(run));
        return;
    }
    out.reserve(runs.iter().map(Vec::len).sum());
    let mut runs: Vec<std::vec::IntoIter<WriteOp>> = runs.into_iter().map(Vec::into_iter).collect();
    // The runs with operations left, by their next key, ties in run order: the first's next
    // operation is the merge's next. Its run then moves back past the runs whose next key
    // comes before its own: one comparison while it keeps coming first (as a partition's
    // timers by time and TTL entries do, their keys starting with the partition), at most
    // one per other run.
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&i| next_key(&runs[i]));
    let mut at = 0;
    while let Some(&i) = order.get(at) {
        let run = &mut runs[i];
        if let Some(ahead) = run.as_slice().get(PREFETCH_AHEAD) {
            prefetch(op_key(ahead));
        }
        if let Some(op) = run.next() {
            out.push(op);
        }
        let Some(key) = next_key(&runs[i]) else {
            at += 1;
            continue;
        };
        let mut place = at + 1;
        while let Some(&j) = order.get(place) {
            let before = match next_key(&runs[j]).map(|other| other.cmp(key)) {
                Some(Ordering::Less) => true,
                Some(Ordering::Equal) => j < i,
                _ => false,
            };
            if !before {
                break;
            }
            place += 1;
        }
        order.copy_within(at + 1..place, at);
        order[place - 1] = i;
    }
}

/// The key of the next operation of `run`, if any is left.
fn next_key(run: &std::vec::IntoIter<WriteOp>) -> Option<&[u8]> {
    run.as_slice().first().map(op_key)
}

/// A commit's operation list, kept from one commit to the next for its room: ~400k
/// operations (56 bytes each, ~22 MiB) per batch of the counter workload. Allocating it
/// anew at every commit (its pages faulted in again) and emptying it on the committing
/// thread (freeing each operation's key and value) made the counter's commit about a third
/// longer (`bench/HISTORY.md`, "The commit's operation list, kept between commits"); it is
/// now emptied on a thread of its own after the write. What is kept is about the last
/// commit's size: a list more than twice as long as that commit needed is shrunk, so a
/// checkpoint that committed one large batch does not keep its room forever.
#[derive(Clone, Default)]
struct Spare(Arc<Mutex<Vec<WriteOp>>>);

impl Spare {
    /// The kept list, or a new one if the last is still being emptied (or none is kept).
    fn take(&self) -> WriteBatch {
        match self.0.try_lock() {
            Ok(mut kept) => WriteBatch::from_ops(std::mem::take(&mut *kept)),
            Err(_) => WriteBatch::new(),
        }
    }

    /// Empties `batch` on a thread of its own, then keeps its list for the next commit. If
    /// no thread can be started, `batch` is dropped here instead.
    fn recycle(&self, batch: WriteBatch) {
        let slot = Arc::clone(&self.0);
        let _ = std::thread::Builder::new()
            .name("statebox-free".into())
            .spawn(move || {
                let mut ops = batch.into_ops();
                let used = ops.len();
                clear_ops(&mut ops);
                if ops.capacity() > 2 * used {
                    ops.shrink_to(used);
                }
                *slot.lock().unwrap_or_else(PoisonError::into_inner) = ops;
            });
    }
}

/// Whether no range delete of a run covers a key of an earlier run.
fn merge_keeps_meaning(runs: &[Vec<WriteOp>]) -> bool {
    runs.iter().enumerate().all(|(j, run)| {
        run.iter().all(|op| match op {
            WriteOp::DeleteRange(start, end) => runs[..j].iter().all(|earlier| {
                let at = earlier.partition_point(|op| op_key(op) < start.as_slice());
                earlier
                    .get(at)
                    .is_none_or(|op| op_key(op) >= end.as_slice())
            }),
            _ => true,
        })
    })
}

/// The key an operation sorts by: a range delete's start.
fn op_key(op: &WriteOp) -> &[u8] {
    match op {
        WriteOp::Put(k, _) | WriteOp::Delete(k) | WriteOp::DeleteRange(k, _) => k,
    }
}

/// The name prefix of a snapshot being written: it is renamed into place when complete.
const PARTIAL_SNAPSHOT: &str = ".tmp-";

/// See [`Checkpoint::snapshot`].
fn snapshot(engine: &dyn KvEngine, dir: &Path) -> Result<bool> {
    let name = dir
        .file_name()
        .ok_or_else(|| StoreError::Storage(format!("bad snapshot path {}", dir.display())))?;
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| io_error("creating", parent, e))?;
    let tmp = parent.join(format!("{PARTIAL_SNAPSHOT}{}", name.to_string_lossy()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| io_error("removing", &tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| io_error("creating", &tmp, e))?;
    if !engine.snapshot_to(&tmp.join(DB_DIR))? {
        std::fs::remove_dir_all(&tmp).map_err(|e| io_error("removing", &tmp, e))?;
        return Ok(false);
    }
    std::fs::rename(&tmp, dir).map_err(|e| io_error("renaming snapshot to", dir, e))?;
    Ok(true)
}

/// A file system error, naming what was being done to which path.
fn io_error(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Storage(format!("{what} {}: {e}", path.display()))
}

fn take_slot<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// Waits for a snapshot's thread; a panic in it (in its `done`) is raised here.
fn join_snapshot(thread: Option<JoinHandle<()>>) {
    if let Some(thread) = thread
        && let Err(panic) = thread.join()
    {
        std::panic::resume_unwind(panic);
    }
}

impl Drop for Checkpoint {
    /// A snapshot being taken is finished first: it holds the database open.
    fn drop(&mut self) {
        if let Some(thread) = self.pending_snapshot().take() {
            // A panic on its thread is not raised from a drop: while unwinding, that would
            // abort.
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(runs: Vec<Vec<WriteOp>>) -> Vec<WriteOp> {
        let mut batch = WriteBatch::new();
        merge_runs(runs, &mut batch);
        batch.into_ops()
    }

    fn put(k: &str) -> WriteOp {
        WriteOp::Put(k.into(), Vec::new())
    }

    /// The list `spare` keeps, once the thread emptying the last one has put it back.
    fn kept(spare: &Spare) -> Vec<WriteOp> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let kept = std::mem::take(&mut *spare.0.lock().unwrap());
            if kept.capacity() > 0 {
                return kept;
            }
            assert!(std::time::Instant::now() < deadline, "no list was kept");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn a_commits_operation_list_is_emptied_aside_and_kept_for_the_next() {
        let spare = Spare::default();
        let mut batch = spare.take();
        for i in 0..1000u32 {
            batch.put(i.to_be_bytes().to_vec(), vec![1; 100]);
        }
        let room = batch.ops().as_ptr();
        spare.recycle(batch);
        let list = kept(&spare);
        assert!(list.is_empty() && list.capacity() >= 1000);
        assert_eq!(list.as_ptr(), room, "the same allocation, not a new one");
        *spare.0.lock().unwrap() = list;
        let mut next = spare.take();
        assert!(next.is_empty());
        assert_eq!(next.ops().as_ptr(), room, "the next commit writes into it");

        // A commit that needed far less than the kept room leaves about what it needed.
        next.put(b"a".to_vec(), Vec::new());
        next.put(b"b".to_vec(), Vec::new());
        spare.recycle(next);
        let list = kept(&spare);
        assert!(
            list.is_empty() && list.capacity() < 1000,
            "{}",
            list.capacity()
        );
    }

    /// Memory whose snapshots wait for a gate, then record what `meta_key("k")` held.
    struct GatedSnapshots {
        inner: MemEngine,
        gate: Mutex<std::sync::mpsc::Receiver<()>>,
        snapshotted: Mutex<Vec<Option<Vec<u8>>>>,
    }

    impl KvEngine for GatedSnapshots {
        fn get_with(&self, key: &[u8], f: &mut crate::engine::GetFn<'_>) -> Result<bool> {
            self.inner.get_with(key, f)
        }
        fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
            self.inner.scan(start, end, f)
        }
        fn write(&self, batch: &WriteBatch) -> Result<()> {
            self.inner.write(batch)
        }
        fn snapshot_to(&self, dir: &Path) -> Result<bool> {
            self.gate.lock().unwrap().recv().unwrap();
            let held = self.inner.get(&keys::meta_key("k"))?;
            self.snapshotted.lock().unwrap().push(held);
            std::fs::create_dir_all(dir).unwrap();
            Ok(true)
        }
    }

    fn commit_k(cp: &Checkpoint, value: u8) {
        cp.commit(Commit {
            meta: vec![("k".into(), Some(vec![value]))],
            ..Commit::default()
        })
        .unwrap();
    }

    #[test]
    fn a_snapshot_in_the_background_holds_the_last_commit_and_the_next_commit_waits_for_it() {
        let (open, gate) = std::sync::mpsc::channel();
        let engine = Arc::new(GatedSnapshots {
            inner: MemEngine::default(),
            gate: Mutex::new(gate),
            snapshotted: Mutex::default(),
        });
        let cp = Checkpoint::with_engine(Arc::clone(&engine) as Arc<dyn KvEngine>);
        let dir = tempfile::tempdir().unwrap();
        commit_k(&cp, 1);
        let (done_tx, done) = std::sync::mpsc::channel();
        cp.snapshot_in_background(dir.path().join("0"), move |taken| {
            done_tx.send(taken.unwrap()).unwrap()
        });
        // The caller goes on while the snapshot waits at its gate...
        let next = {
            let cp = cp.clone();
            std::thread::spawn(move || commit_k(&cp, 2))
        };
        // ... but the next commit does not write until the snapshot is taken.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !next.is_finished(),
            "the commit did not wait for the snapshot"
        );
        assert!(done.try_recv().is_err());
        open.send(()).unwrap();
        next.join().unwrap();
        assert!(done.recv().unwrap(), "the snapshot was written");
        assert_eq!(*engine.snapshotted.lock().unwrap(), vec![Some(vec![1])]);
        assert!(dir.path().join("0").join(DB_DIR).is_dir());
        assert_eq!(cp.get_meta("k").unwrap(), Some(vec![2]));

        // Dropping the checkpoint finishes a snapshot being taken; so does waiting for it.
        cp.snapshot_in_background(dir.path().join("1"), |taken| assert!(taken.unwrap()));
        open.send(()).unwrap();
        cp.wait_for_snapshot();
        assert!(dir.path().join("1").is_dir());
        cp.snapshot_in_background(dir.path().join("2"), |taken| assert!(taken.unwrap()));
        open.send(()).unwrap();
        drop(cp);
        assert!(dir.path().join("2").is_dir());
        assert_eq!(engine.snapshotted.lock().unwrap().len(), 3);
    }

    /// Commits one after another through the kept list write their own operations only,
    /// whether or not they find the last commit's list back, and each sees the one before.
    #[test]
    fn commits_through_the_kept_list_write_their_own_operations_only() {
        /// Memory, recording every write's operations.
        #[derive(Default)]
        struct Recording(MemEngine, Mutex<Vec<Vec<WriteOp>>>);
        impl KvEngine for Recording {
            fn get_with(&self, key: &[u8], f: &mut crate::engine::GetFn<'_>) -> Result<bool> {
                self.0.get_with(key, f)
            }
            fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
                self.0.scan(start, end, f)
            }
            fn write(&self, batch: &WriteBatch) -> Result<()> {
                self.1.lock().unwrap().push(batch.ops().to_vec());
                self.0.write(batch)
            }
        }
        let engine = Arc::new(Recording::default());
        let cp = Checkpoint::with_engine(Arc::clone(&engine) as Arc<dyn KvEngine>);
        for n in 0..50u8 {
            let mut meta = vec![(format!("m{n}"), Some(vec![n]))];
            if n > 0 {
                meta.push((format!("m{}", n - 1), None));
            }
            cp.commit(Commit {
                meta,
                ..Commit::default()
            })
            .unwrap();
            if n % 2 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        let writes = engine.1.lock().unwrap();
        assert_eq!(writes.len(), 50);
        for (n, ops) in writes.iter().enumerate() {
            let mut expected = vec![WriteOp::Put(
                keys::meta_key(&format!("m{n}")),
                vec![n as u8],
            )];
            if n > 0 {
                expected.push(WriteOp::Delete(keys::meta_key(&format!("m{}", n - 1))));
            }
            assert_eq!(*ops, expected, "commit {n}");
        }
        assert_eq!(cp.get_meta("m48").unwrap(), None);
        assert_eq!(cp.get_meta("m49").unwrap(), Some(vec![49]));
    }

    fn range(s: &str, e: &str) -> WriteOp {
        WriteOp::DeleteRange(s.into(), e.into())
    }

    #[test]
    fn sorted_runs_merge_into_one_with_ties_in_run_order() {
        let runs = vec![
            vec![put("a"), put("d"), WriteOp::Delete("k".into())],
            vec![],
            vec![put("b"), range("e", "f"), put("e1"), put("k")],
            vec![put("c")],
        ];
        assert_eq!(
            merged(runs),
            [
                put("a"),
                put("b"),
                put("c"),
                put("d"),
                range("e", "f"),
                put("e1"),
                WriteOp::Delete("k".into()),
                put("k"),
            ]
        );
        assert_eq!(merged(vec![vec![put("x")]]), [put("x")]);
        assert!(merged(Vec::new()).is_empty());
    }

    /// Random runs, interleaved over shared keys (ties within and across runs, every
    /// fourth case all of them) and in blocks of their own (a namespace's partition prefix):
    /// the merge is the stable sort of the runs one after the other.
    #[test]
    fn merged_runs_are_the_stable_sort_of_the_runs_in_order() {
        let mut rng = crate::xorshift(5);
        let mut next = |n: u64| rng() % n;
        for case in 0..300 {
            let runs: Vec<Vec<WriteOp>> = (0..1 + next(6))
                .map(|run| {
                    let mut keys: Vec<Vec<u8>> = (0..next(40))
                        .map(|_| match next(if case % 4 == 0 { 1 } else { 3 }) {
                            0 => vec![b's', next(8) as u8],
                            1 => vec![b'b', run as u8, next(100) as u8],
                            _ => vec![b'p', next(4) as u8, run as u8, next(5) as u8],
                        })
                        .collect();
                    keys.sort();
                    keys.into_iter()
                        .enumerate()
                        .map(|(n, k)| WriteOp::Put(k, vec![run as u8, n as u8]))
                        .collect()
                })
                .collect();
            let mut expected: Vec<WriteOp> = runs.concat();
            expected.sort_by(|a, b| op_key(a).cmp(op_key(b)));
            assert_eq!(merged(runs), expected, "case {case}");
        }
    }

    #[test]
    fn a_range_delete_over_an_earlier_runs_key_keeps_run_order() {
        let runs = vec![vec![put("b"), put("d")], vec![put("a"), range("c", "e")]];
        assert_eq!(
            merged(runs),
            [put("b"), put("d"), put("a"), range("c", "e")]
        );
        // A range delete over a later run's key is merged: the later put wins either way.
        let runs = vec![vec![range("c", "e")], vec![put("d")], vec![put("a")]];
        assert_eq!(merged(runs), [put("a"), range("c", "e"), put("d")]);
    }
}
