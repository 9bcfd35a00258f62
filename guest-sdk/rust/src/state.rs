//! Typed state variables: [`ValueState`], [`ListState`] and [`MapState`], and their lazy
//! iterators.
//!
//! Every operation acts on the grouping key of the call in progress; a processor never names
//! the key, so it can never touch another key's state. Values cross to the host as JSON
//! through `serde`, and the host checks them against the schema the variable was declared
//! with. State can be used only inside `handle_input_rows`, `handle_expired_timer` and
//! `handle_initial_state`.

use std::borrow::Borrow;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::__private::bindings::statebox::processor::state as wit;
use crate::error::LiftHost;
use crate::{Error, Result, held};

#[cfg(not(target_arch = "wasm32"))]
use crate::mem::MemVar;

/// How many items an iterator fetches from the host per page.
const PAGE_SIZE: u32 = 256;

/// Where a state variable lives: in the host, through the WIT imports, or in the test
/// harness's in-memory store. On wasm32 only the host exists, so matching is free.
pub(crate) enum Backend<H> {
    Host(H),
    #[cfg(not(target_arch = "wasm32"))]
    Mem(MemVar),
}

impl<H> Backend<H> {
    /// The variable's number in the host, as `number` reads it from the resource (0 in the
    /// test harness, which holds no writes).
    fn number(&self, number: impl FnOnce(&H) -> u32) -> u32 {
        match self {
            Backend::Host(state) => number(state),
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(_) => 0,
        }
    }
}

fn encode<T: Serialize + ?Sized>(what: &str, value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|err| Error::json(what, err))
}

fn decode<T: DeserializeOwned>(what: &str, json: &str) -> Result<T> {
    serde_json::from_str(json).map_err(|err| Error::json(what, err))
}

fn encode_all<T: Serialize>(what: &str, values: &[T]) -> Result<Vec<String>> {
    values.iter().map(|value| encode(what, value)).collect()
}

/// A single value per grouping key. Mirrors Spark's `ValueState`.
///
/// `T` and the declared schema describe the same JSON: `ValueState<i64>` with `"long"`, or a
/// `#[derive(Serialize, Deserialize)]` struct with a field list such as
/// `"name string, visits int"`.
pub struct ValueState<T> {
    backend: Backend<wit::ValueState>,
    /// The variable's number in the host (0 in the test harness).
    number: u32,
    _value: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> ValueState<T> {
    pub(crate) fn new(backend: Backend<wit::ValueState>) -> Self {
        let number = backend.number(wit::ValueState::number);
        ValueState {
            backend,
            number,
            _value: PhantomData,
        }
    }

    /// Whether the current key has a value.
    pub fn exists(&self) -> Result<bool> {
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.exists().lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.value_exists(),
        }
    }

    /// The current key's value, or `None`.
    pub fn get(&self) -> Result<Option<T>> {
        let json = match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.get().lift()?
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.value_get()?,
        };
        json.map(|json| decode("value state", &json)).transpose()
    }

    /// Replaces the current key's value, restarting its TTL.
    pub fn update(&self, value: &T) -> Result<()> {
        let json = encode("value state", value)?;
        match &self.backend {
            Backend::Host(_) if held::holding() => held::hold(self.number, json, None),
            Backend::Host(state) => state.update(&json).lift(),
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.value_update(json),
        }
    }

    /// Removes the current key's value.
    pub fn clear(&self) -> Result<()> {
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.clear().lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.value_clear(),
        }
    }
}

/// An ordered list of values per grouping key. Mirrors Spark's `ListState`.
///
/// Lists may be larger than guest memory should hold: [`get`](Self::get) returns a lazy
/// iterator that fetches the list from the host page by page.
pub struct ListState<T> {
    backend: Backend<wit::ListState>,
    /// The variable's number in the host (0 in the test harness).
    number: u32,
    _value: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> ListState<T> {
    pub(crate) fn new(backend: Backend<wit::ListState>) -> Self {
        let number = backend.number(wit::ListState::number);
        ListState {
            backend,
            number,
            _value: PhantomData,
        }
    }

    /// Whether the current key's list has at least one element.
    pub fn exists(&self) -> Result<bool> {
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.exists().lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.list_exists(),
        }
    }

