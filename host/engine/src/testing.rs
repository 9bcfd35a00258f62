//! Processors written in Rust against the contract, for tests and benchmarks: the engine's
//! plan, commit, rollback, timers and TTL can be exercised without WebAssembly, and the
//! sandbox's cost measured against the same logic run natively (`statebox bench count`).
//! Not for production pipelines: they are fixed programs, not tenants' processors.

use std::sync::{Arc, Mutex};

use serde_json::json;
use statebox_contract::{
    BatchFailure, CallError, CallErrorKind, Function, InstanceConfig, KeyRows, PartitionBatch,
    PartitionProcessor, ProcessorFactory, ProcessorInfo, TimeMode, each_entry,
};
use statebox_schema::Schema;
use statebox_state::catalog::{Catalog, Declaration, Described, InitOp, VarHandle, VarKind};
use statebox_state::{PartitionTxn, StoredValue};

/// The `counter` plugin's logic in Rust: per key, the running `count` (value state), the
/// size of every batch it saw (`batchCounts`, list state) and the number of calls
/// (`stats`, map state); emits `{"key", "count"}` with the batch's rows per key.
pub struct NativeCounter {
    info: ProcessorInfo,
}

/// The counter's state variables: (name, kind, key schema, value schema).
const COUNTER_VARS: [(&str, VarKind, Option<&str>, &str); 3] = [
    ("count", VarKind::Value, None, "long"),
    ("batchCounts", VarKind::List, None, "long"),
    ("stats", VarKind::Map, Some("name string"), "count long"),
];

impl NativeCounter {
    /// The counter, named `counter-native`.
    pub fn new() -> NativeCounter {
        NativeCounter {
            info: ProcessorInfo {
                name: "counter-native".into(),
                output_schema: Schema::parse_ddl("key string, count long").expect("valid DDL"),
                input_schema: None,
                output_event_time_column: None,
            },
        }
    }
}

impl Default for NativeCounter {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessorFactory for NativeCounter {
    fn info(&self) -> &ProcessorInfo {
        &self.info
    }

    fn describe_init(
        &self,
        _time_mode: TimeMode,
        catalog: &Catalog,
    ) -> Result<Described, CallError> {
        let mut trial = catalog.trial();
        let mut described = Described::default();
        for (name, kind, key, value) in COUNTER_VARS {
            let outcome = trial
                .declare(name, kind, key, value, None)
                .map(|_| ())
                .map_err(|e| e.to_string());
            if let Err(e) = &outcome {
                described.init_error.get_or_insert_with(|| e.clone());
            }
            let op = InitOp::Declare(Declaration {
                name: name.into(),
                kind,
                key_schema: key.map(str::to_owned),
                value_schema: value.into(),
                ttl_ms: None,
            });
            described.ops.push((op, outcome));
        }
        Ok(described)
    }

    fn instantiate(
        &self,
        config: InstanceConfig,
    ) -> Result<Box<dyn PartitionProcessor>, CallError> {
        let catalog: &Mutex<Catalog> = &config.catalog;
        let mut catalog = catalog.lock().expect("catalog lock");
        let mut vars = COUNTER_VARS.iter().map(|&(name, kind, key, value)| {
            catalog
                .declare(name, kind, key, value, None)
                .map_err(|e| self.error(Function::Init, CallErrorKind::Failed(e.to_string())))
        });
        let mut next = || vars.next().expect("three variables");
        Ok(Box::new(NativeCounterInstance {
            count: next()?,
            batch_counts: next()?,
            stats: next()?,
            calls_key: br#"{"name":"calls"}"#.to_vec(),
        }))
    }
}

impl NativeCounter {
    fn error(&self, function: Function, kind: CallErrorKind) -> CallError {
        CallError {
            processor: self.info.name.clone(),
            function,
            key: None,
            kind,
        }
    }
}

struct NativeCounterInstance {
    count: Arc<VarHandle>,
    batch_counts: Arc<VarHandle>,
    stats: Arc<VarHandle>,
    calls_key: Vec<u8>,
}

/// A stored value of `var` with JSON payload `json`, without expiry.
fn stored(var: &VarHandle, json: String) -> StoredValue {
    StoredValue {
        schema_id: var.schema_id(),
        expires_at_ms: None,
        payload: json.into_bytes(),
    }
}

impl NativeCounterInstance {
    /// Counts one key's rows: adds them to `count`, appends their number to `batchCounts`,
    /// counts the call in `stats`, and emits the key with the number of rows.
    fn count_key(
        &self,
        txn: &mut PartitionTxn,
        key: &str,
        rows: &[&str],
    ) -> Result<Vec<String>, CallError> {
        let call_error = |kind| CallError {
            processor: "counter-native".into(),
            function: Function::HandleInputRows,
            key: Some(key.to_owned()),
            kind,
        };
        // Every row is parsed, as the `counter` component parses it (into `IgnoredAny`):
        // the sandbox's cost is measured against the same work.
        for (index, row) in (0u32..).zip(rows) {
            serde_json::from_str::<serde::de::IgnoredAny>(row).map_err(|e| {
                call_error(CallErrorKind::BadInputRow {
                    index,
                    message: e.to_string(),
                })
            })?;
        }
        let batch = rows.len() as i64;
        self.update(txn, key.as_bytes(), batch)
            .map_err(|e| call_error(CallErrorKind::Internal(e)))?;
        let label: Vec<serde_json::Value> = serde_json::from_str(key).unwrap_or_default();
        let label = match label.as_slice() {
            [serde_json::Value::String(s)] => s.clone(),
            [other] => other.to_string(),
            _ => key.to_owned(),
        };
        Ok(vec![json!({"key": label, "count": batch}).to_string()])
    }

    fn update(&self, txn: &mut PartitionTxn, k: &[u8], batch: i64) -> statebox_state::Result<()> {
        let total = match txn.value_get(self.count.id, k)? {
            Some(v) => std::str::from_utf8(&v.payload)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .unwrap_or(0),
            None => 0,
        } + batch;
        txn.value_put(self.count.id, k, stored(&self.count, total.to_string()))?;
        txn.list_append(
            self.batch_counts.id,
            k,
            vec![stored(&self.batch_counts, batch.to_string())],
        )?;
        let calls = match txn.map_get(self.stats.id, k, &self.calls_key)? {
            Some(v) => serde_json::from_slice::<serde_json::Value>(&v.payload)
                .ok()
                .and_then(|v| v["count"].as_i64())
                .unwrap_or(0),
            None => 0,
        } + 1;
        txn.map_put(
            self.stats.id,
            k,
            &self.calls_key,
            stored(&self.stats, format!("{{\"count\":{calls}}}")),
        )
    }
}

impl PartitionProcessor for NativeCounterInstance {
    fn handle_input_batch(
        &mut self,
        batch: &mut PartitionBatch,
        groups: &[KeyRows<'_>],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        let txn = batch.txn();
        each_entry(groups, |g| self.count_key(txn, g.key, g.rows))
    }
}
