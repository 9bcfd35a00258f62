//! The Statebox runtime: runs stateful processor components in a wasmtime sandbox.
//!
//! A [`Runtime`] owns the wasmtime engine and a cache of compiled components. Loading a
//! component gives a [`Processor`]: checked against the `stateful-processor` world and
//! described (name, schemas). A processor is instantiated once per state partition into an
//! [`Instance`]. Both implement the processor contract (`statebox-contract`):
//! [`Processor`] is a [`ProcessorFactory`], [`Instance`] a [`PartitionProcessor`], which the
//! engine drives batch by batch; each call holds the batch's transaction in the instance's
//! store for its length (host functions reach only what the store owns) and gives it back.
//!
//! Architecture Invariant: every state and timer import acts on the key of the call in
//! progress, which only the host sets. The guest never names a key, so per-key isolation
//! holds whatever the guest does.

mod bindings;
mod driver;
mod host;
mod http;
mod positional;
mod sandbox;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use statebox_contract::{
    BatchFailure, BatchTimes, CallError, CallErrorKind, CpuBudget, Function, InstanceConfig,
    KeyRows, PartitionBatch, PartitionProcessor, ProcessorFactory, ProcessorInfo, TimeMode,
    each_entry, thread_cpu_ns,
};
use statebox_schema::Schema;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker, ResourceTable};
use wasmtime::{Engine, Store, UpdateDeadline};

use crate::bindings::StatefulBatchProcessor;
use crate::bindings::exports::statebox::processor::batch_processor as batch_guest;
use crate::bindings::exports::statebox::processor::processor as guest;
use crate::bindings::statebox::processor::types::TimeMode as WitTimeMode;
use crate::driver::Driver;
use crate::host::HostState;
pub use crate::http::HttpHost;
pub use crate::sandbox::Limits;
use statebox_state::catalog::{self, Catalog};

/// Runs one export call of an [`Instance`] under its deadline and sandbox:
/// `|bindings, store| future` is the generated `call_*` of the export. Evaluates to
/// `Result<R, CallError>`, `R` being what the export returns.
macro_rules! guest_invoke {
    ($instance:expr, $function:expr, $key:expr, |$b:ident, $s:ident| $call:expr) => {{
        let instance: &mut Instance = &mut $instance;
        let (function, key) = ($function, $key);
        match instance.start_invoke(function, key) {
            Err(e) => Err(e),
            Ok(()) => {
                let $b = &instance.bindings;
                let $s = &mut instance.store;
                let outcome = instance.driver.run($call);
                instance.finish_invoke(function, key, outcome)
            }
        }
    }};
}

/// Like [`guest_invoke!`], for exports that return `result<T, processor-error>`: the
/// processor's error becomes a [`CallError`] too.
macro_rules! guest_call {
    ($instance:expr, $function:expr, $key:expr, |$b:ident, $s:ident| $call:expr) => {{
        let (function, key) = ($function, $key);
        match guest_invoke!($instance, function, key, |$b, $s| $call) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err($instance.guest_error(function, key, e)),
            Err(e) => Err(e),
        }
    }};
}
/// The fully qualified name of the world every processor must implement.
pub const WORLD: &str = "statebox:processor/stateful-processor@0.1.0";
/// The world of processors that also take many keys per call (`batch-processor`).
pub const BATCH_WORLD: &str = "statebox:processor/stateful-batch-processor@0.1.0";

/// Failures to load a processor component: the tenant's file is at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read processor {path}: {source}")]
    Read {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not a WebAssembly component, or not one that implements the world.
    #[error("invalid processor component: {0}")]
    Invalid(String),
    /// The processor's `describe` trapped or returned unusable schemas.
    #[error("processor `describe` failed: {0}")]
    Describe(String),
}

/// Settings of a [`Runtime`].
#[derive(Clone, Debug, Default)]
pub struct RuntimeConfig {
    /// Where compiled components are cached by content hash; `None` disables the disk cache.
    pub cache_dir: Option<PathBuf>,
    /// Sandbox limits applied to every call.
    pub limits: Limits,
    /// Call processors key by key even when they export `batch-processor` (for comparing
    /// the two; batched calls are faster).
    pub per_key_calls: bool,
}

/// The wasmtime engine, the linker with the host imports, and the compiled-component cache.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    config: RuntimeConfig,
    tokio: Arc<TokioRuntime>,
    _ticker: sandbox::EpochTicker,
}