    /// Iterates the current key's list in insertion order, fetching it lazily. The iterator is
    /// valid only during the handler call that created it.
    pub fn get(&self) -> Result<Iter<T>> {
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                Ok(Iter::host(state.get().lift()?, self.number))
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => Ok(Iter::buffered(var.list_get()?)),
        }
    }

    /// Replaces the whole list, restarting every element's TTL. An empty slice or an element
    /// that serializes to `null` is an error.
    pub fn put(&self, values: &[T]) -> Result<()> {
        let json = encode_all("list element", values)?;
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.put(&json).lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.list_put(json),
        }
    }

    /// Appends one element, with its own TTL. An element that serializes to `null` is an error.
    pub fn append_value(&self, value: &T) -> Result<()> {
        let json = encode("list element", value)?;
        match &self.backend {
            Backend::Host(_) if held::holding() => held::hold(self.number, json, None),
            Backend::Host(state) => state.append_value(&json).lift(),
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.list_append(vec![json]),
        }
    }

    /// Appends elements in order, each with its own TTL. An empty slice or an element that
    /// serializes to `null` is an error.
    pub fn append_list(&self, values: &[T]) -> Result<()> {
        let json = encode_all("list element", values)?;
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.append_list(&json).lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.list_append(json),
        }
    }

    /// Removes the current key's list.
    pub fn clear(&self) -> Result<()> {
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.clear().lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.list_clear(),
        }
    }
}

/// A map from user keys `K` to values `V` per grouping key. Mirrors Spark's `MapState`.
///
/// Iteration is lazy and ordered by the host: ascending by the user key's canonical encoding.
/// Lookups take any borrowed form of `K`, so a `MapState<String, i64>` is queried with a
/// `&str`.
pub struct MapState<K, V> {
    backend: Backend<wit::MapState>,
    /// The variable's number in the host (0 in the test harness).
    number: u32,
    _entry: PhantomData<fn() -> (K, V)>,
}

impl<K, V> MapState<K, V>
where
    K: Serialize + DeserializeOwned,
    V: Serialize + DeserializeOwned,
{
    pub(crate) fn new(backend: Backend<wit::MapState>) -> Self {
        let number = backend.number(wit::MapState::number);
        MapState {
            backend,
            number,
            _entry: PhantomData,
        }
    }

    /// Whether the current key's map has at least one entry.
    pub fn exists(&self) -> Result<bool> {
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.exists().lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.map_exists(),
        }
    }

    /// The value stored under `key`, or `None`.
    pub fn get_value<Q>(&self, key: &Q) -> Result<Option<V>>
    where
        K: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let key = encode("map key", key)?;
        let json = match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.get_value(&key).lift()?
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.map_get(&key)?,
        };
        json.map(|json| decode("map value", &json)).transpose()
    }

    /// Whether `key` is present.
    pub fn contains_key<Q>(&self, key: &Q) -> Result<bool>
    where
        K: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let key = encode("map key", key)?;
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.contains_key(&key).lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.map_contains(&key),
        }
    }

    /// Inserts or replaces the entry for `key`, restarting that entry's TTL.
    pub fn update_value<Q>(&self, key: &Q, value: &V) -> Result<()>
    where
        K: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let key = encode("map key", key)?;
        let value = encode("map value", value)?;
        match &self.backend {
            Backend::Host(_) if held::holding() => held::hold(self.number, value, Some(key)),
            Backend::Host(state) => state.update_value(&key, &value).lift(),
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.map_update(&key, value),
        }
    }

    /// Removes the entry for `key`, if any.
    pub fn remove_key<Q>(&self, key: &Q) -> Result<()>
    where
        K: Borrow<Q>,
        Q: Serialize + ?Sized,
    {
        let key = encode("map key", key)?;
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.remove_key(&key).lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.map_remove(&key),
        }
    }

    /// Iterates the current key's entries lazily, in user-key order. The iterator is valid only
    /// during the handler call that created it.
    pub fn iter(&self) -> Result<MapIter<K, V>> {
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                Ok(MapIter::host(state.iterator().lift()?, self.number))
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => Ok(MapIter::buffered(var.map_entries()?)),
        }
    }

    /// Iterates the current key's user keys lazily, in order.
    pub fn keys(&self) -> Result<Iter<K>> {
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                Ok(Iter::host(state.keys().lift()?, self.number))
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => Ok(Iter::buffered(
                var.map_entries()?.into_iter().map(|e| e.key).collect(),
            )),
        }
    }

    /// Iterates the current key's values lazily, in user-key order.
    pub fn values(&self) -> Result<Iter<V>> {
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                Ok(Iter::host(state.values().lift()?, self.number))
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => Ok(Iter::buffered(
                var.map_entries()?.into_iter().map(|e| e.value).collect(),
            )),
        }
    }

    /// Removes every entry of the current key; other keys are untouched.
    pub fn clear(&self) -> Result<()> {
        match &self.backend {
            Backend::Host(state) => {
                held::sync(self.number)?;
                state.clear().lift()
            }
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Mem(var) => var.map_clear(),
        }
    }
}

