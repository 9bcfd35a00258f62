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
mod query;
pub mod reader;
mod sink;
mod source;
pub mod testing;
mod upgrade;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

use statebox_state::StoreError;

pub use crate::config::{
    BatchPlan, BatchReport, BatchTiming, CommitRecord, FileProgress, OutputMode, QueryConfig,
    TimeMode, VariableCounts,
};
pub use crate::endpoints::{BatchSink, PlanLog, RecordSource, SourceBatch, SourceText};
pub use crate::query::{Endpoints, Query, idle_tick_runs_no_data};
pub use crate::reader::StateReader;
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
    /// Another process took this query over (a newer owner of a task shared by workers, or
    /// a newer producer with the query's Kafka transactional id): this one must stop
    /// writing at once. Nothing of the batch was committed by this process.
    #[error("fenced: {0}")]
    Fenced(String),
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
    /// Bytes of committed state kept in memory in front of the checkpoint's database (see
    /// `statebox_state::cache`; default [`statebox_state::DEFAULT_STATE_CACHE_BYTES`], 0:
    /// none).
    pub state_cache_bytes: Option<usize>,
    /// A state-cache budget shared with other queries of this process (the tasks of a
    /// `--group` worker): the checkpoint's state cache holds an equal part of its bytes
    /// (`state_cache_bytes` is not used).
    pub shared_state_cache: Option<std::sync::Arc<statebox_state::SharedCacheBudget>>,
    /// Memtable room shared with other queries of this process (the tasks of a `--group`
    /// worker, a tenant's pipelines in `statebox serve`): the checkpoint's database writes
    /// memtables of an equal part of it.
    pub shared_memtables: Option<std::sync::Arc<statebox_state::SharedMemtables>>,
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
            state_cache_bytes: None,
            shared_state_cache: None,
            shared_memtables: None,
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
