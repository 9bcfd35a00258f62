//! The reader's unit tests, over checkpoints written directly through the state crate.

use statebox_state::{Commit, StoredValue};

use super::*;
use crate::OutputMode;
use crate::input::partition_of;

fn stored(schema_id: u32, expires_at_ms: Option<i64>, payload: &str) -> StoredValue {
    StoredValue {
        schema_id,
        expires_at_ms,
        payload: payload.as_bytes().to_vec(),
    }
}

fn commit_record(batch_id: u64) -> CommitRecord {
    CommitRecord {
        batch_id,
        timestamp_ms: 1_000 + batch_id as i64,
        watermark_ms: -1,
        output_bytes: 0,
        input_rows: batch_id,
        output_rows: 0,
        keys: 0,
        late_rows: 0,
        timers_fired: 0,
        ttl_removed: 0,
        variables: crate::VariableCounts::default(),
        state_bytes_on_disk: 0,
        state_rows_total: 0,
        state_rows_updated: 0,
        state_rows_removed: 0,
        timers_total: 0,
        timers_registered: 0,
        timers_deleted: 0,
        next_watermark_ms: -1,
        sink_delivery: None,
    }
}

/// A checkpoint written through the state store the way the engine writes one: keys
/// `(user, n)`, an evolved value variable, a list, a TTL'd map and timers.
fn checkpoint(time_mode: TimeMode) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let cp = Checkpoint::open(dir.path()).unwrap();
    let config = QueryConfig {
        version: 1,
        key_columns: vec!["user".into(), "n".into()],
        partitions: 3,
        output_mode: OutputMode::Update,
        time_mode,
        operator_name: "test-op".into(),
        event_time_column: None,
        watermark_delay_ms: 0,
        output_schema: None,
        query_id: None,
    };
    let catalog = json!({
        "vars": {
            "profile": {"id": 0, "name": "profile", "kind": "value", "key_schema": null,
                "value_schemas": ["name STRING", "name STRING, visits BIGINT"], "ttl_ms": null},
            "events": {"id": 1, "name": "events", "kind": "list", "key_schema": null,
                "value_schemas": ["BIGINT"], "ttl_ms": null},
            "seen": {"id": 2, "name": "seen", "kind": "map", "key_schema": "STRING",
                "value_schemas": ["BIGINT"], "ttl_ms": 500},
        },
        "next_id": 3,
    });
    let k1 = br#"["u1",7]"#;
    let k2 = br#"["u2",1]"#;
    let mut txn = cp.txn(0);
    txn.value_put(0, k1, stored(0, None, r#"{"name":"old"}"#))
        .unwrap();
    txn.value_put(0, k2, stored(1, None, r#"{"name":"new","visits":3}"#))
        .unwrap();
    txn.list_append(1, k1, vec![stored(0, None, "1"), stored(0, None, "2")])
        .unwrap();
    txn.list_append(1, k2, vec![stored(0, None, "9")]).unwrap();
    txn.map_put(2, k1, br#""b""#, stored(0, Some(1_500), "20"))
        .unwrap();
    txn.map_put(2, k1, br#""a""#, stored(0, Some(900), "10"))
        .unwrap();
    txn.timer_register(k1, 5_000).unwrap();
    txn.timer_register(k1, 4_000).unwrap();
    txn.timer_register(k2, 7_000).unwrap();
    let mut meta = vec![
        (
            "query".to_owned(),
            Some(serde_json::to_vec(&config).unwrap()),
        ),
        (
            "catalog".to_owned(),
            Some(serde_json::to_vec(&catalog).unwrap()),
        ),
        (
            "head".to_owned(),
            Some(serde_json::to_vec(&commit_record(2)).unwrap()),
        ),
    ];
    for b in 0..3 {
        meta.push((
            crate::config::meta::commit(b),
            Some(serde_json::to_vec(&commit_record(b)).unwrap()),
        ));
    }
    cp.commit(Commit {
        txns: vec![txn],
        meta,
        ..Commit::default()
    })
    .unwrap();
    dir
}

fn rows(dir: &Path, var: &str, flatten: bool) -> Vec<Value> {
    let mut out = Vec::new();
    read_state(dir, var, flatten, None, |row| {
        out.push(row);
        Ok(())
    })
    .unwrap();
    out
}

fn part(key: &str) -> usize {
    partition_of(key.as_bytes(), 3)
}

#[test]
fn value_rows_are_read_through_the_current_schema() {
    let dir = checkpoint(TimeMode::None);
    let p1 = part(r#"["u1",7]"#);
    let p2 = part(r#"["u2",1]"#);
    assert_eq!(
        rows(dir.path(), "profile", true),
        [
            json!({"key": {"user": "u1", "n": 7}, "value": {"name": "old", "visits": null}, "partition_id": p1}),
            json!({"key": {"user": "u2", "n": 1}, "value": {"name": "new", "visits": 3}, "partition_id": p2}),
        ]
    );
}

#[test]
fn lists_flatten_to_elements_or_group_by_key() {
    let dir = checkpoint(TimeMode::None);
    let p1 = part(r#"["u1",7]"#);
    let p2 = part(r#"["u2",1]"#);
    assert_eq!(
        rows(dir.path(), "events", true),
        [
            json!({"key": {"user": "u1", "n": 7}, "list_element": 1, "partition_id": p1}),
            json!({"key": {"user": "u1", "n": 7}, "list_element": 2, "partition_id": p1}),
            json!({"key": {"user": "u2", "n": 1}, "list_element": 9, "partition_id": p2}),
        ]
    );
    assert_eq!(
        rows(dir.path(), "events", false),
        [
            json!({"key": {"user": "u1", "n": 7}, "list_value": [1, 2], "partition_id": p1}),
            json!({"key": {"user": "u2", "n": 1}, "list_value": [9], "partition_id": p2}),
        ]
    );
}

#[test]
fn maps_with_ttl_show_expiry_and_group_by_key() {
    let dir = checkpoint(TimeMode::ProcessingTime);
    let p1 = part(r#"["u1",7]"#);
    assert_eq!(
        rows(dir.path(), "seen", true),
        [
            json!({"key": {"user": "u1", "n": 7}, "user_map_key": "a", "user_map_value": 10,
                "ttl_expiration_ms": 900, "partition_id": p1}),
            json!({"key": {"user": "u1", "n": 7}, "user_map_key": "b", "user_map_value": 20,
                "ttl_expiration_ms": 1_500, "partition_id": p1}),
        ]
    );
    assert_eq!(
        rows(dir.path(), "seen", false),
        [
            json!({"key": {"user": "u1", "n": 7}, "map_value": {"a": 10, "b": 20}, "partition_id": p1})
        ]
    );
}

#[test]
fn a_callback_error_stops_the_scan() {
    let dir = checkpoint(TimeMode::None);
    let mut calls = 0;
    let err = read_state(dir.path(), "events", false, None, |_| {
        calls += 1;
        Err(EngineError::Io("broken pipe".into()))
    })
    .unwrap_err();
    assert_eq!((calls, err.to_string()), (1, "broken pipe".to_owned()));
}

#[test]
fn unknown_variables_are_refused_with_the_known_ones() {
    let dir = checkpoint(TimeMode::None);
    let err = read_state(dir.path(), "nope", true, None, |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown state variable `nope`"), "{err}");
    assert!(err.contains("`events`, `profile`, `seen`"), "{err}");
}

#[test]
fn timers_are_listed_by_key_and_refused_without_a_time_mode() {
    let dir = checkpoint(TimeMode::ProcessingTime);
    let mut out = Vec::new();
    read_timers(dir.path(), |row| {
        out.push(row);
        Ok(())
    })
    .unwrap();
    let p1 = part(r#"["u1",7]"#);
    let p2 = part(r#"["u2",1]"#);
    assert_eq!(
        out,
        [
            json!({"key": {"user": "u1", "n": 7}, "expiration_timestamp_ms": 4_000, "partition_id": p1}),
            json!({"key": {"user": "u1", "n": 7}, "expiration_timestamp_ms": 5_000, "partition_id": p1}),
            json!({"key": {"user": "u2", "n": 1}, "expiration_timestamp_ms": 7_000, "partition_id": p2}),
        ]
    );
    let dir = checkpoint(TimeMode::None);
    let err = read_timers(dir.path(), |_| Ok(())).unwrap_err().to_string();
    assert!(err.contains("time mode `none`"), "{err}");
}

#[test]
fn metadata_and_progress_describe_the_query() {
    let dir = checkpoint(TimeMode::ProcessingTime);
    let m = read_metadata(dir.path()).unwrap();
    assert_eq!(m["operator_id"], 0);
    assert_eq!(m["operator_name"], "test-op");
    assert_eq!(m["num_partitions"], 3);
    // The batches whose state can be read: without change logs, only the latest.
    assert_eq!(
        (m["min_batch_id"].clone(), m["max_batch_id"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(m["time_mode"], "processing-time");
    assert_eq!(m["output_mode"], "update");
    assert_eq!(m["key_columns"], json!(["user", "n"]));
    let vars = m["variables"].as_array().unwrap();
    assert_eq!(vars.len(), 3);
    let profile = vars.iter().find(|v| v["name"] == "profile").unwrap();
    assert_eq!(profile["kind"], "value");
    assert_eq!(profile["value_schema"], "name STRING, visits BIGINT");
    assert_eq!(profile["value_schema_history"].as_array().unwrap().len(), 2);
    assert_eq!(profile["ttl_enabled"], false);
    let seen = vars.iter().find(|v| v["name"] == "seen").unwrap();
    assert_eq!(
        (seen["ttl_enabled"].clone(), seen["ttl_duration_ms"].clone()),
        (json!(true), json!(500))
    );
    assert_eq!(seen["key_schema"], "STRING");

    let last: Vec<u64> = read_progress(dir.path(), 2)
        .unwrap()
        .iter()
        .map(|c| c.commit.batch_id)
        .collect();
    assert_eq!(last, [1, 2]);
    assert_eq!(read_progress(dir.path(), 10).unwrap().len(), 3);
    assert!(read_progress(dir.path(), 0).unwrap().is_empty());
}

/// Commits batch `batch` of `txns` with its change log into the fixture's checkpoint.
fn commit_logged(cp: &Checkpoint, batch: u64, txns: Vec<statebox_state::PartitionTxn>) {
    let record = serde_json::to_vec(&commit_record(batch)).unwrap();
    cp.commit(Commit {
        txns,
        meta: vec![
            ("head".to_owned(), Some(record.clone())),
            (crate::config::meta::commit(batch), Some(record)),
        ],
        changelog: Some(statebox_state::ChangelogWrite {
            batch_id: batch,
            retain_from: (batch + 1).saturating_sub(2),
            partition_of: Box::new(|key: &[u8]| part(std::str::from_utf8(key).unwrap()) as u16),
        }),
        ..Commit::default()
    })
    .unwrap();
}

fn changes(dir: &Path, var: &str, from: u64, to: Option<u64>) -> Vec<Value> {
    let mut out = Vec::new();
    read_changes(dir, var, from, to, |row| {
        out.push(row);
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn the_change_feed_shows_each_batchs_updates_and_deletes() {
    let dir = checkpoint(TimeMode::ProcessingTime);
    let k1 = br#"["u1",7]"#;
    let p1 = part(r#"["u1",7]"#);
    let err = read_changes(dir.path(), "profile", 0, None, |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no retained change log"), "{err}");

    let cp = Checkpoint::open(dir.path()).unwrap();
    let mut txn = cp.txn(p1 as u16);
    txn.value_put(0, k1, stored(0, None, r#"{"name":"again"}"#))
        .unwrap();
    txn.list_append(1, k1, vec![stored(0, None, "3")]).unwrap();
    txn.map_remove(2, k1, br#""a""#).unwrap();
    commit_logged(&cp, 3, vec![txn]);
    let mut txn = cp.txn(p1 as u16);
    txn.value_delete(0, k1).unwrap();
    txn.map_put(2, k1, br#""c""#, stored(0, Some(2_000), "30"))
        .unwrap();
    commit_logged(&cp, 4, vec![txn]);
    drop(cp);

    let key = json!({"user": "u1", "n": 7});
    assert_eq!(
        changes(dir.path(), "profile", 3, None),
        [
            json!({"batch_id": 3, "change_type": "update", "key": key,
                "value": {"name": "again", "visits": null}, "partition_id": p1}),
            json!({"batch_id": 4, "change_type": "delete", "key": key, "value": null,
                "partition_id": p1}),
        ]
    );
    assert_eq!(
        changes(dir.path(), "events", 3, Some(4)),
        [
            json!({"batch_id": 3, "change_type": "update", "key": key, "list_index": 2,
            "value": 3, "partition_id": p1})
        ]
    );
    assert_eq!(
        changes(dir.path(), "seen", 4, Some(4)),
        [
            json!({"batch_id": 4, "change_type": "update", "key": key, "user_map_key": "c",
            "value": 30, "partition_id": p1})
        ]
    );
    assert_eq!(
        changes(dir.path(), "seen", 3, Some(3)),
        [
            json!({"batch_id": 3, "change_type": "delete", "key": key, "user_map_key": "a",
            "value": null, "partition_id": p1})
        ]
    );
    for (from, to) in [(2, None), (3, Some(5))] {
        let err = read_changes(dir.path(), "seen", from, to, |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("retains the change logs of batches 3 to 4"),
            "{err}"
        );
    }
    let err = read_changes(dir.path(), "seen", 4, Some(3), |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--from 4 is after --to 3"), "{err}");
    let err = read_changes(dir.path(), "nope", 3, None, |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown state variable `nope`"), "{err}");
}

/// Every row of every variable, flattened and not, as of `at_batch`.
fn all_rows(dir: &Path, at_batch: Option<u64>) -> Vec<Value> {
    let mut out = Vec::new();
    let reader = StateReader::open(dir).unwrap();
    for var in ["profile", "events", "seen"] {
        for flatten in [true, false] {
            reader
                .read_state(var, flatten, at_batch, |row| {
                    out.push(row);
                    Ok(())
                })
                .unwrap();
        }
    }
    out
}

#[test]
fn time_travel_reads_each_retained_batch_as_it_was_read_live() {
    let dir = checkpoint(TimeMode::ProcessingTime);
    let k1 = br#"["u1",7]"#;
    let k2 = br#"["u2",1]"#;
    let k3 = br#"["u3",2]"#;
    let (p1, p2, p3) = (
        part(r#"["u1",7]"#) as u16,
        part(r#"["u2",1]"#) as u16,
        part(r#"["u3",2]"#) as u16,
    );
    // Batches 0 to 2 were committed without change logs: only the latest is readable.
    let live2 = all_rows(dir.path(), None);
    assert_eq!(all_rows(dir.path(), Some(2)), live2);
    let err = read_state(dir.path(), "events", true, Some(1), |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("retains batches 2 to 2"), "{err}");

    let cp = Checkpoint::open(dir.path()).unwrap();
    let commit = |batch: u64, txns| {
        let record = serde_json::to_vec(&commit_record(batch)).unwrap();
        cp.commit(Commit {
            txns,
            meta: vec![
                ("head".to_owned(), Some(record.clone())),
                (crate::config::meta::commit(batch), Some(record)),
            ],
            changelog: Some(statebox_state::ChangelogWrite {
                batch_id: batch,
                retain_from: 0,
                partition_of: Box::new(|key: &[u8]| part(std::str::from_utf8(key).unwrap()) as u16),
            }),
            ..Commit::default()
        })
        .unwrap();
        all_rows(dir.path(), None)
    };
    let mut live = vec![live2];
    // 3: new values, a new key, appends, a map entry.
    let mut t1 = cp.txn(p1);
    t1.value_put(0, k1, stored(1, None, r#"{"name":"n3","visits":1}"#))
        .unwrap();
    t1.list_append(1, k1, vec![stored(0, None, "3")]).unwrap();
    t1.map_put(2, k1, br#""c""#, stored(0, Some(2_500), "30"))
        .unwrap();
    let mut t3 = cp.txn(p3);
    t3.value_put(0, k3, stored(1, None, r#"{"name":"u3","visits":9}"#))
        .unwrap();
    live.push(commit(3, vec![t1, t3]));
    // 4: delete-if-exists of a present and a missing value, a cleared list, a removed
    // map entry, and TTL cleanup of the map entry expiring at 900.
    let mut t1 = cp.txn(p1);
    t1.value_delete(0, k1).unwrap();
    t1.map_remove(2, k1, br#""b""#).unwrap();
    assert_eq!(t1.ttl_cleanup(1_000).unwrap(), 1);
    let mut t2 = cp.txn(p2);
    t2.value_delete(0, br#"["nobody",0]"#).unwrap();
    t2.list_clear(1, k2).unwrap();
    live.push(commit(4, vec![t1, t2]));
    // 5: a key comes back, a list is replaced, TTL cleanup empties the map.
    let mut t1 = cp.txn(p1);
    t1.value_put(0, k1, stored(1, None, r#"{"name":"back","visits":5}"#))
        .unwrap();
    t1.list_put(1, k1, vec![stored(0, None, "7")]).unwrap();
    assert_eq!(t1.ttl_cleanup(3_000).unwrap(), 1);
    live.push(commit(5, vec![t1]));
    // 6: no change.
    live.push(commit(6, vec![]));
    drop(cp);

    assert_eq!(live.len(), 5);
    for (i, want) in live.iter().enumerate() {
        let batch = i as u64 + 2;
        assert_eq!(&all_rows(dir.path(), Some(batch)), want, "batch {batch}");
    }
    assert_ne!(live[0], live[3]);
    let meta = read_metadata(dir.path()).unwrap();
    assert_eq!(
        (meta["min_batch_id"].clone(), meta["max_batch_id"].clone()),
        (json!(2), json!(6))
    );
    for batch in [1, 7] {
        let err = read_state(dir.path(), "seen", false, Some(batch), |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "the state of batch {batch} is not available: the checkpoint retains \
                 batches 2 to 6"
            )),
            "{err}"
        );
    }
}

#[test]
fn a_directory_that_is_no_checkpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = StateReader::open(dir.path()).unwrap_err().to_string();
    assert!(err.contains("not a Statebox checkpoint"), "{err}");
}
