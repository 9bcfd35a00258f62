//! The `state` interface: value, list and map variables of the current key, and their lazy
//! iterators, paged by count ([`MAX_PAGE`]) and by bytes ([`MAX_PAGE_BYTES`]).

use wasmtime::component::Resource;

use super::HostView;
use super::state::{
    JsonIteratorRes, JsonSource, ListStateRes, MapIteratorRes, MapStateRes, ValueStateRes,
};
use crate::bindings::statebox::processor::state;
use crate::bindings::statebox::processor::types::{self, StateError};

/// Largest page an iterator returns, whatever the guest asks for.
pub(crate) const MAX_PAGE: u32 = 4096;
/// A page also ends once it holds this many bytes of values (and map keys): however large
/// the values, one page costs the host about this much (plus one value).
pub(crate) const MAX_PAGE_BYTES: usize = 1 << 20;

impl types::Host for HostView<'_> {}

impl HostView<'_> {
    /// The variable (or iterator) behind a guest's handle; a handle the table does not hold
    /// traps.
    fn var<T: 'static>(&self, res: &Resource<T>) -> wasmtime::Result<&T> {
        Ok(self.sandbox.table.get(res)?)
    }

    /// `json`'s canonical form as a user key of the map behind `map`.
    fn map_user_key(
        &mut self,
        map: &Resource<MapStateRes>,
        json: &str,
    ) -> wasmtime::Result<Result<Vec<u8>, StateError>> {
        Ok(self.sandbox.table.get_mut(map)?.user_key(json))
    }

    /// Adds an iterator to the table, unless the instance holds too many already.
    fn push_iterator<T: Send + 'static>(
        &mut self,
        it: T,
    ) -> wasmtime::Result<Result<Resource<T>, StateError>> {
        if let Err(e) = self.state.iterator_allowed() {
            return Ok(Err(e));
        }
        let res = self.sandbox.table.push(it)?;
        self.state.live_iterators += 1;
        Ok(Ok(res))
    }
}

impl state::Host for HostView<'_> {}

impl state::HostValueState for HostView<'_> {
    fn exists(
        &mut self,
        this: Resource<ValueStateRes>,
    ) -> wasmtime::Result<Result<bool, StateError>> {
        let var = self.var(&this)?.0.clone();
        Ok(Ok(op!(self, "value-state.exists", |txn, key| txn
            .value_get(var.id, key))
        .is_some()))
    }

    fn get(
        &mut self,
        this: Resource<ValueStateRes>,
    ) -> wasmtime::Result<Result<Option<String>, StateError>> {
        let var = self.var(&this)?.0.clone();
        let stored = op!(self, "value-state.get", |txn, key| txn
            .value_get(var.id, key));
        Ok(stored
            .map(|s| self.state.value_payload(&var, s))
            .transpose())
    }

    fn update(
        &mut self,
        this: Resource<ValueStateRes>,
        value: String,
    ) -> wasmtime::Result<Result<(), StateError>> {
        self.value_update(&this, value, None)
    }

    fn clear(&mut self, this: Resource<ValueStateRes>) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        op!(self, "value-state.clear", |txn, key| txn
            .value_delete(var.id, key));
        Ok(Ok(()))
    }

    fn number(&mut self, this: Resource<ValueStateRes>) -> wasmtime::Result<u32> {
        self.var(&this)?;
        Ok(this.rep())
    }

    fn drop(&mut self, rep: Resource<ValueStateRes>) -> wasmtime::Result<()> {
        self.sandbox.table.delete(rep)?;
        Ok(())
    }
}

