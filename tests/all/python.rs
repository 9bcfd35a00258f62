//! The Python SDK (`guest-sdk/python`) through `statebox build-python`: errors in the user's
//! Python reported with file and line at build time, or with the Python traceback at `init`
//! and in handlers; and the cold start of a Python component (size, first call).
//!
//! The example Python plugins and the sync/async swap on one checkpoint are scenario files
//! (`tests/scenarios/*-py.json`, run by `scenarios.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;
use statebox_runtime::Limits;
use statebox_tests::{EngineQuery, component_cache, guests, statebox_bin};

/// Python builds take seconds of CPU each; one at a time leaves the machine to the others.
static BUILDS: Mutex<()> = Mutex::new(());

/// `statebox build-python FILE -o OUT` (with the shared cache), serialised with other builds.
fn build_python(file: &Path, out: &Path) -> Output {
    timed_build_python(file, out).0
}

/// [`build_python`] and how long the build itself took (not waiting for other builds).
fn timed_build_python(file: &Path, out: &Path) -> (Output, Duration) {
    let _one = BUILDS.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let output = Command::new(statebox_bin())
        .arg("build-python")
        .arg(file)
        .arg("-o")
        .arg(out)
        .env("STATEBOX_CACHE_DIR", component_cache())
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox");
    (output, started.elapsed())
}

