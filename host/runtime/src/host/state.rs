//! The state context: what an instance's state and timer imports act on. The transaction
//! lent for the call in progress, the catalog (or, in describe mode, a trial copy of it),
//! the batch's times, the phase, and the key in use; with the checks every import makes
//! (phase, key selected, schemas, the per-batch write allowance) and the resources the
//! guest holds (state variables and iterators).

use std::cell::Cell;
use std::sync::Arc;

use statebox_schema::{Schema, Strictness};
use statebox_state::catalog::{
    Catalog, Declaration, DeclareError, Described, InitOp, VarHandle, VarKind,
};
use statebox_state::{PartitionTxn, StoreError, StoredValue};

use crate::bindings::statebox::processor::types::{self, ErrorKind, StateError};
use crate::{BatchTimes, InstanceConfig, TimeMode};

/// Most iterators an instance may hold open at once; creating another returns
/// `limit-exceeded`. Iterators a guest never drops stay counted, so a leak is bounded.
pub(crate) const MAX_LIVE_ITERATORS: usize = 1024;

/// A value state variable as seen by one instance.
pub struct ValueStateRes(pub(super) Arc<VarHandle>);
/// A list state variable as seen by one instance.
pub struct ListStateRes(pub(super) Arc<VarHandle>);
/// A map state variable as seen by one instance, with the last user key canonicalized
/// through it.
pub struct MapStateRes(pub(super) Arc<VarHandle>, LastUserKey);

/// The last user key a map handle canonicalized: the JSON text the guest sent and its
/// canonical bytes. A processor mostly uses the same few user keys for every grouping key
/// (the counter's `{"name":"calls"}`), and canonicalizing one parses it against the key
/// schema, which never changes: a few hundred nanoseconds per map operation, about 3% of
/// the samples of a `bench count` run of the Rust counter.
#[derive(Default)]
struct LastUserKey {
    json: String,
    canonical: Vec<u8>,
    /// Whether `json` and `canonical` hold a user key (a text that failed is not kept).
    valid: bool,
}

impl MapStateRes {
    pub(super) fn new(var: Arc<VarHandle>) -> Self {
        Self(var, LastUserKey::default())
    }

    /// `json`'s canonical form as a user key of this map (see [`user_key`]).
    pub(super) fn user_key(&mut self, json: &str) -> Result<Vec<u8>, StateError> {
        let last = &mut self.1;
        if last.valid && last.json == json {
            return Ok(last.canonical.clone());
        }
        last.valid = false;
        let canonical = user_key(&self.0, json)?;
        last.json.clear();
        last.json.push_str(json);
        last.canonical.clear();
        last.canonical.extend_from_slice(&canonical);
        last.valid = true;
        Ok(canonical)
    }
}

/// Where an iterator may be used: in the call that created it and, in a batched call, only
/// while the entry (key) it was created for is selected. So a handler never reads through
/// another key's iterator, while an async handler's iterator survives other keys running in
/// between.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Scope {
    generation: u64,
    entry: Option<usize>,
}

/// A lazy iterator over list elements, or map keys or values.
pub struct JsonIteratorRes {
    pub(super) var: Arc<VarHandle>,
    pub(super) key: String,
    pub(super) scope: Scope,
    pub(super) source: JsonSource,
}

pub(super) enum JsonSource {
    List { after: Option<u64> },
    MapKeys { after: Option<Vec<u8>> },
    MapValues { after: Option<Vec<u8>> },
}

/// A lazy iterator over map entries.
pub struct MapIteratorRes {
    pub(super) var: Arc<VarHandle>,
    pub(super) key: String,
    pub(super) scope: Scope,
    pub(super) after: Option<Vec<u8>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Between calls: nothing may be touched.
    Idle,
    /// Inside `init`: declarations only.
    Init,
    /// Inside a handler: state and timers of the current key.
    Handler,
    /// Inside `close`.
    Close,
}

/// The keys of a batched call, and which one the guest selected.
pub(super) struct BatchKeys {
    pub(super) keys: Vec<String>,
    pub(super) selected: Option<usize>,
    /// Each entry's random stream while another entry is selected; `None` until first
    /// selected.
    pub(super) random: Vec<Option<u64>>,
}

impl BatchKeys {
    pub(super) fn new(keys: Vec<String>) -> BatchKeys {
        BatchKeys {
            random: vec![None; keys.len()],
            keys,
            selected: None,
        }
    }
}

