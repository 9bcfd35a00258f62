//! The RocksDB backend.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use rocksdb::perf::{PerfStatsLevel, set_perf_stats};
use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBCompressionType,
    IngestExternalFileOptions, Options, ReadOptions, WriteOptions,
};

use crate::engine::{GetFn, GetManyFn, KvEngine, ScanFn, WriteBatch, WriteOp};
use crate::ingest;
use crate::{Result, StateMemory, StoreError, keys};

/// The process's state memory budget, of which RocksDB uses the block cache's and the
/// memtables' shares (see [`crate::memory`]): `None` until [`set_memory`] (the default then).
static MEMORY: std::sync::Mutex<Option<StateMemory>> = std::sync::Mutex::new(None);

/// The process's state memory budget.
fn memory() -> StateMemory {
    MEMORY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or_default()
}

/// Sets the process's RocksDB memory: the writable databases' block cache is resized now if
/// it exists, memtables follow at the next open.
pub(crate) fn set_memory(m: StateMemory) {
    *MEMORY.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
    let caches = CACHES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(cache) = &caches[0] {
        cache.clone().set_capacity(m.block_cache_bytes);
    }
}

/// Bloom filter bits per key (~1% false positives): most point reads of a batch hit keys
/// that were never written, and the filter answers those without touching a data block.
const BLOOM_BITS_PER_KEY: f64 = 10.0;

/// Level-0 files that start a compaction (RocksDB's default is 4). A large commit adds a
/// file per core, and while the state fits in one level each compaction of level 0
/// rewrites all of it: at 16 files that happens half as often as at 8. A point read that
/// misses the state cache probes the bloom filter of each level-0 file, twice as many on
/// average; past the cache the runs measured no slower (`bench/HISTORY.md`, "Level 0
/// compacted at 16 files").
const LEVEL0_COMPACTION_TRIGGER: i32 = 16;

/// Level-0 files at which RocksDB slows writes down (2.5 times the trigger, as its default
/// of 20 was for 8), and at which it stops them (16 files later, as its defaults are).
const LEVEL0_SLOWDOWN_WRITES_TRIGGER: i32 = 40;
const LEVEL0_STOP_WRITES_TRIGGER: i32 = 56;

/// A RocksDB database in one directory.
pub(crate) struct RocksEngine {
    /// Shared only with [`SharedMemtables`], which resizes its memtables.
    db: Arc<DB>,
    /// The memtable room this database shares with others, if it does.
    share: Option<Arc<SharedMemtables>>,
    /// Options of every point read, made once: creating them per read costs an allocation
    /// through the C API.
    get_opts: ReadOptions,
    /// Options of every write: fsynced.
    write_opts: WriteOptions,
    /// The database's options, which the table files of large writes are written with.
    opts: Options,
    /// The database's directory.
    dir: PathBuf,
    /// Writes of at least this many operations are ingested as table files
    /// ([`ingest::MIN_OPS`]).
    ingest_min_ops: usize,
    /// Table files of state per ingested write, written side by side: one per core, up
    /// to 4. Found at open: asking for the cores reads the process's cgroup files.
    ingest_parts: usize,
    /// Numbers the table files written for ingestion.
    ingested_files: AtomicU64,
}