impl state::HostListState for HostView<'_> {
    fn exists(
        &mut self,
        this: Resource<ListStateRes>,
    ) -> wasmtime::Result<Result<bool, StateError>> {
        let var = self.var(&this)?.0.clone();
        Ok(Ok(op!(self, "list-state.exists", |txn, key| txn
            .list_exists(var.id, key))))
    }

    fn get(
        &mut self,
        this: Resource<ListStateRes>,
    ) -> wasmtime::Result<Result<Resource<JsonIteratorRes>, StateError>> {
        let var = self.var(&this)?.0.clone();
        if let Err(e) = self.state.access("list-state.get") {
            return Ok(Err(e));
        }
        let it = JsonIteratorRes {
            var,
            key: self.state.key.clone(),
            scope: self.state.scope(),
            source: JsonSource::List { after: None },
        };
        self.push_iterator(it)
    }

    fn put(
        &mut self,
        this: Resource<ListStateRes>,
        values: Vec<String>,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        let values = match self.state.encode_values(&var, values) {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "list-state.put", |txn, key| txn
            .list_put(var.id, key, values));
        Ok(Ok(()))
    }

    fn append_value(
        &mut self,
        this: Resource<ListStateRes>,
        value: String,
    ) -> wasmtime::Result<Result<(), StateError>> {
        self.list_append_value(&this, value, None)
    }

    fn append_list(
        &mut self,
        this: Resource<ListStateRes>,
        values: Vec<String>,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        let values = match self.state.encode_values(&var, values) {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "list-state.append-list", |txn, key| txn
            .list_append(var.id, key, values));
        Ok(Ok(()))
    }

    fn clear(&mut self, this: Resource<ListStateRes>) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        op!(self, "list-state.clear", |txn, key| txn
            .list_clear(var.id, key));
        Ok(Ok(()))
    }

    fn number(&mut self, this: Resource<ListStateRes>) -> wasmtime::Result<u32> {
        self.var(&this)?;
        Ok(this.rep())
    }

    fn drop(&mut self, rep: Resource<ListStateRes>) -> wasmtime::Result<()> {
        self.sandbox.table.delete(rep)?;
        Ok(())
    }
}

impl state::HostMapState for HostView<'_> {
    fn exists(
        &mut self,
        this: Resource<MapStateRes>,
    ) -> wasmtime::Result<Result<bool, StateError>> {
        let var = self.var(&this)?.0.clone();
        Ok(Ok(op!(self, "map-state.exists", |txn, key| txn
            .map_exists(var.id, key))))
    }

    fn get_value(
        &mut self,
        this: Resource<MapStateRes>,
        user_key_json: String,
    ) -> wasmtime::Result<Result<Option<String>, StateError>> {
        let var = self.var(&this)?.0.clone();
        let uk = match self.map_user_key(&this, &user_key_json)? {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        let stored = op!(self, "map-state.get-value", |txn, key| txn
            .map_get(var.id, key, &uk));
        Ok(stored
            .map(|s| self.state.value_payload(&var, s))
            .transpose())
    }

    fn contains_key(
        &mut self,
        this: Resource<MapStateRes>,
        user_key_json: String,
    ) -> wasmtime::Result<Result<bool, StateError>> {
        let var = self.var(&this)?.0.clone();
        let uk = match self.map_user_key(&this, &user_key_json)? {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        Ok(Ok(op!(self, "map-state.contains-key", |txn, key| txn
            .map_get(var.id, key, &uk))
        .is_some()))
    }

    fn update_value(
        &mut self,
        this: Resource<MapStateRes>,
        user_key_json: String,
        value: String,
    ) -> wasmtime::Result<Result<(), StateError>> {
        self.map_update_value(&this, &user_key_json, value, None)
    }

    fn remove_key(
        &mut self,
        this: Resource<MapStateRes>,
        user_key_json: String,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        let uk = match self.map_user_key(&this, &user_key_json)? {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "map-state.remove-key", |txn, key| txn
            .map_remove(var.id, key, &uk));
        Ok(Ok(()))
    }

    fn iterator(
        &mut self,
        this: Resource<MapStateRes>,
    ) -> wasmtime::Result<Result<Resource<MapIteratorRes>, StateError>> {
        let var = self.var(&this)?.0.clone();
        if let Err(e) = self.state.access("map-state.iterator") {
            return Ok(Err(e));
        }
        let it = MapIteratorRes {
            var,
            key: self.state.key.clone(),
            scope: self.state.scope(),
            after: None,
        };
        self.push_iterator(it)
    }

    fn keys(
        &mut self,
        this: Resource<MapStateRes>,
    ) -> wasmtime::Result<Result<Resource<JsonIteratorRes>, StateError>> {
        self.json_iter(this, "map-state.keys", JsonSource::MapKeys { after: None })
    }

    fn values(
        &mut self,
        this: Resource<MapStateRes>,
    ) -> wasmtime::Result<Result<Resource<JsonIteratorRes>, StateError>> {
        self.json_iter(
            this,
            "map-state.values",
            JsonSource::MapValues { after: None },
        )
    }

    fn clear(&mut self, this: Resource<MapStateRes>) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(&this)?.0.clone();
        op!(self, "map-state.clear", |txn, key| txn
            .map_clear(var.id, key));
        Ok(Ok(()))
    }

    fn number(&mut self, this: Resource<MapStateRes>) -> wasmtime::Result<u32> {
        self.var(&this)?;
        Ok(this.rep())
    }

    fn drop(&mut self, rep: Resource<MapStateRes>) -> wasmtime::Result<()> {
        self.sandbox.table.delete(rep)?;
        Ok(())
    }
}

