//! The Statebox state store.
//!
//! Per-key processor state (value, list and map variables), timers and TTL indexes live in
//! one ordered key-value store: RocksDB for real checkpoints, a `BTreeMap` for tests. A
//! micro-batch reads and writes through one [`PartitionTxn`] per partition — an in-memory
//! overlay over the committed state — and [`Checkpoint::commit`] applies every overlay plus
//! the batch's metadata (its commit record) in one fsynced write (on RocksDB, a large one
//! is ingested as table files), so a batch is either wholly visible after a crash or not at
//! all.
//!
//! Code map:
//! - [`keys`]: the byte layout of every stored key; byte order equals logical order.
//! - [`value`](StoredValue): the stored value codec (schema id, TTL expiry, payload).
//! - [`engine`]: the small [`KvEngine`] trait both backends implement.
//! - [`memory`]: one memory budget for a query's state and its split.
//! - `rocks` / `mem`: the RocksDB and in-memory backends; [`cache`]: a bounded cache of
//!   committed point reads in front of either. `ingest`: RocksDB's large writes (a batch's
//!   commit) as table files added in one atomic ingestion instead of a write batch.
//!   `ahead`: a batch's per-key reads, learned from the batch before, read ahead in key
//!   order where the cache does not hold them.
//! - `checkpoint` / `txn`: the public [`Checkpoint`] and [`PartitionTxn`].
//! - [`changelog`]: the per-batch change log codec.
//! - `overlay`: the overlay's building blocks (inline byte keys, per-prefix hash map,
//!   per-collection ordered writes); `marks`: the batch's timers-by-time and TTL index
//!   writes, put in order only when read in order.
//!
//! **Architecture invariant:** nothing reaches the backend except through a [`WriteBatch`]
//! built by [`Checkpoint::commit`] or [`Checkpoint::put_meta_sync`]; a [`PartitionTxn`] only
//! ever reads the backend.

mod ahead;
pub mod cache;
pub mod catalog;
pub mod changelog;
mod checkpoint;
pub mod engine;
mod ingest;
pub mod keys;
mod marks;
mod mem;
pub mod memory;
mod overlay;
mod rocks;
mod txn;
mod value;

#[cfg(test)]
mod conformance;

/// A xorshift generator's next numbers from `seed` (not zero), for the tests' random cases.
#[cfg(test)]
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

pub use cache::SharedCacheBudget;
pub use changelog::ChangeStats;
pub use checkpoint::{
    ChangelogWrite, Checkpoint, Commit, DEFAULT_STATE_CACHE_BYTES, StateCache, Undo,
};
pub use engine::{GetFn, GetManyFn, KvEngine, ScanFn, WriteBatch, WriteOp};
pub use memory::{DEFAULT_STATE_MEMORY_BYTES, MemoryError, StateMemory};
pub use rocks::SharedMemtables;
pub use txn::{DueCursor, PartitionTxn};
pub use value::StoredValue;

/// A state variable id, assigned by the engine and never reused.
pub type VarId = u32;

/// A state partition, fixed when the checkpoint is created.
pub type Partition = u16;

/// Errors of the state layer.
///
/// Internal (storage) faults only: schema and usage errors are raised by the runtime before
/// it calls in here.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The storage backend failed (the RocksDB error text).
    #[error("state store I/O failed: {0}")]
    Storage(String),
    /// Stored bytes do not decode: the checkpoint is damaged or was written by something else.
    #[error("state store is corrupt: {0}")]
    Corrupt(String),
    /// Another process (or another `Checkpoint` in this one) holds the checkpoint open.
    #[error("checkpoint {path} is in use by another process")]
    Locked {
        /// The checkpoint directory.
        path: String,
    },
    /// A grouping key longer than the layout's 32-bit length prefix can describe. A wasm32
    /// guest cannot produce one, so seeing this means a host bug.
    #[error("grouping key of {len} bytes is too large for the state store")]
    KeyTooLarge {
        /// The key's length in bytes.
        len: usize,
    },
}

/// The state layer's result type.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
