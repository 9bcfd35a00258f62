//! The processor traits: what the engine asks of a processor, per query and per partition.

use std::sync::{Arc, Mutex};

use statebox_schema::Schema;
use statebox_state::catalog::{Catalog, Described};
use statebox_state::{Partition, PartitionTxn};

use crate::call::{BatchFailure, CallError, KeyRows};
use crate::time::{BatchTimes, TimeMode};

/// What a processor declared about itself, with its schemas parsed.
#[derive(Debug, Clone)]
pub struct ProcessorInfo {
    /// The processor's name.
    pub name: String,
    /// Schema of emitted rows.
    pub output_schema: Schema,
    /// Schema input rows are checked against, if declared.
    pub input_schema: Option<Schema>,
    /// The output column holding event time, if declared.
    pub output_event_time_column: Option<String>,
}

/// What an instance needs to know about the query it serves.
#[derive(Clone)]
pub struct InstanceConfig {
    /// The query's time mode.
    pub time_mode: TimeMode,
    /// The query's state variables, shared by all partitions' instances.
    pub catalog: Arc<Mutex<Catalog>>,
    /// The state partition this instance serves.
    pub partition: Partition,
    /// The output column holding event time (overrides the processor's own declaration).
    /// In event-time mode, emitting a row older than the watermark fails the call.
    pub output_event_time_column: Option<String>,
    /// The query's id, fixed when its checkpoint was created (`get-query-info`).
    pub query_id: String,
    /// This run's id, new each time the query starts (`get-query-info`).
    pub run_id: String,
}

impl InstanceConfig {
    /// A configuration for running a processor outside any query (describing it, a
    /// benchmark's lone instance): partition 0 of an empty catalog.
    pub fn detached(time_mode: TimeMode) -> InstanceConfig {
        InstanceConfig {
            time_mode,
            catalog: Arc::new(Mutex::new(Catalog::default())),
            partition: 0,
            output_event_time_column: None,
            query_id: String::new(),
            run_id: String::new(),
        }
    }
}

/// One partition's batch in progress: its state transaction and its times. The engine owns
/// it for the whole batch (its own work between calls, firing timers and TTL cleanup, reads
/// and writes the transaction here) and lends it to every processor call. The transaction
/// lives in this one slot, so there is no moment where the engine must ask a processor for it
/// back.
pub struct PartitionBatch {
    /// `None` only while a runtime holds the transaction inside a call ([`Self::lend`]).
    txn: Option<PartitionTxn>,
    times: BatchTimes,
}

impl PartitionBatch {
    /// A batch over `txn` with `times`.
    pub fn new(txn: PartitionTxn, times: BatchTimes) -> PartitionBatch {
        PartitionBatch {
            txn: Some(txn),
            times,
        }
    }

    /// The batch's times.
    pub fn times(&self) -> BatchTimes {
        self.times
    }

    /// The partition's transaction.
    ///
    /// # Panics
    /// While the transaction is [lent](Self::lend) and not yet [restored](Self::restore):
    /// a runtime that lends it must restore it before its call returns.
    pub fn txn(&mut self) -> &mut PartitionTxn {
        self.txn
            .as_mut()
            .expect("the batch's transaction is lent to a call that did not restore it")
    }

    /// Moves the transaction out for the length of one call, for a runtime whose host
    /// functions can only reach what its store owns (wasmtime's). Pair with
    /// [`restore`](Self::restore) before the call returns.
    ///
    /// # Panics
    /// If the transaction is already lent.
    pub fn lend(&mut self) -> PartitionTxn {
        self.txn
            .take()
            .expect("the batch's transaction is already lent")
    }

    /// Puts a [lent](Self::lend) transaction back.
    pub fn restore(&mut self, txn: PartitionTxn) {
        debug_assert!(
            self.txn.is_none(),
            "restoring a transaction that was not lent"
        );
        self.txn = Some(txn);
    }

    /// The transaction, to seal and commit once the batch is over.
    ///
    /// # Panics
    /// If the transaction is lent.
    pub fn into_txn(self) -> PartitionTxn {
        self.txn
            .expect("the batch's transaction is lent to a call that did not restore it")
    }
}

/// A processor instance serving one partition. One method is required, the call with the
/// rows of several keys; everything else has a no-op default, so a processor without timers
/// or initial state (a native test processor, a benchmark's) implements one method.
///
/// Every call gets the partition's [`PartitionBatch`]: a processor reads and writes state
/// through its transaction, for the key of the entry it is handling.
pub trait PartitionProcessor: Send {
    /// Handles the rows of several keys; entry `i` of the result holds the rows emitted for
    /// `groups[i]`. A failure names the entry it belongs to, if one.
    fn handle_input_batch(
        &mut self,
        batch: &mut PartitionBatch,
        groups: &[KeyRows<'_>],
    ) -> Result<Vec<Vec<String>>, BatchFailure>;

    /// Handles one expired timer of each of several distinct keys; entry `i` of the result
    /// holds the rows emitted for `timers[i]`. By default emits nothing.
    fn handle_expired_timers(
        &mut self,
        batch: &mut PartitionBatch,
        timers: &[(&str, i64)],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        let _ = batch;
        Ok(vec![Vec::new(); timers.len()])
    }

    /// Applies one initial-state row of a key. By default ignores it.
    fn handle_initial_state(
        &mut self,
        batch: &mut PartitionBatch,
        key: &str,
        row: &str,
    ) -> Result<(), CallError> {
        let _ = (batch, key, row);
        Ok(())
    }

    /// A new batch starts on this instance (per-batch limits start over).
    fn start_batch(&mut self) {}

    /// The largest memory the instance has been granted so far, in bytes (for per-tenant
    /// accounting); 0 when it does not know.
    fn memory_high_water_bytes(&self) -> usize {
        0
    }

    /// Whether the instance must be replaced before the next call (it trapped).
    fn is_poisoned(&self) -> bool {
        false
    }
}

/// Creates [`PartitionProcessor`]s: one processor, loaded once per query.
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
