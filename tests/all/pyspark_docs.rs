//! A PySpark user's files, unchanged, on Statebox (issue 16): the documentation-style
//! processors of `tests/fixtures/pyspark/` (sync and async, StructType / DDL schemas,
//! module-level output schemas, every Spark type through input, state and output) give
//! what PySpark 4.3 gave on the same input (`expected.jsonl`, written by
//! `guest-sdk/python/spark_compare.py --write-expected`; CI has no PySpark); a whole job
//! script runs with `statebox run job.py`; and what the sandbox cannot run fails at build
//! time with the file, the line and what to do.
//!
//! (Long because it holds one test per fixture and per unsupported construct.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use statebox_tests::{component_cache, parse_jsonl, statebox_bin};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pyspark")
}

fn text(output: &Output) -> String {
    format!(
        "exit status: {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Equal as JSON, numbers compared by value (`1.0` is `1`), as the comparison with
/// PySpark's output is field by field.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Whether two batches hold the same rows, in any order.
fn same_rows(expected: &[Value], got: &[Value]) -> bool {
    let mut left: Vec<&Value> = got.iter().collect();
    for row in expected {
        match left.iter().position(|g| same(row, g)) {
            Some(i) => {
                left.swap_remove(i);
            }
            None => return false,
        }
    }
    left.is_empty()
}

/// PySpark's output per batch, from a fixture's `expected.jsonl`.
fn expected_batches(file: &Path) -> BTreeMap<u64, Vec<Value>> {
    let mut out: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
    let text = std::fs::read_to_string(file).expect("read expected.jsonl");
    for item in parse_jsonl(text.as_bytes()) {
        let batch = item["batch"].as_u64().expect("a batch number");
        out.entry(batch).or_default().push(item["row"].clone());
    }
    out
}

/// Statebox's output per batch, sliced by the commit records' `output_rows`.
fn batches_of(progress: &[u8], output: &Path) -> BTreeMap<u64, Vec<Value>> {
    let rows = parse_jsonl(&std::fs::read(output).unwrap_or_default());
    let mut out = BTreeMap::new();
    let mut at = 0;
    let commits = String::from_utf8_lossy(progress);
    for (i, line) in commits.lines().filter(|l| l.starts_with('{')).enumerate() {
        let commit: Value = serde_json::from_str(line).expect("a commit record");
        let n = commit["output_rows"].as_u64().unwrap_or(0) as usize;
        out.insert(i as u64, rows[at..at + n].to_vec());
        at += n;
    }
    out
}

/// Runs fixture `name` (its `processor.py` over its input, one file per batch, with its
/// query's key and modes) and compares every batch with PySpark's output.
fn run_fixture(name: &str) {
    let dir = fixtures().join(name);
    let query: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("query.json")).expect("query"))
            .expect("query.json");
    let input = dir.join(query["input"].as_str().unwrap_or("input"));
    let expected = dir.join(query["expected"].as_str().unwrap_or("expected.jsonl"));
    let key: Vec<&str> = query["key"]
        .as_array()
        .expect("key columns")
        .iter()
        .map(|k| k.as_str().expect("a column"))
        .collect();
    let work = tempfile::tempdir().expect("create a temporary directory");
    let output = work.path().join("out.jsonl");
    let run = Command::new(statebox_bin())
        .arg("run")
        .arg("--processor")
        .arg(dir.join("processor.py"))
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .arg("--checkpoint")
        .arg(work.path().join("checkpoint"))
        .args(["--key", &key.join(",")])
        .args(["--time-mode", query["time_mode"].as_str().unwrap_or("none")])
        .args([
            "--output-mode",
            query["output_mode"].as_str().unwrap_or("update"),
        ])
        .arg("--progress-json")
        .env("STATEBOX_CACHE_DIR", component_cache())
        .env_remove("STATEBOX_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox");
    assert!(run.status.success(), "{}", text(&run));
    let got = batches_of(&run.stdout, &output);
    let want = expected_batches(&expected);
    let batches = std::fs::read_dir(&input).expect("input").count() as u64;
    for batch in 0..batches {
        let (w, g) = (
            want.get(&batch).cloned().unwrap_or_default(),
            got.get(&batch).cloned().unwrap_or_default(),
        );
        assert!(
            same_rows(&w, &g),
            "{name}: batch {batch} differs from PySpark's output\n  PySpark:  {w:?}\n  \
             Statebox: {g:?}"
        );
    }
}

#[test]
fn the_documentation_count_gives_pysparks_output() {
    run_fixture("count");
}

#[test]
fn the_async_documentation_count_runs_unchanged_and_gives_the_same_output() {
    run_fixture("count-async");
}

#[test]
fn ddl_schemas_with_value_list_and_map_state_give_pysparks_output() {
    run_fixture("session-ddl");
}

#[test]
fn every_spark_type_through_input_state_and_output_matches_pyspark_field_by_field() {
    run_fixture("all-types");
}