fn text(output: &Output) -> String {
    format!(
        "exit status: {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Writes `source` as `processor.py` in a fresh directory and builds it; returns the
/// directory, the file's canonical path, and the build's output.
fn build_source(source: &str) -> (tempfile::TempDir, PathBuf, Output) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let file = dir.path().join("processor.py");
    std::fs::write(&file, source).expect("write processor.py");
    let file = file.canonicalize().expect("canonical path");
    let out = build_python(&file, &dir.path().join("processor.wasm"));
    (dir, file, out)
}

const HEADER: &str = "from pyspark.sql import Row\n\
from pyspark.sql.streaming import StatefulProcessor\n\
OUTPUT_SCHEMA = \"key string, count long\"\n";

#[track_caller]
fn assert_build_fails(source: &str, line: usize, fragments: &[&str]) {
    let (_dir, file, out) = build_source(source);
    let report = text(&out);
    assert!(!out.status.success(), "the build should fail:\n{report}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = format!("{}:{line}", file.display());
    let traceback_at = format!("File \"{}\", line {line}", file.display());
    assert!(
        stderr.contains(&at) || stderr.contains(&traceback_at),
        "the error should name {at}:\n{report}"
    );
    for fragment in fragments {
        assert!(stderr.contains(fragment), "missing `{fragment}`:\n{report}");
    }
}

#[test]
fn a_syntax_error_fails_the_build_with_file_and_line() {
    let source = format!(
        "{HEADER}class P(StatefulProcessor):\n    def init(self, handle):\n        x = (1,\n\n    def handleInputRows(self, key, rows, timerValues):\n        yield Row(key=key[0], count=1)\n"
    );
    assert_build_fails(&source, 6, &["SyntaxError"]);
}

#[test]
fn an_import_error_fails_the_build_with_file_and_line() {
    let source = format!("import numpy_is_not_in_the_sandbox\n{HEADER}");
    assert_build_fails(
        &source,
        1,
        &["ModuleNotFoundError", "numpy_is_not_in_the_sandbox"],
    );
}

#[test]
fn a_wrong_handler_signature_fails_the_build_with_file_and_line() {
    let source = format!(
        "{HEADER}class P(StatefulProcessor):\n    def init(self, handle):\n        pass\n\n    def handleInputRows(self, key, rows):\n        yield Row(key=key[0], count=1)\n"
    );
    assert_build_fails(
        &source,
        8,
        &[
            "invalid processor",
            "P.handleInputRows(self, key, rows) cannot be called as handleInputRows(self, key, rows, timerValues)",
        ],
    );
}

#[test]
fn a_snake_case_handler_fails_the_build_naming_pysparks_method() {
    let source = format!(
        "{HEADER}class P(StatefulProcessor):\n    def init(self, handle):\n        pass\n\n    def handleInputRows(self, key, rows, timerValues):\n        return []\n\n    def handle_expired_timer(self, key, timerValues, info):\n        return []\n"
    );
    assert_build_fails(
        &source,
        11,
        &[
            "P.handle_expired_timer is never called",
            "handleExpiredTimer",
        ],
    );
}

#[test]
fn async_methods_in_a_sync_processor_fail_the_build() {
    let source = format!(
        "{HEADER}class P(StatefulProcessor):\n    def init(self, handle):\n        pass\n\n    async def handleInputRows(self, key, rows, timerValues):\n        yield Row(key=key[0], count=1)\n"
    );
    assert_build_fails(&source, 8, &["AsyncStatefulProcessor"]);
}

#[test]
fn a_missing_output_schema_fails_the_build() {
    let source = "from pyspark.sql.streaming import StatefulProcessor\n\
class P(StatefulProcessor):\n    def init(self, handle):\n        pass\n\n    def handleInputRows(self, key, rows, timerValues):\n        return []\n";
    assert_build_fails(source, 1, &["no output schema", "--output-schema"]);
}

/// Runs `statebox run` on one batch of `rows` keyed by `key`; returns its standard error.
fn run_once(wasm: &Path, dir: &Path, rows: &[serde_json::Value]) -> Output {
    let input = dir.join("input");
    std::fs::create_dir_all(&input).expect("create input/");
    let lines: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(input.join("000001.jsonl"), lines).expect("write input");
    Command::new(statebox_bin())
        .arg("run")
        .arg("--processor")
        .arg(wasm)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(dir.join("out.jsonl"))
        .arg("--checkpoint")
        .arg(dir.join("checkpoint"))
        .args(["--key", "k"])
        .env("STATEBOX_CACHE_DIR", component_cache())
        .env_remove("STATEBOX_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox")
}

#[test]
fn an_error_in_init_reports_the_python_traceback() {
    let source = format!(
        "{HEADER}class P(StatefulProcessor):\n    def init(self, handle):\n        self.count = handle.getValueState('count', 'count long')\n        raise ValueError('no config for ' + 'this tenant')\n\n    def handleInputRows(self, key, rows, timerValues):\n        yield Row(key=key[0], count=1)\n"
    );
    let (dir, file, out) = build_source(&source);
    assert!(out.status.success(), "{}", text(&out));
    let run = run_once(
        &dir.path().join("processor.wasm"),
        dir.path(),
        &[json!({"k": "a"})],
    );
    let report = text(&run);
    assert!(!run.status.success(), "{report}");
    let stderr = String::from_utf8_lossy(&run.stderr);
    for fragment in [
        "failed in init".to_owned(),
        "ValueError: no config for this tenant".to_owned(),
        format!("File \"{}\", line 7, in init", file.display()),
        "raise ValueError('no config for ' + 'this tenant')".to_owned(),
    ] {
        assert!(
            stderr.contains(&fragment),
            "missing `{fragment}`:\n{report}"
        );
    }
}

#[test]
fn errors_in_handlers_report_the_python_traceback_and_state_errors_their_kind() {
    let source = format!(
        "{HEADER}class P(StatefulProcessor):\n    def init(self, handle):\n        self.items = handle.getListState('items', 'n long')\n\n    def handleInputRows(self, key, rows, timerValues):\n        if key[0] == 'empty':\n            self.items.put([])\n        total = 0\n        for row in rows:\n            total += row.n\n        yield Row(key=key[0], count=total)\n"
    );
    let (dir, file, out) = build_source(&source);
    assert!(out.status.success(), "{}", text(&out));
    let wasm = dir.path().join("processor.wasm");

    let run = run_once(&wasm, &dir.path().join("a"), &[json!({"k": "x", "n": "7"})]);
    let report = text(&run);
    assert!(!run.status.success(), "{report}");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("handleInputRows raised TypeError"),
        "{report}"
    );
    assert!(
        stderr.contains(&format!("File \"{}\", line 13", file.display())),
        "{report}"
    );

    let run = run_once(
        &wasm,
        &dir.path().join("b"),
        &[json!({"k": "empty", "n": 1})],
    );
    let report = text(&run);
    assert!(!run.status.success(), "{report}");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("StateError") && stderr.contains("(empty-list)"),
        "{report}"
    );

    let run = run_once(&wasm, &dir.path().join("c"), &[json!({"k": "x", "n": 2})]);
    assert!(run.status.success(), "{}", text(&run));
}

