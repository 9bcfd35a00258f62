//! Time modes and the times a handler sees.

/// How time advances for a query. Fixed when the query's checkpoint is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeMode {
    /// No timers and no TTL.
    None,
    /// Timers and TTL measured against the batch timestamp.
    ProcessingTime,
    /// Timers (and TTL, a Statebox extension) measured against the watermark.
    EventTime,
}

/// The times a handler call may consult, identical for every call of one batch and on replay.
///
/// Mirrors Spark's `TimerValues`. A time that does not apply in the query's time mode is `-1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerValues {
    current_processing_time_ms: i64,
    current_watermark_ms: i64,
}

impl TimerValues {
    /// Timer values with the given batch timestamp and watermark (`-1` for "not applicable").
    pub fn new(current_processing_time_ms: i64, current_watermark_ms: i64) -> Self {
        TimerValues {
            current_processing_time_ms,
            current_watermark_ms,
        }
    }

    /// The batch timestamp in milliseconds since the Unix epoch; `-1` in time mode `None`.
    pub fn current_processing_time_ms(&self) -> i64 {
        self.current_processing_time_ms
    }

    /// The watermark in milliseconds since the Unix epoch; `-1` unless the time mode is
    /// `EventTime`.
    pub fn current_watermark_ms(&self) -> i64 {
        self.current_watermark_ms
    }

    /// The batch timestamp, if the time mode has one.
    pub fn processing_time_ms(&self) -> Option<i64> {
        (self.current_processing_time_ms >= 0).then_some(self.current_processing_time_ms)
    }

    /// The watermark, if the time mode is `EventTime`.
    pub fn watermark_ms(&self) -> Option<i64> {
        (self.current_watermark_ms >= 0).then_some(self.current_watermark_ms)
    }
}

/// Which timer fired. Mirrors Spark's `ExpiredTimerInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExpiredTimerInfo {
    expiry_time_ms: i64,
}

impl ExpiredTimerInfo {
    /// Information about a timer registered for `expiry_time_ms`.
    pub fn new(expiry_time_ms: i64) -> Self {
        ExpiredTimerInfo { expiry_time_ms }
    }

    /// The timestamp the timer was registered for, in milliseconds.
    pub fn expiry_time_ms(&self) -> i64 {
        self.expiry_time_ms
    }
}

/// The query and batch a processor runs in. Mirrors Spark's `QueryInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueryInfo {
    /// The query's id: fixed when its checkpoint was created, the same across restarts.
    pub query_id: String,
    /// This run's id: new each time the query is started.
    pub run_id: String,
    /// The id of the batch in progress (0 outside a batch).
    pub batch_id: u64,
}
