//! The Python SDK (`guest-sdk/python`) through `statebox build-python`: errors in the user's
//! Python reported with file and line at build time, or with the Python traceback at `init`
//! and in handlers; the cold start of a Python component (size, first call); and the batched
//! export: an async processor's keys interleaving within one call with each key's state its
//! own, `getQueryInfo`, and a batched call's failure naming its key (or bad row's line). The
//! test processors are under `guest-sdk/python/tests/`.
//!
//! The example Python plugins and the sync/async swap on one checkpoint are scenario files
//! (`tests/scenarios/*-py.json`, run by `scenarios.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;
use statebox_runtime::Limits;
use statebox_tests::{EngineQuery, component_cache, guests, set_last_used, statebox_bin};

/// Python builds take seconds of CPU each; one at a time leaves the machine to the others.
static BUILDS: Mutex<()> = Mutex::new(());

/// `statebox build-python FILE -o OUT` (with the shared cache), serialised with other builds.
fn build_python(file: &Path, out: &Path) -> Output {
    timed_build_python(file, out).0
}

/// [`build_python`] and how long the build itself took (not waiting for other builds).
fn timed_build_python(file: &Path, out: &Path) -> (Output, Duration) {
    build_python_with(file, out, &component_cache(), &[])
}

/// `statebox build-python FILE [EXTRA…] -o OUT` with the cache in `cache`, serialised with
/// other builds; and how long the build itself took.
fn build_python_with(file: &Path, out: &Path, cache: &Path, extra: &[&str]) -> (Output, Duration) {
    let _one = BUILDS.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let output = build_python_command(file, out, cache, extra)
        .output()
        .expect("spawn statebox");
    (output, started.elapsed())
}

/// The command line of `statebox build-python FILE [EXTRA…] -o OUT` with the cache in
/// `cache`.
fn build_python_command(file: &Path, out: &Path, cache: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(statebox_bin());
    cmd.arg("build-python")
        .arg(file)
        .args(extra)
        .arg("-o")
        .arg(out)
        .env("STATEBOX_CACHE_DIR", cache)
        .stdin(Stdio::null());
    cmd
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

/// Two builds of the same processor at once, into an empty cache: one builds, the other
/// waits for it and takes its component.
#[test]
fn concurrent_builds_of_a_processor_build_it_once() {
    let source = format!(
        "{HEADER}class P(StatefulProcessor):\n    def init(self, handle):\n        pass\n\n    def handleInputRows(self, key, rows, timerValues):\n        yield Row(key=key[0], count=7)\n"
    );
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let file = dir.path().join("processor.py");
    std::fs::write(&file, source).expect("write processor.py");
    let cache = dir.path().join("cache");
    let _one = BUILDS.lock().unwrap_or_else(|e| e.into_inner());
    let builds: Vec<_> = (0..2)
        .map(|n| {
            build_python_command(&file, &dir.path().join(format!("{n}.wasm")), &cache, &[])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn statebox")
        })
        .collect();
    let outputs: Vec<Output> = builds
        .into_iter()
        .map(|b| b.wait_with_output().expect("wait for statebox"))
        .collect();
    for out in &outputs {
        assert!(out.status.success(), "{}", text(out));
    }
    let built = outputs
        .iter()
        .filter(|out| String::from_utf8_lossy(&out.stderr).contains("building Python processor"))
        .count();
    assert_eq!(built, 1, "{}\n{}", text(&outputs[0]), text(&outputs[1]));
    assert_eq!(
        std::fs::read(dir.path().join("0.wasm")).expect("read"),
        std::fs::read(dir.path().join("1.wasm")).expect("read")
    );
    let cached: Vec<String> = std::fs::read_dir(cache.join("python"))
        .expect("read the cache")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert!(
        cached.len() == 1 && cached[0].ends_with(".wasm"),
        "one component and no lock left: {cached:?}"
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
    let (out, _) = build_python_with(&source, &stubbed, &component_cache(), &["--stub-wasi"]);
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

/// Builds the test processor `guest-sdk/python/tests/<name>/processor.py` into a component
/// in `dir`; returns the component's path.
fn build_test_processor(name: &str, dir: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let source = root.join(format!("guest-sdk/python/tests/{name}/processor.py"));
    let wasm = dir.join(format!("{name}.wasm"));
    let out = build_python(&source, &wasm);
    assert!(out.status.success(), "{}", text(&out));
    wasm.display().to_string()
}

/// The output rows by their `key` column (`field`), panicking on a duplicate.
fn by_key<'a>(
    rows: &'a [serde_json::Value],
    field: &str,
) -> std::collections::BTreeMap<String, &'a serde_json::Value> {
    let mut out = std::collections::BTreeMap::new();
    for row in rows {
        let key = row[field].as_str().expect("a string key").to_owned();
        assert!(
            out.insert(key, row).is_none(),
            "two rows for one key: {rows:?}"
        );
    }
    out
}

#[test]
fn an_async_processors_keys_interleave_in_a_batch_and_keep_their_own_state() {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let wasm = build_test_processor("async-interleave-py", dir.path());
    // One partition: every key of a batch goes to the processor in one batched call.
    let mut q = EngineQuery::open(&wasm, "k", 1, Limits::default());
    let keys = ["a", "b", "c", "d", "e"];
    let mut input = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let n = i as i64 + 1;
        for _ in 0..n {
            input.push(json!({"k": key, "n": n}));
        }
    }
    for round in 1..=2i64 {
        let out = q.batch(&input);
        let rows = by_key(&out, "key");
        assert_eq!(rows.len(), keys.len(), "{out:?}");
        for (i, key) in keys.iter().enumerate() {
            let row = rows[*key];
            // Key i has i + 1 rows of n = i + 1 per batch.
            let n = (i as i64 + 1) * (i as i64 + 1);
            assert_eq!(row["total"], json!(round * n), "{key}: {row}");
            assert_eq!(
                row["seen"],
                json!(vec![*key; round as usize].join(",")),
                "{key}: {row}"
            );
            assert_eq!(
                row["parts"],
                json!(format!("a={},b={}", round * n, 2 * round * n)),
                "{key}: {row}"
            );
        }
        // Every handler started before any handler finished: the keys interleaved.
        let last_start = out.iter().map(|r| r["first"].as_i64().unwrap()).max();
        let first_end = out.iter().map(|r| r["last"].as_i64().unwrap()).min();
        assert!(
            last_start < first_end,
            "the keys' handlers ran one after another, not interleaved: {out:?}"
        );
    }
}

