//! Kafka sources and sinks of pipelines, and the admin's grants of Kafka brokers.
//!
//! A pipeline reads HTTP ingest (`"source": "http"`, the default) or Kafka topics
//! (`"source": {"kafka": {...}}`), and writes its output log (`"sink": "output"`, the
//! default) or a Kafka topic (`"sink": {"kafka": {...}}`), with the guarantees of
//! `statebox run`: offsets planned and logged before each batch and committed with its
//! state, and one Kafka transaction per batch (see `statebox_kafka`). The endpoints are
//! built by [`statebox_kafka::endpoints`], as the CLI builds its own.
//!
//! - **Grants.** A tenant reaches only the brokers the admin granted it
//!   (`PUT /v1/tenants/{id}/kafka {"brokers": ["HOST:PORT", ...]}`, the complete list;
//!   stored with the tenant in the registry). Creating or starting a pipeline with a broker
//!   not granted is refused (HTTP 403, naming it); so is resuming one after a restart. A
//!   grant that no longer lists a broker stops the pipelines using it and marks them failed.
//!   A grant covers the cluster behind the address: librdkafka connects to every broker the
//!   cluster advertises in its metadata, which the grant cannot list.
//! - **Client options.** Tenants pass librdkafka settings only from [`ALLOWED_OPTIONS`]
//!   (authentication and the client id); anything else is refused (HTTP 422, naming it):
//!   others read host files (`ssl.*.location`), load code (`plugin.library.paths`) or run
//!   commands (`sasl.kerberos.kinit.cmd`). A pipeline's options can be replaced later
//!   (`PUT /v1/pipelines/{id}/kafka/options`, [`App::set_kafka_options`]) to rotate its
//!   credentials; its brokers and topics cannot.
//! - **Ingest and output.** A pipeline with a Kafka source refuses HTTP ingest and runs its
//!   batches on its trigger interval; one with a Kafka sink has no output log to read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};
use statebox_engine::Endpoints;
use statebox_kafka::{Column, Delivery, InputSettings, KafkaUrl, OutputSettings, QueryShape};

use crate::App;
use crate::app::AppError;
use crate::app::pipelines::Pipeline;
use crate::pipeline::RunState;
use crate::registry::{Desired, PipelineRecord};

type Result<T> = std::result::Result<T, AppError>;

/// The librdkafka settings a tenant may give a Kafka source or sink. Nothing here makes the
/// client read or load host files, run commands, or connect elsewhere than the brokers.
pub const ALLOWED_OPTIONS: &[&str] = &[
    "client.id",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.endpoint.identification.algorithm",
];

/// The SASL mechanisms a tenant may choose: the ones that need nothing but a user name
/// and password (GSSAPI runs `kinit` and reads a keytab; OAUTHBEARER needs more settings).
pub(crate) const ALLOWED_SASL_MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// Where a pipeline reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceSpec {
    /// Rows ingested over HTTP into the pipeline's input log.
    #[default]
    Http,
    /// Kafka topics.
    Kafka(KafkaSourceSpec),
}

/// Where a pipeline writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkSpec {
    /// The pipeline's output log (`GET .../output`).
    #[default]
    Output,
    /// A Kafka topic.
    Kafka(KafkaSinkSpec),
}

/// A Kafka source: `{"brokers", "topics", ...}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceSpec {
    /// Bootstrap brokers, `HOST:PORT` (a list, or one comma-separated string).
    #[serde(deserialize_with = "list_or_commas")]
    pub brokers: Vec<String>,
    /// Topics read (a list, or one comma-separated string).
    #[serde(deserialize_with = "list_or_commas")]
    pub topics: Vec<String>,
    /// Where a new pipeline starts: `earliest` (the default), `latest`, or per topic and
    /// partition an offset (-2 earliest, -1 latest), as in Spark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_offsets: Option<StartingOffsetsSpec>,
    /// At most this many offsets per batch over all partitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_records_per_batch: Option<u64>,
    /// Kafka columns added to every row: key, topic, partition, offset, timestamp.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<String>,
    /// In event-time mode, how long a partition without records holds the watermark back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_idle_timeout_ms: Option<i64>,
    /// librdkafka settings from [`ALLOWED_OPTIONS`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// `"earliest"`, `"latest"` or `{"topic": {"0": 23, "1": -2}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StartingOffsetsSpec {
    Named(String),
    Offsets(BTreeMap<String, BTreeMap<String, i64>>),
}