impl RocksEngine {
    /// Opens (creating if missing) the database in `path`.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        Self::open_mode(path, false, memory().write_buffer_bytes)
    }

    /// Opens (creating if missing) the database in `path` with an equal part of `share`'s
    /// memtable room, shrinking the other databases' parts.
    pub(crate) fn open_sharing(path: &Path, share: &Arc<SharedMemtables>) -> Result<Self> {
        let mut members = share.lock();
        let part = SharedMemtables::part(members.len() + 1);
        let mut engine = Self::open_mode(path, false, part)?;
        SharedMemtables::resize(&members, part);
        members.push(Arc::downgrade(&engine.db));
        engine.share = Some(Arc::clone(share));
        Ok(engine)
    }

    /// Opens the database in `path` for reading only. It takes no lock, so it works while a
    /// writer has the database open, and sees the state committed when it was opened.
    pub(crate) fn open_read_only(path: &Path) -> Result<Self> {
        Self::open_mode(path, true, memory().write_buffer_bytes)
    }

    /// Opens the database in `path` with memtables of `write_buffer_bytes`.
    fn open_mode(path: &Path, read_only: bool, write_buffer_bytes: usize) -> Result<Self> {
        let memory = memory();
        let cache = shared_cache(read_only, memory.block_cache_bytes)?;
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        // A full (not block-based) filter: one probe per point read.
        table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
        // Index and filter blocks are charged to the block cache, so the budget bounds them,
        // and partitioned into ~4 KiB pieces under a small top-level block that stays
        // pinned. A whole-file filter is one cache entry of up to a few MiB, larger than a
        // cache shard (a 64-shard LRU cache of 120 MiB has ~2 MiB shards): it cannot stay
        // cached, and every point read of that file read it back from the file and
        // checksummed it (half the CPU time of a 10M-key run; 1M keys in a 64 MiB budget:
        // over 300 s before, 85 s with partitions). A partition is read once and stays.
        table.set_cache_index_and_filter_blocks(true);
        table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(4096);
        table.set_pin_top_level_index_and_filter(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        table.set_format_version(5);
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_block_based_table_factory(&table);
        // LZ4 is linked into librocksdb (install-rocksdb.sh's build finds liblz4-dev, as
        // Debian's does) and costs little CPU; stored values are JSON text, which compresses
        // well.
        opts.set_compression_type(DBCompressionType::Lz4);
        // A memtable bloom filter lets point reads of keys absent from the memtable (most
        // keys, in a batch over many keys) skip its skiplist search.
        opts.set_memtable_whole_key_filtering(true);
        opts.set_memtable_prefix_bloom_ratio(0.1);
        opts.set_level_compaction_dynamic_level_bytes(true);
        opts.set_max_background_jobs(2);
        // A large commit adds two or more level-0 files (its table files of state, one per
        // core; see [`ingest`]), and before batch plans had a namespace of their own the
        // memtable flush its ingestion forced added a third: at RocksDB's default of 4
        // files, level 0 was compacted into the last level, which holds all the state,
        // after almost every batch.
        opts.set_level_zero_file_num_compaction_trigger(LEVEL0_COMPACTION_TRIGGER);
        opts.set_level_zero_slowdown_writes_trigger(LEVEL0_SLOWDOWN_WRITES_TRIGGER);
        opts.set_level_zero_stop_writes_trigger(LEVEL0_STOP_WRITES_TRIGGER);
        // Memtables are bounded by the budget (`memory`): with one column family, their size
        // times their number bounds what they hold.
        opts.set_write_buffer_size(write_buffer_bytes);
        opts.set_max_write_buffer_number(i32::try_from(memory.write_buffers).unwrap_or(i32::MAX));
        opts.set_bytes_per_sync(1 << 20);
        opts.set_keep_log_file_num(4);

        // The default column family is named so that batched reads (`get_many`) have its
        // handle; the database is the same as one opened without naming it.
        let cfs = [ColumnFamilyDescriptor::new(
            rocksdb::DEFAULT_COLUMN_FAMILY_NAME,
            opts.clone(),
        )];
        let db = if read_only {
            DB::open_cf_descriptors_read_only(&opts, path, cfs, false)
        } else {
            DB::open_cf_descriptors(&opts, path, cfs)
        }
        .map_err(|e| open_error(path, e))?;
        // The open may have started the compaction pool's threads.
        compactions_behind_workers();
        if !read_only {
            ingest::remove_leftovers(path)
                .map_err(|e| StoreError::Storage(format!("opening {}: {e}", path.display())))?;
        }
        let mut write_opts = WriteOptions::default();
        write_opts.set_sync(true);
        Ok(Self {
            db: Arc::new(db),
            share: None,
            get_opts: ReadOptions::default(),
            write_opts,
            opts,
            dir: path.to_path_buf(),
            ingest_min_ops: ingest_min_ops(),
            ingest_parts: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
            ingested_files: AtomicU64::new(0),
        })
    }

    /// Bytes held by the database's memtables, the one being written and those waiting to be
    /// flushed.
    #[cfg(test)]
    fn memtable_bytes(&self) -> u64 {
        self.db
            .property_int_value("rocksdb.size-all-mem-tables")
            .ok()
            .flatten()
            .unwrap_or(0)
    }
}

impl Drop for RocksEngine {
    fn drop(&mut self) {
        if let Some(share) = &self.share {
            share.leave(&self.db);
        }
    }
}

