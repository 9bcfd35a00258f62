//! Unit tests of the overlay's own mechanics (sealing, ordering, written bytes); the
//! behaviour every backend must show is in the conformance suite.

use super::*;
use crate::overlay::POINT_DELETE_LIMIT;
use crate::{ChangeStats, Checkpoint, Commit};

/// The change log of a sealed transaction, once its counts and chunks are checked against
/// those read from the log's own entries.
fn counted(log: Result<Log>) -> Vec<u8> {
    let log = log.unwrap();
    let mut decoded = ChangeStats::default();
    decoded.add_log(&log.bytes).unwrap();
    assert_eq!(log.stats, decoded, "the seal's counts are the log's");
    assert!(
        log.chunks()
            .eq(changelog::chunks(&log.bytes, changelog::CHUNK_BYTES)),
        "the seal's chunks are the log's"
    );
    log.bytes
}

fn v(payload: &str) -> StoredValue {
    StoredValue {
        schema_id: 0,
        expires_at_ms: None,
        payload: payload.as_bytes().to_vec(),
    }
}

fn commit(cp: &Checkpoint, txn: PartitionTxn) {
    cp.commit(Commit {
        txns: vec![txn],
        ..Commit::default()
    })
    .unwrap();
}

fn op_key(op: &WriteOp) -> &[u8] {
    match op {
        WriteOp::Put(k, _) | WriteOp::Delete(k) | WriteOp::DeleteRange(k, _) => k,
    }
}

#[test]
fn written_bytes_count_the_values_keys_and_change_log_a_commit_writes() {
    let cp = Checkpoint::in_memory();
    assert_eq!(cp.txn(0).written_bytes(), 0, "nothing written");
    let mut txn = cp.txn(0);
    txn.value_put(1, b"k", v(&"x".repeat(10_000))).unwrap();
    // The value, and the change log's copy of it.
    let first = txn.written_bytes();
    assert!(first > 20_000 && first < 20_200, "{first}");
    commit(&cp, txn);
    // Overwriting a value logs its before-image too.
    let mut txn = cp.txn(0);
    txn.value_put(1, b"k", v(&"y".repeat(10_000))).unwrap();
    let second = txn.written_bytes();
    assert!(second > 30_000 && second < 30_300, "{second}");
    assert_eq!(txn.written_bytes(), second, "sealed once");
}

#[test]
fn clearing_a_big_committed_collection_uses_one_range_tombstone() {
    let cp = Checkpoint::in_memory();
    let mut txn = cp.txn(0);
    txn.list_append(1, b"small", vec![v("1"); POINT_DELETE_LIMIT])
        .unwrap();
    txn.list_append(1, b"big", vec![v("1"); POINT_DELETE_LIMIT + 1])
        .unwrap();
    commit(&cp, txn);

    let mut txn = cp.txn(0);
    txn.list_clear(1, b"small").unwrap();
    // Point deletes for every element plus the list's metadata.
    assert_eq!(txn.pending_writes(), POINT_DELETE_LIMIT + 1);
    txn.list_clear(1, b"big").unwrap();
    assert_eq!(txn.pending_writes(), POINT_DELETE_LIMIT + 2);
    // Appends after the clear live inside the tombstone as points.
    txn.list_append(1, b"big", vec![v("new")]).unwrap();
    assert_eq!(txn.pending_writes(), POINT_DELETE_LIMIT + 3);
    assert_eq!(txn.list_page(1, b"big", None, 10).unwrap(), [(0, v("new"))]);
    let ops = txn.into_ops();
    let ranges: Vec<&WriteOp> = ops
        .iter()
        .filter(|op| matches!(op, WriteOp::DeleteRange(..)))
        .collect();
    let (start, end) = keys::prefix_range(keys::list_prefix(1, b"big"));
    assert_eq!(ranges, [&WriteOp::DeleteRange(start, end)]);
    assert_eq!(ops.len(), POINT_DELETE_LIMIT + 4);
    assert!(ops.contains(&WriteOp::Put(
        keys::list_meta_key(1, b"big"),
        1u64.to_be_bytes().to_vec()
    )));
    assert!(ops.contains(&WriteOp::Delete(keys::list_meta_key(1, b"small"))));
}

