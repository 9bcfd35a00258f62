//! `statebox run job.py`: a whole PySpark streaming job script, run as Statebox.
//!
//! The script is run by CPython with the Python SDK's recording stand-in for PySpark
//! (`python3 -m statebox._job`, see `guest-sdk/python/src/statebox/_job.py`): its
//! `SparkSession`, `readStream`, `withWatermark`, `groupBy(...).transformWithState(...)` and
//! `writeStream...start()` calls are recorded, not run, and the query it built comes back
//! as JSON. That query becomes the flags of `statebox run` with the same meaning (the table
//! in the README), the processor class of the script is built into a component with the
//! query's input and output schemas, and the query runs in the sandbox as any other. A call
//! Statebox does not support stops it with the script's file, line and the call's name.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Parser;
use serde::Deserialize;
use serde_json::Value;

/// `statebox run job.py`: the command line after `run`.
#[derive(Parser)]
#[command(name = "statebox run", about = "Run a PySpark streaming job script")]
struct JobArgs {
    /// The job script: a processor class and the query built the PySpark way.
    script: PathBuf,
    /// Print the `statebox run` command the script amounts to, and stop.
    #[arg(long)]
    print_plan: bool,
    /// An environment variable for the script, `NAME=VALUE` (repeatable): set while the
    /// script is read and given to its processor's build. The script also sees this
    /// process's environment, as `python job.py` would; the variables it reads are given
    /// to the build (see `statebox build-python --env`).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Everything else is passed to `statebox run` (sandbox limits, `--allow-http`,
    /// `--progress-json`, ...). A flag the script's query sets too (`--input`, `--output`,
    /// `--checkpoint`, `--trigger`, ...) replaces the script's value: e.g. `--input DIR` runs
    /// a notebook's job over a local copy of a dataset it names by an absolute path.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    rest: Vec<OsString>,
}

