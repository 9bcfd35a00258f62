//! `statebox sql`: SQL (Apache DataFusion) over checkpoints that real processors wrote,
//! checked against what the processors stored.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use serde_json::{Value, json};
use statebox_engine::{Query, QueryOptions, TimeMode};
use statebox_tests::{Scratch, component_cache, guests, parse_jsonl, statebox_bin};

const DEDUP_TTL: &str = env!("STATEBOX_GUEST_DEDUP_TTL");
const HEARTBEAT: &str = env!("STATEBOX_GUEST_HEARTBEAT_MONITOR");
const PROFILE_V1: &str = env!("STATEBOX_GUEST_USER_PROFILE_V1");
const PROFILE_V2: &str = env!("STATEBOX_GUEST_USER_PROFILE_V2");

/// `partition_of(["u1"], 4)`, pinned by the engine's partitioning test.
const U1_PARTITION: u64 = 3;

/// Runs `statebox sql --checkpoint <checkpoint> --format <format> <query>`.
fn sql(checkpoint: &Path, format: &str, query: &str) -> Output {
    Command::new(statebox_bin())
        .arg("sql")
        .arg("--checkpoint")
        .arg(checkpoint)
        .args(["--format", format, query])
        .env("STATEBOX_CACHE_DIR", component_cache())
        .env_remove("STATEBOX_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox sql")
}

/// Runs a query expecting success and returns standard output in `format`.
#[track_caller]
fn sql_ok(scratch: &Scratch, format: &str, query: &str) -> String {
    let out = sql(&scratch.checkpoint(), format, query);
    assert!(
        out.status.success(),
        "statebox sql {query:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Runs a query and returns its rows (JSON Lines).
#[track_caller]
fn rows(scratch: &Scratch, query: &str) -> Vec<Value> {
    parse_jsonl(sql_ok(scratch, "jsonl", query).as_bytes())
}

/// Runs a query expecting a clean failure and returns standard error.
#[track_caller]
fn sql_err(scratch: &Scratch, query: &str) -> String {
    let out = sql(&scratch.checkpoint(), "jsonl", query);
    assert_eq!(
        out.status.code(),
        Some(1),
        "statebox sql {query:?} should fail; printed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "a failed query prints no rows");
    String::from_utf8(out.stderr).expect("UTF-8 errors")
}

/// Counter over two batches (`u1` ×2 and `u2`, then `u1`): count 3 and 1, batch counts
/// [2, 1] and [1], calls (the map entry `{name: calls}`) 2 and 1.
fn counter_checkpoint() -> Scratch {
    let scratch = Scratch::new();
    scratch.write_rows(
        "a.jsonl",
        &[json!({"k": "u1"}), json!({"k": "u1"}), json!({"k": "u2"})],
    );
    scratch.run_cmd(guests::COUNTER, "k").run().expect_ok();
    scratch.write_rows("b.jsonl", &[json!({"k": "u1"})]);
    scratch.run_cmd(guests::COUNTER, "k").run().expect_ok();
    scratch
}

/// Value, list and map state, flattened and not, typed: filters on struct fields, time
/// travel and aggregates see what the counter stored.
#[test]
fn sql_reads_value_list_and_map_state_with_typed_columns() {
    let s = counter_checkpoint();

    // Value state: `key` is a struct of the key columns, a `long` value a plain column.
    assert_eq!(
        rows(
            &s,
            "SELECT * FROM read_statestore(stateVarName => 'count') WHERE key.k = 'u1'"
        ),
        [json!({"key": {"k": "u1"}, "value": 3, "partition_id": U1_PARTITION})]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT key.k AS k, value FROM read_statestore(stateVarName => 'count') \
             WHERE value > 1 ORDER BY k"
        ),
        [json!({"k": "u1", "value": 3})]
    );

    // Lists: one row per element, or one list per key.
    assert_eq!(
        rows(
            &s,
            "SELECT key.k AS k, list_element FROM read_statestore(stateVarName => \
             'batchCounts') ORDER BY k, list_element"
        ),
        [
            json!({"k": "u1", "list_element": 1}),
            json!({"k": "u1", "list_element": 2}),
            json!({"k": "u2", "list_element": 1}),
        ]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT key.k AS k, list_value, list_value[1] AS first FROM read_statestore(\
             stateVarName => 'batchCounts', flattenCollectionTypes => false) ORDER BY k"
        ),
        [
            json!({"k": "u1", "list_value": [2, 1], "first": 2}),
            json!({"k": "u2", "list_value": [1], "first": 1}),
        ]
    );

    // Maps: the user key and value are structs (`name string` → `count long`); a filter on
    // a struct field of the value.
    assert_eq!(
        rows(
            &s,
            "SELECT key.k AS k, user_map_key.name AS name, user_map_value.count AS n, \
             partition_id FROM read_statestore(stateVarName => 'stats') \
             WHERE user_map_value.count > 1"
        ),
        [json!({"k": "u1", "name": "calls", "n": 2, "partition_id": U1_PARTITION})]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT map_value FROM read_statestore(stateVarName => 'stats', \
             flattenCollectionTypes => false) WHERE key.k = 'u2'"
        ),
        [json!({"map_value": {"{\"name\":\"calls\"}": {"count": 1}}})]
    );

    // Aggregates, a join of two variables, and time travel.
    assert_eq!(
        rows(
            &s,
            "SELECT key.k AS k, count(*) AS batches, sum(list_element) AS total FROM \
             read_statestore(stateVarName => 'batchCounts') GROUP BY key.k ORDER BY k"
        ),
        [
            json!({"k": "u1", "batches": 2, "total": 3}),
            json!({"k": "u2", "batches": 1, "total": 1}),
        ]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT count(*) AS keys, sum(value) AS rows FROM \
             read_statestore(stateVarName => 'count')"
        ),
        [json!({"keys": 2, "rows": 4})]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT c.key.k AS k, c.value = l.total AS consistent FROM \
             read_statestore(stateVarName => 'count') c JOIN (SELECT key, sum(list_element) \
             AS total FROM read_statestore(stateVarName => 'batchCounts') GROUP BY key) l \
             ON c.key.k = l.key.k ORDER BY k"
        ),
        [
            json!({"k": "u1", "consistent": true}),
            json!({"k": "u2", "consistent": true}),
        ]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT key.k AS k, value FROM read_statestore(STATEVARNAME => 'count', \
             BatchId => 0) ORDER BY k"
        ),
        [
            json!({"k": "u1", "value": 2}),
            json!({"k": "u2", "value": 1})
        ]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT value FROM read_statestore(stateVarName => 'count', batchId => '1') \
             WHERE key.k = 'u1'"
        ),
        [json!({"value": 3})]
    );
}

