//! What a checkpoint records about its query, and the per-batch records of the offset and
//! commit logs.

use serde::{Deserialize, Serialize};

pub use statebox_contract::TimeMode;

use crate::source::FileRange;

/// Spark's output modes; recorded with the query and fixed for its lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputMode {
    /// Only new rows are emitted.
    Append,
    /// Rows for keys that changed are emitted.
    Update,
}

impl std::str::FromStr for OutputMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "append" => Ok(OutputMode::Append),
            "update" => Ok(OutputMode::Update),
            _ => Err(format!(
                "unknown output mode `{s}` (expected append or update)"
            )),
        }
    }
}

impl std::fmt::Display for OutputMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OutputMode::Append => "append",
            OutputMode::Update => "update",
        })
    }
}

/// The settings fixed when a checkpoint is created. A restart with different settings is
/// refused (SPEC §6, §7).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryConfig {
    /// Format version of the checkpoint.
    pub version: u32,
    /// Grouping key columns, in order.
    pub key_columns: Vec<String>,
    /// Number of state partitions.
    pub partitions: u16,
    /// Output mode.
    pub output_mode: OutputMode,
    /// Time mode.
    pub time_mode: TimeMode,
    /// Name of the processor that created the checkpoint (informational).
    pub operator_name: String,
    /// The input column holding event time (event-time mode).
    #[serde(default)]
    pub event_time_column: Option<String>,
    /// How far the watermark trails the largest event time seen, in milliseconds.
    #[serde(default)]
    pub watermark_delay_ms: i64,
    /// The output schema (DDL) of the processor that created the checkpoint.
    #[serde(default)]
    pub output_schema: Option<String>,
    /// The query's id (a UUID), fixed when the checkpoint is created; processors see it
    /// through `get-query-info`. Checkpoints from before it existed get one when next
    /// opened.
    #[serde(default)]
    pub query_id: Option<String>,
}

/// A new random UUID (version 4), for query and run ids.
pub(crate) fn new_uuid() -> String {
    use std::hash::{BuildHasher, RandomState};
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    // Each RandomState is seeded from the OS's randomness.
    let hi = RandomState::new().hash_one((seed, std::process::id()));
    let lo = RandomState::new().hash_one((seed, 1u8));
    let mut b = ((u128::from(hi) << 64) | u128::from(lo)).to_be_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The offset log entry: what batch `batch_id` reads and at which times. Written durably
/// before the batch runs, so a batch re-run after a crash sees exactly the same input,
/// timestamp and watermark.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPlan {
    /// The batch id (0, 1, 2, ...).
    pub batch_id: u64,
    /// The batch timestamp: the processing time every call of the batch sees.
    pub timestamp_ms: i64,
    /// The watermark the batch runs with; -1 outside event-time mode.
    pub watermark_ms: i64,
    /// The input read by the batch.
    pub ranges: Vec<FileRange>,
    /// The initial state applied before the input (first batch of a new checkpoint only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub initial_ranges: Vec<FileRange>,
    /// What a record source (Kafka) reads in this batch, in the source's own terms (for
    /// Kafka, offset ranges per topic partition); none for files and no-data batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<serde_json::Value>,
}

/// The commit log entry, written atomically with the batch's state changes: what recovery
/// reads (the batch, its times and watermarks, the output's committed length, the sink
/// delivery) and what the batch did (rows, keys, timers, state counts), all of it the same
/// however often the batch is re-run from its plan. How long it took is no part of it (see
/// [`BatchTiming`]).
///
/// Records written before the timing moved out carry its fields too; they are ignored
/// here (and read as the batch's [`BatchTiming`] by [`crate::StateReader::progress`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommitRecord {
    /// The batch id.
    pub batch_id: u64,
    /// The batch timestamp.
    pub timestamp_ms: i64,
    /// The watermark the batch ran with.
    pub watermark_ms: i64,
    /// Size of the output file after this batch's rows: the sink's exactly-once marker.
    pub output_bytes: u64,
    /// Rows read.
    pub input_rows: u64,
    /// Rows emitted.
    pub output_rows: u64,
    /// Distinct grouping keys called.
    pub keys: u64,
    /// Input rows dropped as late (event time at or before the watermark).
    #[serde(default)]
    pub late_rows: u64,
    /// Timers that fired.
    #[serde(default)]
    pub timers_fired: u64,
    /// State values, list elements and map entries removed by TTL.
    #[serde(default)]
    pub ttl_removed: u64,
    /// State variables by kind after the batch: value, list, map.
    #[serde(default)]
    pub variables: VariableCounts,
    /// Values, list elements and map entries in state after the batch (counted from this
    /// checkpoint's change logs; 0 for records written before they were counted).
    #[serde(default)]
    pub state_rows_total: u64,
    /// Values, list elements and map entries the batch wrote.
    #[serde(default)]
    pub state_rows_updated: u64,
    /// Values, list elements and map entries the batch removed (by the processor, clears,
    /// TTL cleanup or dropped variables).
    #[serde(default)]
    pub state_rows_removed: u64,
    /// Timers registered after the batch, over all keys.
    #[serde(default)]
    pub timers_total: u64,
    /// Timers the batch registered that were not registered before it (a timer registered
    /// and fired or deleted within the batch is not counted).
    #[serde(default)]
    pub timers_registered: u64,
    /// Timers registered before the batch that it removed: fired (`timers_fired`) or deleted
    /// by a handler.
    #[serde(default)]
    pub timers_deleted: u64,
    /// Bytes of the state database on disk (SST files) after the commit; estimated before
    /// writing the record, so it reflects the previous batches' flushed state.
    #[serde(default)]
    pub state_bytes_on_disk: u64,
    /// The watermark the next batch runs with: the largest event time seen so far minus
    /// the delay, never decreasing. -1 outside event-time mode.
    #[serde(default = "no_watermark")]
    pub next_watermark_ms: i64,
    /// The id of the sink delivery that holds this batch's output (for Kafka, the
    /// transaction's `statebox.delivery` header), when the sink names its deliveries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_delivery: Option<String>,
}

