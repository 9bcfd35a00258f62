//! The table functions `read_statestore` and `read_state_metadata`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::{Field, Schema as ArrowSchema, SchemaRef};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::datasource::MemTable;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::streaming::PartitionStream;
use serde_json::{Map, Value};
use statebox_engine::{EngineError, StateReader};
use statebox_schema::Schema;
use statebox_state::catalog::{VarDef, VarKind};

use crate::convert::{ConvertError, RowBatcher};
use crate::named_args::{self, shown};
use crate::types::{ColumnType, KeyTypeGuess};

/// The name `read_statestore` is registered under.
pub(crate) const READ_STATESTORE: &str = "read_statestore";
/// The name `read_state_metadata` is registered under.
pub(crate) const READ_STATE_METADATA: &str = "read_state_metadata";

const STATESTORE_USAGE: &str = "read_statestore(['/checkpoint/path', ]stateVarName => 'NAME'\
     [, batchId => N][, flattenCollectionTypes => false]), \
     read_statestore(['/checkpoint/path', ]stateVarName => 'NAME', readChangeFeed => true, \
     changeStartBatchId => N[, changeEndBatchId => M]) or \
     read_statestore(['/checkpoint/path', ]readRegisteredTimers => true)";

/// The checkpoints a session's table functions read: the default one (`statebox sql
/// --checkpoint DIR`), and, where allowed, any other named by a call's first argument
/// (`read_statestore('/checkpoint/path', ...)`, as Databricks' table functions take it), so
/// one query can read and join several checkpoints. Each is opened once per session.
#[derive(Debug)]
pub(crate) struct Checkpoints {
    default: Option<(PathBuf, Arc<StateReader>)>,
    /// Checkpoints opened by path; `None` when path arguments are refused (the server,
    /// whose tenants must read their own pipeline's checkpoint only).
    by_path: Option<Mutex<HashMap<PathBuf, Arc<StateReader>>>>,
}

impl Checkpoints {
    /// Reads `default` only; a path argument is an error.
    pub(crate) fn fixed(dir: &Path, reader: StateReader) -> Checkpoints {
        Checkpoints {
            default: Some((dir.to_owned(), Arc::new(reader))),
            by_path: None,
        }
    }

    /// Reads `default` (if any) and any checkpoint a call names by path.
    pub(crate) fn open_by_path(default: Option<(&Path, StateReader)>) -> Checkpoints {
        Checkpoints {
            default: default.map(|(dir, reader)| (dir.to_owned(), Arc::new(reader))),
            by_path: Some(Mutex::new(HashMap::new())),
        }
    }

    /// The reader for a call: the checkpoint at `path`, or the default one.
    fn reader(
        &self,
        function: &str,
        path: Option<&str>,
    ) -> Result<Arc<StateReader>, DataFusionError> {
        let Some(path) = path else {
            return match &self.default {
                Some((_, reader)) => Ok(reader.clone()),
                None => Err(usage(format!(
                    "{function}: no checkpoint to read: pass its path as the first argument \
                     ({function}('/checkpoint/path', ...)) or run with --checkpoint DIR"
                ))),
            };
        };
        let Some(opened) = &self.by_path else {
            return Err(usage(format!(
                "{function}: this session reads one checkpoint; a checkpoint path argument \
                 ('{path}') is not allowed here"
            )));
        };
        let dir = PathBuf::from(path);
        if let Some((default_dir, reader)) = &self.default
            && default_dir == &dir
        {
            return Ok(reader.clone());
        }
        let mut opened = opened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reader) = opened.get(&dir) {
            return Ok(reader.clone());
        }
        let reader = Arc::new(StateReader::open(&dir).map_err(|e| {
            usage(format!(
                "{function}: cannot read the checkpoint '{path}': {e}"
            ))
        })?);
        opened.insert(dir, reader.clone());
        Ok(reader)
    }
}

/// Splits a call's leading positional string argument (a checkpoint path) from its named
/// arguments (encoded by `named_args::rewrite`).
fn path_argument(exprs: &[Expr]) -> (Option<&str>, &[Expr]) {
    match exprs.first() {
        Some(
            Expr::Literal(ScalarValue::Utf8(Some(s)), _)
            | Expr::Literal(ScalarValue::Utf8View(Some(s)), _)
            | Expr::Literal(ScalarValue::LargeUtf8(Some(s)), _),
        ) if !s.starts_with(named_args::NAME_MARK) => (Some(s.as_str()), &exprs[1..]),
        _ => (None, exprs),
    }
}

