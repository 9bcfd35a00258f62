//! The Statebox engine: runs a stateful query as a sequence of micro-batches.
//!
//! Data flows one way: source → decode → key → partition → per-key processor calls →
//! commit → sink. A batch is planned (its input ranges and times written durably to the
//! offset log), executed (partitions in parallel, each with its own processor instance and
//! state overlay), its output appended to the sink, and then committed: every partition's
//! state changes, the catalog, the input progress and the commit record go to the
//! checkpoint in one atomic write.
//!
//! Architecture Invariant: the commit record holds the sink's length after the batch. On
//! start the sink is truncated to the committed length, so output of a batch that did not
//! commit is discarded and the batch, re-run from its plan, writes it again: each batch's
//! output lands exactly once.

mod config;
mod endpoints;
mod input;
mod partition;
pub mod reader;
mod sink;
mod source;
pub mod testing;
mod upgrade;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use statebox_state::catalog::{Catalog, VarKind};
use statebox_state::{ChangelogWrite, Checkpoint, Commit, StoreError};

use crate::config::meta;
pub use crate::config::{
    BatchPlan, CommitRecord, FileProgress, OutputMode, QueryConfig, TimeMode, VariableCounts,
};
pub use crate::endpoints::{BatchSink, RecordSource, SourceBatch, SourceText};
use crate::input::PartitionInput;
pub use crate::reader::StateReader;
use crate::sink::Sink;
pub use crate::source::{FileRange, FileSource};
pub use crate::upgrade::{UpgradeCheck, check_upgrade};
/// The processor contract the engine drives, re-exported for its users.
pub use statebox_contract::{
    BatchFailure, BatchTimes, CallError, CallErrorKind, CallMeter, Function, InstanceConfig,
    KeyRows, Metered, PartitionBatch, PartitionProcessor, ProcessorFactory, ProcessorInfo,
};

/// Why a query could not run. Says whose fault it is: the user's settings or input, the
/// tenant's processor, or the host.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The settings conflict with the checkpoint or with each other.
    #[error("{0}")]
    Config(String),
    /// A bad input row.
    #[error("{file}:{line}: {message}")]
    Input {
        /// Input file.
        file: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong with the row.
        message: String,
    },
    /// A bad input record of a [`RecordSource`] (for Kafka, `at` names the topic, partition
    /// and offset).
    #[error("{at}: {message}")]
    Record {
        /// Where the record is.
        at: String,
        /// What is wrong with it.
        message: String,
    },
    /// The processor failed; the batch committed nothing.
    #[error(transparent)]
    Processor(#[from] CallError),
    /// Reading input or writing output failed.
    #[error("{0}")]
    Io(String),
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The batch would write more state than [`Query::set_state_write_limit`] allows; it
    /// committed nothing.
    #[error(
        "the batch would write {bytes} bytes of state (values, timers and their change log), \
         more than the {limit} bytes it may write; nothing of it was committed"
    )]
    StateLimit {
        /// Bytes the batch's state writes take.
        bytes: u64,
        /// The limit it was checked against.
        limit: u64,
    },
}

impl EngineError {
    /// A record of the checkpoint (`what`: "commit record", "batch plan", ...) that does
    /// not decode: the checkpoint is damaged or was written by something else. The store's
    /// [`StoreError::Corrupt`], not a bad setting: no change of settings makes it readable.
    pub fn corrupt_record(what: &str, e: impl std::fmt::Display) -> EngineError {
        EngineError::Store(StoreError::Corrupt(format!(
            "checkpoint {what} is unreadable: {e}"
        )))
    }
}

/// How to run a query.
#[derive(Clone, Debug)]
pub struct QueryOptions {
    /// Input file or directory of JSON Lines files.
    pub input: PathBuf,
    /// Output JSON Lines file.
    pub output: PathBuf,
    /// Checkpoint directory.
    pub checkpoint: PathBuf,
    /// Grouping key columns.
    pub key_columns: Vec<String>,
    /// State partitions; only for a new checkpoint (default: 4).
    pub partitions: Option<u16>,
    /// Output mode (default: update).
    pub output_mode: Option<OutputMode>,
    /// Time mode (default: none).
    pub time_mode: Option<TimeMode>,
    /// Files read per batch.
    pub max_files_per_batch: usize,
    /// Input bytes read per batch at most (default: unbounded). A file with more unread
    /// bytes is cut at a line boundary and read on by the next batches; a single line longer
    /// than this is read whole.
    pub max_bytes_per_batch: u64,
    /// Worker threads (default: the machine's cores).
    pub workers: Option<usize>,
    /// Event time: the input column and the watermark delay (event-time mode only).
    pub event_time: Option<EventTimeOptions>,
    /// The output column holding event time, overriding the processor's declaration.
    pub output_event_time_column: Option<String>,
    /// Initial state (JSON Lines file or directory), applied in the first batch of a new
    /// checkpoint only.
    pub initial_state: Option<PathBuf>,
    /// How many of the latest batches keep their change log (at least 1; the CLI's
    /// default is [`DEFAULT_MIN_BATCHES_TO_RETAIN`]). Older logs are removed at each commit.
    pub min_batches_to_retain: u64,
    /// Every this many batches, a snapshot of the state (a RocksDB checkpoint, hard-linked)
    /// is kept under `<checkpoint>/snapshots/<batch>`, so reading an earlier batch undoes at
    /// most this many batches' changes (see [`reader`]); 0 takes none. Snapshots older than
    /// the retained batches are removed.
    pub snapshot_interval: u64,
}

