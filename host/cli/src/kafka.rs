//! `statebox run` with Kafka: the `kafka://` input and output and their settings.

use clap::Args;
use statebox_engine::{Endpoints, ProcessorInfo, QueryOptions};
use statebox_kafka::{
    Column, Delivery, InputSettings, KafkaUrl, OutputSettings, QueryShape, SinkOptions,
    SourceOptions, StartingOffsets,
};

/// Settings of a `kafka://` input or output.
#[derive(Args, Clone, Debug)]
pub(crate) struct KafkaArgs {
    /// A librdkafka client setting for the Kafka input and output, e.g.
    /// `security.protocol=SASL_SSL`; repeat for more.
    #[arg(long = "kafka-option", value_name = "KEY=VALUE", value_parser = parse_option)]
    kafka_options: Vec<(String, String)>,
    /// Where a new query starts reading Kafka: `earliest`, `latest`, or JSON as in Spark,
    /// e.g. `{"orders":{"0":23,"1":-2}}` (-2 earliest, -1 latest; partitions not named
    /// start at the earliest offset). Ignored once the checkpoint holds offsets.
    #[arg(long, default_value = "earliest", value_parser = parse_starting_offsets)]
    starting_offsets: StartingOffsets,
    /// At most this many Kafka offsets per micro-batch, shared among partitions in
    /// proportion to their backlog (default: everything available).
    #[arg(long)]
    max_records_per_batch: Option<u64>,
    /// Kafka columns added to every input row: key, topic, partition, offset, timestamp
    /// (`--event-time timestamp` adds `timestamp` by itself).
    #[arg(long, value_delimiter = ',', value_parser = parse_column)]
    kafka_columns: Vec<Column>,
    /// With Kafka input in event-time mode, a partition without records for this long (in
    /// batch time) stops holding the watermark back.
    #[arg(long, default_value = "1m", value_parser = crate::parse_duration_ms)]
    partition_idle_timeout: i64,
    /// Output columns that make each Kafka record's key, comma-separated (default: the
    /// grouping key columns).
    #[arg(long, value_delimiter = ',')]
    output_key: Vec<String>,
    /// Kafka output delivery: `exactly-once` (one transaction per batch; consumers with
    /// isolation.level=read_committed see each row once) or `at-least-once` (no
    /// transactions; a batch re-run after a crash is sent again).
    #[arg(long, default_value = "exactly-once", value_parser = parse_delivery)]
    output_delivery: Delivery,
}

fn parse_option(s: &str) -> Result<(String, String), String> {
    statebox_kafka::parse_option(s).map_err(|e| e.to_string())
}

fn parse_starting_offsets(s: &str) -> Result<StartingOffsets, String> {
    s.parse().map_err(|e: statebox_kafka::Error| e.to_string())
}

fn parse_column(s: &str) -> Result<Column, String> {
    s.parse().map_err(|e: statebox_kafka::Error| e.to_string())
}

fn parse_delivery(s: &str) -> Result<Delivery, String> {
    s.parse().map_err(|e: statebox_kafka::Error| e.to_string())
}

/// How a run's input and output are reached.
pub(crate) struct Wiring<'a> {
    pub input: &'a std::path::Path,
    pub output: &'a std::path::Path,
    pub key_columns: &'a [String],
    pub event_time: Option<&'a str>,
    /// Trigger `available-now`: read up to the end offsets seen at start.
    pub bounded: bool,
}

impl<'a> Wiring<'a> {
    /// The wiring of a query with `opts`; `bounded` for trigger `available-now`.
    pub(crate) fn of(opts: &'a QueryOptions, bounded: bool) -> Self {
        Wiring {
            input: &opts.input,
            output: &opts.output,
            key_columns: &opts.key_columns,
            event_time: opts.event_time.as_ref().map(|e| e.column.as_str()),
            bounded,
        }
    }
}

/// Whether `path` names a Kafka topic (`kafka://`) rather than a folder of files.
pub(crate) fn is_kafka(path: &std::path::Path) -> anyhow::Result<bool> {
    Ok(KafkaUrl::parse(&path.to_string_lossy())?.is_some())
}

