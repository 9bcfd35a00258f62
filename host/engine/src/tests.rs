//! The engine's own behaviour over native processors, without WebAssembly: a batch's plan is
//! durable and re-run as planned, a failed batch commits nothing, timers fire against the
//! batch clock and are deleted, TTL hides and then removes state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use statebox_contract::{
    BatchFailure, CallError, CallErrorKind, Function, InstanceConfig, KeyRows, PartitionBatch,
    PartitionProcessor, ProcessorFactory, ProcessorInfo, TimeMode,
};
use statebox_schema::Schema;
use statebox_state::StoredValue;
use statebox_state::catalog::{Catalog, Declaration, Described, InitOp, VarHandle, VarKind};

use crate::testing::NativeCounter;
use crate::{EngineError, Query, QueryOptions, StateReader};

/// How long `seen` lives, and how far after its batch a key's reminder fires.
const LIFE_MS: i64 = 1_000;

/// What [`Reminder`] does after writing: return its output, fail the call, or panic.
const RUN: u8 = 0;
const FAIL: u8 = 1;
const PANIC: u8 = 2;

/// Per key: emits what `seen` held (TTL hides an expired value), stores the key's row count
/// in `seen` with a TTL of [`LIFE_MS`], and registers a timer [`LIFE_MS`] after the batch;
/// a fired timer emits `{"key", "fired"}`. After writing, fails the call if `fail` is
/// [`FAIL`], or panics (a process dying mid-batch) if it is [`PANIC`], so an unfinished batch
/// has writes to roll back.
struct Reminder {
    info: ProcessorInfo,
    fail: Arc<AtomicU8>,
}

struct ReminderInstance {
    seen: Arc<VarHandle>,
    fail: Arc<AtomicU8>,
}

impl Reminder {
    fn new(fail: Arc<AtomicU8>) -> Reminder {
        Reminder {
            info: ProcessorInfo {
                name: "reminder".into(),
                output_schema: Schema::parse_ddl("key string, seen long, fired long").unwrap(),
                input_schema: None,
                output_event_time_column: None,
            },
            fail,
        }
    }
}

impl ProcessorFactory for Reminder {
    fn info(&self) -> &ProcessorInfo {
        &self.info
    }

    fn describe_init(&self, _: TimeMode, catalog: &Catalog) -> Result<Described, CallError> {
        let mut trial = catalog.trial();
        let outcome = trial
            .declare("seen", VarKind::Value, None, "long", Some(LIFE_MS as u64))
            .map(|_| ())
            .map_err(|e| e.to_string());
        let op = InitOp::Declare(Declaration {
            name: "seen".into(),
            kind: VarKind::Value,
            key_schema: None,
            value_schema: "long".into(),
            ttl_ms: Some(LIFE_MS as u64),
        });
        Ok(Described {
            init_error: outcome.clone().err(),
            ops: vec![(op, outcome)],
        })
    }

    fn instantiate(
        &self,
        config: InstanceConfig,
    ) -> Result<Box<dyn PartitionProcessor>, CallError> {
        let catalog: &Mutex<Catalog> = &config.catalog;
        let seen = catalog
            .lock()
            .unwrap()
            .declare("seen", VarKind::Value, None, "long", Some(LIFE_MS as u64))
            .map_err(|e| CallError {
                processor: "reminder".into(),
                function: Function::Init,
                key: None,
                kind: CallErrorKind::Failed(e.to_string()),
            })?;
        Ok(Box::new(ReminderInstance {
            seen,
            fail: self.fail.clone(),
        }))
    }
}