/// The tokio runtime guest calls are driven on: its timers bound guests blocked in host
/// calls, and its worker drives outbound HTTP connections. Shared by every processor and
/// instance of a [`Runtime`], and shut down without blocking when the last one goes (it may
/// be dropped inside another runtime, e.g. the server's).
struct TokioRuntime(Option<tokio::runtime::Runtime>);

impl TokioRuntime {
    fn handle(&self) -> tokio::runtime::Handle {
        self.0
            .as_ref()
            .expect("runtime present until drop")
            .handle()
            .clone()
    }
}

impl Drop for TokioRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Runtime {
    /// Creates a runtime. Starts one background thread that advances the epoch used for
    /// CPU deadlines.
    pub fn new(config: RuntimeConfig) -> anyhow::Result<Runtime> {
        let engine = sandbox::engine()?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        // The guest's clocks are virtual, and so are their pollables: a sleep takes no real
        // time (wasmtime-wasi's monotonic clock, linked above, would wait in real time).
        linker.allow_shadowing(true);
        wasmtime_wasi::p2::bindings::clocks::monotonic_clock::add_to_linker::<
            HostState,
            HasSelf<HostState>,
        >(&mut linker, |s| s)?;
        linker.allow_shadowing(false);
        // Always linked, so a processor that imports wasi:http loads; every request is
        // checked against the processor's allow-list (`Limits::http_hosts`, empty by default).
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        StatefulBatchProcessor::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("statebox-io")
            .enable_all()
            .build()?;
        let ticker = sandbox::EpochTicker::start(engine.clone());
        Ok(Runtime {
            engine,
            linker,
            config,
            tokio: Arc::new(TokioRuntime(Some(tokio))),
            _ticker: ticker,
        })
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &Limits {
        &self.config.limits
    }

    /// Loads a processor from a `.wasm` file.
    pub fn load_file(&self, path: &Path) -> Result<Processor, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.load(&bytes)
    }

    /// Compiles (or fetches from the cache), checks and describes a processor component.
    pub fn load(&self, bytes: &[u8]) -> Result<Processor, LoadError> {
        self.load_with_limits(bytes, self.config.limits.clone())
    }

    /// Like [`load`](Self::load), but every call of the processor runs under `limits`
    /// instead of the runtime's: how a multi-tenant host applies each tenant's limits while
    /// sharing one engine and its compiled-component cache.
    pub fn load_with_limits(&self, bytes: &[u8], limits: Limits) -> Result<Processor, LoadError> {
        sandbox::check_component_header(bytes).map_err(LoadError::Invalid)?;
        let hash = blake3::hash(bytes).to_hex().to_string();
        let component = self.compile_cached(bytes, &hash)?;
        let instance_pre = self.linker.instantiate_pre(&component).map_err(|e| {
            LoadError::Invalid(format!(
                "it imports something the Statebox host does not provide \
                 (processors may import only world {WORLD} and WASI): {e:#}"
            ))
        })?;
        let mut pre = ExportsPre::new(instance_pre, self.tokio.clone())?;
        if self.config.per_key_calls {
            pre.batch = None;
        }
        let (info, positional) = describe(&pre, &limits)?;
        Ok(Processor {
            pre,
            hash,
            info: Arc::new(info),
            limits,
            positional,
        })
    }

    fn compile_cached(&self, bytes: &[u8], hash: &str) -> Result<Component, LoadError> {
        let cached = self
            .config
            .cache_dir
            .as_ref()
            .map(|dir| dir.join(format!("{hash}.cwasm")));
        if let Some(path) = cached.as_ref().filter(|p| p.exists()) {
            // SAFETY: the cache directory holds only artifacts this host compiled itself
            // (written below under the content hash of the source); wasmtime checks that
            // the artifact matches this engine's version and configuration.
            match unsafe { Component::deserialize_file(&self.engine, path) } {
                Ok(c) => return Ok(c),
                Err(e) => tracing::warn!(error = %e, "ignoring unusable cached component"),
            }
        }
        let component = Component::new(&self.engine, bytes)
            .map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        if let Some(Err(e)) = cached.as_ref().map(|path| write_cache(path, &component)) {
            tracing::warn!(error = %e, "could not cache compiled component");
        }
        Ok(component)
    }
}

