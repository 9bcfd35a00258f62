//! One memory budget for a query's state, split between the three places committed state
//! is held in memory:
//!
//! - the **state cache** ([`crate::cache`]): decoded hot per-key state in front of RocksDB,
//!   per checkpoint, or shared by the checkpoints of a `--group` worker's tasks
//!   ([`crate::SharedCacheBudget`]);
//! - RocksDB's **block cache**: data blocks, and the index and filter blocks of every SST
//!   file (they are charged to it, not held beside it), shared by the process's writable
//!   databases;
//! - RocksDB's **memtables**: at most [`StateMemory::write_buffers`] of
//!   [`StateMemory::write_buffer_bytes`] each per database, flushed in the background; the
//!   databases of a `--group` worker's tasks (and of a tenant's pipelines in `statebox
//!   serve`) share that room, each with memtables of an equal part of the size (down to
//!   1 MiB, see [`crate::SharedMemtables`]).
//!
//! RocksDB 7.8's C API (the system library the `rocksdb` crate links here) has no
//! `WriteBufferManager`, so memtables cannot be charged to the block cache; they get a fixed
//! share of the budget instead, bounded by their size and number. The block cache's capacity
//! is not strict: a full strict cache fails reads ("Insert failed due to LRU cache being
//! full") when blocks pinned by running reads fill it, while a non-strict one only lets
//! pinned blocks overshoot it: those being read, briefly, and the index and filter blocks
//! of level-0 files until a compaction (at 16 files, see `rocks.rs`) replaces them.
//!
//! Not counted (bounded by other limits): the batch being processed (its input rows, the
//! partitions' overlays of the keys it touched, its change log and output; bounded by
//! `--max-files-per-batch` / the per-batch record and byte limits), each processor instance's
//! WebAssembly linear memory (bounded by the sandbox's memory limit, one instance per worker
//! thread), the compiled processor code, and allocator slack.

use std::fmt;

/// The budget of `statebox run` and `statebox bench count` when none is given: about what
/// the state cache and block cache each held before there was a budget (256 MiB), in one
/// figure.
pub const DEFAULT_STATE_MEMORY_BYTES: usize = 512 << 20;

/// The smallest budget accepted: below it the memtables would be so small that RocksDB
/// flushes (and compacts) after every few thousand writes.
pub const MIN_STATE_MEMORY_BYTES: usize = 32 << 20;

/// Largest memtable: a batch's commit inserts every write into the memtable on one thread,
/// and a smaller memtable (flushed sooner, in the background) keeps those skiplist inserts
/// and the next batch's reads out of a multi-million-entry list (+20% on `bench timers`
/// against 64 MiB).
const MAX_WRITE_BUFFER_BYTES: usize = 16 << 20;

/// Memtables per database: one being written while the previous one is flushed.
const WRITE_BUFFERS: usize = 2;

/// How a budget is split (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateMemory {
    /// The whole budget.
    pub total_bytes: usize,
    /// The state cache's share.
    pub cache_bytes: usize,
    /// RocksDB's block cache, index and filter blocks included.
    pub block_cache_bytes: usize,
    /// One memtable's size.
    pub write_buffer_bytes: usize,
    /// Memtables at most (the one written and those waiting to be flushed).
    pub write_buffers: usize,
}

/// A budget that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// Not a size.
    #[error(
        "`{0}` is not a size: expected a whole number with an optional unit, e.g. 512MiB, \
         2GiB, 300MB or 1073741824 (bytes)"
    )]
    NotASize(String),
    /// Below [`MIN_STATE_MEMORY_BYTES`].
    #[error("{} is below the minimum state memory of {}", Mib(*.0), Mib(MIN_STATE_MEMORY_BYTES))]
    TooSmall(usize),
}

impl StateMemory {
    /// Splits `total_bytes`: up to 1/32 of it (at most 16 MiB) per memtable, two of them,
    /// and what is left half to the state cache and half to the block cache. Both caches
    /// earn their share: the state cache answers hot keys without decoding anything, the
    /// block cache holds the filters and indexes every miss of the state cache goes through.
    pub fn split(total_bytes: usize) -> Result<Self, MemoryError> {
        if total_bytes < MIN_STATE_MEMORY_BYTES {
            return Err(MemoryError::TooSmall(total_bytes));
        }
        let write_buffer_bytes = (total_bytes / 32).min(MAX_WRITE_BUFFER_BYTES);
        let rest = total_bytes - write_buffer_bytes * WRITE_BUFFERS;
        let cache_bytes = rest / 2;
        Ok(Self {
            total_bytes,
            cache_bytes,
            block_cache_bytes: rest - cache_bytes,
            write_buffer_bytes,
            write_buffers: WRITE_BUFFERS,
        })
    }