/// The options of `read_statestore`, as in Spark's state data source. Names are matched
/// case-insensitively.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct StateStoreOptions {
    /// `stateVarName`: the variable to read.
    pub state_var_name: Option<String>,
    /// `batchId`: read the state as committed at this batch.
    pub batch_id: Option<u64>,
    /// `operatorId`: a Statebox checkpoint has one operator, 0.
    pub operator_id: Option<u64>,
    /// `flattenCollectionTypes` (default true): one row per list element or map entry.
    pub flatten: Option<bool>,
    /// `readChangeFeed`: the changes of batches instead of the state.
    pub read_change_feed: bool,
    /// `changeStartBatchId`: the first batch of the change feed.
    pub change_start: Option<u64>,
    /// `changeEndBatchId`: the last batch of the change feed (default: the latest).
    pub change_end: Option<u64>,
    /// `readRegisteredTimers`: the registered timers instead of a variable.
    pub read_timers: bool,
}

/// Every option name, as Spark spells it.
const OPTION_NAMES: [&str; 8] = [
    "stateVarName",
    "batchId",
    "operatorId",
    "flattenCollectionTypes",
    "readChangeFeed",
    "changeStartBatchId",
    "changeEndBatchId",
    "readRegisteredTimers",
];

impl StateStoreOptions {
    /// Reads the options from `(name, value)` pairs.
    pub(crate) fn parse(args: &[(String, &Expr)]) -> Result<StateStoreOptions, String> {
        let mut options = StateStoreOptions::default();
        let mut seen: Vec<&str> = Vec::new();
        for (name, value) in args {
            let Some(known) = OPTION_NAMES.iter().find(|n| n.eq_ignore_ascii_case(name)) else {
                return Err(format!(
                    "read_statestore: unknown option `{name}` (options: {})",
                    OPTION_NAMES.join(", ")
                ));
            };
            if seen.contains(known) {
                return Err(format!("read_statestore: option `{known}` is given twice"));
            }
            seen.push(known);
            match *known {
                "stateVarName" => options.state_var_name = Some(string(known, value)?),
                "batchId" => options.batch_id = Some(integer(known, value)?),
                "operatorId" => options.operator_id = Some(integer(known, value)?),
                "flattenCollectionTypes" => options.flatten = Some(boolean(known, value)?),
                "readChangeFeed" => options.read_change_feed = boolean(known, value)?,
                "changeStartBatchId" => options.change_start = Some(integer(known, value)?),
                "changeEndBatchId" => options.change_end = Some(integer(known, value)?),
                "readRegisteredTimers" => options.read_timers = boolean(known, value)?,
                _ => unreachable!("every option name has a branch"),
            }
        }
        Ok(options)
    }

    /// What to read, after checking that the options go together (as Spark checks them).
    /// `known_vars` names the checkpoint's variables for the error of a missing
    /// `stateVarName`.
    pub(crate) fn read(&self, known_vars: &str) -> Result<Read, String> {
        if let Some(id) = self.operator_id.filter(|&id| id != 0) {
            return Err(format!(
                "read_statestore: there is no operator {id}: a Statebox checkpoint has one \
                 operator, 0"
            ));
        }
        let needs_change_feed = |option: &str| {
            format!("read_statestore: option `{option}` needs readChangeFeed => true")
        };
        if !self.read_change_feed {
            if self.change_start.is_some() {
                return Err(needs_change_feed("changeStartBatchId"));
            }
            if self.change_end.is_some() {
                return Err(needs_change_feed("changeEndBatchId"));
            }
        }
        if self.read_timers {
            let conflict = if self.state_var_name.is_some() {
                Some("stateVarName")
            } else if self.read_change_feed {
                Some("readChangeFeed")
            } else if self.flatten.is_some() {
                Some("flattenCollectionTypes")
            } else {
                None
            };
            if let Some(other) = conflict {
                return Err(format!(
                    "read_statestore: readRegisteredTimers => true reads the timers of every \
                     key and cannot be combined with `{other}`"
                ));
            }
            return Ok(Read::Timers {
                at_batch: self.batch_id,
            });
        }
        let Some(var) = self.state_var_name.clone() else {
            return Err(format!(
                "read_statestore: option `stateVarName` is missing: name the state variable to \
                 read ({known_vars}), or pass readRegisteredTimers => true"
            ));
        };
        if self.read_change_feed {
            if self.batch_id.is_some() {
                return Err(
                    "read_statestore: readChangeFeed => true reads the batches from \
                     changeStartBatchId to changeEndBatchId and cannot be combined with \
                     `batchId`"
                        .into(),
                );
            }
            if self.flatten == Some(false) {
                return Err(
                    "read_statestore: the change feed has one row per changed value, list \
                     element or map entry and cannot be combined with \
                     flattenCollectionTypes => false"
                        .into(),
                );
            }
            let Some(from) = self.change_start else {
                return Err(
                    "read_statestore: readChangeFeed => true needs changeStartBatchId => N \
                     (the first batch whose changes to read)"
                        .into(),
                );
            };
            return Ok(Read::Changes {
                var,
                from,
                to: self.change_end,
            });
        }
        Ok(Read::State {
            var,
            flatten: self.flatten.unwrap_or(true),
            at_batch: self.batch_id,
        })
    }
}