/// `statebox run job.py` in a folder holding the job's relative paths: the documentation
/// count job, whose output (in Spark's JSON sink folder) is the count fixture's.
#[test]
fn a_whole_pyspark_job_script_runs_with_statebox_run() {
    let work = tempfile::tempdir().expect("create a temporary directory");
    let input = work.path().join("input");
    std::fs::create_dir(&input).expect("create input/");
    for entry in std::fs::read_dir(fixtures().join("count/input")).expect("read input") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, input.join(path.file_name().expect("a file name"))).expect("copy");
    }
    let job = fixtures().join("job/job.py");
    let statebox = |extra: &[&str]| {
        Command::new(statebox_bin())
            .arg("run")
            .arg(&job)
            .args(extra)
            .current_dir(work.path())
            .env("STATEBOX_CACHE_DIR", component_cache())
            .env_remove("STATEBOX_LOG")
            .stdin(Stdio::null())
            .output()
            .expect("spawn statebox")
    };
    let plan = statebox(&["--print-plan"]);
    assert!(plan.status.success(), "{}", text(&plan));
    let plan = String::from_utf8_lossy(&plan.stdout).into_owned();
    for part in [
        "--input input",
        "--max-files-per-batch 1",
        "--key id",
        "--output-mode append",
        "--time-mode none",
        "--output output/part-00000-statebox.json",
        "--checkpoint checkpoint",
        "--trigger available-now",
    ] {
        assert!(plan.contains(part), "the plan lacks `{part}`: {plan}");
    }

    let run = statebox(&["--progress-json"]);
    assert!(run.status.success(), "{}", text(&run));
    let got = batches_of(
        &run.stdout,
        &work.path().join("output/part-00000-statebox.json"),
    );
    let want = expected_batches(&fixtures().join("count/expected.jsonl"));
    assert_eq!(got.len(), 3, "{}", text(&run));
    for (batch, rows) in &want {
        assert!(
            same_rows(rows, &got[batch]),
            "batch {batch}: PySpark {rows:?}, Statebox {:?}",
            got[batch]
        );
    }

    // Run again: the checkpoint says everything is done, as Spark's would.
    let again = statebox(&[]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("no new input"),
        "{}",
        text(&again)
    );
}

#[test]
fn an_unsupported_call_in_a_job_script_names_its_file_line_and_call() {
    let work = tempfile::tempdir().expect("create a temporary directory");
    let source = std::fs::read_to_string(fixtures().join("job/job.py")).expect("read job.py");
    let bad = source.replace(
        "    events.groupBy(\"id\")",
        "    events.select(\"id\").groupBy(\"id\")",
    );
    assert_ne!(bad, source);
    let line = bad
        .lines()
        .position(|l| l.contains("events.select"))
        .expect("the edited line")
        + 1;
    let job = work.path().join("job.py");
    std::fs::write(&job, bad).expect("write job.py");
    let run = Command::new(statebox_bin())
        .arg("run")
        .arg(&job)
        .current_dir(work.path())
        .env("STATEBOX_CACHE_DIR", component_cache())
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox");
    assert!(!run.status.success(), "{}", text(&run));
    let stderr = String::from_utf8_lossy(&run.stderr);
    let at = format!(
        "{}:{line}: DataFrame.select is not supported",
        job.canonicalize().unwrap().display()
    );
    assert!(stderr.contains(&at), "expected `{at}`:\n{}", text(&run));
}

/// Builds `source` as a processor file and returns the build's output and the file.
fn build(source: &str) -> (tempfile::TempDir, PathBuf, Output) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let file = dir.path().join("processor.py");
    std::fs::write(&file, source).expect("write processor.py");
    let file = file.canonicalize().expect("canonical path");
    let out = Command::new(statebox_bin())
        .arg("build-python")
        .arg(&file)
        .arg("-o")
        .arg(dir.path().join("processor.wasm"))
        .env("STATEBOX_CACHE_DIR", component_cache())
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox");
    (dir, file, out)
}

const PROCESSOR: &str = "from pyspark.sql import Row\n\
from pyspark.sql.streaming import StatefulProcessor\n\
OUTPUT_SCHEMA = \"id string, n long\"\n\
class P(StatefulProcessor):\n    def init(self, handle):\n        pass\n\n    def handleInputRows(self, key, rows, timerValues):\n        yield Row(id=key[0], n=1)\n";