impl PartitionProcessor for ReminderInstance {
    fn handle_input_batch(
        &mut self,
        batch: &mut PartitionBatch,
        groups: &[KeyRows<'_>],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        let now = batch.times().batch_timestamp_ms;
        let internal = |e| BatchFailure {
            entry: None,
            error: CallError {
                processor: "reminder".into(),
                function: Function::HandleInputRows,
                key: None,
                kind: CallErrorKind::Internal(e),
            },
        };
        let mut out = Vec::new();
        for g in groups {
            let txn = batch.txn();
            let k = g.key.as_bytes();
            let before = txn.value_get(self.seen.id, k).map_err(internal)?.map(|v| {
                String::from_utf8(v.payload)
                    .unwrap()
                    .parse::<i64>()
                    .unwrap()
            });
            let value = StoredValue {
                schema_id: self.seen.schema_id(),
                expires_at_ms: Some(now + LIFE_MS),
                payload: g.rows.len().to_string().into_bytes(),
            };
            txn.value_put(self.seen.id, k, value).map_err(internal)?;
            txn.timer_register(k, now + LIFE_MS).map_err(internal)?;
            out.push(vec![json!({"key": g.key, "seen": before}).to_string()]);
        }
        let mode = self.fail.load(Ordering::Relaxed);
        assert_ne!(mode, PANIC, "told to die mid-batch");
        if mode == FAIL {
            return Err(BatchFailure {
                entry: Some(0),
                error: CallError {
                    processor: "reminder".into(),
                    function: Function::HandleInputRows,
                    key: Some(groups[0].key.to_owned()),
                    kind: CallErrorKind::Failed("told to fail".into()),
                },
            });
        }
        Ok(out)
    }

    fn handle_expired_timers(
        &mut self,
        _batch: &mut PartitionBatch,
        timers: &[(&str, i64)],
    ) -> Result<Vec<Vec<String>>, BatchFailure> {
        Ok(timers
            .iter()
            .map(|(key, ts)| vec![json!({"key": key, "fired": ts}).to_string()])
            .collect())
    }
}

/// A query's directories: input files are added one per batch.
struct Dirs {
    _root: tempfile::TempDir,
    input: PathBuf,
    output: PathBuf,
    checkpoint: PathBuf,
}

impl Dirs {
    fn new() -> Dirs {
        let root = tempfile::tempdir().unwrap();
        let input = root.path().join("input");
        std::fs::create_dir(&input).unwrap();
        Dirs {
            input,
            output: root.path().join("out.jsonl"),
            checkpoint: root.path().join("checkpoint"),
            _root: root,
        }
    }

    fn add_input(&self, name: &str, keys: &[&str]) {
        let text: String = keys
            .iter()
            .map(|k| format!("{{\"k\":\"{k}\"}}\n"))
            .collect();
        std::fs::write(self.input.join(name), text).unwrap();
    }

    fn options(&self, time_mode: TimeMode) -> QueryOptions {
        QueryOptions {
            partitions: Some(2),
            time_mode: Some(time_mode),
            workers: Some(1),
            ..QueryOptions::new(
                self.input.clone(),
                self.output.clone(),
                self.checkpoint.clone(),
                vec!["k".into()],
            )
        }
    }

    fn output(&self) -> Vec<Value> {
        read_rows(&self.output)
    }
}

fn read_rows(path: &Path) -> Vec<Value> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn state(checkpoint: &Path, var: &str) -> Vec<Value> {
    let mut rows = Vec::new();
    StateReader::open(checkpoint)
        .unwrap()
        .read_state(var, false, None, |row| {
            rows.push(row);
            Ok(())
        })
        .unwrap();
    rows
}

#[test]
fn native_counter_counts_across_batches_and_restarts() {
    let dirs = Dirs::new();
    dirs.add_input("0.jsonl", &["a", "b", "a"]);
    let mut query =
        Query::open(dirs.options(TimeMode::None), Arc::new(NativeCounter::new())).unwrap();
    assert_eq!(query.run_available(|_| {}).unwrap().len(), 1);
    drop(query);
    dirs.add_input("1.jsonl", &["a"]);
    let mut query =
        Query::open(dirs.options(TimeMode::None), Arc::new(NativeCounter::new())).unwrap();
    let reports = query.run_available(|_| {}).unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].commit.batch_id, 1);
    let mut out = dirs.output();
    out.sort_by_key(|r| r.to_string());
    assert_eq!(
        out,
        [
            json!({"key": "a", "count": 1}),
            json!({"key": "b", "count": 1}),
            json!({"key": "a", "count": 2}),
        ]
    );
    let mut counts = state(&dirs.checkpoint, "count");
    counts.sort_by_key(|r| r.to_string());
    let values: Vec<&Value> = counts.iter().map(|r| &r["value"]).collect();
    assert_eq!(values, [&json!(3), &json!(1)], "{counts:?}");
}

