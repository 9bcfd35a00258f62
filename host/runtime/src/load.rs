//! A loaded component: its exports looked up ([`ExportsPre`]), described ([`describe`]) and
//! wrapped as a [`Processor`], the contract's [`ProcessorFactory`]; and the making of a
//! store with the sandbox applied ([`new_store`]), which every instance starts from.

use std::fmt;
use std::sync::Arc;

use statebox_schema::Schema;
use statebox_state::catalog::{self, Catalog};
use wasmtime::component::{InstancePre, ResourceTable};
use wasmtime::{Store, UpdateDeadline};

use crate::bindings::exports::statebox::processor::batch_processor as batch_guest;
use crate::bindings::exports::statebox::processor::processor as guest;
use crate::driver::Driver;
use crate::error::{InstantiateError, LoadError};
use crate::host::HostState;
use crate::instance::Instance;
use crate::runtime::TokioRuntime;
use crate::sandbox::{self, Limits};
use crate::{
    BATCH_WORLD, CallError, CallErrorKind, EPOCH_TICK, Function, InstanceConfig,
    PartitionProcessor, ProcessorFactory, ProcessorInfo, TimeMode, WORLD,
};

/// A component ready to instantiate, with its exports looked up: `processor` always,
/// `batch-processor` if the component implements the batch world.
#[derive(Clone)]
pub(crate) struct ExportsPre {
    instance: InstancePre<HostState>,
    processor: guest::GuestIndices,
    pub(crate) batch: Option<batch_guest::GuestIndices>,
    tokio: Arc<TokioRuntime>,
}

/// A live instance's exports.
pub(crate) struct Exports {
    pub(crate) processor: guest::Guest,
    pub(crate) batch: Option<batch_guest::Guest>,
}

impl ExportsPre {
    pub(crate) fn new(
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
    ) -> Result<Exports, InstantiateError> {
        let instance = driver
            .run(self.instance.instantiate_async(&mut *store))
            .ok_or(InstantiateError::WaitedPastDeadline)?
            .map_err(InstantiateError::Wasm)?;
        let processor = self
            .processor
            .load(&mut *store, &instance)
            .map_err(InstantiateError::Wasm)?;
        let batch = match &self.batch {
            Some(indices) => Some(
                indices
                    .load(&mut *store, &instance)
                    .map_err(InstantiateError::Wasm)?,
            ),
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
    pub(crate) fn new(
        pre: ExportsPre,
        hash: String,
        info: ProcessorInfo,
        limits: Limits,
        positional: bool,
    ) -> Processor {
        Processor {
            pre,
            hash,
            info: Arc::new(info),
            limits,
            positional,
        }
    }

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

    /// A fresh store and instance; a failure is reported as `init`'s, the first call an
    /// instance would have made.
    fn new_store(&self, config: &InstanceConfig) -> Result<(Store<HostState>, Live), CallError> {
        new_store(&self.pre, &self.limits, &self.info.name, config).map_err(|e| CallError {
            processor: self.info.name.clone(),
            function: Function::Init,
            key: None,
            kind: CallErrorKind::Trap(format!("instantiation failed: {e:#}")),
        })
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
        let (mut store, live) = self.new_store(&config)?;
        store.data_mut().start_describing(catalog);
        let mut instance = Instance::new(store, live, self.info.clone(), None, false);
        let result = instance.init(time_mode);
        let mut described = instance.take_described();
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
        let (store, live) = self.new_store(&config)?;
        let event_time_column = match config.time_mode {
            TimeMode::EventTime => config
                .output_event_time_column
                .clone()
                .or_else(|| self.info.output_event_time_column.clone()),
            _ => None,
        };
        let mut instance = Instance::new(
            store,
            live,
            self.info.clone(),
            event_time_column,
            self.positional,
        );
        instance.init(config.time_mode)?;
        Ok(instance)
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

/// A live instance's exports and the driver of its calls.
pub(crate) struct Live {
    pub(crate) exports: Exports,
    pub(crate) driver: Driver,
}

/// A fresh store with the sandbox applied, and the instantiated component in it.
fn new_store(
    pre: &ExportsPre,
    limits: &Limits,
    name: &str,
    config: &InstanceConfig,
) -> Result<(Store<HostState>, Live), InstantiateError> {
    let host = HostState::new(
        name.to_owned(),
        config.clone(),
        limits,
        ResourceTable::new(),
    );
    let driver = Driver::new(pre.tokio.handle(), host.deadline().clone());
    let mut store = Store::new(pre.instance.engine(), host);
    store.limiter(|s| s.memory_limiter());
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
pub(crate) fn describe(
    pre: &ExportsPre,
    limits: &Limits,
) -> Result<(ProcessorInfo, bool), LoadError> {
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
