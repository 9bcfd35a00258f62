//! Reading a checkpoint's committed state, offline and read-only (SPEC §9), like Spark's
//! `statestore` and `state-metadata` sources.
//!
//! The checkpoint is opened with [`Checkpoint::open_read_only`], which takes no lock, so a
//! pipeline may be running on it; the reader sees the state of the latest batch committed
//! when it was opened. Rows are `serde_json::Value` objects handed to a callback one at a
//! time: a variable is never collected in memory (an unflattened list or map holds one
//! grouping key's collection at a time).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use statebox_state::catalog::{Catalog, VarDef, VarKind};
use statebox_state::{Checkpoint, StoreError, Undo, changelog, keys};

use crate::config::meta;
use crate::{BatchReport, CommitRecord, EngineError, QueryConfig, TimeMode};

mod rows;

use rows::{Emitter, Group, Schemas, user_key};

/// A checkpoint opened for reading its committed state: the latest, or that of a retained
/// earlier batch.
#[derive(Debug)]
pub struct StateReader {
    /// The checkpoint directory.
    dir: PathBuf,
    checkpoint: Checkpoint,
    config: QueryConfig,
    catalog: Catalog,
    head: Option<CommitRecord>,
}

impl StateReader {
    /// Opens the checkpoint in `dir` read-only (works while a pipeline runs on it) and loads
    /// its query record, variable catalog and latest commit record.
    pub fn open(dir: &Path) -> Result<StateReader, EngineError> {
        let checkpoint = Checkpoint::open_read_only(dir)?;
        let config: QueryConfig = match checkpoint.get_meta(meta::QUERY)? {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| EngineError::corrupt_record("query record", e))?,
            None => {
                return Err(EngineError::Config(format!(
                    "{} has no query record: it is not a Statebox checkpoint",
                    dir.display()
                )));
            }
        };
        let catalog = match checkpoint.get_meta(meta::CATALOG)? {
            Some(bytes) => {
                Catalog::from_json(&bytes).map_err(|e| EngineError::corrupt_record("catalog", e))?
            }
            None => Catalog::default(),
        };
        let head = match checkpoint.get_meta(meta::HEAD)? {
            Some(bytes) => Some(parse_commit(&bytes)?),
            None => None,
        };
        Ok(StateReader {
            dir: dir.to_owned(),
            checkpoint,
            config,
            catalog,
            head,
        })
    }

    /// The query record.
    pub fn config(&self) -> &QueryConfig {
        &self.config
    }

    /// The checkpoint's state variables.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The latest committed batch, if any batch committed.
    pub fn latest_batch_id(&self) -> Option<u64> {
        self.head.as_ref().map(|h| h.batch_id)
    }

    /// Calls `f` with one row per stored entry of variable `var_name` (SPEC §9):
    ///
    /// - value state: `{key, value, partition_id}`;
    /// - list state: `{key, list_element, partition_id}` per element when `flatten`, else
    ///   `{key, list_value: [...], partition_id}` per grouping key;
    /// - map state: `{key, user_map_key, user_map_value, partition_id}` per entry when
    ///   `flatten`, else `{key, map_value: {...}, partition_id}` per grouping key.
    ///
    /// `key` is an object of the key columns. Values are read through the variable's current
    /// schema (at `at_batch`: the variables and schemas as they were at that batch). A variable with a TTL adds `ttl_expiration_ms` to value rows and flattened
    /// rows; expired values not yet cleaned up are shown. An unknown variable is an error
    /// naming the variables that exist.
    ///
    /// `at_batch` reads the state as committed at that batch instead of the latest (time
    /// travel): the latest state with the batches after it undone through their change
    /// logs' before-images. Any batch in [`Self::retained_batches`] can be read; another is
    /// an error naming that range.
    pub fn read_state(
        &self,
        var_name: &str,
        flatten: bool,
        at_batch: Option<u64>,
        mut f: impl FnMut(Value) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        if let Some(snapshot) = self.snapshot_for(at_batch)? {
            return snapshot.read_state(var_name, flatten, at_batch, f);
        }
        let catalog = match at_batch {
            Some(batch) => self.catalog_at(batch)?,
            None => None,
        };
        let var = var_in(catalog.as_ref().unwrap_or(&self.catalog), var_name)?;
        let schemas = Schemas::new(var)?;
        let ttl = var.ttl_ms.is_some();
        let undo = match at_batch {
            Some(batch) => {
                self.check_readable(batch)?;
                let latest = self.latest_batch_id().unwrap_or(batch);
                self.checkpoint.undo_since(var.id, batch, latest)?
            }
            None => Undo::default(),
        };
        let mut out = Emitter {
            f: &mut f,
            failed: None,
        };
        match var.kind {
            VarKind::Value => self
                .checkpoint
                .scan_values_at(var.id, &undo, |key, value| {
                    Ok(out.emit(self.value_row("value", key, &value, &schemas, ttl)))
                })?,
            VarKind::List if flatten => {
                self.checkpoint
                    .scan_list_at(var.id, &undo, |key, _, value| {
                        Ok(out.emit(self.value_row("list_element", key, &value, &schemas, ttl)))
                    })?
            }
            VarKind::Map if flatten => {
                self.checkpoint
                    .scan_map_at(var.id, &undo, |key, uk, value| {
                        Ok(out.emit(self.entry_row(key, uk, &value, &schemas, ttl)))
                    })?
            }
            VarKind::List => {
                let mut group = Group::default();
                self.checkpoint
                    .scan_list_at(var.id, &undo, |key, _, value| {
                        let item = schemas.read(&value).map(|v| (Value::Null, v));
                        Ok(out.gather(&mut group, key, item, |done| self.list_row(done)))
                    })?;
                if let Some(row) = group.finish(|done| self.list_row(done)) {
                    out.emit(row);
                }
            }
            VarKind::Map => {
                let mut group = Group::default();
                self.checkpoint
                    .scan_map_at(var.id, &undo, |key, uk, value| {
                        let item = user_key(uk).and_then(|k| Ok((k, schemas.read(&value)?)));
                        Ok(out.gather(&mut group, key, item, |done| self.map_row(done)))
                    })?;
                if let Some(row) = group.finish(|done| self.map_row(done)) {
                    out.emit(row);
                }
            }
        }
        out.failed.map_or(Ok(()), Err)
    }

    /// The batches whose state [`Self::read_state`] can read, `(first, last)`: the latest
    /// committed batch and those before it whose later batches' change logs are all retained
    /// (`--min-batches-to-retain`). `None` before the first commit.
    pub fn retained_batches(&self) -> Result<Option<(u64, u64)>, EngineError> {
        let Some(last) = self.latest_batch_id() else {
            return Ok(None);
        };
        let first = match self.changelog_range()? {
            // Batch `first_log - 1` is readable by undoing `first_log..=last`, if it was
            // committed: the first commit record tells.
            Some((first_log, _)) if first_log > self.first_commit()?.unwrap_or(first_log) => {
                first_log - 1
            }
            Some((first_log, _)) => first_log,
            None => last,
        };
        Ok(Some((first, last)))
    }

    /// The retained change logs, `(first, last)`, if they reach the latest batch.
    fn changelog_range(&self) -> Result<Option<(u64, u64)>, EngineError> {
        Ok(
            match (
                self.checkpoint.changelog_first_batch()?,
                self.latest_batch_id(),
            ) {
                (Some(first), Some(last))
                    if first <= last && self.checkpoint.has_changelog(last)? =>
                {
                    Some((first, last))
                }
                _ => None,
            },
        )
    }

    /// The batch of the oldest commit record.
    fn first_commit(&self) -> Result<Option<u64>, EngineError> {
        let mut first = None;
        self.checkpoint
            .for_each_meta(meta::COMMIT_PREFIX, |_, bytes| {
                first = Some(
                    parse_commit(bytes)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?
                        .batch_id,
                );
                Ok(false)
            })?;
        Ok(first)
    }

    /// Errors unless the state of `batch` can be read.
    fn check_readable(&self, batch: u64) -> Result<(), EngineError> {
        match self.retained_batches()? {
            Some((first, last)) if (first..=last).contains(&batch) => Ok(()),
            Some((first, last)) => Err(EngineError::Config(format!(
                "the state of batch {batch} is not available: the checkpoint retains batches \
                 {first} to {last}"
            ))),
            None => Err(EngineError::Config(format!(
                "the state of batch {batch} is not available: the checkpoint has no committed \
                 batch"
            ))),
        }
    }

    /// Calls `f` with one row per change of variable `var_name` in batches `from..=to` (`to`
    /// defaults to the latest committed batch), ascending by batch, then partition (SPEC §9,
    /// change feed): `{batch_id, change_type, key, value, partition_id}`, `change_type`
    /// being `update` or `delete` (`value` null). List rows add the element's `list_index`
    /// (its sequence in the list), map rows its `user_map_key`. Removals by TTL cleanup, by
    /// clears and by dropping the variable show as deletes; a variable dropped and
    /// re-created (`delete-if-exists`) shows the old one's deletes and the new one's writes.
    /// Values are read through the variable's current schema.
    ///
    /// Only the change logs of the last retained batches (`--min-batches-to-retain`) are
    /// kept: a range reaching outside them is an error naming the range available.
    pub fn read_changes(
        &self,
        var_name: &str,
        from: u64,
        to: Option<u64>,
        mut f: impl FnMut(Value) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        let Some((first, last)) = self.changelog_range()? else {
            return Err(EngineError::Config(
                "the checkpoint has no retained change log: no batch was committed with one".into(),
            ));
        };
        let to = to.unwrap_or(last);
        if from > to {
            return Err(EngineError::Config(format!(
                "the change range is empty: --from {from} is after --to {to}"
            )));
        }
        if from < first || to > last {
            return Err(EngineError::Config(format!(
                "the changes of batches {from} to {to} are not available: the checkpoint \
                 retains the change logs of batches {first} to {last}"
            )));
        }
        // Every variable that bore the name: one dropped and re-created is a new variable
        // (a new id), and the feed shows both the old one's deletes and the new one's writes.
        let defs = self.vars_named(var_name)?;
        let mut vars: HashMap<u32, (u8, Schemas<'_>)> = HashMap::new();
        for def in &defs {
            let ns = match def.kind {
                VarKind::Value => keys::VALUE,
                VarKind::List => keys::LIST,
                VarKind::Map => keys::MAP,
            };
            vars.insert(def.id, (ns, Schemas::new(def)?));
        }
        let mut out = Emitter {
            f: &mut f,
            failed: None,
        };
        self.checkpoint
            .scan_changelog(from, to, |batch, partition, log| {
                for change in changelog::decode(log) {
                    let change = change?;
                    // A delete of what did not exist changed nothing.
                    if change.value.is_none() && change.before == Some(None) {
                        continue;
                    }
                    let Some(&ns) = change.key.first() else {
                        continue;
                    };
                    if !matches!(ns, keys::VALUE | keys::LIST | keys::MAP) {
                        continue;
                    }
                    let id = keys::decode_var_key(ns, change.key)?.0;
                    let Some((_, schemas)) = vars.get(&id).filter(|(var_ns, _)| *var_ns == ns)
                    else {
                        continue;
                    };
                    let row = self.change_row(batch, partition, change, schemas);
                    if !out.emit(row) {
                        return Ok(false);
                    }
                }
                Ok(true)
            })?;
        out.failed.map_or(Ok(()), Err)
    }

    /// For reading `at_batch`: the reader of the earliest snapshot at or after it, if one
    /// is older than the latest batch (undoing from it is less work), after checking the
    /// batch is readable at all.
    fn snapshot_for(&self, at_batch: Option<u64>) -> Result<Option<StateReader>, EngineError> {
        let Some(batch) = at_batch else {
            return Ok(None);
        };
        self.check_readable(batch)?;
        let latest = self.latest_batch_id().unwrap_or(batch);
        let dir = snapshots_dir(&self.dir);
        match list_snapshots(&dir)
            .into_iter()
            .find(|&s| s >= batch && s < latest)
        {
            // A snapshot the writer removes meanwhile: undo from the latest state instead.
            Some(s) => Ok(StateReader::open(&dir.join(snapshot_name(s))).ok()),
            None => Ok(None),
        }
    }

    /// Every definition variable `name` had, in the current catalog and in those recorded
    /// by earlier batches, one per variable id; an error naming the current variables if
    /// there is none.
    fn vars_named(&self, name: &str) -> Result<Vec<VarDef>, EngineError> {
        let mut defs: Vec<VarDef> = Vec::new();
        let mut failed = None;
        self.checkpoint
            .for_each_meta(meta::CATALOG_PREFIX, |record, bytes| {
                match Catalog::from_json(bytes) {
                    Ok(catalog) => {
                        // Later records have the longer schema history.
                        if let Some(def) = catalog.get(name) {
                            defs.retain(|d| d.id != def.id);
                            defs.push(def.clone());
                        }
                        Ok(true)
                    }
                    Err(e) => {
                        failed = Some(EngineError::corrupt_record(
                            &format!("catalog record {record}"),
                            e,
                        ));
                        Ok(false)
                    }
                }
            })?;
        if let Some(e) = failed {
            return Err(e);
        }
        // The current definition wins: it has the whole schema history.
        match self.catalog.get(name) {
            Some(current) => {
                defs.retain(|d| d.id != current.id);
                defs.push(current.clone());
            }
            None if defs.is_empty() => {
                self.var(name)?;
            }
            None => {}
        }
        Ok(defs)
    }

    /// Calls `f` with one row per registered timer at the latest batch; see
    /// [`Self::read_timers_at`].
    pub fn read_timers(
        &self,
        f: impl FnMut(Value) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        self.read_timers_at(None, f)
    }

    /// Calls `f` with one row per registered timer: `{key, expiration_timestamp_ms,
    /// partition_id}`, grouped by key and in time order within a key. Refused in time mode
    /// `none`, which has no timers. `at_batch` reads the timers as registered at that batch
    /// (any in [`Self::retained_batches`]) instead of the latest.
    pub fn read_timers_at(
        &self,
        at_batch: Option<u64>,
        mut f: impl FnMut(Value) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        if self.config.time_mode == TimeMode::None {
            return Err(EngineError::Config(
                "the query runs in time mode `none`, which has no timers to read".into(),
            ));
        }
        if let Some(snapshot) = self.snapshot_for(at_batch)? {
            return snapshot.read_timers_at(at_batch, f);
        }
        let undo = match at_batch {
            Some(batch) => {
                self.check_readable(batch)?;
                let latest = self.latest_batch_id().unwrap_or(batch);
                self.checkpoint.undo_timers_since(batch, latest)?
            }
            None => Undo::default(),
        };
        let mut failed = None;
        self.checkpoint.scan_timers_at(&undo, |key, ts| {
            let row = self.key_fields(key).map(|mut row| {
                row.insert("expiration_timestamp_ms".into(), ts.into());
                self.finish(key, row)
            });
            match row.and_then(&mut f) {
                Ok(()) => Ok(true),
                Err(e) => {
                    failed = Some(e);
                    Ok(false)
                }
            }
        })?;
        failed.map_or(Ok(()), Err)
    }

    /// The state metadata (SPEC §9): operator id and name, partitions, the committed batch
    /// range, time and output modes, key columns, and each variable with its kind, TTL,
    /// current schema (and key schema for maps) and schema history.
    pub fn metadata(&self) -> Result<Value, EngineError> {
        let range = self.retained_batches()?;
        let variables: Vec<Value> = self
            .catalog
            .vars()
            .map(|var| {
                json!({
                    "name": var.name,
                    "id": var.id,
                    "kind": var.kind,
                    "ttl_enabled": var.ttl_ms.is_some(),
                    "ttl_duration_ms": var.ttl_ms,
                    "key_schema": var.key_schema,
                    "value_schema": var.value_schemas.last(),
                    "schema_id": var.value_schemas.len().saturating_sub(1),
                    "value_schema_history": var.value_schemas,
                })
            })
            .collect();
        Ok(json!({
            "operator_id": 0,
            "operator_name": self.config.operator_name,
            "num_partitions": self.config.partitions,
            "min_batch_id": range.map(|r| r.0),
            "max_batch_id": range.map(|r| r.1),
            "time_mode": self.config.time_mode,
            "output_mode": self.config.output_mode,
            "key_columns": self.config.key_columns,
            "snapshots": list_snapshots(&snapshots_dir(&self.dir)),
            "variables": variables,
        }))
    }

    /// The last `last_n` batches' progress, oldest first: each commit record with the
    /// timing kept beside it (for records from before the timing moved out of the commit
    /// record, the timing fields the record itself carries). Holds at most `last_n`
    /// records in memory.
    pub fn progress(&self, last_n: usize) -> Result<Vec<BatchReport>, EngineError> {
        let mut out = VecDeque::with_capacity(last_n.min(1024));
        let mut failed = None;
        self.checkpoint
            .for_each_meta(meta::COMMIT_PREFIX, |_, bytes| match parse_commit(bytes) {
                Ok(record) => {
                    if last_n > 0 {
                        if out.len() == last_n {
                            out.pop_front();
                        }
                        out.push_back((record, bytes.to_vec()));
                    }
                    Ok(true)
                }
                Err(e) => {
                    failed = Some(e);
                    Ok(false)
                }
            })?;
        if let Some(e) = failed {
            return Err(e);
        }
        out.into_iter()
            .map(|(commit, bytes)| {
                let timing = match self.checkpoint.get_meta(&meta::timing(commit.batch_id))? {
                    Some(timing) => timing,
                    None => bytes,
                };
                let timing = serde_json::from_slice(&timing)
                    .map_err(|e| EngineError::corrupt_record("batch timing", e))?;
                Ok(BatchReport { commit, timing })
            })
            .collect()
    }

    /// Variable `name` as it was defined at `at_batch` (its kind and schemas then, which
    /// [`Self::read_state`] reads through), or as it is now; an error naming the variables
    /// that exist if it did not exist then.
    pub fn var_at(&self, name: &str, at_batch: Option<u64>) -> Result<VarDef, EngineError> {
        let then = match at_batch {
            Some(batch) => self.catalog_at(batch)?,
            None => None,
        };
        var_in(then.as_ref().unwrap_or(&self.catalog), name).cloned()
    }

    fn var(&self, name: &str) -> Result<&VarDef, EngineError> {
        var_in(&self.catalog, name)
    }

    /// The catalog as committed at `batch`, if a later batch changed it (`None`: the
    /// current one applies). Each batch that changes the catalog records it under its id.
    fn catalog_at(&self, batch: u64) -> Result<Option<Catalog>, EngineError> {
        let mut at: Option<(u64, Vec<u8>)> = None;
        let mut changed_later = false;
        self.checkpoint
            .for_each_meta(meta::CATALOG_PREFIX, |name, bytes| {
                let id = name
                    .strip_prefix(meta::CATALOG_PREFIX)
                    .and_then(|id| id.parse::<u64>().ok())
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!("malformed catalog record {name}"))
                    })?;
                if id <= batch {
                    at = Some((id, bytes.to_vec()));
                    Ok(true)
                } else {
                    changed_later = true;
                    Ok(false)
                }
            })?;
        match at {
            Some((id, bytes)) if changed_later => Catalog::from_json(&bytes)
                .map(Some)
                .map_err(|e| EngineError::corrupt_record(&format!("catalog of batch {id}"), e)),
            _ => Ok(None),
        }
    }
}