/// A lazy iterator over the elements of a [`ListState`] or the keys or values of a
/// [`MapState`]. It fetches 256 items from the host at a time and decodes each as it
/// is yielded; after an error it ends.
pub struct Iter<T> {
    source: Option<wit::JsonIterator>,
    /// The variable iterated (its number), whose held writes a page must see.
    number: u32,
    page: std::vec::IntoIter<String>,
    _item: PhantomData<fn() -> T>,
}

impl<T> Iter<T> {
    fn host(source: wit::JsonIterator, number: u32) -> Self {
        Iter {
            source: Some(source),
            number,
            page: Vec::new().into_iter(),
            _item: PhantomData,
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn buffered(items: Vec<String>) -> Self {
        Iter {
            source: None,
            number: 0,
            page: items.into_iter(),
            _item: PhantomData,
        }
    }
}

impl<T: DeserializeOwned> Iterator for Iter<T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        loop {
            if let Some(json) = self.page.next() {
                return Some(decode("state element", &json));
            }
            let source = self.source.as_ref()?;
            if let Err(err) = held::sync(self.number) {
                self.source = None;
                return Some(Err(err));
            }
            match source.next_page(PAGE_SIZE) {
                Ok(page) if page.is_empty() => self.source = None,
                Ok(page) => self.page = page.into_iter(),
                Err(err) => {
                    self.source = None;
                    return Some(Err(Error::from_host(err)));
                }
            }
        }
    }
}

/// A lazy iterator over the `(key, value)` entries of a [`MapState`], in user-key order. It
/// fetches 256 entries from the host at a time; after an error it ends.
pub struct MapIter<K, V> {
    source: Option<wit::MapIterator>,
    /// The variable iterated (its number), whose held writes a page must see.
    number: u32,
    page: std::vec::IntoIter<wit::MapEntry>,
    _entry: PhantomData<fn() -> (K, V)>,
}

impl<K, V> MapIter<K, V> {
    fn host(source: wit::MapIterator, number: u32) -> Self {
        MapIter {
            source: Some(source),
            number,
            page: Vec::new().into_iter(),
            _entry: PhantomData,
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn buffered(entries: Vec<wit::MapEntry>) -> Self {
        MapIter {
            source: None,
            number: 0,
            page: entries.into_iter(),
            _entry: PhantomData,
        }
    }
}

impl<K: DeserializeOwned, V: DeserializeOwned> Iterator for MapIter<K, V> {
    type Item = Result<(K, V)>;

    fn next(&mut self) -> Option<Result<(K, V)>> {
        loop {
            if let Some(entry) = self.page.next() {
                let decoded = decode("map key", &entry.key)
                    .and_then(|key| Ok((key, decode("map value", &entry.value)?)));
                return Some(decoded);
            }
            let source = self.source.as_ref()?;
            if let Err(err) = held::sync(self.number) {
                self.source = None;
                return Some(Err(err));
            }
            match source.next_page(PAGE_SIZE) {
                Ok(page) if page.is_empty() => self.source = None,
                Ok(page) => self.page = page.into_iter(),
                Err(err) => {
                    self.source = None;
                    return Some(Err(Error::from_host(err)));
                }
            }
        }
    }
}
