//! The conformance suite: every `Checkpoint` / `PartitionTxn` behaviour, run against every
//! backend by the `conformance!` macro at the bottom.
//!
//! (Long on purpose: one list of behaviours every backend must show, in one place, so the
//! macro runs each of them against each backend.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::engine::{GetFn, KvEngine, ScanFn, WriteBatch};
use crate::overlay::POINT_DELETE_LIMIT;
use crate::{
    ChangeStats, ChangelogWrite, Checkpoint, Commit, DueCursor, PartitionTxn, StoreError,
    StoredValue, changelog, keys,
};

/// A checkpoint on one backend, reopenable to check durability.
struct Fixture {
    dir: Option<tempfile::TempDir>,
    cp: Option<Checkpoint>,
    /// The state cache's budget of a durable checkpoint (0: none).
    cache: usize,
}

impl Fixture {
    fn mem() -> Self {
        Self {
            dir: None,
            cp: Some(Checkpoint::in_memory()),
            cache: 0,
        }
    }

    /// RocksDB alone, without the state cache.
    fn rocks() -> Self {
        Self::durable(0)
    }

    /// RocksDB behind a state cache small enough that the suite's data keeps evicting.
    fn cached() -> Self {
        Self::durable(16 << 10)
    }

    /// RocksDB alone, with every write ingested as table files (see [`crate::ingest`]).
    fn ingested() -> Self {
        crate::rocks::tests::ingest_every_write();
        Self::durable(0)
    }

    fn durable(cache: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open_with_cache(dir.path(), cache).unwrap();
        Self {
            dir: Some(dir),
            cp: Some(cp),
            cache,
        }
    }

    fn cp(&self) -> &Checkpoint {
        self.cp.as_ref().unwrap()
    }

    /// Closes and reopens a durable checkpoint; the in-memory one just stays.
    fn reopen(&mut self) {
        if let Some(dir) = &self.dir {
            self.cp = None;
            self.cp = Some(Checkpoint::open_with_cache(dir.path(), self.cache).unwrap());
        }
    }

    fn commit(&self, txns: Vec<PartitionTxn>) {
        self.cp()
            .commit(Commit {
                txns,
                ..Commit::default()
            })
            .unwrap();
    }
}

fn v(payload: &str) -> StoredValue {
    StoredValue {
        schema_id: 0,
        expires_at_ms: None,
        payload: payload.as_bytes().to_vec(),
    }
}

fn vt(payload: &str, expires_at_ms: i64) -> StoredValue {
    StoredValue {
        expires_at_ms: Some(expires_at_ms),
        ..v(payload)
    }
}

fn payloads<K>(page: &[(K, StoredValue)]) -> Vec<String> {
    page.iter()
        .map(|(_, v)| String::from_utf8(v.payload.clone()).unwrap())
        .collect()
}

fn list_all(txn: &PartitionTxn, var: u32, key: &[u8]) -> Vec<String> {
    payloads(&txn.list_page(var, key, None, usize::MAX).unwrap())
}

fn numbered(range: std::ops::Range<usize>) -> Vec<StoredValue> {
    range.map(|i| v(&i.to_string())).collect()
}

fn strings(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| i.to_string()).collect()
}

/// Counts entries handed out by scans, to prove reads are paged.
struct Counting {
    inner: Arc<dyn KvEngine>,
    scanned: AtomicUsize,
}

impl KvEngine for Counting {
    fn get_with(&self, key: &[u8], f: &mut GetFn<'_>) -> crate::Result<bool> {
        self.inner.get_with(key, f)
    }

    fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> crate::Result<()> {
        self.inner.scan(start, end, &mut |k, v| {
            self.scanned.fetch_add(1, Ordering::Relaxed);
            f(k, v)
        })
    }

    fn last_key_in(&self, start: &[u8], end: &[u8]) -> crate::Result<Option<Vec<u8>>> {
        self.inner.last_key_in(start, end)
    }

    fn write(&self, batch: &WriteBatch) -> crate::Result<()> {
        self.inner.write(batch)
    }
}

// ---- Values ----

fn value_read_your_writes_and_commit(mut fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    assert_eq!(txn.value_get(1, b"k").unwrap(), None);
    txn.value_put(1, b"k", v("1")).unwrap();
    assert_eq!(txn.value_get(1, b"k").unwrap(), Some(v("1")));
    txn.value_put(1, b"k", v("2")).unwrap();
    assert_eq!(txn.pending_writes(), 1);
    fx.commit(vec![txn]);
    fx.reopen();

    let mut txn = fx.cp().txn(0);
    assert_eq!(txn.value_get(1, b"k").unwrap(), Some(v("2")));
    txn.value_delete(1, b"k").unwrap();
    assert_eq!(txn.value_get(1, b"k").unwrap(), None);
    txn.value_delete(1, b"never-there").unwrap();
    fx.commit(vec![txn]);
    fx.reopen();
    assert_eq!(fx.cp().txn(0).value_get(1, b"k").unwrap(), None);
}

fn reserving_room_is_a_hint(mut fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    txn.reserve(500, 2);
    // Room that cannot be allocated is not made, and nothing fails.
    txn.reserve(usize::MAX, 3);
    for i in 0..100 {
        let key = format!("k{i}");
        txn.value_put(1, key.as_bytes(), v(&i.to_string())).unwrap();
        txn.list_append(2, key.as_bytes(), vec![v("a")]).unwrap();
        txn.timer_register(key.as_bytes(), i).unwrap();
    }
    assert_eq!(txn.value_get(1, b"k7").unwrap(), Some(v("7")));
    fx.commit(vec![txn]);
    fx.reopen();
    let txn = fx.cp().txn(0);
    assert_eq!(txn.value_get(1, b"k99").unwrap(), Some(v("99")));
    assert!(txn.list_exists(2, b"k0").unwrap());
    assert_eq!(txn.timer_list(b"k42").unwrap(), vec![42]);
    assert_eq!(txn.timers_due(i64::MAX, 1000).unwrap().len(), 100);
}

fn uncommitted_writes_are_invisible(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    txn.value_put(1, b"k", v("1")).unwrap();
    txn.list_append(2, b"k", vec![v("a")]).unwrap();
    txn.timer_register(b"k", 5).unwrap();
    drop(txn);
    let txn = fx.cp().txn(0);
    assert_eq!(txn.value_get(1, b"k").unwrap(), None);
    assert!(!txn.list_exists(2, b"k").unwrap());
    assert!(txn.timers_due(i64::MAX, 10).unwrap().is_empty());
}

fn state_is_isolated_by_variable_and_key(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    // Keys chosen so that one is a byte prefix of another.
    for (var, key, val) in [
        (1, &b"a"[..], "1a"),
        (1, b"ab", "1ab"),
        (2, b"a", "2a"),
        (1, b"", "1"),
    ] {
        txn.value_put(var, key, v(val)).unwrap();
        txn.map_put(var, key, b"u", v(val)).unwrap();
        txn.list_append(var, key, vec![v(val)]).unwrap();
    }
    fx.commit(vec![txn]);
    let txn = fx.cp().txn(0);
    for (var, key, val) in [
        (1, &b"a"[..], "1a"),
        (1, b"ab", "1ab"),
        (2, b"a", "2a"),
        (1, b"", "1"),
    ] {
        assert_eq!(txn.value_get(var, key).unwrap(), Some(v(val)));
        assert_eq!(payloads(&txn.map_page(var, key, None, 10).unwrap()), [val]);
        assert_eq!(list_all(&txn, var, key), [val]);
    }
    assert_eq!(txn.value_get(2, b"ab").unwrap(), None);
}

fn values_keep_schema_id_and_expiry(fx: Fixture) {
    let mut txn = fx.cp().txn(3);
    let value = StoredValue {
        schema_id: 70_000,
        expires_at_ms: Some(-5),
        payload: b"{}".to_vec(),
    };
    txn.value_put(1, b"k", value.clone()).unwrap();
    fx.commit(vec![txn]);
    assert_eq!(fx.cp().txn(3).value_get(1, b"k").unwrap(), Some(value));
}

fn corrupt_stored_bytes_are_an_error(fx: Fixture) {
    let mut batch = WriteBatch::new();
    batch.put(keys::value_key(1, b"k"), b"{\"not\":\"ours\"}".to_vec());
    batch.put(keys::list_element_key(2, b"k", 0), vec![9, 9]);
    batch.put(keys::list_meta_key(3, b"k"), vec![1, 2, 3]);
    fx.cp().engine().write(&batch).unwrap();
    let mut txn = fx.cp().txn(0);
    assert!(matches!(
        txn.value_get(1, b"k"),
        Err(StoreError::Corrupt(_))
    ));
    assert!(matches!(
        txn.list_page(2, b"k", None, 10),
        Err(StoreError::Corrupt(_))
    ));
    assert!(matches!(
        txn.list_append(3, b"k", vec![v("x")]),
        Err(StoreError::Corrupt(_))
    ));
}

// ---- Metadata ----