/// Opens the checkpoint in `dir` read-only and streams variable `var_name`'s rows (as of
/// batch `at_batch`, default the latest) to `f`; see [`StateReader::read_state`].
pub fn read_state(
    dir: &Path,
    var_name: &str,
    flatten: bool,
    at_batch: Option<u64>,
    f: impl FnMut(Value) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    StateReader::open(dir)?.read_state(var_name, flatten, at_batch, f)
}

/// Opens the checkpoint in `dir` read-only and streams variable `var_name`'s changes in
/// batches `from..=to` to `f`; see [`StateReader::read_changes`].
pub fn read_changes(
    dir: &Path,
    var_name: &str,
    from: u64,
    to: Option<u64>,
    f: impl FnMut(Value) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    StateReader::open(dir)?.read_changes(var_name, from, to, f)
}

/// Opens the checkpoint in `dir` read-only and streams its registered timers to `f`; see
/// [`StateReader::read_timers`].
pub fn read_timers(
    dir: &Path,
    f: impl FnMut(Value) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    StateReader::open(dir)?.read_timers(f)
}

/// The state metadata of the checkpoint in `dir`; see [`StateReader::metadata`].
pub fn read_metadata(dir: &Path) -> Result<Value, EngineError> {
    StateReader::open(dir)?.metadata()
}

