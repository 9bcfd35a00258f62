//! A query bound to its checkpoint: opening it (`query/open.rs`), the batch loop here
//! (plan, run, roll back a failed batch, snapshot, the no-data batch policy), and one
//! batch's steps (`query/batch.rs`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use statebox_state::catalog::Catalog;
use statebox_state::{Checkpoint, Commit};

use crate::config::meta;
use crate::sink::Sink;
use crate::{
    BatchPlan, BatchReport, BatchSink, BatchTiming, CommitRecord, EngineError, FileProgress,
    FileRange, FileSource, PartitionProcessor, PlanLog, ProcessorFactory, QueryConfig,
    QueryOptions, RecordSource, TimeMode, reader,
};

mod batch;
mod open;

/// A query bound to a checkpoint, ready to run batches.
pub struct Query {
    opts: QueryOptions,
    factory: Arc<dyn ProcessorFactory>,
    checkpoint: Checkpoint,
    config: QueryConfig,
    catalog: Arc<Mutex<Catalog>>,
    instances: Vec<Option<Box<dyn PartitionProcessor>>>,
    /// This run's id, new each time the query is opened.
    run_id: String,
    source: FileSource,
    progress: BTreeMap<String, FileProgress>,
    /// A source other than files; `source` and `progress` are then unused.
    records: Option<Box<dyn RecordSource>>,
    /// Plans shared with other processes that may run this query (see [`PlanLog`]).
    plans: Option<Box<dyn PlanLog>>,
    head: Option<CommitRecord>,
    /// How long the head's batch took (see [`Query::last_report`]).
    head_timing: BatchTiming,
    sink: Output,
    scanner: statebox_schema::RowScanner,
    /// Bytes of state the next batch may write (see [`Query::set_state_write_limit`]).
    state_write_limit: Option<u64>,
}

/// Where a query's rows go.
enum Output {
    /// The JSON Lines file of [`QueryOptions::output`].
    File(Sink),
    /// A [`BatchSink`]. `reopen` is set after a batch failed with its delivery's outcome
    /// unknown: the sink must learn again which batches it has before the next one.
    Batches {
        sink: Box<dyn BatchSink>,
        reopen: bool,
    },
}

/// A query's input and output when they are not the files of [`QueryOptions`].
#[derive(Default)]
pub struct Endpoints {
    /// Read records from this source instead of [`QueryOptions::input`].
    pub source: Option<Box<dyn RecordSource>>,
    /// Deliver rows to this sink instead of appending them to [`QueryOptions::output`].
    pub sink: Option<Box<dyn BatchSink>>,
    /// Log each batch's plan here too, and run the plans found here (a query shared by
    /// workers; see [`PlanLog`]).
    pub plans: Option<Box<dyn PlanLog>>,
}

impl Query {
    /// Bounds the state the batches run from now on may write: a batch whose state writes
    /// (the keys and values of its partitions' overlays, and their change log) come to
    /// more than `limit` bytes fails with [`EngineError::StateLimit`] before anything of
    /// it is written, output included. `None` (the default) lifts the bound. A server
    /// sets it before each batch to what is left of a tenant's state quota.
    pub fn set_state_write_limit(&mut self, limit: Option<u64>) {
        self.state_write_limit = limit;
    }

    /// The settings recorded in the checkpoint.
    pub fn config(&self) -> &QueryConfig {
        &self.config
    }

    /// The last committed batch, if any.
    pub fn head(&self) -> Option<&CommitRecord> {
        self.head.as_ref()
    }

    /// The last committed batch's progress, if any: this run's last report, or, before
    /// this run committed a batch, the head with the timing kept beside it.
    pub fn last_report(&self) -> Option<BatchReport> {
        self.head.as_ref().map(|commit| BatchReport {
            commit: commit.clone(),
            timing: self.head_timing.clone(),
        })
    }

    /// Runs batches until all available input is processed. A batch that was planned but
    /// not committed (the process died) is re-run first, exactly as planned.
    pub fn run_available(
        &mut self,
        mut on_batch: impl FnMut(&BatchReport),
    ) -> Result<Vec<BatchReport>, EngineError> {
        let mut reports = Vec::new();
        while let Some(report) = self.run_next(None)? {
            on_batch(&report);
            reports.push(report);
        }
        Ok(reports)
    }

