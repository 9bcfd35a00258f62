//! One partition's share of a batch, on a worker thread: input rows key by key, then
//! expired timers in ascending time order, then TTL cleanup (SPEC §1).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use statebox_contract::{
    BatchFailure, BatchTimes, CallError, CallErrorKind, Function, InstanceConfig, KeyRows,
    PartitionBatch,
};
use statebox_state::catalog::Catalog;
use statebox_state::{Checkpoint, DueCursor, PartitionTxn, StoreError};

use crate::input::{Origin, PartitionInput};
use crate::{PartitionProcessor, ProcessorFactory, TimeMode};

/// Timers fetched from the store per round; handlers may add more, so the engine asks
/// again until none is due.
const TIMER_PAGE: usize = 1024;
/// A handler that keeps registering timers in the past would fire forever; past this many
/// firings per partition and batch the batch fails.
const MAX_TIMER_FIRINGS: u64 = 10_000_000;
/// At most this many keys go to one batched call (processors that export
/// `batch-processor`; others are called key by key)...
const CALL_KEYS: usize = 256;
/// ... and at most about this many bytes of rows: a call's rows are copied into the guest's
/// memory at once. A key's rows always go in one call, however large.
const CALL_BYTES: usize = 4 << 20;

/// Most variables per key the write buffer is sized for at the start of a batch: a
/// processor with more rarely writes them all for every key, and the buffer grows anyway.
const RESERVED_VARS_PER_KEY: usize = 4;

/// A partition's work in one batch.
pub(crate) struct Job {
    pub partition: u16,
    pub instance: Option<Box<dyn PartitionProcessor>>,
    pub input: PartitionInput,
    /// Initial-state rows, applied before the input (first batch of a new query only).
    pub initial: PartitionInput,
}

/// A partition's successful batch.
pub(crate) struct PartitionResult {
    pub txn: PartitionTxn,
    pub rows: Vec<String>,
    pub timers_fired: u64,
    pub ttl_removed: u64,
    /// Wall time of firing timers, in milliseconds.
    pub timers_ms: u64,
    /// Wall time of TTL cleanup, in milliseconds.
    pub ttl_ms: u64,
}

/// What a partition accumulates while its batch runs.
#[derive(Default)]
struct Counts {
    rows: Vec<String>,
    timers_fired: u64,
    ttl_removed: u64,
    timers_ms: u64,
    ttl_ms: u64,
}

/// Why a partition's batch failed, by whose fault: a processor call (with the input row
/// it rejected, when it names one), or the engine's own work on the state store (firing
/// timers, TTL cleanup), which is no call of the processor's.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A processor call failed.
    Call(CallError, Option<Origin>),
    /// The store failed under the engine's own timer or TTL work.
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(e)
    }
}

/// The instance (to keep, unless poisoned) and the result of one partition.
pub(crate) type Outcome = (
    u16,
    Option<Box<dyn PartitionProcessor>>,
    Result<PartitionResult, Failure>,
);

/// What every partition of a batch shares.
pub(crate) struct Context<'q> {
    pub checkpoint: &'q Checkpoint,
    pub factory: &'q dyn ProcessorFactory,
    pub catalog: &'q Arc<Mutex<Catalog>>,
    pub time_mode: TimeMode,
    pub output_event_time_column: Option<&'q str>,
    pub query_id: &'q str,
    pub run_id: &'q str,
    pub times: BatchTimes,
    /// Timers and TTL expiries up to this time were all handled by committed batches.
    pub time_floor: Option<i64>,
}