/// With a state cache far too small for the state, each batch reads its keys' state ahead
/// from RocksDB (learned from the batch before); the counts, lists and maps come out as
/// they would with everything cached.
#[test]
fn state_beyond_the_state_cache_is_read_ahead_and_counts_the_same() {
    let dirs = Dirs::new();
    let key = |i: usize| format!("k{i}");
    // Three batches over overlapping ranges of keys, some keys twice in a batch.
    let batches: [Vec<usize>; 3] = [
        (0..600).chain(0..100).collect(),
        (0..400).chain(300..400).collect(),
        (200..900).collect(),
    ];
    let mut options = dirs.options(TimeMode::None);
    options.state_cache_bytes = Some(16 << 10);
    options.max_files_per_batch = 1;
    for (b, keys) in batches.iter().enumerate() {
        let names: Vec<String> = keys.iter().map(|&i| key(i)).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        dirs.add_input(&format!("{b}.jsonl"), &names);
    }
    let mut query = Query::open(options, Arc::new(NativeCounter::new())).unwrap();
    assert_eq!(query.run_available(|_| {}).unwrap().len(), 3);
    drop(query);

    // Per key: its total count and the size of each batch it was in.
    let mut expected: BTreeMap<String, (i64, Vec<i64>)> = BTreeMap::new();
    for keys in &batches {
        let mut sizes: BTreeMap<usize, i64> = BTreeMap::new();
        for &i in keys {
            *sizes.entry(i).or_default() += 1;
        }
        for (i, n) in sizes {
            let e = expected
                .entry(json!({"k": key(i)}).to_string())
                .or_default();
            e.0 += n;
            e.1.push(n);
        }
    }
    let by_key = |var: &str, field: &str| -> BTreeMap<String, Value> {
        state(&dirs.checkpoint, var)
            .into_iter()
            .map(|r| (r["key"].to_string(), r[field].clone()))
            .collect()
    };
    let counts = by_key("count", "value");
    let lists = by_key("batchCounts", "list_value");
    let stats = by_key("stats", "map_value");
    assert_eq!(counts.len(), expected.len());
    for (k, (total, sizes)) in &expected {
        assert_eq!(counts[k], json!(total), "count of {k}");
        assert_eq!(lists[k], json!(sizes), "batchCounts of {k}");
        let calls = json!({r#"{"name":"calls"}"#: {"count": sizes.len()}});
        assert_eq!(stats[k], calls, "stats of {k}");
    }
}

#[test]
fn snapshots_taken_beside_the_next_batch_read_back_and_partial_ones_go_at_open() {
    let dirs = Dirs::new();
    let opts = QueryOptions {
        snapshot_interval: 1,
        ..dirs.options(TimeMode::None)
    };
    let snapshots = crate::reader::snapshots_dir(&dirs.checkpoint);
    dirs.add_input("0.jsonl", &["a", "b"]);
    dirs.add_input("1.jsonl", &["a"]);
    let mut query = Query::open(opts.clone(), Arc::new(NativeCounter::new())).unwrap();
    assert_eq!(query.run_available(|_| {}).unwrap().len(), 2);
    // Batch 1's commit waited for batch 0's snapshot; batch 1's is waited for here.
    query.wait_for_snapshot();
    assert_eq!(crate::reader::list_snapshots(&snapshots), [0, 1]);
    drop(query);

    // A run that died taking a snapshot left its temporary directory, with a hard link.
    let partial = snapshots.join(".tmp-00000000000000000002");
    std::fs::create_dir_all(partial.join("state")).unwrap();
    std::fs::write(partial.join("state/000009.sst"), b"x").unwrap();
    let query = Query::open(opts, Arc::new(NativeCounter::new())).unwrap();
    assert!(!partial.exists(), "opening removes a partial snapshot");
    assert_eq!(crate::reader::list_snapshots(&snapshots), [0, 1]);
    drop(query);

    // Batch 0 is read from its snapshot (undoing batch 1 there would give the same).
    let mut counts = Vec::new();
    StateReader::open(&dirs.checkpoint)
        .unwrap()
        .read_state("count", false, Some(0), |row| {
            counts.push(row["value"].clone());
            Ok(())
        })
        .unwrap();
    counts.sort_by_key(|v| v.to_string());
    assert_eq!(counts, [json!(1), json!(1)]);
}

#[test]
fn a_failed_batch_commits_nothing_and_withdraws_its_plan() {
    let dirs = Dirs::new();
    dirs.add_input("0.jsonl", &["a", "b"]);
    let fail = Arc::new(AtomicU8::new(FAIL));
    let factory = Arc::new(Reminder::new(fail.clone()));
    let mut query = Query::open(dirs.options(TimeMode::ProcessingTime), factory.clone()).unwrap();
    let err = query.run_next(Some(10_000)).unwrap_err();
    assert!(
        matches!(&err, EngineError::Processor(e) if matches!(&e.kind, CallErrorKind::Failed(m) if m == "told to fail")),
        "{err:?}"
    );
    // Nothing of the batch is visible: no commit, no output.
    assert!(query.head().is_none());
    assert!(dirs.output().is_empty());

    // The plan was withdrawn, so the input is planned again, at the new time; the writes of
    // the failed attempt were rolled back: the new run sees no `seen`.
    fail.store(RUN, Ordering::Relaxed);
    let report = query.run_next(Some(20_000)).unwrap().expect("batch 0");
    assert_eq!(report.commit.batch_id, 0);
    assert_eq!(report.commit.timestamp_ms, 20_000);
    assert_eq!(report.commit.output_rows, 2);
    let out = dirs.output();
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out.iter().all(|r| r["seen"].is_null()), "{out:?}");
}

/// Plans batch 0 over two rows at 10,000 ms and runs it until its processor panics, as a
/// process that dies mid-batch; returns the query's options and a processor that now runs.
fn die_in_batch_0(dirs: &Dirs) -> (QueryOptions, Arc<Reminder>) {
    dirs.add_input("0.jsonl", &["a", "b"]);
    let fail = Arc::new(AtomicU8::new(PANIC));
    let factory = Arc::new(Reminder::new(fail.clone()));
    let opts = dirs.options(TimeMode::ProcessingTime);
    let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut query = Query::open(opts.clone(), factory.clone()).unwrap();
        let _ = query.run_next(Some(10_000));
    }));
    assert!(died.is_err(), "the processor panicked mid-batch");
    assert!(dirs.output().is_empty());
    fail.store(RUN, Ordering::Relaxed);
    (opts, factory)
}