impl QueryOptions {
    /// Options with every optional setting at its default: what the checkpoint records (or
    /// the defaults, for a new one), one file per batch, no event time, no initial state.
    pub fn new(
        input: PathBuf,
        output: PathBuf,
        checkpoint: PathBuf,
        key_columns: Vec<String>,
    ) -> QueryOptions {
        QueryOptions {
            input,
            output,
            checkpoint,
            key_columns,
            partitions: None,
            output_mode: None,
            time_mode: None,
            max_files_per_batch: 1,
            max_bytes_per_batch: u64::MAX,
            workers: None,
            event_time: None,
            output_event_time_column: None,
            initial_state: None,
            min_batches_to_retain: DEFAULT_MIN_BATCHES_TO_RETAIN,
            snapshot_interval: DEFAULT_SNAPSHOT_INTERVAL,
        }
    }
}

/// The default of [`QueryOptions::snapshot_interval`].
pub const DEFAULT_SNAPSHOT_INTERVAL: u64 = 10;

/// The default of [`QueryOptions::min_batches_to_retain`].
pub const DEFAULT_MIN_BATCHES_TO_RETAIN: u64 = 100;

/// Where event time comes from and how far the watermark trails it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventTimeOptions {
    /// Input column with epoch milliseconds or an ISO-8601 timestamp.
    pub column: String,
    /// Watermark = largest event time seen − this delay.
    pub watermark_delay_ms: i64,
}

/// What one batch did.
#[derive(Clone, Debug)]
pub struct BatchReport {
    /// The commit record written.
    pub commit: CommitRecord,
}

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
    head: Option<CommitRecord>,
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
}

const DEFAULT_PARTITIONS: u16 = 4;

impl Query {
    /// Opens (or creates) the checkpoint, checks the settings against it, and prepares the
    /// sink. Refuses settings that differ from the ones the checkpoint was created with.
    pub fn open(
        opts: QueryOptions,
        factory: Arc<dyn ProcessorFactory>,
    ) -> Result<Query, EngineError> {
        Query::open_with(opts, factory, Endpoints::default())
    }