/// The writes a guest may hold back and send together (`keys.apply-writes`), each for the
/// current key (`entry` is `None`) or for an entry of the batched call in progress.
impl HostView<'_> {
    pub(super) fn value_update(
        &mut self,
        this: &Resource<ValueStateRes>,
        value: String,
        entry: Option<u32>,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(this)?.0.clone();
        let stored = match self.state.encode_value(&var, value, "value") {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "value-state.update", entry, |txn, key| txn
            .value_put(var.id, key, stored));
        Ok(Ok(()))
    }

    pub(super) fn list_append_value(
        &mut self,
        this: &Resource<ListStateRes>,
        value: String,
        entry: Option<u32>,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(this)?.0.clone();
        let values = match self.state.encode_values(&var, vec![value]) {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "list-state.append-value", entry, |txn, key| txn
            .list_append(var.id, key, values));
        Ok(Ok(()))
    }

    pub(super) fn map_update_value(
        &mut self,
        this: &Resource<MapStateRes>,
        user_key_json: &str,
        value: String,
        entry: Option<u32>,
    ) -> wasmtime::Result<Result<(), StateError>> {
        let var = self.var(this)?.0.clone();
        let uk = match self.map_user_key(this, user_key_json)?.and_then(|uk| {
            self.state.count_written(uk.len())?;
            Ok(uk)
        }) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        let stored = match self.state.encode_value(&var, value, "map value") {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        op!(self, "map-state.update-value", entry, |txn, key| txn
            .map_put(var.id, key, &uk, stored));
        Ok(Ok(()))
    }

    fn json_iter(
        &mut self,
        this: Resource<MapStateRes>,
        what: &str,
        source: JsonSource,
    ) -> wasmtime::Result<Result<Resource<JsonIteratorRes>, StateError>> {
        let var = self.var(&this)?.0.clone();
        if let Err(e) = self.state.access(what) {
            return Ok(Err(e));
        }
        let it = JsonIteratorRes {
            var,
            key: self.state.key.clone(),
            scope: self.state.scope(),
            source,
        };
        self.push_iterator(it)
    }
}

