//! `--trigger interval=…`: a long-running query that picks up new files, runs no-data
//! batches so processing-time timers fire without input, and stops cleanly on Ctrl-C.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use statebox_tests::{Scratch, guests, interrupt, wait_for};

/// `plugins/heartbeat-monitor` (10 s timeout).
const HEARTBEAT: &str = env!("STATEBOX_GUEST_HEARTBEAT_MONITOR");

/// Polls until the output holds `n` rows, or panics after `limit`.
fn wait_for_rows(scratch: &Scratch, n: usize, limit: Duration) -> Vec<serde_json::Value> {
    wait_for(&format!("{n} output rows"), limit, || {
        let rows = scratch.output_rows();
        (rows.len() >= n).then_some(rows)
    })
}

#[test]
fn an_interval_trigger_processes_new_files_and_stops_on_ctrl_c() {
    let scratch = Scratch::new();
    let child = scratch
        .run_cmd(guests::COUNTER, "k")
        .args(["--trigger", "interval=100ms"])
        .command()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn statebox");
    scratch.write_rows("a.jsonl", &[json!({"k": "x"}), json!({"k": "x"})]);
    let rows = wait_for_rows(&scratch, 1, Duration::from_secs(20));
    assert_eq!(rows, vec![json!({"key": "x", "count": 2})]);
    scratch.write_rows("b.jsonl", &[json!({"k": "y"})]);
    let rows = wait_for_rows(&scratch, 2, Duration::from_secs(20));
    assert_eq!(rows[1], json!({"key": "y", "count": 1}));
    let stderr = interrupt(child);
    assert!(
        stderr.contains("stopped after the last committed batch"),
        "{stderr}"
    );
    // Everything was committed: an available-now run finds nothing new to do.
    let stderr = scratch.run_cmd(guests::COUNTER, "k").run().expect_ok();
    assert!(stderr.contains("no new input"), "{stderr}");
    assert_eq!(scratch.output_rows().len(), 2);
}

#[test]
fn no_data_batches_fire_processing_time_timers_without_input() {
    let scratch = Scratch::new();
    let child = scratch
        .run_cmd(HEARTBEAT, "sensor")
        .args([
            "--time-mode",
            "processing-time",
            "--trigger",
            "interval=200ms",
        ])
        .command()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn statebox");
    scratch.write_rows("beat.jsonl", &[json!({"sensor": "s1"})]);
    let rows = wait_for_rows(&scratch, 1, Duration::from_secs(20));
    assert_eq!(rows, vec![json!({"sensor": "s1", "status": "up"})]);
    // No more input: only a no-data batch can fire the 10 s timeout.
    let rows = wait_for_rows(&scratch, 2, Duration::from_secs(30));
    assert_eq!(rows[1], json!({"sensor": "s1", "status": "down"}));
    interrupt(child);
    assert_eq!(scratch.output_rows().len(), 2, "down is emitted once");
}