    /// Runs the next batch over new input (or re-runs a batch that was planned but not
    /// committed), at batch timestamp `at_ms` (default: now). When there is no new input
    /// but the watermark has advanced past the one the last batch ran with, runs a no-data
    /// batch so event-time timers and TTL fire. Returns `None` when there is nothing to do.
    pub fn run_next(&mut self, at_ms: Option<i64>) -> Result<Option<BatchReport>, EngineError> {
        if let Some(plan) = self.pending_plan()? {
            return self.run_batch(&plan).map(Some);
        }
        let (ranges, source_plan) = match &mut self.records {
            Some(source) => (Vec::new(), source.plan()?),
            None => (
                self.source.next_ranges_bounded(
                    &self.progress,
                    self.opts.max_files_per_batch,
                    self.opts.max_bytes_per_batch,
                )?,
                None,
            ),
        };
        if ranges.is_empty() && source_plan.is_none() && !self.watermark_advanced() {
            return Ok(None);
        }
        let plan = self.plan(ranges, source_plan, at_ms)?;
        self.run_batch(&plan).map(Some)
    }

    /// One trigger tick (`statebox run --trigger interval`): the next batch as
    /// [`Query::run_next`] runs it or, when that finds nothing to do, a no-data batch if
    /// [`idle_tick_runs_no_data`] says so. Returns `None` when the tick ran nothing.
    pub fn run_tick(&mut self, at_ms: Option<i64>) -> Result<Option<BatchReport>, EngineError> {
        if let Some(report) = self.run_next(at_ms)? {
            return Ok(Some(report));
        }
        if idle_tick_runs_no_data(self.config.time_mode) {
            return self.run_no_data(at_ms).map(Some);
        }
        Ok(None)
    }

    /// Whether the watermark the next batch runs with is past the one the last batch ran
    /// with.
    fn watermark_advanced(&self) -> bool {
        self.head
            .as_ref()
            .is_some_and(|h| h.next_watermark_ms > h.watermark_ms)
    }

    /// Runs a batch without input at batch timestamp `at_ms` (default: now), so that
    /// processing-time timers and TTL fire (also used by interval triggers).
    pub fn run_no_data(&mut self, at_ms: Option<i64>) -> Result<BatchReport, EngineError> {
        let plan = match self.pending_plan()? {
            Some(plan) => plan,
            None => self.plan(Vec::new(), None, at_ms)?,
        };
        self.run_batch(&plan)
    }

    /// Waits until the state snapshot of the last commit, if one is being taken, is in the
    /// checkpoint's snapshots directory (e.g. to upload it).
    pub fn wait_for_snapshot(&self) {
        self.checkpoint.wait_for_snapshot();
    }

    fn next_batch_id(&self) -> u64 {
        self.head.as_ref().map_or(0, |h| h.batch_id + 1)
    }

    /// The plan of a batch that was planned but never committed (the process died), or,
    /// with a shared plan log, that another process logged (this process then re-runs it).
    fn pending_plan(&mut self) -> Result<Option<BatchPlan>, EngineError> {
        let batch_id = self.next_batch_id();
        let mut bytes = logged_plan(&self.checkpoint, batch_id)?;
        if bytes.is_none()
            && let Some(log) = &mut self.plans
            && let Some(logged) = log.get(batch_id)?
        {
            self.checkpoint.put_plan_sync(batch_id, &logged)?;
            bytes = Some(logged);
        }
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let plan: BatchPlan = serde_json::from_slice(&bytes)
            .map_err(|e| EngineError::corrupt_record("batch plan", e))?;
        tracing::info!(batch_id, "re-running uncommitted batch from its plan");
        Ok(Some(plan))
    }

    /// Plans the next batch and logs the plan durably before it runs.
    fn plan(
        &mut self,
        ranges: Vec<FileRange>,
        source: Option<serde_json::Value>,
        at_ms: Option<i64>,
    ) -> Result<BatchPlan, EngineError> {
        let batch_id = self.next_batch_id();
        let watermark_ms = match (self.config.time_mode, &self.head) {
            (TimeMode::EventTime, Some(h)) => h.next_watermark_ms.max(0),
            (TimeMode::EventTime, None) => 0,
            _ => -1,
        };
        // The batch timestamp never goes backwards, even if the wall clock does.
        let floor = self.head.as_ref().map_or(i64::MIN, |h| h.timestamp_ms);
        let initial_ranges = match (&self.opts.initial_state, batch_id) {
            (Some(path), 0) => FileSource::new(path)?.next_ranges(&BTreeMap::new(), usize::MAX)?,
            _ => Vec::new(),
        };
        let plan = BatchPlan {
            batch_id,
            timestamp_ms: at_ms.unwrap_or_else(now_ms).max(floor),
            watermark_ms,
            ranges,
            initial_ranges,
            source,
        };
        let mut bytes = serde_json::to_vec(&plan).expect("serialises");
        let mut plan = plan;
        if let Some(log) = &mut self.plans
            && let Some(logged) = log.put(batch_id, &bytes)?
        {
            // Another process planned this batch first (it ran the query before, or runs
            // it still and will be fenced): its plan is the batch.
            plan = serde_json::from_slice(&logged)
                .map_err(|e| EngineError::corrupt_record("logged batch plan", e))?;
            tracing::info!(
                batch_id,
                "batch already planned by another process; running its plan"
            );
            bytes = logged;
        }
        self.checkpoint.put_plan_sync(batch_id, &bytes)?;
        Ok(plan)
    }

