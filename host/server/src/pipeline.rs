//! A running pipeline: its input log, its status, and the runner thread that owns its
//! [`Query`] and runs a batch whenever new input arrives or the trigger interval passes.
//!
//! A failed batch commits nothing (the engine's guarantee); the runner retries it with
//! exponential backoff and marks the pipeline failed, with the reason, after the configured
//! number of attempts. Quota violations (state bytes) fail the pipeline at once.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use statebox_engine::{BatchReport, CommitRecord, Query, QueryOptions, TimeMode};
use statebox_schema::RowScanner;

use crate::App;
use crate::input_log::InputLog;
use crate::meter::Metered;
use crate::metrics::PipelineMetrics;

/// What a pipeline is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RunState {
    Starting,
    Running,
    /// The last batch failed; it is retried after a backoff.
    Retrying,
    Stopped,
    Failed,
}

/// A pipeline's live status.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Status {
    pub state: RunState,
    /// Why the pipeline failed (state `failed`).
    pub failure: Option<String>,
    /// The last batch failure, while retrying.
    pub last_error: Option<String>,
    /// Consecutive failed attempts of the current batch.
    pub failed_attempts: u32,
    /// Bytes of committed output; `GET .../output` reads up to here.
    pub committed_output_bytes: u64,
    /// Bytes of the checkpoint on disk after the last batch.
    pub state_bytes: u64,
    /// The last committed batch's progress record.
    pub last_progress: Option<CommitRecord>,
}

/// How a pipeline's input rows are checked before they are acknowledged: the same
/// checks the engine makes when it decodes a batch, so an acknowledged row never fails one.
pub(crate) struct IngestCheck {
    pub scanner: RowScanner,
    pub key: Vec<String>,
    pub event_time: Option<String>,
    pub has_schema: bool,
}

impl IngestCheck {
    pub fn new(
        schema: Option<statebox_schema::Schema>,
        key: Vec<String>,
        event_time: Option<String>,
    ) -> IngestCheck {
        let mut columns = key.clone();
        columns.extend(event_time.clone());
        IngestCheck {
            has_schema: schema.is_some(),
            scanner: RowScanner::new(schema, columns),
            key,
            event_time,
        }
    }

    /// Checks one row (a JSON object on one line).
    pub fn check(&self, line: &str) -> Result<(), String> {
        if !line.trim_start().starts_with('{') {
            return Err("a row must be a JSON object".into());
        }
        if !self.has_schema {
            serde_json::from_str::<serde::de::IgnoredAny>(line)
                .map_err(|e| format!("invalid JSON: {e}"))?;
        }
        let columns = self.scanner.scan(line).map_err(|e| e.to_string())?;
        for (column, value) in self.key.iter().zip(&columns) {
            if value.is_none() {
                return Err(format!("the row has no key column `{column}`"));
            }
        }
        if let Some(column) = &self.event_time {
            let Some(raw) = columns[self.key.len()] else {
                return Err(format!("the row has no event-time column `{column}`"));
            };
            statebox_schema::timestamp_millis(raw.get())
                .map_err(|e| format!("event-time column `{column}`: {e}"))?;
        }
        Ok(())
    }
}

/// What the runner needs to run a pipeline.
pub(crate) struct RunnerSpec {
    pub factory: Arc<Metered>,
    pub opts: QueryOptions,
    pub trigger: Duration,
    pub time_mode: TimeMode,
    pub max_attempts: u32,
    pub backoff: Duration,
}

enum Command {
    /// New input was acknowledged.
    Input,
    /// Stop after the current batch; reply when stopped.
    Stop(mpsc::Sender<()>),
}