fn write_cache(path: &Path, component: &Component) -> anyhow::Result<()> {
    let dir = path.parent().expect("cache path has a parent");
    std::fs::create_dir_all(dir)?;
    let tmp = tempfile_in(dir)?;
    std::fs::write(&tmp, component.serialize()?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn tempfile_in(dir: &Path) -> std::io::Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    Ok(dir.join(format!(".tmp-{}-{nanos}", std::process::id())))
}

/// A component ready to instantiate, with its exports looked up: `processor` always,
/// `batch-processor` if the component implements the batch world.
#[derive(Clone)]
struct ExportsPre {
    instance: InstancePre<HostState>,
    processor: guest::GuestIndices,
    batch: Option<batch_guest::GuestIndices>,
    tokio: Arc<TokioRuntime>,
}

/// A live instance's exports.
struct Exports {
    processor: guest::Guest,
    batch: Option<batch_guest::Guest>,
}

impl ExportsPre {
    fn new(
        instance: InstancePre<HostState>,
        tokio: Arc<TokioRuntime>,
    ) -> Result<ExportsPre, LoadError> {
        let processor = guest::GuestIndices::new(&instance).map_err(|e| {
            LoadError::Invalid(format!("it does not implement world {WORLD}: {e:#}"))
        })?;
        // A component that exports no `batch-processor` is a plain `stateful-processor`;
        // one that exports it must export it whole.
        let exports_batch = instance
            .component()
            .get_export_index(None, "statebox:processor/batch-processor@0.1.0")
            .is_some();
        let batch = if exports_batch {
            Some(batch_guest::GuestIndices::new(&instance).map_err(|e| {
                LoadError::Invalid(format!("it does not implement world {BATCH_WORLD}: {e:#}"))
            })?)
        } else {
            None
        };
        Ok(ExportsPre {
            instance,
            processor,
            batch,
            tokio,
        })
    }

    /// Instantiates the component in `store` (its start functions run under the store's
    /// deadline, like any call).
    fn instantiate(
        &self,
        store: &mut Store<HostState>,
        driver: &Driver,
    ) -> anyhow::Result<Exports> {
        let instance = driver
            .run(self.instance.instantiate_async(&mut *store))
            .ok_or_else(|| anyhow::anyhow!("instantiation waited past its deadline"))??;
        let processor = self.processor.load(&mut *store, &instance)?;
        let batch = match &self.batch {
            Some(indices) => Some(indices.load(&mut *store, &instance)?),
            None => None,
        };
        Ok(Exports { processor, batch })
    }
}

/// A compiled, checked processor component, ready to instantiate.
#[derive(Clone)]
pub struct Processor {
    pre: ExportsPre,
    hash: String,
    info: Arc<ProcessorInfo>,
    limits: Limits,
    /// The processor takes rows by position in batched calls (`positional-rows`).
    positional: bool,
}

impl Processor {
    /// What the processor declared about itself.
    pub fn info(&self) -> &ProcessorInfo {
        &self.info
    }

    /// Whether the component takes many keys per call (exports `batch-processor`).
    pub fn is_batched(&self) -> bool {
        self.pre.batch.is_some()
    }

    /// The limits every call of the processor runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The content hash (BLAKE3, hex) of the component.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    fn new_store(&self, config: &InstanceConfig) -> anyhow::Result<(Store<HostState>, Live)> {
        new_store(&self.pre, &self.limits, &self.info.name, config)
    }

    /// Runs `init` in describe mode against a trial copy of `catalog` and returns what it
    /// declared and deleted, with the outcome of each, and whether `init` succeeded: how the
    /// host learns a processor's state variables, and checks an upgrade, without data and
    /// without touching any checkpoint.
    pub fn describe_init(
        &self,
        time_mode: TimeMode,
        catalog: &Catalog,
    ) -> Result<catalog::Described, CallError> {
        let config = InstanceConfig::detached(time_mode);
        let (mut store, live) = self.new_store(&config).map_err(|e| CallError {
            processor: self.info.name.clone(),
            function: Function::Init,
            key: None,
            kind: CallErrorKind::Trap(format!("instantiation failed: {e:#}")),
        })?;
        store.data_mut().start_describing(catalog);
        store.data_mut().begin_init();
        let mut instance = Instance {
            store,
            bindings: live.exports,
            driver: live.driver,
            info: self.info.clone(),
            poisoned: false,
            event_time_column: None,
            positional: false,
        };
        let result = guest_call!(instance, Function::Init, None, |b, s| b
            .processor
            .call_init(s, wit_time_mode(time_mode)));
        instance.store.data_mut().end_call();
        let mut described = instance.store.data_mut().take_described();
        match result {
            Ok(()) => {}
            // A trap in init is the processor's bug, not a verdict on the upgrade.
            Err(e) if e.poisons_instance() => return Err(e),
            Err(e) => described.init_error = Some(e.kind.to_string()),
        }
        Ok(described)
    }

    /// Instantiates the processor for one partition and runs its `init`.
    pub fn instantiate(&self, config: InstanceConfig) -> Result<Instance, CallError> {
        let err = |kind| CallError {
            processor: self.info.name.clone(),
            function: Function::Init,
            key: None,
            kind,
        };
        let (store, live) = self
            .new_store(&config)
            .map_err(|e| err(CallErrorKind::Trap(format!("instantiation failed: {e:#}"))))?;
        let event_time_column = match config.time_mode {
            TimeMode::EventTime => config
                .output_event_time_column
                .clone()
                .or_else(|| self.info.output_event_time_column.clone()),
            _ => None,
        };
        let mut instance = Instance {
            store,
            bindings: live.exports,
            driver: live.driver,
            info: self.info.clone(),
            poisoned: false,
            event_time_column,
            positional: self.positional,
        };
        instance.store.data_mut().begin_init();
        let time_mode = config.time_mode;
        let result = guest_call!(instance, Function::Init, None, |b, s| b
            .processor
            .call_init(s, wit_time_mode(time_mode)));
        instance.store.data_mut().end_call();
        result?;
        Ok(instance)
    }
}

