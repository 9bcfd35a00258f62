//! Exactly-once output and exact state under `kill -9` at random moments (SPEC §6).

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use statebox_tests::{Rng, Scratch, guests};

const FILES: usize = 40;
const ROWS_PER_FILE: usize = 5000;
const USERS: u64 = 2000;

/// Writes the same input into each scratch directory. session-tracker emits running totals,
/// so a lost or repeated batch, or state that is off, shows in every later row of that user.
fn write_input(dirs: &[&Scratch], first: usize, count: usize, rng: &mut Rng) {
    for f in first..first + count {
        let mut text = String::new();
        for _ in 0..ROWS_PER_FILE {
            let user = rng.below(USERS);
            let session = rng.below(8);
            text.push_str(
                &json!({"user_id": format!("u{user}"), "session_id": format!("s{session}")})
                    .to_string(),
            );
            text.push('\n');
        }
        for s in dirs {
            s.write_text(&format!("part-{f:04}.jsonl"), &text);
        }
    }
}

#[test]
fn kill_9_at_random_moments_loses_and_duplicates_nothing() {
    let reference = Scratch::new();
    let killed = Scratch::new();
    let mut data = Rng::new(0x5EED);
    write_input(&[&reference, &killed], 0, FILES, &mut data);

    let started = Instant::now();
    reference
        .run_cmd(guests::SESSION_TRACKER, "user_id")
        .run()
        .expect_ok();
    let uninterrupted = started.elapsed();

    let mut timing = Rng::new(42);
    let mut kills = 0;
    let mut attempts = 0;
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        attempts += 1;
        let mut child = killed
            .run_cmd(guests::SESSION_TRACKER, "user_id")
            .command()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn statebox");
        // Past the deadline, let the run finish: the test then still checks recovery from
        // every kill so far.
        if Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(timing.below(301)));
            if child.try_wait().expect("poll statebox").is_none() {
                child.kill().expect("kill -9 statebox");
                child.wait().expect("reap statebox");
                kills += 1;
                continue;
            }
        }
        let out = child.wait_with_output().expect("wait for statebox");
        assert!(
            out.status.success(),
            "statebox run failed after {kills} kills:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        break;
    }
    eprintln!("{kills} of {attempts} runs killed; an uninterrupted run takes {uninterrupted:?}");
    assert!(
        kills >= 3,
        "only {kills} of {attempts} runs were killed (an uninterrupted run takes {uninterrupted:?}); \
         the test proves nothing"
    );
    assert_eq!(
        killed.output_bytes(),
        reference.output_bytes(),
        "after {kills} kills the output differs from an uninterrupted run"
    );

    // The state is exact too: one more batch gives the same totals.
    write_input(&[&reference, &killed], FILES, 1, &mut data);
    for s in [&reference, &killed] {
        s.run_cmd(guests::SESSION_TRACKER, "user_id")
            .run()
            .expect_ok();
    }
    assert_eq!(killed.output_bytes(), reference.output_bytes());
}

/// A new checkpoint pointed at an output file that already holds data (another query's
/// output, or anything else) must not silently destroy it: the run refuses, naming the file,
/// and leaves the existing bytes in place (a new checkpoint has committed no output, so
/// opening the output would cut it to nothing).
#[test]
fn an_existing_output_file_is_never_silently_truncated() {
    let s = Scratch::new();
    s.write_text("a.jsonl", "{\"k\":\"a\"}\n");
    let existing = b"{\"precious\":\"rows written before this query existed\"}\n";
    std::fs::write(s.output(), existing).unwrap();
    let run = s.run_cmd(guests::COUNTER, "k").run();
    run.expect_error(&[&s.output().display().to_string(), "already holds", "is new"]);
    assert_eq!(s.output_bytes(), existing);
}
