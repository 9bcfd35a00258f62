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

use serde_json::{Map, Value, json};
use statebox_schema::Schema;
use statebox_state::catalog::{Catalog, VarDef, VarKind};
use statebox_state::{Checkpoint, StoreError, StoredValue, Undo, changelog, keys};

use crate::config::meta;
use crate::input::partition_of;
use crate::{CommitRecord, EngineError, QueryConfig, TimeMode};

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

    /// The last `last_n` commit records (per-batch progress), oldest first. Holds at most
    /// `last_n` records in memory.
    pub fn progress(&self, last_n: usize) -> Result<Vec<CommitRecord>, EngineError> {
        let mut out = VecDeque::with_capacity(last_n.min(1024));
        let mut failed = None;
        self.checkpoint
            .for_each_meta(meta::COMMIT_PREFIX, |_, bytes| match parse_commit(bytes) {
                Ok(record) => {
                    if last_n > 0 {
                        if out.len() == last_n {
                            out.pop_front();
                        }
                        out.push_back(record);
                    }
                    Ok(true)
                }
                Err(e) => {
                    failed = Some(e);
                    Ok(false)
                }
            })?;
        failed.map_or(Ok(out.into()), Err)
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

    /// `{"key": {column: value, ...}}` for a stored grouping key.
    fn key_fields(&self, key: &[u8]) -> Result<Map<String, Value>, EngineError> {
        let corrupt = || {
            EngineError::Store(StoreError::Corrupt(format!(
                "stored grouping key {} is not a JSON array of {} key column(s)",
                String::from_utf8_lossy(key),
                self.config.key_columns.len()
            )))
        };
        let Ok(Value::Array(values)) = serde_json::from_slice::<Value>(key) else {
            return Err(corrupt());
        };
        if values.len() != self.config.key_columns.len() {
            return Err(corrupt());
        }
        let columns: Map<String, Value> = self
            .config
            .key_columns
            .iter()
            .cloned()
            .zip(values)
            .collect();
        let mut row = Map::new();
        row.insert("key".into(), Value::Object(columns));
        Ok(row)
    }

    /// Adds `partition_id` and makes the row a value.
    fn finish(&self, key: &[u8], mut row: Map<String, Value>) -> Value {
        let partition = partition_of(key, usize::from(self.config.partitions.max(1)));
        row.insert("partition_id".into(), partition.into());
        Value::Object(row)
    }

    /// A row of one stored value under `column`: `value` for value state, `list_element`
    /// for a flattened list.
    fn value_row(
        &self,
        column: &str,
        key: &[u8],
        value: &StoredValue,
        schemas: &Schemas,
        ttl: bool,
    ) -> Result<Value, EngineError> {
        let mut row = self.key_fields(key)?;
        row.insert(column.into(), schemas.read(value)?);
        Ok(self.with_ttl(key, row, value, ttl))
    }

    fn entry_row(
        &self,
        key: &[u8],
        uk: &[u8],
        value: &StoredValue,
        schemas: &Schemas,
        ttl: bool,
    ) -> Result<Value, EngineError> {
        let mut row = self.key_fields(key)?;
        row.insert("user_map_key".into(), user_key(uk)?);
        row.insert("user_map_value".into(), schemas.read(value)?);
        Ok(self.with_ttl(key, row, value, ttl))
    }

    fn with_ttl(
        &self,
        key: &[u8],
        mut row: Map<String, Value>,
        value: &StoredValue,
        ttl: bool,
    ) -> Value {
        if ttl {
            row.insert("ttl_expiration_ms".into(), value.expires_at_ms.into());
        }
        self.finish(key, row)
    }

    /// The row of one logged change of a value, list element or map entry.
    fn change_row(
        &self,
        batch: u64,
        partition: u16,
        change: changelog::Change<'_>,
        schemas: &Schemas,
    ) -> Result<Value, EngineError> {
        let ns = change.key.first().copied().unwrap_or_default();
        let (_, key, suffix) = keys::decode_var_key(ns, change.key)?;
        let mut row = Map::new();
        row.insert("batch_id".into(), batch.into());
        let change_type = if change.value.is_some() {
            "update"
        } else {
            "delete"
        };
        row.insert("change_type".into(), change_type.into());
        row.append(&mut self.key_fields(key)?);
        match ns {
            keys::LIST => {
                let seq = keys::decode_list_seq(change.key)?;
                row.insert("list_index".into(), seq.into());
            }
            keys::MAP => {
                row.insert("user_map_key".into(), user_key(suffix)?);
            }
            _ => {}
        }
        let value = match change.value {
            Some(bytes) => schemas.read(&StoredValue::decode(bytes)?)?,
            None => Value::Null,
        };
        row.insert("value".into(), value);
        row.insert("partition_id".into(), partition.into());
        Ok(Value::Object(row))
    }

    fn list_row(&self, (key, items): (Vec<u8>, Vec<(Value, Value)>)) -> Result<Value, EngineError> {
        let mut row = self.key_fields(&key)?;
        let list = items.into_iter().map(|(_, v)| v).collect();
        row.insert("list_value".into(), Value::Array(list));
        Ok(self.finish(&key, row))
    }

    fn map_row(&self, (key, items): (Vec<u8>, Vec<(Value, Value)>)) -> Result<Value, EngineError> {
        let mut row = self.key_fields(&key)?;
        let map = items
            .into_iter()
            .map(|(k, v)| {
                let name = match k {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                (name, v)
            })
            .collect();
        row.insert("map_value".into(), Value::Object(map));
        Ok(self.finish(&key, row))
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
pub fn read_progress(dir: &Path, last_n: usize) -> Result<Vec<CommitRecord>, EngineError> {
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

/// Hands rows to the caller's callback; remembers the first error, after which it asks the
/// scan to stop and drops further rows.
struct Emitter<'f, F> {
    f: &'f mut F,
    failed: Option<EngineError>,
}

impl<F: FnMut(Value) -> Result<(), EngineError>> Emitter<'_, F> {
    /// Passes a row on; returns whether to go on scanning.
    fn emit(&mut self, row: Result<Value, EngineError>) -> bool {
        if self.failed.is_some() {
            return false;
        }
        match row.and_then(&mut *self.f) {
            Ok(()) => true,
            Err(e) => {
                self.failed = Some(e);
                false
            }
        }
    }

    /// Adds an item of grouping key `key` to `group`, first emitting the previous key's
    /// row if `key` starts a new one; returns whether to go on scanning.
    fn gather(
        &mut self,
        group: &mut Group,
        key: &[u8],
        item: Result<(Value, Value), EngineError>,
        row: impl FnOnce(Done) -> Result<Value, EngineError>,
    ) -> bool {
        if let Some(done) = group.next(key, row)
            && !self.emit(done)
        {
            return false;
        }
        match item {
            Ok(item) => {
                group.items.push(item);
                true
            }
            Err(e) => self.emit(Err(e)),
        }
    }
}

/// One grouping key's collection, gathered for an unflattened row.
#[derive(Default)]
struct Group {
    key: Option<Vec<u8>>,
    items: Vec<(Value, Value)>,
}

type Done = (Vec<u8>, Vec<(Value, Value)>);

impl Group {
    /// Moves on to `key`; if that ends the previous key's collection, returns its row.
    fn next(
        &mut self,
        key: &[u8],
        row: impl FnOnce(Done) -> Result<Value, EngineError>,
    ) -> Option<Result<Value, EngineError>> {
        if self.key.as_deref() == Some(key) {
            return None;
        }
        let done = self.finish(row);
        self.key = Some(key.to_vec());
        done
    }

    /// The row of the collection gathered so far, if any.
    fn finish(
        &mut self,
        row: impl FnOnce(Done) -> Result<Value, EngineError>,
    ) -> Option<Result<Value, EngineError>> {
        let key = self.key.take()?;
        Some(row((key, std::mem::take(&mut self.items))))
    }
}

/// A variable's value schemas, parsed on first use, for reading old values through the
/// current schema.
struct Schemas<'a> {
    var: &'a VarDef,
    current: Option<Schema>,
    parsed: std::cell::RefCell<HashMap<u32, Schema>>,
}

impl<'a> Schemas<'a> {
    fn new(var: &'a VarDef) -> Result<Schemas<'a>, EngineError> {
        let current = match var.value_schemas.len() {
            0 | 1 => None,
            n => Some(parse_schema(var, n - 1)?),
        };
        Ok(Schemas {
            var,
            current,
            parsed: Default::default(),
        })
    }

    /// The stored value as JSON, evolved to the current schema if written with an older one.
    fn read(&self, value: &StoredValue) -> Result<Value, EngineError> {
        let corrupt = |msg: String| {
            EngineError::Store(StoreError::Corrupt(format!(
                "state variable `{}`: {msg}",
                self.var.name
            )))
        };
        let text = std::str::from_utf8(&value.payload)
            .map_err(|_| corrupt("a stored value is not UTF-8".into()))?;
        let current_id = self.var.value_schemas.len().saturating_sub(1);
        let id = value.schema_id as usize;
        let text = match &self.current {
            Some(current) if id != current_id => {
                if id >= self.var.value_schemas.len() {
                    return Err(corrupt(format!("unknown schema id {id}")));
                }
                let mut parsed = self.parsed.borrow_mut();
                let old = match parsed.entry(value.schema_id) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(parse_schema(self.var, id)?)
                    }
                };
                std::borrow::Cow::Owned(
                    statebox_schema::evolve_json(old, current, text).map_err(|e| {
                        corrupt(format!("a value of schema {id} does not evolve: {e}"))
                    })?,
                )
            }
            _ => std::borrow::Cow::Borrowed(text),
        };
        serde_json::from_str(&text).map_err(|e| corrupt(format!("a stored value is not JSON: {e}")))
    }
}

