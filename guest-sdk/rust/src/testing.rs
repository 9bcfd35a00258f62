//! Unit-testing processors natively, without wasm or a host. Like Spark's `TwsTester`.
//!
//! [`TestHarness`] runs a processor against an in-memory state store with the host's
//! semantics: state is isolated per grouping key, lists keep insertion order, maps iterate in
//! the order of their user keys' canonical JSON (compact, object members sorted by name),
//! empty lists and null elements are rejected, declaring state outside `init` or touching
//! state outside a handler fails with [`ErrorKind::WrongPhase`],
//! and timers and TTL follow the harness's clock. Values are stored as the JSON the host would
//! receive, so tests also check the processor's serde round trip.
//!
//! Time is driven by the test: [`TestHarness::set_processing_time`],
//! [`TestHarness::advance_processing_time`] and [`TestHarness::set_watermark`] move the clock,
//! and [`TestHarness::fire_expired_timers`] runs the handlers of the timers that are due, as
//! the host does at the end of a batch. The harness starts at processing time 0 (and
//! watermark 0 in event-time mode); a time that does not apply in the time mode reads as -1.
//!
//! Keys are given as any `Serialize` value: a tuple or array of the key columns
//! (`("u1", 7)`), or a single column value (`"u1"`), which the harness wraps in an array.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::mem::{Phase, SharedStore};
use crate::runtime::{decode_initial_state, decode_rows};
use crate::{
    Emitter, Error, ErrorKind, ExpiredTimerInfo, Handle, Key, Result, StatefulProcessor, TimeMode,
    TimerValues,
};

/// Runs a processor natively against in-memory state. See the [module docs](self).
///
/// Inspection methods ([`value_state`](Self::value_state) and friends) panic, like a failed
/// assertion, when the variable is not declared or its values do not decode as the asked type.
pub struct TestHarness<P: StatefulProcessor> {
    processor: Option<P>,
    store: SharedStore,
}

/// The JSON array of a key given as key columns or a single column value.
fn key_json<K: Serialize>(key: K) -> Result<String> {
    let value = serde_json::to_value(key).map_err(|err| Error::json("grouping key", err))?;
    let array = match value {
        serde_json::Value::Array(_) => value,
        single => serde_json::Value::Array(vec![single]),
    };
    Ok(array.to_string())
}

fn inspect_key<K: Serialize>(key: K) -> String {
    key_json(key).unwrap_or_else(|err| panic!("bad key: {err}"))
}

fn inspect_decode<T: DeserializeOwned>(name: &str, json: &str) -> T {
    serde_json::from_str(json).unwrap_or_else(|err| {
        panic!("state variable `{name}` holds {json}, which does not decode: {err}")
    })
}

impl<P: StatefulProcessor> TestHarness<P> {
    /// Creates the processor by running its `init` in the given time mode.
    pub fn new(time_mode: TimeMode) -> Result<Self> {
        let store = SharedStore::new(time_mode);
        let processor = Self::init(&store)?;
        Ok(TestHarness {
            processor: Some(processor),
            store,
        })
    }

    fn init(store: &SharedStore) -> Result<P> {
        store.enter(Phase::Init, "");
        let processor = P::init(&mut Handle::mem(store.clone(), store.time_mode()));
        store.enter(Phase::Idle, "");
        processor
    }

    /// The query's time mode.
    pub fn time_mode(&self) -> TimeMode {
        self.store.time_mode()
    }

    /// The processor, for inspecting its fields.
    ///
    /// # Panics
    ///
    /// If the harness was closed.
    pub fn processor(&self) -> &P {
        self.processor.as_ref().expect("the harness was closed")
    }

    /// The processor, mutably.
    ///
    /// # Panics
    ///
    /// If the harness was closed.
    pub fn processor_mut(&mut self) -> &mut P {
        self.processor.as_mut().expect("the harness was closed")
    }

    /// The timer values a handler called now would see.
    pub fn timer_values(&self) -> TimerValues {
        let processing = match self.time_mode() {
            TimeMode::None => -1,
            _ => self.store.processing_time_ms(),
        };
        let watermark = match self.time_mode() {
            TimeMode::EventTime => self.store.watermark_ms(),
            _ => -1,
        };
        TimerValues::new(processing, watermark)
    }

    /// Sets the batch timestamp (processing time) in milliseconds.
    pub fn set_processing_time(&mut self, ms: i64) {
        self.store.set_processing_time_ms(ms);
    }

    /// Moves the batch timestamp forward by `delta_ms` milliseconds.
    pub fn advance_processing_time(&mut self, delta_ms: i64) {
        let now = self.store.processing_time_ms().max(0);
        self.store.set_processing_time_ms(now + delta_ms);
    }

    /// Sets the batch id [`Query::info`](crate::Query::info) reports (0 at first).
    pub fn set_batch_id(&mut self, batch_id: u64) {
        self.store.set_batch_id(batch_id);
    }

    /// Sets the watermark in milliseconds (event-time mode).
    pub fn set_watermark(&mut self, ms: i64) {
        self.store.set_watermark_ms(ms);
    }

