//! Per-call metering as a hook: whoever accounts for processor calls (the server: per-tenant
//! CPU and memory, a pipeline's per-batch CPU budget) implements [`CallMeter`] and wraps its
//! factory in [`Metered`]; the wrapping of every call is written once, here.

use statebox_state::catalog::{Catalog, Described};

use crate::budget::thread_cpu_ns;
use crate::call::{BatchFailure, CallError, CallErrorKind, Function, KeyRows};
use crate::processor::{
    InstanceConfig, PartitionBatch, PartitionProcessor, ProcessorFactory, ProcessorInfo,
};
use crate::time::TimeMode;

/// Accounts for the calls of a processor's instances.
pub trait CallMeter: Clone + Send + Sync + 'static {
    /// Before every call: `Err(reason)` refuses it, and the call fails as the processor's
    /// ([`CallErrorKind::Failed`]) with `reason`, without running. By default admits all.
    fn admit(&self) -> Result<(), String> {
        Ok(())
    }

    /// After every call, and after each instantiation ([`Function::Init`]): the calling
    /// thread's CPU time the call took, and the instance's memory high-water mark (0 when
    /// instantiation failed).
    fn record(&self, function: Function, cpu_ns: u64, memory_high_water_bytes: usize);
}

/// A processor whose instances' calls are reported to a [`CallMeter`].
pub struct Metered<F, M> {
    /// The processor.
    pub inner: F,
    /// Where its calls are reported.
    pub meter: M,
}

impl<F: ProcessorFactory, M: CallMeter> ProcessorFactory for Metered<F, M> {
    fn info(&self) -> &ProcessorInfo {
        self.inner.info()
    }

    /// Not metered: describing runs on a request thread, outside any pipeline's batch.
    fn describe_init(
        &self,
        time_mode: TimeMode,
        catalog: &Catalog,
    ) -> Result<Described, CallError> {
        self.inner.describe_init(time_mode, catalog)
    }

    fn instantiate(
        &self,
        config: InstanceConfig,
    ) -> Result<Box<dyn PartitionProcessor>, CallError> {
        let started = thread_cpu_ns();
        let instance = self.inner.instantiate(config);
        let spent = thread_cpu_ns().saturating_sub(started);
        let memory = instance.as_ref().map_or(0, |i| i.memory_high_water_bytes());
        self.meter.record(Function::Init, spent, memory);
        Ok(Box::new(MeteredInstance {
            inner: instance?,
            name: self.inner.info().name.clone(),
            meter: self.meter.clone(),
        }))
    }
}

struct MeteredInstance<M> {
    inner: Box<dyn PartitionProcessor>,
    name: String,
    meter: M,
}

impl<M: CallMeter> MeteredInstance<M> {
    /// Runs `call` if the meter admits it, and reports what it cost. A refused call is
    /// attributed to `key`, the first key it would have served.
    fn metered<T, E: From<CallError>>(
        &mut self,
        function: Function,
        key: &str,
        call: impl FnOnce(&mut dyn PartitionProcessor) -> Result<T, E>,
    ) -> Result<T, E> {
        if let Err(reason) = self.meter.admit() {
            return Err(E::from(CallError {
                processor: self.name.clone(),
                function,
                key: Some(key.to_owned()),
                kind: CallErrorKind::Failed(reason),
            }));
        }
        let started = thread_cpu_ns();
        let result = call(&mut *self.inner);
        let spent = thread_cpu_ns().saturating_sub(started);
        self.meter
            .record(function, spent, self.inner.memory_high_water_bytes());
        result
    }
}

