//! The checkpoint: the committed state plus the one atomic way to change it.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::engine::{KvEngine, WriteBatch, WriteOp};
use crate::mem::MemEngine;
use crate::rocks::RocksEngine;
use crate::txn::PartitionTxn;
use crate::{Partition, Result, StoreError, StoredValue, VarId, keys};

/// A per-variable scan's callback: `(grouping key, key suffix, value)`.
type VarScanFn<'a> = dyn FnMut(&[u8], &[u8], StoredValue) -> Result<bool> + 'a;

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
    /// Partition overlays, applied after `drop_vars`, in order. Transactions not yet
    /// [sealed](PartitionTxn::seal) are sealed by the commit, on the committing thread.
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
        mut f: impl FnMut(&[u8], StoredValue) -> Result<bool>,
    ) -> Result<()> {
        self.scan_var(keys::VALUE, var, &mut |key, suffix, value| {
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
        mut f: impl FnMut(&[u8], u64, StoredValue) -> Result<bool>,
    ) -> Result<()> {
        self.scan_var(keys::LIST, var, &mut |key, suffix, value| {
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
        mut f: impl FnMut(&[u8], &[u8], StoredValue) -> Result<bool>,
    ) -> Result<()> {
        self.scan_var(keys::MAP, var, &mut |key, user_key, value| {
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

    /// Scans one variable's entries in namespace `ns`: `(grouping key, suffix, value)`.
    fn scan_var(&self, ns: u8, var: VarId, f: &mut VarScanFn<'_>) -> Result<()> {
        let (start, end) = keys::var_range(ns, var);
        self.engine.scan(&start, &end, &mut |k, v| {
            let (_, key, suffix) = keys::decode_var_key(ns, k)?;
            f(key, suffix, StoredValue::decode(v)?)
        })
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
        batch.append(merge_runs(
            txns.into_iter().map(PartitionTxn::into_ops).collect(),
        ));
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

/// Merges the sealed transactions' operation lists (each ascending by key) into one
/// ascending list, ties in transaction order, when that applies the same as running them one
/// after the other; else concatenates them.
///
/// RocksDB inserts a batch into its memtable key by key, and each insert starts its search
/// where the previous one ended: one ascending run costs far fewer key comparisons than one
/// run per partition, each spanning the whole key space.
///
/// Merging moves a transaction's range delete ahead of any later-sorting key of an earlier
/// transaction, so it is only done when no range delete covers a key an earlier transaction
/// writes (partitions own disjoint grouping keys, so in practice none does).
fn merge_runs(mut runs: Vec<Vec<WriteOp>>) -> Vec<WriteOp> {
    runs.retain(|run| !run.is_empty());
    if runs.len() <= 1 {
        return runs.pop().unwrap_or_default();
    }
    let total = runs.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(total);
    if !merge_keeps_meaning(&runs) {
        runs.into_iter().for_each(|mut run| out.append(&mut run));
        return out;
    }
    let mut next = vec![0; runs.len()];
    for _ in 0..total {
        let mut best: Option<(usize, &[u8])> = None;
        for (i, run) in runs.iter().enumerate() {
            if let Some(op) = run.get(next[i])
                && best.is_none_or(|(_, key)| op_key(op) < key)
            {
                best = Some((i, op_key(op)));
            }
        }
        let Some((i, _)) = best else { break };
        out.push(std::mem::replace(
            &mut runs[i][next[i]],
            WriteOp::Delete(Vec::new()),
        ));
        next[i] += 1;
    }
    out
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

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str) -> WriteOp {
        WriteOp::Put(k.into(), Vec::new())
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
            merge_runs(runs),
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
        assert_eq!(merge_runs(vec![vec![put("x")]]), [put("x")]);
        assert!(merge_runs(Vec::new()).is_empty());
    }

    #[test]
    fn a_range_delete_over_an_earlier_runs_key_keeps_run_order() {
        let runs = vec![vec![put("b"), put("d")], vec![put("a"), range("c", "e")]];
        assert_eq!(
            merge_runs(runs),
            [put("b"), put("d"), put("a"), range("c", "e")]
        );
        // A range delete over a later run's key is merged: the later put wins either way.
        let runs = vec![vec![range("c", "e")], vec![put("d")], vec![put("a")]];
        assert_eq!(merge_runs(runs), [put("a"), range("c", "e"), put("d")]);
    }
}