    /// Runs one handler call for the key with JSON text `key`.
    fn call<T>(
        &mut self,
        key: String,
        f: impl FnOnce(&mut P, &Key, TimerValues) -> Result<T>,
    ) -> Result<T> {
        let timer_values = self.timer_values();
        let Some(processor) = self.processor.as_mut() else {
            return Err(Error::new(ErrorKind::WrongPhase, "the harness was closed"));
        };
        self.store.enter(Phase::Handler, &key);
        let result = f(processor, &Key::from_json(key), timer_values);
        self.store.enter(Phase::Idle, "");
        result
    }

    /// Calls `handle_input_rows` for `key` with typed rows and returns the emitted rows.
    pub fn handle_input_rows<K: Serialize>(
        &mut self,
        key: K,
        rows: impl IntoIterator<Item = P::Input>,
    ) -> Result<Vec<P::Output>> {
        let rows = rows.into_iter().collect();
        self.call(key_json(key)?, |processor, key, timer_values| {
            let mut out = Emitter::typed();
            processor.handle_input_rows(key, rows, timer_values, &mut out)?;
            Ok(out.into_typed())
        })
    }

    /// Calls `handle_input_rows` for `key` with rows given as JSON objects, decoding them as a
    /// component does: a row that does not decode fails with
    /// [`ErrorKind::BadInputRow`].
    pub fn handle_input_json<K: Serialize>(
        &mut self,
        key: K,
        rows: &[&str],
    ) -> Result<Vec<P::Output>> {
        let rows = decode_rows(rows)?;
        self.handle_input_rows(key, rows)
    }

    /// Calls `handle_initial_state` for `key` with one initial-state row.
    pub fn handle_initial_state<K: Serialize>(
        &mut self,
        key: K,
        row: P::InitialState,
    ) -> Result<()> {
        self.call(key_json(key)?, |processor, key, timer_values| {
            processor.handle_initial_state(key, row, timer_values)
        })
    }

    /// Calls `handle_initial_state` for `key` with one initial-state row given as JSON.
    pub fn handle_initial_state_json<K: Serialize>(&mut self, key: K, row: &str) -> Result<()> {
        let row = decode_initial_state(row)?;
        self.handle_initial_state(key, row)
    }

    /// Fires every timer that is due (timestamp at or before the processing time, or the
    /// watermark in event-time mode) in ascending timestamp order, then by key, and returns the
    /// rows the handlers emitted. Each timer is deleted after its handler returns. Timers that
    /// handlers register in the past fire on the next call, as in the host's next batch.
    pub fn fire_expired_timers(&mut self) -> Result<Vec<P::Output>> {
        let mut rows = Vec::new();
        for (at, key) in self.store.due_timers() {
            // An earlier handler of the same key may have deleted this timer.
            if !self.store.has_timer(&key, at) {
                continue;
            }
            let fired = self.call(key.clone(), |processor, key, timer_values| {
                let mut out = Emitter::typed();
                processor.handle_expired_timer(
                    key,
                    timer_values,
                    ExpiredTimerInfo::new(at),
                    &mut out,
                )?;
                Ok(out.into_typed())
            })?;
            self.store.remove_timer(&key, at);
            rows.extend(fired);
        }
        Ok(rows)
    }

    /// The timers registered for `key`, ascending.
    pub fn timers<K: Serialize>(&self, key: K) -> Vec<i64> {
        self.store.timers_of(&inspect_key(key))
    }

    /// The live value of value state `name` for `key`.
    pub fn value_state<T: DeserializeOwned>(&self, name: &str, key: impl Serialize) -> Option<T> {
        self.store
            .inspect_value(name, &inspect_key(key))
            .map(|json| inspect_decode(name, &json))
    }

    /// The live elements of list state `name` for `key`, in insertion order.
    pub fn list_state<T: DeserializeOwned>(&self, name: &str, key: impl Serialize) -> Vec<T> {
        self.store
            .inspect_list(name, &inspect_key(key))
            .iter()
            .map(|json| inspect_decode(name, json))
            .collect()
    }

    /// The live entries of map state `name` for `key`, in iteration order.
    pub fn map_state<K: DeserializeOwned, V: DeserializeOwned>(
        &self,
        name: &str,
        key: impl Serialize,
    ) -> Vec<(K, V)> {
        self.store
            .inspect_map(name, &inspect_key(key))
            .iter()
            .map(|(k, v)| (inspect_decode(name, k), inspect_decode(name, v)))
            .collect()
    }

    /// Closes the processor and creates a new one with `init`, keeping all state and timers,
    /// as the host does when a partition's instance restarts.
    pub fn restart(&mut self) -> Result<()> {
        self.close()?;
        self.processor = Some(Self::init(&self.store)?);
        Ok(())
    }

    /// Calls the processor's `close`. Later handler calls fail until [`restart`](Self::restart).
    pub fn close(&mut self) -> Result<()> {
        match self.processor.take() {
            Some(mut processor) => processor.close(),
            None => Ok(()),
        }
    }
}