impl state::HostJsonIterator for HostView<'_> {
    fn next_page(
        &mut self,
        this: Resource<JsonIteratorRes>,
        max: u32,
    ) -> wasmtime::Result<Result<Vec<String>, StateError>> {
        let max = max.clamp(1, MAX_PAGE) as usize;
        let it = self.sandbox.table.get(&this)?;
        if let Err(e) = self.state.iter_guard(it.scope) {
            return Ok(Err(e));
        }
        let var = it.var.clone();
        let key = it.key.clone();
        let txn = self.state.txn();
        let mut out = Vec::new();
        match &it.source {
            JsonSource::List { after } => {
                let page =
                    match txn.list_page_within(var.id, key.as_bytes(), *after, max, MAX_PAGE_BYTES)
                    {
                        Ok(p) => p,
                        Err(e) => return Err(self.state.fail(e)),
                    };
                let last = page.last().map(|(seq, _)| *seq);
                for (_, v) in page {
                    match self.state.value_payload(&var, v) {
                        Ok(p) => out.push(p),
                        Err(e) => return Ok(Err(e)),
                    }
                }
                if let Some(last) = last {
                    self.sandbox.table.get_mut(&this)?.source =
                        JsonSource::List { after: Some(last) };
                }
            }
            JsonSource::MapKeys { after } | JsonSource::MapValues { after } => {
                let keys_only = matches!(it.source, JsonSource::MapKeys { .. });
                let page = match txn.map_page_within(
                    var.id,
                    key.as_bytes(),
                    after.as_deref(),
                    max,
                    MAX_PAGE_BYTES,
                ) {
                    Ok(p) => p,
                    Err(e) => return Err(self.state.fail(e)),
                };
                let last = page.last().map(|(k, _)| k.clone());
                for (k, v) in page {
                    if keys_only {
                        out.push(String::from_utf8_lossy(&k).into_owned());
                    } else {
                        match self.state.value_payload(&var, v) {
                            Ok(p) => out.push(p),
                            Err(e) => return Ok(Err(e)),
                        }
                    }
                }
                if let Some(last) = last {
                    let source = if keys_only {
                        JsonSource::MapKeys { after: Some(last) }
                    } else {
                        JsonSource::MapValues { after: Some(last) }
                    };
                    self.sandbox.table.get_mut(&this)?.source = source;
                }
            }
        }
        Ok(Ok(out))
    }

    fn drop(&mut self, rep: Resource<JsonIteratorRes>) -> wasmtime::Result<()> {
        self.sandbox.table.delete(rep)?;
        self.state.live_iterators -= 1;
        Ok(())
    }
}

impl state::HostMapIterator for HostView<'_> {
    fn next_page(
        &mut self,
        this: Resource<MapIteratorRes>,
        max: u32,
    ) -> wasmtime::Result<Result<Vec<state::MapEntry>, StateError>> {
        let max = max.clamp(1, MAX_PAGE) as usize;
        let it = self.sandbox.table.get(&this)?;
        if let Err(e) = self.state.iter_guard(it.scope) {
            return Ok(Err(e));
        }
        let var = it.var.clone();
        let key = it.key.clone();
        let after = it.after.clone();
        let txn = self.state.txn();
        let page = match txn.map_page_within(
            var.id,
            key.as_bytes(),
            after.as_deref(),
            max,
            MAX_PAGE_BYTES,
        ) {
            Ok(p) => p,
            Err(e) => return Err(self.state.fail(e)),
        };
        let last = page.last().map(|(k, _)| k.clone());
        let mut out = Vec::with_capacity(page.len());
        for (k, v) in page {
            match self.state.value_payload(&var, v) {
                Ok(value) => out.push(state::MapEntry {
                    key: String::from_utf8_lossy(&k).into_owned(),
                    value,
                }),
                Err(e) => return Ok(Err(e)),
            }
        }
        if last.is_some() {
            self.sandbox.table.get_mut(&this)?.after = last;
        }
        Ok(Ok(out))
    }

    fn drop(&mut self, rep: Resource<MapIteratorRes>) -> wasmtime::Result<()> {
        self.sandbox.table.delete(rep)?;
        self.state.live_iterators -= 1;
        Ok(())
    }
}