#[test]
fn a_batch_that_died_mid_run_is_rerun_from_its_durable_plan() {
    let dirs = Dirs::new();
    let (opts, factory) = die_in_batch_0(&dirs);
    // A new run re-runs batch 0 exactly as planned, at the planned time, not the one asked
    // for; nothing of the dead attempt is in its state.
    let mut query = Query::open(opts, factory).unwrap();
    let report = query
        .run_next(Some(99_000))
        .unwrap()
        .expect("the pending batch");
    assert_eq!(report.commit.batch_id, 0);
    assert_eq!(report.commit.timestamp_ms, 10_000);
    let out = dirs.output();
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out.iter().all(|r| r["seen"].is_null()), "{out:?}");
    // The plan is consumed by the commit: the next run has nothing to do.
    assert!(query.run_next(Some(99_000)).unwrap().is_none());
}

/// A checkpoint an earlier version left with a batch planned but not committed has the
/// plan among its metadata: the batch is re-run from it, and its commit removes it.
#[test]
fn a_plan_an_earlier_version_logged_is_rerun_and_removed_by_its_commit() {
    let dirs = Dirs::new();
    let (opts, factory) = die_in_batch_0(&dirs);
    let legacy = "plan/00000000000000000000";
    {
        let cp = statebox_state::Checkpoint::open(&dirs.checkpoint).unwrap();
        let plan = cp.get_plan(0).unwrap().expect("batch 0 is planned");
        cp.put_meta_sync(legacy, &plan).unwrap();
        cp.withdraw_plan(0).unwrap();
    }
    let mut query = Query::open(opts, factory).unwrap();
    let report = query
        .run_next(Some(99_000))
        .unwrap()
        .expect("the pending batch");
    assert_eq!(
        (report.commit.batch_id, report.commit.timestamp_ms),
        (0, 10_000)
    );
    assert!(query.run_next(Some(99_000)).unwrap().is_none());
    drop(query);
    let cp = statebox_state::Checkpoint::open(&dirs.checkpoint).unwrap();
    assert_eq!(cp.get_meta(legacy).unwrap(), None);
}