/// The engine endpoints for `kafka://` inputs and outputs (none for files), refusing
/// Kafka settings without a Kafka input or output.
pub(crate) fn endpoints(args: &KafkaArgs, w: Wiring<'_>) -> anyhow::Result<Endpoints> {
    let url = |p: &std::path::Path| -> anyhow::Result<Option<KafkaUrl>> {
        Ok(KafkaUrl::parse(&p.to_string_lossy())?)
    };
    let (input, output) = (url(w.input)?, url(w.output)?);
    if input.is_none() {
        let source_only = [
            (
                args.max_records_per_batch.is_some(),
                "--max-records-per-batch",
            ),
            (!args.kafka_columns.is_empty(), "--kafka-columns"),
        ];
        if let Some((_, flag)) = source_only.iter().find(|(set, _)| *set) {
            anyhow::bail!("{flag} needs a Kafka input (--input kafka://HOST:PORT/TOPIC)");
        }
    }
    if output.is_none() && !args.output_key.is_empty() {
        anyhow::bail!("--output-key needs a Kafka output (--output kafka://HOST:PORT/TOPIC)");
    }
    if input.is_none() && output.is_none() && !args.kafka_options.is_empty() {
        anyhow::bail!("--kafka-option needs a Kafka input or output");
    }
    let input = input.map(|url| InputSettings {
        url,
        client_options: args.kafka_options.clone(),
        starting_offsets: args.starting_offsets.clone(),
        max_records_per_batch: args.max_records_per_batch,
        columns: args.kafka_columns.clone(),
        idle_timeout_ms: args.partition_idle_timeout,
    });
    let output = output.map(|url| OutputSettings {
        url,
        client_options: args.kafka_options.clone(),
        key_columns: args.output_key.clone(),
        delivery: args.output_delivery,
    });
    let shape = QueryShape {
        key_columns: w.key_columns,
        event_time: w.event_time,
        bounded: w.bounded,
    };
    Ok(statebox_kafka::endpoints(input, output, shape)?)
}

/// Refuses a Kafka output whose record key (`--output-key`, or the grouping columns)
/// names a column the processor does not output: the sink would fail every batch on it, so
/// the run stops before it starts. Processors that declare no output columns are not
/// checked.
pub(crate) fn check_output_key(
    args: &KafkaArgs,
    w: &Wiring<'_>,
    processor: &ProcessorInfo,
) -> anyhow::Result<()> {
    if KafkaUrl::parse(&w.output.to_string_lossy())?.is_none() {
        return Ok(());
    }
    let Some(fields) = processor.output_schema.as_struct() else {
        return Ok(());
    };
    let output_columns: Vec<&str> = fields.fields.iter().map(|f| f.name.as_str()).collect();
    let columns = statebox_kafka::record_key_columns(&args.output_key, w.key_columns);
    let Some(missing) = statebox_kafka::missing_key_column(columns, &output_columns) else {
        return Ok(());
    };
    let have = output_columns
        .iter()
        .map(|c| format!("`{c}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let name = &processor.name;
    if args.output_key.is_empty() {
        anyhow::bail!(
            "without --output-key each Kafka record's key is the grouping column `{missing}`, \
             which processor `{name}` does not output (its columns: {have}); name output \
             columns with --output-key"
        );
    }
    anyhow::bail!(
        "--output-key: processor `{name}` has no output column `{missing}` (its columns: {have})"
    )
}

/// The Kafka settings of a worker's tasks (`--group`): the input's brokers and topic, and
/// the source and sink options each task narrows to its partition and its own producer.
pub(crate) fn task_options(
    args: &KafkaArgs,
    w: Wiring<'_>,
) -> anyhow::Result<(KafkaUrl, SourceOptions, SinkOptions)> {
    let url = |p: &std::path::Path| -> anyhow::Result<Option<KafkaUrl>> {
        Ok(KafkaUrl::parse(&p.to_string_lossy())?)
    };
    let Some(input) = url(w.input)? else {
        anyhow::bail!(
            "--group needs a Kafka input (--input kafka://HOST:PORT/TOPIC): the group's \
             members share the topic's partitions"
        );
    };
    let Some(output) = url(w.output)? else {
        anyhow::bail!(
            "--group needs a Kafka output (--output kafka://HOST:PORT/TOPIC): each task \
             delivers its batches in Kafka transactions, which is what keeps output exactly \
             once when tasks move between workers"
        );
    };
    if args.output_delivery != Delivery::ExactlyOnce {
        anyhow::bail!("--group needs --output-delivery exactly-once");
    }
    let mut columns = args.kafka_columns.clone();
    if let Some(c) = w.event_time.and_then(|c| c.parse::<Column>().ok())
        && !columns.contains(&c)
    {
        columns.push(c);
    }
    let source = SourceOptions {
        url: input.clone(),
        client_options: args.kafka_options.clone(),
        starting_offsets: args.starting_offsets.clone(),
        max_records_per_batch: args.max_records_per_batch,
        bounded: false,
        columns,
        idle_timeout_ms: args.partition_idle_timeout,
        ..SourceOptions::default()
    };
    let sink = SinkOptions {
        url: output,
        client_options: args.kafka_options.clone(),
        key_columns: statebox_kafka::record_key_columns(&args.output_key, w.key_columns).to_vec(),
        delivery: Delivery::ExactlyOnce,
        ..SinkOptions::default()
    };
    Ok((input, source, sink))
}