fn parse_schema(var: &VarDef, id: usize) -> Result<Schema, EngineError> {
    Schema::parse_ddl(&var.value_schemas[id]).map_err(|e| {
        EngineError::Store(StoreError::Corrupt(format!(
            "state variable `{}`: schema {id} does not parse: {e}",
            var.name
        )))
    })
}

/// A map's stored user key (canonical JSON) as a value.
fn user_key(uk: &[u8]) -> Result<Value, EngineError> {
    serde_json::from_slice(uk).map_err(|e| {
        EngineError::Store(StoreError::Corrupt(format!(
            "a stored map user key is not JSON: {e}"
        )))
    })
}

fn parse_commit(bytes: &[u8]) -> Result<CommitRecord, EngineError> {
    serde_json::from_slice(bytes).map_err(|e| EngineError::corrupt_record("commit record", e))
}

#[cfg(test)]
mod tests {
    use statebox_state::Commit;

    use super::*;
    use crate::OutputMode;

    fn stored(schema_id: u32, expires_at_ms: Option<i64>, payload: &str) -> StoredValue {
        StoredValue {
            schema_id,
            expires_at_ms,
            payload: payload.as_bytes().to_vec(),
        }
    }

    fn commit_record(batch_id: u64) -> CommitRecord {
        CommitRecord {
            batch_id,
            timestamp_ms: 1_000 + batch_id as i64,
            watermark_ms: -1,
            output_bytes: 0,
            input_rows: batch_id,
            output_rows: 0,
            keys: 0,
            duration_ms: 0,
            read_ms: 0,
            process_ms: 0,
            commit_ms: 0,
            late_rows: 0,
            timers_fired: 0,
            ttl_removed: 0,
            timers_ms: 0,
            ttl_ms: 0,
            rows_per_s: 0.0,
            variables: crate::VariableCounts::default(),
            state_bytes_on_disk: 0,
            state_rows_total: 0,
            state_rows_updated: 0,
            state_rows_removed: 0,
            timers_total: 0,
            timers_registered: 0,
            timers_deleted: 0,
            next_watermark_ms: -1,
            sink_delivery: None,
        }
    }