#[track_caller]
fn assert_refused(source: &str, line: usize, fragments: &[&str]) {
    let (_dir, file, out) = build(source);
    assert!(
        !out.status.success(),
        "the build should fail:\n{}",
        text(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = format!("{}:{line}:", file.display());
    assert!(
        stderr.contains(&at),
        "the error should name {at}\n{}",
        text(&out)
    );
    for fragment in fragments {
        assert!(
            stderr.contains(fragment),
            "missing `{fragment}`:\n{}",
            text(&out)
        );
    }
}

#[test]
fn what_the_sandbox_cannot_run_fails_the_build_with_file_line_and_what_to_do() {
    // pandas (native code): use the row-based API.
    assert_refused(
        &format!("import os\nimport pandas as pd\n{PROCESSOR}"),
        2,
        &["pandas needs native code", "row-based API"],
    );
    // A PySpark module the stand-in does not have.
    assert_refused(
        &format!("from pyspark.ml import Pipeline\n{PROCESSOR}"),
        1,
        &["pyspark.ml", "not part of Statebox's PySpark stand-in"],
    );
    // A Spark column function: importing it works (pasted files import more than they
    // use), calling it at module level or using it in a handler fails the build.
    assert_refused(
        &format!(
            "from pyspark.sql.functions import udf\nshout = udf(lambda s: s.upper())\n{PROCESSOR}"
        ),
        2,
        &["pyspark.sql.functions.udf is not supported by Statebox"],
    );
    assert_refused(
        &format!(
            "from pyspark.sql.functions import lit\n{}",
            PROCESSOR.replace("n=1)", "n=lit(1))")
        ),
        10,
        &["P.handleInputRows uses 'lit'", "sandbox without Spark"],
    );
    // A third-party module that is not installed in the sandbox.
    assert_refused(
        &format!("{PROCESSOR}import cachetools_is_not_in_the_sandbox\n"),
        10,
        &["module 'cachetools_is_not_in_the_sandbox' is not in the sandbox"],
    );
    // spark.sql(...) inside a handler.
    let spark_in_handler = PROCESSOR.replace(
        "        yield Row(id=key[0], n=1)\n",
        "        ref = spark.sql(\"SELECT 1\")\n        yield Row(id=key[0], n=1)\n",
    );
    assert_refused(
        &spark_in_handler,
        9,
        &[
            "P.handleInputRows uses 'spark'",
            "sandbox without Spark",
            "initial state",
        ],
    );
    // A name the file never defines.
    let typo = PROCESSOR.replace("n=1)", "n=lenght(key))");
    assert_refused(
        &typo,
        9,
        &["uses 'lenght', which the processor file never defines"],
    );
}

/// `Row(id=key)` with the key tuple and a string column fails in PySpark (pyarrow:
/// "Expected bytes, got a 'tuple' object"); on Statebox too, with a message that says why.
#[test]
fn a_key_tuple_in_a_string_column_fails_as_in_pyspark_with_a_clear_message() {
    let (dir, _file, out) = build(&PROCESSOR.replace("Row(id=key[0]", "Row(id=key"));
    assert!(out.status.success(), "{}", text(&out));
    let input = dir.path().join("input");
    std::fs::create_dir(&input).expect("create input/");
    std::fs::write(input.join("1.jsonl"), "{\"id\": \"a\"}\n").expect("write input");
    let run = Command::new(statebox_bin())
        .arg("run")
        .arg("--processor")
        .arg(dir.path().join("processor.wasm"))
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(dir.path().join("out.jsonl"))
        .arg("--checkpoint")
        .arg(dir.path().join("checkpoint"))
        .args(["--key", "id"])
        .env("STATEBOX_CACHE_DIR", component_cache())
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox");
    assert!(!run.status.success(), "{}", text(&run));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("output column 'id' is a string but the row gives the tuple ('a',)")
            && stderr.contains("emit key[0]"),
        "{}",
        text(&run)
    );
}

/// Copies `from` (files and folders) into `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a folder");
    for entry in std::fs::read_dir(from).expect("read a folder") {
        let path = entry.expect("entry").path();
        let target = to.join(path.file_name().expect("a file name"));
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copy a file");
        }
    }
}

/// `statebox run JOB [extra...]` in `dir`.
pub(crate) fn run_job(dir: &Path, job: &Path, extra: &[&str]) -> Output {
    run_job_with(dir, job, extra, &[])
}

/// `statebox run JOB [extra...]` in `dir`, with `env` set.
fn run_job_with(dir: &Path, job: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(statebox_bin())
        .arg("run")
        .arg(job)
        .args(extra)
        .envs(env.iter().copied())
        .current_dir(dir)
        .env("STATEBOX_CACHE_DIR", component_cache())
        .env_remove("STATEBOX_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox")
}

/// Checks that `statebox run JOB --print-plan` in `dir` succeeds and its plan has each of
/// `parts`.
fn assert_plan(dir: &Path, job: &Path, parts: &[&str]) {
    let plan = run_job(dir, job, &["--print-plan"]);
    assert!(plan.status.success(), "{}", text(&plan));
    let plan = String::from_utf8_lossy(&plan.stdout);
    for part in parts {
        assert!(plan.contains(part), "the plan lacks `{part}`: {plan}");
    }
}

