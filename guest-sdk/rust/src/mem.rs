//! The in-memory state store behind the test harness, with the host's semantics: per-key
//! isolation, list insertion order, maps ordered by the user key's canonical JSON, TTL, timers
//! and phase checks.
//!
//! Values are kept as JSON text, exactly as they would cross to the host, so a test also
//! exercises the processor's serde round trip.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::rc::Rc;

use crate::__private::bindings::statebox::processor::state::MapEntry;
use crate::{Error, ErrorKind, Result, TimeMode};

/// What the processor may do right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Inside `init`: declarations only.
    Init,
    /// Inside a handler: state and timers of `current_key`.
    Handler,
    /// Between calls, or inside `close`.
    Idle,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Value,
    List,
    Map,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Value => "value",
            Kind::List => "list",
            Kind::Map => "map",
        }
    }
}

/// One stored value with its TTL deadline.
#[derive(Debug, Clone)]
struct Entry {
    json: String,
    expires_at: Option<i64>,
}

impl Entry {
    fn live(&self, now: i64) -> bool {
        self.expires_at.is_none_or(|at| now < at)
    }
}

/// A variable's data for every grouping key (keyed by the key's JSON text).
#[derive(Debug)]
enum Data {
    Value(HashMap<String, Entry>),
    List(HashMap<String, Vec<Entry>>),
    Map(HashMap<String, BTreeMap<String, Entry>>),
}

#[derive(Debug)]
struct Var {
    name: String,
    kind: Kind,
    schemas: (Option<String>, String),
    ttl_ms: Option<u64>,
    deleted: bool,
    data: Data,
}

/// The whole in-memory state of one processor under test.
#[derive(Debug)]
pub(crate) struct Store {
    time_mode: TimeMode,
    phase: Phase,
    processing_time_ms: i64,
    watermark_ms: i64,
    current_key: String,
    /// The batch id `Query::info` reports.
    batch_id: u64,
    vars: Vec<Var>,
    names: HashMap<String, usize>,
    declared_in_this_init: HashSet<usize>,
    /// Registered timers: grouping key → timestamps.
    timers: BTreeMap<String, BTreeSet<i64>>,
}

/// The store shared between the harness and the state handles it gave the processor.
#[derive(Debug, Clone)]
pub(crate) struct SharedStore(Rc<RefCell<Store>>);

/// A state handle's reference to its variable in the store.
#[derive(Debug)]
pub(crate) struct MemVar {
    store: SharedStore,
    id: usize,
}

fn is_null(json: &str) -> bool {
    json.trim() == "null"
}