#[test]
fn an_unchanged_processor_is_not_rebuilt() {
    let source = format!(
        "{HEADER}class P(StatefulProcessor):\n    def init(self, handle):\n        pass\n\n    def handleInputRows(self, key, rows, timerValues):\n        yield Row(key=key[0], count=sum(1 for _ in rows))\n"
    );
    let (dir, file, out) = build_source(&source);
    assert!(out.status.success(), "{}", text(&out));
    let (again, took) = timed_build_python(&file, &dir.path().join("again.wasm"));
    assert!(again.status.success(), "{}", text(&again));
    assert!(took.as_secs_f64() < 2.0, "a cached build took {took:?}");
    assert_eq!(
        std::fs::read(dir.path().join("processor.wasm")).expect("read"),
        std::fs::read(dir.path().join("again.wasm")).expect("read")
    );
}

/// What a fresh instance of a component costs, with its compiled code in the cache:
/// `(load, first, warm)` in milliseconds — loading the compiled component, then opening a
/// query (one partition) and running its first batch of one row (instantiation, `init`, the
/// call, the commit), then a second batch for comparison.
fn start_up_ms(wasm: &str) -> (f64, f64, f64) {
    let started = Instant::now();
    statebox_tests::runtime(Limits::default())
        .load_file(Path::new(wasm))
        .expect("load the component");
    let load = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let mut q = EngineQuery::open(wasm, "key", 1, Limits::default());
    let out = q.batch(&[json!({"key": "a"})]);
    let first = started.elapsed().as_secs_f64() * 1e3;
    assert_eq!(out, vec![json!({"key": "a", "count": 1})]);
    let started = Instant::now();
    q.batch(&[json!({"key": "a"})]);
    let warm = started.elapsed().as_secs_f64() * 1e3;
    (load, first, warm)
}

#[test]
fn a_python_component_starts_in_milliseconds() {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let source = root.join("plugins/counter-py/processor.py");
    let wasm = dir.path().join("counter-py.wasm");
    let out = build_python(&source, &wasm);
    assert!(out.status.success(), "{}", text(&out));
    let stubbed = dir.path().join("counter-py-stub-wasi.wasm");
    let out = {
        let _one = BUILDS.lock().unwrap_or_else(|e| e.into_inner());
        Command::new(statebox_bin())
            .arg("build-python")
            .arg(&source)
            .arg("--stub-wasi")
            .arg("-o")
            .arg(&stubbed)
            .env("STATEBOX_CACHE_DIR", component_cache())
            .stdin(Stdio::null())
            .output()
            .expect("spawn statebox")
    };
    assert!(out.status.success(), "{}", text(&out));
    for (what, wasm) in [
        ("python counter", wasm.as_path()),
        ("python counter --stub-wasi", stubbed.as_path()),
        ("rust counter", Path::new(guests::COUNTER)),
    ] {
        let size = std::fs::metadata(wasm).expect("stat").len();
        let wasm = wasm.display().to_string();
        // The first load compiles the component into the cache; what is measured is every
        // start after that.
        start_up_ms(&wasm);
        let (load, first, warm) = start_up_ms(&wasm);
        println!(
            "{what}: component {:.1} MiB; load from cache {load:.1} ms; open + first batch \
             {first:.1} ms; next batch {warm:.1} ms",
            size as f64 / f64::from(1 << 20)
        );
        // Pre-initialisation means no interpreter start-up or imports at run time.
        assert!(
            first < 1000.0,
            "{what} took {first:.1} ms to its first output"
        );
    }
}

#[test]
fn the_sdks_python_unit_tests_pass() {
    // The SDK's pure-Python parts (types, DDL, Row, codec, async scheduler, signature checks)
    // under the machine's CPython.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let python = std::env::var_os("STATEBOX_PYTHON").unwrap_or_else(|| "python3".into());
    let out = Command::new(python)
        .args(["-m", "unittest", "discover", "-s"])
        .arg(root.join("guest-sdk/python/tests"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run python3");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\nOK"),
        "{}",
        text(&out)
    );
}