/// Runs `statebox run JOB --progress-json` in `dir`, which must succeed, and returns the
/// run and its rows by batch, read from `output` (relative to `dir`).
fn run_job_batches(dir: &Path, job: &Path, output: &str) -> (Output, BTreeMap<u64, Vec<Value>>) {
    let run = run_job(dir, job, &["--progress-json"]);
    assert!(run.status.success(), "{}", text(&run));
    let batches = batches_of(&run.stdout, &dir.join(output));
    (run, batches)
}

/// The count job (`job/job.py`) with `edits` applied, and a copy of the count fixture's
/// input in `dir` (the job's relative paths are the working directory's). The script is
/// written to a path named by its content, beside the component cache, so an unchanged
/// variant's build is found in the cache (the build hashes the script's path too).
fn count_job_variant(dir: &Path, edits: &[(&str, &str)]) -> PathBuf {
    let mut source = std::fs::read_to_string(fixtures().join("job/job.py")).expect("job.py");
    for (from, to) in edits {
        assert!(source.contains(from), "job.py has no `{from}`");
        source = source.replace(from, to);
    }
    copy_tree(&fixtures().join("count/input"), &dir.join("input"));
    job_file(&source)
}

/// `source` written to a file named by its content, beside the component cache.
fn job_file(source: &str) -> PathBuf {
    use std::hash::{Hash, Hasher};

    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut hasher);
    let dir = component_cache().with_file_name("pyspark-job-variants");
    std::fs::create_dir_all(&dir).expect("create the job variants folder");
    let job = dir.join(format!("job-{:016x}.py", hasher.finish()));
    if !job.is_file() {
        // Written whole under a temporary name, so a concurrent reader never sees a part.
        let partial = tempfile::NamedTempFile::new_in(&dir).expect("a temporary file");
        std::fs::write(partial.path(), source).expect("write the job");
        partial.persist(&job).expect("store the job");
    }
    job
}

/// All rows of every batch, for sinks that do not keep batches apart.
fn all_rows(batches: &BTreeMap<u64, Vec<Value>>) -> Vec<Value> {
    batches.values().flatten().cloned().collect()
}

/// The documentation-style event-time job (`job-events/job.py`): `withWatermark`, an
/// initial state read with `spark.read.json(...).groupBy(...)`, event-time timers that end
/// sessions as the watermark passes them, and a final no-data batch that fires them. The
/// same file ran unchanged on PySpark 4.3 (`spark_compare.py --job`), whose output, batch by
/// batch, is `expected.jsonl`.
#[test]
fn an_event_time_job_with_watermark_and_initial_state_gives_pysparks_output() {
    let work = tempfile::tempdir().expect("create a temporary directory");
    let fixture = fixtures().join("job-events");
    for part in ["input", "initial"] {
        copy_tree(&fixture.join(part), &work.path().join(part));
    }
    let job = fixture.join("job.py");
    assert_plan(
        work.path(),
        &job,
        &[
            "--time-mode event-time",
            "--event-time ts --watermark-delay 2000ms",
            "--initial-state initial",
            "--output-mode append",
        ],
    );
    let (run, got) = run_job_batches(work.path(), &job, "output/part-00000-statebox.json");
    let want = expected_batches(&fixture.join("expected.jsonl"));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the same batches (the last one without data, for the timers)\n{}",
        text(&run)
    );
    for (batch, rows) in &want {
        assert!(
            same_rows(rows, &got[batch]),
            "batch {batch}: PySpark {rows:?}, Statebox {:?}",
            got[batch]
        );
    }
}

/// `writeStream.format("console")`: the query's rows are printed on standard output.
#[test]
fn a_job_with_the_console_sink_prints_its_rows() {
    let want = all_rows(&expected_batches(&fixtures().join("count/expected.jsonl")));
    let console = (
        ".writeStream.format(\"json\")",
        ".writeStream.format(\"console\")",
    );
    let no_path = (".start(\"output\")", ".start()");
    // With the job's checkpoint location, and without one (Spark allows that for the
    // console sink): then the checkpoint goes to a fresh temporary directory whose name
    // cannot be guessed ahead, not beside the job.
    let no_checkpoint = (".option(\"checkpointLocation\", \"checkpoint\")", "");
    for edits in [
        vec![console, no_path],
        vec![console, no_checkpoint, no_path],
    ] {
        let work = tempfile::tempdir().expect("create a temporary directory");
        let job = count_job_variant(work.path(), &edits);
        let run = run_job(work.path(), &job, &[]);
        assert!(run.status.success(), "{}", text(&run));
        let printed: Vec<Value> = parse_jsonl(&run.stdout);
        assert!(same_rows(&want, &printed), "{}", text(&run));
        if edits.contains(&no_checkpoint) {
            assert!(!work.path().join("checkpoint").exists());
        }
    }
}

