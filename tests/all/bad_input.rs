//! Bad input fails the batch naming the file and line, commits nothing, and the run
//! continues correctly once the file is fixed.

use serde_json::{Value, json};
use statebox_tests::{Scratch, guests};

fn event(user: &str, session: &str) -> String {
    json!({"user_id": user, "session_id": session}).to_string()
}

/// Runs session-tracker over `a.jsonl` (good) and `b.jsonl`, whose third line is `bad`;
/// expects batch 1 to fail naming `b.jsonl:3` and `fragments`; then fixes the line and
/// expects exactly the output of a run that never saw the bad line.
fn bad_line_scenario(bad: &str, fragments: &[&str]) {
    let a = [event("u1", "s1"), event("u2", "s1")].join("\n") + "\n";
    let b = |third: &str| {
        [
            event("u1", "s2"),
            event("u3", "s1"),
            third.to_owned(),
            event("u2", "s2"),
        ]
        .join("\n")
            + "\n"
    };
    let s = Scratch::new();
    s.write_text("a.jsonl", &a);
    s.write_text("b.jsonl", &b(bad));
    let b_path = s.input().join("b.jsonl");
    let location = format!("{}:3", b_path.display());
    let mut expected = vec![location.as_str()];
    expected.extend_from_slice(fragments);
    s.run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_error(&expected);
    let after_a = s.output_bytes();
    assert_eq!(s.output_rows().len(), 2, "batch 0 (a.jsonl) committed");

    // Running again without a fix fails the same way and still commits nothing.
    s.run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_error(&expected);
    assert_eq!(s.output_bytes(), after_a);

    let fixed = event("u1", "s3");
    s.write_text("b.jsonl", &b(&fixed));
    s.run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_ok();

    let reference = Scratch::new();
    reference.write_text("a.jsonl", &a);
    reference.write_text("b.jsonl", &b(&fixed));
    reference
        .run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_ok();
    assert_eq!(s.output_bytes(), reference.output_bytes());
    // Spelled out: b.jsonl's rows before the bad line count once.
    let by_user = |mut rows: Vec<Value>| {
        rows.sort_by_key(|r| r["user_id"].to_string());
        rows
    };
    assert_eq!(
        by_user(s.output_rows()[2..].to_vec()),
        vec![
            json!({"user_id": "u1", "distinct_sessions": 3, "total_events": 3}),
            json!({"user_id": "u2", "distinct_sessions": 2, "total_events": 2}),
            json!({"user_id": "u3", "distinct_sessions": 1, "total_events": 1}),
        ]
    );
}

#[test]
fn malformed_json_names_file_and_line() {
    bad_line_scenario(r#"{"user_id": "u1", "session_id": "#, &[]);
}

#[test]
fn a_line_that_is_not_an_object_names_file_and_line() {
    bad_line_scenario(r#"["u1", "s1"]"#, &[]);
}

#[test]
fn a_missing_key_column_names_file_line_and_column() {
    bad_line_scenario(r#"{"session_id": "s9"}"#, &["user_id"]);
}

#[test]
fn a_row_not_matching_the_input_schema_names_file_line_and_column() {
    bad_line_scenario(r#"{"user_id": "u1", "session_id": 42}"#, &["session_id"]);
}

#[test]
fn a_row_the_processor_rejects_names_file_line_and_processor() {
    // Fields are nullable, so the host's schema check lets these through; the processor's
    // own decoding rejects them and the host maps the row back to its file and line.
    bad_line_scenario(r#"{"user_id": "u1"}"#, &["session-tracker", "session_id"]);
    bad_line_scenario(
        r#"{"user_id": "u1", "session_id": null}"#,
        &["session-tracker"],
    );
}

/// Appends `text` to input file `name`.
fn append(s: &Scratch, name: &str, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(s.input().join(name))
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// Line numbers count blank lines, and continue where the last batch stopped reading a file
/// that has grown since.
#[test]
fn line_numbers_count_from_the_start_of_a_grown_file() {
    let s = Scratch::new();
    s.write_text(
        "a.jsonl",
        &format!("{}\n\n{}\n", event("u1", "s1"), event("u1", "s2")),
    );
    s.run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_ok();
    append(
        &s,
        "a.jsonl",
        &format!("{}\n\n{{\"user_id\":\n", event("u1", "s3")),
    );
    let a = s.input().join("a.jsonl");
    s.run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_error(&[&format!("{}:6:", a.display())]);
}

/// A file whose last line had no line break when it was read, and that then grows by a
/// line break and more lines: the line numbers of the new lines are still their lines in
/// the file.
#[test]
fn line_numbers_stay_right_after_a_file_without_a_final_line_break_grows() {
    let s = Scratch::new();
    s.write_text(
        "a.jsonl",
        &format!("{}\n{}", event("u1", "s1"), event("u1", "s2")),
    );
    s.run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_ok();
    // Line 3 is good, line 4 is cut short.
    append(
        &s,
        "a.jsonl",
        &format!("\n{}\n{{\"user_id\":\"u1\"", event("u1", "s3")),
    );
    let a = s.input().join("a.jsonl");
    s.run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_error(&[&format!("{}:4:", a.display())]);
}
