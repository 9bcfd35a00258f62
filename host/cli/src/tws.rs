//! `statebox tws-driver`: the real host behind the Python SDK's `TwsTester(host=True)`.
//!
//! PySpark's `TwsTester` runs a processor key by key in memory. Run against this driver, the
//! same tester calls go to the processor built into a component and run by the engine on a
//! fresh checkpoint, so a unit test sees what production runs: schema checks, timers, TTL.
//! The driver reads one JSON command per line on standard input and answers each with one
//! JSON line on standard output:
//!
//! - `{"open": {"processor": FILE, "class": NAME, "key": [COL...], "time_mode": M,
//!   "output_mode": M, "initial_state": [ROW...] | null, "event_time": BOOL}}` builds and
//!   opens the query (in event time, each row's event time is its `__event_time` column);
//! - `{"batch": [ROW...], "at_ms": T}` runs the rows as one batch at processing time `T`;
//! - `{"no_data": true, "at_ms": T}` runs a batch without input (timers due by `T` fire);
//! - `{"state": {"key": [VALUE...], "ops": [OP...]}, "at_ms": T}` writes one key's state
//!   (`TwsTester.update*State`, `deleteState`), see below;
//! - `{"watermark": W, "at_ms": T}` moves the watermark to `W` (`TwsTester.setWatermark`);
//!   the event-time timers and TTL due by `W` fire;
//! - `{"read": {"var": NAME, "key": [VALUE...]}}` reads one key's committed state.
//!
//! Answers: `{"emitted": [ROW...]}`, `{"rows": [...]}`, `{"ok": true}`, or
//! `{"error": MESSAGE}` (a failed batch commits nothing, as always).
//!
//! The driver is the query's record source ([`TesterSource`]): each `batch` is one batch
//! of rows; a `watermark` is a batch without rows whose event time is the new watermark,
//! followed by the no-data batch the engine runs when the watermark advanced, as in
//! production. State writes go through the component and the host like any other: the
//! processor is built with the SDK's tester hook (`tws_driver=True`), which applies a row
//! carrying `__statebox_tws` (a JSON list of `{"var", "op", ...}` with stored JSON texts)
//! to the declared variables through the host's state imports, so the host checks every
//! value against the variable's schema and the batch commits it atomically. Only the
//! driver builds that hook in; production components never have it.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use clap::Args;
use serde::Deserialize;
use serde_json::{Value, json};
use statebox_engine::{
    Endpoints, EngineError, EventTimeOptions, OutputMode, Query, QueryOptions, RecordSource,
    SourceBatch, SourceText, StateReader, TimeMode,
};

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
    #[serde(default)]
    event_time: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StateSpec {
    key: Vec<Value>,
    ops: Vec<Value>,
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
    state: Option<StateSpec>,
    watermark: Option<i64>,
}

/// The column of a tester row that carries state writes for the SDK's tester hook.
const STATE_COLUMN: &str = "__statebox_tws";
/// The column that carries a row's event time (the tester's `eventTimeExtractor`).
const EVENT_TIME_COLUMN: &str = "__event_time";

/// What the next batch reads: rows, and in event time the watermark to move to.
#[derive(Default)]
struct Pending {
    rows: String,
    watermark: Option<i64>,
}

/// The query's record source: the tester's calls, one batch each. A plan holds its rows
/// and watermark itself, so a re-run reads exactly what was planned.
struct TesterSource(Arc<Mutex<Pending>>);

impl RecordSource for TesterSource {
    fn identity(&self) -> String {
        "tws-tester".into()
    }

    fn restore(&mut self, _: Vec<(String, Vec<u8>)>, _: bool) -> Result<(), EngineError> {
        Ok(())
    }

    fn plan(&mut self) -> Result<Option<Value>, EngineError> {
        let mut pending = self.0.lock().expect("tester source lock");
        if pending.rows.is_empty() && pending.watermark.is_none() {
            return Ok(None);
        }
        let next = std::mem::take(&mut *pending);
        Ok(Some(
            json!({ "rows": next.rows, "watermark": next.watermark }),
        ))
    }