    /// Like [`Query::open`], reading from and writing to `endpoints` where they are set.
    pub fn open_with(
        opts: QueryOptions,
        factory: Arc<dyn ProcessorFactory>,
        endpoints: Endpoints,
    ) -> Result<Query, EngineError> {
        let Endpoints {
            source: mut records,
            sink: batch_sink,
        } = endpoints;
        if opts.key_columns.is_empty() {
            return Err(EngineError::Config(
                "at least one key column is required (--key)".into(),
            ));
        }
        if opts.max_files_per_batch == 0 {
            return Err(EngineError::Config(
                "--max-files-per-batch must be at least 1".into(),
            ));
        }
        if opts.min_batches_to_retain == 0 {
            return Err(EngineError::Config(
                "--min-batches-to-retain must be at least 1".into(),
            ));
        }
        std::fs::create_dir_all(&opts.checkpoint).map_err(|e| {
            EngineError::Io(format!(
                "cannot create checkpoint {}: {e}",
                opts.checkpoint.display()
            ))
        })?;
        let checkpoint = Checkpoint::open(&opts.checkpoint)?;
        let config = match checkpoint.get_meta(meta::QUERY)? {
            Some(bytes) => {
                let stored: QueryConfig = serde_json::from_slice(&bytes)
                    .map_err(|e| EngineError::corrupt_record("query record", e))?;
                check_restart(&stored, &opts)?;
                let mut stored = stored;
                if stored.query_id.is_none() {
                    stored.query_id = Some(config::new_uuid());
                    checkpoint.put_meta_sync(
                        meta::QUERY,
                        &serde_json::to_vec(&stored).expect("serialises"),
                    )?;
                }
                // The watermark delay may change between runs, as in Spark.
                if let Some(e) = &opts.event_time {
                    stored.watermark_delay_ms = e.watermark_delay_ms;
                }
                stored
            }
            None => {
                let config = QueryConfig {
                    version: 1,
                    key_columns: opts.key_columns.clone(),
                    partitions: opts.partitions.unwrap_or(DEFAULT_PARTITIONS),
                    output_mode: opts.output_mode.unwrap_or(OutputMode::Update),
                    time_mode: opts.time_mode.unwrap_or(TimeMode::None),
                    operator_name: factory.info().name.clone(),
                    event_time_column: opts.event_time.as_ref().map(|e| e.column.clone()),
                    watermark_delay_ms: opts
                        .event_time
                        .as_ref()
                        .map_or(0, |e| e.watermark_delay_ms),
                    output_schema: Some(factory.info().output_schema.to_ddl()),
                    query_id: Some(config::new_uuid()),
                };
                check_time_settings(&config)?;
                // A new checkpoint has committed no output, so opening the sink would
                // truncate the file to nothing: refuse rather than destroy someone's data.
                // (Checked before the query record is written, so a refused run leaves no
                // checkpoint behind that would allow the truncation next time.)
                let existing = std::fs::metadata(&opts.output).map_or(0, |m| m.len());
                if existing > 0 && batch_sink.is_none() {
                    return Err(EngineError::Config(format!(
                        "output {} already holds {existing} bytes but checkpoint {} is new; \
                         statebox appends each batch's rows exactly once and needs a missing \
                         or empty output file for a new checkpoint (move the file away or \
                         choose another --output)",
                        opts.output.display(),
                        opts.checkpoint.display()
                    )));
                }
                if config.partitions == 0 {
                    return Err(EngineError::Config(
                        "--partitions must be at least 1".into(),
                    ));
                }
                if let Some(source) = &records {
                    checkpoint
                        .put_meta_sync(meta::SOURCE_IDENTITY, source.identity().as_bytes())?;
                }
                checkpoint.put_meta_sync(
                    meta::QUERY,
                    &serde_json::to_vec(&config).expect("serialises"),
                )?;
                config
            }
        };
        // The source cannot change under an existing checkpoint: its positions would mean
        // nothing to another source (as in Spark).
        let identity = checkpoint
            .get_meta(meta::SOURCE_IDENTITY)?
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let wanted = records.as_ref().map(|s| s.identity());
        if identity != wanted {
            let name = |i: &Option<String>| {
                i.clone()
                    .unwrap_or_else(|| "files (--input PATH)".to_owned())
            };
            return Err(EngineError::Config(format!(
                "the checkpoint {} reads from {}, but this run asks for {}; the input of an \
                 existing checkpoint cannot change (use a new --checkpoint)",
                opts.checkpoint.display(),
                name(&identity),
                name(&wanted)
            )));
        }
        let catalog = match checkpoint.get_meta(meta::CATALOG)? {
            Some(bytes) => {
                Catalog::from_json(&bytes).map_err(|e| EngineError::corrupt_record("catalog", e))?
            }
            None => Catalog::default(),
        };
        // Upgrade check: the processor's declarations, learned without running it on any
        // data, must be compatible with every variable's schema history before any state
        // is touched.
        if catalog.vars().next().is_some() {
            let check = upgrade::check_against(&config, &catalog, &*factory)?;
            if !check.is_compatible() {
                return Err(EngineError::Config(format!(
                    "processor `{}` cannot run on checkpoint {}: its state is incompatible\n{check}",
                    factory.info().name,
                    opts.checkpoint.display()
                )));
            }
        }
        let head: Option<CommitRecord> = match checkpoint.get_meta(meta::HEAD)? {
            Some(bytes) => Some(
                serde_json::from_slice(&bytes)
                    .map_err(|e| EngineError::corrupt_record("commit record", e))?,
            ),
            None => None,
        };
        let mut progress = BTreeMap::new();
        for (name, bytes) in checkpoint.scan_meta(meta::SOURCE_PREFIX)? {
            let p: FileProgress = serde_json::from_slice(&bytes)
                .map_err(|e| EngineError::corrupt_record("source progress", e))?;
            progress.insert(name[meta::SOURCE_PREFIX.len()..].to_owned(), p);
        }
        if let (Some(path), Some(h)) = (&opts.initial_state, &head) {
            tracing::warn!(
                "ignoring initial state {}: the checkpoint is past its first batch (last committed batch {})",
                path.display(),
                h.batch_id
            );
        }
        let pending = {
            let next = head.as_ref().map_or(0, |h| h.batch_id + 1);
            checkpoint.get_meta(&meta::plan(next))?.map(|_| next)
        };
        let sink = match batch_sink {
            Some(mut sink) => {
                let query_id = config.query_id.as_deref().unwrap_or_default();
                sink.open(query_id, head.as_ref().map(|h| h.batch_id), pending)?;
                Output::Batches {
                    sink,
                    reopen: false,
                }
            }
            None => Output::File(Sink::open(
                &opts.output,
                head.as_ref().map_or(0, |h| h.output_bytes),
            )?),
        };
        if let Some(source) = &mut records {
            let committed = checkpoint
                .scan_meta(meta::INPUT_PREFIX)?
                .into_iter()
                .map(|(name, value)| (name[meta::INPUT_PREFIX.len()..].to_owned(), value))
                .collect();
            source.restore(committed, head.is_none())?;
        }
        // With a record source the file source is never asked for anything; it points at
        // the checkpoint directory only because `--input` names no path then.
        let source = FileSource::new(match records {
            Some(_) => &opts.checkpoint,
            None => &opts.input,
        })?;
        let mut columns = config.key_columns.clone();
        columns.extend(config.event_time_column.clone());
        let scanner =
            statebox_schema::RowScanner::new(factory.info().input_schema.clone(), columns);
        let instances = (0..config.partitions).map(|_| None).collect();
        Ok(Query {
            opts,
            factory,
            checkpoint,
            config,
            catalog: Arc::new(Mutex::new(catalog)),
            instances,
            run_id: config::new_uuid(),
            source,
            progress,
            records,
            head,
            sink,
            scanner,
            state_write_limit: None,
        })
    }

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
        let watermark_advanced = self
            .head
            .as_ref()
            .is_some_and(|h| h.next_watermark_ms > h.watermark_ms);
        if ranges.is_empty() && source_plan.is_none() && !watermark_advanced {
            return Ok(None);
        }
        let plan = self.plan(ranges, source_plan, at_ms)?;
        self.run_batch(&plan).map(Some)
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