impl<M: CallMeter> PartitionProcessor for MeteredInstance<M> {
    fn handle_input_batch(
        &mut self,
        batch: &mut PartitionBatch,
        groups: &[KeyRows<'_>],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        let first = groups.first().map_or("", |g| g.key);
        self.metered(Function::HandleInputRows, first, |i| {
            i.handle_input_batch(batch, groups)
        })
    }

    fn handle_expired_timers(
        &mut self,
        batch: &mut PartitionBatch,
        timers: &[(&str, i64)],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        let first = timers.first().map_or("", |t| t.0);
        self.metered(Function::HandleExpiredTimer, first, |i| {
            i.handle_expired_timers(batch, timers)
        })
    }

    fn handle_initial_state(
        &mut self,
        batch: &mut PartitionBatch,
        key: &str,
        row: &str,
    ) -> Result<(), CallError> {
        self.metered(Function::HandleInitialState, key, |i| {
            i.handle_initial_state(batch, key, row)
        })
    }

    fn start_batch(&mut self) {
        self.inner.start_batch()
    }

    fn memory_high_water_bytes(&self) -> usize {
        self.inner.memory_high_water_bytes()
    }

    fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use statebox_schema::Schema;
    use statebox_state::Checkpoint;

    use super::*;
    use crate::time::BatchTimes;

    /// Emits one row per key and claims a fixed memory high-water mark; burns a little CPU
    /// so the meter has something to measure.
    struct Echo(ProcessorInfo);

    struct EchoInstance;

    impl PartitionProcessor for EchoInstance {
        fn handle_input_batch(
            &mut self,
            batch: &mut PartitionBatch,
            groups: &[KeyRows<'_>],
        ) -> Result<Vec<Vec<String>>, BatchFailure> {
            // Touches the transaction: the batch's one slot is reachable from a call.
            batch.txn();
            let mut x = 0u64;
            for i in 0..200_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            Ok(groups
                .iter()
                .map(|g| vec![format!("{{\"key\":{},\"n\":{}}}", g.key, g.rows.len())])
                .collect())
        }

        fn memory_high_water_bytes(&self) -> usize {
            4096
        }
    }

    impl ProcessorFactory for Echo {
        fn info(&self) -> &ProcessorInfo {
            &self.0
        }
        fn describe_init(&self, _: TimeMode, _: &Catalog) -> Result<Described, CallError> {
            Ok(Described::default())
        }
        fn instantiate(&self, _: InstanceConfig) -> Result<Box<dyn PartitionProcessor>, CallError> {
            Ok(Box::new(EchoInstance))
        }
    }

    /// Records every report; refuses calls once `refuse` is set.
    #[derive(Clone, Default)]
    struct Log {
        calls: Arc<Mutex<Vec<(Function, u64, usize)>>>,
        refuse: Arc<Mutex<Option<String>>>,
    }

    impl CallMeter for Log {
        fn admit(&self) -> Result<(), String> {
            match self.refuse.lock().unwrap().clone() {
                Some(reason) => Err(reason),
                None => Ok(()),
            }
        }
        fn record(&self, function: Function, cpu_ns: u64, memory: usize) {
            self.calls.lock().unwrap().push((function, cpu_ns, memory));
        }
    }

    fn metered() -> (Metered<Echo, Log>, Log) {
        let info = ProcessorInfo {
            name: "echo".into(),
            output_schema: Schema::parse_ddl("key string, n long").unwrap(),
            input_schema: None,
            output_event_time_column: None,
        };
        let log = Log::default();
        let metered = Metered {
            inner: Echo(info),
            meter: log.clone(),
        };
        (metered, log)
    }

    fn batch(checkpoint: &Checkpoint) -> PartitionBatch {
        let times = BatchTimes {
            batch_id: 0,
            batch_timestamp_ms: 0,
            watermark_ms: -1,
        };
        PartitionBatch::new(checkpoint.txn(0), times)
    }

    #[test]
    fn every_call_and_instantiation_is_reported_with_its_cpu_and_memory() {
        let (factory, log) = metered();
        let checkpoint = Checkpoint::in_memory();
        let mut instance = factory
            .instantiate(InstanceConfig::detached(TimeMode::None))
            .unwrap();
        let mut batch = batch(&checkpoint);
        let rows = ["{}", "{}"];
        let out = instance
            .handle_input_batch(
                &mut batch,
                &[KeyRows {
                    key: "[\"a\"]",
                    rows: &rows,
                }],
            )
            .unwrap();
        assert_eq!(out, vec![vec!["{\"key\":[\"a\"],\"n\":2}".to_owned()]]);
        // A default method is metered too: it is a call the engine made.
        instance
            .handle_expired_timers(&mut batch, &[("[\"a\"]", 5)])
            .unwrap();
        let calls = log.calls.lock().unwrap().clone();
        let functions: Vec<Function> = calls.iter().map(|c| c.0).collect();
        assert_eq!(
            functions,
            [
                Function::Init,
                Function::HandleInputRows,
                Function::HandleExpiredTimer
            ]
        );
        assert!(calls[1].1 > 0, "the input call burned CPU: {calls:?}");
        assert!(calls[1..].iter().all(|c| c.2 == 4096), "{calls:?}");
    }

    #[test]
    fn a_refused_call_fails_as_the_processor_without_running() {
        let (factory, log) = metered();
        let checkpoint = Checkpoint::in_memory();
        let mut instance = factory
            .instantiate(InstanceConfig::detached(TimeMode::None))
            .unwrap();
        *log.refuse.lock().unwrap() = Some("over budget".into());
        let rows = ["{}"];
        let failure = instance
            .handle_input_batch(
                &mut batch(&checkpoint),
                &[KeyRows {
                    key: "[\"k\"]",
                    rows: &rows,
                }],
            )
            .unwrap_err();
        assert_eq!(failure.entry, None);
        assert_eq!(failure.error.processor, "echo");
        assert_eq!(failure.error.key.as_deref(), Some("[\"k\"]"));
        assert!(matches!(&failure.error.kind, CallErrorKind::Failed(m) if m == "over budget"));
        assert!(!failure.error.poisons_instance());
        // Only the instantiation was reported: the refused call never ran.
        assert_eq!(log.calls.lock().unwrap().len(), 1);
    }
}