#[test]
fn get_query_info_names_the_query_across_restarts_and_the_batch() {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let wasm = build_test_processor("query-info-py", dir.path());
    let mut q = EngineQuery::open(&wasm, "k", 2, Limits::default());
    let input = [json!({"k": "a"}), json!({"k": "b"}), json!({"k": "c"})];
    let mut seen = Vec::new();
    for restart in [false, false, true] {
        if restart {
            q.reopen();
        }
        let (reports, out) = q.try_batch(&input).expect("batch");
        assert_eq!(reports.len(), 1);
        let batch_id = reports[0].commit.batch_id;
        assert_eq!(out.len(), input.len(), "{out:?}");
        let query_id = out[0]["query_id"].as_str().expect("a query id").to_owned();
        let run_id = out[0]["run_id"].as_str().expect("a run id").to_owned();
        assert!(!query_id.is_empty() && !run_id.is_empty(), "{out:?}");
        for row in &out {
            assert_eq!(row["batch_id"], json!(batch_id), "{row}");
            assert_eq!(row["query_id"], json!(query_id), "{row}");
            assert_eq!(row["init_query_id"], json!(query_id), "{row}");
            assert_eq!(row["run_id"], json!(run_id), "{row}");
        }
        seen.push((batch_id, query_id, run_id));
    }
    let (b0, q0, r0) = &seen[0];
    let (b1, q1, r1) = &seen[1];
    let (b2, q2, r2) = &seen[2];
    assert_eq!((*b1, *b2), (b0 + 1, b0 + 2), "{seen:?}");
    assert!(q0 == q1 && q1 == q2, "the query id changed: {seen:?}");
    assert_eq!(r0, r1, "one run, one run id: {seen:?}");
    assert_ne!(r1, r2, "a restart is a new run: {seen:?}");
}

#[test]
fn a_failing_key_of_a_batched_call_is_named_and_bad_rows_keep_their_line() {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let wasm = build_test_processor("batch-errors-py", dir.path());

    // `boom` is neither the first nor the last key of the one batched call.
    let mut q = EngineQuery::open(&wasm, "k", 1, Limits::default());
    let input = [
        json!({"k": "a", "n": 1}),
        json!({"k": "b", "n": 1}),
        json!({"k": "boom", "n": 1}),
        json!({"k": "c", "n": 1}),
    ];
    let err = q
        .try_batch(&input)
        .expect_err("the boom key fails")
        .to_string();
    assert!(
        err.contains("for key") && err.contains("boom") && err.contains("exploded"),
        "the error should name the key boom: {err}"
    );
    assert!(
        err.contains("RuntimeError") && err.contains("batch-errors-py/processor.py\", line 27"),
        "the error should carry the Python traceback: {err}"
    );
    assert!(
        q.scratch.output_rows().is_empty(),
        "nothing of a failed batch is visible"
    );

    // A bad row of the second key (its third row): the error names its file and line.
    let mut q = EngineQuery::open(&wasm, "k", 1, Limits::default());
    let input = [
        json!({"k": "a", "n": 1}),
        json!({"k": "b", "n": 1}),
        json!({"k": "b", "n": 2}),
        json!({"k": "c", "n": 1}),
        json!({"k": "b", "n": -5}),
        json!({"k": "d", "n": 1}),
    ];
    let err = q
        .try_batch(&input)
        .expect_err("the bad row fails")
        .to_string();
    assert!(
        err.contains("000001.jsonl:5:") && err.contains("n must not be negative, got -5"),
        "the error should name the bad row's file and line: {err}"
    );
}

/// The cache of Python builds stays within its bound: a build into a full cache removes the
/// least recently used builds.
#[test]
fn a_build_into_a_full_cache_removes_the_least_recently_used_builds() {
    let scratch = tempfile::tempdir().expect("create a temporary directory");
    let cache = scratch.path().join("cache");
    let builds = cache.join("python");
    std::fs::create_dir_all(&builds).unwrap();
    // An old build, 2 GiB on its own (sparse: no disk), the cache's whole bound.
    let stale = builds.join("old-0123.wasm");
    std::fs::File::create(&stale)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    set_last_used(&stale, Duration::from_secs(86_400));
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/counter-py/processor.py");
    let (out, _) = build_python_with(&source, &scratch.path().join("counter.wasm"), &cache, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let left: Vec<String> = std::fs::read_dir(&builds)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".wasm"))
        .collect();
    assert!(!stale.exists(), "the old build stayed: {left:?}");
    assert!(
        left.len() == 1 && left[0].starts_with("processor-"),
        "the new build is not in the cache: {left:?}"
    );
}