    fn next_batch_id(&self) -> u64 {
        self.head.as_ref().map_or(0, |h| h.batch_id + 1)
    }

    /// The plan of a batch that was planned but never committed (the process died).
    fn pending_plan(&self) -> Result<Option<BatchPlan>, EngineError> {
        let batch_id = self.next_batch_id();
        let Some(bytes) = self.checkpoint.get_meta(&meta::plan(batch_id))? else {
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
        self.checkpoint.put_meta_sync(
            &meta::plan(batch_id),
            &serde_json::to_vec(&plan).expect("serialises"),
        )?;
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
                if keep_plan {
                    return Err(e);
                }
                let withdraw = Commit {
                    drop_vars: Vec::new(),
                    txns: Vec::new(),
                    meta: vec![(meta::plan(plan.batch_id), None)],
                    changelog: None,
                };
                if let Err(store) = self.checkpoint.commit(withdraw) {
                    tracing::warn!(error = %store, "could not withdraw the failed batch's plan");
                }
                Err(e)
            }
        }
    }

    fn try_run_batch(&mut self, plan: &BatchPlan) -> Result<BatchReport, EngineError> {
        let started = Instant::now();
        let workers = self.workers();
        if let Output::Batches { sink, reopen } = &mut self.sink
            && *reopen
        {
            let query_id = self.config.query_id.as_deref().unwrap_or_default();
            sink.open(
                query_id,
                self.head.as_ref().map(|h| h.batch_id),
                Some(plan.batch_id),
            )?;
            *reopen = false;
        }
        let mut buffers = Vec::with_capacity(plan.ranges.len());
        let mut new_progress = Vec::new();
        // A record source's texts: each with a made-up range (lines count from 1) and the
        // position of each line's record, to name records in errors.
        let mut record_ranges = Vec::new();
        let mut record_names = Vec::new();
        let mut positions: Vec<Vec<i64>> = Vec::new();
        let mut source_progress = Vec::new();
        if let (Some(source), Some(source_plan)) = (&mut self.records, &plan.source) {
            let batch = source.read(source_plan)?;
            source_progress = batch.progress;
            for t in batch.texts {
                record_ranges.push(FileRange {
                    file: t.name.clone(),
                    start: 0,
                    end: t.text.len() as u64,
                    first_line: 1,
                });
                record_names.push(t.name);
                positions.push(t.positions);
                buffers.push(t.text);
            }
        }
        for range in &plan.ranges {
            let text = self.source.read(range)?;
            // Only line breaks count: a last line without one continues when the file grows.
            let lines = range.first_line - 1 + source::count_lines(text.as_bytes());
            new_progress.push((
                range.file.clone(),
                FileProgress {
                    bytes: range.end,
                    lines,
                },
            ));
            buffers.push(text);
        }
        let texts: Vec<input::Text<'_>> = buffers
            .iter()
            .zip(record_ranges.iter().chain(&plan.ranges))
            .enumerate()
            .map(|(i, (text, range))| input::Text {
                text,
                range,
                file_name: match record_names.get(i) {
                    Some(name) => name.clone(),
                    None => self.source.path_of(&range.file).display().to_string(),
                },
            })
            .collect();
        let locate = |e: EngineError| locate_record(e, &record_names, &positions);
        let event_time = match (self.config.time_mode, &self.config.event_time_column) {
            (TimeMode::EventTime, Some(column)) => Some(input::EventTime {
                column,
                watermark_ms: plan.watermark_ms,
            }),
            _ => None,
        };
        let (inputs, stats) = input::decode(
            &texts,
            0,
            &self.scanner,
            &self.config.key_columns,
            event_time,
            self.instances.len(),
            workers,
        )
        .map_err(locate)?;
        let input_rows = stats.rows;
        let initial = self.read_initial_state(plan)?;
        let initial_texts: Vec<input::Text<'_>> = initial
            .iter()
            .map(|(range, text)| input::Text {
                text,
                range,
                file_name: range.file.clone(),
            })
            .collect();
        let initial_scanner =
            statebox_schema::RowScanner::new(None, self.config.key_columns.clone());
        let (initial_inputs, _) = input::decode(
            &initial_texts,
            texts.len() as u32,
            &initial_scanner,
            &self.config.key_columns,
            None,
            self.instances.len(),
            workers,
        )?;
        let file_names: Vec<String> = texts
            .iter()
            .map(|t| t.file_name.clone())
            .chain(initial_texts.iter().map(|t| t.file_name.clone()))
            .collect();
        let keys = inputs.iter().map(|p| p.groups.len() as u64).sum();
        let read_ms = started.elapsed().as_millis() as u64;
        let times = BatchTimes {
            batch_id: plan.batch_id,
            batch_timestamp_ms: plan.timestamp_ms,
            watermark_ms: plan.watermark_ms,
        };
        let mut results = self
            .execute(inputs, initial_inputs, times, &file_names)
            .map_err(locate)?;
        let process_ms = started.elapsed().as_millis() as u64 - read_ms;

        // Checked before the output is appended: a batch over the limit leaves no trace.
        if let Some(limit) = self.state_write_limit {
            let bytes = results.iter_mut().map(|r| r.txn.written_bytes()).sum();
            if bytes > limit {
                return Err(EngineError::StateLimit { bytes, limit });
            }
        }
        let mut txns = Vec::with_capacity(results.len());
        let mut output = Vec::new();
        let mut output_list = Vec::new();
        let to_file = matches!(self.sink, Output::File(_));
        let mut output_rows = 0u64;
        let (mut timers_fired, mut ttl_removed, mut timers_ms, mut ttl_ms) = (0, 0, 0, 0);
        for r in results {
            timers_fired += r.timers_fired;
            ttl_removed += r.ttl_removed;
            timers_ms = timers_ms.max(r.timers_ms);
            ttl_ms = ttl_ms.max(r.ttl_ms);
            txns.push(r.txn);
            output_rows += r.rows.len() as u64;
            if to_file {
                for row in r.rows {
                    output.extend_from_slice(row.as_bytes());
                    output.push(b'\n');
                }
            } else {
                output_list.extend(r.rows);
            }
        }
        let mut sink_delivery = None;
        let output_bytes = match &mut self.sink {
            Output::File(sink) => sink.append(&output)?,
            Output::Batches { sink, .. } => {
                if sink.has_batch(plan.batch_id)? {
                    // Delivered by a run that died before committing: the rows computed
                    // again here are the ones the sink has; they are not sent twice.
                    tracing::info!(
                        batch_id = plan.batch_id,
                        "the sink already has this batch; its output is not sent again"
                    );
                    sink_delivery = self
                        .checkpoint
                        .get_meta(meta::SINK_DELIVERY)?
                        .and_then(|b| serde_json::from_slice::<SinkDelivery>(&b).ok())
                        .filter(|d| d.batch_id == plan.batch_id)
                        .map(|d| d.id);
                } else {
                    sink_delivery = sink.delivery_id(plan.batch_id);
                    if let Some(id) = &sink_delivery {
                        // Logged before delivering, so that if this run dies after the
                        // sink has the batch, the next run can name the delivery.
                        let logged = SinkDelivery {
                            batch_id: plan.batch_id,
                            id: id.clone(),
                        };
                        self.checkpoint.put_meta_sync(
                            meta::SINK_DELIVERY,
                            &serde_json::to_vec(&logged).expect("serialises"),
                        )?;
                    }
                    sink.deliver(plan.batch_id, &output_list)?;
                    crash_point_after_delivery(plan.batch_id);
                }
                self.head.as_ref().map_or(0, |h| h.output_bytes)
            }
        };

        // A record source may hold the watermark back for a partition that runs behind.
        let (event_time_seen, event_time_progress) =
            match (&mut self.records, &plan.source, self.config.time_mode) {
                (Some(source), Some(source_plan), TimeMode::EventTime) => source.event_time_seen(
                    source_plan,
                    &stats.max_event_time_per_text,
                    plan.timestamp_ms,
                ),
                _ => (stats.max_event_time_ms, Vec::new()),
            };
        let mut commit = CommitRecord {
            batch_id: plan.batch_id,
            timestamp_ms: plan.timestamp_ms,
            watermark_ms: plan.watermark_ms,
            output_bytes,
            input_rows,
            output_rows,
            keys,
            duration_ms: 0,
            read_ms,
            process_ms,
            commit_ms: 0,
            late_rows: stats.late_rows,
            timers_fired,
            ttl_removed,
            timers_ms,
            ttl_ms,
            rows_per_s: 0.0,
            variables: VariableCounts::default(),
            state_bytes_on_disk: self.checkpoint.disk_bytes(),
            // Counted from the change logs inside the commit, below.
            state_rows_total: 0,
            state_rows_updated: 0,
            state_rows_removed: 0,
            timers_total: 0,
            timers_registered: 0,
            timers_deleted: 0,
            sink_delivery,
            next_watermark_ms: match self.config.time_mode {
                TimeMode::EventTime => {
                    let seen = event_time_seen.map_or(i64::MIN, |m| {
                        m.saturating_sub(self.config.watermark_delay_ms)
                    });
                    plan.watermark_ms.max(seen)
                }
                _ => -1,
            },
        };
        let (drop_vars, catalog_json) = {
            let catalog = self.catalog.lock().expect("catalog lock poisoned");
            for var in catalog.vars() {
                match var.kind {
                    VarKind::Value => commit.variables.value += 1,
                    VarKind::List => commit.variables.list += 1,
                    VarKind::Map => commit.variables.map += 1,
                }
            }
            let drops = catalog.pending_drops().to_vec();
            (drops, catalog.is_dirty().then(|| catalog.to_json()))
        };
        // The record is written inside the commit, so the commit's own duration is
        // estimated up to this point; the report returned below has the full figure.
        commit.duration_ms = started.elapsed().as_millis() as u64;
        commit.commit_ms = commit.duration_ms - read_ms - process_ms;
        commit.rows_per_s = rows_per_s(input_rows, started);
        let mut meta_writes = vec![(meta::plan(plan.batch_id), None)];
        if let Some(json) = catalog_json {
            meta_writes.push((meta::catalog_at(plan.batch_id), Some(json.clone())));
            meta_writes.push((meta::CATALOG.to_owned(), Some(json)));
        }
        for (file, p) in &new_progress {
            meta_writes.push((
                meta::source(file),
                Some(serde_json::to_vec(p).expect("serialises")),
            ));
        }
        for (name, value) in source_progress.into_iter().chain(event_time_progress) {
            meta_writes.push((meta::input(&name), Some(value)));
        }
        let partitions = usize::from(self.config.partitions.max(1));
        let previous = self.head.as_ref();
        let (prev_rows, prev_timers) =
            previous.map_or((0, 0), |h| (h.state_rows_total, h.timers_total));
        self.checkpoint.commit_with(
            Commit {
                drop_vars,
                txns,
                meta: meta_writes,
                changelog: Some(ChangelogWrite {
                    batch_id: plan.batch_id,
                    retain_from: (plan.batch_id + 1)
                        .saturating_sub(self.opts.min_batches_to_retain),
                    partition_of: Box::new(move |key: &[u8]| {
                        // Below `partitions`, a `u16`.
                        input::partition_of(key, partitions) as u16
                    }),
                }),
            },
            |changes| {
                commit.state_rows_updated = changes.rows_updated;
                commit.state_rows_removed = changes.rows_removed;
                commit.state_rows_total =
                    (prev_rows + changes.rows_added).saturating_sub(changes.rows_removed);
                commit.timers_registered = changes.timers_added;
                commit.timers_deleted = changes.timers_removed;
                commit.timers_total =
                    (prev_timers + changes.timers_added).saturating_sub(changes.timers_removed);
                let record = serde_json::to_vec(&commit).expect("serialises");
                vec![
                    (meta::commit(plan.batch_id), Some(record.clone())),
                    (meta::HEAD.to_owned(), Some(record)),
                ]
            },
        )?;
        // Only now are the catalog's changes durable; a failed commit leaves them pending
        // for the next batch.
        self.catalog
            .lock()
            .expect("catalog lock poisoned")
            .take_changes();
        for (file, p) in new_progress {
            self.progress.insert(file, p);
        }
        if let (Some(source), Some(source_plan)) = (&mut self.records, &plan.source) {
            source.committed(source_plan);
        }
        self.head = Some(commit.clone());
        self.snapshot(plan.batch_id);
        commit.duration_ms = started.elapsed().as_millis() as u64;
        commit.commit_ms = commit.duration_ms - read_ms - process_ms;
        commit.rows_per_s = rows_per_s(input_rows, started);
        Ok(BatchReport { commit })
    }

    /// Takes the periodic state snapshot after committing `batch` (every
    /// [`QueryOptions::snapshot_interval`] batches) and removes snapshots of batches no
    /// longer retained. The batch is committed already: a failure is logged, not returned
    /// (reads of earlier batches then undo from the next snapshot or the latest state).
    fn snapshot(&self, batch: u64) {
        let interval = self.opts.snapshot_interval;
        if interval == 0 {
            return;
        }
        let dir = reader::snapshots_dir(&self.opts.checkpoint);
        if (batch + 1).is_multiple_of(interval) {
            let at = dir.join(reader::snapshot_name(batch));
            match self.checkpoint.snapshot(&at) {
                Ok(_) => tracing::debug!(batch, dir = %at.display(), "state snapshot taken"),
                Err(e) => tracing::warn!(batch, "cannot take a state snapshot: {e}"),
            }
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

    /// Reads the plan's initial-state ranges (batch 0 of a new checkpoint only).
    fn read_initial_state(
        &self,
        plan: &BatchPlan,
    ) -> Result<Vec<(FileRange, String)>, EngineError> {
        if plan.initial_ranges.is_empty() {
            return Ok(Vec::new());
        }
        let Some(path) = &self.opts.initial_state else {
            return Err(EngineError::Config(format!(
                "batch {} was planned with initial state but this run has no --initial-state; \
                 pass the same --initial-state again to finish it",
                plan.batch_id
            )));
        };
        let source = FileSource::new(path)?;
        plan.initial_ranges
            .iter()
            .map(|range| {
                let text = source.read(range)?;
                let mut range = range.clone();
                range.file = source.path_of(&range.file).display().to_string();
                Ok((range, text))
            })
            .collect()
    }

    /// Calls the processor for every key of every partition, partitions in parallel.
    fn workers(&self) -> usize {
        self.opts
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
    }

    fn execute(
        &mut self,
        inputs: Vec<PartitionInput<'_>>,
        initial: Vec<PartitionInput<'_>>,
        times: BatchTimes,
        file_names: &[String],
    ) -> Result<Vec<partition::PartitionResult>, EngineError> {
        let workers = self.workers().min(self.instances.len());
        let mut lanes: Vec<Vec<partition::Job<'_>>> = (0..workers).map(|_| Vec::new()).collect();
        let jobs = self.instances.iter_mut().zip(inputs).zip(initial);
        for (p, ((instance, input), initial)) in jobs.enumerate() {
            lanes[p % workers].push(partition::Job {
                partition: p as u16,
                instance: instance.take(),
                input,
                initial,
            });
        }
        let ctx = partition::Context {
            checkpoint: &self.checkpoint,
            factory: &*self.factory,
            catalog: &self.catalog,
            time_mode: self.config.time_mode,
            output_event_time_column: self.opts.output_event_time_column.as_deref(),
            query_id: self.config.query_id.as_deref().unwrap_or_default(),
            run_id: &self.run_id,
            times,
            // The committed batch fired every timer and expired every value up to its
            // time, so scans for due timers and expiries can start just after it.
            time_floor: self.head.as_ref().and_then(|h| {
                let clock = self
                    .config
                    .time_mode
                    .clock(h.timestamp_ms, h.watermark_ms)?;
                clock.checked_add(1)
            }),
        };
        let ctx = &ctx;
        let finished: Vec<Vec<partition::Outcome>> = std::thread::scope(|s| {
            let handles: Vec<_> = lanes
                .into_iter()
                .map(|lane| {
                    s.spawn(move || lane.into_iter().map(|job| ctx.run(job)).collect::<Vec<_>>())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("partition worker panicked"))
                .collect()
        });
        let mut results: Vec<Option<partition::PartitionResult>> =
            (0..self.instances.len()).map(|_| None).collect();
        let mut first_error: Option<(u16, partition::Failure)> = None;
        for (p, instance, result) in finished.into_iter().flatten() {
            self.instances[p as usize] = instance.filter(|i| !i.is_poisoned());
            match result {
                Ok(r) => results[p as usize] = Some(r),
                Err(failure) => {
                    if first_error.as_ref().is_none_or(|(q, _)| p < *q) {
                        first_error = Some((p, failure));
                    }
                }
            }
        }
        if let Some((_, failure)) = first_error {
            return Err(match failure {
                partition::Failure::Call(e, origin) => match (&e.kind, origin) {
                    (CallErrorKind::BadInputRow { message, .. }, Some(origin)) => {
                        EngineError::Input {
                            file: file_names[origin.file as usize].clone(),
                            line: origin.line,
                            message: format!(
                                "processor `{}` rejected the row: {message}",
                                e.processor
                            ),
                        }
                    }
                    _ => EngineError::Processor(e),
                },
                // The engine's own timer and TTL work on the store: not the processor's
                // fault, so not reported as one of its calls.
                partition::Failure::Store(e) => EngineError::Store(e),
            });
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every partition finished"))
            .collect())
    }
}

fn check_restart(stored: &QueryConfig, opts: &QueryOptions) -> Result<(), EngineError> {
    let refuse = |setting: &str, old: String, new: String| {
        Err(EngineError::Config(format!(
            "the checkpoint {} was created with {setting} {old}, but this run asks for {new}; \
             {setting} cannot change for an existing checkpoint (use a new --checkpoint)",
            opts.checkpoint.display()
        )))
    };
    if stored.key_columns != opts.key_columns {
        return refuse(
            "--key",
            stored.key_columns.join(","),
            opts.key_columns.join(","),
        );
    }
    if let Some(m) = opts.output_mode.filter(|m| *m != stored.output_mode) {
        return refuse(
            "--output-mode",
            stored.output_mode.to_string(),
            m.to_string(),
        );
    }
    if let Some(t) = opts.time_mode.filter(|t| *t != stored.time_mode) {
        return refuse("--time-mode", stored.time_mode.to_string(), t.to_string());
    }
    if let Some(p) = opts.partitions.filter(|p| *p != stored.partitions) {
        return refuse("--partitions", stored.partitions.to_string(), p.to_string());
    }
    if let Some(e) = opts
        .event_time
        .as_ref()
        .filter(|e| stored.event_time_column.as_deref() != Some(e.column.as_str()))
    {
        let old = stored
            .event_time_column
            .clone()
            .unwrap_or_else(|| "no event-time column".into());
        return refuse("--event-time", old, e.column.clone());
    }
    Ok(())
}

fn check_time_settings(config: &QueryConfig) -> Result<(), EngineError> {
    match (config.time_mode, &config.event_time_column) {
        (TimeMode::EventTime, None) => Err(EngineError::Config(
            "time mode event-time needs an event-time column (--event-time COL --watermark-delay DURATION)".into(),
        )),
        (TimeMode::None | TimeMode::ProcessingTime, Some(c)) => Err(EngineError::Config(format!(
            "--event-time {c} needs --time-mode event-time (the query uses {})",
            config.time_mode
        ))),
        _ if config.watermark_delay_ms < 0 => Err(EngineError::Config(
            "the watermark delay cannot be negative".into(),
        )),
        _ => Ok(()),
    }
}

/// Input rows per second since `started`, rounded to a whole number.
fn rows_per_s(rows: u64, started: Instant) -> f64 {
    let seconds = started.elapsed().as_secs_f64();
    if seconds > 0.0 {
        (rows as f64 / seconds).round()
    } else {
        0.0
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A crash point for the tests: with `STATEBOX_CRASH_AFTER_DELIVERY=N` in the environment,
/// the process aborts (as `kill -9` would stop it) right after the sink accepted batch N and
/// before the checkpoint commits it, the moment where the sink has output the checkpoint
/// does not know of. Random kills seldom land there; this makes the next run's recovery of
/// that window testable. Unset, it costs one cached lookup per delivered batch.
fn crash_point_after_delivery(batch_id: u64) {
    static AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        std::env::var("STATEBOX_CRASH_AFTER_DELIVERY")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    if *at == Some(batch_id) {
        eprintln!("STATEBOX_CRASH_AFTER_DELIVERY: aborting after delivering batch {batch_id}");
        std::process::abort();
    }
}

/// What the checkpoint logs before a [`BatchSink`] delivery.
#[derive(serde::Serialize, serde::Deserialize)]
struct SinkDelivery {
    batch_id: u64,
    id: String,
}

/// Turns an error about line `n` of a record source's text into one naming the record's
/// position (`names[i]` is text `i`'s name, `positions[i]` its records' positions).
fn locate_record(e: EngineError, names: &[String], positions: &[Vec<i64>]) -> EngineError {
    match e {
        EngineError::Input {
            file,
            line,
            message,
        } => match names.iter().position(|n| *n == file) {
            Some(i) => {
                let at = match positions[i].get(line.saturating_sub(1) as usize) {
                    Some(p) => format!("{file} offset {p}"),
                    None => file,
                };
                EngineError::Record { at, message }
            }
            None => EngineError::Input {
                file,
                line,
                message,
            },
        },
        e => e,
    }
}