/// What the recording stand-in printed.
#[derive(Deserialize)]
struct Recorded {
    error: Option<String>,
    #[serde(default)]
    queries: Vec<RecordedQuery>,
    /// The environment variables the script read (and were set): the processor's build is
    /// given them, so the file sees the same values inside the sandbox.
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RecordedQuery {
    source: Source,
    watermark: Option<Watermark>,
    key: Vec<String>,
    processor_class: String,
    output_schema: String,
    output_mode: String,
    time_mode: String,
    initial_state: Option<String>,
    event_time_column: Option<String>,
    sink: Sink,
    start_at: String,
}

#[derive(Deserialize)]
struct Source {
    format: String,
    schema: Option<String>,
    #[serde(default)]
    options: serde_json::Map<String, Value>,
    path: Option<String>,
    at: String,
    /// Kafka columns the query keeps besides the parsed value (`--kafka-columns`).
    #[serde(default)]
    kafka_columns: Vec<String>,
}

#[derive(Deserialize)]
struct Watermark {
    column: String,
    delay_ms: i64,
}

#[derive(Deserialize)]
struct Sink {
    format: String,
    #[serde(default)]
    options: serde_json::Map<String, Value>,
    output_mode: Option<String>,
    trigger: Option<Value>,
}

/// Whether the command line is `statebox run SCRIPT.py ...` (a job script rather than
/// `statebox run --processor ...`).
pub(crate) fn is_job(args: &[OsString]) -> bool {
    args.get(1).is_some_and(|a| a == "run")
        && args
            .get(2)
            .is_some_and(|a| Path::new(a).extension().is_some_and(|e| e == "py"))
}

/// Runs `statebox run SCRIPT.py [--print-plan] [statebox run flags...]`.
pub(crate) fn run(args: &[OsString]) -> anyhow::Result<()> {
    let job = JobArgs::parse_from(
        std::iter::once(OsString::from("statebox run")).chain(args[2..].iter().cloned()),
    );
    let script = std::fs::canonicalize(&job.script)
        .with_context(|| format!("cannot read the job script {}", job.script.display()))?;
    let mut given = Vec::new();
    for item in &job.env {
        let Some((name, value)) = item.split_once('=') else {
            bail!("--env {item:?}: expected NAME=VALUE");
        };
        given.push((name.to_owned(), value.to_owned()));
    }
    let (query, read) = record(&script, &given)?;
    // The build is given what the script read, and what --env set.
    let env: Vec<String> = read
        .into_iter()
        .chain(given)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    // `--print-plan` after other flags lands among them (the rest is taken as it is).
    let mut job = job;
    if let Some(at) = job.rest.iter().position(|a| a == "--print-plan") {
        job.rest.remove(at);
        job.print_plan = true;
    }
    let overridden = flags_in(&job.rest);
    if overridden.iter().any(|f| f == "--processor") {
        bail!(
            "--processor: the job's processor is the class its script passes to transformWithState"
        );
    }
    let (mut argv, console) = plan(&script, &query, &env, &overridden)?;
    argv.extend(job.rest.iter().cloned());
    // The plan (with the flags given after the script) is a command line `statebox run`
    // takes as it is.
    let cli = crate::Cli::try_parse_from(&argv)
        .map_err(|e| anyhow::anyhow!("the job's plan is not a valid statebox run command: {e}"))?;
    if job.print_plan {
        let shown: Vec<String> = argv
            .iter()
            .map(|a| shell_word(&a.to_string_lossy()))
            .collect();
        println!("{}", shown.join(" "));
        return Ok(());
    }
    let crate::Command::Run(run_args) = cli.command else {
        unreachable!("the plan is a `statebox run` command line");
    };
    crate::run(*run_args)?;
    if let Some(output) = console {
        // The console sink: print what the query emitted.
        let output = flag_value(&job.rest, "--output").map_or(output, PathBuf::from);
        let text = std::fs::read_to_string(&output).unwrap_or_default();
        print!("{text}");
        // Without a checkpoint location the run's directory was a temporary one, of no use
        // once its rows are printed (Spark removes such a checkpoint at the end too).
        if option(&query.sink.options, "checkpointLocation").is_none()
            && !overridden
                .iter()
                .any(|f| f == "--output" || f == "--checkpoint")
            && let Some(dir) = output.parent()
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    Ok(())
}

/// Runs the script with the recording stand-in (with the `env` variables set) and returns
/// its one query and the environment variables it read.
fn record(
    script: &Path,
    env: &[(String, String)],
) -> anyhow::Result<(RecordedQuery, std::collections::BTreeMap<String, String>)> {
    let sdk = crate::python::sdk_dir()?;
    let python = std::env::var_os("STATEBOX_PYTHON").unwrap_or_else(|| "python3".into());
    let dir = script.parent().unwrap_or(Path::new("."));
    let output = Command::new(&python)
        .args(["-m", "statebox._job"])
        .arg(script)
        .env("PYTHONPATH", sdk.join("src"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(std::env::current_dir().unwrap_or_else(|_| dir.to_owned()))
        .output()
        .with_context(|| {
            format!(
                "cannot run {} to read the job script",
                python.to_string_lossy()
            )
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().rev().find(|l| l.starts_with('{')) else {
        bail!(
            "reading the job script {} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let recorded: Recorded = serde_json::from_str(line).context("the job reader's answer")?;
    if let Some(error) = recorded.error {
        bail!("{error}");
    }
    let mut queries = recorded.queries.into_iter();
    let Some(query) = queries.next() else {
        bail!(
            "{}:1: the job script starts no streaming query: build it with \
             df.groupBy(...).transformWithState(...).writeStream...start()",
            script.display()
        );
    };
    if let Some(second) = queries.next() {
        bail!(
            "{}: a second streaming query: Statebox runs one query per job script",
            second.start_at
        );
    }
    Ok((query, recorded.env))
}

fn option(options: &serde_json::Map<String, Value>, name: &str) -> Option<String> {
    options
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
}

/// The `--flag` names of a command line (`--flag value` and `--flag=value`).
fn flags_in(args: &[OsString]) -> Vec<String> {
    args.iter()
        .filter_map(|a| a.to_str())
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split_once('=').map_or(a, |(flag, _)| flag).to_owned())
        .collect()
}

/// The value `flag` has on a command line (its last one), if it is there.
fn flag_value(args: &[OsString], flag: &str) -> Option<OsString> {
    let mut found = None;
    let mut args = args.iter();
    while let Some(a) = args.next() {
        let Some(text) = a.to_str() else { continue };
        if text == flag {
            found = args.next().cloned();
        } else if let Some(value) = text.strip_prefix(flag).and_then(|v| v.strip_prefix('=')) {
            found = Some(value.into());
        }
    }
    found
}

/// The `statebox run` command line the recorded query amounts to, and the console sink's
/// output file. Flags in `overridden` are left out (the caller's command line gives them),
/// and nothing is created for an output or checkpoint the caller gives.
fn plan(
    script: &Path,
    q: &RecordedQuery,
    env: &[String],
    overridden: &[String],
) -> anyhow::Result<(Vec<OsString>, Option<PathBuf>)> {
    let mut argv: Vec<OsString> = vec!["statebox".into(), "run".into()];
    let given = |flag: &str| overridden.iter().any(|f| f == flag);
    let mut arg = |flag: &str, value: &str| {
        if !given(flag) {
            argv.push(flag.into());
            argv.push(value.into());
        }
    };

    // The source and the output mode first: what Statebox cannot run stops the job before
    // the build.
    let source_flags = source_flags(q)?;
    let mode = output_mode(q)?;
    let input = match q.source.format.as_str() {
        "json" => q
            .source
            .path
            .clone()
            .with_context(|| format!("{}: the streaming source has no path", q.source.at))?,
        "kafka" => format!(
            "kafka://{}/{}",
            kafka_option(q, "kafka.bootstrap.servers")?,
            kafka_option(q, "subscribe")?
        ),
        other => bail!("{}: source format {other:?} is not supported", q.source.at),
    };
    let options = crate::python::PythonOptions {
        class_name: Some(q.processor_class.clone()),
        output_schema: Some(q.output_schema.clone()),
        input_schema: q.source.schema.clone(),
        output_event_time_column: q.event_time_column.clone(),
        env: env.to_vec(),
        ..Default::default()
    };
    let wasm = crate::python::build(script, &options)?;
    arg("--processor", &wasm.display().to_string());
    arg("--input", &input);
    for (flag, value) in source_flags {
        arg(flag, &value);
    }
    arg("--key", &q.key.join(","));

    arg("--output-mode", &mode);
    let time_mode = match q
        .time_mode
        .replace(['_', '-'], "")
        .to_ascii_lowercase()
        .as_str()
    {
        "none" => "none",
        "processingtime" => "processing-time",
        "eventtime" => "event-time",
        other => bail!("{}: unknown timeMode {other:?}", q.start_at),
    };
    arg("--time-mode", time_mode);
    if let Some(w) = &q.watermark {
        arg("--event-time", &w.column);
        arg("--watermark-delay", &format!("{}ms", w.delay_ms));
    } else if time_mode == "event-time" {
        bail!(
            "{}: timeMode EventTime needs df.withWatermark(column, delay) on the source",
            q.start_at
        );
    }
    if let Some(initial) = &q.initial_state {
        arg("--initial-state", initial);
    }

    let checkpoint = option(&q.sink.options, "checkpointLocation");
    let mut console = None;
    let output = match q.sink.format.as_str() {
        "json" => {
            let path = option(&q.sink.options, "path").with_context(|| {
                format!(
                    "{}: writeStream.format(\"json\").start() needs a path",
                    q.start_at
                )
            })?;
            let path = PathBuf::from(path);
            if given("--output")
                || path
                    .extension()
                    .is_some_and(|e| e == "jsonl" || e == "json")
            {
                path
            } else {
                // Spark's JSON sink writes a folder of part files; Statebox one JSON Lines
                // file in that folder, which Spark reads back the same way.
                std::fs::create_dir_all(&path)
                    .with_context(|| format!("cannot create {}", path.display()))?;
                path.join("part-00000-statebox.json")
            }
        }
        "console" | "memory" => {
            let dir = match &checkpoint {
                _ if given("--output") => PathBuf::from("."),
                Some(c) => {
                    std::fs::create_dir_all(c)?;
                    PathBuf::from(c)
                }
                // A fresh directory of the user's alone, with a name no one can guess ahead
                // (a predictable one in /tmp could be planted by another user); it stays
                // after the run, as the output it holds is the run's result.
                None => tempfile::Builder::new()
                    .prefix("statebox-job-")
                    .tempdir()
                    .context("cannot create a temporary directory for the job's output")?
                    .keep(),
            };
            let file = dir.join(format!("{}-output.jsonl", q.sink.format));
            if q.sink.format == "console" {
                console = Some(file.clone());
            }
            file
        }
        "kafka" => {
            let servers =
                option(&q.sink.options, "kafka.bootstrap.servers").with_context(|| {
                    format!(
                        "{}: a Kafka sink needs option kafka.bootstrap.servers",
                        q.start_at
                    )
                })?;
            let topic = option(&q.sink.options, "topic")
                .with_context(|| format!("{}: a Kafka sink needs option topic", q.start_at))?;
            PathBuf::from(format!("kafka://{servers}/{topic}"))
        }
        other => bail!("{}: sink format {other:?} is not supported", q.start_at),
    };
    let checkpoint = match checkpoint {
        Some(c) => PathBuf::from(c),
        None if console.is_some() || q.sink.format == "memory" => output
            .parent()
            .map(|p| p.join("checkpoint"))
            .unwrap_or_else(|| PathBuf::from("checkpoint")),
        None => bail!(
            "{}: writeStream needs option(\"checkpointLocation\", ...), as Spark does",
            q.start_at
        ),
    };
    arg("--output", &output.display().to_string());
    arg("--checkpoint", &checkpoint.display().to_string());
    match &q.sink.trigger {
        Some(Value::Object(t)) => {
            let ms = t.get("interval_ms").and_then(Value::as_i64).unwrap_or(0);
            arg("--trigger", &format!("interval={ms}ms"));
        }
        // Spark's default trigger runs batches as soon as possible, forever; the job runs
        // what is available and stops (Statebox's available-now). So does `once`, in one
        // batch (`source_flags`).
        _ => arg("--trigger", "available-now"),
    }
    let _ = script;
    Ok((argv, console))
}

/// The query's output mode: transformWithState's, which the writer's (if set) must match.
/// As in Spark, `append` or `update`; `complete` stops the job at `start()`, where Spark's
/// analysis stops it.
fn output_mode(q: &RecordedQuery) -> anyhow::Result<String> {
    let mode = q.output_mode.to_ascii_lowercase();
    let written = q.sink.output_mode.as_deref().unwrap_or(&mode);
    if !written.eq_ignore_ascii_case(&mode) {
        bail!(
            "{}: writeStream.outputMode({written:?}) differs from transformWithState's \
             outputMode {:?}",
            q.start_at,
            q.output_mode
        );
    }
    if mode != "append" && mode != "update" {
        bail!(
            "{}: output mode {:?} is not supported: transformWithState emits in append or \
             update mode (Spark stops here too: \"Invalid streaming output mode\")",
            q.start_at,
            q.output_mode
        );
    }
    Ok(mode)
}

/// The flags of the source's options. Spark's once trigger reads everything available in
/// one batch whatever the source's per-trigger limits say (availableNow keeps to them over
/// several batches), so under it the batch bounds are left out.
fn source_flags(q: &RecordedQuery) -> anyhow::Result<Vec<(&'static str, String)>> {
    let mut flags = match q.source.format.as_str() {
        "kafka" => kafka_flags(q)?,
        "json" => file_flags(&q.source)?,
        _ => Vec::new(),
    };
    if q.sink.trigger.as_ref().and_then(Value::as_str) == Some("once") {
        for (flag, value) in &mut flags {
            if *flag == "--max-files-per-batch" {
                *value = usize::MAX.to_string();
            }
        }
        flags.retain(|(flag, _)| {
            !matches!(*flag, "--max-bytes-per-batch" | "--max-records-per-batch")
        });
    }
    Ok(flags)
}

/// The flags of a file source's limits, as Spark's file source reads them:
/// `maxFilesPerTrigger` (`--max-files-per-batch`) or `maxBytesPerTrigger`
/// (`--max-bytes-per-batch`), not both; without either, every available file in one batch.
fn file_flags(source: &Source) -> anyhow::Result<Vec<(&'static str, String)>> {
    let files = option(&source.options, "maxFilesPerTrigger");
    let bytes = option(&source.options, "maxBytesPerTrigger");
    if files.is_some() && bytes.is_some() {
        bail!(
            "{}: maxFilesPerTrigger and maxBytesPerTrigger cannot both be set (as in Spark): \
             keep one",
            source.at
        );
    }
    let files = match files {
        Some(files) => positive(&files, "maxFilesPerTrigger", &source.at)?.to_string(),
        None => usize::MAX.to_string(),
    };
    let mut flags = vec![("--max-files-per-batch", files)];
    if let Some(bytes) = bytes {
        // A count of bytes, as Spark reads it, or a size such as `64MiB`.
        crate::parse_batch_bytes(&bytes).map_err(|e| {
            anyhow::anyhow!("{}: option maxBytesPerTrigger={bytes:?}: {e}", source.at)
        })?;
        flags.push(("--max-bytes-per-batch", bytes));
    }
    Ok(flags)
}

/// `value`, option `name`'s, which must be a positive integer (a file or record count).
fn positive(value: &str, name: &str, at: &str) -> anyhow::Result<u64> {
    match value.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("{at}: option {name}={value:?} must be a positive integer"),
    }
}

/// A Kafka source option the query needs.
fn kafka_option(q: &RecordedQuery, name: &str) -> anyhow::Result<String> {
    option(&q.source.options, name)
        .with_context(|| format!("{}: a Kafka source needs option {name}", q.source.at))
}

/// The Kafka flags of `statebox run` for the source's options, as Spark's Kafka source
/// reads them: `startingOffsets` (`--starting-offsets`), `maxOffsetsPerTrigger`
/// (`--max-records-per-batch`), `kafka.*` client settings (`--kafka-option`), and the
/// Kafka columns the query keeps (`--kafka-columns`). Anything else stops the job.
fn kafka_flags(q: &RecordedQuery) -> anyhow::Result<Vec<(&'static str, String)>> {
    let mut flags = Vec::new();
    for (name, value) in &q.source.options {
        let value = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            "kafka.bootstrap.servers" | "subscribe" => {}
            "startingoffsets" => flags.push(("--starting-offsets", value)),
            "maxoffsetspertrigger" => flags.push((
                "--max-records-per-batch",
                positive(&value, name, &q.source.at)?.to_string(),
            )),
            // Statebox always fails a query whose Kafka data was lost, as Spark's default.
            "failondataloss" if value.eq_ignore_ascii_case("true") => {}
            _ if lower.starts_with("kafka.") => flags.push((
                "--kafka-option",
                format!("{}={value}", &name["kafka.".len()..]),
            )),
            "subscribepattern" | "assign" => bail!(
                "{}: Kafka option {name} is not supported by Statebox: name the topics with \
                 option(\"subscribe\", \"a,b\")",
                q.source.at
            ),
            _ => bail!(
                "{}: Kafka option {name} is not supported by Statebox (it reads \
                 kafka.bootstrap.servers, subscribe, startingOffsets, maxOffsetsPerTrigger, \
                 failOnDataLoss=true and kafka.* client settings)",
                q.source.at
            ),
        }
    }
    if !q.source.kafka_columns.is_empty() {
        flags.push(("--kafka-columns", q.source.kafka_columns.join(",")));
    }
    Ok(flags)
}

fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_source(options: Value) -> Source {
        serde_json::from_value(serde_json::json!({
            "format": "json",
            "options": options,
            "path": "input",
            "at": "job.py:12",
        }))
        .expect("a recorded source")
    }

    /// The count job's query over `source`, with the sink's `trigger` as recorded.
    fn query(source: Value, trigger: Value) -> RecordedQuery {
        serde_json::from_value(serde_json::json!({
            "source": source,
            "watermark": null,
            "key": ["id"],
            "processor_class": "CountProcessor",
            "output_schema": "id string, count long",
            "output_mode": "append",
            "time_mode": "none",
            "initial_state": null,
            "event_time_column": null,
            "sink": {"format": "json", "options": {}, "output_mode": null, "trigger": trigger},
            "start_at": "job.py:40",
        }))
        .expect("a recorded query")
    }

    #[test]
    fn the_once_trigger_reads_all_available_input_in_one_batch() {
        let files = serde_json::json!({
            "format": "json", "path": "input", "at": "job.py:12",
            "options": {"maxFilesPerTrigger": 1},
        });
        let bytes = serde_json::json!({
            "format": "json", "path": "input", "at": "job.py:12",
            "options": {"maxBytesPerTrigger": "1m"},
        });
        let kafka = serde_json::json!({
            "format": "kafka", "at": "job.py:12",
            "options": {"subscribe": "t", "maxOffsetsPerTrigger": 10, "startingOffsets": "earliest"},
        });
        let flags = |source: &Value, trigger: &str| {
            source_flags(&query(source.clone(), trigger.into())).expect("flags")
        };
        let all = usize::MAX.to_string();
        assert_eq!(
            flags(&files, "available-now"),
            [("--max-files-per-batch", "1".to_owned())]
        );
        assert_eq!(
            flags(&files, "once"),
            [("--max-files-per-batch", all.clone())]
        );
        assert_eq!(
            flags(&bytes, "once"),
            [("--max-files-per-batch", all.clone())]
        );
        assert_eq!(
            flags(&kafka, "available-now"),
            [
                ("--max-records-per-batch", "10".to_owned()),
                ("--starting-offsets", "earliest".to_owned())
            ]
        );
        assert_eq!(
            flags(&kafka, "once"),
            [("--starting-offsets", "earliest".to_owned())]
        );
        let mut none = kafka.clone();
        none["options"]["maxOffsetsPerTrigger"] = "-1".into();
        let e = source_flags(&query(none, Value::Null))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("job.py:12: option maxOffsetsPerTrigger=\"-1\" must be a positive"),
            "{e}"
        );
        // An interval trigger keeps the limits, as Spark's processingTime does.
        let interval = source_flags(&query(files, serde_json::json!({"interval_ms": 5000})));
        assert_eq!(
            interval.expect("flags"),
            [("--max-files-per-batch", "1".to_owned())]
        );
    }

    #[test]
    fn the_output_mode_is_append_or_update_and_the_writers_agrees() {
        let mode = |tws: &str, writer: Option<&str>| {
            let mut q = query(
                serde_json::json!({"format": "json", "at": "job.py:12"}),
                Value::Null,
            );
            q.output_mode = tws.to_owned();
            q.sink.output_mode = writer.map(str::to_owned);
            output_mode(&q).map_err(|e| e.to_string())
        };
        assert_eq!(mode("Update", None).unwrap(), "update");
        assert_eq!(mode("append", Some("Append")).unwrap(), "append");
        let e = mode("Complete", Some("complete")).unwrap_err();
        assert!(
            e.starts_with("job.py:40: output mode \"Complete\" is not supported"),
            "{e}"
        );
        let e = mode("update", Some("append")).unwrap_err();
        assert!(
            e.contains("writeStream.outputMode(\"append\") differs from transformWithState's"),
            "{e}"
        );
    }

    #[test]
    fn a_file_sources_limits_map_to_the_batch_flags() {
        let flags = |options| file_flags(&json_source(options));
        let all = usize::MAX.to_string();
        assert_eq!(
            flags(serde_json::json!({})).unwrap(),
            [("--max-files-per-batch", all.clone())]
        );
        assert_eq!(
            flags(serde_json::json!({"maxFilesPerTrigger": 2})).unwrap(),
            [("--max-files-per-batch", "2".to_owned())]
        );
        assert_eq!(
            flags(serde_json::json!({"maxFilesPerTrigger": " 3"})).unwrap(),
            [("--max-files-per-batch", "3".to_owned())]
        );
        // Any case, as Spark's options; the bytes bound leaves the file count unbounded.
        assert_eq!(
            flags(serde_json::json!({"maxbytespertrigger": "1048576"})).unwrap(),
            [
                ("--max-files-per-batch", all),
                ("--max-bytes-per-batch", "1048576".to_owned())
            ]
        );
        for (options, message) in [
            (
                serde_json::json!({"maxFilesPerTrigger": 0}),
                "job.py:12: option maxFilesPerTrigger=\"0\" must be a positive integer",
            ),
            (
                serde_json::json!({"maxFilesPerTrigger": "x"}),
                "job.py:12: option maxFilesPerTrigger=\"x\" must be a positive integer",
            ),
            (
                serde_json::json!({"maxBytesPerTrigger": "0"}),
                "job.py:12: option maxBytesPerTrigger=\"0\": a batch must be allowed at least 1",
            ),
        ] {
            let e = flags(options).unwrap_err().to_string();
            assert!(e.starts_with(message), "{e}");
        }
        let e = flags(serde_json::json!({"maxFilesPerTrigger": 1, "maxBytesPerTrigger": 64}))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("job.py:12: "), "{e}");
        assert!(
            e.contains("maxFilesPerTrigger and maxBytesPerTrigger cannot both be set"),
            "{e}"
        );
    }
}