/// `writeStream.format("memory").queryName(...)`: the rows are kept beside the checkpoint
/// (`memory-output.jsonl`), where `statebox sql` and tools read them.
#[test]
fn a_job_with_the_memory_sink_keeps_its_rows_beside_the_checkpoint() {
    let work = tempfile::tempdir().expect("create a temporary directory");
    let job = count_job_variant(
        work.path(),
        &[
            (
                ".writeStream.format(\"json\")",
                ".writeStream.format(\"memory\").queryName(\"counts\")",
            ),
            (".start(\"output\")", ".start()"),
        ],
    );
    assert_plan(
        work.path(),
        &job,
        &["--output checkpoint/memory-output.jsonl --checkpoint checkpoint"],
    );
    let (run, got) = run_job_batches(work.path(), &job, "checkpoint/memory-output.jsonl");
    let want = expected_batches(&fixtures().join("count/expected.jsonl"));
    for (batch, rows) in &want {
        assert!(
            same_rows(rows, &got[batch]),
            "batch {batch}\n{}",
            text(&run)
        );
    }
}

/// `trigger(once=True)` reads all available input in one batch, as Spark's once trigger
/// does whatever `maxFilesPerTrigger` says (availableNow keeps to it: three batches here).
/// The script also groups by `events.id` and waits with `spark.streams.awaitAnyTermination()`.
/// `count/expected-once.jsonl` is PySpark 4.3's output of this same script
/// (`spark_compare.py --job` over a copy of `job/` with these edits).
#[test]
fn a_job_with_the_once_trigger_runs_one_batch_as_pyspark_does() {
    let work = tempfile::tempdir().expect("create a temporary directory");
    let job = count_job_variant(
        work.path(),
        &[
            (
                "    events.groupBy(\"id\")",
                "    events.groupBy(events.id)",
            ),
            (".trigger(availableNow=True)", ".trigger(once=True)"),
            (
                "query.awaitTermination()",
                "spark.streams.awaitAnyTermination()",
            ),
        ],
    );
    let all = format!("--max-files-per-batch {}", usize::MAX);
    assert_plan(
        work.path(),
        &job,
        &[&all, "--key id", "--trigger available-now"],
    );
    let (run, got) = run_job_batches(work.path(), &job, "output/part-00000-statebox.json");
    let want = expected_batches(&fixtures().join("count/expected-once.jsonl"));
    assert_eq!(got.len(), 1, "one batch\n{}", text(&run));
    assert!(
        same_rows(&want[&0], &got[&0]),
        "PySpark {:?}, Statebox {:?}",
        want[&0],
        got[&0]
    );
}

/// `spark.readStream.format("kafka")` as Spark's Kafka integration guide writes it (the
/// value parsed with `from_json`, the record timestamp kept for the watermark, the brokers
/// from the environment) becomes exactly the Kafka flags of `statebox run`, and the plan is
/// a command line the CLI takes; the job then runs against a real broker (tansu) and
/// counts the records. An option Statebox does not read stops the job with the file and
/// line, before any build.
#[test]
fn a_kafka_job_maps_to_the_clis_kafka_flags_and_runs_against_a_broker() {
    let work = tempfile::tempdir().expect("create a temporary directory");
    let kafka_source = "spark.readStream.format(\"kafka\")\n    \
        .option(\"kafka.bootstrap.servers\", os.environ.get(\"KAFKA_SERVERS\", \"localhost:9092\"))\n    \
        .option(\"subscribe\", \"events\")\n    \
        .option(\"startingOffsets\", \"earliest\")\n    \
        .option(\"maxOffsetsPerTrigger\", 500)\n    \
        .option(\"kafka.security.protocol\", \"PLAINTEXT\")\n    \
        .load()\n    \
        .select(from_json(col(\"value\").cast(\"string\"), input_schema).alias(\"data\"), \"timestamp\")\n    \
        .select(\"data.*\", \"timestamp\")\n    \
        .withWatermark(\"timestamp\", \"10 seconds\")";
    let job = count_job_variant(
        work.path(),
        &[
            (
                "from typing import Iterator\n",
                "import os\nfrom typing import Iterator\n",
            ),
            (
                "from pyspark.sql import Row, SparkSession\n",
                "from pyspark.sql import Row, SparkSession\nfrom pyspark.sql.functions import col, from_json\n",
            ),
            (
                "spark.readStream.schema(input_schema)\n    .option(\"maxFilesPerTrigger\", 1)\n    .json(\"input\")",
                kafka_source,
            ),
            ("timeMode=\"None\"", "timeMode=\"EventTime\""),
        ],
    );
    let servers = [("KAFKA_SERVERS", "127.0.0.1:9092,127.0.0.1:9093")];
    let plan = run_job_with(work.path(), &job, &["--print-plan"], &servers);
    assert!(plan.status.success(), "{}", text(&plan));
    let plan = String::from_utf8_lossy(&plan.stdout).into_owned();
    for part in [
        " --input kafka://127.0.0.1:9092,127.0.0.1:9093/events ",
        " --kafka-option security.protocol=PLAINTEXT ",
        " --max-records-per-batch 500 ",
        " --starting-offsets earliest ",
        " --kafka-columns timestamp ",
        " --time-mode event-time --event-time timestamp --watermark-delay 10000ms ",
    ] {
        assert!(plan.contains(part), "the plan lacks `{part}`: {plan}");
    }
    assert!(!plan.contains("--max-files-per-batch"), "{plan}");

    // The same job against a broker: the count input's rows as records, one batch.
    let broker = statebox_tests::kafka::Broker::start();
    broker.create_topic("events", 1);
    let mut records = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(work.path().join("input"))
        .expect("input")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(file).expect("input");
        for row in parse_jsonl(text.as_bytes()) {
            records.push((row["id"].as_str().expect("an id").to_owned(), row));
        }
    }
    broker.produce("events", &records);
    let run = run_job_with(
        work.path(),
        &job,
        &["--progress-json"],
        &[("KAFKA_SERVERS", broker.addr.as_str())],
    );
    assert!(run.status.success(), "{}", text(&run));
    let mut last = BTreeMap::new();
    for row in parse_jsonl(
        &std::fs::read(work.path().join("output/part-00000-statebox.json")).unwrap_or_default(),
    ) {
        last.insert(
            row["id"].as_str().expect("an id").to_owned(),
            row["count"].clone(),
        );
    }
    let want: BTreeMap<String, Value> = [("a", 3), ("b", 3), ("c", 2)]
        .into_iter()
        .map(|(k, n)| (k.to_owned(), Value::from(n)))
        .collect();
    assert_eq!(last, want, "{}", text(&run));

    // subscribePattern: refused with the line of the source, before the build.
    let source = std::fs::read_to_string(&job).expect("read job.py");
    let bad = source.replace(
        ".option(\"subscribe\", \"events\")",
        ".option(\"subscribePattern\", \"events-.*\")",
    );
    let job = job_file(&bad);
    let line = bad
        .lines()
        .position(|l| l.contains(".load()"))
        .expect("the load line")
        + 1;
    let refused = run_job_with(work.path(), &job, &["--print-plan"], &servers);
    assert!(!refused.status.success(), "{}", text(&refused));
    let at = format!(
        "{}:{line}: Kafka option subscribePattern is not supported",
        job.canonicalize().unwrap().display()
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains(&at), "expected `{at}`:\n{}", text(&refused));
    assert!(
        !stderr.contains("building Python processor"),
        "{}",
        text(&refused)
    );
}