/// The memtable room of one database of the budget ([`StateMemory::write_buffers`] of
/// [`StateMemory::write_buffer_bytes`]), shared by the databases of several checkpoints (the
/// tasks of a `--group` worker, a tenant's pipelines in `statebox serve`; see
/// [`Checkpoint::open_with_memory`]): each has memtables of an
/// equal part of that size, so together they hold what one database would, however many
/// there are, down to 1 MiB each (past `write_buffer_bytes` / 1 MiB databases the room grows
/// by `write_buffers` MiB per database). A database that opens shrinks the others' memtables
/// at once (RocksDB switches one already larger at its next write, and flushes it); one that
/// closes leaves its part to the rest (their next memtables are larger).
///
/// [`Checkpoint::open_with_memory`]: crate::Checkpoint::open_with_memory
#[derive(Default)]
pub struct SharedMemtables {
    /// The databases sharing the room. Only this struct upgrades the pointers, under the
    /// lock, and a database leaves under it before it closes: a database is never kept open
    /// past its engine's drop, whose checkpoint may be opened again at once.
    members: Mutex<Vec<Weak<DB>>>,
}

impl std::fmt::Debug for SharedMemtables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemtables")
            .field("databases", &self.databases())
            .finish()
    }
}

/// The smallest memtable a shared database is given: below it RocksDB flushes (and compacts)
/// after every few thousand writes. Past `write_buffer_bytes` / this many databases, the room
/// grows by `write_buffers` memtables of this size per database.
const MIN_SHARED_WRITE_BUFFER_BYTES: usize = 1 << 20;

impl SharedMemtables {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<DB>>> {
        self.members.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The databases sharing the room now.
    pub fn databases(&self) -> usize {
        self.lock().len()
    }

    /// One database's memtable size when `databases` share the room.
    fn part(databases: usize) -> usize {
        (memory().write_buffer_bytes / databases.max(1)).max(MIN_SHARED_WRITE_BUFFER_BYTES)
    }

    /// Gives each of `members` memtables of `part` bytes.
    fn resize(members: &[Weak<DB>], part: usize) {
        let size = part.to_string();
        for db in members.iter().filter_map(Weak::upgrade) {
            // A database that refuses keeps its memtable size: the room is exceeded, nothing
            // is lost.
            if let Err(e) = db.set_options(&[("write_buffer_size", &size)]) {
                tracing::warn!(error = %e, part, "cannot resize a database's memtables");
            }
        }
    }

    /// Removes `db` from the room; the others' parts grow.
    fn leave(&self, db: &Arc<DB>) {
        let mut members = self.lock();
        members.retain(|m| !std::ptr::eq(m.as_ptr(), Arc::as_ptr(db)));
        if !members.is_empty() {
            Self::resize(&members, Self::part(members.len()));
        }
    }
}

/// The block cache of the process's databases: one for every writable database (a run's
/// checkpoint, each of a server's pipelines) and one for every read-only one (`statebox
/// state`, `statebox sql`, the server's state queries). Databases open at the same time
/// share it instead of each bringing a cache of its own, so a server with many pipelines
/// holds two caches, not one per pipeline, and queries do not evict the pipelines' blocks.
/// The first open creates it with `capacity` bytes ([`StateMemory::block_cache_bytes`]).
fn shared_cache(read_only: bool, capacity: usize) -> Result<Cache> {
    let mut caches = CACHES.lock().unwrap_or_else(|e| e.into_inner());
    let cache = &mut caches[usize::from(read_only)];
    if cache.is_none() {
        *cache = Some(Cache::new_lru_cache(capacity).map_err(storage)?);
    }
    Ok(cache.clone().expect("set above"))
}

/// The writable and the read-only databases' block caches, made by the first open of each.
static CACHES: std::sync::Mutex<[Option<Cache>; 2]> = std::sync::Mutex::new([None, None]);

/// Puts RocksDB's compaction threads in Linux's `SCHED_IDLE` class, so that they run in the
/// CPU time the partitions' workers leave (the commit's single thread, the output write).
/// RocksDB's environment, and so its compaction pool, is the process's: every database
/// opened here shares the pool's threads, which the first open that needs them starts (each
/// open calls this; a thread already idle is set again).
///
/// RocksDB's own setting (`lower_thread_pool_cpu_priority`) stops at nice 19, which still
/// counts as a busy core when the kernel places a thread that wakes or starts: in a trace of
/// `bench ttl`, a batch's two workers started while a compaction ran at nice 19 shared one
/// core for about 100 ms while the compaction had the other (`bench/HISTORY.md`,
/// "Compactions in SCHED_IDLE"). A core that runs only `SCHED_IDLE` threads counts as idle
/// there, and such a thread has a fifth of a nice-19 thread's share of a contended core.
/// That shortens the workers' waits without ending them (a started thread can still share
/// its starter's core until the load balancer moves it): in one 40-batch run of `bench ttl`
/// they waited 1.53 s for a core in all, against 1.79 s with compactions at nice 19. Not
/// setting RocksDB's priority matters too: a pool thread applies it at its next job, and
/// that would put the thread back in the normal class.
///
/// A compaction starved for long lets level-0 files pile up until RocksDB slows the writes,
/// which frees the CPU it needs. Flushes run in the other pool and keep the process's
/// priority. A thread whose class cannot be set keeps the normal one, with a debug log.
fn compactions_behind_workers() {
    #[cfg(target_os = "linux")]
    {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        for task in tasks.flatten() {
            // A thread that ended while this ran has no `comm` left to read.
            let comm = std::fs::read(task.path().join("comm")).unwrap_or_default();
            if comm.trim_ascii_end() != b"rocksdb:low" {
                continue;
            }
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `param` is a valid `sched_param` for the call's duration; `tid` is a
            // thread of this process, and a lower class needs no privilege.
            if unsafe { libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) } != 0 {
                let error = std::io::Error::last_os_error();
                tracing::debug!(tid, "cannot put a compaction thread in SCHED_IDLE: {error}");
            }
        }
    }
}