/// A Kafka sink: `{"brokers", "topic", ...}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkSpec {
    /// Bootstrap brokers, `HOST:PORT` (a list, or one comma-separated string).
    #[serde(deserialize_with = "list_or_commas")]
    pub brokers: Vec<String>,
    /// The output topic.
    pub topic: String,
    /// Output columns that make each record's key (default: the pipeline's key columns).
    #[serde(
        default,
        deserialize_with = "list_or_commas",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub key: Vec<String>,
    /// `exactly-once` (the default: one transaction per batch) or `at-least-once`.
    #[serde(default)]
    pub delivery: DeliverySpec,
    /// librdkafka settings from [`ALLOWED_OPTIONS`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// How a Kafka sink delivers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliverySpec {
    #[default]
    ExactlyOnce,
    AtLeastOnce,
}

/// A list of strings, or one string of comma-separated items.
pub(crate) fn list_or_commas<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::One(s) => s.split(',').map(|p| p.trim().to_owned()).collect(),
        Raw::Many(v) => v.into_iter().map(|p| p.trim().to_owned()).collect(),
    })
}

impl SourceSpec {
    fn kafka(&self) -> Option<&KafkaSourceSpec> {
        match self {
            SourceSpec::Kafka(k) => Some(k),
            SourceSpec::Http => None,
        }
    }
}

impl SinkSpec {
    fn kafka(&self) -> Option<&KafkaSinkSpec> {
        match self {
            SinkSpec::Kafka(k) => Some(k),
            SinkSpec::Output => None,
        }
    }
}

/// `HOST:PORT` with the host in lower case (how grants and specs are compared), or why
/// `broker` is not one.
fn normal_broker(broker: &str) -> std::result::Result<String, String> {
    let (host, port) = broker
        .rsplit_once(':')
        .ok_or_else(|| format!("broker `{broker}` has no port (expected HOST:PORT)"))?;
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':'));
    if !host_ok || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!("broker `{broker}` is not HOST:PORT"));
    }
    Ok(format!("{}:{port}", host.to_ascii_lowercase()))
}

/// The brokers of a spec, normalised; a 400 naming `field` for a bad one.
fn brokers(field: &str, list: &[String]) -> Result<Vec<String>> {
    if list.is_empty() || list.iter().all(String::is_empty) {
        return Err(AppError::bad_input(format!(
            "`{field}` must name at least one broker (HOST:PORT)"
        )));
    }
    list.iter()
        .map(|b| normal_broker(b).map_err(|e| AppError::bad_input(format!("`{field}`: {e}"))))
        .collect()
}

/// Parses brokers and topics as a `kafka://` address (Kafka's own rules for topic names).
fn url(field: &str, brokers: &[String], topics: &[String]) -> Result<KafkaUrl> {
    let text = format!("kafka://{}/{}", brokers.join(","), topics.join(","));
    KafkaUrl::parse(&text)
        .map_err(|e| AppError::bad_input(format!("`{field}`: {e}")))?
        .ok_or_else(|| AppError::internal("a kafka:// address did not parse as one"))
}

/// Checks client options against [`ALLOWED_OPTIONS`]: 422 naming the first one refused.
fn check_options(field: &str, options: &BTreeMap<String, String>) -> Result<()> {
    for (key, value) in options {
        if !ALLOWED_OPTIONS.contains(&key.as_str()) {
            return Err(AppError::ForbiddenKafkaOption(format!(
                "`{field}.{key}`: the Kafka client option `{key}` is not allowed; a pipeline \
                 may set only {}",
                ALLOWED_OPTIONS.join(", ")
            )));
        }
        if matches!(key.as_str(), "sasl.mechanism" | "sasl.mechanisms")
            && !ALLOWED_SASL_MECHANISMS.contains(&value.as_str())
        {
            return Err(AppError::ForbiddenKafkaOption(format!(
                "`{field}.{key}`: the SASL mechanism `{value}` is not allowed; a pipeline may \
                 use {}",
                ALLOWED_SASL_MECHANISMS.join(", ")
            )));
        }
    }
    Ok(())
}