/// The row-based example of Spark's transformWithState guide (`DownTimeDetector`, pasted
/// byte-for-byte into `docs-downtime/job.py` with the query the guide shows) fails on
/// PySpark 4.3 in its first batch: it compares the naive `datetime.fromtimestamp(0)` with
/// the aware timestamps PySpark hands over. Statebox runs the same file and fails the same
/// way, at the same line, with the same Python error (`expected-error.txt`, written by
/// `spark_compare.py --job ... --write-expected` from the PySpark run).
#[test]
fn the_spark_guides_downtime_detector_fails_at_the_same_line_as_on_pyspark() {
    let fixture = fixtures().join("docs-downtime");
    let expected =
        std::fs::read_to_string(fixture.join("expected-error.txt")).expect("expected-error.txt");
    // "job.py:54: TypeError: can't compare ..."
    let (line, error) = expected
        .trim()
        .strip_prefix("job.py:")
        .and_then(|rest| rest.split_once(": "))
        .expect("job.py:LINE: ERROR");
    let work = tempfile::tempdir().expect("create a temporary directory");
    copy_tree(&fixture.join("input"), &work.path().join("input"));
    let source = std::fs::read_to_string(fixture.join("job.py")).expect("job.py");
    let job = job_file(&source);
    let run = run_job(work.path(), &job, &[]);
    assert!(!run.status.success(), "{}", text(&run));
    let stderr = String::from_utf8_lossy(&run.stderr);
    let at = format!("{}\", line {line}, in handleInputRows", job.display());
    assert!(stderr.contains(&at), "expected `{at}`:\n{}", text(&run));
    assert!(
        stderr.contains(error),
        "expected `{error}`:\n{}",
        text(&run)
    );
}

/// The row-based example of PySpark's `GroupedData.transformWithState` docstring, pasted
/// as published (`docs-violations/processor.py`): its `handleInputRows(self, key, rows)`
/// lacks `timerValues`, which PySpark 4.3 reports only when the first batch calls it.
/// Statebox refuses it when it is built, with the file, the method's line and what to do.
#[test]
fn pysparks_docstring_example_is_refused_at_build_time_naming_the_method() {
    let file = fixtures()
        .join("docs-violations/processor.py")
        .canonicalize()
        .expect("the fixture");
    let line = std::fs::read_to_string(&file)
        .expect("processor.py")
        .lines()
        .position(|l| l.contains("def handleInputRows(self, key, rows):"))
        .expect("the method")
        + 1;
    let work = tempfile::tempdir().expect("create a temporary directory");
    let out = Command::new(statebox_bin())
        .arg("build-python")
        .arg(&file)
        .arg("-o")
        .arg(work.path().join("p.wasm"))
        .env("STATEBOX_CACHE_DIR", component_cache())
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox");
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = format!(
        "{}:{line}: SimpleStatefulProcessor.handleInputRows(self, key, rows) cannot be called \
         as handleInputRows(self, key, rows, timerValues)",
        file.display()
    );
    assert!(stderr.contains(&at), "expected `{at}`:\n{}", text(&out));
    assert!(stderr.contains("declare them all"), "{}", text(&out));
}