/// The user key's canonical JSON: compact, with object members sorted by name, so that equal
/// keys compare equal and maps iterate in a deterministic order.
fn canonical(json: &str) -> Result<String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|err| Error::json("map key", err))?;
    let mut out = String::with_capacity(json.len());
    write_canonical(&value, &mut out);
    Ok(out)
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut members: Vec<_> = members.iter().collect();
            members.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (name, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(name.clone()).to_string());
                out.push(':');
                write_canonical(member, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

impl Store {
    /// The time TTL is measured against: the watermark in event-time mode, else the batch
    /// timestamp.
    fn ttl_now(&self) -> i64 {
        match self.time_mode {
            TimeMode::EventTime => self.watermark_ms,
            _ => self.processing_time_ms,
        }
    }

    fn check_handler(&self, what: &str) -> Result<()> {
        if self.phase == Phase::Handler {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::WrongPhase,
                format!(
                    "{what} is allowed only inside handle_input_rows, handle_expired_timer and \
                     handle_initial_state"
                ),
            ))
        }
    }

    fn var(&self, id: usize, op: &str) -> Result<&Var> {
        self.check_handler(op)?;
        let var = &self.vars[id];
        if var.deleted {
            return Err(Error::new(
                ErrorKind::InvalidUse,
                format!("state variable `{}` was deleted", var.name),
            ));
        }
        Ok(var)
    }

    fn expiry(&self, ttl_ms: Option<u64>) -> Option<i64> {
        ttl_ms.map(|ttl| {
            self.ttl_now()
                .saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX))
        })
    }

    fn declare(
        &mut self,
        name: &str,
        kind: Kind,
        schemas: (Option<&str>, &str),
        ttl_ms: Option<u64>,
    ) -> Result<usize> {
        if self.phase != Phase::Init {
            return Err(Error::new(
                ErrorKind::WrongPhase,
                format!("state variable `{name}` can be declared only in init"),
            ));
        }
        if schemas.1.trim().is_empty() || schemas.0.is_some_and(|s| s.trim().is_empty()) {
            return Err(Error::new(
                ErrorKind::InvalidSchema,
                format!("state variable `{name}` has an empty schema"),
            ));
        }
        if ttl_ms.is_some() && self.time_mode == TimeMode::None {
            return Err(Error::new(
                ErrorKind::UnsupportedInTimeMode,
                format!("state variable `{name}` has a TTL, which time mode none does not support"),
            ));
        }
        let schemas = (schemas.0.map(str::to_owned), schemas.1.to_owned());
        if let Some(&id) = self.names.get(name) {
            let var = &mut self.vars[id];
            if var.kind != kind {
                return Err(Error::new(
                    ErrorKind::InvalidUse,
                    format!(
                        "state variable `{name}` is a {} state and cannot be redeclared as a {} \
                         state",
                        var.kind.name(),
                        kind.name()
                    ),
                ));
            }
            // Within one init a second declaration must match; across restarts the schema
            // may evolve, which the host checks and the harness accepts.
            if !self.declared_in_this_init.insert(id) && var.schemas != schemas {
                return Err(Error::new(
                    ErrorKind::InvalidUse,
                    format!("state variable `{name}` was declared twice with different schemas"),
                ));
            }
            var.schemas = schemas;
            var.ttl_ms = ttl_ms;
            return Ok(id);
        }
        let data = match kind {
            Kind::Value => Data::Value(HashMap::new()),
            Kind::List => Data::List(HashMap::new()),
            Kind::Map => Data::Map(HashMap::new()),
        };
        let id = self.vars.len();
        self.vars.push(Var {
            name: name.to_owned(),
            kind,
            schemas,
            ttl_ms,
            deleted: false,
            data,
        });
        self.names.insert(name.to_owned(), id);
        self.declared_in_this_init.insert(id);
        Ok(id)
    }

    fn check_timers(&self, what: &str) -> Result<()> {
        self.check_handler(what)?;
        if self.time_mode == TimeMode::None {
            return Err(Error::new(
                ErrorKind::UnsupportedInTimeMode,
                format!("{what} is not supported in time mode none"),
            ));
        }
        Ok(())
    }
}

impl SharedStore {
    pub(crate) fn new(time_mode: TimeMode) -> Self {
        let (processing_time_ms, watermark_ms) = match time_mode {
            TimeMode::None => (-1, -1),
            TimeMode::ProcessingTime => (0, -1),
            TimeMode::EventTime => (0, 0),
        };
        SharedStore(Rc::new(RefCell::new(Store {
            time_mode,
            phase: Phase::Idle,
            processing_time_ms,
            watermark_ms,
            current_key: String::new(),
            batch_id: 0,
            vars: Vec::new(),
            names: HashMap::new(),
            declared_in_this_init: HashSet::new(),
            timers: BTreeMap::new(),
        })))
    }

    pub(crate) fn time_mode(&self) -> TimeMode {
        self.0.borrow().time_mode
    }

    /// What `Query::info` reports under the harness: fixed ids and the harness's batch id.
    pub(crate) fn query_info(&self) -> crate::QueryInfo {
        crate::QueryInfo {
            query_id: "harness-query".to_owned(),
            run_id: "harness-run".to_owned(),
            batch_id: self.0.borrow().batch_id,
        }
    }

    pub(crate) fn set_batch_id(&self, batch_id: u64) {
        self.0.borrow_mut().batch_id = batch_id;
    }

    /// Enters `phase`, acting on grouping key `key` (ignored outside handlers).
    pub(crate) fn enter(&self, phase: Phase, key: &str) {
        let mut store = self.0.borrow_mut();
        store.phase = phase;
        if phase == Phase::Init {
            store.declared_in_this_init.clear();
        }
        key.clone_into(&mut store.current_key);
    }

    pub(crate) fn processing_time_ms(&self) -> i64 {
        self.0.borrow().processing_time_ms
    }

    pub(crate) fn set_processing_time_ms(&self, ms: i64) {
        self.0.borrow_mut().processing_time_ms = ms;
    }

    pub(crate) fn watermark_ms(&self) -> i64 {
        self.0.borrow().watermark_ms
    }

