//! `statebox state`: reading a checkpoint's committed state, timers, metadata and progress
//! with the CLI, after runs of real processors and while a run holds the checkpoint.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use statebox_tests::{
    Scratch, component_cache, guests, interrupt, parse_jsonl, statebox_bin, wait_for,
};

const DEDUP_TTL: &str = env!("STATEBOX_GUEST_DEDUP_TTL");
const HEARTBEAT: &str = env!("STATEBOX_GUEST_HEARTBEAT_MONITOR");

/// Runs `statebox state <args>` on the scratch checkpoint.
fn state(scratch: &Scratch, args: &[&str]) -> Output {
    Command::new(statebox_bin())
        .arg("state")
        .arg(args[0])
        .arg("--checkpoint")
        .arg(scratch.checkpoint())
        .args(&args[1..])
        .env("STATEBOX_CACHE_DIR", component_cache())
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox state")
}

/// Runs `statebox state <args>`, expecting success, and returns standard output.
#[track_caller]
fn state_ok(scratch: &Scratch, args: &[&str]) -> String {
    let out = state(scratch, args);
    assert!(
        out.status.success(),
        "statebox state {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Runs `statebox state <args>`, expecting a clean failure, and returns standard error.
#[track_caller]
fn state_err(scratch: &Scratch, args: &[&str]) -> String {
    let out = state(scratch, args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "statebox state {args:?} should fail"
    );
    String::from_utf8(out.stderr).expect("UTF-8 errors")
}

fn rows(scratch: &Scratch, args: &[&str]) -> Vec<Value> {
    parse_jsonl(state_ok(scratch, args).as_bytes())
}

/// `partition_of(["u1"], 4)`, pinned by the engine's partitioning test.
const U1_PARTITION: u64 = 3;

/// Counter over two batches: value, list and map state in every read mode and format.
#[test]
fn counter_state_reads_in_every_mode() {
    let scratch = Scratch::new();
    scratch.write_rows(
        "a.jsonl",
        &[json!({"k": "u1"}), json!({"k": "u1"}), json!({"k": "u2"})],
    );
    scratch.run_cmd(guests::COUNTER, "k").run().expect_ok();
    scratch.write_rows("b.jsonl", &[json!({"k": "u1"})]);
    scratch.run_cmd(guests::COUNTER, "k").run().expect_ok();

    let count = rows(&scratch, &["read", "--var", "count"]);
    assert_eq!(count.len(), 2);
    assert_eq!(
        count[0],
        json!({"key": {"k": "u1"}, "value": 3, "partition_id": U1_PARTITION})
    );
    assert_eq!(count[1]["key"], json!({"k": "u2"}));
    assert_eq!(count[1]["value"], 1);
    let p2 = count[1]["partition_id"].as_u64().unwrap();
    assert!(p2 < 4);

    let list = rows(&scratch, &["read", "--var", "batchCounts"]);
    let u1: Vec<&Value> = list
        .iter()
        .filter(|r| r["key"]["k"] == "u1")
        .map(|r| &r["list_element"])
        .collect();
    assert_eq!(u1, [&json!(2), &json!(1)]);
    assert_eq!(list.len(), 3);
    assert_eq!(
        rows(&scratch, &["read", "--var", "batchCounts", "--no-flatten"]),
        [
            json!({"key": {"k": "u1"}, "list_value": [2, 1], "partition_id": U1_PARTITION}),
            json!({"key": {"k": "u2"}, "list_value": [1], "partition_id": p2}),
        ]
    );

    assert_eq!(
        rows(&scratch, &["read", "--var", "stats"])[0],
        json!({"key": {"k": "u1"}, "user_map_key": {"name": "calls"},
               "user_map_value": {"count": 2}, "partition_id": U1_PARTITION})
    );
    assert_eq!(
        rows(&scratch, &["read", "--var", "stats", "--no-flatten"])[1],
        json!({"key": {"k": "u2"}, "map_value": {"{\"name\":\"calls\"}": {"count": 1}},
               "partition_id": p2})
    );

    let csv = state_ok(&scratch, &["read", "--var", "count", "--format", "csv"]);
    assert_eq!(
        csv,
        format!(
            "key,value,partition_id\n\"{{\"\"k\"\":\"\"u1\"\"}}\",3,{U1_PARTITION}\n\"{{\"\"k\"\":\"\"u2\"\"}}\",1,{p2}\n"
        )
    );
    let table = state_ok(&scratch, &["read", "--var", "count", "--format", "table"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(
        lines[0].starts_with("key") && lines[0].ends_with("partition_id"),
        "{table}"
    );
    assert!(lines[2].contains("3"), "{table}");

    // Time travel: batch 1 is the latest; batch 0 is before u1's third row.
    assert_eq!(
        rows(&scratch, &["read", "--var", "count", "--batch-id", "1"]),
        count
    );
    assert_eq!(
        rows(&scratch, &["read", "--var", "count", "--batch-id", "0"])[0],
        json!({"key": {"k": "u1"}, "value": 2, "partition_id": U1_PARTITION})
    );
    let err = state_err(&scratch, &["read", "--var", "count", "--batch-id", "2"]);
    assert!(err.contains("retains batches 0 to 1"), "{err}");

    let err = state_err(&scratch, &["read", "--var", "counts"]);
    assert!(err.contains("unknown state variable `counts`"), "{err}");
    assert!(err.contains("`batchCounts`, `count`, `stats`"), "{err}");
    let err = state_err(&scratch, &["read", "--timers"]);
    assert!(err.contains("time mode `none`"), "{err}");

    let meta: Value = serde_json::from_str(&state_ok(&scratch, &["metadata"])).unwrap();
    assert_eq!(meta["operator_id"], 0);
    assert_eq!(meta["operator_name"], "counter");
    assert_eq!(meta["num_partitions"], 4);
    assert_eq!(
        (meta["min_batch_id"].clone(), meta["max_batch_id"].clone()),
        (json!(0), json!(1))
    );
    assert_eq!(meta["time_mode"], "none");
    assert_eq!(meta["output_mode"], "update");
    assert_eq!(meta["key_columns"], json!(["k"]));
    let vars = meta["variables"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> = vars
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("batchCounts", "list"),
            ("count", "value"),
            ("stats", "map")
        ]
    );
    let stats = &vars[2];
    assert_eq!(stats["ttl_enabled"], false);
    assert!(
        stats["key_schema"].as_str().unwrap().contains("name"),
        "{stats}"
    );
    assert_eq!(stats["value_schema_history"].as_array().unwrap().len(), 1);

    let progress = rows(&scratch, &["progress"]);
    let batches: Vec<&Value> = progress.iter().map(|p| &p["batch_id"]).collect();
    assert_eq!(batches, [&json!(0), &json!(1)]);
    assert_eq!(
        (
            progress[0]["input_rows"].clone(),
            progress[1]["input_rows"].clone()
        ),
        (json!(3), json!(1))
    );
    assert_eq!(rows(&scratch, &["progress", "--last", "1"]).len(), 1);
}

/// Session tracker: a map keyed by session id next to a struct value.
#[test]
fn session_tracker_maps_read_per_entry_and_per_key() {
    let scratch = Scratch::new();
    scratch.write_rows(
        "a.jsonl",
        &[
            json!({"user_id": "u1", "session_id": "s1"}),
            json!({"user_id": "u1", "session_id": "s2"}),
            json!({"user_id": "u1", "session_id": "s1"}),
        ],
    );
    scratch
        .run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_ok();
    let entries: Vec<(Value, Value)> = rows(&scratch, &["read", "--var", "sessions"])
        .into_iter()
        .map(|r| (r["user_map_key"].clone(), r["user_map_value"].clone()))
        .collect();
    assert_eq!(entries, [(json!("s1"), json!(2)), (json!("s2"), json!(1))]);
    assert_eq!(
        rows(&scratch, &["read", "--var", "sessions", "--no-flatten"]),
        [
            json!({"key": {"user_id": "u1"}, "map_value": {"s1": 2, "s2": 1}, "partition_id": U1_PARTITION})
        ]
    );
    assert_eq!(
        rows(&scratch, &["read", "--var", "totals"])[0]["value"],
        json!({"distinct_sessions": 2, "total_events": 3})
    );
}

/// Dedup with a TTL'd map: rows show each entry's expiry (first sighting + 60 s).
#[test]
fn ttl_state_shows_its_expiry() {
    let scratch = Scratch::new();
    scratch.write_rows("a.jsonl", &[json!({"id": "e1"}), json!({"id": "e2"})]);
    scratch
        .run_cmd(DEDUP_TTL, "id")
        .args(["--time-mode", "processing-time"])
        .run()
        .expect_ok();
    let seen = rows(&scratch, &["read", "--var", "seen"]);
    assert_eq!(seen.len(), 2);
    for row in &seen {
        let first_seen = row["user_map_value"].as_i64().unwrap();
        assert_eq!(
            row["ttl_expiration_ms"],
            json!(first_seen + 60_000),
            "{row}"
        );
        assert_eq!(row["user_map_key"], row["key"]["id"], "{row}");
    }
    let meta: Value = serde_json::from_str(&state_ok(&scratch, &["metadata"])).unwrap();
    let var = &meta["variables"][0];
    assert_eq!(
        (var["ttl_enabled"].clone(), var["ttl_duration_ms"].clone()),
        (json!(true), json!(60_000))
    );
    assert_eq!(meta["time_mode"], "processing-time");
}

/// Heartbeat monitor, read while an interval-triggered run holds the checkpoint: timers and
/// state are readable, and the run goes on committing afterwards.
#[test]
fn timers_and_state_read_while_a_run_holds_the_checkpoint() {
    let scratch = Scratch::new();
    scratch.write_rows(
        "a.jsonl",
        &[json!({"sensor": "s1"}), json!({"sensor": "s2"})],
    );
    let child = scratch
        .run_cmd(HEARTBEAT, "sensor")
        .args([
            "--time-mode",
            "processing-time",
            "--trigger",
            "interval=100ms",
        ])
        .command()
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn statebox");
    wait_for("the first batch's output", Duration::from_secs(20), || {
        (scratch.output_rows().len() >= 2).then_some(())
    });
    let timers = rows(&scratch, &["read", "--timers"]);
    assert_eq!(timers.len(), 2, "{timers:?}");
    let status = rows(&scratch, &["read", "--var", "status"]);
    for (timer, status) in timers.iter().zip(&status) {
        assert_eq!(timer["key"], status["key"]);
        assert_eq!(timer["partition_id"], status["partition_id"]);
        assert_eq!(status["value"], "up");
    }
    let deadlines = rows(&scratch, &["read", "--var", "deadline"]);
    for (timer, deadline) in timers.iter().zip(&deadlines) {
        assert_eq!(timer["expiration_timestamp_ms"], deadline["value"]);
    }
    // The run keeps committing (no-data batches) while and after it is read.
    let before = rows(&scratch, &["progress", "--last", "1"])[0]["batch_id"]
        .as_u64()
        .unwrap();
    wait_for("another committed batch", Duration::from_secs(20), || {
        let last = rows(&scratch, &["progress", "--last", "1"])[0]["batch_id"].as_u64()?;
        (last > before).then_some(())
    });
    interrupt(child);
    let meta: Value = serde_json::from_str(&state_ok(&scratch, &["metadata"])).unwrap();
    assert!(meta["max_batch_id"].as_u64().unwrap() > before);
}

/// `statebox run --progress-json` prints each batch's commit record, the same records
/// `statebox state progress` reads back.
#[test]
fn run_prints_progress_as_json_lines() {
    let scratch = Scratch::new();
    scratch.write_rows("a.jsonl", &[json!({"k": "u1"}), json!({"k": "u2"})]);
    scratch.write_rows("b.jsonl", &[json!({"k": "u1"})]);
    let out = scratch
        .run_cmd(guests::COUNTER, "k")
        .args(["--progress-json"])
        .command()
        .output()
        .expect("run statebox");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON progress line"))
        .collect();
    let input_rows: Vec<&Value> = printed.iter().map(|p| &p["input_rows"]).collect();
    assert_eq!(input_rows, [&json!(2), &json!(1)]);
    // The counter declares one variable of each kind; the other progress fields are there.
    assert_eq!(
        printed[0]["variables"],
        json!({"value": 1, "list": 1, "map": 1})
    );
    for field in [
        "rows_per_s",
        "timers_ms",
        "ttl_ms",
        "state_bytes_on_disk",
        "late_rows",
    ] {
        assert!(
            printed[0].get(field).is_some(),
            "no `{field}` in {}",
            printed[0]
        );
    }
    // The stored record estimates the commit's own duration before writing it; every
    // other field is the same.
    let counts = |records: &[Value]| -> Vec<(Value, Value, Value)> {
        records
            .iter()
            .map(|r| {
                (
                    r["batch_id"].clone(),
                    r["input_rows"].clone(),
                    r["output_bytes"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(counts(&printed), counts(&rows(&scratch, &["progress"])));
}

/// Counter over four CLI runs: the change feed of `count` per batch, and the error once the
/// older change logs are past `--min-batches-to-retain`.
#[test]
fn change_feed_follows_batches_and_retention() {
    let scratch = Scratch::new();
    for (file, keys) in [
        ("a.jsonl", &["u1", "u1", "u2"][..]),
        ("b.jsonl", &["u1"]),
        ("c.jsonl", &["u2"]),
    ] {
        let rows: Vec<Value> = keys.iter().map(|k| json!({"k": k})).collect();
        scratch.write_rows(file, &rows);
        scratch.run_cmd(guests::COUNTER, "k").run().expect_ok();
    }
    let feed = rows(&scratch, &["changes", "--var", "count", "--from", "0"]);
    let p2 = feed
        .iter()
        .find(|r| r["key"]["k"] == "u2")
        .map(|r| r["partition_id"].clone())
        .unwrap();
    let change = |batch: u64, k: &str, value: u64, partition: &Value| {
        json!({"batch_id": batch, "change_type": "update", "key": {"k": k}, "value": value,
               "partition_id": partition})
    };
    let u1 = json!(U1_PARTITION);
    let mut want = vec![change(0, "u1", 2, &u1), change(0, "u2", 1, &p2)];
    // Rows of a batch come by partition.
    if p2.as_u64() < u1.as_u64() {
        want.swap(0, 1);
    }
    want.push(change(1, "u1", 3, &u1));
    want.push(change(2, "u2", 2, &p2));
    assert_eq!(feed, want);
    assert_eq!(
        rows(
            &scratch,
            &["changes", "--var", "count", "--from", "1", "--to", "1"]
        ),
        [change(1, "u1", 3, &u1)]
    );
    let list = rows(
        &scratch,
        &["changes", "--var", "batchCounts", "--from", "2"],
    );
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(
        (list[0]["list_index"].clone(), list[0]["value"].clone()),
        (json!(1), json!(1))
    );
    let csv = state_ok(
        &scratch,
        &[
            "changes", "--var", "count", "--from", "2", "--format", "csv",
        ],
    );
    assert_eq!(
        csv.lines().next(),
        Some("batch_id,change_type,key,value,partition_id")
    );

    scratch.write_rows("d.jsonl", &[json!({"k": "u1"})]);
    scratch
        .run_cmd(guests::COUNTER, "k")
        .args(["--min-batches-to-retain", "2"])
        .run()
        .expect_ok();
    let err = state_err(&scratch, &["changes", "--var", "count", "--from", "0"]);
    assert!(
        err.contains("retains the change logs of batches 2 to 3"),
        "{err}"
    );
    assert_eq!(
        rows(&scratch, &["changes", "--var", "count", "--from", "3"]),
        [change(3, "u1", 4, &u1)]
    );
    let err = state_err(&scratch, &["changes", "--var", "counts", "--from", "3"]);
    assert!(err.contains("unknown state variable `counts`"), "{err}");
}

/// Dedup with a TTL'd map in processing time: first sightings are updates, and TTL cleanup
/// 60 s later shows as deletes.
#[test]
fn change_feed_shows_ttl_removals_as_deletes() {
    let scratch = Scratch::new();
    let mut query = statebox_tests::processing_time_query(&scratch, DEDUP_TTL, "id");
    scratch.write_rows("a.jsonl", &[json!({"id": "e1"}), json!({"id": "e2"})]);
    let t0 = 1_700_000_000_000_i64;
    query.run_next(Some(t0)).expect("batch 0").expect("input");
    query.run_no_data(Some(t0 + 30_000)).expect("batch 1");
    query.run_no_data(Some(t0 + 61_000)).expect("batch 2");
    drop(query);

    let feed = rows(&scratch, &["changes", "--var", "seen", "--from", "0"]);
    let mut seen: Vec<(u64, &str, &str, Value)> = feed
        .iter()
        .map(|r| {
            assert_eq!(r["user_map_key"], r["key"]["id"], "{r}");
            (
                r["batch_id"].as_u64().unwrap(),
                r["change_type"].as_str().unwrap(),
                r["user_map_key"].as_str().unwrap(),
                r["value"].clone(),
            )
        })
        .collect();
    seen.sort_by(|a, b| (a.0, a.2).cmp(&(b.0, b.2)));
    assert_eq!(
        seen,
        [
            (0, "update", "e1", json!(t0)),
            (0, "update", "e2", json!(t0)),
            (2, "delete", "e1", Value::Null),
            (2, "delete", "e2", Value::Null),
        ]
    );
    assert!(rows(&scratch, &["read", "--var", "seen"]).is_empty());
}

/// Counter over five CLI runs, the last one retaining two batches, and dedup with a TTL'd
/// map: `--batch-id N` reads exactly what a read right after batch N showed, for every
/// retained batch, and names the retained range for the others.
#[test]
fn time_travel_reads_each_retained_batch_as_it_was() {
    let scratch = Scratch::new();
    let vars = ["count", "batchCounts", "stats"];
    let mut live: Vec<Vec<Vec<Value>>> = Vec::new();
    let read_all = |batch: Option<u64>| -> Vec<Vec<Value>> {
        vars.iter()
            .flat_map(|var| {
                let mut args = vec!["read", "--var", var];
                let id = batch.map(|b| b.to_string());
                if let Some(id) = &id {
                    args.extend(["--batch-id", id.as_str()]);
                }
                let flat = rows(&scratch, &args);
                args.push("--no-flatten");
                [flat, rows(&scratch, &args)]
            })
            .collect()
    };
    for (file, keys) in [
        ("a.jsonl", &["u1", "u1", "u2"][..]),
        ("b.jsonl", &["u1"]),
        ("c.jsonl", &["u2", "u3"]),
        ("d.jsonl", &["u3"]),
    ] {
        let rows: Vec<Value> = keys.iter().map(|k| json!({"k": k})).collect();
        scratch.write_rows(file, &rows);
        scratch
            .run_cmd(guests::COUNTER, "k")
            .args(["--snapshot-interval", "2"])
            .run()
            .expect_ok();
        live.push(read_all(None));
    }
    // Snapshots after batches 1 and 3: batch 0 is read by undoing batch 1 in snapshot 1,
    // batch 2 from snapshot 3, batch 3 from the latest state.
    let meta: Value = serde_json::from_str(&state_ok(&scratch, &["metadata"])).unwrap();
    assert_eq!(meta["snapshots"], json!([1, 3]));
    for (batch, want) in live.iter().enumerate() {
        assert_eq!(&read_all(Some(batch as u64)), want, "batch {batch}");
    }
    assert_ne!(live[0], live[3]);

    scratch.write_rows("e.jsonl", &[json!({"k": "u1"})]);
    scratch
        .run_cmd(guests::COUNTER, "k")
        .args(["--min-batches-to-retain", "2", "--snapshot-interval", "2"])
        .run()
        .expect_ok();
    // Logs of batches 3 and 4 are kept: batches 2 to 4 can be read, so snapshot 1 is gone.
    let meta: Value = serde_json::from_str(&state_ok(&scratch, &["metadata"])).unwrap();
    assert_eq!(
        (meta["min_batch_id"].clone(), meta["max_batch_id"].clone()),
        (json!(2), json!(4))
    );
    assert_eq!(meta["snapshots"], json!([3]));
    assert_eq!(read_all(Some(2)), live[2]);
    assert_eq!(read_all(Some(3)), live[3]);
    let err = state_err(&scratch, &["read", "--var", "count", "--batch-id", "1"]);
    assert!(
        err.contains(
            "the state of batch 1 is not available: the checkpoint retains batches 2 to 4"
        ),
        "{err}"
    );

    // TTL cleanup and time travel: the dedup entries live at batch 0, removed at batch 2.
    let ttl = Scratch::new();
    let mut query = statebox_tests::processing_time_query(&ttl, DEDUP_TTL, "id");
    ttl.write_rows("a.jsonl", &[json!({"id": "e1"}), json!({"id": "e2"})]);
    let t0 = 1_700_000_000_000_i64;
    query.run_next(Some(t0)).expect("batch 0").expect("input");
    query.run_no_data(Some(t0 + 61_000)).expect("batch 1");
    drop(query);
    assert!(rows(&ttl, &["read", "--var", "seen"]).is_empty());
    let at0 = rows(&ttl, &["read", "--var", "seen", "--batch-id", "0"]);
    let keys: Vec<&Value> = at0.iter().map(|r| &r["user_map_key"]).collect();
    assert_eq!(keys, [&json!("e1"), &json!("e2")]);
    assert_eq!(at0[0]["ttl_expiration_ms"], json!(t0 + 60_000));
}

/// Heartbeat monitor on a manual clock: the timers registered at each batch are read back
/// at that batch (time travel), and each commit record counts the timers and state rows.
#[test]
fn timers_and_progress_counts_follow_each_batch() {
    let scratch = Scratch::new();
    let mut query = statebox_tests::processing_time_query(&scratch, HEARTBEAT, "sensor");
    let t0 = 1_700_000_000_000_i64;
    let mut timers_at = Vec::new();
    let mut records = Vec::new();
    let read_timers = |scratch: &Scratch| -> Vec<(Value, Value)> {
        rows(scratch, &["read", "--timers"])
            .into_iter()
            .map(|r| {
                (
                    r["key"]["sensor"].clone(),
                    r["expiration_timestamp_ms"].clone(),
                )
            })
            .collect()
    };
    // Batch 0: s1, s2 arm timers at t0 + 10 s. Batch 1 (t0 + 5 s): s1 re-arms (one timer
    // deleted, one registered). Batch 2 (t0 + 12 s, no data): s2's timer fires.
    let steps: [(&[&str], i64); 3] = [(&["s1", "s2"], 0), (&["s1"], 5_000), (&[], 12_000)];
    for (batch, (sensors, at)) in steps.into_iter().enumerate() {
        let report = if sensors.is_empty() {
            query.run_no_data(Some(t0 + at)).expect("no-data batch")
        } else {
            let input: Vec<Value> = sensors.iter().map(|s| json!({"sensor": s})).collect();
            scratch.write_rows(&format!("{batch}.jsonl"), &input);
            query
                .run_next(Some(t0 + at))
                .expect("batch")
                .expect("input")
        };
        records.push(report.commit);
        timers_at.push(read_timers(&scratch));
    }
    drop(query);
    assert_eq!(
        timers_at[0],
        [
            (json!("s1"), json!(t0 + 10_000)),
            (json!("s2"), json!(t0 + 10_000))
        ]
    );
    assert_eq!(timers_at[1][0], (json!("s1"), json!(t0 + 15_000)));
    assert_eq!(timers_at[2], [(json!("s1"), json!(t0 + 15_000))]);
    for (batch, want) in timers_at.iter().enumerate() {
        let id = batch.to_string();
        let got: Vec<(Value, Value)> = rows(&scratch, &["read", "--timers", "--batch-id", &id])
            .into_iter()
            .map(|r| {
                (
                    r["key"]["sensor"].clone(),
                    r["expiration_timestamp_ms"].clone(),
                )
            })
            .collect();
        assert_eq!(&got, want, "timers at batch {batch}");
    }

    let counts: Vec<(u64, u64, u64, u64)> = records
        .iter()
        .map(|c| {
            (
                c.timers_total,
                c.timers_registered,
                c.timers_deleted,
                c.timers_fired,
            )
        })
        .collect();
    assert_eq!(counts, [(2, 2, 0, 0), (2, 1, 1, 0), (1, 0, 1, 1)]);
    // The state rows counted equal the rows the reader finds, after every batch (the last
    // record is compared against the latest state).
    let state_rows: usize = ["status", "deadline"]
        .iter()
        .map(|var| rows(&scratch, &["read", "--var", var]).len())
        .sum();
    let last = records.last().unwrap();
    assert_eq!(last.state_rows_total, state_rows as u64, "{last:?}");
    // Batch 0 writes both sensors' status and deadline; batch 2 clears s2's deadline.
    assert_eq!(
        records
            .iter()
            .map(|c| (
                c.state_rows_total,
                c.state_rows_updated,
                c.state_rows_removed
            ))
            .collect::<Vec<_>>(),
        [(4, 4, 0), (4, 1, 0), (3, 1, 1)]
    );
    // The stored records carry the counts too.
    let stored = rows(&scratch, &["progress"]);
    assert_eq!(stored.len(), 3);
    assert_eq!(stored[2]["timers_total"], json!(1));
    assert_eq!(stored[1]["timers_registered"], json!(1));
    assert_eq!(stored[2]["state_rows_total"], json!(state_rows));
}

/// The counter, then a redeployment that drops `count` with `delete-if-exists` and re-creates
/// it: the feed shows the old variable's deletes and the new one's writes, and reading an
/// earlier batch shows the variable as it was then, not the re-created one.
#[test]
fn change_feed_and_time_travel_across_delete_if_exists() {
    let reset: &str = env!("STATEBOX_GUEST_COUNTER_RESET");
    let scratch = Scratch::new();
    scratch.write_rows(
        "a.jsonl",
        &[json!({"k": "u1"}), json!({"k": "u1"}), json!({"k": "u2"})],
    );
    scratch.run_cmd(guests::COUNTER, "k").run().expect_ok();
    scratch.write_rows("b.jsonl", &[json!({"k": "u1"})]);
    scratch.run_cmd(reset, "k").run().expect_ok();

    let values = |rows: Vec<Value>| -> Vec<(Value, Value)> {
        rows.into_iter()
            .map(|r| (r["key"]["k"].clone(), r["value"].clone()))
            .collect()
    };
    assert_eq!(
        values(rows(
            &scratch,
            &["read", "--var", "count", "--batch-id", "0"]
        )),
        [(json!("u1"), json!(2)), (json!("u2"), json!(1))]
    );
    assert_eq!(
        values(rows(&scratch, &["read", "--var", "count"])),
        [(json!("u1"), json!(1))]
    );
    let feed: Vec<(Value, Value, Value, Value)> =
        rows(&scratch, &["changes", "--var", "count", "--from", "0"])
            .into_iter()
            .map(|r| {
                (
                    r["batch_id"].clone(),
                    r["change_type"].clone(),
                    r["key"]["k"].clone(),
                    r["value"].clone(),
                )
            })
            .collect();
    let (b0, b1) = feed.split_at(2);
    let mut b0 = b0.to_vec();
    b0.sort_by_key(|r| r.2.to_string());
    assert_eq!(
        b0,
        [
            (json!(0), json!("update"), json!("u1"), json!(2)),
            (json!(0), json!("update"), json!("u2"), json!(1)),
        ]
    );
    let mut b1 = b1.to_vec();
    b1.sort_by_key(|r| (r.1.to_string(), r.2.to_string()));
    assert_eq!(
        b1,
        [
            (json!(1), json!("delete"), json!("u1"), Value::Null),
            (json!(1), json!("delete"), json!("u2"), Value::Null),
            (json!(1), json!("update"), json!("u1"), json!(1)),
        ]
    );
}