/// A live instance's exports and the driver of its calls.
struct Live {
    exports: Exports,
    driver: Driver,
}

/// A fresh store with the sandbox applied, and the instantiated component in it.
fn new_store(
    pre: &ExportsPre,
    limits: &Limits,
    name: &str,
    config: &InstanceConfig,
) -> anyhow::Result<(Store<HostState>, Live)> {
    let host = HostState::new(
        name.to_owned(),
        config.clone(),
        limits,
        ResourceTable::new(),
    );
    let driver = Driver::new(pre.tokio.handle(), host.deadline().clone());
    let mut store = Store::new(pre.instance.engine(), host);
    store.limiter(|s| &mut s.limits);
    // What the host copies out of the guest in one transfer (an import's arguments, an
    // export's results) is bounded by the instance's own memory limit: a list whose strings
    // all alias one buffer is charged for every copy, and traps once past the bound, before
    // the host allocates it.
    store.set_hostcall_fuel(limits.memory_bytes.max(1 << 20));
    store.epoch_deadline_callback(extend_deadline);
    store.set_epoch_deadline(limits.deadline_ticks());
    store.data_mut().start_call_deadline();
    let exports = pre.instantiate(&mut store, &driver)?;
    Ok((store, Live { exports, driver }))
}

/// The CPU deadline passed, or it is time to check the shared batch budget. A call traps
/// once its deadline passed: every key of a batched call gets a full budget from when it is
/// first selected (the store moves the deadline), so batching never shortens a key's
/// allowance, while a loop that selects no new key is stopped one budget after the last new
/// key. A shared batch budget ([`Limits::batch_cpu`]) binds across keys: it is checked every
/// [`sandbox::BUDGET_CHECK`] while the call runs.
fn extend_deadline(
    store: wasmtime::StoreContextMut<'_, HostState>,
) -> wasmtime::Result<UpdateDeadline> {
    let host = store.data();
    if host.batch_budget_exceeded() {
        return Err(wasmtime::Error::msg(BatchBudgetExceeded));
    }
    let mut left = host.deadline().left();
    if host.batch_budget().is_some() {
        left = left.min(sandbox::BUDGET_CHECK);
    }
    let ticks = (left.as_millis() / EPOCH_TICK.as_millis()) as u64;
    if ticks > 0 {
        return Ok(UpdateDeadline::Continue(ticks));
    }
    Err(wasmtime::Trap::Interrupt.into())
}

/// A call stopped because the shared batch CPU budget was used up.
#[derive(Debug)]
pub(crate) struct BatchBudgetExceeded;

impl fmt::Display for BatchBudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the batch used up its CPU budget")
    }
}

