//! The checkpoint: the committed state plus the one atomic way to change it.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::engine::{KvEngine, WriteBatch};
use crate::mem::MemEngine;
use crate::rocks::RocksEngine;
use crate::txn::PartitionTxn;
use crate::{Partition, Result, StoreError, VarId, keys};

/// Name of the database subdirectory inside a checkpoint directory; the engine keeps its own
/// files next to it.
const DB_DIR: &str = "state";

/// A durable checkpoint (one RocksDB database in a directory), or an in-memory one for tests.
///
/// Cheap to clone: clones share the database.
#[derive(Clone)]
pub struct Checkpoint {
    engine: Arc<dyn KvEngine>,
}

/// Everything one micro-batch changes, applied atomically by [`Checkpoint::commit`].
#[derive(Debug, Default)]
pub struct Commit {
    /// Variables whose data (value, list and map entries, for every grouping key) is removed.
    /// Dropping a variable that has no data is a no-op.
    pub drop_vars: Vec<VarId>,
    /// Partition overlays, applied after `drop_vars`, in order.
    pub txns: Vec<PartitionTxn>,
    /// Metadata writes, applied last; `None` deletes. They carry the batch's commit record.
    pub meta: Vec<(String, Option<Vec<u8>>)>,
}

impl Checkpoint {
    /// Opens the checkpoint in `dir`, creating the directory and database if missing.
    ///
    /// The database lives in `dir/state/`. A checkpoint already open (in this or another
    /// process) gives [`StoreError::Locked`].
    pub fn open(dir: &Path) -> Result<Self> {
        let db_dir = dir.join(DB_DIR);
        std::fs::create_dir_all(&db_dir).map_err(|e| {
            StoreError::Storage(format!(
                "creating checkpoint directory {}: {e}",
                db_dir.display()
            ))
        })?;
        let engine = RocksEngine::open(&db_dir)?;
        tracing::debug!(dir = %dir.display(), "opened checkpoint");
        Ok(Self::with_engine(Arc::new(engine)))
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
        Self { engine }
    }

    /// A small named metadata blob (query config, variable catalog, batch plans, commit log).
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

    /// Durably (fsynced) writes one metadata blob outside any batch, e.g. the batch plan
    /// written before a batch runs.
    pub fn put_meta_sync(&self, name: &str, value: &[u8]) -> Result<()> {
        let mut batch = WriteBatch::new();
        batch.put(keys::meta_key(name), value.to_vec());
        self.engine.write(batch)
    }

    /// A new transaction for one partition of the batch being run: an in-memory overlay
    /// over the committed state with read-your-writes.
    pub fn txn(&self, partition: Partition) -> PartitionTxn {
        PartitionTxn::new(Arc::clone(&self.engine), partition)
    }

    /// Atomically (one fsynced write batch) applies the variable drops, every partition's
    /// overlay and the metadata writes. After a crash either all of it is visible or none.
    ///
    /// The transactions must come from this checkpoint (their reads were of its state).
    pub fn commit(&self, commit: Commit) -> Result<()> {
        let Commit {
            drop_vars,
            txns,
            meta,
        } = commit;
        let mut batch = WriteBatch::new();
        batch.reserve(
            drop_vars.len() * keys::VAR_NAMESPACES.len()
                + txns.iter().map(PartitionTxn::pending_ops).sum::<usize>()
                + meta.len(),
        );
        for var in &drop_vars {
            for ns in keys::VAR_NAMESPACES {
                let (start, end) = keys::var_range(ns, *var);
                batch.delete_range(start, end);
            }
        }
        let txn_count = txns.len();
        for txn in txns {
            txn.write_to(&mut batch);
        }
        for (name, value) in meta {
            let key = keys::meta_key(&name);
            match value {
                Some(v) => batch.put(key, v),
                None => batch.delete(key),
            }
        }
        let ops = batch.len();
        self.engine.write(batch)?;
        tracing::debug!(
            dropped_vars = drop_vars.len(),
            txns = txn_count,
            ops,
            "committed batch"
        );
        Ok(())
    }
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint").finish_non_exhaustive()
    }
}