    pub(crate) fn set_watermark_ms(&self, ms: i64) {
        self.0.borrow_mut().watermark_ms = ms;
    }

    /// The timers due now, ascending by timestamp then key.
    pub(crate) fn due_timers(&self) -> Vec<(i64, String)> {
        let store = self.0.borrow();
        let now = match store.time_mode {
            TimeMode::None => return Vec::new(),
            TimeMode::ProcessingTime => store.processing_time_ms,
            TimeMode::EventTime => store.watermark_ms,
        };
        let mut due: Vec<(i64, String)> = store
            .timers
            .iter()
            .flat_map(|(key, times)| times.range(..=now).map(move |&at| (at, key.clone())))
            .collect();
        due.sort();
        due
    }

    /// Whether a timer is still registered (a handler may have deleted it before it fired).
    pub(crate) fn has_timer(&self, key: &str, at: i64) -> bool {
        self.0
            .borrow()
            .timers
            .get(key)
            .is_some_and(|times| times.contains(&at))
    }

    /// Removes a timer after its handler returned.
    pub(crate) fn remove_timer(&self, key: &str, at: i64) {
        let mut store = self.0.borrow_mut();
        if let Some(times) = store.timers.get_mut(key) {
            times.remove(&at);
            if times.is_empty() {
                store.timers.remove(key);
            }
        }
    }

    pub(crate) fn timers_of(&self, key: &str) -> Vec<i64> {
        self.0
            .borrow()
            .timers
            .get(key)
            .map(|times| times.iter().copied().collect())
            .unwrap_or_default()
    }

    fn declare(
        &self,
        name: &str,
        kind: Kind,
        schemas: (Option<&str>, &str),
        ttl_ms: Option<u64>,
    ) -> Result<MemVar> {
        let id = self.0.borrow_mut().declare(name, kind, schemas, ttl_ms)?;
        Ok(MemVar {
            store: self.clone(),
            id,
        })
    }

    pub(crate) fn declare_value(
        &self,
        name: &str,
        schema: &str,
        ttl: Option<u64>,
    ) -> Result<MemVar> {
        self.declare(name, Kind::Value, (None, schema), ttl)
    }

    pub(crate) fn declare_list(
        &self,
        name: &str,
        schema: &str,
        ttl: Option<u64>,
    ) -> Result<MemVar> {
        self.declare(name, Kind::List, (None, schema), ttl)
    }

    pub(crate) fn declare_map(
        &self,
        name: &str,
        key_schema: &str,
        value_schema: &str,
        ttl: Option<u64>,
    ) -> Result<MemVar> {
        self.declare(name, Kind::Map, (Some(key_schema), value_schema), ttl)
    }

    pub(crate) fn delete_if_exists(&self, name: &str) -> Result<()> {
        let mut store = self.0.borrow_mut();
        if store.phase != Phase::Init {
            return Err(Error::new(
                ErrorKind::WrongPhase,
                format!("delete_if_exists(`{name}`) is allowed only in init"),
            ));
        }
        if let Some(id) = store.names.remove(name) {
            let var = &mut store.vars[id];
            var.deleted = true;
            var.data = Data::Value(HashMap::new());
        }
        Ok(())
    }

    pub(crate) fn register_timer(&self, at: i64) -> Result<()> {
        let mut store = self.0.borrow_mut();
        store.check_timers("register_timer")?;
        let key = store.current_key.clone();
        store.timers.entry(key).or_default().insert(at);
        Ok(())
    }

    pub(crate) fn delete_timer(&self, at: i64) -> Result<()> {
        let key = {
            let store = self.0.borrow();
            store.check_timers("delete_timer")?;
            store.current_key.clone()
        };
        self.remove_timer(&key, at);
        Ok(())
    }

    pub(crate) fn list_timers(&self) -> Result<Vec<i64>> {
        let store = self.0.borrow();
        store.check_timers("list_timers")?;
        Ok(store
            .timers
            .get(&store.current_key)
            .map(|t| t.iter().copied().collect())
            .unwrap_or_default())
    }

    /// The live JSON of a value variable for `key`, for inspection by tests.
    pub(crate) fn inspect_value(&self, name: &str, key: &str) -> Option<String> {
        let store = self.0.borrow();
        let now = store.ttl_now();
        match &store.inspect(name, Kind::Value).data {
            Data::Value(values) => values
                .get(key)
                .filter(|e| e.live(now))
                .map(|e| e.json.clone()),
            _ => unreachable!("checked by inspect"),
        }
    }