#[test]
fn timers_fire_at_the_batch_clock_once_and_are_deleted() {
    let dirs = Dirs::new();
    dirs.add_input("0.jsonl", &["a"]);
    let factory = Arc::new(Reminder::new(Arc::new(AtomicU8::new(RUN))));
    let mut query = Query::open(dirs.options(TimeMode::ProcessingTime), factory).unwrap();
    query.run_next(Some(1_000)).unwrap().unwrap();
    // Not yet due: the timer is at 2000.
    let early = query.run_no_data(Some(1_999)).unwrap();
    assert_eq!(early.commit.timers_fired, 0);
    let due = query.run_no_data(Some(2_000)).unwrap();
    assert_eq!(due.commit.timers_fired, 1);
    let again = query.run_no_data(Some(5_000)).unwrap();
    assert_eq!(again.commit.timers_fired, 0, "a fired timer is deleted");
    let fired: Vec<Value> = dirs
        .output()
        .into_iter()
        .filter(|r| r.get("fired").is_some())
        .collect();
    assert_eq!(fired, [json!({"key": "[\"a\"]", "fired": 2_000})]);
    drop(query);
    let mut timers = Vec::new();
    StateReader::open(&dirs.checkpoint)
        .unwrap()
        .read_timers(|t| {
            timers.push(t);
            Ok(())
        })
        .unwrap();
    assert!(timers.is_empty(), "{timers:?}");
}

#[test]
fn ttl_hides_expired_state_from_the_processor_and_cleanup_removes_it() {
    let dirs = Dirs::new();
    dirs.add_input("0.jsonl", &["a", "b"]);
    let factory = Arc::new(Reminder::new(Arc::new(AtomicU8::new(RUN))));
    let mut query = Query::open(dirs.options(TimeMode::ProcessingTime), factory).unwrap();
    query.run_next(Some(1_000)).unwrap().unwrap();
    // Within its life `a` is seen; `b`'s value expires at 2000 and is removed then.
    dirs.add_input("1.jsonl", &["a"]);
    let report = query.run_next(Some(1_500)).unwrap().unwrap();
    assert_eq!(report.commit.ttl_removed, 0);
    // At 3000 `a`'s value (rewritten at 1500, expiring at 2500) is expired: the processor
    // must not see it, although cleanup has not run yet in this batch.
    dirs.add_input("2.jsonl", &["a"]);
    let report = query.run_next(Some(3_000)).unwrap().unwrap();
    // `b`'s value (expired at 2000) is cleaned up; `a` was just rewritten.
    assert_eq!(report.commit.ttl_removed, 1);
    let seen: Vec<Value> = dirs
        .output()
        .into_iter()
        .filter(|r| r["key"] == "[\"a\"]" && r.get("seen").is_some())
        .map(|r| r["seen"].clone())
        .collect();
    assert_eq!(seen, [Value::Null, json!(1), Value::Null]);
    drop(query);
    let rows = state(&dirs.checkpoint, "seen");
    assert_eq!(rows.len(), 1, "only `a` is left: {rows:?}");
}