fn metadata_put_scan_and_commit(mut fx: Fixture) {
    let cp = fx.cp();
    assert_eq!(cp.get_meta("query").unwrap(), None);
    cp.put_meta_sync("query", b"q").unwrap();
    cp.put_meta_sync("batch/2", b"b2").unwrap();
    cp.put_meta_sync("batch/1", b"b1").unwrap();
    cp.put_meta_sync("batch0", b"not a batch/").unwrap();
    let mut txn = cp.txn(0);
    txn.value_put(1, b"k", v("1")).unwrap();
    cp.commit(Commit {
        drop_vars: vec![],
        txns: vec![txn],
        meta: vec![
            ("commit/1".into(), Some(b"c1".to_vec())),
            ("batch/1".into(), None),
        ],
        changelog: None,
    })
    .unwrap();
    fx.reopen();
    let cp = fx.cp();
    assert_eq!(cp.get_meta("query").unwrap(), Some(b"q".to_vec()));
    assert_eq!(cp.get_meta("commit/1").unwrap(), Some(b"c1".to_vec()));
    assert_eq!(
        cp.scan_meta("batch/").unwrap(),
        [("batch/2".to_string(), b"b2".to_vec())]
    );
    let names: Vec<String> = cp
        .scan_meta("")
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["batch/2", "batch0", "commit/1", "query"]);
}

// ---- Lists ----

fn list_append_put_and_clear(mut fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    assert!(!txn.list_exists(1, b"k").unwrap());
    txn.list_append(1, b"k", vec![v("a"), v("b")]).unwrap();
    txn.list_append(1, b"k", vec![v("c")]).unwrap();
    txn.list_append(1, b"k", vec![]).unwrap();
    assert!(txn.list_exists(1, b"k").unwrap());
    assert_eq!(list_all(&txn, 1, b"k"), ["a", "b", "c"]);
    fx.commit(vec![txn]);
    fx.reopen();

    let mut txn = fx.cp().txn(0);
    txn.list_append(1, b"k", vec![v("d")]).unwrap();
    let page = txn.list_page(1, b"k", None, 10).unwrap();
    let seqs: Vec<u64> = page.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    txn.list_put(1, b"k", vec![v("x"), v("y")]).unwrap();
    assert_eq!(list_all(&txn, 1, b"k"), ["x", "y"]);
    fx.commit(vec![txn]);
    assert_eq!(list_all(&fx.cp().txn(0), 1, b"k"), ["x", "y"]);

    let mut txn = fx.cp().txn(0);
    txn.list_clear(1, b"k").unwrap();
    assert!(!txn.list_exists(1, b"k").unwrap());
    fx.commit(vec![txn]);
    fx.reopen();
    let txn = fx.cp().txn(0);
    assert!(!txn.list_exists(1, b"k").unwrap());
    assert!(list_all(&txn, 1, b"k").is_empty());
}

fn list_pages_resume_after_a_sequence(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    txn.list_append(1, b"k", numbered(0..10)).unwrap();
    fx.commit(vec![txn]);
    let mut txn = fx.cp().txn(0);
    txn.list_append(1, b"k", numbered(10..15)).unwrap();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = txn.list_page(1, b"k", after, 4).unwrap();
        assert!(page.len() <= 4);
        let Some(last) = page.last() else { break };
        after = Some(last.0);
        seen.extend(payloads(&page));
    }
    assert_eq!(seen, strings(0..15));
    assert!(
        txn.list_page(1, b"k", Some(u64::MAX), 4)
            .unwrap()
            .is_empty()
    );
    assert!(txn.list_page(1, b"k", None, 0).unwrap().is_empty());
}

/// Clears of small and large committed lists (point deletes vs a range tombstone) followed
/// by appends in the same batch keep exactly the new elements, before and after commit.
fn list_clear_then_append_in_one_batch(mut fx: Fixture) {
    for (var, len) in [(1, 3), (2, 64), (3, 65), (4, 500)] {
        let mut txn = fx.cp().txn(0);
        txn.list_append(var, b"k", numbered(0..len)).unwrap();
        fx.commit(vec![txn]);

        let mut txn = fx.cp().txn(0);
        txn.list_append(var, b"k", vec![v("pending")]).unwrap();
        txn.list_clear(var, b"k").unwrap();
        txn.list_append(var, b"k", vec![v("new1")]).unwrap();
        txn.list_append(var, b"k", vec![v("new2")]).unwrap();
        assert_eq!(list_all(&txn, var, b"k"), ["new1", "new2"], "len {len}");
        fx.commit(vec![txn]);
        fx.reopen();
        let txn = fx.cp().txn(0);
        assert_eq!(list_all(&txn, var, b"k"), ["new1", "new2"], "len {len}");
        let page = txn.list_page(var, b"k", None, 10).unwrap();
        assert_eq!(page[0].0, 0, "sequence restarts after a clear");

        // A second replace in a later batch stacks a new clear on top.
        let mut txn = fx.cp().txn(0);
        txn.list_put(var, b"k", numbered(0..len)).unwrap();
        txn.list_put(var, b"k", vec![v("last")]).unwrap();
        fx.commit(vec![txn]);
        assert_eq!(list_all(&fx.cp().txn(0), var, b"k"), ["last"]);
    }
}

/// Lists under appends, clears, TTL cleanups (which remove elements at a list's end too),
/// commits and reopens: the elements are always the model's, in order. An element appended
/// must never land on a sequence still held, nor be removed by the TTL index entry of one
/// that was (a clear restarts the sequence at 0 and leaves the index entries behind).
fn lists_match_a_model_under_random_operations(mut fx: Fixture) {
    let mut next = random();
    let keys: [&[u8]; 2] = [b"a", b"b"];
    let mut model: [Vec<(String, Option<i64>)>; 2] = Default::default();
    let mut now = 0;
    let mut txn = Some(fx.cp().txn(0));
    for step in 0..1_500 {
        let k = next(2) as usize;
        let t = txn.as_mut().unwrap();
        match next(100) {
            0..=54 => {
                let values: Vec<(String, Option<i64>)> = (0..1 + next(3))
                    .map(|i| {
                        let expiry = (next(2) == 0).then(|| now + 1 + next(6) as i64);
                        (format!("{step}.{i}"), expiry)
                    })
                    .collect();
                let stored = values
                    .iter()
                    .map(|(p, e)| match e {
                        Some(e) => vt(p, *e),
                        None => v(p),
                    })
                    .collect();
                t.list_append(1, keys[k], stored).unwrap();
                model[k].extend(values);
            }
            55..=59 => {
                t.list_clear(1, keys[k]).unwrap();
                model[k].clear();
            }
            60..=74 => {
                now += next(3) as i64;
                t.ttl_cleanup(now).unwrap();
                for m in &mut model {
                    m.retain(|(_, e)| e.is_none_or(|e| e > now));
                }
            }
            75..=94 => fx.commit(vec![txn.take().unwrap()]),
            _ => {
                fx.commit(vec![txn.take().unwrap()]);
                fx.reopen();
            }
        }
        let t = txn.get_or_insert_with(|| fx.cp().txn(0));
        for (key, m) in keys.iter().zip(&model) {
            let expected: Vec<&str> = m.iter().map(|(p, _)| p.as_str()).collect();
            assert_eq!(list_all(t, 1, key), expected, "step {step}");
        }
    }
}

/// Reading a batch's state ahead changes no answer. One batch's reads teach the next what
/// to read ahead; that batch then reads, for keys with state, without it, with expired
/// values, and for keys it writes before reading them, exactly what a batch that did not read
/// ahead reads. Backends that answer reads from disk read ahead every foreseen read; the one
/// in memory reads none.
fn reads_ahead_answer_what_point_reads_find(mut fx: Fixture) {
    const KEYS: usize = 300;
    let key = |i: usize| format!("k{i}").into_bytes();
    let mut txn = fx.cp().txn(0);
    // Every third key has no state; every fifth value has expired by the batches' clock.
    for i in (0..KEYS).filter(|i| i % 3 != 2) {
        let value = format!("v{i}");
        let value = if i % 5 == 0 {
            vt(&value, 50)
        } else {
            v(&value)
        };
        txn.value_put(1, &key(i), value).unwrap();
        txn.list_append(2, &key(i), vec![v("a"), v("b")]).unwrap();
        if i % 2 == 0 {
            txn.map_put(3, &key(i), b"calls", v(&format!("c{i}")))
                .unwrap();
        }
    }
    fx.commit(vec![txn]);
    fx.reopen();

    // What the counter does per key, after writing every seventh key's value first.
    let batch = |txn: &mut PartitionTxn| -> Vec<String> {
        txn.set_ttl_clock(Some(100));
        let shown = |v: Option<StoredValue>| v.map(|v| String::from_utf8(v.payload).unwrap());
        (0..KEYS + 50)
            .map(|i| {
                let k = key(i);
                if i % 7 == 0 {
                    txn.value_put(1, &k, v("new")).unwrap();
                }
                let value = shown(txn.value_get(1, &k).unwrap());
                let call = shown(txn.map_get(3, &k, b"calls").unwrap());
                txn.list_append(2, &k, vec![v("x")]).unwrap();
                let list = list_all(txn, 2, &k).join(",");
                format!("{i}: {value:?} {call:?} {list}")
            })
            .collect()
    };
    let expected: Vec<String> = (0..KEYS + 50)
        .map(|i| {
            let stored = i < KEYS && i % 3 != 2;
            let value = if i % 7 == 0 {
                Some("new".to_owned())
            } else {
                (stored && i % 5 != 0).then(|| format!("v{i}"))
            };
            let call = (stored && i % 2 == 0).then(|| format!("c{i}"));
            let list = if stored { "a,b,x" } else { "x" };
            format!("{i}: {value:?} {call:?} {list}")
        })
        .collect();

    // A checkpoint just opened has learned nothing to read ahead.
    let mut first = fx.cp().txn(0);
    first
        .read_ahead(
            (0..KEYS)
                .map(key)
                .collect::<Vec<_>>()
                .iter()
                .map(Vec::as_slice),
        )
        .unwrap();
    assert_eq!(first.read_ahead_len(), 0);
    assert_eq!(batch(&mut first), expected);
    // Sealed, it hands what it read to the next; not committed.
    first.seal();

    let grouping: Vec<Vec<u8>> = (0..KEYS + 50).map(key).collect();
    let mut ahead = fx.cp().txn(0);
    ahead
        .read_ahead(grouping.iter().map(Vec::as_slice))
        .unwrap();
    let read = ahead.read_ahead_len();
    if fx.dir.is_some() {
        // The value, the map entry and the list's length of every key, with state or not,
        // less what the state cache (if any) still held.
        assert!(read > (KEYS + 50) * 2, "read ahead {read}");
    } else {
        assert_eq!(read, 0, "a backend in memory reads nothing ahead");
    }
    assert_eq!(batch(&mut ahead), expected);
    let mut plain = fx.cp().txn(0);
    assert_eq!(batch(&mut plain), expected);
}