/// A literal's value as text: strings as they are, numbers and booleans as written.
fn literal_text(value: &Expr) -> Option<String> {
    match value {
        Expr::Literal(ScalarValue::Utf8(Some(s)), _)
        | Expr::Literal(ScalarValue::Utf8View(Some(s)), _)
        | Expr::Literal(ScalarValue::LargeUtf8(Some(s)), _) => Some(s.clone()),
        Expr::Literal(v, _) if !v.is_null() => Some(v.to_string()),
        _ => None,
    }
}

fn string(name: &str, value: &Expr) -> Result<String, String> {
    match value {
        Expr::Literal(ScalarValue::Utf8(Some(s)), _)
        | Expr::Literal(ScalarValue::Utf8View(Some(s)), _)
        | Expr::Literal(ScalarValue::LargeUtf8(Some(s)), _) => Ok(s.clone()),
        other => Err(format!(
            "read_statestore: option `{name}` must be a string literal, found {}",
            shown(other)
        )),
    }
}

/// A non-negative integer option: an integer literal, or a string of digits (Spark's
/// options are strings).
fn integer(name: &str, value: &Expr) -> Result<u64, String> {
    let is_number_or_string = matches!(
        value,
        Expr::Literal(v, _) if v.data_type().is_integer() || v.data_type().is_string()
    );
    literal_text(value)
        .filter(|_| is_number_or_string)
        .and_then(|text| text.trim().parse::<u64>().ok())
        .ok_or_else(|| {
            format!(
                "read_statestore: option `{name}` must be a non-negative integer, found {}",
                shown(value)
            )
        })
}

/// A boolean option: `true`/`false`, or the strings `'true'`/`'false'` in any case.
fn boolean(name: &str, value: &Expr) -> Result<bool, String> {
    match value {
        Expr::Literal(ScalarValue::Boolean(Some(b)), _) => Ok(*b),
        Expr::Literal(v, _) if v.data_type().is_string() => match literal_text(value) {
            Some(t) if t.eq_ignore_ascii_case("true") => Ok(true),
            Some(t) if t.eq_ignore_ascii_case("false") => Ok(false),
            _ => Err(format!(
                "read_statestore: option `{name}` must be true or false, found {}",
                shown(value)
            )),
        },
        other => Err(format!(
            "read_statestore: option `{name}` must be true or false, found {}",
            shown(other)
        )),
    }
}

/// What one `read_statestore` call reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// A variable's state, at the latest or an earlier batch.
    State {
        var: String,
        flatten: bool,
        at_batch: Option<u64>,
    },
    /// A variable's changes in batches `from..=to`.
    Changes {
        var: String,
        from: u64,
        to: Option<u64>,
    },
    /// The registered timers.
    Timers { at_batch: Option<u64> },
}

impl Read {
    /// Streams the rows to `f` (see [`StateReader`]).
    fn run(
        &self,
        reader: &StateReader,
        f: impl FnMut(Value) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        match self {
            Read::State {
                var,
                flatten,
                at_batch,
            } => reader.read_state(var, *flatten, *at_batch, f),
            Read::Changes { var, from, to } => reader.read_changes(var, *from, *to, f),
            Read::Timers { at_batch } => reader.read_timers_at(*at_batch, f),
        }
    }