    /// The live elements of a list variable for `key`, for inspection by tests.
    pub(crate) fn inspect_list(&self, name: &str, key: &str) -> Vec<String> {
        let store = self.0.borrow();
        let now = store.ttl_now();
        match &store.inspect(name, Kind::List).data {
            Data::List(lists) => lists
                .get(key)
                .map(|list| {
                    list.iter()
                        .filter(|e| e.live(now))
                        .map(|e| e.json.clone())
                        .collect()
                })
                .unwrap_or_default(),
            _ => unreachable!("checked by inspect"),
        }
    }

    /// The live entries of a map variable for `key`, in order, for inspection by tests.
    pub(crate) fn inspect_map(&self, name: &str, key: &str) -> Vec<(String, String)> {
        let store = self.0.borrow();
        let now = store.ttl_now();
        match &store.inspect(name, Kind::Map).data {
            Data::Map(maps) => maps
                .get(key)
                .map(|map| {
                    map.iter()
                        .filter(|(_, e)| e.live(now))
                        .map(|(k, e)| (k.clone(), e.json.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            _ => unreachable!("checked by inspect"),
        }
    }
}

impl Store {
    /// The variable a test inspects. Panics, as a failed assertion would, if the name is not
    /// declared or is of another kind.
    fn inspect(&self, name: &str, kind: Kind) -> &Var {
        let Some(&id) = self.names.get(name) else {
            panic!("the processor declared no state variable `{name}`");
        };
        let var = &self.vars[id];
        assert_eq!(
            var.kind,
            kind,
            "state variable `{name}` is a {} state, not a {} state",
            var.kind.name(),
            kind.name()
        );
        var
    }
}

impl MemVar {
    /// Runs `op` on this variable's data for the current key.
    fn with<T>(
        &self,
        op: &str,
        f: impl FnOnce(&mut Data, &str, i64, Option<i64>) -> Result<T>,
    ) -> Result<T> {
        let mut guard = self.store.0.borrow_mut();
        let store = &mut *guard;
        let ttl_ms = store.var(self.id, op)?.ttl_ms;
        let expiry = store.expiry(ttl_ms);
        let now = store.ttl_now();
        let var = &mut store.vars[self.id];
        f(&mut var.data, &store.current_key, now, expiry)
    }

    fn name(&self) -> String {
        self.store.0.borrow().vars[self.id].name.clone()
    }

    fn check_elements(&self, op: &str, values: &[String]) -> Result<()> {
        if values.is_empty() {
            return Err(Error::new(
                ErrorKind::EmptyList,
                format!("list state `{}`: {op} was given an empty list", self.name()),
            ));
        }
        if let Some(index) = values.iter().position(|v| is_null(v)) {
            return Err(Error::new(
                ErrorKind::NullElement,
                format!(
                    "list state `{}`: {op} was given a null element at {index}",
                    self.name()
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn value_exists(&self) -> Result<bool> {
        Ok(self.value_get()?.is_some())
    }

    pub(crate) fn value_get(&self) -> Result<Option<String>> {
        self.with("ValueState::get", |data, key, now, _| match data {
            Data::Value(values) => Ok(values
                .get(key)
                .filter(|e| e.live(now))
                .map(|e| e.json.clone())),
            _ => unreachable!("a value handle points at a value variable"),
        })
    }

    pub(crate) fn value_update(&self, json: String) -> Result<()> {
        if is_null(&json) {
            return Err(Error::new(
                ErrorKind::SchemaMismatch,
                format!("value state `{}`: update with null; use clear", self.name()),
            ));
        }
        self.with(
            "ValueState::update",
            |data, key, _, expires_at| match data {
                Data::Value(values) => {
                    values.insert(key.to_owned(), Entry { json, expires_at });
                    Ok(())
                }
                _ => unreachable!("a value handle points at a value variable"),
            },
        )
    }

    pub(crate) fn value_clear(&self) -> Result<()> {
        self.with("ValueState::clear", |data, key, _, _| match data {
            Data::Value(values) => {
                values.remove(key);
                Ok(())
            }
            _ => unreachable!("a value handle points at a value variable"),
        })
    }

    pub(crate) fn list_exists(&self) -> Result<bool> {
        Ok(!self.list_get()?.is_empty())
    }

    pub(crate) fn list_get(&self) -> Result<Vec<String>> {
        self.with("ListState::get", |data, key, now, _| match data {
            Data::List(lists) => Ok(lists
                .get(key)
                .map(|list| {
                    list.iter()
                        .filter(|e| e.live(now))
                        .map(|e| e.json.clone())
                        .collect()
                })
                .unwrap_or_default()),
            _ => unreachable!("a list handle points at a list variable"),
        })
    }

    pub(crate) fn list_put(&self, values: Vec<String>) -> Result<()> {
        self.check_elements("put", &values)?;
        self.with("ListState::put", |data, key, _, expires_at| match data {
            Data::List(lists) => {
                let list = values
                    .into_iter()
                    .map(|json| Entry { json, expires_at })
                    .collect();
                lists.insert(key.to_owned(), list);
                Ok(())
            }
            _ => unreachable!("a list handle points at a list variable"),
        })
    }

    pub(crate) fn list_append(&self, values: Vec<String>) -> Result<()> {
        self.check_elements("append", &values)?;
        self.with("ListState::append", |data, key, _, expires_at| match data {
            Data::List(lists) => {
                let list = lists.entry(key.to_owned()).or_default();
                list.extend(values.into_iter().map(|json| Entry { json, expires_at }));
                Ok(())
            }
            _ => unreachable!("a list handle points at a list variable"),
        })
    }

    pub(crate) fn list_clear(&self) -> Result<()> {
        self.with("ListState::clear", |data, key, _, _| match data {
            Data::List(lists) => {
                lists.remove(key);
                Ok(())
            }
            _ => unreachable!("a list handle points at a list variable"),
        })
    }

    pub(crate) fn map_exists(&self) -> Result<bool> {
        Ok(!self.map_entries()?.is_empty())
    }

    pub(crate) fn map_get(&self, user_key: &str) -> Result<Option<String>> {
        let user_key = canonical(user_key)?;
        self.with("MapState::get_value", |data, key, now, _| match data {
            Data::Map(maps) => Ok(maps
                .get(key)
                .and_then(|map| map.get(&user_key))
                .filter(|e| e.live(now))
                .map(|e| e.json.clone())),
            _ => unreachable!("a map handle points at a map variable"),
        })
    }

    pub(crate) fn map_contains(&self, user_key: &str) -> Result<bool> {
        Ok(self.map_get(user_key)?.is_some())
    }

    pub(crate) fn map_update(&self, user_key: &str, json: String) -> Result<()> {
        let user_key = canonical(user_key)?;
        if is_null(&user_key) || is_null(&json) {
            return Err(Error::new(
                ErrorKind::SchemaMismatch,
                format!(
                    "map state `{}`: null key or value; use remove_key",
                    self.name()
                ),
            ));
        }
        self.with(
            "MapState::update_value",
            |data, key, _, expires_at| match data {
                Data::Map(maps) => {
                    maps.entry(key.to_owned())
                        .or_default()
                        .insert(user_key, Entry { json, expires_at });
                    Ok(())
                }
                _ => unreachable!("a map handle points at a map variable"),
            },
        )
    }

    pub(crate) fn map_remove(&self, user_key: &str) -> Result<()> {
        let user_key = canonical(user_key)?;
        self.with("MapState::remove_key", |data, key, _, _| match data {
            Data::Map(maps) => {
                if let Some(map) = maps.get_mut(key) {
                    map.remove(&user_key);
                }
                Ok(())
            }
            _ => unreachable!("a map handle points at a map variable"),
        })
    }

    pub(crate) fn map_entries(&self) -> Result<Vec<MapEntry>> {
        self.with("MapState::iter", |data, key, now, _| match data {
            Data::Map(maps) => Ok(maps
                .get(key)
                .map(|map| {
                    map.iter()
                        .filter(|(_, e)| e.live(now))
                        .map(|(k, e)| MapEntry {
                            key: k.clone(),
                            value: e.json.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default()),
            _ => unreachable!("a map handle points at a map variable"),
        })
    }

    pub(crate) fn map_clear(&self) -> Result<()> {
        self.with("MapState::clear", |data, key, _, _| match data {
            Data::Map(maps) => {
                maps.remove(key);
                Ok(())
            }
            _ => unreachable!("a map handle points at a map variable"),
        })
    }
}