/// A 200k-element list reads page by page, each page touching only about a page of entries.
fn large_list_is_read_in_bounded_pages(fx: Fixture) {
    const LEN: usize = 200_000;
    const PAGE: usize = 1_000;
    let mut txn = fx.cp().txn(0);
    for chunk in (0..LEN).step_by(10_000) {
        txn.list_append(1, b"big", numbered(chunk..chunk + 10_000))
            .unwrap();
    }
    fx.commit(vec![txn]);

    let counting = Arc::new(Counting {
        inner: Arc::clone(fx.cp().engine()),
        scanned: AtomicUsize::new(0),
    });
    let cp = Checkpoint::with_engine(Arc::clone(&counting) as Arc<dyn KvEngine>);
    let mut txn = cp.txn(0);
    // Overlay writes mixed into the committed list must merge in order.
    txn.list_append(1, b"big", vec![v("tail")]).unwrap();
    assert!(txn.list_exists(1, b"big").unwrap());
    let mut after = None;
    let mut total = 0;
    let mut max_scanned = 0;
    loop {
        counting.scanned.store(0, Ordering::Relaxed);
        let page = txn.list_page(1, b"big", after, PAGE).unwrap();
        max_scanned = max_scanned.max(counting.scanned.load(Ordering::Relaxed));
        let Some(&(last, _)) = page.last() else { break };
        for (i, (seq, value)) in page.iter().enumerate() {
            assert_eq!(*seq as usize, total + i);
            let expected = if total + i == LEN {
                "tail".to_string()
            } else {
                (total + i).to_string()
            };
            assert_eq!(value.payload, expected.as_bytes());
        }
        total += page.len();
        after = Some(last);
    }
    assert_eq!(total, LEN + 1);
    assert!(
        max_scanned <= PAGE + 1,
        "a page scanned {max_scanned} entries"
    );
}

// ---- Maps ----

fn map_put_get_remove_and_page(mut fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    assert!(!txn.map_exists(1, b"k").unwrap());
    for uk in ["b", "a", "c", "a\0", ""] {
        txn.map_put(1, b"k", uk.as_bytes(), v(uk)).unwrap();
    }
    assert!(txn.map_exists(1, b"k").unwrap());
    fx.commit(vec![txn]);
    fx.reopen();

    let mut txn = fx.cp().txn(0);
    assert_eq!(txn.map_get(1, b"k", b"a").unwrap(), Some(v("a")));
    assert_eq!(txn.map_get(1, b"k", b"zz").unwrap(), None);
    txn.map_remove(1, b"k", b"b").unwrap();
    txn.map_remove(1, b"k", b"missing").unwrap();
    txn.map_put(1, b"k", b"bb", v("bb")).unwrap();
    txn.map_put(1, b"k", b"c", v("c2")).unwrap();
    let page = txn.map_page(1, b"k", None, 100).unwrap();
    let user_keys: Vec<&[u8]> = page.iter().map(|(k, _)| k.as_slice()).collect();
    assert_eq!(user_keys, [&b""[..], b"a", b"a\0", b"bb", b"c"]);
    assert_eq!(payloads(&page), ["", "a", "a\0", "bb", "c2"]);
    assert_eq!(
        payloads(&txn.map_page(1, b"k", Some(b"a"), 2).unwrap()),
        ["a\0", "bb"]
    );
    assert_eq!(
        payloads(&txn.map_page(1, b"k", Some(b"b"), 10).unwrap()),
        ["bb", "c2"]
    );
    assert!(txn.map_page(1, b"k", Some(b"c"), 10).unwrap().is_empty());
    fx.commit(vec![txn]);
    assert_eq!(
        payloads(&fx.cp().txn(0).map_page(1, b"k", None, 100).unwrap()),
        ["", "a", "a\0", "bb", "c2"]
    );
}

fn map_clear_then_put_in_one_batch(mut fx: Fixture) {
    for (var, len) in [(1, 2), (2, 300)] {
        let mut txn = fx.cp().txn(0);
        for i in 0..len {
            txn.map_put(var, b"k", format!("{i:05}").as_bytes(), v("old"))
                .unwrap();
        }
        txn.map_put(var, b"other", b"x", v("keep")).unwrap();
        fx.commit(vec![txn]);

        let mut txn = fx.cp().txn(0);
        txn.map_put(var, b"k", b"pending", v("gone")).unwrap();
        txn.map_clear(var, b"k").unwrap();
        assert!(!txn.map_exists(var, b"k").unwrap());
        assert_eq!(txn.map_get(var, b"k", b"00000").unwrap(), None);
        txn.map_put(var, b"k", b"00001", v("new")).unwrap();
        fx.commit(vec![txn]);
        fx.reopen();
        let txn = fx.cp().txn(0);
        let page = txn.map_page(var, b"k", None, 1000).unwrap();
        assert_eq!(page, [(b"00001".to_vec(), v("new"))], "len {len}");
        assert_eq!(txn.map_get(var, b"other", b"x").unwrap(), Some(v("keep")));
    }
}

/// A deterministic pseudo-random source (xorshift): `next(n)` is in `0..n`.
fn random() -> impl FnMut(u64) -> u64 {
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    }
}

/// Random map operations with commits in between, checked against a `BTreeMap` model.
fn map_matches_a_model_under_random_operations(fx: Fixture) {
    let mut next = random();
    let mut model: BTreeMap<Vec<u8>, StoredValue> = BTreeMap::new();
    let mut txn = fx.cp().txn(0);
    for step in 0..4_000 {
        let uk = format!("{:03}", next(150)).into_bytes();
        match next(100) {
            0..=49 => {
                let value = v(&step.to_string());
                txn.map_put(1, b"k", &uk, value.clone()).unwrap();
                model.insert(uk, value);
            }
            50..=79 => {
                txn.map_remove(1, b"k", &uk).unwrap();
                model.remove(&uk);
            }
            80..=81 => {
                txn.map_clear(1, b"k").unwrap();
                model.clear();
            }
            82..=89 => assert_eq!(txn.map_get(1, b"k", &uk).unwrap().as_ref(), model.get(&uk)),
            90..=96 => {
                let max = 1 + next(40) as usize;
                let page = txn.map_page(1, b"k", Some(&uk), max).unwrap();
                let expected: Vec<_> = model
                    .range::<[u8], _>((
                        std::ops::Bound::Excluded(&uk[..]),
                        std::ops::Bound::Unbounded,
                    ))
                    .take(max)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(page, expected, "step {step}");
            }
            _ => {
                fx.commit(vec![txn]);
                txn = fx.cp().txn(0);
            }
        }
    }
    let all = txn.map_page(1, b"k", None, usize::MAX).unwrap();
    assert_eq!(all, model.into_iter().collect::<Vec<_>>());
}

// ---- Timers ----

fn scans_of_committed_timers_start_at_the_time_floor(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    txn.timer_register(b"a", 30).unwrap();
    txn.timer_register(b"b", 50).unwrap();
    fx.commit(vec![txn]);

    let mut txn = fx.cp().txn(0);
    // The previous batch handled everything up to 39: scans of committed timers start at
    // 40, while timers buffered in this batch are always seen.
    txn.set_time_floor(Some(40));
    txn.timer_register(b"c", 10).unwrap();
    assert_eq!(
        txn.timers_due(100, 10).unwrap(),
        [(10, b"c".to_vec()), (50, b"b".to_vec())]
    );
    txn.set_time_floor(None);
    assert_eq!(txn.timers_due(100, 10).unwrap().len(), 3);
}