/// Checks a pipeline's source and sink: 400 naming the bad field, 422 for a client option
/// that is not allowed. Returns them normalised (brokers as compared with grants).
pub(crate) fn check_spec(
    source: &mut SourceSpec,
    sink: &mut SinkSpec,
    event_time: bool,
) -> Result<()> {
    if let SourceSpec::Kafka(k) = source {
        k.brokers = brokers("source.kafka.brokers", &k.brokers)?;
        url("source.kafka.topics", &k.brokers, &k.topics)?;
        let mut seen = std::collections::BTreeSet::new();
        if let Some(t) = k.topics.iter().find(|t| !seen.insert(*t)) {
            return Err(AppError::bad_input(format!(
                "`source.kafka.topics` names `{t}` twice"
            )));
        }
        starting_offsets(k)?;
        if k.max_records_per_batch == Some(0) {
            return Err(AppError::bad_input(
                "`source.kafka.max_records_per_batch` must be at least 1",
            ));
        }
        for c in &k.columns {
            c.parse::<Column>()
                .map_err(|e| AppError::bad_input(format!("`source.kafka.columns`: {e}")))?;
        }
        if let Some(ms) = k.partition_idle_timeout_ms {
            if ms <= 0 {
                return Err(AppError::bad_input(
                    "`source.kafka.partition_idle_timeout_ms` must be positive",
                ));
            }
            if !event_time {
                return Err(AppError::bad_input(
                    "`source.kafka.partition_idle_timeout_ms` applies to the watermark: it \
                     needs time_mode `event-time`",
                ));
            }
        }
        check_options("source.kafka.options", &k.options)?;
    }
    if let SinkSpec::Kafka(k) = sink {
        k.brokers = brokers("sink.kafka.brokers", &k.brokers)?;
        let parsed = url(
            "sink.kafka.topic",
            &k.brokers,
            std::slice::from_ref(&k.topic),
        )?;
        if parsed.topics.len() != 1 {
            return Err(AppError::bad_input(format!(
                "`sink.kafka.topic`: `{}` is not one topic name; a sink writes to exactly one \
                 topic",
                k.topic
            )));
        }
        if k.key.iter().any(String::is_empty) {
            return Err(AppError::bad_input(
                "`sink.kafka.key` must name output columns, none of them empty",
            ));
        }
        check_options("sink.kafka.options", &k.options)?;
    }
    Ok(())
}

/// Why a Kafka sink's record key cannot be built from processor `processor`'s output rows
/// (schema `output_schema`), if it cannot: a key column (by default the pipeline's grouping
/// columns, `key`) that is not an output column. Output rows are checked against that
/// schema, so such a key would fail every batch.
pub(crate) fn sink_key_missing(
    sink: &SinkSpec,
    key: &[String],
    processor: &str,
    output_schema: &str,
) -> Option<String> {
    let SinkSpec::Kafka(k) = sink else {
        return None;
    };
    let schema = statebox_schema::Schema::parse_ddl(output_schema).ok()?;
    let fields = schema.as_struct()?;
    let output_columns: Vec<&str> = fields.fields.iter().map(|f| f.name.as_str()).collect();
    let columns = statebox_kafka::record_key_columns(&k.key, key);
    let missing = statebox_kafka::missing_key_column(columns, &output_columns)?;
    let have = quoted(&output_columns);
    Some(if k.key.is_empty() {
        format!(
            "`sink.kafka.key` is not set, so each record's key is the grouping column \
             `{missing}`, which processor `{processor}` does not output (its columns: {have}); \
             set `sink.kafka.key` to output columns"
        )
    } else {
        format!(
            "`sink.kafka.key`: processor `{processor}` has no output column `{missing}` (its \
             columns: {have})"
        )
    })
}

