//! A live [`Instance`]: its export calls, run under the deadline and the sandbox, and the
//! checks of what they return (output limit, output schema, watermark). It implements the
//! contract's [`PartitionProcessor`]: every call holds the batch's transaction in the store
//! for its length (the host functions reach only what the store owns) and gives it back.

use std::sync::Arc;

use statebox_state::catalog::Described;
use wasmtime::Store;

use crate::bindings::exports::statebox::processor::batch_processor as batch_guest;
use crate::bindings::exports::statebox::processor::processor as guest;
use crate::bindings::statebox::processor::types::TimeMode as WitTimeMode;
use crate::driver::Driver;
use crate::host::HostState;
use crate::load::{BatchBudgetExceeded, Exports, Live};
use crate::{
    BatchFailure, CallError, CallErrorKind, Function, KeyRows, PartitionBatch, PartitionProcessor,
    ProcessorInfo, TimeMode, each_entry, positional, sandbox,
};

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
    pub(crate) fn new(
        store: Store<HostState>,
        live: Live,
        info: Arc<ProcessorInfo>,
        event_time_column: Option<String>,
        positional: bool,
    ) -> Instance {
        Instance {
            store,
            bindings: live.exports,
            driver: live.driver,
            info,
            poisoned: false,
            event_time_column,
            positional,
        }
    }

    /// Calls `init`, declarations only.
    pub(crate) fn init(&mut self, time_mode: TimeMode) -> Result<(), CallError> {
        self.store.data_mut().begin_init();
        let result = guest_call!(*self, Function::Init, None, |b, s| b
            .processor
            .call_init(s, wit_time_mode(time_mode)));
        self.store.data_mut().end_call();
        result
    }

    /// What `init` declared and deleted in describe mode.
    pub(crate) fn take_described(&mut self) -> Described {
        self.store.data_mut().take_described()
    }

    /// Whether a trap made this instance unusable; the engine must instantiate a new one.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// The largest linear memory the instance has been granted so far, in bytes: its
    /// memory high-water mark (for per-tenant accounting).
    pub fn memory_high_water_bytes(&self) -> usize {
        self.store.data().memory_high_water_bytes()
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