/// The three output formats.
#[test]
fn sql_prints_tables_json_lines_and_csv() {
    let s = counter_checkpoint();
    let query = "SELECT key, value, partition_id FROM read_statestore(stateVarName => 'count') \
                 ORDER BY key.k";
    let csv = sql_ok(&s, "csv", query);
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("key,value,partition_id"));
    assert_eq!(
        lines.next(),
        Some(format!("\"{{\"\"k\"\":\"\"u1\"\"}}\",3,{U1_PARTITION}").as_str())
    );
    assert_eq!(lines.count(), 1);

    // The default is a table.
    let out = Command::new(statebox_bin())
        .arg("sql")
        .arg("--checkpoint")
        .arg(s.checkpoint())
        .arg(query)
        .output()
        .expect("spawn statebox sql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 6, "{table}");
    for column in ["key", "value", "partition_id"] {
        assert!(lines[1].contains(column), "{table}");
    }
    assert!(
        lines[3].contains("{k: u1}") && lines[3].contains("| 3 "),
        "{table}"
    );

    // An empty result still has its columns.
    let empty = sql_ok(
        &s,
        "csv",
        "SELECT key.k AS k FROM read_statestore(stateVarName => 'count') WHERE value > 99",
    );
    assert_eq!(empty, "k\n");
}

