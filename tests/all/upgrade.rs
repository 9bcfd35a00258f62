//! Upgrading a processor over an existing checkpoint, through the CLI (SPEC §7, §8; issue 4):
//! `statebox check` reports each state variable of a new version against the checkpoint and
//! exits non-zero when the upgrade would be refused; `statebox run` refuses the same
//! upgrades before touching state; `--initial-state` applies to a new checkpoint only.
//!
//! The processors are the `user-profile` chain of `plugins/` (v1 → v2 evolves `profile` and
//! adds `history`; v3 is compatible with v2 but not with v1) and the test guests
//! `profile-kind-change` and `profile-ttl-added`. The report's layout is not fixed: the tests
//! look for the variable names, the verdicts and the schemas in it.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use statebox_tests::{Scratch, component_cache, statebox_bin};

const V1: &str = env!("STATEBOX_GUEST_USER_PROFILE_V1");
const V2: &str = env!("STATEBOX_GUEST_USER_PROFILE_V2");
const V3: &str = env!("STATEBOX_GUEST_USER_PROFILE_V3");
const KIND_CHANGE: &str = env!("STATEBOX_GUEST_PROFILE_KIND_CHANGE");
const TTL_ADDED: &str = env!("STATEBOX_GUEST_PROFILE_TTL_ADDED");

/// The `profile` schema of each version, as the host prints DDL.
const V1_PROFILE: &str = "name string, visits int";
const V2_PROFILE: &str = "display_name string, email string, visits long";
const V3_PROFILE: &str =
    "display_name string, email string, visits long, name struct<first: string, last: string>";
/// The output schemas of v1 and v2.
const V1_OUTPUT: &str = "user string, name string, visits int";
const V2_OUTPUT: &str = "user string, display_name string, email string, visits long, history array<long>, status string";

/// How a `statebox check` ended.
struct Checked {
    code: Option<i32>,
    /// Standard output and standard error together.
    text: String,
}

impl Checked {
    #[track_caller]
    fn expect_ok(self, fragments: &[&str]) -> String {
        assert_eq!(
            self.code,
            Some(0),
            "the upgrade should pass:\n{}",
            self.text
        );
        self.expect_mentions(fragments)
    }

    #[track_caller]
    fn expect_refused(self, fragments: &[&str]) -> String {
        assert!(
            matches!(self.code, Some(code) if code != 0),
            "the upgrade should be refused (non-zero exit, not a crash):\n{}",
            self.text
        );
        self.expect_mentions(fragments)
    }

    #[track_caller]
    fn expect_mentions(self, fragments: &[&str]) -> String {
        for fragment in fragments {
            assert!(
                self.text.contains(fragment),
                "the report should mention `{fragment}`:\n{}",
                self.text
            );
        }
        self.text
    }
}