const ENV_PROCESSOR: &str = "import os\n\
from pyspark.sql import Row\n\
from pyspark.sql.streaming import StatefulProcessor\n\
OUTPUT_SCHEMA = \"id string, greeting string, later string, optional string\"\n\
GREETING = os.environ[\"GREETING\"]\n\
class P(StatefulProcessor):\n    def init(self, handle):\n        pass\n\n    def handleInputRows(self, key, rows, timerValues):\n        yield Row(id=key[0], greeting=GREETING, later=os.environ[\"GREETING\"], optional=os.getenv(\"NOT_GIVEN\", \"default\"))\n";

/// `statebox run --processor FILE` over one row, with `env` set; returns the run and the
/// rows it wrote.
fn run_env_processor(file: &Path, env: &[(&str, &str)]) -> (Output, Vec<Value>) {
    let work = tempfile::tempdir().expect("create a temporary directory");
    let input = work.path().join("input");
    std::fs::create_dir(&input).expect("create input/");
    std::fs::write(input.join("1.jsonl"), "{\"id\": \"a\"}\n").expect("write input");
    let output = work.path().join("out.jsonl");
    let run = Command::new(statebox_bin())
        .arg("run")
        .arg("--processor")
        .arg(file)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .arg("--checkpoint")
        .arg(work.path().join("checkpoint"))
        .args(["--key", "id"])
        .env_remove("STATEBOX_PYTHON_ENV")
        .envs(env.iter().copied())
        .env("STATEBOX_CACHE_DIR", component_cache())
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox");
    let rows = parse_jsonl(&std::fs::read(&output).unwrap_or_default());
    (run, rows)
}

/// A processor file that reads `os.environ["X"]` at module level (it runs at build time):
/// the build gives it exactly the variables passed (`--env NAME=VALUE`, `--env NAME`,
/// `STATEBOX_PYTHON_ENV`), handlers see the same values at run time, `os.getenv` of one
/// not given is its default, and a missing one fails the build with the file, the line,
/// the variable and the flag to pass.
#[test]
fn module_level_environment_variables_are_the_ones_the_build_is_given() {
    let (dir, file, out) = build(ENV_PROCESSOR);
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = format!(
        "{}:5: the environment variable GREETING is not set for this processor",
        file.display()
    );
    assert!(stderr.contains(&at), "expected `{at}`:\n{}", text(&out));
    assert!(stderr.contains("--env GREETING=VALUE"), "{}", text(&out));

    // --env NAME=VALUE on build-python.
    let wasm = dir.path().join("given.wasm");
    let out = Command::new(statebox_bin())
        .arg("build-python")
        .arg(&file)
        .args(["--env", "GREETING=hello"])
        .arg("-o")
        .arg(&wasm)
        .env("STATEBOX_CACHE_DIR", component_cache())
        .env_remove("STATEBOX_PYTHON_ENV")
        .stdin(Stdio::null())
        .output()
        .expect("spawn statebox");
    assert!(out.status.success(), "{}", text(&out));
    // The value is in the component: the run's own environment does not change it.
    let (run, rows) = run_env_processor(&wasm, &[("GREETING", "not this one")]);
    assert!(run.status.success(), "{}", text(&run));
    assert_eq!(
        rows,
        vec![
            serde_json::json!({"id": "a", "greeting": "hello", "later": "hello", "optional": "default"})
        ],
        "{}",
        text(&run)
    );

    // STATEBOX_PYTHON_ENV names variables to take from the environment, for a build that
    // `statebox run --processor FILE.py` makes.
    let (run, rows) = run_env_processor(
        &file,
        &[("GREETING", "hi"), ("STATEBOX_PYTHON_ENV", "GREETING")],
    );
    assert!(run.status.success(), "{}", text(&run));
    assert_eq!(rows[0]["greeting"], "hi", "{}", text(&run));
    assert_eq!(rows[0]["later"], "hi", "{}", text(&run));
}

