//! Every scenario file under `tests/scenarios/` through `statebox test`: the time and TTL
//! conformance scenarios (SPEC §3 and §4, driven by `tests/guests/timer-ops`) and the
//! scenarios of the example plugins.
//!
//! Scenario files name their processor as a plugin folder (`plugins/heartbeat-monitor`).
//! `statebox test` would build such a folder with cargo; here each scenario is copied with its
//! processors replaced by the components `build.rs` already built, so the suite runs no nested
//! cargo. One test keeps a scenario as written, to cover folder resolution too.
//!
//! With `STATEBOX_BLESS=1`, [`every_scenario_passes`] rewrites the expectations of every
//! failing step from what the run did instead of failing (see [`bless`]); the other ways of
//! running the scenarios still check against the files.

mod bless;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

use serde_json::Value;
use statebox_tests::{component_cache, statebox_bin};

/// The workspace root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests package lives in the workspace")
}

/// Where `build.rs` put the guest components.
fn guest_dir() -> &'static Path {
    Path::new(env!("STATEBOX_GUEST_DIR"))
}

/// Every scenario file, sorted.
fn scenario_files() -> Vec<PathBuf> {
    let dir = root().join("tests/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("read a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

/// The built component of a processor named in a scenario: a `.wasm` as is, a plugin folder
/// (relative to the workspace root) as the component `build.rs` built from it.
fn component(processor: &str) -> String {
    if processor.ends_with(".wasm") {
        return processor.to_owned();
    }
    let folder = root().join(processor);
    if let Some(wasm) = crate::js::plugin_component(&folder) {
        return wasm.display().to_string();
    }
    if folder.join("processor.py").is_file() {
        return python_component(&folder);
    }
    assert!(
        folder.join("Cargo.toml").is_file(),
        "processor {processor} is neither a .wasm file nor a plugin folder of the workspace"
    );
    let name = folder
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a plugin folder has a name");
    let wasm = guest_dir().join(format!("{}.wasm", name.replace('-', "_")));
    assert!(
        wasm.is_file(),
        "{} is missing: add the package `{name}` to GUESTS in tests/build.rs",
        wasm.display()
    );
    wasm.display().to_string()
}

/// A Python plugin folder (one with a `processor.py`) built by `statebox build-python`,
/// once per test process. The CLI caches the component by content hash in the shared
/// component cache, so later runs do not rebuild an unchanged plugin.
fn python_component(folder: &Path) -> String {
    static BUILT: Mutex<BTreeMap<PathBuf, String>> = Mutex::new(BTreeMap::new());
    // Holding the lock while building keeps builds one at a time: each takes seconds of CPU.
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(wasm) = built.get(folder) {
        return wasm.clone();
    }
    let name = folder
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a plugin folder has a name");
    let output = Command::new(statebox_bin())
        .arg("build-python")
        .arg(folder.join("processor.py"))
        .args(["--name", name])
        .env("STATEBOX_CACHE_DIR", component_cache())
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox build-python");
    assert!(
        output.status.success(),
        "building {} failed:\n{}",
        folder.display(),
        describe(&output)
    );
    let wasm = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    built.insert(folder.to_owned(), wasm.clone());
    wasm
}

/// The scenario with every processor (the query's and those of restart steps) replaced by
/// its built component.
fn with_components(mut scenario: Value) -> Value {
    let processor = scenario["processor"]
        .as_str()
        .expect("a scenario names its processor");
    scenario["processor"] = component(processor).into();
    if let Some(steps) = scenario["steps"].as_array_mut() {
        for step in steps {
            if let Some(p) = step.get("processor").and_then(Value::as_str) {
                step["processor"] = component(p).into();
            }
        }
    }
    scenario
}

fn read_scenario(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// A `statebox test` command with the shared component cache.
fn statebox_test(scenario: &Path) -> Command {
    let mut cmd = Command::new(statebox_bin());
    cmd.arg("test")
        .arg(scenario)
        .env("STATEBOX_CACHE_DIR", component_cache())
        .env_remove("STATEBOX_LOG")
        .stdin(Stdio::null());
    cmd
}

/// Writes the scenario into `dir` and runs `statebox test` on it.
fn run_scenario(dir: &Path, name: &str, scenario: &Value) -> Output {
    run_scenario_with(dir, name, scenario, &[])
}

/// [`run_scenario`] with extra `statebox test` arguments.
fn run_scenario_with(dir: &Path, name: &str, scenario: &Value, args: &[&str]) -> Output {
    let file = dir.join(name);
    std::fs::write(
        &file,
        serde_json::to_string_pretty(scenario).expect("serialises"),
    )
    .expect("write the scenario");
    statebox_test(&file)
        .args(args)
        .output()
        .expect("spawn statebox")
}

fn describe(output: &Output) -> String {
    format!(
        "exit status: {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn every_scenario_passes() {
    if std::env::var_os("STATEBOX_BLESS").is_some_and(|v| v == "1") {
        bless_every_scenario();
    } else {
        every_scenario_passes_with(&[]);
    }
}

/// Bless mode: every scenario with a failing step gets that step's expectations rewritten
/// from the real run, and must then pass as written.
fn bless_every_scenario() {
    let files = scenario_files();
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let outcomes: Vec<(String, Result<bool, String>)> = std::thread::scope(|s| {
        let runs: Vec<_> = files
            .iter()
            .map(|file| {
                let dir = dir.path();
                s.spawn(move || (file.display().to_string(), bless_scenario(dir, file)))
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a scenario thread panicked"))
            .collect()
    });
    let mut errors = Vec::new();
    for (file, outcome) in outcomes {
        match outcome {
            Ok(true) => eprintln!("blessed {file}: review it with `git diff`"),
            Ok(false) => {}
            Err(e) => errors.push(format!("=== {file} could not be blessed\n{e}")),
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// Runs the scenario `file` (its copy with built components, in `dir`); if a step failed,
/// rewrites `file`'s expectations from the run and checks that it then passes. Returns
/// whether it rewrote the file.
fn bless_scenario(dir: &Path, file: &Path) -> Result<bool, String> {
    let name = file.file_name().and_then(|n| n.to_str()).expect("a name");
    let text =
        std::fs::read_to_string(file).map_err(|e| format!("read {}: {e}", file.display()))?;
    let scenario = with_components(read_scenario(file));
    let output = run_scenario_with(dir, name, &scenario, &["--json"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let runs = bless::StepRun::parse_all(&stdout)?;
    if output.status.success() && runs.iter().all(|r| r.passed) {
        return Ok(false);
    }
    if runs.is_empty() {
        return Err(format!("no step ran:\n{}", describe(&output)));
    }
    let temp = std::env::temp_dir();
    let cache = component_cache();
    let unstable = [
        temp.to_str().expect("a UTF-8 temporary directory"),
        root().to_str().expect("a UTF-8 workspace path"),
        guest_dir().to_str().expect("a UTF-8 target directory"),
        cache.to_str().expect("a UTF-8 cache directory"),
    ];
    let blessed = bless::bless(&text, &runs, &unstable)?;
    // Written aside and renamed over the file, so the suite's other runs of the scenarios
    // (other test processes) never read half a file.
    let aside = file.with_extension("json.blessing");
    std::fs::write(&aside, blessed).map_err(|e| format!("write {}: {e}", aside.display()))?;
    std::fs::rename(&aside, file).map_err(|e| format!("replace {}: {e}", file.display()))?;
    let again = run_scenario_with(dir, name, &with_components(read_scenario(file)), &[]);
    if !again.status.success() {
        return Err(format!(
            "the blessed file still fails (a step whose outcome differs from run to run?):\n{}",
            describe(&again)
        ));
    }
    Ok(true)
}

/// Blessing a scenario whose expectations are wrong gives back the right file: here the
/// original, byte for byte, since the wrong expectations were made from it.
#[test]
fn bless_rewrites_wrong_expectations_from_the_run() {
    let original = root().join("tests/scenarios/timers-fire-in-ascending-order.json");
    let text = std::fs::read_to_string(&original).expect("read the scenario");
    let wrong = text
        .replacen(
            r#""at_ms": 100, "expect": []"#,
            r#""at_ms": 100, "expect_error": "a timer error""#,
            1,
        )
        .replacen(r#""seq": 5"#, r#""seq": 6"#, 1);
    assert_ne!(wrong, text, "the scenario's text changed: update this test");
    let files = tempfile::tempdir().expect("create a temporary directory");
    let file = files.path().join("timers-fire-in-ascending-order.json");
    std::fs::write(&file, &wrong).expect("write the scenario");
    let runs = tempfile::tempdir().expect("create a temporary directory");
    assert_eq!(bless_scenario(runs.path(), &file), Ok(true));
    let blessed = std::fs::read_to_string(&file).expect("read the blessed scenario");
    assert_eq!(blessed, text);
    // Nothing left to bless.
    assert_eq!(bless_scenario(runs.path(), &file), Ok(false));
}

/// Processors built with the SDKs take many keys per call (`batch-processor`); called key by
/// key instead, through `processor`, every scenario gives the same results.
#[test]
fn every_scenario_passes_called_key_by_key() {
    every_scenario_passes_with(&["--per-key-calls"]);
}

/// Recovery: a restart after every batch (a fresh query, runtime and processor instances
/// over the same checkpoint) changes nothing any step emits or fails with.
#[test]
fn every_scenario_passes_with_a_restart_after_every_batch() {
    every_scenario_passes_with(&["--restart-every-batch"]);
}

fn every_scenario_passes_with(args: &[&str]) {
    let files = scenario_files();
    assert!(
        files.len() >= 20,
        "expected the scenario files under tests/scenarios, found {}",
        files.len()
    );
    let dir = tempfile::tempdir().expect("create a temporary directory");
    // The scenarios are independent processes: run them all at once, report every failure.
    let failures: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = files
            .iter()
            .map(|file| {
                let dir = dir.path();
                s.spawn(move || {
                    let name = file.file_name().and_then(|n| n.to_str()).expect("a name");
                    let scenario = with_components(read_scenario(file));
                    let output = run_scenario_with(dir, name, &scenario, args);
                    if !output.status.success() {
                        return Some(format!("=== {name} FAILED\n{}", describe(&output)));
                    }
                    // Every scenario runs a batch, so the mode must have restarted.
                    let restarted = restarts(&String::from_utf8_lossy(&output.stdout));
                    let restarting = args.contains(&"--restart-every-batch");
                    (restarting && restarted.is_none_or(|n| n == 0))
                        .then(|| format!("=== {name} did not restart\n{}", describe(&output)))
                })
            })
            .collect();
        runs.into_iter()
            .filter_map(|run| run.join().expect("a scenario thread panicked"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

/// The restart mode really starts the query again between batches: every batch sees a new
/// run id (a run is one `Query::open`), while the query id, kept in the checkpoint, stays.
/// Without the mode all batches share one run.
#[test]
fn a_restart_after_every_batch_starts_a_new_run_each_batch() {
    let row = serde_json::json!({"k": "a", "action": "query-info"});
    let scenario = serde_json::json!({
        "processor": statebox_tests::guests::MISBEHAVE,
        "key": ["k"],
        "steps": [{"batch": [row]}, {"batch": [row]}, {"batch": [row]}],
    });
    let dir = tempfile::tempdir().expect("create a temporary directory");
    // (query id, run id) of each batch.
    let ids = |args: &[&str]| -> Vec<(String, String)> {
        let output = run_scenario_with(dir.path(), "query-info.json", &scenario, args);
        assert!(output.status.success(), "{}", describe(&output));
        let runs = bless::StepRun::parse_all(&String::from_utf8_lossy(&output.stdout))
            .unwrap_or_else(|e| panic!("{e}\n{}", describe(&output)));
        runs.iter()
            .map(|run| {
                let detail = run.emitted[0]["detail"].as_str().expect("a detail");
                let (query, run) = detail.split_once(' ').expect("query id and run id");
                (query.to_owned(), run.to_owned())
            })
            .collect()
    };
    let plain = ids(&["--json"]);
    let restarted = ids(&["--json", "--restart-every-batch"]);
    assert_eq!(plain.len(), 3);
    assert!(plain.iter().all(|ids| *ids == plain[0]), "{plain:?}");
    assert_eq!(restarted.len(), 3);
    assert!(
        restarted.iter().all(|(query, _)| *query == restarted[0].0),
        "{restarted:?}"
    );
    let runs: std::collections::BTreeSet<&String> = restarted.iter().map(|(_, r)| r).collect();
    assert_eq!(runs.len(), 3, "a run id per batch: {restarted:?}");
}

/// The restarts `statebox test --restart-every-batch` reports on its last line.
fn restarts(stdout: &str) -> Option<usize> {
    let line = stdout.lines().last()?;
    let (_, tail) = line.split_once("with a restart after every batch (")?;
    tail.strip_suffix(" restarts)")?.parse().ok()
}

#[test]
fn a_scenario_naming_a_plugin_folder_runs_as_written() {
    // `statebox test` builds the folder with cargo. It gets a target directory of its own
    // (next to build.rs's, so it stays warm between runs): rebuilding into build.rs's would
    // replace components that the other tests are loading.
    let target = guest_dir()
        .ancestors()
        .nth(3)
        .expect("<target>/wasm-guests/wasm32-wasip2/release")
        .join("wasm-scenario-plugins");
    let file = root().join("tests/scenarios/heartbeat-monitor.json");
    let output = statebox_test(&file)
        .env("STATEBOX_WASM_TARGET_DIR", &target)
        .output()
        .expect("spawn statebox");
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("ok: 11 steps passed"), "{stdout}");
}

#[test]
fn a_wrong_expectation_fails_with_a_readable_diff() {
    let mut scenario = with_components(read_scenario(
        &root().join("tests/scenarios/timers-fire-in-ascending-order.json"),
    ));
    // Claim the last timer fires sixth (it fires fifth), and expect an error where there is none.
    let fired = scenario["steps"][1]["expect"]
        .as_array_mut()
        .expect("step 2 expects rows");
    let last = fired.last_mut().expect("step 2 expects a row");
    last["seq"] = 6.into();
    scenario["steps"][0]["expect_error"] = "a timer error".into();
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let output = run_scenario(dir.path(), "wrong.json", &scenario);
    let report = describe(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    for line in [
        "step 1: FAILED",
        "  expected an error containing: a timer error",
        "  but the step succeeded",
        "step 2: FAILED",
        r#"  - expected, not emitted: {"history":[1500,2500,3000],"k":"a","op":"fired","seq":6,"timers":[3000],"ts":3000}"#,
        r#"  + emitted, not expected: {"history":[1500,2500,3000],"k":"a","op":"fired","seq":5,"timers":[3000],"ts":3000}"#,
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing line `{line}`:\n{report}"
        );
    }
    // Rows that matched are not part of the diff.
    assert!(!stdout.contains(r#""seq":4"#), "{report}");
    assert!(stderr.contains("2 of 2 steps failed"), "{report}");
}
