//! The host side of the WIT imports: state variables, timers and logging, each bound to
//! the grouping key of the call in progress.

use std::sync::Arc;

use statebox_schema::{Schema, Strictness};
use statebox_state::{PartitionTxn, StoreError, StoredValue};
use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::bindings::statebox::processor::{handle, keys, log, state, types};
use crate::http::HttpHooks;
use crate::sandbox::{CallDeadline, Limits, VirtualClock, VirtualRandom};
use crate::{BatchTimes, InstanceConfig, TimeMode};
use statebox_state::catalog::{
    Catalog, Declaration, DeclareError, Described, InitOp, VarHandle, VarKind,
};
use types::{ErrorKind, StateError};

/// Largest page an iterator returns, whatever the guest asks for.
const MAX_PAGE: u32 = 4096;
/// A page also ends once it holds this many bytes of values (and map keys): however large
/// the values, one page costs the host about this much (plus one value).
const MAX_PAGE_BYTES: usize = 1 << 20;
/// Most iterators an instance may hold open at once; creating another returns
/// `limit-exceeded`. Iterators a guest never drops stay counted, so a leak is bounded.
pub(crate) const MAX_LIVE_ITERATORS: usize = 1024;
/// Most timers `list-timers` returns; a key with more gets `limit-exceeded`.
pub(crate) const MAX_LIST_TIMERS: usize = 100_000;
/// Most resources (state handles, iterators, pollables, HTTP objects) one instance may hold
/// at once; past it, creating one traps.
pub(crate) const MAX_RESOURCES: usize = 65_536;
/// A guest log message longer than this is cut.
pub(crate) const MAX_LOG_MESSAGE: usize = 4096;
/// Messages one call may log; the rest are counted and reported in one line.
pub(crate) const MAX_LOGS_PER_CALL: u32 = 100;
/// How much of the guest's stderr is kept to explain a trap.
const STDERR_CAPACITY: usize = 64 << 10;

/// A value state variable as seen by one instance.
pub struct ValueStateRes(Arc<VarHandle>);
/// A list state variable as seen by one instance.
pub struct ListStateRes(Arc<VarHandle>);
/// A map state variable as seen by one instance.
pub struct MapStateRes(Arc<VarHandle>);

/// Where an iterator may be used: in the call that created it and, in a batched call, only
/// while the entry (key) it was created for is selected. So a handler never reads through
/// another key's iterator, while an async handler's iterator survives other keys running in
/// between.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Scope {
    generation: u64,
    entry: Option<usize>,
}

/// A lazy iterator over list elements, or map keys or values.
pub struct JsonIteratorRes {
    var: Arc<VarHandle>,
    key: String,
    scope: Scope,
    source: JsonSource,
}

enum JsonSource {
    List { after: Option<u64> },
    MapKeys { after: Option<Vec<u8>> },
    MapValues { after: Option<Vec<u8>> },
}

/// A lazy iterator over map entries.
pub struct MapIteratorRes {
    var: Arc<VarHandle>,
    key: String,
    scope: Scope,
    after: Option<Vec<u8>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Between calls: nothing may be touched.
    Idle,
    /// Inside `init`: declarations only.
    Init,
    /// Inside a handler: state and timers of the current key.
    Handler,
    /// Inside `close`.
    Close,
}

/// Most core instances, linear memories and tables one instance's store may create. The
/// components the SDKs build stay well below (a Python component has about a dozen core
/// instances and two memories); the counts bound what a crafted component can make the host
/// allocate besides the bytes [`MemoryLimiter`] counts.
const MAX_CORE_INSTANCES: usize = 64;
const MAX_MEMORIES: usize = 8;
const MAX_TABLES: usize = 64;
/// What a table element costs the host, for the memory limit (a function reference).
const TABLE_ELEMENT_BYTES: usize = 8;

/// Denies growth of linear memories and tables past the instance's limit, which covers all
/// of them together, and remembers that it did, so the trap that usually follows (an
/// allocation failure) can be explained.
pub(crate) struct MemoryLimiter {
    max: usize,
    hit: bool,
    /// Bytes of every linear memory and table of the store.
    total: usize,
    /// The largest `total` reached, in bytes (the instance's high-water mark).
    pub(crate) peak: usize,
}

impl MemoryLimiter {
    fn new(max: usize) -> MemoryLimiter {
        MemoryLimiter {
            max,
            hit: false,
            total: 0,
            peak: 0,
        }
    }

    /// Grows the total from `current` to `desired` bytes of one memory or table, if the
    /// limit allows.
    fn grow(&mut self, current: usize, desired: usize) -> bool {
        let total = (self.total - current.min(self.total)).saturating_add(desired);
        if total > self.max {
            self.hit = true;
            return false;
        }
        self.total = total;
        self.peak = self.peak.max(total);
        true
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(current, desired))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(
            current.saturating_mul(TABLE_ELEMENT_BYTES),
            desired.saturating_mul(TABLE_ELEMENT_BYTES),
        ))
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