/// The starting offsets of a source, checked.
fn starting_offsets(k: &KafkaSourceSpec) -> Result<statebox_kafka::StartingOffsets> {
    use statebox_kafka::StartingOffsets;
    const FIELD: &str = "source.kafka.starting_offsets";
    Ok(match &k.starting_offsets {
        None => StartingOffsets::Earliest,
        Some(StartingOffsetsSpec::Named(n)) => match n.as_str() {
            "earliest" => StartingOffsets::Earliest,
            "latest" => StartingOffsets::Latest,
            other => {
                return Err(AppError::bad_input(format!(
                    "`{FIELD}`: `{other}` is not a starting position (expected \"earliest\", \
                     \"latest\" or {{\"TOPIC\": {{\"PARTITION\": OFFSET}}}})"
                )));
            }
        },
        Some(StartingOffsetsSpec::Offsets(topics)) => {
            let mut out = BTreeMap::new();
            for (topic, parts) in topics {
                if !k.topics.contains(topic) {
                    return Err(AppError::bad_input(format!(
                        "`{FIELD}` names topic `{topic}`, which `source.kafka.topics` does not \
                         list"
                    )));
                }
                let mut p = BTreeMap::new();
                for (part, &offset) in parts {
                    let n: i32 = part.parse().ok().filter(|n| *n >= 0).ok_or_else(|| {
                        AppError::bad_input(format!(
                            "`{FIELD}.{topic}`: `{part}` is not a partition number"
                        ))
                    })?;
                    if offset < -2 {
                        return Err(AppError::bad_input(format!(
                            "`{FIELD}.{topic}.{part}`: offset {offset} (use -2 for earliest, \
                             -1 for latest)"
                        )));
                    }
                    p.insert(n, offset);
                }
                out.insert(topic.clone(), p);
            }
            StartingOffsets::Offsets(out)
        }
    })
}

/// The first broker of a pipeline's source or sink that `granted` does not list.
fn ungranted<'a>(
    granted: &[String],
    source: &'a SourceSpec,
    sink: &'a SinkSpec,
) -> Option<&'a str> {
    let source = source.kafka().map(|k| k.brokers.as_slice()).unwrap_or(&[]);
    let sink = sink.kafka().map(|k| k.brokers.as_slice()).unwrap_or(&[]);
    source
        .iter()
        .chain(sink)
        .find(|b| !granted.contains(b))
        .map(String::as_str)
}

fn not_granted(broker: &str) -> String {
    format!(
        "the Kafka broker `{broker}` is not granted to the tenant; the admin grants brokers \
         with PUT /v1/tenants/{{id}}/kafka"
    )
}

impl App {
    /// The Kafka brokers the admin granted `tenant`.
    pub(crate) fn kafka_grant(&self, tenant: &str) -> Vec<String> {
        self.registry
            .lock()
            .expect("registry lock")
            .data
            .tenants
            .get(tenant)
            .map(|t| t.kafka_brokers.clone())
            .unwrap_or_default()
    }

    /// Refuses (403, naming the broker) a source or sink with a broker the tenant's grant
    /// does not list.
    pub(crate) fn check_kafka_grant(
        &self,
        tenant: &str,
        source: &SourceSpec,
        sink: &SinkSpec,
    ) -> Result<()> {
        match ungranted(&self.kafka_grant(tenant), source, sink) {
            None => Ok(()),
            Some(b) => Err(AppError::KafkaBrokerNotGranted(not_granted(b))),
        }
    }