/// Calls a freshly instantiated component's `describe` and parses its schemas; also asks a
/// batched processor whether it takes rows by position.
fn describe(pre: &ExportsPre, limits: &Limits) -> Result<(ProcessorInfo, bool), LoadError> {
    let config = InstanceConfig::detached(TimeMode::None);
    let (mut store, live) =
        new_store(pre, limits, "", &config).map_err(|e| LoadError::Describe(format!("{e:#}")))?;
    let waited = || {
        LoadError::Describe(format!(
            "it waited in a host call past the time limit of {:?} per call",
            limits.call_timeout
        ))
    };
    store.data_mut().start_call_deadline();
    let raw = live
        .driver
        .run(live.exports.processor.call_describe(&mut store))
        .ok_or_else(waited)?
        .map_err(|e| LoadError::Describe(sandbox::describe_trap(&e, &store)))?;
    let positional = match &live.exports.batch {
        Some(batch) => {
            store.data_mut().start_call_deadline();
            live.driver
                .run(batch.call_positional_rows(&mut store))
                .ok_or_else(waited)?
                .map_err(|e| LoadError::Describe(sandbox::describe_trap(&e, &store)))?
        }
        None => false,
    };
    let parse = |what: &str, ddl: &str| {
        Schema::parse_ddl(ddl)
            .map_err(|e| LoadError::Describe(format!("invalid {what} schema `{ddl}`: {e}")))
    };
    let info = ProcessorInfo {
        output_schema: parse("output", &raw.output_schema)?,
        input_schema: raw
            .input_schema
            .as_deref()
            .map(|s| parse("input", s))
            .transpose()?,
        output_event_time_column: raw.output_event_time_column,
        name: raw.name,
    };
    Ok((info, positional))
}

/// A live processor instance serving one partition.
pub struct Instance {
    store: Store<HostState>,
    bindings: Exports,
    driver: Driver,
    info: Arc<ProcessorInfo>,
    poisoned: bool,
    /// The output event-time column checked against the watermark, in event-time mode.
    event_time_column: Option<String>,
    /// Batched calls may pass rows by position.
    positional: bool,
}

impl Instance {
    /// Whether a trap made this instance unusable; the engine must instantiate a new one.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// The largest linear memory the instance has been granted so far, in bytes: its
    /// memory high-water mark (for per-tenant accounting).
    pub fn memory_high_water_bytes(&self) -> usize {
        self.store.data().limits.peak
    }

    /// Whether the instance takes many keys per call (its component exports
    /// `batch-processor`).
    pub fn is_batched(&self) -> bool {
        self.bindings.batch.is_some()
    }

    /// Calls `handle-input-rows` for one key. Returns the emitted rows, checked against the
    /// output schema.
    fn input_rows(&mut self, key: &str, rows: &[&str]) -> Result<Vec<String>, CallError> {
        self.store.data_mut().begin_call(key);
        let tv = self.store.data().timer_values();
        let result = guest_call!(*self, Function::HandleInputRows, Some(key), |b, s| b
            .processor
            .call_handle_input_rows(s, key, rows, tv));
        self.store.data_mut().end_call();
        self.check_output(Function::HandleInputRows, key, result?)
    }

    /// Calls `handle-expired-timer` for one key and timer.
    fn expired_timer(&mut self, key: &str, expiry_ms: i64) -> Result<Vec<String>, CallError> {
        self.store.data_mut().begin_call(key);
        let tv = self.store.data().timer_values();
        let info = guest::ExpiredTimerInfo {
            expiry_time_ms: expiry_ms,
        };
        let result = guest_call!(*self, Function::HandleExpiredTimer, Some(key), |b, s| b
            .processor
            .call_handle_expired_timer(s, key, tv, info));
        self.store.data_mut().end_call();
        self.check_output(Function::HandleExpiredTimer, key, result?)
    }

    /// Handles the rows of several keys: one `handle-input-batch` call if the component
    /// exports `batch-processor`, else one `handle-input-rows` call per key. Entry `i` of
    /// the result holds the rows emitted for `groups[i]`, checked against the output schema.
    fn input_batch(&mut self, groups: &[KeyRows<'_>]) -> Result<Vec<Vec<String>>, BatchFailure> {
        if !self.is_batched() {
            return each_entry(groups, |g| self.input_rows(g.key, g.rows));
        }
        let positional = if self.positional {
            let rows: Vec<&[&str]> = groups.iter().map(|g| g.rows).collect();
            positional::transcode(&rows)
        } else {
            None
        };
        let by_position: Vec<[&str; 1]>;
        let columns: Option<Vec<&str>>;
        let entries: Vec<batch_guest::KeyRows<'_>> = match &positional {
            Some(p) => {
                columns = Some(p.columns.iter().map(String::as_str).collect());
                by_position = p.rows.iter().map(|rows| [rows.as_str()]).collect();
                groups
                    .iter()
                    .zip(&by_position)
                    .map(|(g, rows)| batch_guest::KeyRows { key: g.key, rows })
                    .collect()
            }
            None => {
                columns = None;
                groups
                    .iter()
                    .map(|g| batch_guest::KeyRows {
                        key: g.key,
                        rows: g.rows,
                    })
                    .collect()
            }
        };
        let keys = groups.iter().map(|g| g.key).collect::<Vec<_>>();
        let tv = self.open_batch_call(&keys);
        let result = guest_invoke!(*self, Function::HandleInputRows, None, |b, s| b
            .batch
            .as_ref()
            .expect("checked by is_batched")
            .call_handle_input_batch(s, &entries, columns.as_deref(), tv));
        self.close_batch_call(Function::HandleInputRows, &keys, result)
    }