fn due_timers_page_through_committed_timers_once(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    for (key, ts) in [(b"a", 10), (b"b", 20), (b"c", 30), (b"d", 40), (b"e", 50)] {
        txn.timer_register(key, ts).unwrap();
    }
    txn.timer_register(b"f", 500).unwrap();
    fx.commit(vec![txn]);

    let mut txn = fx.cp().txn(0);
    let mut cursor = DueCursor::default();
    let page = txn.timers_due_from(100, 2, &mut cursor).unwrap();
    assert_eq!(page, [(10, b"a".to_vec()), (20, b"b".to_vec())]);
    // Fire the page: each timer is still registered until deleted.
    for (ts, key) in &page {
        assert!(txn.due_timer_still_registered(key, *ts).unwrap());
        txn.timer_delete(key, *ts).unwrap();
        assert!(!txn.due_timer_still_registered(key, *ts).unwrap());
    }
    // A handler registers a due timer earlier than the page, and deletes a committed one.
    txn.timer_register(b"z", 5).unwrap();
    txn.timer_delete(b"d", 40).unwrap();
    assert!(!txn.due_timer_still_registered(b"d", 40).unwrap());
    assert!(txn.due_timer_still_registered(b"c", 30).unwrap());
    let page = txn.timers_due_from(100, 2, &mut cursor).unwrap();
    assert_eq!(page, [(5, b"z".to_vec()), (30, b"c".to_vec())]);
    for (ts, key) in &page {
        txn.timer_delete(key, *ts).unwrap();
    }
    // A fired committed timer registered again is due again.
    txn.timer_register(b"b", 20).unwrap();
    let page = txn.timers_due_from(100, 2, &mut cursor).unwrap();
    assert_eq!(page, [(20, b"b".to_vec()), (50, b"e".to_vec())]);
    for (ts, key) in &page {
        txn.timer_delete(key, *ts).unwrap();
    }
    assert!(txn.timers_due_from(100, 2, &mut cursor).unwrap().is_empty());
    // The same scan without a cursor agrees: nothing is due.
    assert!(txn.timers_due(100, 10).unwrap().is_empty());
    assert_eq!(
        txn.timers_due(i64::MAX, 10).unwrap(),
        [(500, b"f".to_vec())]
    );
}

/// Paging through due timers, firing each page before reading the next, returns every due
/// timer once and in order: this batch's own, across pages and beside committed ones, and
/// the ones handlers register between pages, however early or late among the rest.
fn due_timers_page_through_this_batchs_timers_once(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    for ts in [15, 25, 35] {
        txn.timer_register(b"committed", ts).unwrap();
    }
    fx.commit(vec![txn]);

    let mut txn = fx.cp().txn(0);
    for (i, ts) in [1, 2, 3, 11, 12, 21, 31, 41].into_iter().enumerate() {
        txn.timer_register(format!("b{i}").as_bytes(), ts).unwrap();
    }
    // Not due.
    txn.timer_register(b"late", 1_000).unwrap();
    let mut cursor = DueCursor::default();
    let mut fired = Vec::new();
    let mut pages = 0;
    loop {
        let page = txn.timers_due_from(100, 3, &mut cursor).unwrap();
        if page.is_empty() {
            break;
        }
        for (ts, key) in &page {
            txn.timer_delete(key, *ts).unwrap();
            fired.push(*ts);
        }
        pages += 1;
        match pages {
            // Before everything read so far, and between the cursor and the next due one.
            1 => txn.timer_register(b"early", 0).unwrap(),
            2 => txn.timer_register(b"between", 13).unwrap(),
            // Written and deleted again: never due.
            3 => {
                txn.timer_register(b"gone", 5).unwrap();
                txn.timer_delete(b"gone", 5).unwrap();
            }
            _ => {}
        }
    }
    assert_eq!(fired, [1, 2, 3, 0, 11, 12, 13, 15, 21, 25, 31, 35, 41]);
    assert!(txn.timers_due(100, 10).unwrap().is_empty());
    assert_eq!(
        txn.timers_due(i64::MAX, 10).unwrap(),
        [(1_000, b"late".to_vec())]
    );
}

fn timers_register_list_delete_and_fire_in_order(mut fx: Fixture) {
    let mut txn = fx.cp().txn(1);
    txn.timer_register(b"b", 20).unwrap();
    txn.timer_register(b"a", 20).unwrap();
    txn.timer_register(b"a", -5).unwrap();
    txn.timer_register(b"a", 20).unwrap();
    txn.timer_register(b"c", 30).unwrap();
    txn.timer_delete(b"c", 99).unwrap();
    let mut other = fx.cp().txn(2);
    other.timer_register(b"z", 0).unwrap();
    assert_eq!(txn.timer_list(b"a").unwrap(), [-5, 20]);
    assert!(txn.timer_exists(b"a", -5).unwrap());
    assert!(txn.timer_exists(b"c", 30).unwrap());
    assert!(!txn.timer_exists(b"c", 99).unwrap());
    fx.commit(vec![txn, other]);
    fx.reopen();

    let mut txn = fx.cp().txn(1);
    // Committed timers are found by a point read; buffered deletes hide them.
    assert!(txn.timer_exists(b"a", 20).unwrap());
    assert!(!txn.timer_exists(b"a", 21).unwrap());
    txn.timer_delete(b"b", 20).unwrap();
    assert!(!txn.timer_exists(b"b", 20).unwrap());
    txn.timer_register(b"b", 20).unwrap();
    assert!(txn.timer_exists(b"b", 20).unwrap());
    assert_eq!(
        txn.timers_due(20, 10).unwrap(),
        [
            (-5, b"a".to_vec()),
            (20, b"a".to_vec()),
            (20, b"b".to_vec())
        ]
    );
    assert_eq!(txn.timers_due(19, 10).unwrap(), [(-5, b"a".to_vec())]);
    assert_eq!(txn.timers_due(i64::MAX, 2).unwrap().len(), 2);
    assert!(txn.timers_due(-6, 10).unwrap().is_empty());
    txn.timer_delete(b"a", -5).unwrap();
    txn.timer_register(b"d", 10).unwrap();
    assert_eq!(
        txn.timers_due(i64::MAX, 10).unwrap(),
        [
            (10, b"d".to_vec()),
            (20, b"a".to_vec()),
            (20, b"b".to_vec()),
            (30, b"c".to_vec())
        ]
    );
    assert_eq!(txn.timer_list(b"a").unwrap(), [20]);
    fx.commit(vec![txn]);
    let txn = fx.cp().txn(1);
    assert_eq!(txn.timer_list(b"a").unwrap(), [20]);
    assert_eq!(txn.timer_list(b"d").unwrap(), [10]);
    assert_eq!(fx.cp().txn(2).timers_due(i64::MIN + 1, 10).unwrap(), []);
    assert_eq!(
        fx.cp().txn(2).timers_due(0, 10).unwrap(),
        [(0, b"z".to_vec())]
    );
}

// ---- TTL ----

fn expired_values_are_hidden_from_reads(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    txn.value_put(1, b"k", vt("v", 100)).unwrap();
    txn.list_append(
        2,
        b"k",
        vec![vt("old", 100), v("forever"), vt("young", 200)],
    )
    .unwrap();
    txn.map_put(3, b"k", b"old", vt("old", 100)).unwrap();
    txn.list_append(4, b"k", vec![vt("old", 100)]).unwrap();
    txn.map_put(5, b"k", b"old", vt("old", 100)).unwrap();
    fx.commit(vec![txn]);

    let mut txn = fx.cp().txn(0);
    txn.set_ttl_clock(Some(99));
    assert!(txn.value_get(1, b"k").unwrap().is_some());
    assert_eq!(list_all(&txn, 2, b"k"), ["old", "forever", "young"]);
    txn.set_ttl_clock(Some(100));
    assert_eq!(txn.value_get(1, b"k").unwrap(), None);
    assert_eq!(list_all(&txn, 2, b"k"), ["forever", "young"]);
    assert_eq!(txn.map_get(3, b"k", b"old").unwrap(), None);
    assert!(txn.map_page(3, b"k", None, 10).unwrap().is_empty());
    assert!(!txn.list_exists(4, b"k").unwrap());
    assert!(!txn.map_exists(5, b"k").unwrap());
    assert!(txn.list_exists(2, b"k").unwrap());
    txn.set_ttl_clock(None);
    assert!(txn.list_exists(4, b"k").unwrap());
}