    /// The output columns, given the key struct's type.
    fn columns(
        &self,
        reader: &StateReader,
        key: ColumnType,
    ) -> Result<Vec<(String, ColumnType)>, String> {
        let column = |name: &str, ty: ColumnType| (name.to_owned(), ty);
        // `flatten` is `None` for the change feed.
        let (var, flatten, at_batch) = match self {
            Read::Timers { .. } => {
                return Ok(vec![
                    column("key", key),
                    column("expiration_timestamp_ms", ColumnType::Long),
                    column("partition_id", ColumnType::Int),
                ]);
            }
            Read::State {
                var,
                flatten,
                at_batch,
            } => (var, Some(*flatten), *at_batch),
            Read::Changes { var, .. } => (var, None, None),
        };
        // The variable as it was at `at_batch`: the schema its values are read through.
        let def = reader.var_at(var, at_batch).map_err(|e| e.to_string())?;
        let def = &def;
        let value = value_type(def)?;
        let mut columns = Vec::with_capacity(6);
        match flatten {
            Some(flatten) => {
                columns.push(column("key", key));
                match (def.kind, flatten) {
                    (VarKind::Value, _) => columns.push(column("value", value)),
                    (VarKind::List, true) => columns.push(column("list_element", value)),
                    (VarKind::List, false) => {
                        columns.push(column("list_value", ColumnType::List(Box::new(value))))
                    }
                    (VarKind::Map, true) => {
                        columns.push(column("user_map_key", user_key_type(def)?));
                        columns.push(column("user_map_value", value));
                    }
                    (VarKind::Map, false) => columns.push(column(
                        "map_value",
                        ColumnType::Map(Box::new(user_key_type(def)?), Box::new(value)),
                    )),
                }
                // The reader adds the expiry to every row but the unflattened collections'.
                let per_row = def.kind == VarKind::Value || flatten;
                if def.ttl_ms.is_some() && per_row {
                    columns.push(column("ttl_expiration_ms", ColumnType::Long));
                }
            }
            None => {
                columns.push(column("batch_id", ColumnType::Long));
                columns.push(column("change_type", ColumnType::String));
                columns.push(column("key", key));
                match def.kind {
                    VarKind::Value => {}
                    VarKind::List => columns.push(column("list_index", ColumnType::Long)),
                    VarKind::Map => columns.push(column("user_map_key", user_key_type(def)?)),
                }
                columns.push(column("value", value));
            }
        }
        columns.push(column("partition_id", ColumnType::Int));
        Ok(columns)
    }

    /// Reconciles the planned columns with those of the rows read, `seen`. The columns come
    /// from the latest catalog, but a read at an earlier batch sees the variable as it was
    /// then: values through that batch's schema (which the value type of every schema
    /// holds, see `value_type`) and a TTL it may have had. A variable that was dropped and
    /// declared again as another kind since has other columns: refused.
    fn check_columns(
        &self,
        columns: &mut Vec<(String, ColumnType)>,
        seen: &[String],
    ) -> Result<(), String> {
        for name in seen {
            if columns.iter().any(|(c, _)| c == name) {
                continue;
            }
            if name == "ttl_expiration_ms" {
                let at = columns.len().saturating_sub(1);
                columns.insert(at, (name.clone(), ColumnType::Long));
                continue;
            }
            let (var, at_batch) = match self {
                Read::State { var, at_batch, .. } => (var.as_str(), *at_batch),
                Read::Changes { var, .. } => (var.as_str(), None),
                Read::Timers { .. } => ("", None),
            };
            let when = at_batch.map_or("then".to_owned(), |b| format!("at batch {b}"));
            return Err(format!(
                "state variable `{var}` was of another kind {when} (its rows have a `{name}` \
                 column): read it at a batch after it was declared again"
            ));
        }
        Ok(())
    }
}

/// The value column type of `var`: its current schema (for a read at an earlier batch, `var`
/// as it was then; see [`StateReader::var_at`]).
fn value_type(var: &VarDef) -> Result<ColumnType, String> {
    let latest = var
        .value_schemas
        .last()
        .ok_or_else(|| format!("state variable `{}` has no value schema", var.name))?;
    parse_type(var, "value", latest)
}

/// The map user key schema of `var` as a column type.
fn user_key_type(var: &VarDef) -> Result<ColumnType, String> {
    let ddl = var
        .key_schema
        .as_deref()
        .ok_or_else(|| format!("map state variable `{}` has no user key schema", var.name))?;
    parse_type(var, "user key", ddl)
}