    /// The engine endpoints of a pipeline: Kafka where its spec says so (checked against
    /// the tenant's grant now), the input log and output file otherwise.
    pub(crate) fn kafka_endpoints(
        &self,
        record: &PipelineRecord,
    ) -> std::result::Result<Endpoints, String> {
        if let Some(b) = ungranted(
            &self.kafka_grant(&record.tenant),
            &record.source,
            &record.sink,
        ) {
            return Err(not_granted(b));
        }
        let input = match record.source.kafka() {
            None => None,
            Some(k) => Some(InputSettings {
                url: url("source.kafka", &k.brokers, &k.topics).map_err(|e| e.to_string())?,
                client_options: client_options("source.kafka.options", &k.options)?,
                starting_offsets: starting_offsets(k).map_err(|e| e.to_string())?,
                max_records_per_batch: k.max_records_per_batch,
                columns: k
                    .columns
                    .iter()
                    .map(|c| c.parse::<Column>().map_err(|e| e.to_string()))
                    .collect::<std::result::Result<_, _>>()?,
                idle_timeout_ms: k
                    .partition_idle_timeout_ms
                    .unwrap_or(statebox_kafka::DEFAULT_IDLE_TIMEOUT_MS),
            }),
        };
        let output = match record.sink.kafka() {
            None => None,
            Some(k) => Some(OutputSettings {
                url: url("sink.kafka", &k.brokers, std::slice::from_ref(&k.topic))
                    .map_err(|e| e.to_string())?,
                client_options: client_options("sink.kafka.options", &k.options)?,
                key_columns: k.key.clone(),
                delivery: match k.delivery {
                    DeliverySpec::ExactlyOnce => Delivery::ExactlyOnce,
                    DeliverySpec::AtLeastOnce => Delivery::AtLeastOnce,
                },
            }),
        };
        let shape = QueryShape {
            key_columns: &record.key,
            event_time: record.event_time.as_ref().map(|e| e.column.as_str()),
            // A pipeline keeps consuming, like `statebox run --trigger interval=...`.
            bounded: false,
        };
        statebox_kafka::endpoints(input, output, shape).map_err(|e| e.to_string())
    }

    /// Refuses HTTP ingest into a pipeline that reads Kafka (409).
    pub(crate) fn refuse_ingest_if_kafka(&self, id: &str) -> Result<()> {
        let source = self.pipeline_source(id);
        match source.kafka() {
            None => Ok(()),
            Some(k) => Err(AppError::KafkaSource(format!(
                "pipeline `{id}` reads Kafka topic(s) {} on {}, not HTTP ingest: produce its \
                 rows to the topic(s) instead",
                quoted(&k.topics),
                k.brokers.join(",")
            ))),
        }
    }

    /// Refuses reading the output log of a pipeline that writes to Kafka (409).
    pub(crate) fn refuse_output_if_kafka(&self, id: &str) -> Result<()> {
        let sink = self
            .registry
            .lock()
            .expect("registry lock")
            .data
            .pipelines
            .get(id)
            .map(|p| p.sink.clone())
            .unwrap_or_default();
        match sink.kafka() {
            None => Ok(()),
            Some(k) => Err(AppError::KafkaSink(format!(
                "pipeline `{id}` writes its output to Kafka topic `{}` on {}, not to an output \
                 log: read it from the topic (with isolation.level=read_committed to see each \
                 row once)",
                k.topic,
                k.brokers.join(",")
            ))),
        }
    }

    fn pipeline_source(&self, id: &str) -> SourceSpec {
        self.registry
            .lock()
            .expect("registry lock")
            .data
            .pipelines
            .get(id)
            .map(|p| p.source.clone())
            .unwrap_or_default()
    }
}