fn ttl_cleanup_removes_expired_entries_only(mut fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    txn.value_put(1, b"a", vt("a", 100)).unwrap();
    txn.value_put(1, b"b", vt("b", 100)).unwrap();
    txn.value_put(1, b"c", vt("c", 300)).unwrap();
    txn.value_put(1, b"d", v("d")).unwrap();
    txn.list_append(2, b"a", vec![vt("x", 50), v("y"), vt("z", 150)])
        .unwrap();
    txn.map_put(3, b"a", b"m", vt("m", 100)).unwrap();
    txn.value_put(1, b"gone", vt("gone", 100)).unwrap();
    let mut other = fx.cp().txn(1);
    other.value_put(1, b"p1", vt("p1", 100)).unwrap();
    fx.commit(vec![txn, other]);

    let mut txn = fx.cp().txn(0);
    // Overwritten with a later expiry: the old index entry is stale.
    txn.value_put(1, b"b", vt("b2", 500)).unwrap();
    txn.value_delete(1, b"gone").unwrap();
    assert_eq!(txn.ttl_cleanup(100).unwrap(), 3);
    txn.set_ttl_clock(None);
    assert_eq!(txn.value_get(1, b"a").unwrap(), None);
    assert_eq!(txn.value_get(1, b"b").unwrap(), Some(vt("b2", 500)));
    assert_eq!(txn.value_get(1, b"c").unwrap(), Some(vt("c", 300)));
    assert_eq!(txn.value_get(1, b"d").unwrap(), Some(v("d")));
    assert_eq!(list_all(&txn, 2, b"a"), ["y", "z"]);
    assert_eq!(txn.map_get(3, b"a", b"m").unwrap(), None);
    fx.commit(vec![txn]);
    fx.reopen();

    let mut txn = fx.cp().txn(0);
    assert_eq!(
        txn.ttl_cleanup(100).unwrap(),
        0,
        "index entries were consumed"
    );
    assert_eq!(txn.ttl_cleanup(1_000).unwrap(), 3);
    assert_eq!(list_all(&txn, 2, b"a"), ["y"]);
    assert_eq!(txn.value_get(1, b"d").unwrap(), Some(v("d")));
    fx.commit(vec![txn]);
    // Partition 1's index is its own.
    let mut other = fx.cp().txn(1);
    assert_eq!(other.value_get(1, b"p1").unwrap(), Some(vt("p1", 100)));
    assert_eq!(other.ttl_cleanup(100).unwrap(), 1);
    assert_eq!(other.value_get(1, b"p1").unwrap(), None);
}

fn ttl_cleanup_handles_more_than_one_chunk(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    for i in 0..2_500u32 {
        txn.map_put(1, b"k", &i.to_be_bytes(), vt("x", i64::from(i % 7)))
            .unwrap();
    }
    txn.map_put(1, b"k", b"live", vt("x", 1_000)).unwrap();
    fx.commit(vec![txn]);
    let mut txn = fx.cp().txn(0);
    assert_eq!(txn.ttl_cleanup(999).unwrap(), 2_500);
    fx.commit(vec![txn]);
    let txn = fx.cp().txn(0);
    assert_eq!(
        txn.map_page(1, b"k", None, 10).unwrap(),
        [(b"live".to_vec(), vt("x", 1_000))]
    );
    // Every index entry the cleanup read was deleted with its value: only the live one's
    // is left.
    let (start, end) = keys::prefix_range(keys::ttl_prefix(0));
    let mut index = Vec::new();
    fx.cp()
        .engine()
        .scan(&start, &end, &mut |k, _| {
            index.push(keys::decode_ttl_key(k).unwrap().0);
            Ok(true)
        })
        .unwrap();
    assert_eq!(index, [1_000]);
}

// ---- Change log ----

/// Commits `txns` and `drop_vars` as batch `batch` with its change log, keeping the logs of
/// the last `retain` batches. Keys starting with `b` are in partition 1, others in 0.
fn commit_logged(
    fx: &Fixture,
    batch: u64,
    drop_vars: Vec<u32>,
    txns: Vec<PartitionTxn>,
) -> ChangeStats {
    commit_retaining(fx, batch, 100, drop_vars, txns)
}

fn commit_retaining(
    fx: &Fixture,
    batch: u64,
    retain: u64,
    drop_vars: Vec<u32>,
    txns: Vec<PartitionTxn>,
) -> ChangeStats {
    fx.cp()
        .commit_with(
            Commit {
                drop_vars,
                txns,
                meta: vec![],
                changelog: Some(ChangelogWrite {
                    batch_id: batch,
                    retain_from: (batch + 1).saturating_sub(retain),
                    partition_of: Box::new(|key: &[u8]| u16::from(key.starts_with(b"b"))),
                }),
            },
            |_| Vec::new(),
        )
        .unwrap()
}

/// The logged changes of batches `from..=to` as `(batch, partition, change)`, the change
/// written `v1:a=payload` (value), `l2:a#seq=payload` (list), `m3:a.user=payload` (map),
/// `t:a@ts=+` (timer), with `-` for a delete.
fn logged(fx: &Fixture, from: u64, to: u64) -> Vec<(u64, u16, String)> {
    let mut out = Vec::new();
    fx.cp()
        .scan_changelog(from, to, |batch, partition, log| {
            for change in changelog::decode(log) {
                let change = change?;
                let ns = change.key[0];
                if ns == keys::TIMER_BY_KEY {
                    let (key, ts) = keys::decode_timer_key(change.key)?;
                    let op = if change.value.is_some() { "+" } else { "-" };
                    let key = String::from_utf8_lossy(key);
                    out.push((batch, partition, format!("t:{key}@{ts}={op}")));
                    continue;
                }
                let (var, key, suffix) = keys::decode_var_key(ns, change.key)?;
                let key = String::from_utf8_lossy(key);
                let at = match ns {
                    keys::VALUE => format!("v{var}:{key}"),
                    keys::LIST => format!("l{var}:{key}#{}", keys::decode_list_seq(change.key)?),
                    _ => format!("m{var}:{key}.{}", String::from_utf8_lossy(suffix)),
                };
                let value = match change.value {
                    Some(bytes) => String::from_utf8(StoredValue::decode(bytes)?.payload).unwrap(),
                    None => "-".into(),
                };
                out.push((batch, partition, format!("{at}={value}")));
            }
            Ok(true)
        })
        .unwrap();
    out
}

fn entries(batch: u64, partition: u16, changes: &[&str]) -> Vec<(u64, u16, String)> {
    changes
        .iter()
        .map(|c| (batch, partition, (*c).to_owned()))
        .collect()
}

fn changelog_records_point_writes_per_partition(mut fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    txn.value_put(1, b"a", v("1")).unwrap();
    txn.list_append(2, b"a", vec![v("x"), v("y")]).unwrap();
    txn.map_put(3, b"a", b"m", v("m1")).unwrap();
    txn.timer_register(b"a", 5).unwrap();
    let mut other = fx.cp().txn(1);
    other.value_put(1, b"b", v("2")).unwrap();
    commit_logged(&fx, 0, vec![], vec![txn, other, fx.cp().txn(2)]);

    let mut txn = fx.cp().txn(0);
    txn.value_put(1, b"a", v("3")).unwrap();
    txn.list_put(2, b"a", vec![v("z")]).unwrap();
    txn.map_remove(3, b"a", b"m").unwrap();
    commit_logged(&fx, 1, vec![], vec![txn]);
    fx.reopen();

    let mut want = entries(
        0,
        0,
        &["v1:a=1", "l2:a#0=x", "l2:a#1=y", "m3:a.m=m1", "t:a@5=+"],
    );
    want.extend(entries(0, 1, &["v1:b=2"]));
    want.extend(entries(
        1,
        0,
        &["v1:a=3", "l2:a#0=z", "l2:a#1=-", "m3:a.m=-"],
    ));
    assert_eq!(logged(&fx, 0, 1), want);
    assert_eq!(logged(&fx, 1, u64::MAX), want[6..]);
    assert_eq!(fx.cp().changelog_first_batch().unwrap(), Some(0));
    assert!(fx.cp().has_changelog(1).unwrap());
    assert!(!fx.cp().has_changelog(2).unwrap());
    // A commit without a change log records none.
    fx.commit(vec![fx.cp().txn(0)]);
    assert!(!fx.cp().has_changelog(2).unwrap());
}

fn changelog_lists_the_keys_range_tombstones_remove(fx: Fixture) {
    let n = POINT_DELETE_LIMIT + 10;
    let mut txn = fx.cp().txn(0);
    txn.list_append(2, b"a", numbered(0..n)).unwrap();
    for i in 0..n {
        txn.map_put(3, b"a", format!("k{i:03}").as_bytes(), v("old"))
            .unwrap();
    }
    commit_logged(&fx, 0, vec![], vec![txn]);

    let mut txn = fx.cp().txn(0);
    txn.list_put(2, b"a", vec![v("new")]).unwrap();
    txn.map_clear(3, b"a").unwrap();
    txn.map_put(3, b"a", b"k005", v("new")).unwrap();
    let sealed_ops = {
        // The clears are range tombstones, not point deletes.
        txn.seal();
        txn.pending_writes()
    };
    assert!(sealed_ops < n, "{sealed_ops}");
    commit_logged(&fx, 1, vec![], vec![txn]);

    let got: Vec<String> = logged(&fx, 1, 1).into_iter().map(|(_, _, c)| c).collect();
    let mut want = vec!["l2:a#0=new".to_owned(), "m3:a.k005=new".to_owned()];
    want.extend((1..n).map(|i| format!("l2:a#{i}=-")));
    want.extend(
        (0..n)
            .filter(|&i| i != 5)
            .map(|i| format!("m3:a.k{i:03}=-")),
    );
    assert_eq!(got, want);
}