fn parse_type(var: &VarDef, what: &str, ddl: &str) -> Result<ColumnType, String> {
    let schema = Schema::parse_ddl(ddl).map_err(|e| {
        format!(
            "state variable `{}`: its {what} schema `{ddl}` does not parse: {e}",
            var.name
        )
    })?;
    Ok(ColumnType::from_spark(schema.root()))
}

/// The names of the checkpoint's variables for messages: `` `a`, `b` `` or a sentence that
/// there are none.
fn known_vars(reader: &StateReader) -> String {
    let names: Vec<String> = reader
        .catalog()
        .vars()
        .map(|v| format!("`{}`", v.name))
        .collect();
    if names.is_empty() {
        "the checkpoint has no state variables".to_owned()
    } else {
        format!("state variables: {}", names.join(", "))
    }
}

/// An error of the checkpoint or of a stored row, passed through DataFusion unchanged.
fn external(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// A usage error of a table function call (shown without DataFusion's prefixes).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn usage(message: String) -> DataFusionError {
    external(UsageError(message))
}

/// `read_statestore(...)`: a variable's state, its change feed, or the registered timers.
#[derive(Debug)]
pub(crate) struct ReadStateStore {
    pub(crate) checkpoints: Arc<Checkpoints>,
}

impl TableFunctionImpl for ReadStateStore {
    fn call_with_args(
        &self,
        args: TableFunctionArgs,
    ) -> datafusion::common::Result<Arc<dyn TableProvider>> {
        let (path, rest) = path_argument(args.exprs());
        let pairs = named_args::options(READ_STATESTORE, STATESTORE_USAGE, rest).map_err(usage)?;
        let options = StateStoreOptions::parse(&pairs).map_err(usage)?;
        let reader = self.checkpoints.reader(READ_STATESTORE, path)?;
        let read = options.read(&known_vars(&reader)).map_err(usage)?;

        // The checkpoint does not record the key columns' types: a first pass over the
        // rows infers them (see `KeyTypeGuess`). It also reports an unknown variable or an
        // unavailable batch before anything runs.
        let key_columns = &reader.config().key_columns;
        let mut guesses = vec![KeyTypeGuess::default(); key_columns.len()];
        let mut first_row: Option<Vec<String>> = None;
        read.run(&reader, |row| {
            if let Value::Object(row) = &row {
                if first_row.is_none() {
                    first_row = Some(row.keys().cloned().collect());
                }
                if let Some(Value::Object(key)) = row.get("key") {
                    for (guess, name) in guesses.iter_mut().zip(key_columns) {
                        guess.observe(key.get(name).unwrap_or(&Value::Null));
                    }
                }
            }
            Ok(())
        })
        .map_err(external)?;
        let key = ColumnType::Struct(
            key_columns
                .iter()
                .cloned()
                .zip(guesses.iter().map(|g| g.column_type()))
                .collect(),
        );
        let mut columns = read.columns(&reader, key).map_err(usage)?;
        read.check_columns(&mut columns, first_row.as_deref().unwrap_or_default())
            .map_err(usage)?;
        let schema = schema_of(&columns);
        let partition = StatePartition {
            reader,
            read,
            schema: schema.clone(),
            columns,
        };
        Ok(Arc::new(StreamingTable::try_new(
            schema,
            vec![Arc::new(partition)],
        )?))
    }
}

fn schema_of(columns: &[(String, ColumnType)]) -> SchemaRef {
    Arc::new(ArrowSchema::new(
        columns
            .iter()
            .map(|(name, ty)| Field::new(name, ty.arrow_type(), true))
            .collect::<Vec<_>>(),
    ))
}

/// The rows of one `read_statestore` call, read on a blocking thread when the query runs.
#[derive(Debug)]
struct StatePartition {
    reader: Arc<StateReader>,
    read: Read,
    schema: SchemaRef,
    columns: Vec<(String, ColumnType)>,
}

