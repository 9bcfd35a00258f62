//! Declaring state in `init`, and timers.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::__private::bindings::statebox::processor::handle as wit;
use crate::error::LiftHost;
use crate::held;
use crate::state::Backend;
use crate::{ListState, MapState, QueryInfo, Result, TimeMode, ValueState};

#[cfg(not(target_arch = "wasm32"))]
use crate::mem::SharedStore;

/// Where declarations and timers go: the host, or the test harness's in-memory store.
#[derive(Clone)]
enum Target {
    Host,
    #[cfg(not(target_arch = "wasm32"))]
    Mem(SharedStore),
}

/// Declares state variables; handed to [`StatefulProcessor::init`](crate::StatefulProcessor::init)
/// and usable only there. Mirrors Spark's `StatefulProcessorHandle`.
///
/// Each variable has a name unique within the processor and a schema in Spark DDL that
/// describes the JSON of its Rust type (see the [crate docs](crate)). Declaring a variable
/// again on a restart reopens its data. With a TTL, a value expires `ttl` after the batch that
/// wrote it (measured against the batch timestamp, or against the watermark in event-time
/// mode); expired values are invisible at once.
pub struct Handle {
    target: Target,
    time_mode: TimeMode,
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

impl Handle {
    pub(crate) fn host(time_mode: TimeMode) -> Self {
        Handle {
            target: Target::Host,
            time_mode,
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn mem(store: SharedStore, time_mode: TimeMode) -> Self {
        Handle {
            target: Target::Mem(store),
            time_mode,
        }
    }

    /// The query's time mode.
    pub fn time_mode(&self) -> TimeMode {
        self.time_mode
    }

    /// Declares a value state variable whose values match `schema`.
    pub fn value_state<T>(&mut self, name: &str, schema: &str) -> Result<ValueState<T>>
    where
        T: Serialize + DeserializeOwned,
    {
        self.declare_value(name, schema, None)
    }

    /// Declares a value state variable whose value expires `ttl` after each update.
    pub fn value_state_with_ttl<T>(
        &mut self,
        name: &str,
        schema: &str,
        ttl: Duration,
    ) -> Result<ValueState<T>>
    where
        T: Serialize + DeserializeOwned,
    {
        self.declare_value(name, schema, Some(ttl_ms(ttl)))
    }

    /// Declares a list state variable whose elements match `element_schema`.
    pub fn list_state<T>(&mut self, name: &str, element_schema: &str) -> Result<ListState<T>>
    where
        T: Serialize + DeserializeOwned,
    {
        self.declare_list(name, element_schema, None)
    }

    /// Declares a list state variable whose elements each expire `ttl` after they were
    /// written.
    pub fn list_state_with_ttl<T>(
        &mut self,
        name: &str,
        element_schema: &str,
        ttl: Duration,
    ) -> Result<ListState<T>>
    where
        T: Serialize + DeserializeOwned,
    {
        self.declare_list(name, element_schema, Some(ttl_ms(ttl)))
    }

    /// Declares a map state variable from keys matching `key_schema` to values matching
    /// `value_schema`.
    pub fn map_state<K, V>(
        &mut self,
        name: &str,
        key_schema: &str,
        value_schema: &str,
    ) -> Result<MapState<K, V>>
    where
        K: Serialize + DeserializeOwned,
        V: Serialize + DeserializeOwned,
    {
        self.declare_map(name, key_schema, value_schema, None)
    }

    /// Declares a map state variable whose entries each expire `ttl` after they were written.
    pub fn map_state_with_ttl<K, V>(
        &mut self,
        name: &str,
        key_schema: &str,
        value_schema: &str,
        ttl: Duration,
    ) -> Result<MapState<K, V>>
    where
        K: Serialize + DeserializeOwned,
        V: Serialize + DeserializeOwned,
    {
        self.declare_map(name, key_schema, value_schema, Some(ttl_ms(ttl)))
    }

    /// Drops the named variable's data for all keys, if it exists. Use it for variables a new
    /// version of the processor no longer declares.
    pub fn delete_if_exists(&mut self, name: &str) -> Result<()> {
        match &self.target {
            Target::Host => wit::delete_if_exists(name).lift(),
            #[cfg(not(target_arch = "wasm32"))]
            Target::Mem(store) => store.delete_if_exists(name),
        }
    }

    /// The timers of the processor, to keep in the processor and use in its handlers.
    pub fn timers(&self) -> Timers {
        Timers {
            target: self.target.clone(),
            held: self.time_mode != TimeMode::None,
        }
    }

    /// The query the processor runs in, to keep in the processor and ask in its handlers.
    pub fn query(&self) -> Query {
        Query {
            target: self.target.clone(),
        }
    }

    fn declare_value<T>(
        &mut self,
        name: &str,
        schema: &str,
        ttl: Option<u64>,
    ) -> Result<ValueState<T>>
    where
        T: Serialize + DeserializeOwned,
    {
        let backend = match &self.target {
            Target::Host => Backend::Host(wit::get_value_state(name, schema, ttl).lift()?),
            #[cfg(not(target_arch = "wasm32"))]
            Target::Mem(store) => Backend::Mem(store.declare_value(name, schema, ttl)?),
        };
        Ok(ValueState::new(backend))
    }

    fn declare_list<T>(
        &mut self,
        name: &str,
        schema: &str,
        ttl: Option<u64>,
    ) -> Result<ListState<T>>
    where
        T: Serialize + DeserializeOwned,
    {
        let backend = match &self.target {
            Target::Host => Backend::Host(wit::get_list_state(name, schema, ttl).lift()?),
            #[cfg(not(target_arch = "wasm32"))]
            Target::Mem(store) => Backend::Mem(store.declare_list(name, schema, ttl)?),
        };
        Ok(ListState::new(backend))
    }

    fn declare_map<K, V>(
        &mut self,
        name: &str,
        key_schema: &str,
        value_schema: &str,
        ttl: Option<u64>,
    ) -> Result<MapState<K, V>>
    where
        K: Serialize + DeserializeOwned,
        V: Serialize + DeserializeOwned,
    {
        let backend = match &self.target {
            Target::Host => {
                Backend::Host(wit::get_map_state(name, key_schema, value_schema, ttl).lift()?)
            }
            #[cfg(not(target_arch = "wasm32"))]
            Target::Mem(store) => {
                Backend::Mem(store.declare_map(name, key_schema, value_schema, ttl)?)
            }
        };
        Ok(MapState::new(backend))
    }
}

/// The timers of the current grouping key. Obtain it in `init` with [`Handle::timers`], keep
/// it in the processor, and use it in handlers. Timers need time mode `ProcessingTime` or
/// `EventTime`.
///
/// A timer fires once its timestamp is at or before the batch timestamp (processing time) or
/// the watermark (event time), calling `handle_expired_timer` for its key.
#[derive(Clone)]
pub struct Timers {
    target: Target,
    /// Whether registrations and deletions may be held (see [`held`]): in a time mode with
    /// timers, where the host accepts them. In time mode `None` they go at once, so the
    /// error comes back from the call that made it.
    held: bool,
}

impl Timers {
    /// Registers a timer for the current key at `expiry_ms`; registering an existing timer is a
    /// no-op.
    pub fn register(&self, expiry_ms: i64) -> Result<()> {
        match &self.target {
            Target::Host if self.held && held::holding() => {
                held::hold(held::TIMER_REGISTER, expiry_ms.to_string(), None)
            }
            Target::Host => wit::register_timer(expiry_ms).lift(),
            #[cfg(not(target_arch = "wasm32"))]
            Target::Mem(store) => store.register_timer(expiry_ms),
        }
    }

    /// Deletes the current key's timer at `expiry_ms`; deleting a missing timer is a no-op.
    pub fn delete(&self, expiry_ms: i64) -> Result<()> {
        match &self.target {
            Target::Host if self.held && held::holding() => {
                held::hold(held::TIMER_DELETE, expiry_ms.to_string(), None)
            }
            Target::Host => wit::delete_timer(expiry_ms).lift(),
            #[cfg(not(target_arch = "wasm32"))]
            Target::Mem(store) => store.delete_timer(expiry_ms),
        }
    }

    /// The current key's registered timers, ascending.
    pub fn list(&self) -> Result<Vec<i64>> {
        match &self.target {
            Target::Host => {
                held::sync(held::TIMER_REGISTER)?;
                held::sync(held::TIMER_DELETE)?;
                wit::list_timers().lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Target::Mem(store) => store.list_timers(),
        }
    }
}

/// The query the processor runs in. Obtain it in `init` with [`Handle::query`] and keep it in
/// the processor; [`info`](Query::info) tells the query id, run id and batch id.
#[derive(Clone)]
pub struct Query {
    target: Target,
}

impl Query {
    /// The query id, this run's id and the batch in progress.
    pub fn info(&self) -> QueryInfo {
        match &self.target {
            Target::Host => {
                let info = wit::get_query_info();
                QueryInfo {
                    query_id: info.query_id,
                    run_id: info.run_id,
                    batch_id: info.batch_id,
                }
            }
            #[cfg(not(target_arch = "wasm32"))]
            Target::Mem(store) => store.query_info(),
        }
    }
}