fn changelog_lists_the_entries_of_dropped_variables(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    txn.value_put(1, b"a", v("va")).unwrap();
    txn.list_append(1, b"a", vec![v("la")]).unwrap();
    txn.map_put(1, b"a", b"m", v("ma")).unwrap();
    txn.value_put(2, b"a", v("kept")).unwrap();
    let mut other = fx.cp().txn(1);
    other.value_put(1, b"b", v("vb")).unwrap();
    commit_logged(&fx, 0, vec![], vec![txn, other]);

    let mut txn = fx.cp().txn(0);
    txn.value_put(2, b"a", v("new")).unwrap();
    commit_logged(&fx, 1, vec![1], vec![txn]);
    let mut want = entries(1, 0, &["v1:a=-", "l1:a#0=-", "m1:a.m=-", "v2:a=new"]);
    want.extend(entries(1, 1, &["v1:b=-"]));
    assert_eq!(logged(&fx, 1, 1), want);
}

fn changelog_shows_ttl_cleanup_as_deletes(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    txn.value_put(1, b"a", vt("a", 100)).unwrap();
    txn.value_put(1, b"c", vt("c", 300)).unwrap();
    txn.list_append(2, b"a", vec![vt("x", 50), v("y")]).unwrap();
    txn.map_put(3, b"a", b"m", vt("m", 100)).unwrap();
    commit_logged(&fx, 0, vec![], vec![txn]);

    let mut txn = fx.cp().txn(0);
    assert_eq!(txn.ttl_cleanup(100).unwrap(), 3);
    commit_logged(&fx, 1, vec![], vec![txn]);
    assert_eq!(
        logged(&fx, 1, 1),
        entries(1, 0, &["v1:a=-", "l2:a#0=-", "m3:a.m=-"])
    );
}

fn changelog_keeps_the_last_batches_only(mut fx: Fixture) {
    for batch in 0..6 {
        let mut txn = fx.cp().txn(0);
        txn.value_put(1, b"a", v(&batch.to_string())).unwrap();
        commit_retaining(&fx, batch, 2, vec![], vec![txn]);
    }
    fx.reopen();
    assert_eq!(fx.cp().changelog_first_batch().unwrap(), Some(4));
    assert!(!fx.cp().has_changelog(3).unwrap());
    let mut want = entries(4, 0, &["v1:a=4"]);
    want.extend(entries(5, 0, &["v1:a=5"]));
    assert_eq!(logged(&fx, 0, 10), want);
    // Batches without changes are retained too.
    commit_retaining(&fx, 6, 2, vec![], vec![fx.cp().txn(0)]);
    assert_eq!(fx.cp().changelog_first_batch().unwrap(), Some(5));
    assert!(fx.cp().has_changelog(6).unwrap());
    assert_eq!(logged(&fx, 6, 6), []);
}

fn changelog_in_chunks_reads_back_whole_and_in_order(mut fx: Fixture) {
    // Values of ~200 bytes: each batch's log of partition 0 is ~1 MiB, dozens of chunks.
    let n = 4_000;
    let key = |i: usize| format!("k{i:05}");
    let payload = |batch: usize, i: usize| format!("{batch}:{i}:{}", "x".repeat(200));
    for batch in 0..2 {
        let mut txn = fx.cp().txn(0);
        for i in 0..n {
            txn.value_put(1, key(i).as_bytes(), v(&payload(batch, i)))
                .unwrap();
        }
        let mut other = fx.cp().txn(1);
        other.value_put(1, b"b", v(&batch.to_string())).unwrap();
        commit_logged(&fx, batch as u64, vec![], vec![txn, other]);
    }
    fx.reopen();

    // Stored as many chunks, none much past the target.
    let (start, end) = keys::changelog_range(0, 1);
    let mut chunks = 0;
    fx.cp()
        .engine()
        .scan(&start, &end, &mut |k, v| {
            if keys::decode_changelog_key(k)? == (0, Some(0)) {
                chunks += 1;
                assert!(
                    v.len() < changelog::CHUNK_BYTES + 1_024,
                    "{} bytes",
                    v.len()
                );
            }
            Ok(true)
        })
        .unwrap();
    assert!(chunks > 20, "{chunks} chunks");

    // Read back whole, in order, by batch and partition.
    let mut want = Vec::new();
    for batch in 0..2 {
        let values: Vec<String> = (0..n)
            .map(|i| format!("v1:{}={}", key(i), payload(batch, i)))
            .collect();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        want.extend(entries(batch as u64, 0, &values));
        want.extend(entries(batch as u64, 1, &[&format!("v1:b={batch}")]));
    }
    assert_eq!(logged(&fx, 0, 1), want);
    // Each before-image is found in its chunk: batch 0's state is rebuilt from batch 1.
    let at_0 = state_at(&fx, 0, 1);
    assert_eq!(at_0.len(), n + 1);
    assert_eq!(at_0[0], "v:b=0");
    assert_eq!(at_0[1], format!("v:{}={}", key(0), payload(0, 0)));
    assert_eq!(at_0[n], format!("v:{}={}", key(n - 1), payload(0, n - 1)));

    // A log stored whole, as before chunks, reads the same.
    let mut log = Vec::new();
    changelog::push(
        &mut log,
        &keys::value_key(1, b"a"),
        Some(&v("w").encode()),
        None,
    );
    let mut batch = WriteBatch::new();
    batch.put(keys::changelog_marker(2), Vec::new());
    batch.put(keys::changelog_key(2, 0), log);
    fx.cp().engine().write(&batch).unwrap();
    assert_eq!(logged(&fx, 2, 2), entries(2, 0, &["v1:a=w"]));
}

// ---- Commit ----

fn drop_vars_removes_every_key_of_those_variables(mut fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    for key in [&b"a"[..], b"b"] {
        txn.value_put(1, key, v("v1")).unwrap();
        txn.list_append(1, key, vec![v("l1")]).unwrap();
        txn.map_put(1, key, b"m", v("m1")).unwrap();
        txn.value_put(2, key, v("v2")).unwrap();
    }
    fx.commit(vec![txn]);

    let mut txn = fx.cp().txn(0);
    txn.value_put(3, b"a", v("v3")).unwrap();
    fx.cp()
        .commit(Commit {
            drop_vars: vec![1, 42],
            txns: vec![txn],
            meta: vec![],
            changelog: None,
        })
        .unwrap();
    fx.reopen();
    let mut txn = fx.cp().txn(0);
    for key in [&b"a"[..], b"b"] {
        assert_eq!(txn.value_get(1, key).unwrap(), None);
        assert!(!txn.list_exists(1, key).unwrap());
        assert!(!txn.map_exists(1, key).unwrap());
        assert_eq!(txn.value_get(2, key).unwrap(), Some(v("v2")));
    }
    assert_eq!(txn.value_get(3, b"a").unwrap(), Some(v("v3")));
    // The dropped list's sequence metadata went too.
    txn.list_append(1, b"a", vec![v("fresh")]).unwrap();
    assert_eq!(txn.list_page(1, b"a", None, 10).unwrap()[0].0, 0);
}

fn commit_applies_several_partitions_atomically(mut fx: Fixture) {
    let txns = (0..4)
        .map(|p| {
            let mut txn = fx.cp().txn(p);
            txn.value_put(1, &p.to_be_bytes(), v(&p.to_string()))
                .unwrap();
            txn
        })
        .collect();
    fx.cp()
        .commit(Commit {
            txns,
            meta: vec![("commit/0".into(), Some(vec![]))],
            ..Commit::default()
        })
        .unwrap();
    fx.reopen();
    let txn = fx.cp().txn(0);
    for p in 0..4u16 {
        assert_eq!(
            txn.value_get(1, &p.to_be_bytes()).unwrap(),
            Some(v(&p.to_string()))
        );
    }
    assert!(fx.cp().get_meta("commit/0").unwrap().is_some());
}

// ---- Committed-state scans (the state reader) ----

