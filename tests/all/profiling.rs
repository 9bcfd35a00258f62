//! `STATEBOX_PERFMAP=1`: wasmtime writes a perf map naming the compiled guest functions, so
//! `perf report` shows where in the processor the time goes; without it, no map is written.

use std::path::PathBuf;
use std::process::Stdio;

use serde_json::json;
use statebox_tests::{Scratch, guests};

/// Runs the counter over a few rows, with `STATEBOX_PERFMAP` set or not, and returns the
/// path where the run's perf map is (or would be).
fn run_counter(perfmap: bool) -> PathBuf {
    let s = Scratch::new();
    s.write_rows(
        "0.jsonl",
        &[
            json!({"user": "a"}),
            json!({"user": "b"}),
            json!({"user": "a"}),
        ],
    );
    let mut cmd = s.run_cmd(guests::COUNTER, "user").command();
    if perfmap {
        cmd.env("STATEBOX_PERFMAP", "1");
    } else {
        cmd.env_remove("STATEBOX_PERFMAP");
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn statebox");
    let map = PathBuf::from(format!("/tmp/perf-{}.map", child.id()));
    let out = child.wait_with_output().expect("wait for statebox");
    assert!(
        out.status.success(),
        "statebox run failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s.output_rows().len(), 2, "the counter emits a row per key");
    map
}

#[test]
fn perfmap_names_the_guest_functions_only_when_asked() {
    let map = run_counter(true);
    let text = std::fs::read_to_string(&map)
        .unwrap_or_else(|e| panic!("no perf map at {}: {e}", map.display()));
    let _ = std::fs::remove_file(&map);
    // Each line is `<start address in hex> <size in hex> <name>`.
    let line = text
        .lines()
        .find(|l| l.contains("handle_input_batch"))
        .unwrap_or_else(|| panic!("no guest export named in the map:\n{text}"));
    let fields: Vec<&str> = line.splitn(3, ' ').collect();
    assert_eq!(fields.len(), 3, "{line}");
    assert!(
        fields[..2]
            .iter()
            .all(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).is_ok()),
        "{line}"
    );

    let map = run_counter(false);
    assert!(
        !map.exists(),
        "{} written without STATEBOX_PERFMAP",
        map.display()
    );
}