/// How long a batch took, measured while it ran: reported with the batch and kept beside
/// its commit record (`timing/<batch>`) for progress histories; recovery never reads it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchTiming {
    /// Wall time of the batch in milliseconds.
    pub duration_ms: u64,
    /// Milliseconds spent reading and decoding input.
    pub read_ms: u64,
    /// Milliseconds spent in processor calls (all partitions, in parallel).
    pub process_ms: u64,
    /// Milliseconds spent writing output and committing state. The timing kept in the
    /// checkpoint is written inside the commit, so there it stops short of the commit's
    /// own write; the report has the full figure.
    pub commit_ms: u64,
    /// Milliseconds spent firing timers (the slowest partition).
    pub timers_ms: u64,
    /// Milliseconds spent removing expired state (the slowest partition).
    pub ttl_ms: u64,
    /// Input rows per second of the batch's wall time.
    pub rows_per_s: f64,
}

/// What one batch did and how long it took: the progress record of `statebox run
/// --progress-json`, of the server's pipeline status and of [`crate::StateReader::progress`].
/// Serialised as one flat object (the commit record's fields and the timing's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchReport {
    /// The commit record written.
    #[serde(flatten)]
    pub commit: CommitRecord,
    /// How long the batch took.
    #[serde(flatten)]
    pub timing: BatchTiming,
}

/// A report reads as its commit record (`report.batch_id`), the part every reader of
/// progress wants; the timing is `report.timing`.
impl std::ops::Deref for BatchReport {
    type Target = CommitRecord;

    fn deref(&self) -> &CommitRecord {
        &self.commit
    }
}

fn no_watermark() -> i64 {
    -1
}

/// How many state variables of each kind a query has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariableCounts {
    /// Value state variables.
    pub value: u32,
    /// List state variables.
    pub list: u32,
    /// Map state variables.
    pub map: u32,
}

/// Consumption of one input file, committed with every batch that read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileProgress {
    /// Bytes read so far.
    pub bytes: u64,
    /// Line breaks read so far (a last line without one continues when the file grows).
    pub lines: u64,
}

/// Metadata names used in the checkpoint.
pub(crate) mod meta {
    pub const QUERY: &str = "query";
    pub const CATALOG: &str = "catalog";
    /// The catalog as of each batch that changed it, for reading earlier batches.
    pub const CATALOG_PREFIX: &str = "catalog/";
    pub const HEAD: &str = "head";
    /// Where versions before plans had a namespace of their own logged them (see
    /// [`legacy_plan`]).
    pub const LEGACY_PLAN_PREFIX: &str = "plan/";
    pub const COMMIT_PREFIX: &str = "commit/";
    /// Each batch's [`BatchTiming`](crate::BatchTiming), beside its commit record.
    pub const TIMING_PREFIX: &str = "timing/";
    pub const SOURCE_PREFIX: &str = "source/";
    /// A record source's committed positions, by the source's own names.
    pub const INPUT_PREFIX: &str = "input/";
    /// What reads the checkpoint's input, when it is not files (see `RecordSource`).
    pub const SOURCE_IDENTITY: &str = "source-identity";
    /// The batch and id of the latest sink delivery begun (see `BatchSink`).
    pub const SINK_DELIVERY: &str = "sink-delivery";

    /// A batch plan as earlier versions logged it, among the metadata. A checkpoint they
    /// left with a batch planned but not committed still has it there: the batch is re-run
    /// from it, and its commit removes it. Plans are now logged by
    /// `Checkpoint::put_plan_sync`.
    pub fn legacy_plan(batch: u64) -> String {
        format!("{LEGACY_PLAN_PREFIX}{batch:020}")
    }

    pub fn catalog_at(batch: u64) -> String {
        format!("{CATALOG_PREFIX}{batch:020}")
    }

    pub fn commit(batch: u64) -> String {
        format!("{COMMIT_PREFIX}{batch:020}")
    }

    pub fn timing(batch: u64) -> String {
        format!("{TIMING_PREFIX}{batch:020}")
    }

    pub fn source(file: &str) -> String {
        format!("{SOURCE_PREFIX}{file}")
    }

    pub fn input(name: &str) -> String {
        format!("{INPUT_PREFIX}{name}")
    }
}
