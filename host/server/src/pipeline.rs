//! A running pipeline: its input log, its status, and the runner thread that owns its
//! [`Query`] and runs a batch whenever new input arrives or the trigger interval passes.
//!
//! A failed batch commits nothing (the engine's guarantee); the runner retries it with
//! exponential backoff and marks the pipeline failed, with the reason, after the configured
//! number of attempts. A batch that would take the tenant's state past its quota fails
//! before it commits and fails the pipeline at once, and so does a panic anywhere in the
//! runner (a partition worker's included).
//!
//! Nothing waits on a runner without a bound: a runner may be inside a guest call that
//! takes its whole deadline (or longer, if the guest found a way to block). Stopping asks
//! the runner to stop after its current batch and waits a bounded time; past it the
//! pipeline shows `stopping` and its runner ends on its own. Starting a pipeline whose old
//! runner is still stopping is refused with a reason, not queued.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use statebox_engine::{BatchReport, Endpoints, EngineError, Query, QueryOptions, TimeMode};

use crate::App;
use crate::disk::{dir_size, pipeline_disk_bytes, reclaim_input};
use crate::input_log::InputLog;
use crate::meter::Metered;
use crate::metrics::PipelineMetrics;
use crate::retention::{Policy, Retention};
pub(crate) use crate::rows::IngestCheck;

/// What a pipeline is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RunState {
    Starting,
    Running,
    /// The last batch failed; it is retried after a backoff.
    Retrying,
    /// Asked to stop; its runner is still finishing the current batch.
    Stopping,
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
    /// The last committed batch's progress: its commit record and how long it took
    /// (serialized as one flat object, as `--progress-json` prints it).
    pub last_progress: Option<BatchReport>,
}

/// What the runner needs to run a pipeline.
pub(crate) struct RunnerSpec {
    pub factory: Arc<Metered>,
    pub opts: QueryOptions,
    /// Kafka source and sink, where the pipeline has them (see [`crate::kafka`]).
    pub endpoints: Endpoints,
    pub trigger: Duration,
    pub time_mode: TimeMode,
    pub max_attempts: u32,
    pub backoff: Duration,
    /// How long [`PipelineHandle::start`] waits for the query to open.
    pub open_wait: Duration,
}

enum Command {
    /// New input was acknowledged.
    Input,
    /// Stop after the current batch.
    Stop,
}

/// Why a pipeline cannot start while its previous runner is still stopping.
pub(crate) const STILL_STOPPING: &str = "the pipeline's previous runner is still finishing its \
     current batch (a processor call that has not returned yet); it stops on its own when \
     the call ends: retry then";

/// A pipeline known to the server.
pub(crate) struct PipelineHandle {
    pub id: String,
    pub tenant: String,
    pub dir: PathBuf,
    pub log: InputLog,
    pub status: Mutex<Status>,
    pub metrics: PipelineMetrics,
    pub ingest: Mutex<Arc<IngestCheck>>,
    /// Whether `ingest` holds the processor's checks (false while a pipeline resumes after
    /// a restart and its processor is not loaded yet: ingest then waits).
    pub checks_ready: std::sync::atomic::AtomicBool,
    /// Why the pipeline stopped at its tenant's state quota (ingest is refused with it
    /// until the pipeline starts again).
    pub state_quota_failure: Mutex<Option<String>>,
    /// The first byte of the output still kept (see [`crate::retention`]): readers refuse
    /// offsets before it. Moved by the runner before the bytes before it are dropped.
    pub output_start: std::sync::atomic::AtomicU64,
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
            checks_ready: std::sync::atomic::AtomicBool::new(true),
            state_quota_failure: Mutex::new(None),
            output_start: std::sync::atomic::AtomicU64::new(Retention::start_of(dir)),
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