    /// Handles one expired timer of each of several keys (`(key, expiry)`, each key at most
    /// once): one `handle-expired-timers` call if the component exports `batch-processor`,
    /// else one `handle-expired-timer` call per timer. Entry `i` of the result holds the
    /// rows emitted for `timers[i]`.
    fn expired_timers(&mut self, timers: &[(&str, i64)]) -> Result<Vec<Vec<String>>, BatchFailure> {
        if !self.is_batched() {
            return each_entry(timers, |&(key, ts)| self.expired_timer(key, ts));
        }
        let entries: Vec<batch_guest::KeyTimer<'_>> = timers
            .iter()
            .map(|&(key, ts)| batch_guest::KeyTimer {
                key,
                expired_timer_info: guest::ExpiredTimerInfo { expiry_time_ms: ts },
            })
            .collect();
        let keys = timers.iter().map(|t| t.0).collect::<Vec<_>>();
        let tv = self.open_batch_call(&keys);
        let result = guest_invoke!(*self, Function::HandleExpiredTimer, None, |b, s| b
            .batch
            .as_ref()
            .expect("checked by is_batched")
            .call_handle_expired_timers(s, &entries, tv));
        self.close_batch_call(Function::HandleExpiredTimer, &keys, result)
    }

    /// Starts a batched export call over entries with `keys`; returns its timer values.
    fn open_batch_call(&mut self, keys: &[&str]) -> guest::TimerValues {
        self.store
            .data_mut()
            .begin_batch_call(keys.iter().map(|k| (*k).to_owned()).collect());
        self.store.data().timer_values()
    }

    /// Ends a batched export call over entries with `keys`, and checks each entry's
    /// output. A failure is attributed to the entry the guest names, or for a trap to the
    /// entry it had selected.
    fn close_batch_call(
        &mut self,
        function: Function,
        keys: &[&str],
        result: Result<Result<Vec<Vec<String>>, batch_guest::BatchError>, CallError>,
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        let selected = self.store.data().selected_entry();
        self.store.data_mut().end_call();
        let at = |entry: Option<usize>, error| BatchFailure { entry, error };
        let outputs = match result {
            Ok(Ok(outputs)) => outputs,
            Ok(Err(e)) => {
                let entry = e.index as usize;
                let Some(key) = keys.get(entry) else {
                    return Err(at(
                        None,
                        self.error(
                            function,
                            None,
                            CallErrorKind::Failed(format!(
                                "the processor reported a failure of entry {entry} of a call \
                                 with {} entries: {}",
                                keys.len(),
                                processor_error(e.error)
                            )),
                        ),
                    ));
                };
                return Err(at(
                    Some(entry),
                    self.guest_error(function, Some(key), e.error),
                ));
            }
            Err(mut e) => {
                if e.key.is_none() {
                    e.key = selected.map(|i| keys[i].to_owned());
                }
                return Err(at(selected, e));
            }
        };
        if outputs.len() != keys.len() {
            return Err(at(
                None,
                self.error(
                    function,
                    None,
                    CallErrorKind::BadOutput(format!(
                        "a batched call with {} entries returned {} results",
                        keys.len(),
                        outputs.len()
                    )),
                ),
            ));
        }
        // The output limit binds the whole call, however many entries it has.
        let mut left = self.store.data().output_limit();
        outputs
            .into_iter()
            .zip(keys)
            .enumerate()
            .map(|(i, (rows, key))| {
                self.check_rows(function, key, rows, &mut left)
                    .map_err(|e| at(Some(i), e))
            })
            .collect()
    }

    /// Calls `handle-initial-state` for one key and initial-state row.
    fn initial_state(&mut self, key: &str, row: &str) -> Result<(), CallError> {
        self.store.data_mut().begin_call(key);
        let tv = self.store.data().timer_values();
        let result = guest_call!(*self, Function::HandleInitialState, Some(key), |b, s| b
            .processor
            .call_handle_initial_state(s, key, row, tv));
        self.store.data_mut().end_call();
        result.map(|_| ())
    }