    /// Parses a size (see [`parse_size`]) and splits it.
    pub fn parse(text: &str) -> Result<Self, MemoryError> {
        Self::split(parse_size(text)?)
    }

    /// Sizes RocksDB's part of the process by this budget: the shared block cache of
    /// writable databases now (a cache in use is resized), the memtables of every database
    /// opened afterwards. A process running one query calls it once, before opening it.
    pub fn configure_rocksdb(&self) {
        crate::rocks::set_memory(*self);
    }
}

impl Default for StateMemory {
    fn default() -> Self {
        Self::split(DEFAULT_STATE_MEMORY_BYTES).expect("the default is above the minimum")
    }
}

impl fmt::Display for StateMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (state cache {}, block cache {}, memtables {} x {})",
            Mib(self.total_bytes),
            Mib(self.cache_bytes),
            Mib(self.block_cache_bytes),
            self.write_buffers,
            Mib(self.write_buffer_bytes)
        )
    }
}

/// Bytes shown in MiB, with a fraction when not whole.
struct Mib(usize);

impl fmt::Display for Mib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1 << 20) {
            write!(f, "{} MiB", self.0 >> 20)
        } else {
            write!(f, "{:.1} MiB", self.0 as f64 / f64::from(1 << 20))
        }
    }
}

/// Parses a byte size: a whole number with an optional unit, binary (`K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB`) or decimal (`KB`, `MB`, `GB`), case-insensitive; no unit (or `B`) is bytes.
pub fn parse_size(text: &str) -> Result<usize, MemoryError> {
    let bad = || MemoryError::NotASize(text.to_owned());
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(bad());
    }
    let number: usize = t[..digits].parse().map_err(|_| bad())?;
    let unit: usize = match t[digits..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return Err(bad()),
    };
    number.checked_mul(unit).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("300MB"), Ok(300_000_000));
        assert_eq!(parse_size(" 64 KiB "), Ok(64 << 10));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        for bad in [
            "",
            "MiB",
            "-1GiB",
            "1.5GiB",
            "12 parsecs",
            "99999999999999999999G",
        ] {
            assert_eq!(
                parse_size(bad),
                Err(MemoryError::NotASize(bad.into())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_split_adds_up_to_the_budget() {
        for total in [
            32 << 20,
            100_000_000,
            256 << 20,
            512 << 20,
            1 << 30,
            64 << 30,
        ] {
            let m = StateMemory::split(total).unwrap();
            assert_eq!(
                m.cache_bytes + m.block_cache_bytes + m.write_buffers * m.write_buffer_bytes,
                total,
                "{m}"
            );
            assert!(m.write_buffer_bytes <= MAX_WRITE_BUFFER_BYTES, "{m}");
            assert!(m.write_buffer_bytes >= 1 << 20, "{m}");
            assert!(m.cache_bytes.abs_diff(m.block_cache_bytes) <= 1, "{m}");
        }
    }

    #[test]
    fn the_default_keeps_the_sizes_there_were_before_a_budget() {
        let m = StateMemory::default();
        assert_eq!(m.total_bytes, 512 << 20);
        assert_eq!((m.write_buffer_bytes, m.write_buffers), (16 << 20, 2));
        assert_eq!(m.cache_bytes, 240 << 20);
        assert_eq!(m.cache_bytes, crate::DEFAULT_STATE_CACHE_BYTES);
        assert_eq!(m.block_cache_bytes, 240 << 20);
        assert_eq!(
            m.to_string(),
            "512 MiB (state cache 240 MiB, block cache 240 MiB, memtables 2 x 16 MiB)"
        );
        let small = StateMemory::split(256 << 20).unwrap();
        assert_eq!(small.write_buffer_bytes, 8 << 20);
        assert_eq!(small.cache_bytes, 120 << 20);
    }

    #[test]
    fn a_budget_below_the_minimum_is_refused_with_both_figures() {
        let e = StateMemory::parse("16MiB").unwrap_err();
        assert_eq!(e, MemoryError::TooSmall(16 << 20));
        assert_eq!(
            e.to_string(),
            "16 MiB is below the minimum state memory of 32 MiB"
        );
        assert_eq!(
            StateMemory::parse("1000000").unwrap_err().to_string(),
            "1.0 MiB is below the minimum state memory of 32 MiB"
        );
        assert!(StateMemory::parse("32MiB").is_ok());
        assert!(
            StateMemory::parse("lots")
                .unwrap_err()
                .to_string()
                .contains("`lots` is not a size")
        );
    }
}