/// The last `last_n` commit records of the checkpoint in `dir`, oldest first; see
/// [`StateReader::progress`].
pub fn read_progress(dir: &Path, last_n: usize) -> Result<Vec<BatchReport>, EngineError> {
    StateReader::open(dir)?.progress(last_n)
}

/// Where the periodic state snapshots of the checkpoint in `checkpoint` live.
pub fn snapshots_dir(checkpoint: &Path) -> PathBuf {
    checkpoint.join("snapshots")
}

/// The directory name of the snapshot taken after committing `batch`.
pub fn snapshot_name(batch: u64) -> String {
    format!("{batch:020}")
}

/// The batches of the complete snapshots in `dir`, ascending (none if it does not exist).
pub fn list_snapshots(dir: &Path) -> Vec<u64> {
    let mut batches: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    batches.sort_unstable();
    batches
}

/// Variable `name` of `catalog`, or an error naming the variables that exist.
fn var_in<'c>(catalog: &'c Catalog, name: &str) -> Result<&'c VarDef, EngineError> {
    catalog.get(name).ok_or_else(|| {
        let names: Vec<String> = catalog.vars().map(|v| format!("`{}`", v.name)).collect();
        let known = if names.is_empty() {
            "the checkpoint has no state variables".to_owned()
        } else {
            format!("state variables: {}", names.join(", "))
        };
        EngineError::Config(format!("unknown state variable `{name}` ({known})"))
    })
}

fn parse_commit(bytes: &[u8]) -> Result<CommitRecord, EngineError> {
    serde_json::from_slice(bytes).map_err(|e| EngineError::corrupt_record("commit record", e))
}

#[cfg(test)]
mod tests;