impl PartitionStream for StatePartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema.clone(), 2);
        let tx = builder.tx();
        let reader = self.reader.clone();
        let read = self.read.clone();
        let mut batcher = RowBatcher::new(self.schema.clone(), &self.columns);
        builder.spawn_blocking(move || {
            // Why the scan stopped early, if it did: a row that does not convert, or the
            // query no longer wanting rows (a `LIMIT` was reached).
            let mut stopped: Option<Option<ConvertError>> = None;
            let mut send = |batch| {
                if tx.blocking_send(Ok(batch)).is_err() {
                    stopped = Some(None);
                    return false;
                }
                true
            };
            let mut failed = None;
            let scan = read.run(&reader, |row| {
                match batcher.push(&row) {
                    Ok(None) => return Ok(()),
                    Ok(Some(batch)) => {
                        if send(batch) {
                            return Ok(());
                        }
                    }
                    Err(e) => failed = Some(e),
                }
                // The reader stops scanning at the callback's first error.
                Err(EngineError::Io("the query stopped reading".into()))
            });
            if let Some(e) = failed {
                return Err(external(e));
            }
            if stopped.is_some() {
                return Ok(());
            }
            scan.map_err(external)?;
            if batcher.has_rows() {
                let batch = batcher.finish().map_err(external)?;
                let _ = tx.blocking_send(Ok(batch));
            }
            Ok(())
        });
        builder.build()
    }
}

/// `read_state_metadata()`: one row per state variable, with the checkpoint's operator,
/// partitions, batch range and modes.
#[derive(Debug)]
pub(crate) struct ReadStateMetadata {
    pub(crate) checkpoints: Arc<Checkpoints>,
}

/// The columns of `read_state_metadata()`.
pub(crate) fn metadata_columns() -> Vec<(String, ColumnType)> {
    let strings = || ColumnType::List(Box::new(ColumnType::String));
    [
        ("operator_id", ColumnType::Long),
        ("operator_name", ColumnType::String),
        ("num_partitions", ColumnType::Int),
        ("min_batch_id", ColumnType::Long),
        ("max_batch_id", ColumnType::Long),
        ("time_mode", ColumnType::String),
        ("output_mode", ColumnType::String),
        ("key_columns", strings()),
        ("state_var_name", ColumnType::String),
        ("state_var_id", ColumnType::Long),
        ("kind", ColumnType::String),
        ("ttl_enabled", ColumnType::Boolean),
        ("ttl_duration_ms", ColumnType::Long),
        ("user_map_key_schema", ColumnType::String),
        ("value_schema", ColumnType::String),
        ("schema_id", ColumnType::Long),
        ("value_schema_history", strings()),
    ]
    .into_iter()
    .map(|(name, ty)| (name.to_owned(), ty))
    .collect()
}

/// The metadata rows: the checkpoint's fields repeated on each variable's row.
pub(crate) fn metadata_rows(metadata: &Value) -> Vec<Value> {
    let mut common = Map::new();
    for name in [
        "operator_id",
        "operator_name",
        "num_partitions",
        "min_batch_id",
        "max_batch_id",
        "time_mode",
        "output_mode",
        "key_columns",
    ] {
        common.insert(name.into(), metadata[name].clone());
    }
    let empty = Vec::new();
    let vars = metadata["variables"].as_array().unwrap_or(&empty);
    vars.iter()
        .map(|var| {
            let mut row = common.clone();
            for (column, field) in [
                ("state_var_name", "name"),
                ("state_var_id", "id"),
                ("kind", "kind"),
                ("ttl_enabled", "ttl_enabled"),
                ("ttl_duration_ms", "ttl_duration_ms"),
                ("user_map_key_schema", "key_schema"),
                ("value_schema", "value_schema"),
                ("schema_id", "schema_id"),
                ("value_schema_history", "value_schema_history"),
            ] {
                row.insert(column.into(), var[field].clone());
            }
            Value::Object(row)
        })
        .collect()
}

impl TableFunctionImpl for ReadStateMetadata {
    fn call_with_args(
        &self,
        args: TableFunctionArgs,
    ) -> datafusion::common::Result<Arc<dyn TableProvider>> {
        let (path, rest) = path_argument(args.exprs());
        if let Some(arg) = rest.first() {
            return Err(usage(format!(
                "read_state_metadata takes only a checkpoint path, found {}; call it as \
                 read_state_metadata() or read_state_metadata('/checkpoint/path')",
                shown(arg)
            )));
        }
        let reader = self.checkpoints.reader(READ_STATE_METADATA, path)?;
        let metadata = reader.metadata().map_err(external)?;
        let columns = metadata_columns();
        let schema = schema_of(&columns);
        let mut batcher = RowBatcher::new(schema.clone(), &columns);
        let mut batches = Vec::new();
        for row in metadata_rows(&metadata) {
            batches.extend(batcher.push(&row).map_err(external)?);
        }
        batches.push(batcher.finish().map_err(external)?);
        Ok(Arc::new(MemTable::try_new(schema, vec![batches])?))
    }
}

#[cfg(test)]
mod tests;