#[test]
fn a_store_failure_while_firing_timers_is_the_stores_not_the_processors() {
    let dirs = Dirs::new();
    dirs.add_input("0.jsonl", &["a"]);
    let factory = Arc::new(Reminder::new(Arc::new(AtomicU8::new(RUN))));
    let opts = dirs.options(TimeMode::ProcessingTime);
    let mut query = Query::open(opts.clone(), factory.clone()).unwrap();
    query.run_next(Some(1_000)).unwrap().unwrap();
    drop(query);
    // A timer whose key does not decode (no key the engine writes is not UTF-8): firing it
    // fails in the engine's own scan of due timers, before any processor call.
    let checkpoint = statebox_state::Checkpoint::open(&dirs.checkpoint).unwrap();
    let mut txn = checkpoint.txn(0);
    txn.timer_register(b"\xff\xfe", 1_500).unwrap();
    checkpoint
        .commit(statebox_state::Commit {
            drop_vars: Vec::new(),
            txns: vec![txn],
            meta: Vec::new(),
            changelog: None,
        })
        .unwrap();
    drop(checkpoint);
    let mut query = Query::open(opts, factory).unwrap();
    let err = query.run_no_data(Some(1_600)).unwrap_err();
    assert!(
        matches!(&err, EngineError::Store(statebox_state::StoreError::Corrupt(m)) if m.contains("timer key")),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(!message.contains("handle-expired-timer"), "{message}");
    assert!(!message.contains("processor"), "{message}");
}

/// Overwrites checkpoint record `name` (`plan 1`: batch 1's plan) with bytes that do not
/// decode.
fn damage(checkpoint: &Path, name: &str) {
    let cp = statebox_state::Checkpoint::open(checkpoint).unwrap();
    let bad = b"{\"batch_id\": \"not a number\"";
    match name {
        "plan 1" => cp.put_plan_sync(1, bad),
        _ => cp.put_meta_sync(name, bad),
    }
    .unwrap();
}

fn is_corrupt(err: &EngineError, what: &str) -> bool {
    matches!(err, EngineError::Store(statebox_state::StoreError::Corrupt(m))
        if m.starts_with(&format!("checkpoint {what} is unreadable")))
}

#[test]
fn a_damaged_checkpoint_record_is_corrupt_state_not_a_bad_setting() {
    for (name, what) in [
        ("head", "commit record"),
        ("query", "query record"),
        ("catalog", "catalog"),
        ("plan 1", "batch plan"),
    ] {
        let dirs = Dirs::new();
        dirs.add_input("0.jsonl", &["a"]);
        let opts = dirs.options(TimeMode::None);
        let mut query = Query::open(opts.clone(), Arc::new(NativeCounter::new())).unwrap();
        query.run_available(|_| {}).unwrap();
        drop(query);
        damage(&dirs.checkpoint, name);
        let err = match Query::open(opts, Arc::new(NativeCounter::new())) {
            // A plan is read when the batch it plans runs.
            Ok(mut query) => query.run_next(None).map(|_| ()).unwrap_err(),
            Err(e) => e,
        };
        assert!(is_corrupt(&err, what), "{name}: {err:?}");
        assert!(
            err.to_string()
                .starts_with("state store is corrupt: checkpoint"),
            "{name}: {err}"
        );
        if name != "plan 1" {
            let Err(err) = StateReader::open(&dirs.checkpoint) else {
                panic!("the reader opened a damaged {name}");
            };
            assert!(is_corrupt(&err, what), "reader, {name}: {err:?}");
        }
    }
}

/// A commit record as versions before the timing moved out of it wrote it: the timing
/// fields inline, no `timing/<batch>` beside it.
fn old_format_record(batch_id: u64, output_bytes: u64) -> Vec<u8> {
    json!({
        "batch_id": batch_id, "timestamp_ms": 1_000, "watermark_ms": -1,
        "output_bytes": output_bytes, "input_rows": 3, "output_rows": 2, "keys": 2,
        "duration_ms": 41, "read_ms": 7, "process_ms": 30, "commit_ms": 4, "late_rows": 0,
        "timers_fired": 0, "ttl_removed": 0, "timers_ms": 0, "ttl_ms": 0, "rows_per_s": 73.0,
        "variables": {"value": 1, "list": 1, "map": 1}, "state_rows_total": 6,
        "state_rows_updated": 6, "state_rows_removed": 0, "timers_total": 0,
        "timers_registered": 0, "timers_deleted": 0, "state_bytes_on_disk": 0,
        "next_watermark_ms": -1
    })
    .to_string()
    .into_bytes()
}

#[test]
fn a_checkpoint_whose_commit_records_hold_timing_still_opens_and_goes_on() {
    let dirs = Dirs::new();
    dirs.add_input("0.jsonl", &["a", "b", "a"]);
    let opts = dirs.options(TimeMode::None);
    let mut query = Query::open(opts.clone(), Arc::new(NativeCounter::new())).unwrap();
    let first = query.run_available(|_| {}).unwrap().remove(0);
    drop(query);
    // Batch 0's records rewritten as an earlier version wrote them.
    let old = old_format_record(0, first.commit.output_bytes);
    let cp = statebox_state::Checkpoint::open(&dirs.checkpoint).unwrap();
    cp.commit(statebox_state::Commit {
        drop_vars: Vec::new(),
        txns: Vec::new(),
        meta: vec![
            ("timing/00000000000000000000".into(), None),
            ("commit/00000000000000000000".into(), Some(old.clone())),
            ("head".into(), Some(old)),
        ],
        changelog: None,
    })
    .unwrap();
    drop(cp);

    dirs.add_input("1.jsonl", &["a"]);
    let mut query = Query::open(opts, Arc::new(NativeCounter::new())).unwrap();
    let head = query.last_report().expect("batch 0");
    assert_eq!(head.commit.batch_id, 0);
    assert_eq!(head.commit.output_bytes, first.commit.output_bytes);
    assert_eq!(
        (head.timing.duration_ms, head.timing.rows_per_s),
        (41, 73.0)
    );
    let second = query.run_available(|_| {}).unwrap().remove(0);
    assert_eq!(second.commit.batch_id, 1);
    // The old record's 6 state rows, and the list element `a`'s batch added.
    assert_eq!(second.commit.state_rows_total, 7);
    assert_eq!(query.last_report().as_ref(), Some(&second));
    drop(query);
    let mut counts: Vec<Value> = state(&dirs.checkpoint, "count")
        .into_iter()
        .map(|r| r["value"].clone())
        .collect();
    counts.sort_by_key(|v| v.to_string());
    assert_eq!(counts, [json!(1), json!(3)]);

    // The new record holds no timing; the progress shows each batch's all the same.
    let cp = statebox_state::Checkpoint::open_read_only(&dirs.checkpoint).unwrap();
    let stored: Value =
        serde_json::from_slice(&cp.get_meta("commit/00000000000000000001").unwrap().unwrap())
            .unwrap();
    drop(cp);
    for field in [
        "duration_ms",
        "read_ms",
        "process_ms",
        "commit_ms",
        "rows_per_s",
    ] {
        assert!(stored.get(field).is_none(), "`{field}` stored in {stored}");
    }
    assert_eq!(stored["batch_id"], 1);
    let progress = StateReader::open(&dirs.checkpoint)
        .unwrap()
        .progress(10)
        .unwrap();
    assert_eq!(progress[0].timing.read_ms, 7, "the old record's own timing");
    assert_eq!(progress[1].commit, second.commit);
    assert_eq!(progress[1].timing.read_ms, second.timing.read_ms);
}

#[test]
fn a_report_prints_as_one_object_of_the_record_and_its_timing() {
    let dirs = Dirs::new();
    dirs.add_input("0.jsonl", &["a"]);
    let mut query =
        Query::open(dirs.options(TimeMode::None), Arc::new(NativeCounter::new())).unwrap();
    let report = query.run_available(|_| {}).unwrap().remove(0);
    let printed = serde_json::to_value(&report).unwrap();
    assert_eq!(printed["batch_id"], 0);
    assert_eq!(printed["input_rows"], 1);
    assert_eq!(printed["duration_ms"], report.timing.duration_ms);
    assert!(printed.get("rows_per_s").is_some(), "{printed}");
    let back: crate::BatchReport = serde_json::from_value(printed).unwrap();
    assert_eq!(back, report);
}

#[test]
fn an_idle_tick_runs_a_no_data_batch_in_the_time_modes_only() {
    assert!(!crate::idle_tick_runs_no_data(TimeMode::None));
    assert!(crate::idle_tick_runs_no_data(TimeMode::ProcessingTime));
    assert!(crate::idle_tick_runs_no_data(TimeMode::EventTime));

    let dirs = Dirs::new();
    dirs.add_input("0.jsonl", &["a"]);
    let mut query =
        Query::open(dirs.options(TimeMode::None), Arc::new(NativeCounter::new())).unwrap();
    assert_eq!(
        query
            .run_tick(Some(1_000))
            .unwrap()
            .unwrap()
            .commit
            .input_rows,
        1
    );
    assert!(
        query.run_tick(Some(2_000)).unwrap().is_none(),
        "nothing can be due"
    );

    let dirs = Dirs::new();
    dirs.add_input("0.jsonl", &["a"]);
    let factory = Arc::new(Reminder::new(Arc::new(AtomicU8::new(RUN))));
    let mut query = Query::open(dirs.options(TimeMode::ProcessingTime), factory).unwrap();
    assert_eq!(
        query
            .run_tick(Some(1_000))
            .unwrap()
            .unwrap()
            .commit
            .input_rows,
        1
    );
    // No new input: the tick runs a no-data batch, which fires the timer due at 2000.
    let idle = query
        .run_tick(Some(2_000))
        .unwrap()
        .expect("a no-data batch");
    assert_eq!((idle.commit.input_rows, idle.commit.timers_fired), (0, 1));
}

/// A plan log in memory, shared by the "processes" of a test as an object store would be.
#[derive(Clone, Default)]
struct SharedPlans(Arc<Mutex<std::collections::BTreeMap<u64, Vec<u8>>>>);

impl crate::PlanLog for SharedPlans {
    fn put(&mut self, batch_id: u64, plan: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let mut plans = self.0.lock().unwrap();
        if let Some(logged) = plans.get(&batch_id) {
            return Ok(Some(logged.clone()));
        }
        plans.insert(batch_id, plan.to_vec());
        Ok(None)
    }

    fn get(&mut self, batch_id: u64) -> Result<Option<Vec<u8>>, EngineError> {
        Ok(self.0.lock().unwrap().get(&batch_id).cloned())
    }

    fn last(&mut self) -> Result<Option<u64>, EngineError> {
        Ok(self.0.lock().unwrap().keys().next_back().copied())
    }
}

/// Two processes share a query through a plan log: the second, starting from nothing,
/// re-runs the first's plans (same batches, same times, same output and state), and a
/// batch one of them planned first is the batch the other runs, whatever it would have
/// planned itself.
#[test]
fn a_shared_plan_log_makes_a_second_process_run_the_same_batches() {
    let dirs = Dirs::new();
    let other = Dirs::new();
    for (i, keys) in [["a", "b"], ["a", "c"], ["b", "b"]].iter().enumerate() {
        dirs.add_input(&format!("{i}.jsonl"), keys);
    }
    let log = SharedPlans::default();
    let open = |checkpoint: &Path, output: &Path| {
        let opts = QueryOptions {
            max_files_per_batch: 1,
            checkpoint: checkpoint.to_owned(),
            output: output.to_owned(),
            ..dirs.options(TimeMode::ProcessingTime)
        };
        let endpoints = crate::Endpoints {
            plans: Some(Box::new(log.clone())),
            ..Default::default()
        };
        Query::open_with(opts, Arc::new(NativeCounter::new()), endpoints).unwrap()
    };
    let mut first = open(&dirs.checkpoint, &dirs.output);
    let mut times = Vec::new();
    for at in [1_000, 2_000, 3_000] {
        let report = first.run_next(Some(at)).unwrap().unwrap();
        times.push(report.commit.timestamp_ms);
    }
    assert_eq!(log.0.lock().unwrap().len(), 3);

    // The second process starts from an empty checkpoint at a later clock: it runs the
    // logged batches with their own times, not its own.
    let mut second = open(&other.checkpoint, &other.output);
    let mut replayed = Vec::new();
    while let Some(report) = second.run_next(Some(9_000)).unwrap() {
        replayed.push(report.commit.timestamp_ms);
        if replayed.len() == 3 {
            break;
        }
    }
    assert_eq!(replayed, times);
    assert_eq!(read_rows(&other.output), dirs.output());
    assert_eq!(
        state(&other.checkpoint, "count"),
        state(&dirs.checkpoint, "count")
    );

    // New input: the second plans batch 3 first; the first then runs that plan, not its own.
    dirs.add_input("3.jsonl", &["c"]);
    let planned = second.run_next(Some(20_000)).unwrap().unwrap();
    let adopted = first.run_next(Some(50_000)).unwrap().unwrap();
    assert_eq!(adopted.commit.batch_id, 3);
    assert_eq!(adopted.commit.timestamp_ms, planned.commit.timestamp_ms);
    assert_eq!(adopted.commit.timestamp_ms, 20_000);
    assert_eq!(read_rows(&other.output), dirs.output());
}
