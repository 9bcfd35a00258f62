//! How the reader turns stored keys and values into rows: the columns of each kind of read
//! (see the table in `statebox_sql`'s docs), values read through the variable's current
//! schema, and the emitter that hands rows to the caller's callback.

use std::collections::HashMap;

use serde_json::{Map, Value};
use statebox_schema::Schema;
use statebox_state::catalog::VarDef;
use statebox_state::{StoreError, StoredValue, changelog, keys};

use super::StateReader;
use crate::EngineError;
use crate::input::partition_of;

impl StateReader {
    /// `{"key": {column: value, ...}}` for a stored grouping key.
    pub(super) fn key_fields(&self, key: &[u8]) -> Result<Map<String, Value>, EngineError> {
        let corrupt = || {
            EngineError::Store(StoreError::Corrupt(format!(
                "stored grouping key {} is not a JSON array of {} key column(s)",
                String::from_utf8_lossy(key),
                self.config.key_columns.len()
            )))
        };
        let Ok(Value::Array(values)) = serde_json::from_slice::<Value>(key) else {
            return Err(corrupt());
        };
        if values.len() != self.config.key_columns.len() {
            return Err(corrupt());
        }
        let columns: Map<String, Value> = self
            .config
            .key_columns
            .iter()
            .cloned()
            .zip(values)
            .collect();
        let mut row = Map::new();
        row.insert("key".into(), Value::Object(columns));
        Ok(row)
    }

    /// Adds `partition_id` and makes the row a value.
    pub(super) fn finish(&self, key: &[u8], mut row: Map<String, Value>) -> Value {
        let partition = partition_of(key, usize::from(self.config.partitions.max(1)));
        row.insert("partition_id".into(), partition.into());
        Value::Object(row)
    }

    /// A row of one stored value under `column`: `value` for value state, `list_element`
    /// for a flattened list.
    pub(super) fn value_row(
        &self,
        column: &str,
        key: &[u8],
        value: &StoredValue,
        schemas: &Schemas,
        ttl: bool,
    ) -> Result<Value, EngineError> {
        let mut row = self.key_fields(key)?;
        row.insert(column.into(), schemas.read(value)?);
        Ok(self.with_ttl(key, row, value, ttl))
    }

    pub(super) fn entry_row(
        &self,
        key: &[u8],
        uk: &[u8],
        value: &StoredValue,
        schemas: &Schemas,
        ttl: bool,
    ) -> Result<Value, EngineError> {
        let mut row = self.key_fields(key)?;
        row.insert("user_map_key".into(), user_key(uk)?);
        row.insert("user_map_value".into(), schemas.read(value)?);
        Ok(self.with_ttl(key, row, value, ttl))
    }

    pub(super) fn with_ttl(
        &self,
        key: &[u8],
        mut row: Map<String, Value>,
        value: &StoredValue,
        ttl: bool,
    ) -> Value {
        if ttl {
            row.insert("ttl_expiration_ms".into(), value.expires_at_ms.into());
        }
        self.finish(key, row)
    }

    /// The row of one logged change of a value, list element or map entry.
    pub(super) fn change_row(
        &self,
        batch: u64,
        partition: u16,
        change: changelog::Change<'_>,
        schemas: &Schemas,
    ) -> Result<Value, EngineError> {
        let ns = change.key.first().copied().unwrap_or_default();
        let (_, key, suffix) = keys::decode_var_key(ns, change.key)?;
        let mut row = Map::new();
        row.insert("batch_id".into(), batch.into());
        let change_type = if change.value.is_some() {
            "update"
        } else {
            "delete"
        };
        row.insert("change_type".into(), change_type.into());
        row.append(&mut self.key_fields(key)?);
        match ns {
            keys::LIST => {
                let seq = keys::decode_list_seq(change.key)?;
                row.insert("list_index".into(), seq.into());
            }
            keys::MAP => {
                row.insert("user_map_key".into(), user_key(suffix)?);
            }
            _ => {}
        }
        let value = match change.value {
            Some(bytes) => schemas.read(&StoredValue::decode(bytes)?)?,
            None => Value::Null,
        };
        row.insert("value".into(), value);
        row.insert("partition_id".into(), partition.into());
        Ok(Value::Object(row))
    }

    pub(super) fn list_row(
        &self,
        (key, items): (Vec<u8>, Vec<(Value, Value)>),
    ) -> Result<Value, EngineError> {
        let mut row = self.key_fields(&key)?;
        let list = items.into_iter().map(|(_, v)| v).collect();
        row.insert("list_value".into(), Value::Array(list));
        Ok(self.finish(&key, row))
    }

    pub(super) fn map_row(
        &self,
        (key, items): (Vec<u8>, Vec<(Value, Value)>),
    ) -> Result<Value, EngineError> {
        let mut row = self.key_fields(&key)?;
        let map = items
            .into_iter()
            .map(|(k, v)| {
                let name = match k {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                (name, v)
            })
            .collect();
        row.insert("map_value".into(), Value::Object(map));
        Ok(self.finish(&key, row))
    }
}

/// Hands rows to the caller's callback; remembers the first error, after which it asks the
/// scan to stop and drops further rows.
pub(super) struct Emitter<'f, F> {
    pub(super) f: &'f mut F,
    pub(super) failed: Option<EngineError>,
}