/// Counter over three runs: the change feed, whole and in a range, for a value and a list.
#[test]
fn sql_reads_the_change_feed() {
    let s = Scratch::new();
    for (file, keys) in [
        ("a.jsonl", &["u1", "u1", "u2"][..]),
        ("b.jsonl", &["u1"]),
        ("c.jsonl", &["u2"]),
    ] {
        let rows: Vec<Value> = keys.iter().map(|k| json!({"k": k})).collect();
        s.write_rows(file, &rows);
        s.run_cmd(guests::COUNTER, "k").run().expect_ok();
    }
    let change = |batch: u64, k: &str, value: u64| json!({"batch_id": batch, "change_type": "update", "k": k, "value": value});
    assert_eq!(
        rows(
            &s,
            "SELECT batch_id, change_type, key.k AS k, value FROM read_statestore(\
             stateVarName => 'count', readChangeFeed => true, changeStartBatchId => 0) \
             ORDER BY batch_id, k"
        ),
        [
            change(0, "u1", 2),
            change(0, "u2", 1),
            change(1, "u1", 3),
            change(2, "u2", 2)
        ]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT batch_id, change_type, key.k AS k, value FROM read_statestore(\
             stateVarName => 'count', readChangeFeed => 'true', changeStartBatchId => 1, \
             changeEndBatchId => 1)"
        ),
        [change(1, "u1", 3)]
    );
    // List changes name the element's index; the schema has the change feed's columns.
    assert_eq!(
        rows(
            &s,
            "SELECT * FROM read_statestore(stateVarName => 'batchCounts', \
             readChangeFeed => true, changeStartBatchId => 2)"
        ),
        [
            json!({"batch_id": 2, "change_type": "update", "key": {"k": "u2"}, "list_index": 1,
                "value": 1, "partition_id": rows(&s,
                    "SELECT partition_id FROM read_statestore(stateVarName => 'count') \
                     WHERE key.k = 'u2'")[0]["partition_id"]})
        ]
    );
    let err = sql_err(
        &s,
        "SELECT * FROM read_statestore(stateVarName => 'count', readChangeFeed => true, \
         changeStartBatchId => 1, changeEndBatchId => 5)",
    );
    assert!(
        err.contains("the checkpoint retains the change logs of batches 0 to 2"),
        "{err}"
    );
}

/// Dedup with a TTL'd map (processing time): entries show their expiry, the change feed
/// shows the TTL removals, time travel reads the entries back; the metadata says TTL.
#[test]
fn sql_reads_ttl_expiry_and_ttl_removals() {
    let s = Scratch::new();
    let processor = Arc::new(
        statebox_tests::runtime(Default::default())
            .load_file(Path::new(DEDUP_TTL))
            .expect("load dedup-ttl"),
    );
    let opts = QueryOptions {
        time_mode: Some(TimeMode::ProcessingTime),
        ..QueryOptions::new(s.input(), s.output(), s.checkpoint(), vec!["id".into()])
    };
    s.write_rows("a.jsonl", &[json!({"id": "e1"}), json!({"id": "e2"})]);
    let t0 = 1_700_000_000_000_i64;
    let mut query = Query::open(opts, processor).expect("open query");
    query.run_next(Some(t0)).expect("batch 0").expect("input");
    query.run_no_data(Some(t0 + 61_000)).expect("batch 1");
    drop(query);

    assert_eq!(
        rows(
            &s,
            "SELECT count(*) AS n FROM read_statestore(stateVarName => 'seen')"
        ),
        [json!({"n": 0})]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT user_map_key, user_map_value, ttl_expiration_ms, \
             ttl_expiration_ms - user_map_value AS ttl FROM read_statestore(stateVarName => \
             'seen', batchId => 0) ORDER BY user_map_key"
        ),
        [
            json!({"user_map_key": "e1", "user_map_value": t0, "ttl_expiration_ms": t0 + 60_000,
                   "ttl": 60_000}),
            json!({"user_map_key": "e2", "user_map_value": t0, "ttl_expiration_ms": t0 + 60_000,
                   "ttl": 60_000}),
        ]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT batch_id, change_type, count(*) AS n FROM read_statestore(stateVarName \
             => 'seen', readChangeFeed => true, changeStartBatchId => 0) \
             GROUP BY batch_id, change_type ORDER BY batch_id"
        ),
        [
            json!({"batch_id": 0, "change_type": "update", "n": 2}),
            json!({"batch_id": 1, "change_type": "delete", "n": 2}),
        ]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT state_var_name, kind, ttl_enabled, ttl_duration_ms, time_mode \
             FROM read_state_metadata()"
        ),
        [
            json!({"state_var_name": "seen", "kind": "map", "ttl_enabled": true,
                "ttl_duration_ms": 60_000, "time_mode": "processing-time"})
        ]
    );
}