/// `statebox check --processor <processor> --checkpoint <checkpoint>`.
fn check(processor: &str, checkpoint: &Path) -> Checked {
    let out = Command::new(statebox_bin())
        .arg("check")
        .args(["--processor", processor])
        .arg("--checkpoint")
        .arg(checkpoint)
        .env("STATEBOX_CACHE_DIR", component_cache())
        .env_remove("STATEBOX_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox");
    Checked {
        code: out.status.code(),
        text: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn visit(user: &str, name: &str, visits: i64) -> Value {
    json!({"user": user, "name": name, "visits": visits})
}

/// A checkpoint written by v1 (time mode `none`): users `a` (Ann, 5 visits) and `z` (Zed, 7).
fn v1_checkpoint() -> Scratch {
    let s = Scratch::new();
    s.write_rows(
        "000.jsonl",
        &[
            visit("a", "Ann", 2),
            visit("a", "Ann", 3),
            visit("z", "Zed", 7),
        ],
    );
    s.run_cmd(V1, "user").run().expect_ok();
    assert_eq!(s.output_rows().len(), 2);
    s
}

/// The output row of v2 (or of v3 without its `name`) for an update.
fn v2_row(user: &str, display_name: Value, email: Value, visits: i64, history: &[i64]) -> Value {
    json!({"user": user, "display_name": display_name, "email": email, "visits": visits,
           "history": history, "status": "active"})
}

/// The rows of the output from index `from` on, sorted by user.
fn rows_from(s: &Scratch, from: usize) -> Vec<Value> {
    let mut rows = s.output_rows().split_off(from);
    rows.sort_by(|a, b| a["user"].as_str().cmp(&b["user"].as_str()));
    rows
}

#[test]
fn check_accepts_v2_on_a_v1_checkpoint_reporting_what_evolves_and_what_is_added() {
    let s = v1_checkpoint();
    let report = check(V2, &s.checkpoint()).expect_ok(&[
        "profile", "evolve", V1_PROFILE, V2_PROFILE, "history", "added", V1_OUTPUT, V2_OUTPUT,
    ]);
    assert!(!report.contains("incompatible"), "{report}");
    // The same version again changes nothing.
    check(V1, &s.checkpoint()).expect_ok(&["profile", "compatible"]);
    // Checking touched nothing: v1 still runs on the checkpoint as before.
    s.write_rows("001.jsonl", &[visit("a", "Ann", 1)]);
    s.run_cmd(V1, "user").run().expect_ok();
    assert_eq!(
        rows_from(&s, 2),
        vec![json!({"user": "a", "name": "Ann", "visits": 6})]
    );
}

#[test]
fn check_refuses_v3_on_a_v1_checkpoint_naming_the_variable_and_both_schemas() {
    let s = v1_checkpoint();
    check(V3, &s.checkpoint()).expect_refused(&["profile", "incompatible", V1_PROFILE, V3_PROFILE]);
}

#[test]
fn check_refuses_v3_after_v2_because_of_the_schema_v1_wrote() {
    // v1 → v2 is fine, but `z` still holds the value v1 wrote, with `name` a string: v3's
    // `name` struct is checked against every earlier schema, not only v2's.
    let s = v1_checkpoint();
    s.write_rows(
        "001.jsonl",
        &[json!({"user": "a", "name": "Ann Lee", "email": "ann@x", "visits": 1})],
    );
    s.run_cmd(V2, "user").run().expect_ok();
    check(V3, &s.checkpoint()).expect_refused(&["profile", "incompatible", V1_PROFILE, V3_PROFILE]);

    // On a checkpoint v2 created, v3 only adds a nullable field.
    let fresh = Scratch::new();
    fresh.write_rows("000.jsonl", &[visit("a", "Ann Lee", 1)]);
    fresh.run_cmd(V2, "user").run().expect_ok();
    let report = check(V3, &fresh.checkpoint()).expect_ok(&["profile", "evolve", V3_PROFILE]);
    assert!(!report.contains("incompatible"), "{report}");
}

#[test]
fn check_reports_a_variable_the_new_version_no_longer_declares() {
    // Rolling v2 back to v1: `history` is dropped (its data stays), and `profile` would
    // narrow `visits` from long to int.
    let s = Scratch::new();
    s.write_rows("000.jsonl", &[visit("a", "Ann", 1)]);
    s.run_cmd(V2, "user").run().expect_ok();
    check(V1, &s.checkpoint()).expect_refused(&[
        "history",
        "dropped",
        "profile",
        "incompatible",
        V1_PROFILE,
        V2_PROFILE,
    ]);
}

#[test]
fn check_refuses_a_kind_change_and_an_added_ttl() {
    let s = v1_checkpoint();
    check(KIND_CHANGE, &s.checkpoint()).expect_refused(&["profile", "list"]);

    // TTL needs a time mode with a clock.
    let timed = Scratch::new();
    timed.write_rows("000.jsonl", &[visit("a", "Ann", 1)]);
    timed
        .run_cmd(V1, "user")
        .args(["--time-mode", "processing-time"])
        .run()
        .expect_ok();
    check(TTL_ADDED, &timed.checkpoint()).expect_refused(&["profile", "TTL"]);
}

#[test]
fn run_refuses_an_incompatible_upgrade_before_touching_state() {
    let s = v1_checkpoint();
    s.write_rows(
        "001.jsonl",
        &[
            json!({"user": "a", "visits": 1}),
            json!({"user": "c", "name": "Cy", "visits": 1}),
        ],
    );
    let before = s.output_bytes();
    s.run_cmd(V3, "user")
        .run()
        .expect_error(&["profile", V1_PROFILE, V3_PROFILE]);
    assert_eq!(s.output_bytes(), before, "the refused run emitted nothing");
    s.run_cmd(KIND_CHANGE, "user")
        .run()
        .expect_error(&["profile"]);
    assert_eq!(s.output_bytes(), before, "the refused run emitted nothing");

    // The input the refused runs saw is still pending, and v1's state reads through v2.
    s.run_cmd(V2, "user").run().expect_ok();
    assert_eq!(
        rows_from(&s, 2),
        vec![
            v2_row("a", Value::Null, Value::Null, 6, &[1]),
            v2_row("c", json!("Cy"), Value::Null, 1, &[1]),
        ]
    );
    s.write_rows(
        "002.jsonl",
        &[json!({"user": "z", "email": "z@x", "visits": 1})],
    );
    s.run_cmd(V2, "user").run().expect_ok();
    assert_eq!(
        rows_from(&s, 4),
        vec![v2_row("z", Value::Null, json!("z@x"), 8, &[1])]
    );
}

/// Writes initial-state rows into `dir` as JSON Lines, one file per slice.
fn write_initial_state(dir: &Path, files: &[&[Value]]) {
    std::fs::create_dir_all(dir).expect("create the initial-state directory");
    for (i, rows) in files.iter().enumerate() {
        let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(dir.join(format!("{i:03}.jsonl")), text).expect("write initial state");
    }
}

#[test]
fn initial_state_applies_to_the_first_batch_of_a_new_checkpoint_only() {
    let s = Scratch::new();
    let initial = s.path().join("initial");
    write_initial_state(
        &initial,
        &[
            &[
                json!({"user": "a", "name": "Ann", "visits": 10}),
                json!({"user": "b", "name": "Bob", "visits": 3}),
            ],
            &[json!({"user": "a", "email": "ann@x", "visits": 5})],
        ],
    );
    s.write_rows("000.jsonl", &[json!({"user": "a", "visits": 1})]);
    s.run_cmd(V2, "user")
        .args(["--initial-state".as_ref(), initial.as_os_str()])
        .run()
        .expect_ok();
    // `b` is only in the initial state: it got no handle-input-rows, so no row.
    assert_eq!(
        rows_from(&s, 0),
        vec![v2_row("a", json!("Ann"), json!("ann@x"), 16, &[10, 5, 1])]
    );

    // A later run with initial state again ignores it: the checkpoint is past its first batch.
    s.write_rows("001.jsonl", &[json!({"user": "b", "visits": 1})]);
    let stderr = s
        .run_cmd(V2, "user")
        .args(["--initial-state".as_ref(), initial.as_os_str()])
        .run()
        .expect_ok();
    assert!(
        stderr.to_lowercase().contains("initial"),
        "a notice says the initial state was ignored:\n{stderr}"
    );
    assert_eq!(
        rows_from(&s, 1),
        vec![v2_row("b", json!("Bob"), Value::Null, 4, &[3, 1])]
    );
}

#[test]
fn initial_state_is_ignored_when_upgrading_an_existing_checkpoint() {
    let s = v1_checkpoint();
    let initial = s.path().join("initial.jsonl");
    std::fs::write(
        &initial,
        "{\"user\":\"a\",\"visits\":100}\n{\"user\":\"n\",\"visits\":1}\n",
    )
    .expect("write initial state");
    s.write_rows("001.jsonl", &[json!({"user": "a", "visits": 1})]);
    s.run_cmd(V2, "user")
        .args(["--initial-state".as_ref(), initial.as_os_str()])
        .run()
        .expect_ok();
    assert_eq!(
        rows_from(&s, 2),
        vec![v2_row("a", Value::Null, Value::Null, 6, &[1])]
    );
}

/// Time travel across a schema evolution: after v2 runs on v1's checkpoint, batch 0 reads
/// `profile` as v1 wrote it (v1's schema), the latest batch through v2's schema, and
/// `history`, which v2 added, does not exist at batch 0.
#[test]
fn state_of_a_batch_before_an_evolution_reads_through_the_schema_of_that_batch() {
    let s = v1_checkpoint();
    s.write_rows("001.jsonl", &[visit("a", "Ann", 1)]);
    s.run_cmd(V2, "user").run().expect_ok();
    let read = |args: &[&str]| -> std::process::Output {
        Command::new(statebox_bin())
            .args(["state", "read", "--checkpoint"])
            .arg(s.checkpoint())
            .args(args)
            .env("STATEBOX_CACHE_DIR", component_cache())
            .stdin(Stdio::null())
            .output()
            .expect("run statebox state read")
    };
    let values = |args: &[&str]| -> Vec<Value> {
        let out = read(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        statebox_tests::parse_jsonl(&out.stdout)
            .into_iter()
            .map(|r| r["value"].clone())
            .collect()
    };
    assert_eq!(
        values(&["--var", "profile", "--batch-id", "0"]),
        [
            json!({"name": "Ann", "visits": 5}),
            json!({"name": "Zed", "visits": 7})
        ]
    );
    let latest = values(&["--var", "profile"]);
    assert_eq!(latest[0]["visits"], json!(6));
    assert_eq!(latest[1]["visits"], json!(7));
    assert!(latest[1].get("email").is_some(), "{latest:?}");
    assert!(latest[1].get("name").is_none(), "{latest:?}");
    assert_eq!(values(&["--var", "history"]).len(), 1);
    let err = read(&["--var", "history", "--batch-id", "0"]);
    assert!(!err.status.success());
    let err = String::from_utf8_lossy(&err.stderr);
    assert!(
        err.contains("unknown state variable `history`") && err.contains("`profile`"),
        "{err}"
    );
}