/// The state side of one instance.
pub(crate) struct StateCtx {
    pub(super) config: InstanceConfig,
    pub(super) phase: Phase,
    pub(super) key: String,
    /// The keys of the batched call in progress, if one is.
    pub(super) batch: Option<BatchKeys>,
    txn: Option<PartitionTxn>,
    pub(super) times: Option<BatchTimes>,
    /// Bumped on every call; iterators created in an earlier call are refused.
    generation: u64,
    /// Iterators created and not yet dropped by the guest.
    pub(super) live_iterators: usize,
    /// Bytes of state values and map keys written in the batch in progress.
    written: Cell<usize>,
    /// The most [`written`](Self::written) may reach ([`Limits::state_bytes_per_batch`]).
    ///
    /// [`Limits::state_bytes_per_batch`]: crate::Limits::state_bytes_per_batch
    written_limit: usize,
    /// A storage failure seen by an import; the import traps and the caller reports this.
    pub(super) internal_error: Option<StoreError>,
    /// In describe mode, `init` runs against a trial copy of the catalog (so it meets the
    /// refusals a real run would) and what it did is recorded here.
    describe: Option<(Catalog, Described)>,
}

impl StateCtx {
    pub(super) fn new(config: InstanceConfig, written_limit: usize) -> StateCtx {
        StateCtx {
            config,
            phase: Phase::Idle,
            key: String::new(),
            batch: None,
            txn: None,
            times: None,
            generation: 0,
            live_iterators: 0,
            written: Cell::new(0),
            written_limit,
            internal_error: None,
            describe: None,
        }
    }

    pub(super) fn start_describing(&mut self, catalog: &Catalog) {
        self.describe = Some((catalog.trial(), Described::default()));
    }

    pub(super) fn take_described(&mut self) -> Described {
        self.describe.take().map(|(_, d)| d).unwrap_or_default()
    }

    pub(super) fn start_batch(&mut self) {
        self.written.set(0);
    }

    pub(super) fn lend(&mut self, txn: PartitionTxn, times: BatchTimes) {
        self.txn = Some(txn);
        self.times = Some(times);
    }

    pub(super) fn take_back(&mut self) -> Option<PartitionTxn> {
        self.times = None;
        self.txn.take()
    }

    /// A call in `phase` starts: iterators of earlier calls stop working.
    pub(super) fn begin(&mut self, phase: Phase) {
        self.phase = phase;
        self.generation += 1;
    }

    pub(super) fn end_call(&mut self) {
        self.phase = Phase::Idle;
        self.batch = None;
    }

    /// The batch in progress (0 outside one), which seeds the guest's randomness.
    pub(super) fn batch_id(&self) -> u64 {
        self.times.map_or(0, |t| t.batch_id)
    }

    pub(super) fn selected_entry(&self) -> Option<usize> {
        self.batch.as_ref().and_then(|b| b.selected)
    }

    /// Hints that entry `entry` of the batched call in progress is the next whose state is
    /// read (see `PartitionTxn::prefetch`); nothing if there is no such entry.
    pub(super) fn prefetch_entry(&mut self, entry: usize) {
        let key = self.batch.as_ref().and_then(|b| b.keys.get(entry));
        if let (Some(key), Some(txn)) = (key, self.txn.as_mut()) {
            txn.prefetch(key.as_bytes());
        }
    }

    /// The query and batch, as `get-query-info` reports them.
    pub(super) fn query_info(&self) -> types::QueryInfo {
        types::QueryInfo {
            query_id: self.config.query_id.clone(),
            run_id: self.config.run_id.clone(),
            batch_id: self.batch_id(),
        }
    }

    /// Checks the phase for a state or timer operation and returns the partition's
    /// transaction and the current key.
    pub(super) fn access(&mut self, what: &str) -> Result<(&mut PartitionTxn, &str), StateError> {
        self.access_at(what, None)
    }

