//! The JavaScript/TypeScript SDK end to end: `plugins/counter-js` (TypeScript) against the Rust
//! `plugins/counter` on the same input and checkpoints, build errors with file and line, a throw
//! in a handler failing its batch, and the cold start of a JS component.
//!
//! JS processors are built with `guest-sdk/js/build.mjs` (esbuild + componentize-js; the tools
//! come from `guest-sdk/js/setup.sh`), which caches components by content hash: a build of an
//! unchanged processor is a copy.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use statebox_engine::EngineError;
use statebox_runtime::Limits;
use statebox_tests::{EngineQuery, Rng, Scratch, component_cache, guests, statebox_bin};

/// The workspace root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests package lives in the workspace")
}

/// Where built JS components are cached, next to the compiled-component cache of this build.
fn js_cache() -> PathBuf {
    component_cache().with_file_name("statebox-test-js-components")
}

/// Builds a JS processor (a plugin folder or a source file) with `build.mjs`; returns the
/// component, or the build's standard error.
fn build(processor: &Path) -> Result<PathBuf, String> {
    let output = Command::new("node")
        .arg(root().join("guest-sdk/js/build.mjs"))
        .arg(processor)
        .arg("--cache-dir")
        .arg(js_cache())
        .output()
        .expect("run node: Node.js 20+ is needed, and guest-sdk/js/setup.sh installs the tools");
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let wasm = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(wasm.is_file(), "build.mjs printed no component: {stdout}");
    Ok(wasm)
}

/// The component of a JS plugin folder (one with a `package.json` and no `Cargo.toml`), for
/// the scenario runner; `None` if the folder is not one.
pub(crate) fn plugin_component(folder: &Path) -> Option<PathBuf> {
    if folder.join("Cargo.toml").exists() || !folder.join("package.json").is_file() {
        return None;
    }
    Some(build(folder).unwrap_or_else(|e| panic!("building {}:\n{e}", folder.display())))
}

/// `plugins/counter-js`, built.
fn counter_js() -> String {
    let folder = root().join("plugins/counter-js");
    plugin_component(&folder)
        .expect("plugins/counter-js is a JS plugin")
        .display()
        .to_string()
}

/// Input batches for the counters: keys of several shapes (strings, numbers, a missing
/// column), rows of any shape, some keys in some batches only.
fn batches() -> Vec<Vec<Value>> {
    let mut rng = Rng::new(7);
    (0..4)
        .map(|b| {
            let mut rows = Vec::new();
            for i in 0..60 {
                let user = format!("u{}", rng.below(12));
                let row = match i % 4 {
                    0 => json!({"user": user, "n": rng.below(3)}),
                    1 => json!({"user": user, "n": rng.below(3), "tags": ["a", null], "b": b}),
                    2 => json!({"user": user, "n": 1.5, "nested": {"x": {"y": [1, 2]}}}),
                    _ => json!({"user": user, "n": "seven"}),
                };
                rows.push(row);
            }
            rows
        })
        .collect()
}

/// Rows in a canonical order, to compare multisets.
fn sorted(mut rows: Vec<Value>) -> Vec<Value> {
    rows.sort_by_key(Value::to_string);
    rows
}

#[test]
fn counter_js_emits_what_the_rust_counter_emits() {
    let js = counter_js();
    for key in ["user", "user,n", "n"] {
        let mut rust_query = EngineQuery::open(guests::COUNTER, key, 3, Limits::default());
        let mut js_query = EngineQuery::open(&js, key, 3, Limits::default());
        for (i, batch) in batches().iter().enumerate() {
            let expected = sorted(rust_query.batch(batch));
            assert!(!expected.is_empty());
            let emitted = sorted(js_query.batch(batch));
            assert_eq!(emitted, expected, "key {key}, batch {i}");
        }
        // A restart reopens the same state.
        js_query.reopen();
        rust_query.reopen();
        let batch = &batches()[0];
        assert_eq!(
            sorted(js_query.batch(batch)),
            sorted(rust_query.batch(batch)),
            "key {key}, after a restart"
        );
    }
}

