//! Restarting on an existing checkpoint with different settings is refused, naming the
//! setting and both values (SPEC §6, §7); the same settings, given or omitted, are accepted.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde_json::json;
use statebox_tests::{Scratch, guests};

fn setup() -> Scratch {
    let s = Scratch::new();
    s.write_rows("a.jsonl", &[json!({"k": "x"}), json!({"k": "y"})]);
    s.run_cmd(guests::COUNTER, "k").run().expect_ok();
    s
}

#[test]
fn changed_settings_are_refused_naming_both_values() {
    let s = setup();
    let before = s.output_bytes();
    s.write_rows("b.jsonl", &[json!({"k": "x", "user": "x"})]);
    let cases: [(&str, &[&str], &[&str]); 5] = [
        ("user", &[], &["--key", "k", "user"]),
        ("k,user", &[], &["--key", "k", "k,user"]),
        (
            "k",
            &["--output-mode", "append"],
            &["--output-mode", "update", "append"],
        ),
        ("k", &["--partitions", "2"], &["--partitions", "4", "2"]),
        (
            "k",
            &["--time-mode", "processing-time"],
            &["--time-mode", "none", "processing-time"],
        ),
    ];
    for (key, args, fragments) in cases {
        let error = s
            .run_cmd(guests::COUNTER, key)
            .args(args)
            .run()
            .expect_error(fragments);
        assert!(
            error.contains(&s.checkpoint().display().to_string()),
            "names the checkpoint: {error}"
        );
        assert_eq!(s.output_bytes(), before, "nothing ran");
    }

    // The recorded settings, given explicitly, are fine; so is leaving them out.
    s.run_cmd(guests::COUNTER, "k")
        .args([
            "--output-mode",
            "update",
            "--partitions",
            "4",
            "--time-mode",
            "none",
        ])
        .run()
        .expect_ok();
    assert_eq!(s.output_rows().len(), 3);
    s.write_rows("c.jsonl", &[json!({"k": "y"})]);
    s.run_cmd(guests::COUNTER, "k").run().expect_ok();
    assert_eq!(s.output_rows().len(), 4);
}

#[test]
fn settings_of_a_new_checkpoint_are_recorded() {
    let s = Scratch::new();
    s.write_rows("a.jsonl", &[json!({"k": "x"})]);
    s.run_cmd(guests::COUNTER, "k")
        .args(["--output-mode", "append", "--partitions", "2"])
        .run()
        .expect_ok();
    // A later run without the options uses the recorded ones...
    s.write_rows("b.jsonl", &[json!({"k": "x"})]);
    s.run_cmd(guests::COUNTER, "k").run().expect_ok();
    // ...and the defaults no longer apply.
    s.run_cmd(guests::COUNTER, "k")
        .args(["--output-mode", "update"])
        .run()
        .expect_error(&["--output-mode", "append", "update"]);
    s.run_cmd(guests::COUNTER, "k")
        .args(["--partitions", "4"])
        .run()
        .expect_error(&["--partitions", "2", "4"]);
}

#[test]
fn invalid_settings_are_refused_before_anything_is_recorded() {
    let s = Scratch::new();
    s.write_rows("a.jsonl", &[json!({"k": "x"})]);
    s.run_cmd(guests::COUNTER, "k")
        .args(["--partitions", "0"])
        .run()
        .expect_error(&["--partitions"]);
    s.run_cmd(guests::COUNTER, "k")
        .args(["--max-files-per-batch", "0"])
        .run()
        .expect_error(&["--max-files-per-batch"]);
    // A value the command line cannot parse is a usage error (exit code 2).
    let run = s
        .run_cmd(guests::COUNTER, "k")
        .args(["--output-mode", "sideways"])
        .run();
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("sideways"), "{}", run.stderr);
    // Every refusal above comes before the output is opened: no file, not even an empty one.
    assert!(!s.output().exists());
    // None of that was recorded: a valid run creates the checkpoint as asked.
    s.run_cmd(guests::COUNTER, "k")
        .args(["--partitions", "3"])
        .run()
        .expect_ok();
    s.run_cmd(guests::COUNTER, "k")
        .args(["--partitions", "4"])
        .run()
        .expect_error(&["--partitions", "3", "4"]);
}

/// Two runs on one checkpoint at once: the second is refused while the first holds it.
#[test]
fn a_checkpoint_in_use_is_refused() {
    let s = Scratch::new();
    s.write_rows("a.jsonl", &[json!({"k": "x", "action": "ok"})]);
    s.write_rows("b.jsonl", &[json!({"k": "x", "action": "loop"})]);
    let mut first = s
        .run_cmd(guests::MISBEHAVE, "k")
        .args(["--call-timeout-ms", "20000"])
        .command()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn statebox");
    // Once batch 0 committed, the first run is stuck in batch 1 with the checkpoint open.
    let mut stderr = BufReader::new(first.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("batch 0:") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "statebox ended early"
        );
    }
    let second = s.run_cmd(guests::MISBEHAVE, "k").run();
    first.kill().unwrap();
    first.wait().unwrap();
    second.expect_error(&["in use"]);
    assert_eq!(
        s.output_rows().len(),
        1,
        "only the first run's batch 0 committed"
    );
}