    /// A checkpoint written through the state store the way the engine writes one: keys
    /// `(user, n)`, an evolved value variable, a list, a TTL'd map and timers.
    fn checkpoint(time_mode: TimeMode) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let config = QueryConfig {
            version: 1,
            key_columns: vec!["user".into(), "n".into()],
            partitions: 3,
            output_mode: OutputMode::Update,
            time_mode,
            operator_name: "test-op".into(),
            event_time_column: None,
            watermark_delay_ms: 0,
            output_schema: None,
            query_id: None,
        };
        let catalog = json!({
            "vars": {
                "profile": {"id": 0, "name": "profile", "kind": "value", "key_schema": null,
                    "value_schemas": ["name STRING", "name STRING, visits BIGINT"], "ttl_ms": null},
                "events": {"id": 1, "name": "events", "kind": "list", "key_schema": null,
                    "value_schemas": ["BIGINT"], "ttl_ms": null},
                "seen": {"id": 2, "name": "seen", "kind": "map", "key_schema": "STRING",
                    "value_schemas": ["BIGINT"], "ttl_ms": 500},
            },
            "next_id": 3,
        });
        let k1 = br#"["u1",7]"#;
        let k2 = br#"["u2",1]"#;
        let mut txn = cp.txn(0);
        txn.value_put(0, k1, stored(0, None, r#"{"name":"old"}"#))
            .unwrap();
        txn.value_put(0, k2, stored(1, None, r#"{"name":"new","visits":3}"#))
            .unwrap();
        txn.list_append(1, k1, vec![stored(0, None, "1"), stored(0, None, "2")])
            .unwrap();
        txn.list_append(1, k2, vec![stored(0, None, "9")]).unwrap();
        txn.map_put(2, k1, br#""b""#, stored(0, Some(1_500), "20"))
            .unwrap();
        txn.map_put(2, k1, br#""a""#, stored(0, Some(900), "10"))
            .unwrap();
        txn.timer_register(k1, 5_000).unwrap();
        txn.timer_register(k1, 4_000).unwrap();
        txn.timer_register(k2, 7_000).unwrap();
        let mut meta = vec![
            (
                "query".to_owned(),
                Some(serde_json::to_vec(&config).unwrap()),
            ),
            (
                "catalog".to_owned(),
                Some(serde_json::to_vec(&catalog).unwrap()),
            ),
            (
                "head".to_owned(),
                Some(serde_json::to_vec(&commit_record(2)).unwrap()),
            ),
        ];
        for b in 0..3 {
            meta.push((
                crate::config::meta::commit(b),
                Some(serde_json::to_vec(&commit_record(b)).unwrap()),
            ));
        }
        cp.commit(Commit {
            txns: vec![txn],
            meta,
            ..Commit::default()
        })
        .unwrap();
        dir
    }

    fn rows(dir: &Path, var: &str, flatten: bool) -> Vec<Value> {
        let mut out = Vec::new();
        read_state(dir, var, flatten, None, |row| {
            out.push(row);
            Ok(())
        })
        .unwrap();
        out
    }

    fn part(key: &str) -> usize {
        partition_of(key.as_bytes(), 3)
    }

    #[test]
    fn value_rows_are_read_through_the_current_schema() {
        let dir = checkpoint(TimeMode::None);
        let p1 = part(r#"["u1",7]"#);
        let p2 = part(r#"["u2",1]"#);
        assert_eq!(
            rows(dir.path(), "profile", true),
            [
                json!({"key": {"user": "u1", "n": 7}, "value": {"name": "old", "visits": null}, "partition_id": p1}),
                json!({"key": {"user": "u2", "n": 1}, "value": {"name": "new", "visits": 3}, "partition_id": p2}),
            ]
        );
    }

    #[test]
    fn lists_flatten_to_elements_or_group_by_key() {
        let dir = checkpoint(TimeMode::None);
        let p1 = part(r#"["u1",7]"#);
        let p2 = part(r#"["u2",1]"#);
        assert_eq!(
            rows(dir.path(), "events", true),
            [
                json!({"key": {"user": "u1", "n": 7}, "list_element": 1, "partition_id": p1}),
                json!({"key": {"user": "u1", "n": 7}, "list_element": 2, "partition_id": p1}),
                json!({"key": {"user": "u2", "n": 1}, "list_element": 9, "partition_id": p2}),
            ]
        );
        assert_eq!(
            rows(dir.path(), "events", false),
            [
                json!({"key": {"user": "u1", "n": 7}, "list_value": [1, 2], "partition_id": p1}),
                json!({"key": {"user": "u2", "n": 1}, "list_value": [9], "partition_id": p2}),
            ]
        );
    }

    #[test]
    fn maps_with_ttl_show_expiry_and_group_by_key() {
        let dir = checkpoint(TimeMode::ProcessingTime);
        let p1 = part(r#"["u1",7]"#);
        assert_eq!(
            rows(dir.path(), "seen", true),
            [
                json!({"key": {"user": "u1", "n": 7}, "user_map_key": "a", "user_map_value": 10,
                    "ttl_expiration_ms": 900, "partition_id": p1}),
                json!({"key": {"user": "u1", "n": 7}, "user_map_key": "b", "user_map_value": 20,
                    "ttl_expiration_ms": 1_500, "partition_id": p1}),
            ]
        );
        assert_eq!(
            rows(dir.path(), "seen", false),
            [
                json!({"key": {"user": "u1", "n": 7}, "map_value": {"a": 10, "b": 20}, "partition_id": p1})
            ]
        );
    }

    #[test]
    fn a_callback_error_stops_the_scan() {
        let dir = checkpoint(TimeMode::None);
        let mut calls = 0;
        let err = read_state(dir.path(), "events", false, None, |_| {
            calls += 1;
            Err(EngineError::Io("broken pipe".into()))
        })
        .unwrap_err();
        assert_eq!((calls, err.to_string()), (1, "broken pipe".to_owned()));
    }

    #[test]
    fn unknown_variables_are_refused_with_the_known_ones() {
        let dir = checkpoint(TimeMode::None);
        let err = read_state(dir.path(), "nope", true, None, |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown state variable `nope`"), "{err}");
        assert!(err.contains("`events`, `profile`, `seen`"), "{err}");
    }

    #[test]
    fn timers_are_listed_by_key_and_refused_without_a_time_mode() {
        let dir = checkpoint(TimeMode::ProcessingTime);
        let mut out = Vec::new();
        read_timers(dir.path(), |row| {
            out.push(row);
            Ok(())
        })
        .unwrap();
        let p1 = part(r#"["u1",7]"#);
        let p2 = part(r#"["u2",1]"#);
        assert_eq!(
            out,
            [
                json!({"key": {"user": "u1", "n": 7}, "expiration_timestamp_ms": 4_000, "partition_id": p1}),
                json!({"key": {"user": "u1", "n": 7}, "expiration_timestamp_ms": 5_000, "partition_id": p1}),
                json!({"key": {"user": "u2", "n": 1}, "expiration_timestamp_ms": 7_000, "partition_id": p2}),
            ]
        );
        let dir = checkpoint(TimeMode::None);
        let err = read_timers(dir.path(), |_| Ok(())).unwrap_err().to_string();
        assert!(err.contains("time mode `none`"), "{err}");
    }

    #[test]
    fn metadata_and_progress_describe_the_query() {
        let dir = checkpoint(TimeMode::ProcessingTime);
        let m = read_metadata(dir.path()).unwrap();
        assert_eq!(m["operator_id"], 0);
        assert_eq!(m["operator_name"], "test-op");
        assert_eq!(m["num_partitions"], 3);
        // The batches whose state can be read: without change logs, only the latest.
        assert_eq!(
            (m["min_batch_id"].clone(), m["max_batch_id"].clone()),
            (json!(2), json!(2))
        );
        assert_eq!(m["time_mode"], "processing-time");
        assert_eq!(m["output_mode"], "update");
        assert_eq!(m["key_columns"], json!(["user", "n"]));
        let vars = m["variables"].as_array().unwrap();
        assert_eq!(vars.len(), 3);
        let profile = vars.iter().find(|v| v["name"] == "profile").unwrap();
        assert_eq!(profile["kind"], "value");
        assert_eq!(profile["value_schema"], "name STRING, visits BIGINT");
        assert_eq!(profile["value_schema_history"].as_array().unwrap().len(), 2);
        assert_eq!(profile["ttl_enabled"], false);
        let seen = vars.iter().find(|v| v["name"] == "seen").unwrap();
        assert_eq!(
            (seen["ttl_enabled"].clone(), seen["ttl_duration_ms"].clone()),
            (json!(true), json!(500))
        );
        assert_eq!(seen["key_schema"], "STRING");

        let last: Vec<u64> = read_progress(dir.path(), 2)
            .unwrap()
            .iter()
            .map(|c| c.batch_id)
            .collect();
        assert_eq!(last, [1, 2]);
        assert_eq!(read_progress(dir.path(), 10).unwrap().len(), 3);
        assert!(read_progress(dir.path(), 0).unwrap().is_empty());
    }

    /// Commits batch `batch` of `txns` with its change log into the fixture's checkpoint.
    fn commit_logged(cp: &Checkpoint, batch: u64, txns: Vec<statebox_state::PartitionTxn>) {
        let record = serde_json::to_vec(&commit_record(batch)).unwrap();
        cp.commit(Commit {
            txns,
            meta: vec![
                ("head".to_owned(), Some(record.clone())),
                (crate::config::meta::commit(batch), Some(record)),
            ],
            changelog: Some(statebox_state::ChangelogWrite {
                batch_id: batch,
                retain_from: (batch + 1).saturating_sub(2),
                partition_of: Box::new(|key: &[u8]| part(std::str::from_utf8(key).unwrap()) as u16),
            }),
            ..Commit::default()
        })
        .unwrap();
    }

    fn changes(dir: &Path, var: &str, from: u64, to: Option<u64>) -> Vec<Value> {
        let mut out = Vec::new();
        read_changes(dir, var, from, to, |row| {
            out.push(row);
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn the_change_feed_shows_each_batchs_updates_and_deletes() {
        let dir = checkpoint(TimeMode::ProcessingTime);
        let k1 = br#"["u1",7]"#;
        let p1 = part(r#"["u1",7]"#);
        let err = read_changes(dir.path(), "profile", 0, None, |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no retained change log"), "{err}");

        let cp = Checkpoint::open(dir.path()).unwrap();
        let mut txn = cp.txn(p1 as u16);
        txn.value_put(0, k1, stored(0, None, r#"{"name":"again"}"#))
            .unwrap();
        txn.list_append(1, k1, vec![stored(0, None, "3")]).unwrap();
        txn.map_remove(2, k1, br#""a""#).unwrap();
        commit_logged(&cp, 3, vec![txn]);
        let mut txn = cp.txn(p1 as u16);
        txn.value_delete(0, k1).unwrap();
        txn.map_put(2, k1, br#""c""#, stored(0, Some(2_000), "30"))
            .unwrap();
        commit_logged(&cp, 4, vec![txn]);
        drop(cp);

        let key = json!({"user": "u1", "n": 7});
        assert_eq!(
            changes(dir.path(), "profile", 3, None),
            [
                json!({"batch_id": 3, "change_type": "update", "key": key,
                    "value": {"name": "again", "visits": null}, "partition_id": p1}),
                json!({"batch_id": 4, "change_type": "delete", "key": key, "value": null,
                    "partition_id": p1}),
            ]
        );
        assert_eq!(
            changes(dir.path(), "events", 3, Some(4)),
            [
                json!({"batch_id": 3, "change_type": "update", "key": key, "list_index": 2,
                "value": 3, "partition_id": p1})
            ]
        );
        assert_eq!(
            changes(dir.path(), "seen", 4, Some(4)),
            [
                json!({"batch_id": 4, "change_type": "update", "key": key, "user_map_key": "c",
                "value": 30, "partition_id": p1})
            ]
        );
        assert_eq!(
            changes(dir.path(), "seen", 3, Some(3)),
            [
                json!({"batch_id": 3, "change_type": "delete", "key": key, "user_map_key": "a",
                "value": null, "partition_id": p1})
            ]
        );
        for (from, to) in [(2, None), (3, Some(5))] {
            let err = read_changes(dir.path(), "seen", from, to, |_| Ok(()))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("retains the change logs of batches 3 to 4"),
                "{err}"
            );
        }
        let err = read_changes(dir.path(), "seen", 4, Some(3), |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--from 4 is after --to 3"), "{err}");
        let err = read_changes(dir.path(), "nope", 3, None, |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown state variable `nope`"), "{err}");
    }

    /// Every row of every variable, flattened and not, as of `at_batch`.
    fn all_rows(dir: &Path, at_batch: Option<u64>) -> Vec<Value> {
        let mut out = Vec::new();
        let reader = StateReader::open(dir).unwrap();
        for var in ["profile", "events", "seen"] {
            for flatten in [true, false] {
                reader
                    .read_state(var, flatten, at_batch, |row| {
                        out.push(row);
                        Ok(())
                    })
                    .unwrap();
            }
        }
        out
    }

    #[test]
    fn time_travel_reads_each_retained_batch_as_it_was_read_live() {
        let dir = checkpoint(TimeMode::ProcessingTime);
        let k1 = br#"["u1",7]"#;
        let k2 = br#"["u2",1]"#;
        let k3 = br#"["u3",2]"#;
        let (p1, p2, p3) = (
            part(r#"["u1",7]"#) as u16,
            part(r#"["u2",1]"#) as u16,
            part(r#"["u3",2]"#) as u16,
        );
        // Batches 0 to 2 were committed without change logs: only the latest is readable.
        let live2 = all_rows(dir.path(), None);
        assert_eq!(all_rows(dir.path(), Some(2)), live2);
        let err = read_state(dir.path(), "events", true, Some(1), |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("retains batches 2 to 2"), "{err}");

        let cp = Checkpoint::open(dir.path()).unwrap();
        let commit = |batch: u64, txns| {
            let record = serde_json::to_vec(&commit_record(batch)).unwrap();
            cp.commit(Commit {
                txns,
                meta: vec![
                    ("head".to_owned(), Some(record.clone())),
                    (crate::config::meta::commit(batch), Some(record)),
                ],
                changelog: Some(statebox_state::ChangelogWrite {
                    batch_id: batch,
                    retain_from: 0,
                    partition_of: Box::new(|key: &[u8]| {
                        part(std::str::from_utf8(key).unwrap()) as u16
                    }),
                }),
                ..Commit::default()
            })
            .unwrap();
            all_rows(dir.path(), None)
        };
        let mut live = vec![live2];
        // 3: new values, a new key, appends, a map entry.
        let mut t1 = cp.txn(p1);
        t1.value_put(0, k1, stored(1, None, r#"{"name":"n3","visits":1}"#))
            .unwrap();
        t1.list_append(1, k1, vec![stored(0, None, "3")]).unwrap();
        t1.map_put(2, k1, br#""c""#, stored(0, Some(2_500), "30"))
            .unwrap();
        let mut t3 = cp.txn(p3);
        t3.value_put(0, k3, stored(1, None, r#"{"name":"u3","visits":9}"#))
            .unwrap();
        live.push(commit(3, vec![t1, t3]));
        // 4: delete-if-exists of a present and a missing value, a cleared list, a removed
        // map entry, and TTL cleanup of the map entry expiring at 900.
        let mut t1 = cp.txn(p1);
        t1.value_delete(0, k1).unwrap();
        t1.map_remove(2, k1, br#""b""#).unwrap();
        assert_eq!(t1.ttl_cleanup(1_000).unwrap(), 1);
        let mut t2 = cp.txn(p2);
        t2.value_delete(0, br#"["nobody",0]"#).unwrap();
        t2.list_clear(1, k2).unwrap();
        live.push(commit(4, vec![t1, t2]));
        // 5: a key comes back, a list is replaced, TTL cleanup empties the map.
        let mut t1 = cp.txn(p1);
        t1.value_put(0, k1, stored(1, None, r#"{"name":"back","visits":5}"#))
            .unwrap();
        t1.list_put(1, k1, vec![stored(0, None, "7")]).unwrap();
        assert_eq!(t1.ttl_cleanup(3_000).unwrap(), 1);
        live.push(commit(5, vec![t1]));
        // 6: no change.
        live.push(commit(6, vec![]));
        drop(cp);

        assert_eq!(live.len(), 5);
        for (i, want) in live.iter().enumerate() {
            let batch = i as u64 + 2;
            assert_eq!(&all_rows(dir.path(), Some(batch)), want, "batch {batch}");
        }
        assert_ne!(live[0], live[3]);
        let meta = read_metadata(dir.path()).unwrap();
        assert_eq!(
            (meta["min_batch_id"].clone(), meta["max_batch_id"].clone()),
            (json!(2), json!(6))
        );
        for batch in [1, 7] {
            let err = read_state(dir.path(), "seen", false, Some(batch), |_| Ok(()))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!(
                    "the state of batch {batch} is not available: the checkpoint retains \
                     batches 2 to 6"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn a_directory_that_is_no_checkpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = StateReader::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a Statebox checkpoint"), "{err}");
    }
}