thread_local! {
    static PERF_STATS_OFF: Cell<bool> = const { Cell::new(false) };
}

/// Turns RocksDB's per-thread performance counters off for the calling thread. They default
/// to on and count every key comparison through a thread-local of the shared library (a
/// `__tls_get_addr` call each): about a tenth of the CPU time of memtable reads and writes.
#[inline]
fn perf_stats_off() {
    PERF_STATS_OFF.with(|off| {
        if !off.get() {
            set_perf_stats(PerfStatsLevel::Disable);
            off.set(true);
        }
    });
}

impl KvEngine for RocksEngine {
    fn snapshot_to(&self, dir: &Path) -> Result<bool> {
        let checkpoint = rocksdb::checkpoint::Checkpoint::new(&self.db).map_err(storage)?;
        checkpoint.create_checkpoint(dir).map_err(storage)?;
        Ok(true)
    }

    fn disk_bytes(&self) -> u64 {
        // A statistic, not part of any result: a failure reads as 0.
        self.db
            .property_int_value("rocksdb.total-sst-files-size")
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    #[inline]
    fn get_with(&self, key: &[u8], f: &mut GetFn<'_>) -> Result<bool> {
        perf_stats_off();
        match self
            .db
            .get_pinned_opt(key, &self.get_opts)
            .map_err(storage)?
        {
            Some(v) => f(&v).map(|()| true),
            None => Ok(false),
        }
    }

    fn get_many(&self, keys: &[&[u8]], f: &mut GetManyFn<'_>) -> Result<()> {
        /// Keys per batched lookup: bounds the pinned blocks held at once.
        const CHUNK: usize = 1024;
        perf_stats_off();
        let Some(cf) = self.db.cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME) else {
            return Err(StoreError::Storage(
                "the default column family is not open".into(),
            ));
        };
        for (c, chunk) in keys.chunks(CHUNK).enumerate() {
            let sorted = chunk.windows(2).all(|w| w[0] < w[1]);
            let values = self
                .db
                .batched_multi_get_cf_opt(cf, chunk, sorted, &self.get_opts);
            for (i, value) in values.into_iter().enumerate() {
                let value = value.map_err(storage)?;
                f(c * CHUNK + i, value.as_deref())?;
            }
        }
        Ok(())
    }

    fn read_ahead(&self, keys: &[&[u8]], f: &mut GetManyFn<'_>) -> Result<()> {
        // In key order, consecutive keys in one block share its lookup.
        if keys.windows(2).all(|w| w[0] < w[1]) {
            return self.get_many(keys, f);
        }
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_unstable_by_key(|&i| keys[i]);
        let sorted: Vec<&[u8]> = order.iter().map(|&i| keys[i]).collect();
        self.get_many(&sorted, &mut |j, v| f(order[j], v))
    }

    fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        perf_stats_off();
        let mut opts = ReadOptions::default();
        // The upper bound lets RocksDB stop at the range end instead of stepping over
        // tombstones beyond it.
        opts.set_iterate_upper_bound(end);
        let mut it = self.db.raw_iterator_opt(opts);
        it.seek(start);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !f(k, v)? {
                return Ok(());
            }
            it.next();
        }
        it.status().map_err(storage)
    }

    fn last_key_in(&self, start: &[u8], end: &[u8]) -> Result<Option<Vec<u8>>> {
        if start >= end {
            return Ok(None);
        }
        perf_stats_off();
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(start);
        opts.set_iterate_upper_bound(end);
        let mut it = self.db.raw_iterator_opt(opts);
        it.seek_to_last();
        match it.key() {
            Some(k) => Ok(Some(k.to_vec())),
            None => it.status().map(|()| None).map_err(storage),
        }
    }

    fn write(&self, batch: &WriteBatch) -> Result<()> {
        perf_stats_off();
        if batch.len() >= self.ingest_min_ops {
            return self.ingest(batch);
        }
        let mut wb = rocksdb::WriteBatch::default();
        for op in batch.ops() {
            match op {
                WriteOp::Put(k, v) => wb.put(k, v),
                WriteOp::Delete(k) => wb.delete(k),
                WriteOp::DeleteRange(start, end) if start < end => wb.delete_range(start, end),
                WriteOp::DeleteRange(..) => {}
            }
        }
        self.db.write_opt(wb, &self.write_opts).map_err(storage)
    }
}

/// The ingestion threshold of the databases opened now: [`ingest::MIN_OPS`], or in tests
/// the calling thread's override ([`tests::ingest_every_write`]).
fn ingest_min_ops() -> usize {
    #[cfg(test)]
    if let Some(min) = tests::INGEST_MIN_OPS.with(Cell::get) {
        return min;
    }
    ingest::MIN_OPS
}

impl RocksEngine {
    /// Writes `batch` as table files and ingests them in one step (see [`ingest`]).
    fn ingest(&self, batch: &WriteBatch) -> Result<()> {
        let ops = batch.ops();
        let points = ingest::effective_points(ops);
        let parts = ingest::split(ops, &points, self.ingest_parts, &[keys::CHANGELOG]);
        if parts.is_empty() {
            return Ok(());
        }
        let first = self
            .ingested_files
            .fetch_add(parts.len() as u64, Ordering::Relaxed);
        let files = ingest::write_files(&self.opts, &self.dir, first, ops, &parts)?;
        let mut options = IngestExternalFileOptions::default();
        // The files are linked into the database, not copied.
        options.set_move_files(true);
        let ingested = self.db.ingest_external_file_opts(&options, files.clone());
        // Linked files are removed from their old names by RocksDB; on a failure they are
        // still there.
        ingest::remove_files(&files);
        ingested.map_err(storage)
    }
}

fn storage(e: rocksdb::Error) -> StoreError {
    StoreError::Storage(e.into_string())
}