/// `statebox state read` of one variable, as rows in a canonical order.
fn state_rows(checkpoint: &Path, var: &str) -> Vec<Value> {
    let output = Command::new(statebox_bin())
        .args([
            "state",
            "read",
            "--format",
            "jsonl",
            "--var",
            var,
            "--checkpoint",
        ])
        .arg(checkpoint)
        .output()
        .expect("spawn statebox");
    assert!(
        output.status.success(),
        "state read {var}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    sorted(statebox_tests::parse_jsonl(&output.stdout))
}

#[test]
fn js_and_rust_counters_continue_each_others_checkpoint() {
    let js = counter_js();
    let swapped = Scratch::new();
    let rust_only = Scratch::new();
    for (i, batch) in batches().iter().enumerate() {
        // Rust, JS, Rust, JS on one checkpoint; Rust only on the other.
        let processor = if i % 2 == 0 { guests::COUNTER } else { &js };
        let name = format!("{i:03}.jsonl");
        swapped.write_rows(&name, batch);
        swapped
            .run_cmd(processor, "user")
            .args(["--partitions", "2"])
            .run()
            .expect_ok();
        rust_only.write_rows(&name, batch);
        rust_only
            .run_cmd(guests::COUNTER, "user")
            .args(["--partitions", "2"])
            .run()
            .expect_ok();
    }
    assert_eq!(
        sorted(swapped.output_rows()),
        sorted(rust_only.output_rows())
    );
    for var in ["count", "batchCounts", "stats"] {
        let state = state_rows(&swapped.checkpoint(), var);
        assert!(!state.is_empty(), "{var} has state");
        assert_eq!(state, state_rows(&rust_only.checkpoint(), var), "{var}");
    }
}

/// A JS plugin folder with one source file, in a temporary directory.
fn plugin(file: &str, source: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("statebox-js-test-")
        .tempdir()
        .expect("create a temporary directory");
    let folder = dir.path().join("plugin");
    std::fs::create_dir(&folder).expect("create the plugin folder");
    std::fs::write(
        folder.join("package.json"),
        r#"{"private": true, "type": "module"}"#,
    )
    .expect("write package.json");
    std::fs::write(folder.join(file), source).expect("write the processor");
    (dir, folder)
}

#[test]
fn a_syntax_error_is_reported_with_file_and_line_at_build_time() {
    let source = "\
import { StatefulProcessor, type Handle } from '@statebox/sdk';

export default class Broken extends StatefulProcessor {
  static outputSchema = 'n long';
  init(handle: Handle) {
    const n = 1 +;
  }
  handleInputRows() {}
}
";
    let (_dir, folder) = plugin("processor.ts", source);
    let err = build(&folder).expect_err("the build fails");
    assert!(err.contains("processor.ts:6:18: error:"), "{err}");
    assert!(err.contains("const n = 1 +;"), "{err}");

    // `statebox run` builds the folder the same way and stops before touching anything.
    let scratch = Scratch::new();
    scratch.write_rows("1.jsonl", &[json!({"user": "a"})]);
    let outcome = scratch
        .run_cmd(folder.to_str().expect("a UTF-8 path"), "user")
        .run();
    assert_eq!(outcome.code, Some(1), "{}", outcome.stderr);
    assert!(
        outcome.stderr.contains("processor.ts:6:18: error:"),
        "{}",
        outcome.stderr
    );
    assert!(!scratch.checkpoint().exists());
}

#[test]
fn a_throw_at_module_top_level_fails_the_build_with_the_js_stack() {
    let source = "\
const limits = JSON.parse('{\"max\": 3}');
function check() {
  if (limits.max < 5) throw new RangeError(`max is ${limits.max}`);
}
check();
export default { processorName: 'top', outputSchema: 'n long', init() {}, handleInputRows() {} };
";
    let (_dir, folder) = plugin("processor.js", source);
    let err = build(&folder).expect_err("the build fails");
    assert!(err.contains("RangeError: max is 3"), "{err}");
    assert!(err.contains("check@processor.js:3:"), "{err}");
}

#[test]
fn a_missing_output_schema_or_default_export_fails_the_build() {
    let (_dir, folder) = plugin(
        "processor.js",
        "export default class NoSchema { init() {} handleInputRows() {} }\n",
    );
    let err = build(&folder).expect_err("the build fails");
    assert!(err.contains("must declare its output schema"), "{err}");

    let (_dir, folder) = plugin(
        "processor.js",
        "export class P { static outputSchema = 'n long'; init() {} handleInputRows() {} }\n",
    );
    let err = build(&folder).expect_err("the build fails");
    assert!(err.contains("has no default export"), "{err}");
}

/// Throws in `handleInputRows` for key `bad`, after writing state; in `init` when the time mode
/// is processing time.
const THROWER: &str = "\
export default class Thrower {
  static processorName = 'thrower';
  static outputSchema = 'user string';

  init(handle) {
    if (handle.timeMode === 'processing-time') refuse(handle.timeMode);
    this.seen = handle.getValueState('seen', 'long');
  }

  handleInputRows([user], rows) {
    this.seen.update(rows.length);
    if (user === 'bad') {
      return countFor(user);
    }
    return rows.map(() => ({ user }));
  }
}

