//! `statebox tws-driver`: the real host behind the Python SDK's `TwsTester(host=True)`.
//!
//! PySpark's `TwsTester` runs a processor key by key in memory. Run against this driver, the
//! same tester calls go to the processor built into a component and run by the engine on a
//! fresh checkpoint, so a unit test sees what production runs: schema checks, timers, TTL.
//! The driver reads one JSON command per line on standard input and answers each with one
//! JSON line on standard output:
//!
//! - `{"open": {"processor": FILE, "class": NAME, "key": [COL...], "time_mode": M,
//!   "output_mode": M, "initial_state": [ROW...] | null}}` builds and opens the query;
//! - `{"batch": [ROW...], "at_ms": T}` runs the rows as batches at processing time `T`;
//! - `{"no_data": true, "at_ms": T}` runs a batch without input (timers due by `T` fire);
//! - `{"read": {"var": NAME, "key": [VALUE...]}}` reads one key's committed state.
//!
//! Answers: `{"emitted": [ROW...]}`, `{"rows": [...]}`, `{"ok": true}`, or
//! `{"error": MESSAGE}` (a failed batch commits nothing, as always).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use serde::Deserialize;
use serde_json::{Value, json};
use statebox_engine::{OutputMode, Query, QueryOptions, StateReader, TimeMode};

use crate::SandboxArgs;

/// `statebox tws-driver`.
#[derive(Args)]
pub(crate) struct TwsDriverArgs {
    #[command(flatten)]
    sandbox: SandboxArgs,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenSpec {
    processor: PathBuf,
    class: Option<String>,
    key: Vec<String>,
    time_mode: String,
    output_mode: String,
    initial_state: Option<Vec<Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadSpec {
    var: String,
    key: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Command {
    open: Option<OpenSpec>,
    batch: Option<Vec<Value>>,
    #[serde(default)]
    no_data: bool,
    at_ms: Option<i64>,
    read: Option<ReadSpec>,
}

/// The open query and where its files are.
struct Session {
    query: Query,
    key: Vec<String>,
    work: tempfile::TempDir,
    batches: usize,
}

impl Session {
    fn input(&self) -> PathBuf {
        self.work.path().join("input")
    }
    fn output(&self) -> PathBuf {
        self.work.path().join("output.jsonl")
    }
    fn checkpoint(&self) -> PathBuf {
        self.work.path().join("checkpoint")
    }
}

pub(crate) fn run(args: TwsDriverArgs) -> anyhow::Result<()> {
    let runtime = args.sandbox.runtime()?;
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let mut session: Option<Session> = None;
    for line in stdin.lock().lines() {
        let line = line.context("cannot read a command")?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Command>(&line) {
            Ok(command) => match step(&runtime, &mut session, command) {
                Ok(answer) => answer,
                Err(e) => json!({ "error": format!("{e:#}") }),
            },
            Err(e) => json!({ "error": format!("invalid command: {e}") }),
        };
        writeln!(stdout, "{answer}")?;
        stdout.flush()?;
    }
    Ok(())
}

fn step(
    runtime: &statebox_runtime::Runtime,
    session: &mut Option<Session>,
    command: Command,
) -> anyhow::Result<Value> {
    if let Some(spec) = command.open {
        *session = None;
        *session = Some(open(runtime, spec)?);
        return Ok(json!({ "ok": true }));
    }
    let Some(s) = session.as_mut() else {
        bail!("no query: send an `open` command first");
    };
    if let Some(read) = command.read {
        return Ok(json!({ "rows": read_key(&s.checkpoint(), &s.key, &read)? }));
    }
    let at_ms = command.at_ms.unwrap_or(0);
    let before = std::fs::metadata(s.output()).map_or(0, |m| m.len());
    let had_batch = command.batch.is_some();
    let rows = command.batch.unwrap_or_default();
    if !rows.is_empty() {
        s.batches += 1;
        let file = s.input().join(format!("{:06}.jsonl", s.batches));
        let mut text = String::new();
        for row in &rows {
            text.push_str(&serde_json::to_string(row)?);
            text.push('\n');
        }
        std::fs::write(&file, text)?;
        if let Err(e) = run_until_idle(&mut s.query, at_ms) {
            // A failed batch commits nothing; its input must not block later calls.
            std::fs::remove_file(&file).ok();
            return Err(e.into());
        }
    } else if command.no_data || had_batch {
        s.query.run_no_data(Some(at_ms))?;
        run_until_idle(&mut s.query, at_ms)?;
    } else {
        bail!("a command needs one of `open`, `batch`, `no_data` and `read`");
    }
    Ok(json!({ "emitted": rows_after(&s.output(), before)? }))
}

fn open(runtime: &statebox_runtime::Runtime, spec: OpenSpec) -> anyhow::Result<Session> {
    let options = crate::python::PythonOptions {
        class_name: spec.class.clone(),
        ..Default::default()
    };
    let wasm = crate::python::build(&spec.processor, &options)?;
    let processor = runtime
        .load_file(&wasm)
        .with_context(|| format!("cannot load processor {}", wasm.display()))?;
    let work = tempfile::Builder::new()
        .prefix("statebox-tws-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    std::fs::create_dir_all(work.path().join("input"))?;
    let initial_state = match &spec.initial_state {
        Some(rows) => {
            let path = work.path().join("initial-state.jsonl");
            let mut text = String::new();
            for row in rows {
                text.push_str(&serde_json::to_string(row)?);
                text.push('\n');
            }
            std::fs::write(&path, text)?;
            Some(path)
        }
        None => None,
    };
    let opts = QueryOptions {
        // One partition: the tester's calls run one key at a time anyway.
        partitions: Some(1),
        output_mode: Some(
            spec.output_mode
                .parse::<OutputMode>()
                .map_err(anyhow::Error::msg)?,
        ),
        time_mode: Some(
            spec.time_mode
                .parse::<TimeMode>()
                .map_err(anyhow::Error::msg)?,
        ),
        initial_state,
        ..QueryOptions::new(
            work.path().join("input"),
            work.path().join("output.jsonl"),
            work.path().join("checkpoint"),
            spec.key.clone(),
        )
    };
    let query = Query::open(opts, Arc::new(processor))?;
    Ok(Session {
        query,
        key: spec.key,
        work,
        batches: 0,
    })
}

fn run_until_idle(query: &mut Query, at_ms: i64) -> Result<(), statebox_engine::EngineError> {
    while query.run_next(Some(at_ms))?.is_some() {}
    Ok(())
}

/// The committed rows of `read.var` whose key is `read.key` (one row per value, list
/// element or map entry, as `statebox sql` reads them).
fn read_key(checkpoint: &Path, columns: &[String], read: &ReadSpec) -> anyhow::Result<Vec<Value>> {
    let mut rows = Vec::new();
    let reader = StateReader::open(checkpoint)?;
    if !reader.catalog().vars().any(|v| v.name == read.var) {
        // Declared but never written: nothing to read yet.
        return Ok(rows);
    }
    reader.read_state(&read.var, true, None, |row| {
        let key = &row["key"];
        let same = columns
            .iter()
            .zip(&read.key)
            .all(|(column, value)| &key[column] == value);
        if same {
            rows.push(row);
        }
        Ok(())
    })?;
    Ok(rows)
}

fn rows_after(output: &Path, offset: u64) -> anyhow::Result<Vec<Value>> {
    let bytes = match std::fs::read(output) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    bytes[start..]
        .split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_slice(line).context("an output row is not JSON"))
        .collect()
}
