//! The example processors through the CLI: the scd1 README example, and counter and
//! session-tracker over directories of files read batch by batch, resumed from the checkpoint.

use serde_json::{Value, json};
use statebox_tests::{Scratch, guests};

/// Sorts rows by their JSON text, for comparing the rows of one batch, whose order depends
/// on partitioning.
fn sorted(mut rows: Vec<Value>) -> Vec<Value> {
    rows.sort_by_key(|r| r.to_string());
    rows
}

fn loc(user: &str, time: i64, location: &str) -> Value {
    json!({"user": user, "time": time, "location": location})
}

/// Runs the query and returns the rows it appended to the output.
fn run_new_rows(s: &Scratch, processor: &str, key: &str, extra: &[&str]) -> Vec<Value> {
    let before = s.output_rows().len();
    s.run_cmd(processor, key).args(extra).run().expect_ok();
    s.output_rows()[before..].to_vec()
}

#[test]
fn scd1_readme_example() {
    let s = Scratch::new();
    s.write_rows(
        "0.jsonl",
        &[
            loc("u1", 1, "NYC"),
            loc("u1", 3, "SF"),
            loc("u1", 2, "LA"),
            loc("u2", 5, "London"),
        ],
    );
    let out = run_new_rows(&s, guests::SCD1, "user", &[]);
    assert_eq!(
        sorted(out),
        sorted(vec![loc("u1", 3, "SF"), loc("u2", 5, "London")])
    );

    // An older row changes nothing; a newer one updates.
    s.write_rows("1.jsonl", &[loc("u1", 2, "LA"), loc("u2", 6, "Paris")]);
    let out = run_new_rows(&s, guests::SCD1, "user", &[]);
    assert_eq!(out, vec![loc("u2", 6, "Paris")]);

    // A row as old as the stored one is not newer; the newest row of the batch wins.
    s.write_rows(
        "2.jsonl",
        &[
            loc("u1", 3, "Oslo"),
            loc("u1", 5, "Rome"),
            loc("u1", 4, "Bern"),
        ],
    );
    let out = run_new_rows(&s, guests::SCD1, "user", &[]);
    assert_eq!(out, vec![loc("u1", 5, "Rome")]);

    // Only u1 older rows: nothing.
    s.write_rows("3.jsonl", &[loc("u1", 1, "NYC")]);
    assert_eq!(
        run_new_rows(&s, guests::SCD1, "user", &[]),
        Vec::<Value>::new()
    );
}

fn count(key: &str, n: i64) -> Value {
    json!({"key": key, "count": n})
}

fn krows(key: &str, n: usize) -> Vec<Value> {
    (0..n).map(|i| json!({"k": key, "i": i})).collect()
}

#[test]
fn counter_reads_one_file_per_batch_and_resumes() {
    let s = Scratch::new();
    s.write_rows("a.jsonl", &[krows("k1", 2), krows("k2", 1)].concat());
    s.write_rows("b.jsonl", &krows("k1", 3));
    s.write_rows("c.jsonl", &krows("k2", 4));
    let stderr = s.run_cmd(guests::COUNTER, "k").run().expect_ok();
    for batch in ["batch 0:", "batch 1:", "batch 2:"] {
        assert!(stderr.contains(batch), "{stderr}");
    }
    assert!(!stderr.contains("batch 3:"), "{stderr}");
    let out = s.output_rows();
    assert_eq!(out.len(), 4);
    assert_eq!(
        sorted(out[..2].to_vec()),
        sorted(vec![count("k1", 2), count("k2", 1)])
    );
    assert_eq!(out[2..], [count("k1", 3), count("k2", 4)]);

    // Nothing new: no batch runs and the output is untouched.
    let before = s.output_bytes();
    let stderr = s.run_cmd(guests::COUNTER, "k").run().expect_ok();
    assert!(stderr.contains("no new input"), "{stderr}");
    assert!(!stderr.contains("batch "), "{stderr}");
    assert_eq!(s.output_bytes(), before);

    // A new file: only its batch runs.
    s.write_rows("d.jsonl", &[krows("k1", 1), krows("k3", 2)].concat());
    let stderr = s.run_cmd(guests::COUNTER, "k").run().expect_ok();
    assert!(stderr.contains("batch 3:"), "{stderr}");
    assert!(
        !stderr.contains("batch 2:") && !stderr.contains("batch 4:"),
        "{stderr}"
    );
    let out = s.output_rows();
    assert_eq!(&s.output_bytes()[..before.len()], &before[..]);
    assert_eq!(
        sorted(out[4..].to_vec()),
        sorted(vec![count("k1", 1), count("k3", 2)])
    );
}