/// The keys of a batched call, and which one the guest selected.
struct BatchKeys {
    keys: Vec<String>,
    selected: Option<usize>,
    /// Each entry's random stream while another entry is selected; `None` until first
    /// selected.
    random: Vec<Option<u64>>,
}

/// Everything the imports of one instance can reach.
pub struct HostState {
    processor: String,
    config: InstanceConfig,
    pub(crate) limits: MemoryLimiter,
    limits_config: Limits,
    table: ResourceTable,
    wasi: WasiCtx,
    /// Outbound HTTP: denied unless the host is on the allow-list (`Limits::http_hosts`).
    http: WasiHttpCtx,
    http_hooks: HttpHooks,
    stderr: MemoryOutputPipe,
    /// The wall-clock deadline of the call in progress (shared with the driving thread and
    /// the outbound-HTTP hooks).
    deadline: CallDeadline,
    /// The thread's CPU time when the call started, when a shared [`Limits::batch_cpu`]
    /// budget is checked during the call.
    cpu_started: u64,
    clock: VirtualClock,
    random: VirtualRandom,
    phase: Phase,
    key: String,
    /// The keys of the batched call in progress, if one is.
    batch: Option<BatchKeys>,
    txn: Option<PartitionTxn>,
    times: Option<BatchTimes>,
    /// Bumped on every call; iterators created in an earlier call are refused.
    generation: u64,
    /// Iterators created and not yet dropped by the guest.
    live_iterators: usize,
    /// Bytes of state values and map keys written in the batch in progress.
    written: std::cell::Cell<usize>,
    /// Messages logged in the call in progress, and how many of them were dropped.
    logged: u32,
    /// A storage failure seen by an import; the import traps and the caller reports this.
    internal_error: Option<StoreError>,
    /// In describe mode, `init` runs against a trial copy of the catalog (so it meets the
    /// refusals a real run would) and what it did is recorded here.
    describe: Option<(Catalog, Described)>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

impl HostState {
    pub(crate) fn new(
        processor: String,
        config: InstanceConfig,
        limits: &Limits,
        mut table: ResourceTable,
    ) -> HostState {
        table.set_max_capacity(MAX_RESOURCES);
        let clock = VirtualClock::default();
        let random = VirtualRandom::default();
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let deadline = CallDeadline::default();
        // Nothing is granted: no preopened directories, no environment, no network, no
        // arguments, stdin closed. Clocks and randomness are virtual.
        let wasi = WasiCtx::builder()
            .stderr(stderr.clone())
            .wall_clock(clock.clone())
            .monotonic_clock(clock.clone())
            .secure_random(random.clone())
            .insecure_random(random.clone())
            .insecure_random_seed(0)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        HostState {
            processor,
            config,
            limits: MemoryLimiter::new(limits.memory_bytes),
            limits_config: limits.clone(),
            table,
            wasi,
            http: WasiHttpCtx::new(),
            http_hooks: HttpHooks::new(&limits.http_hosts, deadline.clone()),
            stderr,
            deadline,
            cpu_started: 0,
            clock,
            random,
            phase: Phase::Idle,
            key: String::new(),
            batch: None,
            txn: None,
            times: None,
            generation: 0,
            live_iterators: 0,
            written: std::cell::Cell::new(0),
            logged: 0,
            internal_error: None,
            describe: None,
        }
    }

    /// Switches to describe mode against a trial copy of `catalog`.
    pub(crate) fn start_describing(&mut self, catalog: &Catalog) {
        self.describe = Some((catalog.trial(), Described::default()));
    }

    /// What `init` did in describe mode.
    pub(crate) fn take_described(&mut self) -> Described {
        self.describe.take().map(|(_, d)| d).unwrap_or_default()
    }

    pub(crate) fn call_timeout(&self) -> std::time::Duration {
        self.limits_config.call_timeout
    }

    /// Starts the deadline of a call: it bounds the guest's CPU (epoch interruption), its
    /// waits in host calls and its outbound HTTP requests.
    pub(crate) fn start_call_deadline(&mut self) {
        self.deadline.start(self.limits_config.call_timeout);
        self.http_hooks.start_call();
        if self.limits_config.batch_cpu.is_some() {
            self.cpu_started = crate::sandbox::thread_cpu_ns();
        }
    }

    /// The deadline of the call in progress.
    pub(crate) fn deadline(&self) -> &CallDeadline {
        &self.deadline
    }

    /// Whether the call in progress, with the CPU it has used so far, took the shared batch
    /// budget past its limit.
    pub(crate) fn batch_budget_exceeded(&self) -> bool {
        self.limits_config.batch_cpu.as_ref().is_some_and(|budget| {
            let running = crate::sandbox::thread_cpu_ns().saturating_sub(self.cpu_started);
            budget.exceeded_with(running)
        })
    }

