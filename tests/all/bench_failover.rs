//! `statebox bench failover` (issue 17's recovery figure), small: the JSON line it prints
//! has every field, with values that fit together, and what it says it stored is in the
//! store (over a real S3 server, moto).

use std::process::Command;

use serde_json::Value;
use statebox_cluster::StateStore;
use statebox_tests::s3::S3;
use statebox_tests::statebox_bin;

/// Runs `statebox bench failover ARGS` with `env`; its one JSON line.
fn bench(args: &[&str], env: &[(&str, String)]) -> Value {
    let out = Command::new(statebox_bin())
        .args(["bench", "failover"])
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .output()
        .expect("run statebox bench failover");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failover failed:\n{stderr}");
    assert!(
        stderr.contains("no --brokers given"),
        "without --brokers it says the scaling run was skipped:\n{stderr}"
    );
    let stdout = String::from_utf8(out.stdout).expect("UTF-8 output");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line without --brokers:\n{stdout}");
    serde_json::from_str(lines[0]).expect("a JSON line")
}

fn f(line: &Value, field: &str) -> f64 {
    line[field]
        .as_f64()
        .unwrap_or_else(|| panic!("`{field}` is not a number in {line}"))
}

/// The fields of a run with `--state-mb 8 --replay-batches 2 --batch-events 5000`.
fn check_line(line: &Value, store: &str) {
    assert_eq!(line["workload"], "failover-recovery", "{line}");
    assert_eq!(line["store"], store, "{line}");
    assert_eq!(line["processor"], "counter-native", "{line}");
    assert_eq!(line["replay_output_identical"], true, "{line}");
    assert!(f(line, "cores") >= 1.0, "{line}");
    // At least the target, and built in whole batches of 5000 new keys.
    let state = f(line, "state_bytes");
    assert!(state >= 8.0 * 1024.0 * 1024.0, "{line}");
    let keys = f(line, "keys");
    assert!(keys > 0.0 && keys % 5000.0 == 0.0, "{line}");
    // The snapshot holds the state (its change log and unflushed writes aside) and is what
    // was uploaded: several files, most of the state's bytes.
    let snapshot = f(line, "snapshot_bytes");
    assert!(snapshot > state / 4.0 && snapshot <= state * 2.0, "{line}");
    assert!(f(line, "snapshot_files") >= 3.0, "{line}");
    // Batches 0..=S built the state; two more were replayed.
    let snapshot_batch = f(line, "snapshot_batch");
    assert_eq!(snapshot_batch, keys / 5000.0 - 1.0, "{line}");
    assert_eq!(f(line, "last_batch"), snapshot_batch + 2.0, "{line}");
    assert_eq!(f(line, "replay_batches"), 2.0, "{line}");
    assert_eq!(f(line, "replay_events"), 10_000.0, "{line}");
    // The first owner claimed generation 1, the new owner 2.
    assert_eq!(f(line, "owner_generation"), 2.0, "{line}");
    for field in [
        "build_seconds",
        "upload_seconds",
        "download_seconds",
        "replay_seconds",
        "first_run_seconds",
        "recovery_seconds",
    ] {
        let s = f(line, field);
        assert!(s > 0.0 && s < 300.0, "`{field}` is {s}: {line}");
    }
    let total = f(line, "recovery_seconds");
    let parts = f(line, "download_seconds") + f(line, "replay_seconds");
    assert!(
        (total - parts).abs() <= 0.002,
        "recovery = download + replay: {line}"
    );
    assert!(f(line, "download_mib_per_s") > 0.0, "{line}");
}

#[test]
fn bench_failover_over_a_local_directory_prints_a_sane_recovery_line() {
    let line = bench(
        &[
            "--state-mb",
            "8",
            "--replay-batches",
            "2",
            "--batch-events",
            "5000",
        ],
        &[],
    );
    check_line(&line, "directory");
}

/// Over S3: the task the line names is in the bucket with the snapshot, the plans and the
/// owner generations the line reports.
#[test]
fn bench_failover_over_s3_stores_what_it_reports() {
    let s3 = S3::start();
    s3.create_bucket("bench");
    let env = s3.env();
    let line = bench(
        &[
            "--state-mb",
            "8",
            "--replay-batches",
            "2",
            "--batch-events",
            "5000",
            "--state-store",
            "s3://bench/figures",
        ],
        &env,
    );
    check_line(&line, "s3");
    let url = line["store_url"].as_str().expect("store_url");
    assert!(url.starts_with("s3://bench/figures/"), "{line}");
    let store = StateStore::open_read_only_with(url, env.iter().map(|(k, v)| (*k, v.clone())))
        .expect("open the bench's store");
    let task = store
        .task(line["task"].as_str().expect("task"))
        .expect("the task");
    let manifest = task
        .latest_snapshot()
        .expect("read the manifest")
        .expect("a snapshot");
    assert_eq!(manifest.batch as f64, f(&line, "snapshot_batch"));
    assert_eq!(manifest.files.len() as f64, f(&line, "snapshot_files"));
    let uploaded: u64 = manifest.files.iter().map(|m| m.size).sum();
    assert_eq!(uploaded as f64, f(&line, "snapshot_bytes"));
    assert_eq!(task.owner_generation().expect("owners"), Some(2));
    assert_eq!(
        task.latest_plan().expect("plans").map(|b| b as f64),
        Some(f(&line, "last_batch"))
    );
}

#[test]
fn bench_failover_refuses_zero_replay_batches() {
    let out = Command::new(statebox_bin())
        .args(["bench", "failover", "--replay-batches", "0"])
        .output()
        .expect("run statebox bench failover");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--replay-batches"), "{stderr}");
}