    fn read(&mut self, plan: &Value) -> Result<SourceBatch, EngineError> {
        let text = plan["rows"].as_str().unwrap_or_default().to_owned();
        let lines = text.lines().count() as i64;
        Ok(SourceBatch {
            texts: vec![SourceText {
                name: "tester call".into(),
                text,
                positions: (0..lines).collect(),
            }],
            progress: Vec::new(),
        })
    }

    fn committed(&mut self, _: &Value) {}

    /// The watermark follows the tester alone (`setWatermark`), never the rows' event
    /// times, as in Spark's `TwsTester`.
    fn event_time_seen(
        &mut self,
        plan: &Value,
        _: &[Option<i64>],
        _: i64,
    ) -> (Option<i64>, Vec<(String, Vec<u8>)>) {
        (plan["watermark"].as_i64(), Vec::new())
    }
}

/// The open query and where its files are.
struct Session {
    query: Query,
    key: Vec<String>,
    work: tempfile::TempDir,
    pending: Arc<Mutex<Pending>>,
    event_time: bool,
    /// The watermark the tester last set (rows at or before it are late).
    watermark: i64,
}

impl Session {
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
    if let Some(state) = command.state {
        if state.key.len() != s.key.len() {
            bail!(
                "a key of {} column(s) expected, got {}",
                s.key.len(),
                state.key.len()
            );
        }
        let mut row = serde_json::Map::new();
        for (column, value) in s.key.iter().zip(state.key) {
            row.insert(column.clone(), value);
        }
        row.insert(
            STATE_COLUMN.into(),
            Value::String(serde_json::to_string(&state.ops)?),
        );
        if s.event_time {
            // Not late: the row must reach the processor.
            row.insert(
                EVENT_TIME_COLUMN.into(),
                json!(s.watermark.saturating_add(1)),
            );
        }
        s.pending.lock().expect("tester source lock").rows = format!("{}\n", Value::Object(row));
        run_until_idle(&mut s.query, at_ms)?;
    } else if let Some(watermark) = command.watermark {
        if !s.event_time {
            bail!("setWatermark needs time mode event-time");
        }
        s.pending.lock().expect("tester source lock").watermark = Some(watermark);
        run_until_idle(&mut s.query, at_ms)?;
        s.watermark = s.watermark.max(watermark);
    } else if let Some(rows) = command.batch.as_ref().filter(|rows| !rows.is_empty()) {
        let mut text = String::new();
        for row in rows {
            text.push_str(&serde_json::to_string(row)?);
            text.push('\n');
        }
        s.pending.lock().expect("tester source lock").rows = text;
        run_until_idle(&mut s.query, at_ms)?;
    } else if command.no_data || command.batch.is_some() {
        s.query.run_no_data(Some(at_ms))?;
        run_until_idle(&mut s.query, at_ms)?;
    } else {
        bail!("a command needs one of `open`, `batch`, `no_data`, `state`, `watermark` and `read`");
    }
    Ok(json!({ "emitted": rows_after(&s.output(), before)? }))
}

fn open(runtime: &statebox_runtime::Runtime, spec: OpenSpec) -> anyhow::Result<Session> {
    let options = crate::python::PythonOptions {
        class_name: spec.class.clone(),
        tws_driver: true,
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
    // Unread (the driver is the query's source), but part of the query's options.
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
        event_time: spec.event_time.then(|| EventTimeOptions {
            column: EVENT_TIME_COLUMN.into(),
            watermark_delay_ms: 0,
        }),
        ..QueryOptions::new(
            work.path().join("input"),
            work.path().join("output.jsonl"),
            work.path().join("checkpoint"),
            spec.key.clone(),
        )
    };
    let pending = Arc::new(Mutex::new(Pending::default()));
    let endpoints = Endpoints {
        source: Some(Box::new(TesterSource(pending.clone()))),
        sink: None,
        plans: None,
    };
    let query = Query::open_with(opts, Arc::new(processor), endpoints)?;
    Ok(Session {
        query,
        key: spec.key,
        work,
        pending,
        event_time: spec.event_time,
        watermark: 0,
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