fn committed_state_scans_enumerate_each_variable(mut fx: Fixture) {
    let mut a = fx.cp().txn(0);
    a.value_put(1, b"k2", v("2")).unwrap();
    a.value_put(1, b"k1", vt("1", 50)).unwrap();
    a.value_put(2, b"k1", v("other var")).unwrap();
    a.list_append(3, b"k1", numbered(0..3)).unwrap();
    a.map_put(4, b"k1", b"\"b\"", v("B")).unwrap();
    a.map_put(4, b"k1", b"\"a\"", vt("A", 7)).unwrap();
    a.timer_register(b"k1", 20).unwrap();
    a.timer_register(b"k1", -3).unwrap();
    let mut b = fx.cp().txn(1);
    b.list_append(3, b"k0", numbered(5..6)).unwrap();
    b.map_put(4, b"k0", b"", v("empty")).unwrap();
    b.timer_register(b"k0", 99).unwrap();
    // Uncommitted writes are not scanned.
    let mut pending = fx.cp().txn(2);
    pending.value_put(1, b"k9", v("9")).unwrap();
    fx.commit(vec![a, b]);
    drop(pending);
    fx.reopen();
    let mut values = Vec::new();
    fx.cp()
        .scan_values(1, |k, value| {
            values.push((k.to_vec(), value));
            Ok(true)
        })
        .unwrap();
    assert_eq!(
        values,
        [(b"k1".to_vec(), vt("1", 50)), (b"k2".to_vec(), v("2"))]
    );
    let mut list = Vec::new();
    fx.cp()
        .scan_list(3, |k, seq, value| {
            list.push((k.to_vec(), seq, value.payload));
            Ok(true)
        })
        .unwrap();
    let keys: Vec<_> = list.iter().map(|(k, _, _)| k.as_slice()).collect();
    assert_eq!(keys, [&b"k0"[..], b"k1", b"k1", b"k1"]);
    let payloads: Vec<_> = list.iter().map(|(_, _, p)| p.clone()).collect();
    let expected: Vec<Vec<u8>> = ["5", "0", "1", "2"]
        .iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    assert_eq!(payloads, expected);
    assert!(list[1].1 < list[2].1 && list[2].1 < list[3].1);
    let mut map = Vec::new();
    fx.cp()
        .scan_map(4, |k, uk, value| {
            map.push((k.to_vec(), uk.to_vec(), value));
            Ok(true)
        })
        .unwrap();
    assert_eq!(
        map,
        [
            (b"k0".to_vec(), Vec::new(), v("empty")),
            (b"k1".to_vec(), b"\"a\"".to_vec(), vt("A", 7)),
            (b"k1".to_vec(), b"\"b\"".to_vec(), v("B")),
        ]
    );
    let mut timers = Vec::new();
    fx.cp()
        .scan_timers(|k, ts| {
            timers.push((k.to_vec(), ts));
            Ok(true)
        })
        .unwrap();
    assert_eq!(
        timers,
        [
            (b"k0".to_vec(), 99),
            (b"k1".to_vec(), -3),
            (b"k1".to_vec(), 20)
        ]
    );
    // A scan stops when the callback says so, and an unknown variable scans nothing.
    let mut seen = 0;
    fx.cp()
        .scan_list(3, |_, _, _| {
            seen += 1;
            Ok(seen < 2)
        })
        .unwrap();
    assert_eq!(seen, 2);
    fx.cp()
        .scan_values(77, |_, _| panic!("variable 77 has no values"))
        .unwrap();
}

fn committed_state_scans_page_through_large_variables(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    for i in 0..2_000u32 {
        txn.value_put(1, &i.to_be_bytes(), v(&i.to_string()))
            .unwrap();
    }
    fx.commit(vec![txn]);
    let mut next = 0u32;
    fx.cp()
        .scan_values(1, |k, value| {
            assert_eq!(k, next.to_be_bytes());
            assert_eq!(value, v(&next.to_string()));
            next += 1;
            Ok(true)
        })
        .unwrap();
    assert_eq!(next, 2_000);
}

fn committed_state_scans_report_corrupt_bytes(fx: Fixture) {
    let mut batch = WriteBatch::new();
    batch.put(keys::value_key(1, b"k"), b"not a stored value".to_vec());
    batch.put(
        keys::list_element_key(2, b"k", 0)[..12].to_vec(),
        v("x").encode(),
    );
    fx.cp().engine().write(&batch).unwrap();
    let err = fx.cp().scan_values(1, |_, _| Ok(true)).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    let err = fx.cp().scan_list(2, |_, _, _| Ok(true)).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
}

fn metadata_is_visited_one_blob_at_a_time(fx: Fixture) {
    for i in 0..5 {
        fx.cp()
            .put_meta_sync(&format!("commit/{i:020}"), i.to_string().as_bytes())
            .unwrap();
    }
    fx.cp().put_meta_sync("commits", b"not a commit").unwrap();
    let mut names = Vec::new();
    fx.cp()
        .for_each_meta("commit/", |name, value| {
            names.push((name.to_owned(), value.to_vec()));
            Ok(names.len() < 3)
        })
        .unwrap();
    assert_eq!(names.len(), 3);
    assert_eq!(names[2], (format!("commit/{:020}", 2), b"2".to_vec()));
}

/// Every entry of value variable 1, list variable 2 and map variable 3, as committed at
/// `batch` (undoing the batches after it up to `latest`), written `v:key=payload`,
/// `l:key#seq=payload`, `m:key.user=payload`, and every timer, `t:key@ts`.
fn state_at(fx: &Fixture, batch: u64, latest: u64) -> Vec<String> {
    let cp = fx.cp();
    let text = |v: StoredValue| String::from_utf8(v.payload).unwrap();
    let mut out = Vec::new();
    cp.scan_values_at(1, &cp.undo_since(1, batch, latest).unwrap(), |k, v| {
        out.push(format!("v:{}={}", String::from_utf8_lossy(k), text(v)));
        Ok(true)
    })
    .unwrap();
    cp.scan_list_at(2, &cp.undo_since(2, batch, latest).unwrap(), |k, seq, v| {
        out.push(format!(
            "l:{}#{seq}={}",
            String::from_utf8_lossy(k),
            text(v)
        ));
        Ok(true)
    })
    .unwrap();
    cp.scan_map_at(3, &cp.undo_since(3, batch, latest).unwrap(), |k, uk, v| {
        let (k, uk) = (String::from_utf8_lossy(k), String::from_utf8_lossy(uk));
        out.push(format!("m:{k}.{uk}={}", text(v)));
        Ok(true)
    })
    .unwrap();
    cp.scan_timers_at(&cp.undo_timers_since(batch, latest).unwrap(), |k, ts| {
        out.push(format!("t:{}@{ts}", String::from_utf8_lossy(k)));
        Ok(true)
    })
    .unwrap();
    out
}

fn changelog_before_images_rebuild_every_earlier_batch(mut fx: Fixture) {
    let big = POINT_DELETE_LIMIT + 3;
    let mut seen = Vec::new();
    let mut batch = 0;
    let mut commit = |fx: &mut Fixture, drop_vars: Vec<u32>, txns: Vec<PartitionTxn>| {
        commit_logged(fx, batch, drop_vars, txns);
        seen.push(state_at(fx, batch, batch));
        batch += 1;
    };
    let mut a = fx.cp().txn(0);
    a.value_put(1, b"a", v("a0")).unwrap();
    a.value_put(1, b"c", vt("c0", 100)).unwrap();
    a.list_append(2, b"a", numbered(0..big)).unwrap();
    a.map_put(3, b"a", b"x", v("x0")).unwrap();
    a.map_put(3, b"a", b"y", vt("y0", 100)).unwrap();
    a.timer_register(b"a", 5).unwrap();
    a.timer_register(b"a", 9).unwrap();
    let mut b = fx.cp().txn(1);
    b.value_put(1, b"b", v("b0")).unwrap();
    b.list_append(2, b"b", vec![v("p"), v("q")]).unwrap();
    b.timer_register(b"b", 7).unwrap();
    commit(&mut fx, vec![], vec![a, b]);

    // Overwrites, a delete-if-exists of a missing key, a removed map entry.
    let mut a = fx.cp().txn(0);
    a.value_put(1, b"a", v("a1")).unwrap();
    a.value_delete(1, b"zz").unwrap();
    a.map_remove(3, b"a", b"x").unwrap();
    a.map_put(3, b"a", b"z", v("z1")).unwrap();
    a.timer_delete(b"a", 5).unwrap();
    a.timer_register(b"a", 3).unwrap();
    let mut b = fx.cp().txn(1);
    b.timer_delete(b"b", 7).unwrap();
    b.value_delete(1, b"b").unwrap();
    b.list_append(2, b"b", vec![v("r")]).unwrap();
    commit(&mut fx, vec![], vec![a, b]);

    // A clear of a big list (a range tombstone) then appends; TTL cleanup.
    let mut a = fx.cp().txn(0);
    a.list_clear(2, b"a").unwrap();
    a.list_append(2, b"a", vec![v("new")]).unwrap();
    assert!(a.ttl_cleanup(500).unwrap() >= 2);
    commit(&mut fx, vec![], vec![a]);
    fx.reopen();

    // A key comes back; the map variable is dropped.
    let mut b = fx.cp().txn(1);
    b.value_put(1, b"b", v("b3")).unwrap();
    commit(&mut fx, vec![3], vec![b]);

    // An empty batch.
    commit(&mut fx, vec![], vec![]);

    let latest = batch - 1;
    assert_ne!(seen[0], seen[latest as usize]);
    for (at, want) in seen.iter().enumerate() {
        assert_eq!(&state_at(&fx, at as u64, latest), want, "batch {at}");
    }
    assert!(seen[0].contains(&"m:a.y=y0".to_owned()));
    assert!(!seen[2].contains(&"m:a.y=y0".to_owned()));
    let timers = |batch: usize| -> Vec<&str> {
        seen[batch]
            .iter()
            .filter(|e| e.starts_with("t:"))
            .map(String::as_str)
            .collect()
    };
    assert_eq!(timers(0), ["t:a@5", "t:a@9", "t:b@7"]);
    assert_eq!(timers(1), ["t:a@3", "t:a@9"]);

    // Scans stop when asked, also inside the undone entries.
    let undo = fx.cp().undo_since(2, 0, latest).unwrap();
    assert!(!undo.is_empty());
    let mut calls = 0;
    fx.cp()
        .scan_list_at(2, &undo, |_, _, _| {
            calls += 1;
            Ok(calls < 2)
        })
        .unwrap();
    assert_eq!(calls, 2);
}