    pub(crate) fn batch_budget(&self) -> Option<&crate::sandbox::CpuBudget> {
        self.limits_config.batch_cpu.as_deref()
    }

    /// Epoch ticks until the deadline callback first runs in a call: at the call's deadline,
    /// or sooner when a shared batch budget must be checked while the call runs.
    pub(crate) fn deadline_ticks(&self) -> u64 {
        let ticks = self.limits_config.deadline_ticks();
        if self.limits_config.batch_cpu.is_some() {
            let check = crate::sandbox::BUDGET_CHECK.as_millis() / crate::EPOCH_TICK.as_millis();
            return ticks.min(check as u64);
        }
        ticks
    }

    pub(crate) fn output_limit(&self) -> usize {
        self.limits_config.output_bytes_per_call
    }

    pub(crate) fn memory_limit(&self) -> usize {
        self.limits.max
    }

    pub(crate) fn memory_limit_hit(&self) -> bool {
        self.limits.hit
    }

    pub(crate) fn stderr_tail(&self) -> String {
        let bytes = self.stderr.contents();
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim();
        let start = text.len().saturating_sub(2000);
        let start = (start..=text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_owned()
    }

    pub(crate) fn take_internal_error(&mut self) -> Option<StoreError> {
        self.internal_error.take()
    }

    pub(crate) fn begin_init(&mut self) {
        self.phase = Phase::Init;
        self.generation += 1;
        self.logged = 0;
    }

    pub(crate) fn begin_close(&mut self) {
        self.phase = Phase::Close;
        self.generation += 1;
        self.logged = 0;
    }

    /// A new batch starts: the per-batch write allowance starts over.
    pub(crate) fn start_batch(&mut self) {
        self.written.set(0);
    }

    /// Holds the batch's transaction for one export call (host functions reach only what
    /// the store owns); [`Self::take_back`] returns it when the call is over. The engine
    /// set its TTL clock and time floor when it opened it.
    pub(crate) fn lend(&mut self, txn: PartitionTxn, times: BatchTimes) {
        self.txn = Some(txn);
        self.times = Some(times);
        self.clock.set_ms(times.batch_timestamp_ms);
    }

    /// Gives back the transaction [lent](Self::lend) for a call.
    pub(crate) fn take_back(&mut self) -> Option<PartitionTxn> {
        self.times = None;
        self.txn.take()
    }

    /// Every call starts at the batch timestamp, whatever an earlier call slept.
    fn reset_clock(&self) {
        if let Some(times) = self.times {
            self.clock.set_ms(times.batch_timestamp_ms);
        }
    }

    pub(crate) fn begin_call(&mut self, key: &str) {
        self.phase = Phase::Handler;
        self.generation += 1;
        self.logged = 0;
        self.reset_clock();
        key.clone_into(&mut self.key);
        let batch_id = self.times.map_or(0, |t| t.batch_id);
        self.random.reseed(batch_id, key);
    }

    /// Starts a batched call over `keys`: no key is current until the guest selects one
    /// with `use-key`.
    pub(crate) fn begin_batch_call(&mut self, keys: Vec<String>) {
        self.phase = Phase::Handler;
        self.generation += 1;
        self.logged = 0;
        self.reset_clock();
        self.key.clear();
        self.batch = Some(BatchKeys {
            random: vec![None; keys.len()],
            keys,
            selected: None,
        });
    }

    pub(crate) fn end_call(&mut self) {
        self.phase = Phase::Idle;
        self.batch = None;
    }

    /// The entry of the batched call in progress that the guest selected last.
    pub(crate) fn selected_entry(&self) -> Option<usize> {
        self.batch.as_ref().and_then(|b| b.selected)
    }

    /// The query and batch, as `get-query-info` reports them.
    fn query_info(&self) -> types::QueryInfo {
        types::QueryInfo {
            query_id: self.config.query_id.clone(),
            run_id: self.config.run_id.clone(),
            batch_id: self.times.map_or(0, |t| t.batch_id),
        }
    }

    pub(crate) fn timer_values(&self) -> types::TimerValues {
        let (ts, wm) = match (self.config.time_mode, self.times) {
            (TimeMode::None, _) | (_, None) => (-1, -1),
            (TimeMode::ProcessingTime, Some(t)) => (t.batch_timestamp_ms, -1),
            (TimeMode::EventTime, Some(t)) => (t.batch_timestamp_ms, t.watermark_ms),
        };
        types::TimerValues {
            current_processing_time_ms: ts,
            current_watermark_ms: wm,
        }
    }

    fn expiry(&self, var: &VarHandle) -> Option<i64> {
        let ttl = var.ttl_ms?;
        // The one clock of timers and TTL (the batch timestamp, or the watermark in event-time
        // mode), as the engine's TTL cleanup uses it.
        let now = self.times.and_then(|t| {
            self.config
                .time_mode
                .clock(t.batch_timestamp_ms, t.watermark_ms)
        })?;
        Some(now.saturating_add(ttl as i64))
    }

    /// Checks the phase for a state or timer operation and returns the partition's
    /// transaction and the current key.
    fn access(&mut self, what: &str) -> Result<(&mut PartitionTxn, &str), StateError> {
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
        if self.batch.as_ref().is_some_and(|b| b.selected.is_none()) {
            return Err(err(
                ErrorKind::WrongPhase,
                format!("{what}: no key is selected; call use-key first in a batched call"),
            ));
        }
        match self.txn.as_mut() {
            Some(txn) => Ok((txn, &self.key)),
            None => Err(err(
                ErrorKind::WrongPhase,
                format!("{what}: no batch is in progress"),
            )),
        }
    }

    /// Turns a storage failure into a trap, remembering it for the error report.
    fn fail(&mut self, e: StoreError) -> wasmtime::Error {
        let msg = e.to_string();
        self.internal_error = Some(e);
        wasmtime::Error::msg(msg)
    }

    fn value_payload(&self, var: &VarHandle, stored: StoredValue) -> Result<String, StateError> {
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

    fn encode_value(
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

    fn encode_values(
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
    fn count_written(&self, bytes: usize) -> Result<(), StateError> {
        let total = self.written.get().saturating_add(bytes);
        let limit = self.limits_config.state_bytes_per_batch;
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

    fn declare(
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

    /// Adds an iterator to the table, unless the instance holds too many already.
    fn push_iterator<T: Send + 'static>(
        &mut self,
        it: T,
    ) -> wasmtime::Result<Result<Resource<T>, StateError>> {
        if self.live_iterators >= MAX_LIVE_ITERATORS {
            return Ok(Err(err(
                ErrorKind::LimitExceeded,
                format!(
                    "the instance holds {MAX_LIVE_ITERATORS} open iterators, the most allowed; \
                     drop iterators that are no longer needed"
                ),
            )));
        }
        let res = self.table.push(it)?;
        self.live_iterators += 1;
        Ok(Ok(res))
    }

    fn scope(&self) -> Scope {
        Scope {
            generation: self.generation,
            entry: self.selected_entry(),
        }
    }

    fn iter_guard(&self, scope: Scope) -> Result<(), StateError> {
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

fn err(kind: ErrorKind, message: String) -> StateError {
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

/// Runs a state operation; `Err(trap)` for storage failures, `Ok(Err(..))` for errors the
/// guest sees.
macro_rules! op {
    ($self:ident, $what:expr, |$txn:ident, $key:ident| $body:expr) => {{
        let ($txn, $key) = match $self.access($what) {
            Ok(x) => x,
            Err(e) => return Ok(Err(e)),
        };
        let $key = $key.as_bytes();
        let result = $body;
        match result {
            Ok(v) => v,
            Err(e) => return Err($self.fail(e)),
        }
    }};
}

impl types::Host for HostState {}

/// `wasi:clocks/monotonic-clock` on the virtual clock. It replaces wasmtime-wasi's, whose
/// pollables wait in real time: here a guest that sleeps (`subscribe-duration` then
/// `block`) holds no host thread, and its clock moves by exactly the time it slept.
impl wasmtime_wasi::p2::bindings::clocks::monotonic_clock::Host for HostState {
    fn now(&mut self) -> wasmtime::Result<u64> {
        Ok(self.clock.monotonic_now())
    }

    fn resolution(&mut self) -> wasmtime::Result<u64> {
        Ok(1)
    }

    fn subscribe_instant(
        &mut self,
        when: u64,
    ) -> wasmtime::Result<Resource<wasmtime_wasi::p2::DynPollable>> {
        let timer = self.table.push(self.clock.timer_at(when))?;
        wasmtime_wasi::p2::subscribe(&mut self.table, timer)
    }

    fn subscribe_duration(
        &mut self,
        duration: u64,
    ) -> wasmtime::Result<Resource<wasmtime_wasi::p2::DynPollable>> {
        let timer = self.table.push(self.clock.timer_in(duration))?;
        wasmtime_wasi::p2::subscribe(&mut self.table, timer)
    }
}

impl keys::Host for HostState {
    fn use_key(&mut self, index: u32) -> wasmtime::Result<Result<(), StateError>> {
        let Some(batch) = self.batch.as_mut() else {
            return Ok(Err(err(
                ErrorKind::InvalidUse,
                "use-key is allowed only during a batched call (handle-input-batch or \
                 handle-expired-timers)"
                    .into(),
            )));
        };
        let index = index as usize;
        if index >= batch.keys.len() {
            return Ok(Err(err(
                ErrorKind::InvalidUse,
                format!(
                    "use-key({index}): the call has {} entries",
                    batch.keys.len()
                ),
            )));
        }
        if batch.selected == Some(index) {
            return Ok(Ok(()));
        }
        // Each key keeps its own random stream across switches, as if it had been called
        // alone.
        if let Some(previous) = batch.selected {
            batch.random[previous] = Some(self.random.state());
        }
        match batch.random[index] {
            Some(state) => self.random.restore(state),
            None => {
                let batch_id = self.times.map_or(0, |t| t.batch_id);
                self.random.reseed(batch_id, &batch.keys[index]);
                // A key's first selection starts its own CPU, waiting and outbound-HTTP
                // budget (a shared batch budget still binds across keys).
                self.deadline.start(self.limits_config.call_timeout);
                self.http_hooks.start_call();
            }
        }
        batch.selected = Some(index);
        batch.keys[index].clone_into(&mut self.key);
        Ok(Ok(()))
    }
}

impl log::Host for HostState {
    fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        self.logged = self.logged.saturating_add(1);
        if self.logged > MAX_LOGS_PER_CALL {
            return Ok(());
        }
        let message = if self.logged == MAX_LOGS_PER_CALL {
            format!(
                "(this call's further messages are dropped) {}",
                log_line(&message)
            )
        } else {
            log_line(&message)
        };
        let p = &self.processor;
        // Guest messages may contain tenant data: they go to the processor's own log target
        // and are never mixed into the host's messages.
        match level {
            log::Level::Trace => {
                tracing::trace!(target: "statebox::guest", processor = %p, "{message}")
            }
            log::Level::Debug => {
                tracing::debug!(target: "statebox::guest", processor = %p, "{message}")
            }
            log::Level::Info => {
                tracing::info!(target: "statebox::guest", processor = %p, "{message}")
            }
            log::Level::Warn => {
                tracing::warn!(target: "statebox::guest", processor = %p, "{message}")
            }
            log::Level::Error => {
                tracing::error!(target: "statebox::guest", processor = %p, "{message}")
            }
        }
        Ok(())
    }
}

/// A guest message as one bounded log line: control characters (newlines included) are
/// escaped, so a guest cannot forge log lines, and anything past [`MAX_LOG_MESSAGE`] bytes
/// is cut.
pub(crate) fn log_line(message: &str) -> String {
    let mut line = String::with_capacity(message.len().min(MAX_LOG_MESSAGE) + 32);
    for (i, c) in message.char_indices() {
        if line.len() >= MAX_LOG_MESSAGE {
            line.push_str(&format!("… ({} more bytes cut)", message.len() - i));
            break;
        }
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

impl handle::Host for HostState {
    fn get_query_info(&mut self) -> wasmtime::Result<types::QueryInfo> {
        Ok(self.query_info())
    }

    fn get_value_state(
        &mut self,
        name: String,
        value_schema: String,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<Resource<ValueStateRes>, StateError>> {
        Ok(
            match self.declare(&name, VarKind::Value, None, &value_schema, ttl_ms) {
                Ok(var) => Ok(self.table.push(ValueStateRes(var))?),
                Err(e) => Err(e),
            },
        )
    }

    fn get_list_state(
        &mut self,
        name: String,
        element_schema: String,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<Resource<ListStateRes>, StateError>> {
        Ok(
            match self.declare(&name, VarKind::List, None, &element_schema, ttl_ms) {
                Ok(var) => Ok(self.table.push(ListStateRes(var))?),
                Err(e) => Err(e),
            },
        )
    }

    fn get_map_state(
        &mut self,
        name: String,
        user_key_schema: String,
        value_schema: String,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<Resource<MapStateRes>, StateError>> {
        Ok(
            match self.declare(
                &name,
                VarKind::Map,
                Some(&user_key_schema),
                &value_schema,
                ttl_ms,
            ) {
                Ok(var) => Ok(self.table.push(MapStateRes(var))?),
                Err(e) => Err(e),
            },
        )
    }

    fn delete_if_exists(&mut self, name: String) -> wasmtime::Result<Result<(), StateError>> {
        if self.phase != Phase::Init {
            return Ok(Err(err(
                ErrorKind::WrongPhase,
                format!("delete-if-exists(\"{name}\") is allowed only in init"),
            )));
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
        Ok(Ok(()))
    }

    fn register_timer(&mut self, expiry_ms: i64) -> wasmtime::Result<Result<(), StateError>> {
        if let Err(e) = self.timers_allowed("register-timer") {
            return Ok(Err(e));
        }
        op!(self, "register-timer", |txn, key| txn
            .timer_register(key, expiry_ms));
        Ok(Ok(()))
    }

    fn delete_timer(&mut self, expiry_ms: i64) -> wasmtime::Result<Result<(), StateError>> {
        if let Err(e) = self.timers_allowed("delete-timer") {
            return Ok(Err(e));
        }
        op!(self, "delete-timer", |txn, key| txn
            .timer_delete(key, expiry_ms));
        Ok(Ok(()))
    }

    fn list_timers(&mut self) -> wasmtime::Result<Result<Vec<i64>, StateError>> {
        if let Err(e) = self.timers_allowed("list-timers") {
            return Ok(Err(e));
        }
        let timers = op!(self, "list-timers", |txn, key| txn
            .timer_list_upto(key, MAX_LIST_TIMERS + 1));
        if timers.len() > MAX_LIST_TIMERS {
            return Ok(Err(err(
                ErrorKind::LimitExceeded,
                format!(
                    "the key has more than {MAX_LIST_TIMERS} timers, more than list-timers \
                     returns"
                ),
            )));
        }
        Ok(Ok(timers))
    }
}

impl HostState {
    fn timers_allowed(&self, what: &str) -> Result<(), StateError> {
        if self.config.time_mode == TimeMode::None {
            return Err(err(
                ErrorKind::UnsupportedInTimeMode,
                format!(
                    "{what}: timers are not allowed in time mode none; run the query with time mode processing-time or event-time"
                ),
            ));
        }
        Ok(())
    }

    fn var<T: 'static>(&self, res: &Resource<T>) -> wasmtime::Result<&T> {
        Ok(self.table.get(res)?)
    }
}

impl state::Host for HostState {}

impl state::HostValueState for HostState {
    fn exists(
        &mut self,
        this: Resource<ValueStateRes>,
    ) -> wasmtime::Result<Result<bool, StateError>> {
        let var = self.var(&this)?.0.clone();
        Ok(Ok(op!(self, "value-state.exists", |txn, key| txn
            .value_get(var.id, key))
        .is_some()))
    }

    fn get(
        &mut self,
        this: Resource<ValueStateRes>,
    ) -> wasmtime::Result<Result<Option<String>, StateError>> {
        let var = self.var(&this)?.0.clone();
        let stored = op!(self, "value-state.get", |txn, key| txn
            .value_get(var.id, key));
        Ok(stored.map(|s| self.value_payload(&var, s)).transpose())
    }

    fn update(
        &mut self,
        this: Resource<ValueStateRes>,
        value: String,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        let stored = match self.encode_value(&var, value, "value") {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "value-state.update", |txn, key| txn
            .value_put(var.id, key, stored));
        Ok(Ok(()))
    }

    fn clear(&mut self, this: Resource<ValueStateRes>) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        op!(self, "value-state.clear", |txn, key| txn
            .value_delete(var.id, key));
        Ok(Ok(()))
    }

    fn drop(&mut self, rep: Resource<ValueStateRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}

impl state::HostListState for HostState {
    fn exists(
        &mut self,
        this: Resource<ListStateRes>,
    ) -> wasmtime::Result<Result<bool, StateError>> {
        let var = self.var(&this)?.0.clone();
        Ok(Ok(op!(self, "list-state.exists", |txn, key| txn
            .list_exists(var.id, key))))
    }

    fn get(
        &mut self,
        this: Resource<ListStateRes>,
    ) -> wasmtime::Result<Result<Resource<JsonIteratorRes>, StateError>> {
        let var = self.var(&this)?.0.clone();
        if let Err(e) = self.access("list-state.get") {
            return Ok(Err(e));
        }
        let it = JsonIteratorRes {
            var,
            key: self.key.clone(),
            scope: self.scope(),
            source: JsonSource::List { after: None },
        };
        self.push_iterator(it)
    }

    fn put(
        &mut self,
        this: Resource<ListStateRes>,
        values: Vec<String>,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        let values = match self.encode_values(&var, values) {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "list-state.put", |txn, key| txn
            .list_put(var.id, key, values));
        Ok(Ok(()))
    }

    fn append_value(
        &mut self,
        this: Resource<ListStateRes>,
        value: String,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        let values = match self.encode_values(&var, vec![value]) {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "list-state.append-value", |txn, key| txn
            .list_append(var.id, key, values));
        Ok(Ok(()))
    }

    fn append_list(
        &mut self,
        this: Resource<ListStateRes>,
        values: Vec<String>,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        let values = match self.encode_values(&var, values) {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "list-state.append-list", |txn, key| txn
            .list_append(var.id, key, values));
        Ok(Ok(()))
    }

    fn clear(&mut self, this: Resource<ListStateRes>) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        op!(self, "list-state.clear", |txn, key| txn
            .list_clear(var.id, key));
        Ok(Ok(()))
    }

    fn drop(&mut self, rep: Resource<ListStateRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}

impl state::HostMapState for HostState {
    fn exists(
        &mut self,
        this: Resource<MapStateRes>,
    ) -> wasmtime::Result<Result<bool, StateError>> {
        let var = self.var(&this)?.0.clone();
        Ok(Ok(op!(self, "map-state.exists", |txn, key| txn
            .map_exists(var.id, key))))
    }

    fn get_value(
        &mut self,
        this: Resource<MapStateRes>,
        user_key_json: String,
    ) -> wasmtime::Result<Result<Option<String>, StateError>> {
        let var = self.var(&this)?.0.clone();
        let uk = match user_key(&var, &user_key_json) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        let stored = op!(self, "map-state.get-value", |txn, key| txn
            .map_get(var.id, key, &uk));
        Ok(stored.map(|s| self.value_payload(&var, s)).transpose())
    }

    fn contains_key(
        &mut self,
        this: Resource<MapStateRes>,
        user_key_json: String,
    ) -> wasmtime::Result<Result<bool, StateError>> {
        let var = self.var(&this)?.0.clone();
        let uk = match user_key(&var, &user_key_json) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        Ok(Ok(op!(self, "map-state.contains-key", |txn, key| txn
            .map_get(var.id, key, &uk))
        .is_some()))
    }

    fn update_value(
        &mut self,
        this: Resource<MapStateRes>,
        user_key_json: String,
        value: String,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        let uk = match user_key(&var, &user_key_json).and_then(|uk| {
            self.count_written(uk.len())?;
            Ok(uk)
        }) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        let stored = match self.encode_value(&var, value, "map value") {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "map-state.update-value", |txn, key| txn
            .map_put(var.id, key, &uk, stored));
        Ok(Ok(()))
    }

    fn remove_key(
        &mut self,
        this: Resource<MapStateRes>,
        user_key_json: String,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        let uk = match user_key(&var, &user_key_json) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "map-state.remove-key", |txn, key| txn
            .map_remove(var.id, key, &uk));
        Ok(Ok(()))
    }

    fn iterator(
        &mut self,
        this: Resource<MapStateRes>,
    ) -> wasmtime::Result<Result<Resource<MapIteratorRes>, StateError>> {
        let var = self.var(&this)?.0.clone();
        if let Err(e) = self.access("map-state.iterator") {
            return Ok(Err(e));
        }
        let it = MapIteratorRes {
            var,
            key: self.key.clone(),
            scope: self.scope(),
            after: None,
        };
        self.push_iterator(it)
    }

    fn keys(
        &mut self,
        this: Resource<MapStateRes>,
    ) -> wasmtime::Result<Result<Resource<JsonIteratorRes>, StateError>> {
        self.json_iter(this, "map-state.keys", JsonSource::MapKeys { after: None })
    }

    fn values(
        &mut self,
        this: Resource<MapStateRes>,
    ) -> wasmtime::Result<Result<Resource<JsonIteratorRes>, StateError>> {
        self.json_iter(
            this,
            "map-state.values",
            JsonSource::MapValues { after: None },
        )
    }

    fn clear(&mut self, this: Resource<MapStateRes>) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        op!(self, "map-state.clear", |txn, key| txn
            .map_clear(var.id, key));
        Ok(Ok(()))
    }

    fn drop(&mut self, rep: Resource<MapStateRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}

impl HostState {
    fn json_iter(
        &mut self,
        this: Resource<MapStateRes>,
        what: &str,
        source: JsonSource,
    ) -> wasmtime::Result<Result<Resource<JsonIteratorRes>, StateError>> {
        let var = self.var(&this)?.0.clone();
        if let Err(e) = self.access(what) {
            return Ok(Err(e));
        }
        let it = JsonIteratorRes {
            var,
            key: self.key.clone(),
            scope: self.scope(),
            source,
        };
        self.push_iterator(it)
    }
}

impl state::HostJsonIterator for HostState {
    fn next_page(
        &mut self,
        this: Resource<JsonIteratorRes>,
        max: u32,
    ) -> wasmtime::Result<Result<Vec<String>, StateError>> {
        let max = max.clamp(1, MAX_PAGE) as usize;
        let it = self.table.get(&this)?;
        if let Err(e) = self.iter_guard(it.scope) {
            return Ok(Err(e));
        }
        let var = it.var.clone();
        let key = it.key.clone();
        let txn = self.txn.as_ref().expect("handler phase has a transaction");
        let mut out = Vec::new();
        match &it.source {
            JsonSource::List { after } => {
                let page =
                    match txn.list_page_within(var.id, key.as_bytes(), *after, max, MAX_PAGE_BYTES)
                    {
                        Ok(p) => p,
                        Err(e) => return Err(self.fail(e)),
                    };
                let last = page.last().map(|(seq, _)| *seq);
                for (_, v) in page {
                    match self.value_payload(&var, v) {
                        Ok(p) => out.push(p),
                        Err(e) => return Ok(Err(e)),
                    }
                }
                if let Some(last) = last {
                    self.table.get_mut(&this)?.source = JsonSource::List { after: Some(last) };
                }
            }
            JsonSource::MapKeys { after } | JsonSource::MapValues { after } => {
                let keys_only = matches!(it.source, JsonSource::MapKeys { .. });
                let page = match txn.map_page_within(
                    var.id,
                    key.as_bytes(),
                    after.as_deref(),
                    max,
                    MAX_PAGE_BYTES,
                ) {
                    Ok(p) => p,
                    Err(e) => return Err(self.fail(e)),
                };
                let last = page.last().map(|(k, _)| k.clone());
                for (k, v) in page {
                    if keys_only {
                        out.push(String::from_utf8_lossy(&k).into_owned());
                    } else {
                        match self.value_payload(&var, v) {
                            Ok(p) => out.push(p),
                            Err(e) => return Ok(Err(e)),
                        }
                    }
                }
                if let Some(last) = last {
                    let source = if keys_only {
                        JsonSource::MapKeys { after: Some(last) }
                    } else {
                        JsonSource::MapValues { after: Some(last) }
                    };
                    self.table.get_mut(&this)?.source = source;
                }
            }
        }
        Ok(Ok(out))
    }

    fn drop(&mut self, rep: Resource<JsonIteratorRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        self.live_iterators -= 1;
        Ok(())
    }
}

impl state::HostMapIterator for HostState {
    fn next_page(
        &mut self,
        this: Resource<MapIteratorRes>,
        max: u32,
    ) -> wasmtime::Result<Result<Vec<state::MapEntry>, StateError>> {
        let max = max.clamp(1, MAX_PAGE) as usize;
        let it = self.table.get(&this)?;
        if let Err(e) = self.iter_guard(it.scope) {
            return Ok(Err(e));
        }
        let var = it.var.clone();
        let key = it.key.clone();
        let after = it.after.clone();
        let txn = self.txn.as_ref().expect("handler phase has a transaction");
        let page = match txn.map_page_within(
            var.id,
            key.as_bytes(),
            after.as_deref(),
            max,
            MAX_PAGE_BYTES,
        ) {
            Ok(p) => p,
            Err(e) => return Err(self.fail(e)),
        };
        let last = page.last().map(|(k, _)| k.clone());
        let mut out = Vec::with_capacity(page.len());
        for (k, v) in page {
            match self.value_payload(&var, v) {
                Ok(value) => out.push(state::MapEntry {
                    key: String::from_utf8_lossy(&k).into_owned(),
                    value,
                }),
                Err(e) => return Ok(Err(e)),
            }
        }
        if last.is_some() {
            self.table.get_mut(&this)?.after = last;
        }
        Ok(Ok(out))
    }

    fn drop(&mut self, rep: Resource<MapIteratorRes>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        self.live_iterators -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core module with `count` linear memories of `pages` 64 KiB pages each, written out
    /// by hand (magic, version, one memory section).
    fn module_with_memories(count: u8, pages: u8) -> Vec<u8> {
        let mut section = vec![count];
        for _ in 0..count {
            section.extend([0x00, pages]);
        }
        let mut wasm = b"\0asm\x01\0\0\0".to_vec();
        wasm.push(5);
        wasm.push(section.len() as u8);
        wasm.extend(section);
        wasm
    }

    fn instantiate(wasm: &[u8], limit: usize) -> wasmtime::Result<usize> {
        let engine = wasmtime::Engine::default();
        let module = wasmtime::Module::new(&engine, wasm)?;
        let mut store = wasmtime::Store::new(&engine, MemoryLimiter::new(limit));
        store.limiter(|l| l);
        wasmtime::Instance::new(&mut store, &module, &[])?;
        Ok(store.data().peak)
    }

    #[test]
    fn the_memory_limit_covers_all_memories_together() {
        const PAGE: usize = 64 << 10;
        // Two memories of two pages: four pages in all, the high-water mark.
        assert_eq!(
            instantiate(&module_with_memories(2, 2), 4 * PAGE).unwrap(),
            4 * PAGE
        );
        // Each would fit alone; together they do not.
        let err = instantiate(&module_with_memories(2, 2), 3 * PAGE).unwrap_err();
        assert!(format!("{err:#}").contains("memory"), "{err:#}");
    }

    #[test]
    fn an_instance_may_have_only_so_many_memories() {
        assert!(instantiate(&module_with_memories(MAX_MEMORIES as u8, 0), 1 << 20).is_ok());
        let err =
            instantiate(&module_with_memories(MAX_MEMORIES as u8 + 24, 0), 1 << 20).unwrap_err();
        assert!(format!("{err:#}").contains("memor"), "{err:#}");
    }

    #[test]
    fn log_lines_are_escaped_and_cut() {
        assert_eq!(log_line("a\nb\u{7}c"), "a\\nb\\u{7}c");
        let long = "x".repeat(MAX_LOG_MESSAGE + 10);
        let line = log_line(&long);
        assert!(line.starts_with(&"x".repeat(MAX_LOG_MESSAGE)));
        assert!(line.ends_with("… (10 more bytes cut)"), "{line}");
    }
}
