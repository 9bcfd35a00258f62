//! The in-memory backend: a `BTreeMap` behind a lock. For tests and ephemeral runs.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{PoisonError, RwLock};

use crate::Result;
use crate::engine::{GetFn, KvEngine, ScanFn, WriteBatch, WriteOp};

/// An ordered in-memory store.
#[derive(Debug, Default)]
pub(crate) struct MemEngine {
    map: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl KvEngine for MemEngine {
    fn get_with(&self, key: &[u8], f: &mut GetFn<'_>) -> Result<bool> {
        // A panic elsewhere cannot leave the map half-updated (`write` mutates only after
        // all fallible work), so a poisoned lock is safe to keep using.
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        match map.get(key) {
            Some(v) => f(v).map(|()| true),
            None => Ok(false),
        }
    }

    fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        for (k, v) in map.range::<[u8], _>((Bound::Included(start), Bound::Excluded(end))) {
            if !f(k, v)? {
                break;
            }
        }
        Ok(())
    }

    fn last_key_in(&self, start: &[u8], end: &[u8]) -> Result<Option<Vec<u8>>> {
        if start >= end {
            return Ok(None);
        }
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let last = map
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
            .next_back();
        Ok(last.map(|(k, _)| k.clone()))
    }

    fn write(&self, batch: &WriteBatch) -> Result<()> {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        for op in batch.ops() {
            match op {
                WriteOp::Put(k, v) => {
                    map.insert(k.clone(), v.clone());
                }
                WriteOp::Delete(k) => {
                    map.remove(k);
                }
                WriteOp::DeleteRange(start, end) => {
                    if start >= end {
                        continue;
                    }
                    let doomed: Vec<Vec<u8>> = map
                        .range::<[u8], _>((Bound::Included(&start[..]), Bound::Excluded(&end[..])))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in doomed {
                        map.remove(&k);
                    }
                }
            }
        }
        Ok(())
    }
}