fn quoted(items: &[impl std::fmt::Display]) -> String {
    items
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A spec's client options for librdkafka, checked again (the registry is a file).
fn client_options(
    field: &str,
    options: &BTreeMap<String, String>,
) -> std::result::Result<Vec<(String, String)>, String> {
    check_options(field, options).map_err(|e| e.to_string())?;
    Ok(options
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect())
}

/// What a pipeline's JSON shows in place of a SASL password.
const REDACTED: &str = "<redacted>";

/// A pipeline's JSON as shown to its tenant: secrets among its Kafka options redacted.
pub(crate) fn redact(pipeline: &mut Value) {
    for side in ["source", "sink"] {
        if let Some(options) = pipeline
            .get_mut(side)
            .and_then(|s| s.get_mut("kafka"))
            .and_then(|k| k.get_mut("options"))
            .and_then(Value::as_object_mut)
            && let Some(p) = options.get_mut("sasl.password")
        {
            *p = json!(REDACTED);
        }
    }
}

impl App {
    /// Sets the Kafka brokers tenant `id`'s pipelines may read and write (the complete
    /// list; the admin's only); returns the grant as stored and the pipelines it stopped.
    /// Pipelines that use a broker no longer listed stop, marked failed with the reason.
    /// Blocks (up to the stop wait).
    pub(crate) fn grant_kafka_brokers(
        &self,
        id: &str,
        requested: &[String],
    ) -> Result<(Vec<String>, Vec<String>)> {
        let mut brokers = Vec::with_capacity(requested.len());
        for (i, b) in requested.iter().enumerate() {
            if b.is_empty() && requested.len() == 1 {
                continue;
            }
            brokers.push(
                normal_broker(b)
                    .map_err(|e| AppError::bad_input(format!("`brokers[{i}]`: {e}")))?,
            );
        }
        brokers.sort();
        brokers.dedup();
        let revoked: Vec<(String, String)> = {
            let mut registry = self.registry.lock().expect("registry lock");
            let tenant = registry
                .data
                .tenants
                .get_mut(id)
                .ok_or_else(|| AppError::not_found("tenant", id))?;
            tenant.kafka_brokers = brokers.clone();
            let revoked = registry
                .data
                .pipelines
                .values()
                .filter(|p| p.tenant == id && p.desired == Desired::Running)
                .filter_map(|p| {
                    ungranted(&brokers, &p.source, &p.sink).map(|b| (p.id.clone(), not_granted(b)))
                })
                .collect();
            crate::app::tenants::save(&registry)?;
            revoked
        };
        let stopped: Vec<String> = revoked.iter().map(|(p, _)| p.clone()).collect();
        for (pipeline, reason) in revoked {
            let Some(h) = self.pipeline(id, &pipeline) else {
                continue;
            };
            let reason = format!("stopped: {reason}");
            // Past the wait the runner ends on its own after its current batch.
            h.stop(self.config.http.stop_wait.min(Duration::from_secs(5)));
            {
                let mut status = h.status.lock().expect("status lock");
                status.state = RunState::Failed;
                status.failure = Some(reason.clone());
            }
            self.pipeline_failed(&pipeline, &reason);
            tracing::info!(pipeline = %pipeline, "pipeline stopped: its Kafka grant was revoked");
        }
        tracing::info!(tenant = %id, brokers = ?brokers, "Kafka brokers granted");
        Ok((brokers, stopped))
    }

    /// Replaces the client options of the tenant's pipeline `id`'s Kafka source, sink or
    /// both (the side's complete list): how credentials are rotated. Brokers and topics stay
    /// as they are, so the pipeline's offsets and its sink's transactions carry on. A
    /// `sasl.password` of `<redacted>` (as the pipeline's JSON shows it) keeps the stored
    /// one. A running pipeline restarts with the new options after its current batch; a
    /// stopped or failed one gets them when it starts again. Blocks (up to the stop wait).
    pub(crate) fn set_kafka_options(
        self: &Arc<Self>,
        tenant: &str,
        id: &str,
        change: KafkaOptionsChange,
    ) -> Result<(Pipeline, bool)> {
        if change.source.is_none() && change.sink.is_none() {
            return Err(AppError::bad_input(
                "give `source`, `sink` or both: the client options of that side of the pipeline",
            ));
        }
        let h = self.pipeline_handle(tenant, id)?;
        let record = self.update_pipeline_record(tenant, id, |r| {
            if let Some(options) = change.source {
                let SourceSpec::Kafka(k) = &mut r.source else {
                    return Err(AppError::bad_input(
                        "`source`: the pipeline does not read from Kafka",
                    ));
                };
                k.options = replaced_options("source", &k.options, options)?;
            }
            if let Some(options) = change.sink {
                let SinkSpec::Kafka(k) = &mut r.sink else {
                    return Err(AppError::bad_input(
                        "`sink`: the pipeline does not write to Kafka",
                    ));
                };
                k.options = replaced_options("sink", &k.options, options)?;
            }
            Ok(())
        })?;
        let restarted = self.restart_with(&record, &h, "the new Kafka options")?;
        tracing::info!(pipeline = %id, restarted, "pipeline Kafka options replaced");
        let pipeline = Pipeline {
            record,
            handle: Some(h),
        };
        Ok((pipeline, restarted))
    }
}

/// A request to replace a pipeline's Kafka client options
/// (`PUT /v1/pipelines/{id}/kafka/options`): per side, the complete list.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KafkaOptionsChange {
    #[serde(default)]
    pub source: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub sink: Option<BTreeMap<String, String>>,
}

