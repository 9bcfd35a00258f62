//! A query's Kafka endpoints from its settings: what `statebox run`'s flags and a
//! `statebox serve` pipeline's spec both come down to, so that both wire Kafka the same way
//! (the record timestamp brought along as event time, the grouping key as the default
//! record key).

use statebox_engine::{Endpoints, EngineError};

use crate::{
    Column, Delivery, KafkaSink, KafkaSource, KafkaUrl, SinkOptions, SourceOptions, StartingOffsets,
};

/// A Kafka input's settings.
#[derive(Clone, Debug)]
pub struct InputSettings {
    /// Brokers and topics.
    pub url: KafkaUrl,
    /// librdkafka settings, after Statebox's own.
    pub client_options: Vec<(String, String)>,
    /// Where a new query starts.
    pub starting_offsets: StartingOffsets,
    /// At most this many offsets per batch (unbounded when `None`).
    pub max_records_per_batch: Option<u64>,
    /// Kafka columns added to every row (an event-time column that names a Kafka column is
    /// added by [`endpoints`] itself).
    pub columns: Vec<Column>,
    /// In event-time mode, how long a partition without records holds the watermark back.
    pub idle_timeout_ms: i64,
}

/// A Kafka output's settings.
#[derive(Clone, Debug)]
pub struct OutputSettings {
    /// Brokers and the one output topic.
    pub url: KafkaUrl,
    /// librdkafka settings, after Statebox's own.
    pub client_options: Vec<(String, String)>,
    /// Output columns that make each record's key; empty for the grouping key columns.
    pub key_columns: Vec<String>,
    /// Exactly once or at least once.
    pub delivery: Delivery,
}

/// What the query itself says about its endpoints.
#[derive(Clone, Copy, Debug)]
pub struct QueryShape<'a> {
    /// The grouping key columns (the records' key unless the output names its own).
    pub key_columns: &'a [String],
    /// The event-time column: when it names a Kafka column (`timestamp`), the source adds
    /// that column to every row.
    pub event_time: Option<&'a str>,
    /// Read only up to the end offsets seen when the query opens (trigger
    /// `available-now`).
    pub bounded: bool,
}

/// The columns that make each output record's key: those the output names, or else the
/// grouping key columns.
pub fn record_key_columns<'a>(named: &'a [String], grouping: &'a [String]) -> &'a [String] {
    if named.is_empty() { grouping } else { named }
}

/// The first of `key_columns` that is not among a processor's declared `output_columns`:
/// the sink would fail every batch on it. `None` when all are there, and when the processor
/// declares no columns (nothing to check against).
pub fn missing_key_column<'a>(
    key_columns: &'a [String],
    output_columns: &[&str],
) -> Option<&'a str> {
    if output_columns.is_empty() {
        return None;
    }
    key_columns
        .iter()
        .map(String::as_str)
        .find(|c| !output_columns.contains(c))
}

/// The engine endpoints for a Kafka input and output (either may be absent: files, or the
/// server's input log and output file, stand in).
pub fn endpoints(
    input: Option<InputSettings>,
    output: Option<OutputSettings>,
    query: QueryShape<'_>,
) -> Result<Endpoints, EngineError> {
    let mut endpoints = Endpoints::default();
    if let Some(input) = input {
        let mut columns = input.columns;
        // The record timestamp as event time: `--event-time timestamp` (or any Kafka
        // column) brings its column along.
        if let Some(c) = query.event_time.and_then(|c| c.parse::<Column>().ok())
            && !columns.contains(&c)
        {
            columns.push(c);
        }
        let source = KafkaSource::new(SourceOptions {
            url: input.url,
            client_options: input.client_options,
            starting_offsets: input.starting_offsets,
            max_records_per_batch: input.max_records_per_batch,
            bounded: query.bounded,
            columns,
            idle_timeout_ms: input.idle_timeout_ms,
            ..SourceOptions::default()
        })
        .map_err(|e| context("cannot set up the Kafka input", e))?;
        endpoints.source = Some(Box::new(source));
    }
    if let Some(output) = output {
        let sink = KafkaSink::new(SinkOptions {
            key_columns: record_key_columns(&output.key_columns, query.key_columns).to_vec(),
            url: output.url,
            client_options: output.client_options,
            delivery: output.delivery,
            ..SinkOptions::default()
        })
        .map_err(|e| context("cannot set up the Kafka output", e))?;
        endpoints.sink = Some(Box::new(sink));
    }
    Ok(endpoints)
}

/// `e` with what was being done in front of its message (settings stay settings errors).
fn context(what: &str, e: EngineError) -> EngineError {
    match e {
        EngineError::Config(m) => EngineError::Config(format!("{what}: {m}")),
        other => EngineError::Io(format!("{what}: {other}")),
    }
}