fn change_stats_count_what_each_batch_changed(fx: Fixture) {
    let mut a = fx.cp().txn(0);
    a.value_put(1, b"a", v("a0")).unwrap();
    a.list_append(2, b"a", vec![v("x"), v("y")]).unwrap();
    a.map_put(3, b"a", b"m", v("m0")).unwrap();
    a.timer_register(b"a", 5).unwrap();
    a.timer_register(b"a", 6).unwrap();
    // Registered and deleted within the batch: not counted.
    a.timer_register(b"a", 7).unwrap();
    a.timer_delete(b"a", 7).unwrap();
    let stats = commit_logged(&fx, 0, vec![], vec![a]);
    assert_eq!(
        stats,
        ChangeStats {
            rows_updated: 4,
            rows_added: 4,
            rows_removed: 0,
            timers_added: 2,
            timers_removed: 0,
        }
    );

    let mut a = fx.cp().txn(0);
    a.value_put(1, b"a", v("a1")).unwrap();
    a.list_clear(2, b"a").unwrap();
    // Deleting a missing value or timer removes nothing.
    a.value_delete(1, b"zz").unwrap();
    a.timer_delete(b"a", 99).unwrap();
    a.timer_delete(b"a", 5).unwrap();
    // Re-registering an existing timer adds nothing.
    a.timer_register(b"a", 6).unwrap();
    let stats = commit_logged(&fx, 1, vec![3], vec![a]);
    assert_eq!(
        stats,
        ChangeStats {
            rows_updated: 1,
            rows_added: 0,
            rows_removed: 3,
            timers_added: 0,
            timers_removed: 1,
        }
    );

    // A clear of more entries than get point deletes is one range delete, whose removed
    // entries the commit logs and counts. The list starts again at the first sequence: the
    // element appended after the clear overwrites that entry, not removed and not new.
    let long = POINT_DELETE_LIMIT + 6;
    let mut a = fx.cp().txn(0);
    a.list_append(4, b"a", (0..long).map(|n| v(&n.to_string())).collect())
        .unwrap();
    commit_logged(&fx, 2, vec![], vec![a]);
    let mut a = fx.cp().txn(0);
    a.list_clear(4, b"a").unwrap();
    a.list_append(4, b"a", vec![v("after")]).unwrap();
    let stats = commit_logged(&fx, 3, vec![], vec![a]);
    assert_eq!(
        stats,
        ChangeStats {
            rows_updated: 1,
            rows_added: 0,
            rows_removed: long as u64 - 1,
            timers_added: 0,
            timers_removed: 0,
        }
    );
}

fn snapshot_keeps_the_state_committed_when_taken(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    txn.value_put(1, b"a", v("1")).unwrap();
    fx.commit(vec![txn]);
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snapshots").join("0");
    if !fx.cp().snapshot(&snap).unwrap() {
        // Checkpoints in memory take none.
        assert!(!snap.exists());
        return;
    }
    let mut txn = fx.cp().txn(0);
    txn.value_put(1, b"a", v("2")).unwrap();
    txn.value_put(1, b"b", v("3")).unwrap();
    fx.commit(vec![txn]);
    let values = |cp: &Checkpoint| {
        let mut out = Vec::new();
        cp.scan_values(1, |k, v| {
            out.push(format!(
                "{}={}",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(&v.payload)
            ));
            Ok(true)
        })
        .unwrap();
        out
    };
    let old = Checkpoint::open_read_only(&snap).unwrap();
    assert_eq!(values(&old), ["a=1"]);
    assert_eq!(values(fx.cp()), ["a=2", "b=3"]);
    // No temporary directory is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path().join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["0"]);
}

fn get_many_reads_keys_in_order_across_chunks(fx: Fixture) {
    let mut txn = fx.cp().txn(0);
    for i in (0..2_500).step_by(2) {
        txn.value_put(1, format!("k{i:05}").as_bytes(), v(&i.to_string()))
            .unwrap();
    }
    fx.commit(vec![txn]);
    let keys: Vec<Vec<u8>> = (0..2_500)
        .map(|i| keys::value_key(1, format!("k{i:05}").as_bytes()))
        .collect();
    let mut refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    // Out of order too.
    refs.swap(0, 2_000);
    let mut got = Vec::new();
    fx.cp()
        .engine()
        .get_many(&refs, &mut |i, value| {
            let value =
                value.map(|b| String::from_utf8(StoredValue::decode(b).unwrap().payload).unwrap());
            got.push((i, value));
            Ok(())
        })
        .unwrap();
    let want: Vec<(usize, Option<String>)> = (0..2_500)
        .map(|i| {
            let n = match i {
                0 => 2_000,
                2_000 => 0,
                n => n,
            };
            (i, (n % 2 == 0).then(|| n.to_string()))
        })
        .collect();
    assert_eq!(got, want);
}

fn last_key_in_finds_the_greatest_key_of_a_range(fx: Fixture) {
    let e = fx.cp().engine();
    let mut b = WriteBatch::new();
    for k in ["a", "b1", "b2", "b3", "c"] {
        b.put(k.into(), vec![]);
    }
    e.write(&b).unwrap();
    let last = |start: &str, end: &str| {
        e.last_key_in(start.as_bytes(), end.as_bytes())
            .unwrap()
            .map(|k| String::from_utf8(k).unwrap())
    };
    assert_eq!(last("b", "c").as_deref(), Some("b3"));
    assert_eq!(
        last("b", "b3").as_deref(),
        Some("b2"),
        "the end is excluded"
    );
    assert_eq!(
        last("b2", "b2\0").as_deref(),
        Some("b2"),
        "the start is included"
    );
    assert_eq!(last("a", "z").as_deref(), Some("c"));
    assert_eq!(last("d", "z"), None);
    assert_eq!(last("c", "b"), None, "an empty range");
    // Deleted keys, one by one or by range, are not found.
    let mut b = WriteBatch::new();
    b.delete("b3".into());
    b.delete_range("b2".into(), "b3".into());
    e.write(&b).unwrap();
    assert_eq!(last("b", "c").as_deref(), Some("b1"));
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod mem {
            $( #[test] fn $name() { super::$name(super::Fixture::mem()) } )*
        }
        mod rocks {
            $( #[test] fn $name() { super::$name(super::Fixture::rocks()) } )*
        }
        mod cached {
            $( #[test] fn $name() { super::$name(super::Fixture::cached()) } )*
        }
        mod ingested {
            $( #[test] fn $name() { super::$name(super::Fixture::ingested()) } )*
        }
    };
}

conformance!(
    value_read_your_writes_and_commit,
    uncommitted_writes_are_invisible,
    state_is_isolated_by_variable_and_key,
    values_keep_schema_id_and_expiry,
    corrupt_stored_bytes_are_an_error,
    metadata_put_scan_and_commit,
    list_append_put_and_clear,
    list_pages_resume_after_a_sequence,
    list_clear_then_append_in_one_batch,
    lists_match_a_model_under_random_operations,
    large_list_is_read_in_bounded_pages,
    map_put_get_remove_and_page,
    map_clear_then_put_in_one_batch,
    map_matches_a_model_under_random_operations,
    timers_register_list_delete_and_fire_in_order,
    scans_of_committed_timers_start_at_the_time_floor,
    due_timers_page_through_committed_timers_once,
    due_timers_page_through_this_batchs_timers_once,
    expired_values_are_hidden_from_reads,
    ttl_cleanup_removes_expired_entries_only,
    ttl_cleanup_handles_more_than_one_chunk,
    drop_vars_removes_every_key_of_those_variables,
    commit_applies_several_partitions_atomically,
    committed_state_scans_enumerate_each_variable,
    committed_state_scans_page_through_large_variables,
    committed_state_scans_report_corrupt_bytes,
    metadata_is_visited_one_blob_at_a_time,
    changelog_records_point_writes_per_partition,
    change_stats_count_what_each_batch_changed,
    snapshot_keeps_the_state_committed_when_taken,
    changelog_lists_the_keys_range_tombstones_remove,
    changelog_lists_the_entries_of_dropped_variables,
    changelog_shows_ttl_cleanup_as_deletes,
    changelog_keeps_the_last_batches_only,
    changelog_before_images_rebuild_every_earlier_batch,
    changelog_in_chunks_reads_back_whole_and_in_order,
    get_many_reads_keys_in_order_across_chunks,
    reads_ahead_answer_what_point_reads_find,
    last_key_in_finds_the_greatest_key_of_a_range,
    reserving_room_is_a_hint,
);

#[test]
fn checkpoint_and_txn_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Checkpoint>();
    send::<PartitionTxn>();
    send::<Commit>();
}

#[test]
fn a_rocks_checkpoint_open_twice_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Checkpoint::open(dir.path()).unwrap();
    assert!(dir.path().join("state").is_dir());
    match Checkpoint::open(dir.path()) {
        Err(StoreError::Locked { path }) => assert_eq!(path, dir.path().display().to_string()),
        other => panic!("expected Locked, got {other:?}"),
    }
}