/// The options that replace `current` on `side`: checked as a new pipeline's are, with a
/// redacted `sasl.password` standing for the stored one.
fn replaced_options(
    side: &str,
    current: &BTreeMap<String, String>,
    mut options: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    let field = format!("{side}.kafka.options");
    if let Some(p) = options.get_mut("sasl.password")
        && p == REDACTED
    {
        *p = current.get("sasl.password").cloned().ok_or_else(|| {
            AppError::bad_input(format!(
                "`{field}.sasl.password`: `{REDACTED}` keeps the stored password, but the \
                 pipeline has none; give the password"
            ))
        })?;
    }
    check_options(&field, &options)?;
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(v: Value) -> SourceSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn replaced_options_keep_a_redacted_password_and_are_checked() {
        let opts = |v: Value| -> BTreeMap<String, String> { serde_json::from_value(v).unwrap() };
        let current = opts(json!({"sasl.username": "u", "sasl.password": "old"}));
        let kept = replaced_options(
            "source",
            &current,
            opts(json!({"sasl.username": "v", "sasl.password": REDACTED})),
        )
        .unwrap();
        assert_eq!(
            kept,
            opts(json!({"sasl.username": "v", "sasl.password": "old"}))
        );
        let new = opts(json!({"sasl.password": "new", "client.id": "c"}));
        assert_eq!(
            replaced_options("sink", &current, new.clone()).unwrap(),
            new
        );
        // The whole list is replaced: what is not given is gone.
        assert_eq!(
            replaced_options("sink", &current, BTreeMap::new()).unwrap(),
            BTreeMap::new()
        );
        let e = replaced_options(
            "sink",
            &BTreeMap::new(),
            opts(json!({"sasl.password": REDACTED})),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`sink.kafka.options.sasl.password`") && e.contains("has none"),
            "{e}"
        );
        let e = replaced_options(
            "source",
            &current,
            opts(json!({"plugin.library.paths": "/x.so"})),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`source.kafka.options.plugin.library.paths`"),
            "{e}"
        );
    }

    #[test]
    fn specs_parse_with_defaults_and_bad_fields_are_named() {
        let mut s = source(json!({"kafka": {"brokers": "H:9092, h2:1", "topics": "a,b"}}));
        let mut sink: SinkSpec = serde_json::from_value(json!("output")).unwrap();
        check_spec(&mut s, &mut sink, false).unwrap();
        let k = s.kafka().unwrap();
        assert_eq!(k.brokers, ["h:9092", "h2:1"]);
        assert_eq!(k.topics, ["a", "b"]);
        assert_eq!(source(json!("http")), SourceSpec::Http);
        for (spec, status, field) in [
            (
                json!({"brokers": "h", "topics": ["t"]}),
                400,
                "source.kafka.brokers",
            ),
            (
                json!({"brokers": [], "topics": ["t"]}),
                400,
                "source.kafka.brokers",
            ),
            (
                json!({"brokers": "h:1", "topics": ["a b"]}),
                400,
                "source.kafka.topics",
            ),
            (
                json!({"brokers": "h:1", "topics": "t", "starting_offsets": "middle"}),
                400,
                "starting_offsets",
            ),
            (
                json!({"brokers": "h:1", "topics": "t", "starting_offsets": {"u": {"0": 1}}}),
                400,
                "`u`",
            ),
            (
                json!({"brokers": "h:1", "topics": "t", "starting_offsets": {"t": {"x": 1}}}),
                400,
                "`x`",
            ),
            (
                json!({"brokers": "h:1", "topics": "t", "columns": ["value"]}),
                400,
                "source.kafka.columns",
            ),
            (
                json!({"brokers": "h:1", "topics": "t", "max_records_per_batch": 0}),
                400,
                "max_records_per_batch",
            ),
            (
                json!({"brokers": "h:1", "topics": "t", "partition_idle_timeout_ms": 5}),
                400,
                "event-time",
            ),
            (
                json!({"brokers": "h:1", "topics": "t", "options": {"plugin.library.paths": "/x.so"}}),
                422,
                "plugin.library.paths",
            ),
            (
                json!({"brokers": "h:1", "topics": "t", "options": {"ssl.ca.location": "/etc/x"}}),
                422,
                "ssl.ca.location",
            ),
            (
                json!({"brokers": "h:1", "topics": "t", "options": {"sasl.mechanism": "GSSAPI"}}),
                422,
                "GSSAPI",
            ),
        ] {
            let mut s = source(json!({ "kafka": spec }));
            let e = crate::error::ApiError::from(
                check_spec(&mut s, &mut SinkSpec::Output, false).unwrap_err(),
            );
            assert_eq!(e.status.as_u16(), status, "{spec}: {}", e.message);
            assert!(e.message.contains(field), "{spec}: {}", e.message);
        }
        let mut sink: SinkSpec =
            serde_json::from_value(json!({"kafka": {"brokers": ["h:1"], "topic": "a,b"}})).unwrap();
        let e = check_spec(&mut SourceSpec::Http, &mut sink, false).unwrap_err();
        assert!(matches!(e, AppError::BadInput(_)), "{e:?}");
        assert!(e.to_string().contains("sink.kafka.topic"), "{e}");
        assert!(
            serde_json::from_value::<SinkSpec>(
                json!({"kafka": {"brokers": ["h:1"], "topic": "t", "delivery": "twice"}})
            )
            .is_err()
        );
    }

    #[test]
    fn grants_name_the_first_broker_missing() {
        let mut s = source(json!({"kafka": {"brokers": "a:1,B:2", "topics": "t"}}));
        let mut sink: SinkSpec =
            serde_json::from_value(json!({"kafka": {"brokers": "c:3", "topic": "o"}})).unwrap();
        check_spec(&mut s, &mut sink, false).unwrap();
        let granted = vec!["a:1".to_owned(), "b:2".to_owned()];
        assert_eq!(ungranted(&granted, &s, &sink), Some("c:3"));
        assert_eq!(ungranted(&granted, &s, &SinkSpec::Output), None);
    }

    #[test]
    fn a_sink_key_must_be_made_of_output_columns() {
        let key = ["user".to_owned()];
        let sink = |key: Value| {
            serde_json::from_value::<SinkSpec>(
                json!({"kafka": {"brokers": "h:1", "topic": "t", "key": key}}),
            )
            .unwrap()
        };
        let output = "key string, count long";
        let missing = |s: &SinkSpec, schema: &str| sink_key_missing(s, &key, "pr_c", schema);
        assert_eq!(missing(&SinkSpec::Output, output), None);
        assert_eq!(missing(&sink(json!(["key"])), output), None);
        assert_eq!(missing(&sink(json!(["count", "key"])), output), None);
        let default = missing(&sink(json!([])), output).unwrap();
        assert!(
            default.contains("is not set") && default.contains("`user`"),
            "{default}"
        );
        assert!(default.contains("`key`, `count`"), "{default}");
        let named = missing(&sink(json!(["key", "n"])), output).unwrap();
        assert!(named.contains("no output column `n`"), "{named}");
        // Grouped by an output column, the default key is fine.
        assert_eq!(missing(&sink(json!([])), "user string, n long"), None);
        // An output that is not a list of columns is not checked here.
        assert_eq!(missing(&sink(json!(["key"])), "long"), None);
    }

    #[test]
    fn passwords_are_redacted() {
        let mut v = json!({"source": {"kafka": {"options": {"sasl.password": "s3cret", "sasl.username": "u"}}}, "sink": "output"});
        redact(&mut v);
        assert_eq!(
            v["source"]["kafka"]["options"]["sasl.password"],
            "<redacted>"
        );
        assert_eq!(v["source"]["kafka"]["options"]["sasl.username"], "u");
    }
}