    /// Runs `call` with the batch's transaction held by the store, where the host
    /// functions reach it, and gives it back to the batch afterwards, whatever the outcome.
    fn with_batch<T>(
        &mut self,
        batch: &mut PartitionBatch,
        call: impl FnOnce(&mut Instance) -> T,
    ) -> T {
        let times = batch.times();
        self.store.data_mut().lend(batch.lend(), times);
        let result = call(self);
        let txn = self
            .store
            .data_mut()
            .take_back()
            .expect("the store holds the lent transaction until the call is over");
        batch.restore(txn);
        result
    }

    /// Calls `close`. Errors are returned but the instance is gone either way.
    pub fn close(mut self) -> Result<(), CallError> {
        if self.poisoned {
            return Ok(());
        }
        self.store.data_mut().begin_close();
        let result = guest_call!(self, Function::Close, None, |b, s| b
            .processor
            .call_close(s));
        self.store.data_mut().end_call();
        result
    }

    /// Checks a call's output: the output limit, the output schema and (in event-time
    /// mode) the watermark.
    fn check_output(
        &self,
        function: Function,
        key: &str,
        rows: Vec<String>,
    ) -> Result<Vec<String>, CallError> {
        let mut left = self.store.data().output_limit();
        self.check_rows(function, key, rows, &mut left)
    }

    /// [`check_output`](Self::check_output) for one entry of a call that may emit `left`
    /// more bytes.
    fn check_rows(
        &self,
        function: Function,
        key: &str,
        mut rows: Vec<String>,
        left: &mut usize,
    ) -> Result<Vec<String>, CallError> {
        let limit = self.store.data().output_limit();
        for row in &mut rows {
            if row.len() > *left {
                return Err(self.error(
                    function,
                    Some(key),
                    CallErrorKind::BadOutput(format!(
                        "the call emitted more than the output limit of {limit} bytes"
                    )),
                ));
            }
            *left -= row.len();
            if let Err(e) = self
                .info
                .output_schema
                .validate(row, statebox_schema::Strictness::Strict)
            {
                return Err(self.error(
                    function,
                    Some(key),
                    CallErrorKind::BadOutput(format!(
                        "emitted row does not match the output schema `{}`: {e}",
                        self.info.output_schema.to_ddl()
                    )),
                ));
            }
            if let Some(column) = &self.event_time_column {
                let watermark = self.store.data().timer_values().current_watermark_ms;
                if let Err(message) = check_event_time(row, column, watermark) {
                    return Err(self.error(function, Some(key), CallErrorKind::BadOutput(message)));
                }
            }
            // The output is JSON Lines: a row the guest pretty-printed is re-encoded
            // compactly so it stays on one line.
            if row.contains(['\n', '\r']) {
                let value: serde_json::Value =
                    serde_json::from_str(row).expect("the row was validated as JSON");
                *row = value.to_string();
            }
        }
        Ok(rows)
    }

    fn error(&self, function: Function, key: Option<&str>, kind: CallErrorKind) -> CallError {
        CallError {
            processor: self.info.name.clone(),
            function,
            key: key.map(str::to_owned),
            kind,
        }
    }

    /// The report of an error the guest returned.
    fn guest_error(
        &self,
        function: Function,
        key: Option<&str>,
        e: guest::ProcessorError,
    ) -> CallError {
        let kind = match e {
            guest::ProcessorError::Failed(msg) => CallErrorKind::Failed(msg),
            guest::ProcessorError::BadInputRow(row) => CallErrorKind::BadInputRow {
                index: row.index,
                message: row.message,
            },
        };
        self.error(function, key, kind)
    }

    /// Starts an export call: refuses a poisoned instance, starts the call's deadline.
    fn start_invoke(&mut self, function: Function, key: Option<&str>) -> Result<(), CallError> {
        if self.poisoned {
            return Err(self.error(
                function,
                key,
                CallErrorKind::Trap("the instance trapped earlier and cannot be used".into()),
            ));
        }
        let ticks = self.store.data().deadline_ticks();
        self.store.set_epoch_deadline(ticks);
        self.store.data_mut().start_call_deadline();
        Ok(())
    }