/// Heartbeat monitor in processing time: the registered timers are the deadlines the
/// processor stored; a timer read in time mode `none` is refused.
#[test]
fn sql_reads_registered_timers() {
    let s = Scratch::new();
    let processor = Arc::new(
        statebox_tests::runtime(Default::default())
            .load_file(Path::new(HEARTBEAT))
            .expect("load heartbeat-monitor"),
    );
    let opts = QueryOptions {
        time_mode: Some(TimeMode::ProcessingTime),
        ..QueryOptions::new(s.input(), s.output(), s.checkpoint(), vec!["sensor".into()])
    };
    s.write_rows(
        "a.jsonl",
        &[json!({"sensor": "s1"}), json!({"sensor": "s2"})],
    );
    let t0 = 1_700_000_000_000_i64;
    let mut query = Query::open(opts, processor).expect("open query");
    query.run_next(Some(t0)).expect("batch 0").expect("input");
    drop(query);

    let timers = rows(
        &s,
        "SELECT key.sensor AS sensor, expiration_timestamp_ms FROM \
         read_statestore(readRegisteredTimers => true) ORDER BY sensor",
    );
    assert_eq!(timers.len(), 2, "{timers:?}");
    assert_eq!(timers[0]["sensor"], "s1");
    assert!(timers[0]["expiration_timestamp_ms"].as_i64().unwrap() > t0);
    assert_eq!(
        rows(
            &s,
            "SELECT t.key.sensor AS sensor, t.expiration_timestamp_ms = d.value AS same, \
             t.partition_id = d.partition_id AS same_partition FROM \
             read_statestore(readRegisteredTimers => true, batchId => 0) t JOIN \
             read_statestore(stateVarName => 'deadline') d ON t.key.sensor = d.key.sensor \
             ORDER BY sensor"
        ),
        [
            json!({"sensor": "s1", "same": true, "same_partition": true}),
            json!({"sensor": "s2", "same": true, "same_partition": true}),
        ]
    );

    let none = counter_checkpoint();
    let err = sql_err(
        &none,
        "SELECT * FROM read_statestore(readRegisteredTimers => true)",
    );
    assert!(err.contains("time mode `none`"), "{err}");
}

/// v1 of the user profile, then v2 (a renamed field and a widened type): values written by
/// v1 read through v2's schema, and the metadata shows both schemas.
#[test]
fn sql_reads_evolved_values_and_the_schema_history() {
    let s = Scratch::new();
    s.write_rows(
        "000.jsonl",
        &[
            json!({"user": "a", "name": "Ann", "visits": 2}),
            json!({"user": "z", "name": "Zed", "visits": 7}),
        ],
    );
    s.run_cmd(PROFILE_V1, "user").run().expect_ok();
    s.write_rows(
        "001.jsonl",
        &[json!({"user": "a", "name": "Ann Lee", "email": "ann@x", "visits": 1})],
    );
    s.run_cmd(PROFILE_V2, "user").run().expect_ok();

    assert_eq!(
        rows(
            &s,
            "SELECT key.user AS user, value.display_name AS name, value.visits AS visits \
             FROM read_statestore(stateVarName => 'profile') ORDER BY user"
        ),
        [
            json!({"user": "a", "name": "Ann Lee", "visits": 3}),
            json!({"user": "z", "name": null, "visits": 7}),
        ]
    );
    // At batch 0, v1's values through v1's schema, and `history` (added by v2) is unknown.
    assert_eq!(
        rows(
            &s,
            "SELECT key.user AS user, value FROM read_statestore(stateVarName => 'profile', \
             batchId => 0) ORDER BY user"
        ),
        [
            json!({"user": "a", "value": {"name": "Ann", "visits": 2}}),
            json!({"user": "z", "value": {"name": "Zed", "visits": 7}}),
        ]
    );
    let err = sql_err(
        &s,
        "SELECT * FROM read_statestore(stateVarName => 'history', batchId => 0)",
    );
    assert!(err.contains("unknown state variable `history`"), "{err}");
    let meta = rows(
        &s,
        "SELECT state_var_name, kind, schema_id, value_schema, value_schema_history, \
         operator_name, num_partitions, min_batch_id, max_batch_id, output_mode, key_columns \
         FROM read_state_metadata() ORDER BY state_var_name",
    );
    assert_eq!(meta.len(), 2, "{meta:?}");
    assert_eq!(
        (&meta[0]["state_var_name"], &meta[0]["kind"]),
        (&json!("history"), &json!("list"))
    );
    let profile = &meta[1];
    assert_eq!(profile["schema_id"], 1);
    let history = profile["value_schema_history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "{profile}");
    assert_eq!(history[1], profile["value_schema"]);
    for (schema, field) in [(&history[0], "name"), (&history[1], "display_name")] {
        assert!(schema.as_str().unwrap().contains(field), "{profile}");
    }
    assert_eq!(profile["num_partitions"], 4);
    assert_eq!(
        (&profile["min_batch_id"], &profile["max_batch_id"]),
        (&json!(0), &json!(1))
    );
    assert_eq!(profile["output_mode"], "update");
    assert_eq!(profile["key_columns"], json!(["user"]));
}

/// The documentation's SQL as written: the checkpoint path is the first argument of
/// `read_statestore` and `read_state_metadata`, so one query reads and joins two
/// checkpoints, and `--checkpoint` is only the default (not needed at all with paths).
#[test]
fn sql_takes_the_checkpoint_path_as_the_first_argument() {
    let a = counter_checkpoint();
    let b = Scratch::new();
    b.write_rows("a.jsonl", &[json!({"k": "u1"}), json!({"k": "u3"})]);
    b.run_cmd(guests::COUNTER, "k").run().expect_ok();
    let (pa, pb) = (a.checkpoint(), b.checkpoint());
    let query = format!(
        "SELECT x.key.k AS k, x.value AS a, y.value AS b \
         FROM read_statestore('{}', stateVarName => 'count') x \
         JOIN read_statestore('{}', stateVarName => 'count') y ON x.key.k = y.key.k",
        pa.display(),
        pb.display()
    );
    let out = Command::new(statebox_bin())
        .args(["sql", "--format", "jsonl", &query])
        .env_remove("STATEBOX_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox sql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        parse_jsonl(&out.stdout),
        vec![json!({"k": "u1", "a": 3, "b": 1})]
    );

    // With --checkpoint, a call without a path reads it; one with a path reads that one.
    let query = format!(
        "SELECT (SELECT count(*) FROM read_state_metadata()) AS here, \
         (SELECT count(*) FROM read_state_metadata('{}')) AS there",
        pb.display()
    );
    assert_eq!(rows(&a, &query), vec![json!({"here": 3, "there": 3})]);

    // Without --checkpoint and without a path there is nothing to read: said so.
    let out = Command::new(statebox_bin())
        .args(["sql", "SELECT * FROM read_state_metadata()"])
        .env_remove("STATEBOX_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox sql");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no checkpoint to read: pass its path as the first argument"),
        "{err}"
    );
}