#[test]
fn max_files_per_batch_groups_files() {
    let s = Scratch::new();
    for i in 1..=5 {
        s.write_rows(&format!("{i}.jsonl"), &krows("k", i));
    }
    let stderr = s
        .run_cmd(guests::COUNTER, "k")
        .args(["--max-files-per-batch", "2"])
        .run()
        .expect_ok();
    assert!(
        stderr.contains("batch 2:") && !stderr.contains("batch 3:"),
        "{stderr}"
    );
    assert_eq!(
        s.output_rows(),
        vec![count("k", 1 + 2), count("k", 3 + 4), count("k", 5)]
    );
}

#[test]
fn counter_labels_multi_column_keys() {
    let s = Scratch::new();
    s.write_rows(
        "a.jsonl",
        &[
            json!({"a": "x", "b": 1}),
            json!({"b": 1, "a": "x", "other": true}),
            json!({"a": "x", "b": 2}),
        ],
    );
    s.run_cmd(guests::COUNTER, "a,b").run().expect_ok();
    assert_eq!(
        sorted(s.output_rows()),
        sorted(vec![count(r#"["x",1]"#, 2), count(r#"["x",2]"#, 1)])
    );
}

/// What session-tracker must emit for each batch (one file of `(user, session)` events per
/// batch), each batch's rows sorted.
fn session_model(batches: &[Vec<(&str, &str)>]) -> Vec<Vec<Value>> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut sessions: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut events: BTreeMap<&str, i64> = BTreeMap::new();
    batches
        .iter()
        .map(|batch| {
            let mut users = BTreeSet::new();
            for &(user, session) in batch {
                sessions.entry(user).or_default().insert(session);
                *events.entry(user).or_default() += 1;
                users.insert(user);
            }
            sorted(
                users
                    .into_iter()
                    .map(|u| {
                        json!({"user_id": u, "distinct_sessions": sessions[u].len(), "total_events": events[u]})
                    })
                    .collect(),
            )
        })
        .collect()
}

fn events(batch: &[(&str, &str)]) -> Vec<Value> {
    batch
        .iter()
        .map(|(u, s)| json!({"user_id": u, "session_id": s, "page": "/"}))
        .collect()
}

#[test]
fn session_tracker_totals_span_batches_and_runs() {
    let batches: Vec<Vec<(&str, &str)>> = vec![
        vec![("u1", "s1"), ("u2", "s1"), ("u1", "s1"), ("u1", "s2")],
        vec![("u2", "s2"), ("u3", "s1")],
        vec![("u1", "s3"), ("u1", "s1"), ("u2", "s1")],
        vec![("u3", "s1"), ("u3", "s2"), ("u1", "s9")],
    ];
    let s = Scratch::new();
    s.write_rows("b0.jsonl", &events(&batches[0]));
    s.write_rows("b1.jsonl", &events(&batches[1]));
    s.run_cmd(guests::SESSION_TRACKER, "user_id")
        .args(["--partitions", "3"])
        .run()
        .expect_ok();
    // Later files, a later run: the totals continue from the checkpoint.
    s.write_rows("b2.jsonl", &events(&batches[2]));
    s.write_rows("b3.jsonl", &events(&batches[3]));
    s.run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_ok();

    let expected = session_model(&batches);
    let mut out = s.output_rows().into_iter();
    for (i, batch) in expected.into_iter().enumerate() {
        let got: Vec<Value> = out.by_ref().take(batch.len()).collect();
        assert_eq!(sorted(got), batch, "batch {i}");
    }
    assert_eq!(out.next(), None);
}

/// Hidden and `_`-prefixed files (being written, or markers) and subdirectories are not
/// input; keys spelled differently in JSON are the same key.
#[test]
fn only_complete_files_are_input_and_keys_are_canonical() {
    let s = Scratch::new();
    s.write_text(
        "a.jsonl",
        "{\"k\":\"u1\"}\n{\"k\": \"\\u0075\\u0031\"}\r\n\n{\"k\":7}\n{\"k\":7, \"x\":1}",
    );
    s.write_text("_SUCCESS", "");
    std::fs::write(s.input().join(".b.jsonl.tmp"), "{\"k\":\"hidden\"}\n").unwrap();
    std::fs::write(s.input().join("_c.jsonl"), "{\"k\":\"marker\"}\n").unwrap();
    std::fs::create_dir(s.input().join("sub")).unwrap();
    std::fs::write(s.input().join("sub/d.jsonl"), "{\"k\":\"nested\"}\n").unwrap();
    let stderr = s.run_cmd(guests::COUNTER, "k").run().expect_ok();
    assert!(!stderr.contains("batch 1:"), "one input file: {stderr}");
    assert_eq!(
        sorted(s.output_rows()),
        sorted(vec![count("u1", 2), count("7", 2)])
    );
}