/// A job script that reads its input folder from the environment: `statebox run job.py`
/// reads the script with the caller's environment, as `python job.py` would, and its
/// processor's build is given the variables the script read; without the variable the job
/// stops with the script's file and line naming it.
#[test]
fn a_job_script_reads_the_environment_as_python_would() {
    let work = tempfile::tempdir().expect("create a temporary directory");
    let job = count_job_variant(
        work.path(),
        &[
            (
                "from typing import Iterator\n",
                "import os\nfrom typing import Iterator\n",
            ),
            (".json(\"input\")", ".json(os.environ[\"COUNT_INPUT\"])"),
        ],
    );
    let missing = run_job(work.path(), &job, &["--print-plan"]);
    assert!(!missing.status.success(), "{}", text(&missing));
    let line = std::fs::read_to_string(&job)
        .expect("job.py")
        .lines()
        .position(|l| l.contains("COUNT_INPUT"))
        .expect("the line")
        + 1;
    let at = format!(
        "{}:{line}: the environment variable COUNT_INPUT is not set",
        job.display()
    );
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains(&at), "expected `{at}`:\n{}", text(&missing));

    let run = run_job_with(
        work.path(),
        &job,
        &["--progress-json"],
        &[("COUNT_INPUT", "input")],
    );
    assert!(run.status.success(), "{}", text(&run));
    let got = batches_of(
        &run.stdout,
        &work.path().join("output/part-00000-statebox.json"),
    );
    let want = expected_batches(&fixtures().join("count/expected.jsonl"));
    assert_eq!(got.len(), want.len(), "{}", text(&run));
    for (batch, rows) in &want {
        assert!(
            same_rows(rows, &got[batch]),
            "batch {batch}: {:?}",
            got[batch]
        );
    }

    // --env after the script works the same.
    let again = tempfile::tempdir().expect("create a temporary directory");
    copy_tree(&fixtures().join("count/input"), &again.path().join("in2"));
    let plan = run_job(
        again.path(),
        &job,
        &["--env", "COUNT_INPUT=in2", "--print-plan"],
    );
    assert!(plan.status.success(), "{}", text(&plan));
    assert!(
        String::from_utf8_lossy(&plan.stdout).contains("--input in2"),
        "{}",
        text(&plan)
    );
}

/// Databricks' async count and its query exactly as published
/// (`docs-async-count/job.py`: the page's two code blocks, one after the other). The query
/// reads `/databricks-datasets/structured-streaming/events`, ten files per trigger, into the
/// memory sink; flags after the script replace the script's, so `--input` runs it over a
/// local copy of that dataset (`{"time": …, "action": "Open"|"Close"}` per line). PySpark
/// 4.3 has no `AsyncStatefulProcessor` (it is Databricks Runtime 19+), so the counts are
/// checked against the input: twelve files are two batches, and each emits the running
/// count of the actions it saw.
#[test]
fn the_databricks_async_count_job_runs_unchanged_over_a_local_copy_of_its_dataset() {
    let work = tempfile::tempdir().expect("create a temporary directory");
    let job = fixtures().join("docs-async-count/job.py");
    let events = work.path().join("events");
    std::fs::create_dir_all(&events).expect("create events/");
    for i in 0..12i64 {
        let mut lines = format!("{{\"time\":{},\"action\":\"Open\"}}\n", 1469501107 + i);
        if i % 2 == 0 {
            lines.push_str(&format!(
                "{{\"time\":{},\"action\":\"Close\"}}\n",
                1469501200 + i
            ));
        }
        std::fs::write(events.join(format!("file-{i:02}.json")), lines).expect("write events");
    }
    let output = work.path().join("async_counts.jsonl");
    let checkpoint = work.path().join("checkpoint");
    let (input, output, checkpoint) = (
        events.to_str().expect("utf-8"),
        output.to_str().expect("utf-8"),
        checkpoint.to_str().expect("utf-8"),
    );
    let local = [
        "--input",
        input,
        "--output",
        output,
        "--checkpoint",
        checkpoint,
    ];

    let plan = run_job(work.path(), &job, &[&local[..], &["--print-plan"]].concat());
    assert!(plan.status.success(), "{}", text(&plan));
    let shown = String::from_utf8_lossy(&plan.stdout);
    for part in [
        "--max-files-per-batch 10",
        "--key action",
        "--output-mode update",
        "--trigger available-now",
    ] {
        assert!(
            shown.contains(part),
            "no `{part}` in the plan\n{}",
            text(&plan)
        );
    }
    assert!(
        !shown.contains("/databricks-datasets"),
        "--input replaces the script's path\n{}",
        text(&plan)
    );

    let run = run_job(
        work.path(),
        &job,
        &[&local[..], &["--progress-json"]].concat(),
    );
    assert!(run.status.success(), "{}", text(&run));
    let got = batches_of(&run.stdout, Path::new(output));
    let rows = |open: i64, close: i64| {
        vec![
            serde_json::json!({"action": "Close", "count": close}),
            serde_json::json!({"action": "Open", "count": open}),
        ]
    };
    let want: BTreeMap<u64, Vec<Value>> = [(0, rows(10, 5)), (1, rows(12, 6))].into();
    assert_eq!(got.len(), want.len(), "{}", text(&run));
    for (batch, rows) in &want {
        assert!(
            same_rows(rows, &got[batch]),
            "batch {batch}\n{}",
            text(&run)
        );
    }
}