#[test]
fn deletes_after_a_clear_cancel_buffered_puts_only() {
    let cp = Checkpoint::in_memory();
    let mut txn = cp.txn(0);
    txn.map_put(1, b"k", b"a", v("a")).unwrap();
    commit(&cp, txn);

    let mut txn = cp.txn(0);
    txn.map_clear(1, b"k").unwrap();
    assert_eq!(txn.pending_writes(), 1, "the committed entry's delete");
    txn.map_put(1, b"k", b"a", v("a2")).unwrap();
    txn.map_put(1, b"k", b"b", v("b")).unwrap();
    assert_eq!(txn.pending_writes(), 2);
    txn.map_remove(1, b"k", b"a").unwrap();
    txn.map_remove(1, b"k", b"b").unwrap();
    txn.map_remove(1, b"k", b"never").unwrap();
    assert_eq!(txn.pending_writes(), 1);
    assert_eq!(
        txn.into_ops(),
        [WriteOp::Delete(keys::map_entry_key(1, b"k", b"a"))]
    );
}

/// Everything the test below can see of the state.
type Snapshot = Vec<(
    Option<StoredValue>,
    Option<StoredValue>,
    Vec<(u64, StoredValue)>,
    Vec<(Vec<u8>, StoredValue)>,
    Vec<i64>,
)>;

const KEYS: [&[u8]; 5] = [b"", b"a", b"a\0", b"b", b"big"];

/// A second value variable, whose id sorts after the others' in every byte but the last.
const VAR_AFTER_ALL: u32 = 0x0100_0000;

fn snapshot(txn: &PartitionTxn) -> (Snapshot, Vec<(i64, Vec<u8>)>) {
    let per_key = KEYS
        .iter()
        .map(|k| {
            (
                txn.value_get(1, k).unwrap(),
                txn.value_get(VAR_AFTER_ALL, k).unwrap(),
                txn.list_page(2, k, None, usize::MAX).unwrap(),
                txn.map_page(3, k, None, usize::MAX).unwrap(),
                txn.timer_list(k).unwrap(),
            )
        })
        .collect();
    (per_key, txn.timers_due(i64::MAX, usize::MAX).unwrap())
}

/// Random operations of every kind over committed state, big collections included:
/// the sealed operations are in strictly ascending key order, and committing them shows
/// exactly what the overlay showed.
#[test]
fn sealed_operations_are_sorted_and_reproduce_the_overlay() {
    let cp = Checkpoint::in_memory();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut txn = cp.txn(0);
    txn.list_append(2, b"big", (0..100).map(|i| v(&i.to_string())).collect())
        .unwrap();
    for i in 0..100u32 {
        txn.map_put(3, b"big", &i.to_be_bytes(), v("old")).unwrap();
    }
    commit(&cp, txn);
    for round in 0..6 {
        let mut txn = cp.txn(0);
        for step in 0..300 {
            let key = KEYS[next(KEYS.len() as u64) as usize];
            let value = if next(4) == 0 {
                StoredValue {
                    expires_at_ms: Some(next(50) as i64),
                    ..v(&format!("{round}/{step}"))
                }
            } else {
                v(&format!("{round}/{step}"))
            };
            let uk = (next(120) as u32).to_be_bytes();
            match next(18) {
                0..=1 => txn.value_put(1, key, value).unwrap(),
                2 => txn.value_delete(1, key).unwrap(),
                16 => txn.value_put(VAR_AFTER_ALL, key, value).unwrap(),
                17 => txn.value_delete(VAR_AFTER_ALL, key).unwrap(),
                3..=4 => txn.list_append(2, key, vec![value.clone(), value]).unwrap(),
                5 => txn.list_clear(2, key).unwrap(),
                6 => txn.list_put(2, key, vec![value]).unwrap(),
                7..=8 => txn.map_put(3, key, &uk, value).unwrap(),
                9 => txn.map_remove(3, key, &uk).unwrap(),
                10 => txn.map_clear(3, key).unwrap(),
                11 => txn.timer_register(key, next(20) as i64 - 10).unwrap(),
                12 => txn.timer_delete(key, next(20) as i64 - 10).unwrap(),
                13 => {
                    txn.ttl_cleanup(next(50) as i64).unwrap();
                }
                _ => {
                    let seen = snapshot(&txn);
                    assert_eq!(seen, snapshot(&txn));
                }
            }
        }
        let seen = snapshot(&txn);
        let pending = txn.pending_writes();
        txn.seal();
        assert_eq!(txn.pending_writes(), pending);
        let ops = txn.into_ops();
        for w in ops.windows(2) {
            assert!(op_key(&w[0]) < op_key(&w[1]), "round {round}: {w:?}");
        }
        let points = ops
            .iter()
            .filter(|op| !matches!(op, WriteOp::DeleteRange(..)))
            .count();
        assert_eq!(points, pending, "round {round}");
        let mut batch = crate::WriteBatch::new();
        batch.append(ops);
        cp.engine().write(&batch).unwrap();
        assert_eq!(snapshot(&cp.txn(0)), seen, "round {round}");
    }
}