/// A pipeline known to the server.
pub(crate) struct PipelineHandle {
    pub id: String,
    pub tenant: String,
    pub dir: PathBuf,
    pub log: InputLog,
    pub status: Mutex<Status>,
    pub metrics: PipelineMetrics,
    pub ingest: Mutex<Arc<IngestCheck>>,
    commands: Mutex<Option<mpsc::Sender<Command>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl PipelineHandle {
    /// The handle of the pipeline in `dir`, its input log recovered; not running yet.
    pub fn new(
        id: &str,
        tenant: &str,
        dir: &Path,
        ingest: IngestCheck,
    ) -> std::io::Result<PipelineHandle> {
        let log = InputLog::open(&dir.join("input"), id)?;
        Ok(PipelineHandle {
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            dir: dir.to_owned(),
            log,
            status: Mutex::new(Status {
                state: RunState::Stopped,
                failure: None,
                last_error: None,
                failed_attempts: 0,
                committed_output_bytes: 0,
                state_bytes: 0,
                last_progress: None,
            }),
            metrics: PipelineMetrics::default(),
            ingest: Mutex::new(Arc::new(ingest)),
            commands: Mutex::new(None),
            thread: Mutex::new(None),
        })
    }

    pub fn input_dir(dir: &Path) -> PathBuf {
        dir.join("input")
    }

    pub fn output_path(dir: &Path) -> PathBuf {
        dir.join("output.jsonl")
    }

    pub fn checkpoint_dir(dir: &Path) -> PathBuf {
        dir.join("checkpoint")
    }

    pub fn initial_state_path(dir: &Path) -> PathBuf {
        dir.join("initial-state.jsonl")
    }

    pub fn status(&self) -> Status {
        self.status.lock().expect("status lock").clone()
    }

    /// Whether the runner thread is alive.
    pub fn is_running(&self) -> bool {
        self.thread
            .lock()
            .expect("thread lock")
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Starts the runner: opens the query (refusing settings or a processor the checkpoint
    /// does not accept, with the engine's reason) and returns once it is open. Blocks.
    pub fn start(self: &Arc<Self>, spec: RunnerSpec, app: Weak<App>) -> Result<(), String> {
        let mut thread = self.thread.lock().expect("thread lock");
        if let Some(t) = thread.take() {
            if !t.is_finished() {
                *thread = Some(t);
                return Ok(());
            }
            let _ = t.join();
        }
        self.status.lock().expect("status lock").state = RunState::Starting;
        let (tx, rx) = mpsc::channel();
        let (opened_tx, opened_rx) = mpsc::channel();
        *self.commands.lock().expect("commands lock") = Some(tx);
        let handle = self.clone();
        let t = std::thread::Builder::new()
            .name(format!("pipeline-{}", self.id))
            .spawn(move || Runner::new(handle, spec, app, rx).run(opened_tx))
            .map_err(|e| format!("cannot start the pipeline's thread: {e}"))?;
        match opened_rx.recv() {
            Ok(Ok(())) => {
                *thread = Some(t);
                Ok(())
            }
            Ok(Err(reason)) => {
                let _ = t.join();
                *self.commands.lock().expect("commands lock") = None;
                let mut status = self.status.lock().expect("status lock");
                status.state = RunState::Failed;
                status.failure = Some(reason.clone());
                Err(reason)
            }
            Err(_) => {
                let _ = t.join();
                Err("the pipeline's thread ended while opening the query".into())
            }
        }
    }

    /// Stops the runner after its current batch. Blocks until it has stopped.
    pub fn stop(&self) {
        let tx = self.commands.lock().expect("commands lock").take();
        if let Some(tx) = tx {
            let (reply, stopped) = mpsc::channel();
            if tx.send(Command::Stop(reply)).is_ok() {
                let _ = stopped.recv();
            }
        }
        let thread = self.thread.lock().expect("thread lock").take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// Tells the runner new input was acknowledged.
    pub fn notify(&self) {
        if let Some(tx) = self.commands.lock().expect("commands lock").as_ref() {
            let _ = tx.send(Command::Input);
        }
    }
}

enum Failure {
    /// The batch failed and committed nothing; worth retrying.
    Batch(String),
    /// The pipeline cannot go on (a quota); no retry.
    Fatal(String),
}

struct Runner {
    handle: Arc<PipelineHandle>,
    spec: RunnerSpec,
    app: Weak<App>,
    rx: mpsc::Receiver<Command>,
}

/// The largest wait between retries of a failed batch.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Batches run back to back before the runner looks at its commands again.
const BATCHES_PER_ROUND: usize = 8;

impl Runner {
    fn new(
        handle: Arc<PipelineHandle>,
        spec: RunnerSpec,
        app: Weak<App>,
        rx: mpsc::Receiver<Command>,
    ) -> Runner {
        Runner {
            handle,
            spec,
            app,
            rx,
        }
    }

    fn set_status(&self, f: impl FnOnce(&mut Status)) {
        f(&mut self.handle.status.lock().expect("status lock"));
    }

    fn run(self, opened: mpsc::Sender<Result<(), String>>) {
        let opts = self.spec.opts.clone();
        let mut query = match Query::open(opts, self.spec.factory.clone()) {
            Ok(q) => q,
            Err(e) => {
                let _ = opened.send(Err(format!("{e}")));
                return;
            }
        };
        let state_bytes = dir_size(&self.spec.opts.checkpoint);
        self.handle
            .metrics
            .state_bytes
            .store(state_bytes, Ordering::Relaxed);
        self.set_status(|s| {
            s.state = RunState::Running;
            s.failure = None;
            s.last_error = None;
            s.failed_attempts = 0;
            s.state_bytes = state_bytes;
            if let Some(head) = query.head() {
                s.committed_output_bytes = head.output_bytes;
                s.last_progress = Some(head.clone());
            }
        });
        let _ = opened.send(Ok(()));
        tracing::info!(pipeline = %self.handle.id, "pipeline running");

        // Input logged before this start (or before a crash) is picked up at once.
        let mut pending = true;
        let mut next_tick = Instant::now() + self.spec.trigger;
        let mut retry_at: Option<Instant> = None;
        let mut attempts = 0u32;
        loop {
            let now = Instant::now();
            let due = match retry_at {
                Some(at) => at,
                None if pending => now,
                None => next_tick,
            };
            let mut stop = None;
            match self.rx.recv_timeout(due.saturating_duration_since(now)) {
                Ok(Command::Input) => pending = true,
                Ok(Command::Stop(reply)) => stop = Some(Some(reply)),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => stop = Some(None),
            }
            // Commands that queued up during a batch: a stop wins, inputs coalesce.
            while stop.is_none() {
                match self.rx.try_recv() {
                    Ok(Command::Input) => pending = true,
                    Ok(Command::Stop(reply)) => stop = Some(Some(reply)),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => stop = Some(None),
                }
            }
            if let Some(reply) = stop {
                drop(query);
                self.set_status(|s| {
                    if s.state != RunState::Failed {
                        s.state = RunState::Stopped;
                    }
                });
                tracing::info!(pipeline = %self.handle.id, "pipeline stopped");
                if let Some(reply) = reply {
                    let _ = reply.send(());
                }
                return;
            }
            let now = Instant::now();
            if retry_at.is_some_and(|at| now < at) {
                continue;
            }
            let tick = now >= next_tick;
            if !pending && !tick && retry_at.is_none() {
                continue;
            }
            if tick {
                next_tick = now + self.spec.trigger;
            }
            pending = false;
            match self.run_batches(&mut query, tick) {
                Ok(more) => {
                    pending |= more;
                    if retry_at.take().is_some() || attempts > 0 {
                        attempts = 0;
                        self.set_status(|s| {
                            s.state = RunState::Running;
                            s.last_error = None;
                            s.failed_attempts = 0;
                        });
                    }
                }
                Err(Failure::Fatal(reason)) => {
                    self.fail(reason);
                    return;
                }
                Err(Failure::Batch(reason)) => {
                    attempts += 1;
                    self.handle
                        .metrics
                        .batch_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        pipeline = %self.handle.id,
                        attempt = attempts,
                        max_attempts = self.spec.max_attempts,
                        "batch failed; nothing was committed"
                    );
                    if attempts >= self.spec.max_attempts {
                        self.fail(format!(
                            "the batch failed {attempts} times (nothing was committed); last \
                             error: {reason}"
                        ));
                        return;
                    }
                    let backoff = self
                        .spec
                        .backoff
                        .saturating_mul(1 << (attempts - 1).min(16))
                        .min(MAX_BACKOFF);
                    retry_at = Some(Instant::now() + backoff);
                    pending = true;
                    self.set_status(|s| {
                        s.state = RunState::Retrying;
                        s.last_error = Some(reason);
                        s.failed_attempts = attempts;
                    });
                }
            }
        }
    }

    fn fail(&self, reason: String) {
        tracing::warn!(pipeline = %self.handle.id, "pipeline failed");
        self.set_status(|s| {
            s.state = RunState::Failed;
            s.failure = Some(reason.clone());
        });
        if let Some(app) = self.app.upgrade() {
            app.pipeline_failed(&self.handle.id, &reason);
        }
    }

    /// Runs batches over everything sealed so far (up to [`BATCHES_PER_ROUND`]); on a
    /// trigger tick without input, a no-data batch in time modes with timers. Returns
    /// whether input may remain.
    fn run_batches(&self, query: &mut Query, tick: bool) -> Result<bool, Failure> {
        self.handle.log.seal().map_err(Failure::Batch)?;
        let mut ran = 0;
        while ran < BATCHES_PER_ROUND {
            self.spec.factory.budget.reset();
            match query.run_next(None) {
                Ok(Some(report)) => {
                    ran += 1;
                    self.record(&report)?;
                }
                Ok(None) => break,
                Err(e) => return Err(Failure::Batch(e.to_string())),
            }
        }
        if ran == BATCHES_PER_ROUND {
            return Ok(true);
        }
        if ran == 0 && tick && self.spec.time_mode != TimeMode::None {
            self.spec.factory.budget.reset();
            let report = query
                .run_no_data(None)
                .map_err(|e| Failure::Batch(e.to_string()))?;
            self.record(&report)?;
        }
        Ok(false)
    }

    fn record(&self, report: &BatchReport) -> Result<(), Failure> {
        let c = &report.commit;
        let m = &self.handle.metrics;
        m.input_rows.fetch_add(c.input_rows, Ordering::Relaxed);
        m.output_rows.fetch_add(c.output_rows, Ordering::Relaxed);
        m.batches.fetch_add(1, Ordering::Relaxed);
        m.observe_batch(c.duration_ms as f64 / 1000.0);
        let state_bytes = dir_size(&self.spec.opts.checkpoint);
        m.state_bytes.store(state_bytes, Ordering::Relaxed);
        self.set_status(|s| {
            s.committed_output_bytes = c.output_bytes;
            s.state_bytes = state_bytes;
            s.last_progress = Some(c.clone());
        });
        tracing::debug!(
            pipeline = %self.handle.id,
            batch_id = c.batch_id,
            input_rows = c.input_rows,
            output_rows = c.output_rows,
            duration_ms = c.duration_ms,
            "batch committed"
        );
        if let Some(app) = self.app.upgrade() {
            app.check_state_quota(&self.handle.tenant)
                .map_err(Failure::Fatal)?;
        }
        Ok(())
    }
}

/// Bytes of the files under `dir`.
pub(crate) fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}