/// Bad calls fail with a message that names the problem, and print nothing.
#[test]
fn sql_errors_name_the_problem() {
    let s = counter_checkpoint();
    let err = sql_err(
        &s,
        "SELECT * FROM read_statestore(stateVarName => 'counts')",
    );
    assert!(err.contains("unknown state variable `counts`"), "{err}");
    assert!(err.contains("`batchCounts`, `count`, `stats`"), "{err}");

    let err = sql_err(&s, "SELECT * FROM read_statestore(batchId => 0)");
    assert!(err.contains("option `stateVarName` is missing"), "{err}");
    assert!(err.contains("`batchCounts`, `count`, `stats`"), "{err}");

    let err = sql_err(
        &s,
        "SELECT * FROM read_statestore(stateVarName => 'count', batch => 0)",
    );
    assert!(err.contains("unknown option `batch`"), "{err}");
    assert!(err.contains("batchId"), "{err}");

    let err = sql_err(
        &s,
        "SELECT * FROM read_statestore(stateVarName => 'count', batchId => 'latest')",
    );
    assert!(
        err.contains("option `batchId` must be a non-negative integer, found 'latest'"),
        "{err}"
    );

    // A leading string is a checkpoint path (Databricks' form), not a variable name.
    let err = sql_err(&s, "SELECT * FROM read_statestore('count')");
    assert!(err.contains("cannot read the checkpoint 'count'"), "{err}");
    let err = sql_err(
        &s,
        "SELECT * FROM read_statestore(stateVarName => 'count', 'count')",
    );
    assert!(err.contains("takes named arguments only"), "{err}");

    let err = sql_err(
        &s,
        "SELECT * FROM read_statestore(stateVarName => 'count', batchId => 7)",
    );
    assert!(
        err.contains(
            "the state of batch 7 is not available: the checkpoint retains batches 0 to 1"
        ),
        "{err}"
    );

    let err = sql_err(&s, "SELECT * FROM read_state_metadata(1)");
    assert!(
        err.contains("read_state_metadata takes only a checkpoint path"),
        "{err}"
    );

    let err = sql_err(
        &s,
        "SELECT nope FROM read_statestore(stateVarName => 'count')",
    );
    assert!(err.contains("nope"), "{err}");

    // Read-only: statements that would write are refused. `CREATE TABLE .. AS` parses as
    // an SQL statement, so it is DataFusion's plan check (DDL not allowed) that refuses it.
    let err = sql_err(&s, "CREATE TABLE t AS SELECT 1");
    assert!(err.contains("DDL not supported"), "{err}");

    let out = sql(Path::new("/nonexistent/checkpoint"), "jsonl", "SELECT 1");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a Statebox checkpoint"), "{err}");
}