#[test]
#[should_panic(expected = "sealed PartitionTxn")]
fn a_sealed_transaction_refuses_state_access() {
    let mut txn = Checkpoint::in_memory().txn(0);
    txn.value_put(1, b"k", v("1")).unwrap();
    txn.seal();
    txn.seal();
    assert_eq!(txn.pending_writes(), 1);
    let _ = txn.value_get(1, b"k");
}

/// A backend that counts the point reads of one namespace's keys (the change log's reads of
/// before-images).
struct CountingReads {
    inner: crate::mem::MemEngine,
    ns: u8,
    reads: std::sync::atomic::AtomicUsize,
}

impl CountingReads {
    fn new(ns: u8) -> Arc<Self> {
        Arc::new(Self {
            inner: crate::mem::MemEngine::default(),
            ns,
            reads: Default::default(),
        })
    }

    /// The reads counted since the last call.
    fn take(&self) -> usize {
        self.reads.swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

impl KvEngine for CountingReads {
    fn get_with(&self, key: &[u8], f: &mut crate::engine::GetFn<'_>) -> Result<bool> {
        if key.first() == Some(&self.ns) {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.get_with(key, f)
    }
    fn scan(&self, start: &[u8], end: &[u8], f: &mut ScanFn<'_>) -> Result<()> {
        self.inner.scan(start, end, f)
    }
    fn last_key_in(&self, start: &[u8], end: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.last_key_in(start, end)
    }
    fn write(&self, batch: &crate::WriteBatch) -> Result<()> {
        self.inner.write(batch)
    }
    /// Reads ahead as a backend on disk would (one in memory reads nothing ahead), without
    /// counting: these are the batch's reads, made before its calls.
    fn read_ahead(&self, keys: &[&[u8]], f: &mut crate::engine::GetManyFn<'_>) -> Result<()> {
        for (i, key) in keys.iter().enumerate() {
            let mut found = None;
            self.inner.get_with(key, &mut |v| {
                found = Some(v.to_vec());
                Ok(())
            })?;
            f(i, found.as_deref())?;
        }
        Ok(())
    }
}

#[test]
fn timers_armed_after_every_committed_one_are_logged_as_new_without_reading_them() {
    let engine = CountingReads::new(keys::TIMER_BY_KEY);
    let cp = Checkpoint::with_engine(engine.clone());
    let logged = |txn: PartitionTxn| -> Vec<(i64, Option<bool>)> {
        let (_, log) = txn.into_parts();
        let log = counted(log);
        changelog::decode(&log)
            .map(|c| {
                let c = c.unwrap();
                let prefix = keys::timer_key_prefix(b"k").len();
                let ts = keys::decode_timer_by_key(c.key, prefix).unwrap();
                (ts, c.before.map(|b| b.is_some()))
            })
            .collect()
    };
    // No committed timer in the partition: nothing to read.
    let mut txn = cp.txn(0);
    txn.timer_register(b"k", 10).unwrap();
    txn.timer_register(b"k", 20).unwrap();
    assert_eq!(logged(txn), [(10, Some(false)), (20, Some(false))]);
    assert_eq!(engine.take(), 0);
    let mut txn = cp.txn(0);
    txn.timer_register(b"k", 10).unwrap();
    txn.timer_register(b"k", 20).unwrap();
    commit(&cp, txn);
    engine.take();

    // Committed timers end at 20 in partition 0: times up to 20 are read, later ones are
    // known new, registered or deleted.
    let mut txn = cp.txn(0);
    txn.timer_delete(b"k", 10).unwrap();
    txn.timer_register(b"k", 15).unwrap();
    txn.timer_register(b"k", 20).unwrap();
    txn.timer_register(b"k", 21).unwrap();
    txn.timer_delete(b"k", 30).unwrap();
    assert_eq!(
        logged(txn),
        [
            (10, Some(true)),
            (15, Some(false)),
            (20, Some(true)),
            (21, Some(false)),
            (30, Some(false)),
        ]
    );
    assert_eq!(engine.take(), 3, "the timers at 10, 15 and 20 were read");
    // Another partition's timers do not count.
    let mut txn = cp.txn(1);
    txn.timer_register(b"j", 5).unwrap();
    let _ = txn.into_parts();
    assert_eq!(engine.take(), 0);
}

#[test]
fn appended_list_elements_are_logged_as_new_without_reading_them() {
    let engine = CountingReads::new(keys::LIST);
    let cp = Checkpoint::with_engine(engine.clone());
    let reads = || engine.take();
    let mut txn = cp.txn(0);
    txn.list_append(1, b"k", vec![v("a"), v("b")]).unwrap();
    commit(&cp, txn);
    reads();

    // Appends after the committed elements: nothing there before, known without a read.
    let mut txn = cp.txn(0);
    txn.list_append(1, b"k", vec![v("c")]).unwrap();
    let (_, log) = txn.into_parts();
    let log = counted(log);
    assert_eq!(reads(), 0, "no before-image read for an appended element");
    let changes: Vec<_> = changelog::decode(&log).collect::<Result<_>>().unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].key, keys::list_element_key(1, b"k", 2));
    assert_eq!(changes[0].before, Some(None));

    // Cleared then appended in one batch: the new elements overwrite committed sequences,
    // whose before-images must be read.
    let mut txn = cp.txn(0);
    txn.list_clear(1, b"k").unwrap();
    txn.list_append(1, b"k", vec![v("x")]).unwrap();
    let (_, log) = txn.into_parts();
    let log = counted(log);
    assert!(reads() > 0);
    let changes: Vec<_> = changelog::decode(&log).collect::<Result<_>>().unwrap();
    let first = changes
        .iter()
        .find(|c| c.key == keys::list_element_key(1, b"k", 0))
        .unwrap();
    assert_eq!(first.value.map(<[u8]>::to_vec), Some(v("x").encode()));
    assert_eq!(first.before, Some(Some(&v("a").encode()[..])));
}

/// A value that expires at `ms`.
fn expiring_at(ms: i64) -> StoredValue {
    StoredValue {
        expires_at_ms: Some(ms),
        ..v("expiring")
    }
}

#[test]
fn values_and_map_entries_the_batch_read_are_logged_without_reading_them_again() {
    let engine = CountingReads::new(keys::VALUE);
    let cp = Checkpoint::with_engine(engine.clone());
    let expiring = expiring_at(5);
    let mut txn = cp.txn(0);
    txn.value_put(1, b"k", v("a")).unwrap();
    txn.value_put(1, b"unread", v("old")).unwrap();
    txn.value_put(1, b"expired", expiring.clone()).unwrap();
    commit(&cp, txn);
    engine.take();

    let mut txn = cp.txn(0);
    txn.set_ttl_clock(Some(10));
    assert_eq!(txn.value_get(1, b"k").unwrap(), Some(v("a")));
    assert_eq!(txn.value_get(1, b"new").unwrap(), None);
    assert_eq!(txn.value_get(1, b"expired").unwrap(), None, "expired at 5");
    assert_eq!(txn.value_get(1, b"read-only").unwrap(), None);
    txn.value_put(1, b"k", v("b")).unwrap();
    // Read again once written: the overlay answers, and the first read stays the before.
    assert_eq!(txn.value_get(1, b"k").unwrap(), Some(v("b")));
    txn.value_put(1, b"new", v("n")).unwrap();
    txn.value_put(1, b"expired", v("e")).unwrap();
    txn.value_put(1, b"unread", v("z")).unwrap();
    assert_eq!(engine.take(), 4, "the batch's own reads");
    let (_, log) = txn.into_parts();
    let log = counted(log);
    assert_eq!(
        engine.take(),
        1,
        "only the value the batch wrote unread is read at the seal"
    );
    let befores: Vec<_> = changelog::decode(&log)
        .map(|c| {
            let c = c.unwrap();
            (c.key.to_vec(), c.before.map(|b| b.map(<[u8]>::to_vec)))
        })
        .collect();
    assert_eq!(
        befores,
        [
            // In key order: grouping keys are length-prefixed.
            (keys::value_key(1, b"k"), Some(Some(v("a").encode()))),
            (keys::value_key(1, b"new"), Some(None)),
            (keys::value_key(1, b"unread"), Some(Some(v("old").encode()))),
            (
                keys::value_key(1, b"expired"),
                Some(Some(expiring.encode()))
            ),
        ],
        "the before-images are the committed bytes, an expired value's included"
    );

    let engine = CountingReads::new(keys::MAP);
    let cp = Checkpoint::with_engine(engine.clone());
    let mut txn = cp.txn(0);
    txn.map_put(1, b"k", b"u", v("m")).unwrap();
    commit(&cp, txn);
    let mut txn = cp.txn(0);
    assert_eq!(txn.map_get(1, b"k", b"u").unwrap(), Some(v("m")));
    assert_eq!(txn.map_get(1, b"k", b"w").unwrap(), None);
    txn.map_put(1, b"k", b"u", v("m2")).unwrap();
    txn.map_put(1, b"k", b"w", v("w")).unwrap();
    engine.take();
    let (_, log) = txn.into_parts();
    let log = counted(log);
    assert_eq!(engine.take(), 0, "both entries were read by the batch");
    let befores: Vec<_> = changelog::decode(&log)
        .map(|c| c.unwrap().before.map(|b| b.map(<[u8]>::to_vec)))
        .collect();
    assert_eq!(befores, [Some(Some(v("m").encode())), Some(None)]);
}

#[test]
fn state_read_ahead_is_logged_without_reading_it_again() {
    let engine = CountingReads::new(keys::VALUE);
    let cp = Checkpoint::with_engine(engine.clone());
    let key = |i: usize| format!("k{i}").into_bytes();
    let mut txn = cp.txn(0);
    for i in 0..4 {
        txn.value_put(1, &key(i), v(&format!("old{i}"))).unwrap();
    }
    commit(&cp, txn);
    // A batch reading the value of more than one key teaches the next to read it ahead.
    let mut txn = cp.txn(0);
    txn.value_get(1, &key(0)).unwrap();
    txn.value_get(1, &key(1)).unwrap();
    txn.seal();
    engine.take();

    let mut txn = cp.txn(0);
    // Keys 0 to 3 have values, 4 has none; 2 is written without being read.
    let grouping: Vec<Vec<u8>> = (0..5).map(key).collect();
    txn.read_ahead(grouping.iter().map(Vec::as_slice)).unwrap();
    assert_eq!(txn.read_ahead_len(), 5);
    for i in [0, 1, 3, 4] {
        let expected = (i < 4).then(|| v(&format!("old{i}")));
        assert_eq!(txn.value_get(1, &key(i)).unwrap(), expected);
    }
    for i in 0..5 {
        txn.value_put(1, &key(i), v("new")).unwrap();
    }
    assert_eq!(
        engine.take(),
        0,
        "every read was answered by the read-ahead"
    );
    assert!(
        txn.reads.borrow().kept.is_empty(),
        "reads answered ahead are not kept twice"
    );
    let (_, log) = txn.into_parts();
    let log = counted(log);
    assert_eq!(engine.take(), 0, "the seal read no before-image again");
    let befores: Vec<_> = changelog::decode(&log)
        .map(|c| {
            let c = c.unwrap();
            (c.key.to_vec(), c.before.map(|b| b.map(<[u8]>::to_vec)))
        })
        .collect();
    let expected: Vec<_> = (0..5)
        .map(|i| {
            let before = (i < 4).then(|| v(&format!("old{i}")).encode());
            (keys::value_key(1, &key(i)), Some(before))
        })
        .collect();
    assert_eq!(
        befores, expected,
        "the before-images are the committed bytes"
    );
}

#[test]
fn state_removed_by_ttl_cleanup_is_logged_without_reading_it_again() {
    let engine = CountingReads::new(keys::VALUE);
    let cp = Checkpoint::with_engine(engine.clone());
    let expiring = expiring_at(5);
    let mut txn = cp.txn(0);
    txn.value_put(1, b"k", expiring.clone()).unwrap();
    commit(&cp, txn);
    engine.take();

    let mut txn = cp.txn(0);
    assert_eq!(txn.ttl_cleanup(10).unwrap(), 1);
    assert_eq!(engine.take(), 1, "the cleanup read the value's expiry");
    let (_, log) = txn.into_parts();
    let log = counted(log);
    assert_eq!(engine.take(), 0, "and the seal did not read it again");
    let changes: Vec<_> = changelog::decode(&log).collect::<Result<_>>().unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].key, keys::value_key(1, b"k"));
    assert_eq!(changes[0].value, None);
    assert_eq!(changes[0].before, Some(Some(&expiring.encode()[..])));
}