/// RocksDB reports a `LOCK` file held by another process as "While lock file: …" (the
/// `fcntl` lock failed) and one held in this process as "lock hold by current process"; other
/// failures around the file (e.g. permissions) are plain I/O errors.
fn open_error(path: &Path, e: rocksdb::Error) -> StoreError {
    let text = e.into_string();
    if text.contains("While lock file") || text.contains("lock hold by current process") {
        StoreError::Locked {
            path: path.parent().unwrap_or(path).display().to_string(),
        }
    } else {
        StoreError::Storage(format!("opening {}: {text}", path.display()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// The ingestion threshold of the databases this thread opens, if overridden.
        pub(crate) static INGEST_MIN_OPS: Cell<Option<usize>> = const { Cell::new(None) };
    }

    /// Makes every write of at least `min` operations to the databases this thread opens
    /// from now on an ingestion.
    fn ingest_writes_of(min: usize) {
        INGEST_MIN_OPS.with(|m| m.set(Some(min)));
    }

    /// Makes every write of the databases this thread opens from now on an ingestion.
    pub(crate) fn ingest_every_write() {
        ingest_writes_of(1);
    }

    /// An integer property of `engine`'s database.
    fn int_property(engine: &RocksEngine, name: &str) -> u64 {
        engine.db.property_int_value(name).unwrap().unwrap()
    }

    /// A database in a new temporary directory, ingesting every write.
    fn ingesting() -> (tempfile::TempDir, RocksEngine) {
        let dir = tempfile::tempdir().unwrap();
        ingest_every_write();
        let engine = RocksEngine::open(dir.path()).unwrap();
        (dir, engine)
    }

    /// Every key and value of `engine`, in order.
    fn contents(engine: &RocksEngine) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut all = Vec::new();
        engine
            .scan(&[], &[0xff; 8], &mut |k, v| {
                all.push((k.to_vec(), v.to_vec()));
                Ok(true)
            })
            .unwrap();
        all
    }

    /// Random batches of puts, deletes and range deletes over a few keys, with keys written
    /// several times per batch and range deletes before and after point writes they cover,
    /// leave the same contents ingested as written through the log, batch after batch and
    /// after reopening.
    #[test]
    fn ingested_writes_leave_what_logged_writes_do() {
        let dir = tempfile::tempdir().unwrap();
        let logged = RocksEngine::open(&dir.path().join("logged")).unwrap();
        ingest_every_write();
        let ingested = RocksEngine::open(&dir.path().join("ingested")).unwrap();
        assert_eq!(
            (logged.ingest_min_ops, ingested.ingest_min_ops),
            (ingest::MIN_OPS, 1)
        );
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        let key = |i: u64| format!("k{i:02}").into_bytes();
        for round in 0..60 {
            let mut batch = WriteBatch::new();
            for _ in 0..next(300) {
                match next(20) {
                    0..=13 => batch.put(
                        key(next(64)),
                        format!("v{round}-{}", next(1000)).into_bytes(),
                    ),
                    14..=16 => batch.delete(key(next(64))),
                    // Empty and reversed ranges included: they delete nothing.
                    _ => batch.delete_range(key(next(66)), key(next(66))),
                }
            }
            logged.write(&batch).unwrap();
            ingested.write(&batch).unwrap();
            assert_eq!(contents(&ingested), contents(&logged), "round {round}");
        }
        let expected = contents(&logged);
        assert!(!expected.is_empty());
        drop(ingested);
        let reopened = RocksEngine::open(&dir.path().join("ingested")).unwrap();
        assert_eq!(contents(&reopened), expected);
    }

    /// A batch's ingestion is one step: a key written in one table file of the batch and
    /// range-deleted in another keeps the batch's order of operations, and no file is left
    /// beside the database.
    #[test]
    fn a_write_split_into_files_keeps_the_order_of_its_operations() {
        let (dir, engine) = ingesting();
        let mut first = WriteBatch::new();
        for i in 0..3000 {
            first.put(format!("a{i:04}").into_bytes(), b"old".to_vec());
        }
        engine.write(&first).unwrap();
        let mut second = WriteBatch::new();
        // Removes every `a` key, then puts some back: those stay, in every file.
        second.delete_range(b"a".to_vec(), b"b".to_vec());
        for i in (0..3000).step_by(7) {
            second.put(format!("a{i:04}").into_bytes(), b"new".to_vec());
        }
        // A put then removed by a later range delete is gone.
        second.put(b"c1".to_vec(), b"gone".to_vec());
        second.delete_range(b"c".to_vec(), b"d".to_vec());
        engine.write(&second).unwrap();
        let all = contents(&engine);
        let expected: Vec<(Vec<u8>, Vec<u8>)> = (0..3000)
            .step_by(7)
            .map(|i| (format!("a{i:04}").into_bytes(), b"new".to_vec()))
            .collect();
        assert_eq!(all, expected);
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with("statebox-ingest-")),
            "{names:?}"
        );
    }

    /// A commit's change log, whose keys are past everything stored, is a table file of its
    /// own, which RocksDB adds to the last level: it is not compacted with the state, which
    /// a later write overlaps and which goes to level 0.
    #[test]
    fn the_change_log_goes_to_the_last_level() {
        let (_dir, engine) = ingesting();
        let files_at =
            |level: u8| int_property(&engine, &format!("rocksdb.num-files-at-level{level}"));
        let commit = |batch: u64| {
            let mut b = WriteBatch::new();
            for i in 0..100u32 {
                b.put(keys::value_key(1, &i.to_be_bytes()), vec![1; 10]);
            }
            b.put(keys::changelog_key(batch, 0), vec![2; 1000]);
            engine.write(&b).unwrap();
        };
        commit(1);
        let (level0, last) = (files_at(0), files_at(6));
        commit(2);
        assert!(files_at(0) > level0, "the state overlaps the first write's");
        assert_eq!(
            files_at(6),
            last + 1,
            "the change log alone goes to the last level"
        );
    }

    /// Level 0 is compacted at 16 files, not before. Each commit adds one level-0 file over
    /// the same keys, and RocksDB is left to finish its compactions before the next: the
    /// count is then the same however busy the machine is.
    #[test]
    fn level_0_is_compacted_at_16_files() {
        let (_dir, mut engine) = ingesting();
        engine.ingest_parts = 1;
        let level0 = |engine: &RocksEngine| int_property(engine, "rocksdb.num-files-at-level0");
        let commit = |engine: &RocksEngine, batch: u32| {
            let mut b = WriteBatch::new();
            for i in 0..100u32 {
                b.put(
                    keys::value_key(1, &i.to_be_bytes()),
                    batch.to_be_bytes().to_vec(),
                );
            }
            engine.write(&b).unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while int_property(engine, "rocksdb.compaction-pending") != 0
                || int_property(engine, "rocksdb.num-running-compactions") != 0
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "compactions still running"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        // The first write overlaps nothing and goes to the last level; the next ones to 0.
        commit(&engine, 0);
        assert_eq!(level0(&engine), 0);
        for batch in 1..16 {
            commit(&engine, batch);
            assert_eq!(level0(&engine), u64::from(batch), "after commit {batch}");
        }
        commit(&engine, 16);
        assert!(level0(&engine) < 16, "the 16th file starts a compaction");
        let all = contents(&engine);
        assert_eq!(all.len(), 100, "the keys are still there, each once");
        assert!(
            all.iter().all(|(_, v)| *v == 16u32.to_be_bytes()),
            "each with the last commit's value"
        );
    }

    /// A logged plan lies below every key a commit writes, so ingesting a commit leaves it
    /// in the memtable; a metadata blob inside the commit's key range is flushed first.
    #[test]
    fn ingesting_a_commit_leaves_the_logged_plan_in_the_memtable() {
        let dir = tempfile::tempdir().unwrap();
        // The plan's write (two operations) is logged; the commit's (three) ingested.
        ingest_writes_of(3);
        let engine = Arc::new(RocksEngine::open(dir.path()).unwrap());
        let checkpoint = crate::Checkpoint::with_engine(engine.clone());
        let in_memtable = || int_property(&engine, "rocksdb.num-entries-active-mem-table");
        let commit = |batch: u64| {
            let mut b = WriteBatch::new();
            b.put(keys::meta_key(&format!("commit/{batch}")), vec![1]);
            b.put(keys::meta_key(&format!("timing/{batch}")), vec![2]);
            b.put(keys::value_key(1, b"k"), vec![3]);
            engine.write(&b).unwrap();
        };
        checkpoint.put_plan_sync(1, b"plan 1").unwrap();
        commit(1);
        assert_eq!(
            in_memtable(),
            2,
            "the plan and the removal of the one before"
        );
        checkpoint.put_meta_sync("head", b"1").unwrap();
        commit(2);
        assert_eq!(in_memtable(), 0, "\"head\" is inside the commit's range");
        assert_eq!(
            checkpoint.get_plan(1).unwrap().as_deref(),
            Some(&b"plan 1"[..])
        );
        checkpoint.put_plan_sync(2, b"plan 2").unwrap();
        assert_eq!(
            checkpoint.get_plan(1).unwrap(),
            None,
            "removed by the next plan"
        );
        checkpoint.withdraw_plan(2).unwrap();
        assert_eq!(checkpoint.get_plan(2).unwrap(), None);
    }

    /// Table files a crash left before their ingestion are removed when the database opens;
    /// what was committed stays.
    #[test]
    fn table_files_left_before_ingestion_are_removed_at_open() {
        let (dir, engine) = ingesting();
        let mut batch = WriteBatch::new();
        batch.put(b"k".to_vec(), b"v".to_vec());
        engine.write(&batch).unwrap();
        drop(engine);
        let leftover = dir.path().join("statebox-ingest-3.sst");
        std::fs::write(&leftover, b"half a table file").unwrap();
        let engine = RocksEngine::open(dir.path()).unwrap();
        assert!(!leftover.exists());
        assert_eq!(contents(&engine), vec![(b"k".to_vec(), b"v".to_vec())]);
    }

    /// Writes up to `bytes` of 1 KiB values to `engine`, in synced batches of 1,000, and
    /// says how many value bytes it wrote.
    fn fill(engine: &RocksEngine, bytes: usize) -> usize {
        let value = vec![7u8; 1024];
        let batches = bytes / (1024 * 1000);
        for b in 0..batches {
            let mut batch = WriteBatch::new();
            for i in 0..1000 {
                batch.put(format!("k{b:04}-{i:04}").into_bytes(), value.clone());
            }
            engine.write(&batch).unwrap();
        }
        batches * 1000 * 1024
    }

    /// A thread's scheduling class and nice value, from its `/proc/…/stat` text (the 41st
    /// and 19th fields).
    fn class_and_nice(stat: &str) -> (i32, i64) {
        // The fields after the command, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        (fields[38].parse().unwrap(), fields[16].parse().unwrap())
    }

    /// The scheduling class and nice value of each of this process's threads named `name`.
    fn threads_named(name: &str) -> Vec<(i32, i64)> {
        let mut found = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = task.unwrap().path();
            let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
                continue; // the thread ended
            };
            let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
                continue;
            };
            if comm.trim_end() == name {
                found.push(class_and_nice(&stat));
            }
        }
        found
    }

    /// Compaction threads are in `SCHED_IDLE` once a database is open, and stay there
    /// after running a compaction; flush threads keep the class and nice value of the
    /// thread that opened the database.
    #[test]
    fn compactions_run_behind_the_workers() {
        let dir = tempfile::tempdir().unwrap();
        let engine = RocksEngine::open(dir.path()).unwrap();
        let idle = |threads: &[(i32, i64)]| {
            !threads.is_empty() && threads.iter().all(|&(class, _)| class == libc::SCHED_IDLE)
        };
        let low = threads_named("rocksdb:low");
        assert!(
            idle(&low),
            "compaction threads before a compaction: {low:?}"
        );

        // Two level-0 files (each flush is a job of the flush pool), compacted into one by
        // a manual compaction, which runs in the compaction pool. (RocksDB's own priority
        // setting would take effect here: a pool's thread applies it at its next job.)
        for _ in 0..2 {
            fill(&engine, 1 << 20);
            engine.db.flush().unwrap();
        }
        engine.db.compact_range(None::<&[u8]>, None::<&[u8]>);
        let low = threads_named("rocksdb:low");
        assert!(idle(&low), "compaction threads after a compaction: {low:?}");
        let own = class_and_nice(&std::fs::read_to_string("/proc/thread-self/stat").unwrap());
        let high = threads_named("rocksdb:high");
        assert!(
            !high.is_empty() && high.iter().all(|&t| t == own),
            "flush threads: {high:?}, this thread: {own:?}"
        );
    }

    /// Four databases sharing the room of one hold its memtables between them, where four
    /// on their own would each hold nearly a whole memtable; one that closes leaves its
    /// part to the others.
    #[test]
    fn shared_databases_hold_the_memtables_of_one() {
        let m = memory();
        let room = m.write_buffers * m.write_buffer_bytes;
        // Each database is written most of one whole memtable: on its own, none flushes.
        let written = m.write_buffer_bytes * 7 / 8;
        let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();

        let alone: Vec<RocksEngine> = dirs
            .iter()
            .map(|d| RocksEngine::open(&d.path().join("alone")).unwrap())
            .collect();
        alone.iter().for_each(|e| {
            fill(e, written);
        });
        let held: u64 = alone.iter().map(RocksEngine::memtable_bytes).sum();
        // What the shared ones must stay under, RocksDB's arena blocks (up to 1 MiB per
        // memtable) allowed for.
        let bound = (room + 4 * m.write_buffers * (1 << 20)) as u64;
        assert!(held > bound, "alone: {held} bytes, not above {bound}");
        drop(alone);

        let share = Arc::new(SharedMemtables::default());
        let shared: Vec<RocksEngine> = dirs
            .iter()
            .map(|d| RocksEngine::open_sharing(&d.path().join("shared"), &share).unwrap())
            .collect();
        assert_eq!(share.databases(), 4);
        shared.iter().for_each(|e| {
            fill(e, written);
        });
        let held: u64 = shared.iter().map(RocksEngine::memtable_bytes).sum();
        assert!(held <= bound, "shared: {held} bytes, above {bound}");

        // Three close: the last gets the whole room back. Its memtable then is one of a
        // part (a memtable with a bloom filter cannot grow); the next, after a flush, is of
        // the whole room and holds nearly a whole memtable's writes without flushing.
        let mut shared = shared;
        let last = shared.pop().unwrap();
        drop(shared);
        assert_eq!(share.databases(), 1);
        last.db.flush().unwrap();
        let values = fill(&last, written) as u64;
        let held = last.memtable_bytes();
        assert!(
            held >= values,
            "the last database holds {held} bytes after {values} bytes of values: it flushed"
        );
    }
}