function countFor(user) {
  throw new RangeError(`cannot count ${user}`);
}

function refuse(mode) {
  throw new Error(`no ${mode} here`);
}
";

#[test]
fn a_throw_in_a_handler_fails_the_batch_naming_the_key_and_the_js_error() {
    let (_dir, folder) = plugin("processor.js", THROWER);
    let wasm = build(&folder).expect("the thrower builds");
    let scratch = Scratch::new();
    scratch.write_rows(
        "1.jsonl",
        &[
            json!({"user": "a"}),
            json!({"user": "bad"}),
            json!({"user": "a"}),
        ],
    );
    let error = scratch
        .run_cmd(wasm.to_str().expect("a UTF-8 path"), "user")
        .run()
        .expect_error(&[
            "processor `thrower` failed in handle-input-rows",
            r#"["bad"]"#,
            "RangeError: cannot count bad",
            "at countFor (processor.js:20:9)",
            "at handleInputRows (processor.js:13:14)",
        ]);
    // The glue's own frames are not shown.
    assert!(!error.contains("export.js"), "{error}");
    // Nothing of the failed batch is visible.
    assert!(scratch.output_rows().is_empty());

    // Once the input is fixed, the batch runs from the committed state.
    scratch.write_text("1.jsonl", "{\"user\":\"a\"}\n{\"user\":\"a\"}\n");
    scratch
        .run_cmd(wasm.to_str().expect("a UTF-8 path"), "user")
        .run()
        .expect_ok();
    assert_eq!(scratch.output_rows(), vec![json!({"user": "a"}); 2]);
}

#[test]
fn a_throw_in_init_fails_with_the_js_stack() {
    let (_dir, folder) = plugin("processor.js", THROWER);
    let wasm = build(&folder).expect("the thrower builds");
    let scratch = Scratch::new();
    scratch.write_rows("1.jsonl", &[json!({"user": "a"})]);
    scratch
        .run_cmd(wasm.to_str().expect("a UTF-8 path"), "user")
        .args(["--time-mode", "processing-time"])
        .run()
        .expect_error(&[
            "processor `thrower` failed in init: Error: no processing-time here",
            "Error: no processing-time here",
            "at refuse (processor.js:24:9)",
            "at init (processor.js:6:",
        ]);
    assert!(scratch.output_rows().is_empty());
}

/// Time from loading a component to the end of its first batch (one key, one row, one
/// partition): instantiation, `init`, the first call and the commit.
fn first_batch(wasm: &str) -> (Duration, Duration, Duration) {
    let started = Instant::now();
    let mut query = EngineQuery::open(wasm, "user", 1, Limits::default());
    let opened = started.elapsed();
    let started = Instant::now();
    let rows = query.batch(&[json!({"user": "u1"})]);
    let first = started.elapsed();
    assert_eq!(rows, vec![json!({"key": "u1", "count": 1})]);
    let started = Instant::now();
    query.batch(&[json!({"user": "u1"})]);
    (opened, first, started.elapsed())
}

#[test]
fn cold_start_of_a_js_component_is_measured() {
    let js = counter_js();
    let size = std::fs::metadata(&js).expect("the component exists").len();
    // Warm the compiled-component cache, as a second run of a query would find it.
    first_batch(&js);
    first_batch(guests::COUNTER);
    let (js_open, js_first, js_next) = first_batch(&js);
    let (rust_open, rust_first, rust_next) = first_batch(guests::COUNTER);
    eprintln!(
        "counter-js: component {:.1} MiB; open {js_open:?}, first batch {js_first:?}, next \
         batch {js_next:?}\ncounter (Rust): open {rust_open:?}, first batch {rust_first:?}, \
         next batch {rust_next:?}",
        size as f64 / 1048576.0
    );
    // Pre-initialised by wizer, the engine starts from a snapshot: a first call is
    // milliseconds, not the seconds of evaluating the engine and the module from scratch.
    assert!(
        js_first < Duration::from_secs(2),
        "first batch {js_first:?}"
    );
}