#[test]
fn reads_past_their_limit_are_not_kept_and_read_again_at_the_seal() {
    let engine = CountingReads::new(keys::VALUE);
    let cp = Checkpoint::with_engine(engine.clone());
    let big = |i: usize| v(&format!("{}{i:02}", "0".repeat(1 << 20)));
    let n = 20;
    let mut txn = cp.txn(0);
    for i in 0..n {
        txn.value_put(1, format!("k{i:02}").as_bytes(), big(i))
            .unwrap();
    }
    commit(&cp, txn);

    let mut txn = cp.txn(0);
    for i in 0..n {
        let key = format!("k{i:02}");
        assert_eq!(txn.value_get(1, key.as_bytes()).unwrap(), Some(big(i)));
        txn.value_put(1, key.as_bytes(), v("small")).unwrap();
    }
    let key_len = keys::value_key(1, b"k00").len();
    let kept = READS_LIMIT / Reads::cost(key_len, big(0).encode().len());
    assert!(kept < n, "the test reads past the limit");
    assert!(txn.reads.borrow().bytes <= READS_LIMIT);
    engine.take();
    let (_, log) = txn.into_parts();
    let log = counted(log);
    assert_eq!(
        engine.take(),
        n - kept,
        "the reads not kept are read at the seal"
    );
    let befores: Vec<_> = changelog::decode(&log)
        .map(|c| c.unwrap().before.map(|b| b.map(<[u8]>::to_vec)))
        .collect();
    let expected: Vec<_> = (0..n).map(|i| Some(Some(big(i).encode()))).collect();
    assert!(
        befores == expected,
        "every before-image is the committed value"
    );
}