impl<F: FnMut(Value) -> Result<(), EngineError>> Emitter<'_, F> {
    /// Passes a row on; returns whether to go on scanning.
    pub(super) fn emit(&mut self, row: Result<Value, EngineError>) -> bool {
        if self.failed.is_some() {
            return false;
        }
        match row.and_then(&mut *self.f) {
            Ok(()) => true,
            Err(e) => {
                self.failed = Some(e);
                false
            }
        }
    }

    /// Adds an item of grouping key `key` to `group`, first emitting the previous key's
    /// row if `key` starts a new one; returns whether to go on scanning.
    pub(super) fn gather(
        &mut self,
        group: &mut Group,
        key: &[u8],
        item: Result<(Value, Value), EngineError>,
        row: impl FnOnce(Done) -> Result<Value, EngineError>,
    ) -> bool {
        if let Some(done) = group.next(key, row)
            && !self.emit(done)
        {
            return false;
        }
        match item {
            Ok(item) => {
                group.items.push(item);
                true
            }
            Err(e) => self.emit(Err(e)),
        }
    }
}

/// One grouping key's collection, gathered for an unflattened row.
#[derive(Default)]
pub(super) struct Group {
    key: Option<Vec<u8>>,
    items: Vec<(Value, Value)>,
}

type Done = (Vec<u8>, Vec<(Value, Value)>);

impl Group {
    /// Moves on to `key`; if that ends the previous key's collection, returns its row.
    pub(super) fn next(
        &mut self,
        key: &[u8],
        row: impl FnOnce(Done) -> Result<Value, EngineError>,
    ) -> Option<Result<Value, EngineError>> {
        if self.key.as_deref() == Some(key) {
            return None;
        }
        let done = self.finish(row);
        self.key = Some(key.to_vec());
        done
    }

    /// The row of the collection gathered so far, if any.
    pub(super) fn finish(
        &mut self,
        row: impl FnOnce(Done) -> Result<Value, EngineError>,
    ) -> Option<Result<Value, EngineError>> {
        let key = self.key.take()?;
        Some(row((key, std::mem::take(&mut self.items))))
    }
}

/// A variable's value schemas, parsed on first use, for reading old values through the
/// current schema.
pub(super) struct Schemas<'a> {
    var: &'a VarDef,
    current: Option<Schema>,
    parsed: std::cell::RefCell<HashMap<u32, Schema>>,
}

impl<'a> Schemas<'a> {
    pub(super) fn new(var: &'a VarDef) -> Result<Schemas<'a>, EngineError> {
        let current = match var.value_schemas.len() {
            0 | 1 => None,
            n => Some(parse_schema(var, n - 1)?),
        };
        Ok(Schemas {
            var,
            current,
            parsed: Default::default(),
        })
    }

    /// The stored value as JSON, evolved to the current schema if written with an older one.
    pub(super) fn read(&self, value: &StoredValue) -> Result<Value, EngineError> {
        let corrupt = |msg: String| {
            EngineError::Store(StoreError::Corrupt(format!(
                "state variable `{}`: {msg}",
                self.var.name
            )))
        };
        let text = std::str::from_utf8(&value.payload)
            .map_err(|_| corrupt("a stored value is not UTF-8".into()))?;
        let current_id = self.var.value_schemas.len().saturating_sub(1);
        let id = value.schema_id as usize;
        let text = match &self.current {
            Some(current) if id != current_id => {
                if id >= self.var.value_schemas.len() {
                    return Err(corrupt(format!("unknown schema id {id}")));
                }
                let mut parsed = self.parsed.borrow_mut();
                let old = match parsed.entry(value.schema_id) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(parse_schema(self.var, id)?)
                    }
                };
                std::borrow::Cow::Owned(
                    statebox_schema::evolve_json(old, current, text).map_err(|e| {
                        corrupt(format!("a value of schema {id} does not evolve: {e}"))
                    })?,
                )
            }
            _ => std::borrow::Cow::Borrowed(text),
        };
        serde_json::from_str(&text).map_err(|e| corrupt(format!("a stored value is not JSON: {e}")))
    }
}

pub(super) fn parse_schema(var: &VarDef, id: usize) -> Result<Schema, EngineError> {
    Schema::parse_ddl(&var.value_schemas[id]).map_err(|e| {
        EngineError::Store(StoreError::Corrupt(format!(
            "state variable `{}`: schema {id} does not parse: {e}",
            var.name
        )))
    })
}

/// A map's stored user key (canonical JSON) as a value.
pub(super) fn user_key(uk: &[u8]) -> Result<Value, EngineError> {
    serde_json::from_slice(uk).map_err(|e| {
        EngineError::Store(StoreError::Corrupt(format!(
            "a stored map user key is not JSON: {e}"
        )))
    })
}