    /// Ends an export call: a trap, or a guest abandoned while it waited in a host call
    /// (`None`), poisons the instance and becomes a [`CallError`].
    fn finish_invoke<R>(
        &mut self,
        function: Function,
        key: Option<&str>,
        outcome: Option<wasmtime::Result<R>>,
    ) -> Result<R, CallError> {
        let trap = match outcome {
            Some(Ok(v)) => return Ok(v),
            Some(Err(trap)) => trap,
            None => {
                self.poisoned = true;
                let reason = format!(
                    "waited in a host call (a sleep, poll or stream) past the time limit of \
                     {:?} per call",
                    self.store.data().call_timeout()
                );
                return Err(self.error(function, key, CallErrorKind::Trap(reason)));
            }
        };
        self.poisoned = true;
        let host = self.store.data_mut();
        let kind = match host.take_internal_error() {
            Some(e) => CallErrorKind::Internal(e),
            None => match (
                trap.downcast_ref::<BatchBudgetExceeded>(),
                host.batch_budget(),
            ) {
                (Some(_), Some(budget)) => CallErrorKind::Trap(format!(
                    "the batch used {} ms of CPU, more than its budget of {} ms",
                    budget.used_ns() / 1_000_000,
                    budget.limit_ns() / 1_000_000
                )),
                _ => CallErrorKind::Trap(sandbox::describe_trap(&trap, &self.store)),
            },
        };
        Err(self.error(function, key, kind))
    }
}

impl ProcessorFactory for Processor {
    fn info(&self) -> &ProcessorInfo {
        Processor::info(self)
    }

    fn describe_init(
        &self,
        time_mode: TimeMode,
        catalog: &Catalog,
    ) -> Result<catalog::Described, CallError> {
        Processor::describe_init(self, time_mode, catalog)
    }

    fn instantiate(
        &self,
        config: InstanceConfig,
    ) -> Result<Box<dyn PartitionProcessor>, CallError> {
        Ok(Box::new(Processor::instantiate(self, config)?))
    }
}

/// Every call takes the batch's transaction into the store for its length.
impl PartitionProcessor for Instance {
    /// One `handle-input-batch` call if the component exports `batch-processor`, else one
    /// `handle-input-rows` call per key; every entry's rows are checked against the output
    /// schema.
    fn handle_input_batch(
        &mut self,
        batch: &mut PartitionBatch,
        groups: &[KeyRows<'_>],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        self.with_batch(batch, |i| i.input_batch(groups))
    }

    /// One `handle-expired-timers` call if the component exports `batch-processor`, else
    /// one `handle-expired-timer` call per timer.
    fn handle_expired_timers(
        &mut self,
        batch: &mut PartitionBatch,
        timers: &[(&str, i64)],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        self.with_batch(batch, |i| i.expired_timers(timers))
    }

    fn handle_initial_state(
        &mut self,
        batch: &mut PartitionBatch,
        key: &str,
        row: &str,
    ) -> Result<(), CallError> {
        self.with_batch(batch, |i| i.initial_state(key, row))
    }

    fn start_batch(&mut self) {
        self.store.data_mut().start_batch();
    }

    fn memory_high_water_bytes(&self) -> usize {
        Instance::memory_high_water_bytes(self)
    }

    fn is_poisoned(&self) -> bool {
        Instance::is_poisoned(self)
    }
}

fn processor_error(e: guest::ProcessorError) -> String {
    match e {
        guest::ProcessorError::Failed(msg) => msg,
        guest::ProcessorError::BadInputRow(row) => {
            format!("input row {} rejected: {}", row.index, row.message)
        }
    }
}

/// Checks that an emitted row's event time is not older than the watermark.
fn check_event_time(row: &str, column: &str, watermark: i64) -> Result<(), String> {
    let scanner = statebox_schema::RowScanner::new(None, vec![column.to_owned()]);
    let value = scanner.scan(row).map_err(|e| e.to_string())?;
    let Some(raw) = value.first().copied().flatten() else {
        return Err(format!("emitted row has no event-time column `{column}`"));
    };
    let ts = statebox_schema::timestamp_millis(raw.get())
        .map_err(|e| format!("event-time column `{column}` of an emitted row: {e}"))?;
    if ts < watermark {
        return Err(format!(
            "emitted a row with event time {ts} in column `{column}`, older than the current \
             watermark {watermark}"
        ));
    }
    Ok(())
}

/// The contract's time mode as the WIT package spells it.
fn wit_time_mode(mode: TimeMode) -> WitTimeMode {
    match mode {
        TimeMode::None => WitTimeMode::None,
        TimeMode::ProcessingTime => WitTimeMode::ProcessingTime,
        TimeMode::EventTime => WitTimeMode::EventTime,
    }
}

/// How long the epoch ticker sleeps between ticks; the CPU deadline is measured in ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);