    /// Whether the runner was asked to stop and has not stopped yet.
    pub fn is_stopping(&self) -> bool {
        self.is_running() && self.commands.lock().expect("commands lock").is_none()
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
    /// does not accept, with the engine's reason) and returns once it is open, or after
    /// the spec's `open_wait` with the pipeline still `starting` (the open runs the
    /// processor's `init`; the runner then reports the outcome in the pipeline's status). Refused while a previous runner is
    /// still stopping ([`STILL_STOPPING`]). Blocks.
    pub fn start(self: &Arc<Self>, spec: RunnerSpec, app: Weak<App>) -> Result<(), String> {
        let open_wait = spec.open_wait;
        let opened_rx = {
            let mut thread = self.thread.lock().expect("thread lock");
            if let Some(t) = thread.take() {
                if !t.is_finished() {
                    *thread = Some(t);
                    if self.commands.lock().expect("commands lock").is_none() {
                        return Err(STILL_STOPPING.into());
                    }
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
            *thread = Some(t);
            opened_rx
        };
        match opened_rx.recv_timeout(open_wait) {
            Ok(Ok(())) => Ok(()),
            // Still opening (a slow `init`): the runner reports the outcome itself.
            Err(RecvTimeoutError::Timeout) => Ok(()),
            Ok(Err(reason)) => {
                *self.commands.lock().expect("commands lock") = None;
                let thread = self.thread.lock().expect("thread lock").take();
                if let Some(t) = thread {
                    let _ = t.join();
                }
                Err(reason)
            }
            Err(RecvTimeoutError::Disconnected) => {
                *self.commands.lock().expect("commands lock") = None;
                let reason = self.status().failure.unwrap_or_else(|| {
                    "the pipeline's runner ended while opening the query".into()
                });
                Err(reason)
            }
        }
    }

    /// Asks the runner to stop after its current batch; returns at once. The pipeline
    /// shows `stopping` until the runner has stopped.
    pub fn request_stop(&self) {
        let tx = self.commands.lock().expect("commands lock").take();
        if let Some(tx) = tx {
            let _ = tx.send(Command::Stop);
        }
        let alive = self
            .thread
            .lock()
            .expect("thread lock")
            .as_ref()
            .is_some_and(|t| !t.is_finished());
        let mut status = self.status.lock().expect("status lock");
        if alive
            && matches!(
                status.state,
                RunState::Running | RunState::Retrying | RunState::Starting
            )
        {
            status.state = RunState::Stopping;
        }
    }

    /// Waits up to `wait` for the runner to end; whether it has.
    pub fn wait_stopped(&self, wait: Duration) -> bool {
        let deadline = Instant::now().checked_add(wait);
        loop {
            {
                let mut thread = self.thread.lock().expect("thread lock");
                match thread.as_ref() {
                    None => return true,
                    Some(t) if t.is_finished() => {
                        if let Some(t) = thread.take() {
                            let _ = t.join();
                        }
                        return true;
                    }
                    Some(_) => {}
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the runner after its current batch, waiting up to `wait`; whether it stopped
    /// (if not, it is `stopping` and stops on its own).
    pub fn stop(&self, wait: Duration) -> bool {
        self.request_stop();
        self.wait_stopped(wait)
    }

    /// Stops the runner, waiting up to `wait`; then (or, if the runner is still stopping,
    /// once it has stopped, on a thread of its own) runs `then`. Whether `then` ran already.
    pub fn stop_then(
        self: &Arc<Self>,
        wait: Duration,
        then: impl FnOnce() + Send + 'static,
    ) -> bool {
        if self.stop(wait) {
            then();
            return true;
        }
        let handle = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("stopping-{}", self.id))
            .spawn(move || {
                handle.wait_stopped(Duration::MAX);
                then();
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, pipeline = %self.id, "cannot wait for the runner to stop");
        }
        false
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
    retention: std::cell::RefCell<Retention>,
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
        let retention = Retention::load(&handle.dir, PipelineHandle::output_path(&handle.dir));
        Runner {
            handle,
            spec,
            app,
            rx,
            retention: std::cell::RefCell::new(retention),
        }
    }

    fn set_status(&self, f: impl FnOnce(&mut Status)) {
        f(&mut self.handle.status.lock().expect("status lock"));
    }

    /// Runs the pipeline until stopped; a panic anywhere in it (a partition worker's
    /// included) marks the pipeline failed (see [`guarded`]).
    fn run(self, opened: mpsc::Sender<Result<(), String>>) {
        let handle = self.handle.clone();
        let app = self.app.clone();
        guarded(&handle, &app, move || self.run_inner(opened));
    }

    fn run_inner(mut self, opened: mpsc::Sender<Result<(), String>>) {
        let opts = self.spec.opts.clone();
        let endpoints = std::mem::take(&mut self.spec.endpoints);
        let mut query = match Query::open_with(opts, self.spec.factory.clone(), endpoints) {
            Ok(q) => q,
            Err(e) => {
                let reason = crate::bounded_message(&e.to_string());
                self.set_status(|s| {
                    s.state = RunState::Failed;
                    s.failure = Some(reason.clone());
                });
                // Nobody waits any more (the open took long): record the failure here.
                if opened.send(Err(reason.clone())).is_err()
                    && let Some(app) = self.app.upgrade()
                {
                    app.pipeline_failed(&self.handle.id, &reason);
                }
                return;
            }
        };
        let state_bytes = dir_size(&self.spec.opts.checkpoint);
        self.handle
            .metrics
            .state_bytes
            .store(state_bytes, Ordering::Relaxed);
        *self
            .handle
            .state_quota_failure
            .lock()
            .expect("state quota lock") = None;
        self.set_status(|s| {
            s.state = RunState::Running;
            s.failure = None;
            s.last_error = None;
            s.failed_attempts = 0;
            s.state_bytes = state_bytes;
            if let Some(last) = query.last_report() {
                s.committed_output_bytes = last.output_bytes;
                s.last_progress = Some(last);
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
            let mut stop = false;
            match self.rx.recv_timeout(due.saturating_duration_since(now)) {
                Ok(Command::Input) => pending = true,
                Ok(Command::Stop) | Err(RecvTimeoutError::Disconnected) => stop = true,
                Err(RecvTimeoutError::Timeout) => {}
            }
            // Commands that queued up during a batch: a stop wins, inputs coalesce.
            while !stop {
                match self.rx.try_recv() {
                    Ok(Command::Input) => pending = true,
                    Ok(Command::Stop) | Err(mpsc::TryRecvError::Disconnected) => stop = true,
                    Err(mpsc::TryRecvError::Empty) => break,
                }
            }
            if stop {
                drop(query);
                self.set_status(|s| {
                    if s.state != RunState::Failed {
                        s.state = RunState::Stopped;
                    }
                });
                tracing::info!(pipeline = %self.handle.id, "pipeline stopped");
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
                    self.retain();
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
                        s.last_error = Some(crate::bounded_message(&reason));
                        s.failed_attempts = attempts;
                    });
                }
            }
        }
    }

    fn fail(&self, reason: String) {
        tracing::warn!(pipeline = %self.handle.id, "pipeline failed");
        let reason = crate::bounded_message(&reason);
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
            self.spec.factory.meter.budget.reset();
            self.limit_state(query);
            match query.run_next(None) {
                Ok(Some(report)) => {
                    ran += 1;
                    self.record(&report);
                }
                Ok(None) => {
                    // Caught up: every sealed segment is read. Processed input is removed
                    // in bulk while rows keep coming, and all of it once a round finds
                    // nothing new.
                    let input = PipelineHandle::input_dir(&self.handle.dir);
                    if reclaim_input(&input, ran == 0) {
                        self.handle
                            .metrics
                            .disk_bytes
                            .store(pipeline_disk_bytes(&self.handle.dir), Ordering::Relaxed);
                    }
                    break;
                }
                Err(e) => return Err(self.failure(e)),
            }
        }
        if ran == BATCHES_PER_ROUND {
            return Ok(true);
        }
        if ran == 0 && tick && statebox_engine::idle_tick_runs_no_data(self.spec.time_mode) {
            self.spec.factory.meter.budget.reset();
            self.limit_state(query);
            let report = query.run_no_data(None).map_err(|e| self.failure(e))?;
            self.record(&report);
        }
        Ok(false)
    }

    /// Drops the committed output past the tenant's retention (see [`crate::retention`]).
    fn retain(&self) {
        let Some(app) = self.app.upgrade() else {
            return;
        };
        let quotas = app.quotas(&self.handle.tenant);
        let policy = Policy {
            bytes: quotas.output_retention_bytes,
            age_ms: quotas.output_retention_ms,
        };
        let committed = self.handle.status().committed_output_bytes;
        let start = &self.handle.output_start;
        let before = start.load(Ordering::Acquire);
        let applied = self.retention.borrow_mut().apply(
            committed,
            crate::registry::now_ms(),
            policy,
            |new| start.store(new, Ordering::Release),
        );
        if let Err(e) = applied {
            tracing::warn!(error = %e, pipeline = %self.handle.id, "cannot drop output past its retention");
        }
        if start.load(Ordering::Acquire) != before {
            self.handle
                .metrics
                .disk_bytes
                .store(pipeline_disk_bytes(&self.handle.dir), Ordering::Relaxed);
        }
    }

    /// Lets the next batch write at most what is left of the tenant's state quota (over
    /// all its pipelines, as measured on disk after their last commits), so that no batch
    /// commits past it.
    fn limit_state(&self, query: &mut Query) {
        if let Some(app) = self.app.upgrade() {
            let (used, quota) = app.state_usage(&self.handle.tenant);
            query.set_state_write_limit(Some(quota.saturating_sub(used)));
        }
    }

    /// What a failed batch means for the pipeline: one over the state quota stops it (it
    /// would fail again), anything else is retried.
    fn failure(&self, e: EngineError) -> Failure {
        let EngineError::StateLimit { bytes, limit } = e else {
            return Failure::Batch(e.to_string());
        };
        let quota = self
            .app
            .upgrade()
            .map_or(0, |app| app.state_usage(&self.handle.tenant).1);
        let reason = format!(
            "the batch would write {bytes} bytes of state, but only {limit} bytes are left \
             of the tenant's state quota of {quota} bytes (`max_state_bytes`, over all its \
             pipelines); nothing of the batch was committed. Raise the quota and start the \
             pipeline again"
        );
        *self
            .handle
            .state_quota_failure
            .lock()
            .expect("state quota lock") = Some(reason.clone());
        Failure::Fatal(reason)
    }

    fn record(&self, report: &BatchReport) {
        let c = &report.commit;
        let m = &self.handle.metrics;
        m.output_rows.fetch_add(c.output_rows, Ordering::Relaxed);
        m.batches.fetch_add(1, Ordering::Relaxed);
        m.observe_batch(report.timing.duration_ms as f64 / 1000.0);
        let state_bytes = dir_size(&self.spec.opts.checkpoint);
        m.state_bytes.store(state_bytes, Ordering::Relaxed);
        m.disk_bytes
            .store(pipeline_disk_bytes(&self.handle.dir), Ordering::Relaxed);
        self.set_status(|s| {
            s.committed_output_bytes = c.output_bytes;
            s.state_bytes = state_bytes;
            s.last_progress = Some(report.clone());
        });
        // Last, and released: whoever sees the batch's rows counted as processed (the API's
        // `rows_processed`) sees its state and disk bytes and its status too.
        m.input_rows.fetch_add(c.input_rows, Ordering::Release);
        tracing::debug!(
            pipeline = %self.handle.id,
            batch_id = c.batch_id,
            input_rows = c.input_rows,
            output_rows = c.output_rows,
            duration_ms = report.timing.duration_ms,
            "batch committed"
        );
    }
}

/// Runs a pipeline's runner `body`; if it panics, marks the pipeline failed with the
/// panic's message (in its status and, durably, in the registry) instead of leaving it
/// `running` with no runner.
fn guarded(handle: &PipelineHandle, app: &Weak<App>, body: impl FnOnce()) {
    let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(body)) else {
        return;
    };
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    let reason = crate::bounded_message(&format!(
        "the pipeline's runner panicked (a bug in the host; the batch committed nothing): \
         {message}"
    ));
    tracing::error!(pipeline = %handle.id, "the pipeline's runner panicked");
    {
        let mut status = handle.status.lock().expect("status lock");
        status.state = RunState::Failed;
        status.failure = Some(reason.clone());
    }
    if let Some(app) = app.upgrade() {
        app.pipeline_failed(&handle.id, &reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_runner_marks_the_pipeline_failed() {
        let dir = tempfile::tempdir().unwrap();
        let handle = PipelineHandle::new(
            "pl_test",
            "tn_test",
            dir.path(),
            IngestCheck::new(None, vec!["k".into()], None),
        )
        .unwrap();
        handle.status.lock().unwrap().state = RunState::Running;
        guarded(&handle, &Weak::new(), || {
            std::thread::scope(|s| {
                s.spawn(|| panic!("a partition worker broke"))
                    .join()
                    .expect("partition worker panicked")
            })
        });
        let status = handle.status();
        assert_eq!(status.state, RunState::Failed);
        let failure = status.failure.unwrap();
        assert!(failure.contains("runner panicked"), "{failure}");
        assert!(failure.contains("partition worker panicked"), "{failure}");
    }
}