    /// As [`access`](Self::access), for the key of entry `entry` of the batched call in
    /// progress when given (whether or not it is the selected one), else the current key.
    pub(super) fn access_at(
        &mut self,
        what: &str,
        entry: Option<u32>,
    ) -> Result<(&mut PartitionTxn, &str), StateError> {
        if self.phase != Phase::Handler {
            let phase = match self.phase {
                Phase::Init => "init",
                Phase::Close => "close",
                _ => "between calls",
            };
            return Err(err(
                ErrorKind::WrongPhase,
                format!(
                    "{what} is not allowed in {phase}; state and timers can be used only in the handle-* functions"
                ),
            ));
        }
        let key = match (entry, self.batch.as_ref()) {
            (None, _) => &self.key,
            (Some(entry), Some(batch)) => match batch.keys.get(entry as usize) {
                Some(key) => key,
                None => {
                    return Err(err(
                        ErrorKind::InvalidUse,
                        format!(
                            "{what}: entry {entry}: the call has {} entries",
                            batch.keys.len()
                        ),
                    ));
                }
            },
            (Some(_), None) => {
                return Err(err(
                    ErrorKind::InvalidUse,
                    format!("{what} is allowed only during a batched call"),
                ));
            }
        };
        if entry.is_none() && self.batch.as_ref().is_some_and(|b| b.selected.is_none()) {
            return Err(err(
                ErrorKind::WrongPhase,
                format!("{what}: no key is selected; call use-key first in a batched call"),
            ));
        }
        match self.txn.as_mut() {
            Some(txn) => Ok((txn, key)),
            None => Err(err(
                ErrorKind::WrongPhase,
                format!("{what}: no batch is in progress"),
            )),
        }
    }

    /// The transaction, for an iterator whose scope [`iter_guard`](Self::iter_guard)
    /// checked (only a handler, which always has one, passes).
    pub(super) fn txn(&self) -> &PartitionTxn {
        self.txn.as_ref().expect("handler phase has a transaction")
    }

    /// Turns a storage failure into a trap, remembering it for the error report.
    pub(super) fn fail(&mut self, e: StoreError) -> wasmtime::Error {
        let msg = e.to_string();
        self.internal_error = Some(e);
        wasmtime::Error::msg(msg)
    }

    /// A stored value as the guest reads it: in the variable's current schema.
    pub(super) fn value_payload(
        &self,
        var: &VarHandle,
        stored: StoredValue,
    ) -> Result<String, StateError> {
        let payload = String::from_utf8(stored.payload).map_err(|_| {
            err(
                ErrorKind::SchemaMismatch,
                format!("stored value of `{}` is not UTF-8", var.name),
            )
        })?;
        let current = var.schema_id();
        if stored.schema_id == current {
            return Ok(payload);
        }
        let Some(old) = var.value_schemas.get(stored.schema_id as usize) else {
            return Err(err(
                ErrorKind::SchemaMismatch,
                format!(
                    "stored value of `{}` names unknown schema #{}",
                    var.name, stored.schema_id
                ),
            ));
        };
        statebox_schema::evolve_json(old, var.value_schema(), &payload).map_err(|e| {
            err(
                ErrorKind::SchemaMismatch,
                format!("cannot read old value of `{}`: {e}", var.name),
            )
        })
    }

    pub(super) fn encode_value(
        &self,
        var: &VarHandle,
        json: String,
        what: &str,
    ) -> Result<StoredValue, StateError> {
        self.count_written(json.len())?;
        check_value(var.value_schema(), &json, &var.name, what)?;
        Ok(StoredValue {
            schema_id: var.schema_id(),
            expires_at_ms: self.expiry(var),
            payload: json.into_bytes(),
        })
    }

    pub(super) fn encode_values(
        &self,
        var: &VarHandle,
        values: Vec<String>,
    ) -> Result<Vec<StoredValue>, StateError> {
        if values.is_empty() {
            return Err(err(
                ErrorKind::EmptyList,
                format!(
                    "list state `{}`: an empty list cannot be put or appended; use clear",
                    var.name
                ),
            ));
        }
        values
            .into_iter()
            .map(|v| self.encode_value(var, v, "list element"))
            .collect()
    }

    /// Counts `bytes` toward the state the instance writes in this batch, which the
    /// partition's overlay holds in host memory until the commit.
    pub(super) fn count_written(&self, bytes: usize) -> Result<(), StateError> {
        let total = self.written.get().saturating_add(bytes);
        let limit = self.written_limit;
        if total > limit {
            return Err(err(
                ErrorKind::LimitExceeded,
                format!(
                    "the processor wrote more than {limit} bytes of state in this batch \
                     (the limit per partition and batch)"
                ),
            ));
        }
        self.written.set(total);
        Ok(())
    }

