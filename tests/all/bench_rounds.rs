//! `bench/rounds.py`, which compares builds' `statebox bench` figures over rounds: the
//! medians and ranges it prints are those of the runs, taken in turn, and it refuses output
//! it cannot compare, saying why.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/rounds.py")
}

/// A stand-in for `statebox` in `dir`: its n-th run of `bench ttl …` prints a per-batch
/// line, then `summaries` summary lines with the n-th of `figures` as events/s.
fn fake(dir: &Path, name: &str, figures: &[u32], summaries: usize) -> PathBuf {
    let path = dir.join(name);
    let runs = dir.join(format!("{name}.runs"));
    let figures: Vec<String> = figures.iter().map(u32::to_string).collect();
    let text = format!(
        r#"#!/bin/sh
[ "$1" = bench ] && [ "$2" = ttl ] || exit 3
n=$(cat '{runs}' 2>/dev/null || echo 0)
echo $((n + 1)) > '{runs}'
set -- {figures}
shift $n
echo '{{"batch":0,"events_per_s":1.0}}'
i=0
while [ $i -lt {summaries} ]; do
  echo "{{\"events_per_s\":$1.0,\"workload\":\"ttl\"}}"
  i=$((i + 1))
done
"#,
        runs = runs.display(),
        figures = figures.join(" "),
    );
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn rounds(args: &[&str]) -> Output {
    Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .expect("run python3 bench/rounds.py")
}

#[test]
fn rounds_print_each_builds_median_and_range() {
    let dir = tempfile::tempdir().unwrap();
    let a = fake(dir.path(), "a", &[100_000, 400_000, 200_000], 1);
    let b = fake(dir.path(), "b", &[50_000, 90_000, 60_000], 1);
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let out = rounds(&["3", a, b, "--", "ttl", "--events", "10"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(
        lines[0].starts_with(&format!(
            "{a}: events/s median 200k [100k-400k], CPU median "
        )),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("  events/s 100k 400k 200k | CPU s "),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with(&format!("{b}: events/s median 60k [50k-90k], CPU median ")),
        "{stdout}"
    );
    assert!(
        lines[3].starts_with("  events/s 50k 90k 60k | CPU s "),
        "{stdout}"
    );
}

#[test]
fn rounds_refuse_what_they_cannot_compare() {
    let dir = tempfile::tempdir().unwrap();
    let two = fake(dir.path(), "two", &[1_000], 2);
    let two = two.to_str().unwrap();
    let refused = |args: &[&str], why: &str| {
        let out = rounds(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    };
    refused(
        &["1", two, "--", "ttl"],
        "printed 2 summary lines, not one (with `bench count`, pick one --engine)",
    );
    refused(&["1", two, "--", "count"], "exited with 3");
    refused(&["1", two, "ttl"], "missing -- before the bench arguments");
    refused(
        &["x", two, "--", "ttl"],
        "ROUNDS must be a positive number, not 'x'",
    );
    refused(
        &["1", "/nonexistent", "--", "ttl"],
        "'/nonexistent' is not an executable",
    );
}