    /// Runs one planned batch and commits it. On failure nothing is committed, the plan is
    /// withdrawn (so fixed input is re-planned on the next run) and poisoned instances are
    /// dropped.
    fn run_batch(&mut self, plan: &BatchPlan) -> Result<BatchReport, EngineError> {
        match self.try_run_batch(plan) {
            Ok(report) => Ok(report),
            Err(e) => {
                let keep_plan = match &mut self.sink {
                    Output::File(sink) => {
                        // Output appended before a failed commit must not survive into the
                        // next batch's committed length.
                        let committed = self.head.as_ref().map_or(0, |h| h.output_bytes);
                        if let Err(io) = sink.rollback(committed) {
                            tracing::warn!(error = %io, "could not roll the output back");
                        }
                        false
                    }
                    // A delivery that may have reached the sink cannot be taken back: the
                    // batch must run again exactly as planned, never re-planned.
                    Output::Batches { sink, reopen } => {
                        let may = sink.may_have_delivered(plan.batch_id);
                        *reopen |= may;
                        may
                    }
                };
                // A plan in a shared log is final: the batch is re-run from it.
                if keep_plan || self.plans.is_some() {
                    return Err(e);
                }
                let legacy = Commit {
                    drop_vars: Vec::new(),
                    txns: Vec::new(),
                    meta: vec![(meta::legacy_plan(plan.batch_id), None)],
                    changelog: None,
                };
                let withdrawn = self
                    .checkpoint
                    .withdraw_plan(plan.batch_id)
                    .and_then(|()| self.checkpoint.commit(legacy));
                if let Err(store) = withdrawn {
                    tracing::warn!(error = %store, "could not withdraw the failed batch's plan");
                }
                Err(e)
            }
        }
    }

    /// Starts the periodic state snapshot after committing `batch` (every
    /// [`QueryOptions::snapshot_interval`] batches) and removes snapshots of batches no
    /// longer retained. The snapshot is taken on a thread of its own while the next batch
    /// reads and processes its input; that batch's commit waits for it (see
    /// [`Checkpoint::snapshot_in_background`]), and so does
    /// [`wait_for_snapshot`](Self::wait_for_snapshot). The batch is committed already: a
    /// failure is logged, not returned (reads of earlier batches then undo from the next
    /// snapshot or the latest state).
    fn snapshot(&self, batch: u64) {
        let interval = self.opts.snapshot_interval;
        if interval == 0 {
            return;
        }
        let dir = reader::snapshots_dir(&self.opts.checkpoint);
        if (batch + 1).is_multiple_of(interval) {
            let at = dir.join(reader::snapshot_name(batch));
            let shown = at.display().to_string();
            self.checkpoint
                .snapshot_in_background(at, move |taken| match taken {
                    Ok(_) => tracing::debug!(batch, dir = %shown, "state snapshot taken"),
                    Err(e) => tracing::warn!(batch, "cannot take a state snapshot: {e}"),
                });
        }
        // Batches before the first retained one cannot be read; their snapshots go.
        let first_retained = (batch + 1).saturating_sub(self.opts.min_batches_to_retain);
        for old in reader::list_snapshots(&dir) {
            if old < first_retained.saturating_sub(1) {
                let path = dir.join(reader::snapshot_name(old));
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::warn!(dir = %path.display(), "cannot remove an old snapshot: {e}");
                }
            }
        }
    }
}

/// The plan logged in `checkpoint` for `batch`, where this version logs plans or, failing
/// that, where an earlier version did ([`meta::legacy_plan`]).
fn logged_plan(
    checkpoint: &Checkpoint,
    batch: u64,
) -> Result<Option<Vec<u8>>, statebox_state::StoreError> {
    match checkpoint.get_plan(batch)? {
        Some(bytes) => Ok(Some(bytes)),
        None => checkpoint.get_meta(&meta::legacy_plan(batch)),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The no-data batch policy, in one place for every trigger. A batch runs without new input:
///
/// - whenever the watermark has advanced past the one the last batch ran with:
///   [`Query::run_next`] runs it by itself, so event-time timers and TTL fire without
///   waiting for more input;
/// - on a trigger tick that found no new input, in the time modes (this function says
///   whether): processing-time timers and TTL are due as the clock moves. In time mode
///   `none` nothing can be due, and the tick runs nothing.
///
/// [`Query::run_tick`] applies it; a caller that runs several batches per tick (the
/// server's rounds of [`Query::run_next`]) asks it once a round has run none.
pub fn idle_tick_runs_no_data(time_mode: TimeMode) -> bool {
    time_mode != TimeMode::None
}
