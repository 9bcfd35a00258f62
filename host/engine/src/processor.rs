//! The engine's view of a processor: something that can be instantiated per partition and
//! called key by key. The WebAssembly runtime is the real implementation; the benchmark
//! also plugs in native Rust logic to measure the sandbox's cost.

use statebox_runtime::{
    BatchFailure, BatchTimes, CallError, Instance, InstanceConfig, KeyRows, Processor,
    ProcessorInfo, TimeMode, each_entry,
};
use statebox_state::PartitionTxn;
use statebox_state::catalog::{Catalog, Described};

/// A processor instance serving one partition.
pub trait PartitionProcessor: Send {
    /// Lends the instance the partition's transaction for a batch.
    fn begin_batch(&mut self, txn: PartitionTxn, times: BatchTimes);
    /// Handles all rows of one key; returns the emitted rows (JSON objects).
    fn handle_input_rows(&mut self, key: &str, rows: &[&str]) -> Result<Vec<String>, CallError>;
    /// Handles one expired timer of a key; returns the emitted rows.
    fn handle_expired_timer(&mut self, key: &str, expiry_ms: i64)
    -> Result<Vec<String>, CallError>;
    /// Applies one initial-state row of a key.
    fn handle_initial_state(&mut self, key: &str, row: &str) -> Result<(), CallError>;
    /// Handles the rows of several keys; entry `i` of the result holds the rows emitted for
    /// `groups[i]`. By default one `handle_input_rows` call per key.
    fn handle_input_batch(
        &mut self,
        groups: &[KeyRows<'_>],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        each_entry(groups, |g| self.handle_input_rows(g.key, g.rows))
    }
    /// Handles one expired timer of each of several distinct keys; entry `i` of the result
    /// holds the rows emitted for `timers[i]`. By default one `handle_expired_timer` call
    /// per timer.
    fn handle_expired_timers(
        &mut self,
        timers: &[(&str, i64)],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        each_entry(timers, |&(key, ts)| self.handle_expired_timer(key, ts))
    }
    /// The lent transaction, for the engine's work between calls (timers, TTL).
    fn txn_mut(&mut self) -> Option<&mut PartitionTxn>;
    /// Takes the transaction back.
    fn end_batch(&mut self) -> Option<PartitionTxn>;
    /// Whether the instance must be replaced before the next call.
    fn is_poisoned(&self) -> bool;
}

/// Creates [`PartitionProcessor`]s.
pub trait ProcessorFactory: Send + Sync {
    /// What the processor declared about itself.
    fn info(&self) -> &ProcessorInfo;
    /// Runs `init` in describe mode against a trial copy of `catalog`: what it declares and
    /// whether it succeeds, without touching any state.
    fn describe_init(&self, time_mode: TimeMode, catalog: &Catalog)
    -> Result<Described, CallError>;
    /// Creates an instance for one partition and runs its `init`.
    fn instantiate(&self, config: InstanceConfig)
    -> Result<Box<dyn PartitionProcessor>, CallError>;
}

impl ProcessorFactory for Processor {
    fn info(&self) -> &ProcessorInfo {
        Processor::info(self)
    }

    fn describe_init(
        &self,
        time_mode: TimeMode,
        catalog: &Catalog,
    ) -> Result<Described, CallError> {
        Processor::describe_init(self, time_mode, catalog)
    }

    fn instantiate(
        &self,
        config: InstanceConfig,
    ) -> Result<Box<dyn PartitionProcessor>, CallError> {
        Ok(Box::new(Processor::instantiate(self, config)?))
    }
}

impl PartitionProcessor for Instance {
    fn begin_batch(&mut self, txn: PartitionTxn, times: BatchTimes) {
        Instance::begin_batch(self, txn, times)
    }

    fn handle_input_rows(&mut self, key: &str, rows: &[&str]) -> Result<Vec<String>, CallError> {
        Instance::handle_input_rows(self, key, rows)
    }

    fn handle_expired_timer(
        &mut self,
        key: &str,
        expiry_ms: i64,
    ) -> Result<Vec<String>, CallError> {
        Instance::handle_expired_timer(self, key, expiry_ms)
    }

    fn handle_initial_state(&mut self, key: &str, row: &str) -> Result<(), CallError> {
        Instance::handle_initial_state(self, key, row)
    }

    fn handle_input_batch(
        &mut self,
        groups: &[KeyRows<'_>],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        Instance::handle_input_batch(self, groups)
    }

    fn handle_expired_timers(
        &mut self,
        timers: &[(&str, i64)],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        Instance::handle_expired_timers(self, timers)
    }

    fn txn_mut(&mut self) -> Option<&mut PartitionTxn> {
        Instance::txn_mut(self)
    }

    fn end_batch(&mut self) -> Option<PartitionTxn> {
        Instance::end_batch(self)
    }

    fn is_poisoned(&self) -> bool {
        Instance::is_poisoned(self)
    }
}
