//! Per-tenant accounting around the runtime: CPU time of every processor call (the calling
//! thread's CPU clock), each instance's memory high-water mark, and the per-batch CPU
//! budget. Wraps the runtime's [`Processor`] as the engine's [`ProcessorFactory`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use statebox_engine::{PartitionProcessor, ProcessorFactory};
use statebox_runtime::{
    BatchFailure, BatchTimes, CallError, CallErrorKind, Function, Instance, InstanceConfig,
    KeyRows, Processor, ProcessorInfo, TimeMode,
};
use statebox_state::PartitionTxn;
use statebox_state::catalog::{Catalog, Described};

/// What a tenant's processors have used.
#[derive(Debug, Default)]
pub(crate) struct TenantUsage {
    /// CPU time spent in processor calls, in nanoseconds.
    pub cpu_ns: AtomicU64,
    /// The largest linear memory any of the tenant's instances reached, in bytes.
    pub memory_high_water: AtomicU64,
}

/// The CPU budget of one pipeline's current batch, shared by its partitions: the meter
/// charges it after each call, and the runtime checks it inside every call (the processor
/// was loaded with it as [`Limits::batch_cpu`](statebox_runtime::Limits::batch_cpu)).
pub(crate) use statebox_runtime::CpuBudget as BatchBudget;
pub(crate) use statebox_runtime::thread_cpu_ns;

/// A processor whose calls are accounted to a tenant and a pipeline's batch budget.
pub(crate) struct Metered {
    pub processor: Processor,
    pub usage: Arc<TenantUsage>,
    pub budget: Arc<BatchBudget>,
}

impl ProcessorFactory for Metered {
    fn info(&self) -> &ProcessorInfo {
        self.processor.info()
    }

    fn describe_init(
        &self,
        time_mode: TimeMode,
        catalog: &Catalog,
    ) -> Result<Described, CallError> {
        self.processor.describe_init(time_mode, catalog)
    }

    fn instantiate(
        &self,
        config: InstanceConfig,
    ) -> Result<Box<dyn PartitionProcessor>, CallError> {
        let started = thread_cpu_ns();
        let instance = self.processor.instantiate(config);
        self.usage
            .cpu_ns
            .fetch_add(thread_cpu_ns().saturating_sub(started), Ordering::Relaxed);
        let instance = instance?;
        let metered = MeteredInstance {
            instance,
            name: self.processor.info().name.clone(),
            usage: self.usage.clone(),
            budget: self.budget.clone(),
        };
        metered.record_memory();
        Ok(Box::new(metered))
    }
}

struct MeteredInstance {
    instance: Instance,
    name: String,
    usage: Arc<TenantUsage>,
    budget: Arc<BatchBudget>,
}

impl MeteredInstance {
    /// Refuses a call once the batch has used its CPU budget.
    fn check_budget(&self, function: Function, key: &str) -> Result<(), CallError> {
        let used = self.budget.used_ns();
        let limit = self.budget.limit_ns();
        if used <= limit {
            return Ok(());
        }
        Err(CallError {
            processor: self.name.clone(),
            function,
            key: Some(key.to_owned()),
            kind: CallErrorKind::Failed(format!(
                "the batch used {} ms of CPU, more than its budget of {} ms (tenant quota \
                 `batch_cpu_ms`)",
                used / 1_000_000,
                limit / 1_000_000
            )),
        })
    }

    fn metered<T, E: From<CallError>>(
        &mut self,
        function: Function,
        key: &str,
        call: impl FnOnce(&mut Instance) -> Result<T, E>,
    ) -> Result<T, E> {
        self.check_budget(function, key)?;
        let started = thread_cpu_ns();
        let result = call(&mut self.instance);
        let spent = thread_cpu_ns().saturating_sub(started);
        self.usage.cpu_ns.fetch_add(spent, Ordering::Relaxed);
        self.budget.charge(spent);
        self.record_memory();
        result
    }

    fn record_memory(&self) {
        let bytes = self.instance.memory_high_water_bytes() as u64;
        self.usage
            .memory_high_water
            .fetch_max(bytes, Ordering::Relaxed);
    }
}

impl PartitionProcessor for MeteredInstance {
    fn begin_batch(&mut self, txn: PartitionTxn, times: BatchTimes) {
        self.instance.begin_batch(txn, times)
    }

    fn handle_input_rows(&mut self, key: &str, rows: &[&str]) -> Result<Vec<String>, CallError> {
        self.metered(Function::HandleInputRows, key, |i| {
            i.handle_input_rows(key, rows)
        })
    }

    fn handle_expired_timer(
        &mut self,
        key: &str,
        expiry_ms: i64,
    ) -> Result<Vec<String>, CallError> {
        self.metered(Function::HandleExpiredTimer, key, |i| {
            i.handle_expired_timer(key, expiry_ms)
        })
    }

    fn handle_initial_state(&mut self, key: &str, row: &str) -> Result<(), CallError> {
        self.metered(Function::HandleInitialState, key, |i| {
            i.handle_initial_state(key, row)
        })
    }

    fn handle_input_batch(
        &mut self,
        groups: &[KeyRows<'_>],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        let first = groups.first().map_or("", |g| g.key);
        self.metered(Function::HandleInputRows, first, |i| {
            i.handle_input_batch(groups)
        })
    }

    fn handle_expired_timers(
        &mut self,
        timers: &[(&str, i64)],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        let first = timers.first().map_or("", |t| t.0);
        self.metered(Function::HandleExpiredTimer, first, |i| {
            i.handle_expired_timers(timers)
        })
    }

    fn txn_mut(&mut self) -> Option<&mut PartitionTxn> {
        self.instance.txn_mut()
    }

    fn end_batch(&mut self) -> Option<PartitionTxn> {
        self.instance.end_batch()
    }

    fn is_poisoned(&self) -> bool {
        self.instance.is_poisoned()
    }
}