impl Context<'_> {
    /// The batch's timer and TTL clock.
    fn clock(&self) -> Option<i64> {
        self.time_mode
            .clock(self.times.batch_timestamp_ms, self.times.watermark_ms)
    }

    pub fn run(&self, job: Job) -> Outcome {
        let Job {
            partition,
            instance,
            input,
            initial,
        } = job;
        let mut instance = match instance {
            Some(i) => i,
            None => {
                let config = InstanceConfig {
                    time_mode: self.time_mode,
                    catalog: self.catalog.clone(),
                    partition,
                    output_event_time_column: self.output_event_time_column.map(str::to_owned),
                    query_id: self.query_id.to_owned(),
                    run_id: self.run_id.to_owned(),
                };
                match self.factory.instantiate(config) {
                    Ok(i) => i,
                    Err(e) => return (partition, None, Err(Failure::Call(e, None))),
                }
            }
        };
        let mut txn = self.checkpoint.txn(partition);
        // Room for a write of each declared variable (up to a few) and the timers of each of
        // the batch's keys, made once: growing the write buffer step by step rehashed it
        // each time.
        let vars = self.catalog.lock().map_or(0, |c| c.vars().count());
        txn.reserve(input.groups.len(), vars.min(RESERVED_VARS_PER_KEY));
        txn.set_time_floor(self.time_floor);
        // Reads hide, and writes expire against, the same clock timers fire against.
        txn.set_ttl_clock(self.clock());
        // The state the calls will read, read in one go where it is not in memory.
        if let Err(e) = txn.read_ahead(input.groups.iter().map(|g| g.key.as_bytes())) {
            return (partition, Some(instance), Err(Failure::Store(e)));
        }
        let mut batch = PartitionBatch::new(txn, self.times);
        instance.start_batch();
        let mut counts = Counts::default();
        let outcome = self
            .initial_state(&mut *instance, &mut batch, &initial)
            .and_then(|()| self.inputs(&mut *instance, &mut batch, &input, &mut counts.rows))
            .and_then(|()| {
                let started = Instant::now();
                let fired = self.timers(&mut *instance, &mut batch, &mut counts);
                counts.timers_ms = started.elapsed().as_millis() as u64;
                fired
            })
            .and_then(|()| {
                let started = Instant::now();
                let cleaned = self.ttl(batch.txn(), &mut counts);
                counts.ttl_ms = started.elapsed().as_millis() as u64;
                cleaned
            });
        let outcome = outcome.map(|()| {
            let mut txn = batch.into_txn();
            // Sorting and encoding the partition's writes here, on its worker, keeps the
            // single-threaded commit short.
            txn.seal();
            txn
        });
        let outcome = outcome.map(|txn| PartitionResult {
            txn,
            rows: counts.rows,
            timers_fired: counts.timers_fired,
            ttl_removed: counts.ttl_removed,
            timers_ms: counts.timers_ms,
            ttl_ms: counts.ttl_ms,
        });
        (partition, Some(instance), outcome)
    }

    /// One `handle-initial-state` call per initial-state row, in file order per key.
    fn initial_state(
        &self,
        instance: &mut dyn PartitionProcessor,
        batch: &mut PartitionBatch,
        initial: &PartitionInput,
    ) -> Result<(), Failure> {
        let rows = initial.rows();
        for group in &initial.groups {
            for (row, origin) in rows[group.rows.clone()].iter().zip(initial.origins(group)) {
                instance
                    .handle_initial_state(batch, &group.key, row)
                    .map_err(|e| Failure::Call(e, Some(*origin)))?;
            }
        }
        Ok(())
    }

    fn inputs(
        &self,
        instance: &mut dyn PartitionProcessor,
        batch: &mut PartitionBatch,
        input: &PartitionInput,
        rows: &mut Vec<String>,
    ) -> Result<(), Failure> {
        let texts = input.rows();
        let mut rest = &input.groups[..];
        while !rest.is_empty() {
            let mut bytes = 0;
            let take = rest
                .iter()
                .take(CALL_KEYS)
                .position(|g| {
                    bytes += texts[g.rows.clone()].iter().map(|r| r.len()).sum::<usize>();
                    bytes > CALL_BYTES
                })
                .unwrap_or(rest.len().min(CALL_KEYS))
                .max(1);
            let (chunk, next) = rest.split_at(take);
            rest = next;
            let calls: Vec<KeyRows<'_>> = chunk
                .iter()
                .map(|g| KeyRows {
                    key: &g.key,
                    rows: &texts[g.rows.clone()],
                })
                .collect();
            match instance.handle_input_batch(batch, &calls) {
                Ok(out) => rows.extend(out.into_iter().flatten()),
                Err(BatchFailure { entry, error }) => {
                    let origin = match (&error.kind, entry) {
                        (CallErrorKind::BadInputRow { index, .. }, Some(entry)) => {
                            input.origins(&chunk[entry]).get(*index as usize).copied()
                        }
                        _ => None,
                    };
                    return Err(Failure::Call(error, origin));
                }
            }
        }
        Ok(())
    }

    /// Fires every timer at or before the batch's time, ascending by (time, key). The
    /// firing timer stays registered during its handler (so `list-timers` shows it) and is
    /// deleted after the handler returns; timers registered by handlers that are already
    /// due fire in this batch too.
    fn timers(
        &self,
        instance: &mut dyn PartitionProcessor,
        batch: &mut PartitionBatch,
        result: &mut Counts,
    ) -> Result<(), Failure> {
        let Some(upto) = self.clock() else {
            return Ok(());
        };
        // Every timer of a page is fired or found deleted before the next page is read.
        let mut cursor = DueCursor::default();
        loop {
            let due = batch.txn().timers_due_from(upto, TIMER_PAGE, &mut cursor)?;
            if due.is_empty() {
                return Ok(());
            }
            let due = due
                .into_iter()
                .map(|(ts, key)| {
                    String::from_utf8(key)
                        .map(|key| (key, ts))
                        .map_err(|_| StoreError::Corrupt("timer key is not UTF-8".into()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            // The due timers go to the processor in runs of distinct keys, so one call can
            // serve many keys while each key's timers still fire one at a time, in order.
            let mut rest = &due[..];
            while !rest.is_empty() {
                let mut keys = HashSet::new();
                let run = rest
                    .iter()
                    .take(CALL_KEYS)
                    .take_while(|(key, _)| keys.insert(key.as_str()))
                    .count();
                let (candidates, next) = rest.split_at(run);
                rest = next;
                // An earlier handler may have deleted one of these timers; a deleted timer
                // never fires, whichever page of due timers it was fetched in. (Handlers act
                // on their own key only, and the run's keys are distinct, so checking the
                // whole run up front is the same as checking each timer just before it.)
                let mut timers = Vec::with_capacity(candidates.len());
                for (key, ts) in candidates {
                    if batch
                        .txn()
                        .due_timer_still_registered(key.as_bytes(), *ts)?
                    {
                        timers.push((key.as_str(), *ts));
                    }
                }
                if timers.is_empty() {
                    continue;
                }
                let out = instance
                    .handle_expired_timers(batch, &timers)
                    .map_err(|f| Failure::Call(f.error, None))?;
                result.rows.extend(out.into_iter().flatten());
                for (key, ts) in &timers {
                    batch.txn().timer_delete(key.as_bytes(), *ts)?;
                }
                result.timers_fired += timers.len() as u64;
                if result.timers_fired > MAX_TIMER_FIRINGS {
                    let key = timers.last().map(|(key, _)| (*key).to_owned());
                    return Err(Failure::Call(
                        CallError {
                            processor: self.factory.info().name.clone(),
                            function: Function::HandleExpiredTimer,
                            key,
                            kind: CallErrorKind::Failed(format!(
                                "more than {MAX_TIMER_FIRINGS} timers fired in one batch; the \
                                 processor keeps registering timers that are already due"
                            )),
                        },
                        None,
                    ));
                }
            }
        }
    }

    /// Removes state whose TTL has expired (reads already hid it).
    fn ttl(&self, txn: &mut PartitionTxn, result: &mut Counts) -> Result<(), Failure> {
        let Some(now) = self.clock() else {
            return Ok(());
        };
        result.ttl_removed = txn.ttl_cleanup(now)?;
        Ok(())
    }
}