    pub(super) fn declare(
        &mut self,
        name: &str,
        kind: VarKind,
        key_ddl: Option<&str>,
        value_ddl: &str,
        ttl_ms: Option<u64>,
    ) -> Result<Arc<VarHandle>, StateError> {
        if self.phase != Phase::Init {
            return Err(err(
                ErrorKind::WrongPhase,
                format!("state variable `{name}` must be declared in init"),
            ));
        }
        if ttl_ms.is_some() && self.config.time_mode == TimeMode::None {
            return Err(err(
                ErrorKind::UnsupportedInTimeMode,
                format!(
                    "state variable `{name}` has a TTL, but TTL needs time mode processing-time or event-time (the query uses none)"
                ),
            ));
        }
        if ttl_ms == Some(0) {
            return Err(err(
                ErrorKind::InvalidUse,
                format!("state variable `{name}`: TTL must be positive"),
            ));
        }
        if let Some((trial, described)) = &mut self.describe {
            let result = trial.declare(name, kind, key_ddl, value_ddl, ttl_ms);
            let op = InitOp::Declare(Declaration {
                name: name.to_owned(),
                kind,
                key_schema: key_ddl.map(str::to_owned),
                value_schema: value_ddl.to_owned(),
                ttl_ms,
            });
            let outcome = result.as_ref().map(|_| ()).map_err(|e| e.to_string());
            described.ops.push((op, outcome));
            return result.map_err(declare_error);
        }
        let mut catalog = self.config.catalog.lock().expect("catalog lock poisoned");
        catalog
            .declare(name, kind, key_ddl, value_ddl, ttl_ms)
            .map_err(declare_error)
    }

    pub(super) fn delete_if_exists(&mut self, name: String) -> Result<(), StateError> {
        if self.phase != Phase::Init {
            return Err(err(
                ErrorKind::WrongPhase,
                format!("delete-if-exists(\"{name}\") is allowed only in init"),
            ));
        }
        match &mut self.describe {
            Some((trial, described)) => {
                trial.delete_if_exists(&name);
                described.ops.push((InitOp::Delete(name), Ok(())));
            }
            None => self
                .config
                .catalog
                .lock()
                .expect("catalog lock poisoned")
                .delete_if_exists(&name),
        }
        Ok(())
    }

    /// Refuses a new iterator while the instance holds [`MAX_LIVE_ITERATORS`].
    pub(super) fn iterator_allowed(&self) -> Result<(), StateError> {
        if self.live_iterators >= MAX_LIVE_ITERATORS {
            return Err(err(
                ErrorKind::LimitExceeded,
                format!(
                    "the instance holds {MAX_LIVE_ITERATORS} open iterators, the most allowed; \
                     drop iterators that are no longer needed"
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn scope(&self) -> Scope {
        Scope {
            generation: self.generation,
            entry: self.selected_entry(),
        }
    }

    pub(super) fn iter_guard(&self, scope: Scope) -> Result<(), StateError> {
        if scope != self.scope() || self.phase != Phase::Handler {
            return Err(err(
                ErrorKind::InvalidUse,
                "an iterator can only be used during the call (and for the key) that created it"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The guest-visible error for a refused declaration.
fn declare_error(e: DeclareError) -> StateError {
    match e {
        DeclareError::InvalidSchema { .. } => err(ErrorKind::InvalidSchema, e.to_string()),
        _ => err(ErrorKind::InvalidUse, e.to_string()),
    }
}

pub(super) fn err(kind: ErrorKind, message: String) -> StateError {
    StateError { kind, message }
}

fn check_value(schema: &Schema, json: &str, var: &str, what: &str) -> Result<(), StateError> {
    if json.trim() == "null" {
        return Err(err(
            ErrorKind::NullElement,
            format!("state variable `{var}`: a {what} cannot be null"),
        ));
    }
    schema.validate(json, Strictness::Strict).map_err(|e| {
        err(
            ErrorKind::SchemaMismatch,
            format!(
                "state variable `{var}`: {what} does not match schema `{}`: {e}",
                schema.to_ddl()
            ),
        )
    })
}

/// A map's user key in canonical form (its storage order is the byte order of that).
fn user_key(var: &VarHandle, json: &str) -> Result<Vec<u8>, StateError> {
    let schema = var.key_schema.as_ref().expect("map state has a key schema");
    if json.trim() == "null" {
        return Err(err(
            ErrorKind::NullElement,
            format!("map state `{}`: a user key cannot be null", var.name),
        ));
    }
    schema
        .canonicalize(json)
        .map(String::into_bytes)
        .map_err(|e| {
            err(
                ErrorKind::SchemaMismatch,
                format!(
                    "map state `{}`: user key does not match schema `{}`: {e}",
                    var.name,
                    schema.to_ddl()
                ),
            )
        })
}
