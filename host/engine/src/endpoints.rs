//! The seams for sources and sinks other than files (Kafka, in `statebox-kafka`; the
//! engine never links a Kafka client): a [`RecordSource`] plans each batch as positions the
//! engine logs before the batch runs and commits with its state, and a [`BatchSink`]
//! delivers each batch all or nothing and knows, after a crash, which batches it has.

use crate::EngineError;

/// A source of records that are not files (Kafka, in `statebox-kafka`): the engine logs the
/// source's plan of each batch before the batch runs and commits the source's positions in
/// the same write as the batch's state, so the checkpoint, not the source, knows what was
/// read. A re-run of a batch reads exactly what its plan names.
pub trait RecordSource: Send {
    /// What the checkpoint records of this source when it is created (for Kafka, the
    /// topics), so that a restart with a different source is refused.
    fn identity(&self) -> String;

    /// Called once when the query opens, with the positions committed by earlier batches
    /// (the entries of [`SourceBatch::progress`], latest value per name). `new_query` is
    /// true for a checkpoint that has committed no batch.
    fn restore(
        &mut self,
        committed: Vec<(String, Vec<u8>)>,
        new_query: bool,
    ) -> Result<(), EngineError>;

    /// Plans the next batch after the committed (and restored) positions, or `None` when
    /// there is nothing new to read. The plan is opaque to the engine; it is logged as is.
    fn plan(&mut self) -> Result<Option<serde_json::Value>, EngineError>;

    /// Reads exactly the records a plan names, however often it is called for that plan.
    fn read(&mut self, plan: &serde_json::Value) -> Result<SourceBatch, EngineError>;

    /// The batch planned with `plan` has committed: its positions are durable.
    fn committed(&mut self, plan: &serde_json::Value);

    /// In event-time mode, the largest event time the next batch's watermark may follow,
    /// given the largest event time of each of the batch's texts (in the order `read`
    /// returned them) and the batch timestamp. A source with partitions returns the minimum
    /// over its partitions, so one partition that runs behind holds the watermark back, and
    /// may leave out partitions that have been idle for a while. The default takes the
    /// maximum over all texts, as the file source does. The returned entries are committed
    /// with the batch, like [`SourceBatch::progress`].
    fn event_time_seen(
        &mut self,
        _plan: &serde_json::Value,
        per_text_max_ms: &[Option<i64>],
        _batch_timestamp_ms: i64,
    ) -> (Option<i64>, Vec<(String, Vec<u8>)>) {
        (per_text_max_ms.iter().flatten().copied().max(), Vec::new())
    }
}

/// What a [`RecordSource`] read for one batch.
#[derive(Debug, Default)]
pub struct SourceBatch {
    /// The rows, one text per source partition, in a fixed order.
    pub texts: Vec<SourceText>,
    /// Positions to commit with the batch, as named entries; the next `restore` gets the
    /// latest value of each name.
    pub progress: Vec<(String, Vec<u8>)>,
}

/// Rows of one source partition: one JSON row per line.
#[derive(Debug, Default)]
pub struct SourceText {
    /// Names the partition in error messages (e.g. `topic orders partition 3`).
    pub name: String,
    /// JSON rows separated by `\n`; no row contains a line break.
    pub text: String,
    /// The position of each line's record (a Kafka offset), named with the partition in
    /// error messages.
    pub positions: Vec<i64>,
}

/// An output other than a file (Kafka, in `statebox-kafka`). Exactly-once delivery needs a
/// sink that can deliver a batch all or nothing and tell, after a crash, whether it already
/// has a batch: the engine then re-runs that batch (the same plan, times and randomness, so
/// the same rows) with its output suppressed, and never delivers a committed batch again.
pub trait BatchSink: Send {
    /// Prepares the sink when the query opens. `query_id` is the checkpoint's query id;
    /// `last_committed` the last batch the checkpoint committed; `pending` a batch that was
    /// planned but not committed (it runs next). Refuses a sink that holds batches the
    /// checkpoint cannot account for (a checkpoint older than its output).
    fn open(
        &mut self,
        query_id: &str,
        last_committed: Option<u64>,
        pending: Option<u64>,
    ) -> Result<(), EngineError>;

    /// Whether batch `batch_id`'s output already reached the sink (delivered by a run that
    /// died before the checkpoint committed the batch).
    fn has_batch(&mut self, batch_id: u64) -> Result<bool, EngineError>;

    /// An id for the next delivery of batch `batch_id` that the delivery carries with it
    /// (for Kafka, in each record's headers), or `None`. The engine logs it durably before
    /// delivering, and records the id of the delivery that reached the sink in the batch's
    /// commit record.
    fn delivery_id(&mut self, batch_id: u64) -> Option<String>;

    /// Delivers a batch's rows (JSON objects), all or nothing.
    fn deliver(&mut self, batch_id: u64, rows: &[String]) -> Result<(), EngineError>;

    /// Whether a failed batch's output may have reached the sink anyway (a delivery whose
    /// outcome is unknown). The engine then keeps the batch's plan, so the batch is never
    /// re-planned with different input, and reopens the sink before the next batch.
    fn may_have_delivered(&self, batch_id: u64) -> bool;
}

/// A log of batch plans kept outside the checkpoint and shared by every process that may run
/// the query (a task's plans in an object store, when workers share a query): whoever logs a
/// batch's plan first fixes what the batch reads and at which times. A batch's state and
/// output are a function of its plan (re-runs after a crash already rely on that), so a
/// process that finds a plan logged by another runs that plan and computes the same batch;
/// a new owner of the query restores a state snapshot and re-runs the logged plans after it.
/// A logged plan is final: a failed batch is re-run from it, never re-planned.
pub trait PlanLog: Send {
    /// Logs `plan` as batch `batch_id`'s plan unless one is logged already. Returns `None`
    /// when `plan` was logged, or the plan logged before (which the batch then runs).
    fn put(&mut self, batch_id: u64, plan: &[u8]) -> Result<Option<Vec<u8>>, EngineError>;

    /// The plan logged for batch `batch_id`, if any.
    fn get(&mut self, batch_id: u64) -> Result<Option<Vec<u8>>, EngineError>;

    /// The last batch with a logged plan, if any (plans are logged in batch order, each
    /// after its predecessor's).
    fn last(&mut self) -> Result<Option<u64>, EngineError>;
}