/// The whole SDK API from TypeScript (`guest-sdk/js/tests/state-ops`), step by step under a
/// manual clock: value, list (lazy, paged) and map state, TTL, timers, initial state, the
/// host's state errors as `StateError`s, a restart, and an async handler that rejects.
#[test]
fn the_sdk_api_end_to_end() {
    let wasm = build(&root().join("guest-sdk/js/tests/state-ops")).expect("state-ops builds");
    let row = |op: &str, result: &str| json!({"user": "a", "op": op, "result": result});
    let op = |op: &str| json!({"user": "a", "op": op});
    let op_n = |op: &str, n: u32| json!({"user": "a", "op": op, "n": n});
    let empty = r#"{"total":null,"exists":[false,false,false],"items":0,"first":null,"seen":[],"keys":[],"values":[],"contains":[false,false],"recent":null}"#;
    let scenario = json!({
        "processor": wasm,
        "key": ["user"],
        "time_mode": "processing-time",
        "output_mode": "append",
        "partitions": 2,
        "initial_state": [{"user": "z", "total": 40}],
        "steps": [
            {"at_ms": 1000, "batch": [
                op_n("add", 1), op_n("add", 2), op_n("add", 1), op("read"), op_n("many", 600),
                op("sum"), op("bad-value"), op("empty-put"), op_n("timer", 500),
                {"user": "z", "op": "read"},
            ], "expect": [
                row("read", r#"{"total":4,"exists":[true,true,true],"items":3,"first":{"n":1},"seen":[["k1",2],["k2",1]],"keys":["k1","k2"],"values":[2,1],"contains":[true,false],"recent":"1@1000"}"#),
                row("sum", "179704"),
                row("bad-value", r#"["schema-mismatch",true]"#),
                row("empty-put", r#""empty-list""#),
                row("timer", "[1500]"),
                {"user": "z", "op": "read", "result": r#"{"total":40,"exists":[true,false,false],"items":0,"first":null,"seen":[],"keys":[],"values":[],"contains":[false,false],"recent":null}"#},
            ]},
            {"restart": true},
            {"at_ms": 2000, "batch": [op("read"), op("put"), op("sum"), op("clear"), op("read")],
             "expect": [
                row("read", r#"{"total":4,"exists":[true,true,true],"items":603,"first":{"n":1},"seen":[["k1",2],["k2",1]],"keys":["k1","k2"],"values":[2,1],"contains":[true,false],"recent":null}"#),
                row("sum", "300"),
                row("read", empty),
                row("fired", "[1500,2000,[1500]]"),
            ]},
            {"at_ms": 3000, "batch": [op("throw-in-promise")],
             "expect_error": "TypeError: async failure\n    at handleInputRows (processor.ts:"},
        ]
    });
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let file = dir.path().join("state-ops.json");
    std::fs::write(&file, scenario.to_string()).expect("write the scenario");
    let output = Command::new(statebox_bin())
        .arg("test")
        .arg(&file)
        .env("STATEBOX_CACHE_DIR", component_cache())
        .env_remove("STATEBOX_LOG")
        .output()
        .expect("spawn statebox");
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The SDK's native test harness (`guest-sdk/js/testing.mjs`) and the unit tests written with
/// it: counter-js's, and the harness's own against the host's expectations.
#[test]
fn node_unit_tests_pass() {
    let output = Command::new("node")
        .arg("--test")
        .arg(root().join("guest-sdk/js/tests"))
        .arg(root().join("plugins/counter-js"))
        .output()
        .expect("run node: Node.js 20+ is needed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("# fail 0"), "{stdout}");
}

/// The `batch-ops` test processor (`guest-sdk/js/tests/batch-ops`): a `long` key `k`, one
/// operation per row.
fn batch_ops() -> String {
    build(&root().join("guest-sdk/js/tests/batch-ops"))
        .expect("batch-ops builds")
        .display()
        .to_string()
}

/// The longs that do not fit a JS number: 2^53 + 1, i64::MIN and i64::MAX.
const BIG: [i64; 3] = [9_007_199_254_740_993, i64::MIN, i64::MAX];

fn ops_row(k: i64, op: &str, n: Option<i64>) -> Value {
    match n {
        Some(n) => json!({"k": k, "op": op, "n": n}),
        None => json!({"k": k, "op": op}),
    }
}

/// Output rows of key `k` and operation `op`, as `(n, result)`.
fn of(rows: &[Value], k: i64, op: &str) -> Vec<(Value, String)> {
    rows.iter()
        .filter(|r| r["k"] == json!(k) && r["op"] == op)
        .map(|r| {
            (
                r["n"].clone(),
                r["result"].as_str().expect("a result").to_owned(),
            )
        })
        .collect()
}

/// Longs beyond 2^53 reach a JS processor exactly (as `bigint`s) in keys and rows, come back
/// exactly from value, list and map state (keys and values), and are emitted exactly; safe
/// integers stay numbers. Many keys per batch go through the batched export.
#[test]
fn js_longs_beyond_2_53_round_trip_exactly() {
    let wasm = batch_ops();
    let mut query = EngineQuery::open(&wasm, "k", 2, Limits::default());
    let mut rows = Vec::new();
    for &k in &BIG {
        for &n in &BIG {
            rows.push(ops_row(k, "store", Some(n)));
        }
    }
    // Enough other keys that a call carries many of them.
    for k in 0..300 {
        rows.push(ops_row(k, "store", Some(k * 3)));
    }
    rows.push(ops_row(5, "store", Some(9_007_199_254_740_991)));
    let out = query.batch(&rows);
    assert_eq!(out.len(), rows.len());
    for &k in &BIG {
        let expected: Vec<_> = BIG
            .iter()
            .map(|&n| (json!(n), "bigint".to_owned()))
            .collect();
        assert_eq!(of(&out, k, "store"), expected, "key {k}");
    }
    assert_eq!(
        of(&out, 5, "store"),
        vec![
            (json!(15), "number".to_owned()),
            (json!(9_007_199_254_740_991i64), "number".to_owned())
        ]
    );

    // Read back in the next batch, after a restart (nothing cached in the instance).
    query.reopen();
    let read: Vec<Value> = BIG.iter().map(|&k| ops_row(k, "read", None)).collect();
    let out = query.batch(&read);
    let mut by_canonical = BIG.to_vec();
    by_canonical.sort_by_key(|n| n.to_string());
    for &k in &BIG {
        let bigints = |ns: &[i64]| -> Vec<(Value, String)> {
            ns.iter()
                .map(|&n| (json!(n), "bigint".to_owned()))
                .collect()
        };
        assert_eq!(of(&out, k, "value"), bigints(&[i64::MAX]), "key {k}");
        assert_eq!(of(&out, k, "list"), bigints(&BIG), "key {k}");
        let mut map_keys = of(&out, k, "map-key");
        map_keys.sort_by_key(|(n, _)| n.as_i64());
        let mut sorted_big = BIG.to_vec();
        sorted_big.sort();
        assert_eq!(map_keys, bigints(&sorted_big), "key {k}");
        let mut map_values = of(&out, k, "map-value");
        map_values.sort_by_key(|(n, _)| n.as_i64());
        assert_eq!(map_values, bigints(&sorted_big), "key {k}");
    }
    // The state as the host stored it: exact.
    let state = state_rows(&query.scratch.checkpoint(), "last");
    for &k in &BIG {
        let row = state
            .iter()
            .find(|r| r["key"] == json!({"k": k}))
            .unwrap_or_else(|| panic!("no state row for key {k}: {state:?}"));
        assert_eq!(row["value"], json!(i64::MAX), "{row}");
    }
}

/// `handle.getQueryInfo()`: the query id stays across restarts, the run id changes with each
/// start, the batch id is the batch in progress.
#[test]
fn js_get_query_info() {
    let wasm = batch_ops();
    let mut query = EngineQuery::open(&wasm, "k", 2, Limits::default());
    let info = |query: &mut EngineQuery| -> (Value, Value) {
        let out = query.batch(&[ops_row(1, "info", None), ops_row(2, "info", None)]);
        let one = of(&out, 1, "info");
        let two = of(&out, 2, "info");
        assert_eq!(one.len(), 1, "{out:?}");
        assert_eq!(one, two, "every key sees the same query info");
        let (n, result) = one.into_iter().next().expect("one row");
        let result: Value = serde_json::from_str(&result).expect("JSON");
        assert_eq!(result["batchId"], n);
        assert_eq!(result["type"], "number");
        (n, result)
    };
    let (b0, first) = info(&mut query);
    let (b1, second) = info(&mut query);
    assert_eq!(
        b1.as_u64(),
        b0.as_u64().map(|b| b + 1),
        "consecutive batches"
    );
    assert_eq!(first["queryId"], second["queryId"]);
    assert_eq!(first["runId"], second["runId"]);
    assert!(
        first["queryId"].as_str().is_some_and(|s| !s.is_empty()),
        "{first}"
    );
    query.reopen();
    let (b2, third) = info(&mut query);
    assert_eq!(b2.as_u64(), b1.as_u64().map(|b| b + 1));
    assert_eq!(
        third["queryId"], first["queryId"],
        "the query id survives a restart"
    );
    assert_ne!(third["runId"], first["runId"], "a restart is a new run");
}

/// A throw for one key of a batched call fails the batch naming that key and the JS error;
/// nothing of the batch is visible.
#[test]
fn js_a_failing_key_in_a_batched_call_is_named() {
    let wasm = batch_ops();
    let mut query = EngineQuery::open(&wasm, "k", 1, Limits::default());
    let mut rows: Vec<Value> = (0..200).map(|k| ops_row(k, "store", Some(k))).collect();
    rows.insert(120, ops_row(i64::MIN, "fail", None));
    let err = match query.try_batch(&rows) {
        Err(EngineError::Processor(e)) => {
            assert_eq!(e.processor, "js-batch-ops");
            assert_eq!(e.key.as_deref(), Some("[-9223372036854775808]"), "{e}");
            e.to_string()
        }
        Err(e) => panic!("expected a processor error, got {e}"),
        Ok(_) => panic!("the batch should fail"),
    };
    assert!(err.contains("[-9223372036854775808]"), "{err}");
    assert!(
        err.contains("RangeError: cannot handle key -9223372036854775808"),
        "{err}"
    );
    assert!(err.contains("processor.ts:"), "{err}");
    assert!(query.scratch.output_rows().is_empty());
    // Without the failing row the batch runs.
    rows.remove(120);
    query.rewrite_last(&rows);
    let out = query.run_available().expect("the batch runs").1;
    assert_eq!(out.len(), 200);
}

/// Abandoning an iteration (`break`, a throw) frees the host's iterator at once: the next
/// iterator gets the same handle. Iterating again afterwards works; an iterator kept past its
/// call is freed when the call ends and refused with `invalid-use`.
#[test]
fn js_breaking_out_of_an_iteration_frees_it() {
    let wasm = batch_ops();
    let mut query = EngineQuery::open(&wasm, "k", 1, Limits::default());
    query.batch(&[
        ops_row(1, "store", Some(i64::MAX)),
        json!({"k": 1, "op": "many", "m": 600}),
        ops_row(2, "store", Some(1)),
    ]);
    let out = query.batch(&[
        json!({"k": 1, "op": "break"}),
        json!({"k": 2, "op": "break"}),
    ]);
    let (count, result) = of(&out, 1, "break")
        .into_iter()
        .next()
        .expect("a break row");
    assert_eq!(count, json!(601));
    let result: Value = serde_json::from_str(&result).expect("JSON");
    let max = i64::MAX.to_string();
    assert_eq!(
        result["firsts"],
        json!([[max, "0"], [max, "0"], [max, "0"]]),
        "{result}"
    );
    assert_eq!(result["mapSize"], 1);
    assert_eq!(result["sameHandle"], true, "{result}");
    let (count, _) = of(&out, 2, "break")
        .into_iter()
        .next()
        .expect("a break row");
    assert_eq!(count, json!(1));

    // A half-read iterator kept past its call (never finished or abandoned through the
    // iterator protocol) is freed when the call ends: the next call's first iterator reuses
    // its handle, and using it throws `invalid-use`.
    let out = query.batch(&[json!({"k": 1, "op": "stash"})]);
    let (first, stashed_handle) = of(&out, 1, "stash")
        .into_iter()
        .next()
        .expect("a stash row");
    assert_eq!(first, json!(i64::MAX));
    let out = query.batch(&[
        json!({"k": 1, "op": "use-stashed"}),
        json!({"k": 1, "op": "break"}),
    ]);
    assert_eq!(of(&out, 1, "use-stashed")[0].1, "invalid-use");
    let (_, result) = of(&out, 1, "break")
        .into_iter()
        .next()
        .expect("a break row");
    let result: Value = serde_json::from_str(&result).expect("JSON");
    assert_eq!(result["handles"][0], json!(stashed_handle), "{result}");
}
