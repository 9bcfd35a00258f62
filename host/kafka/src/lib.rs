//! Kafka in and out for Statebox: a source reading topics by offset ranges the engine plans
//! and logs, and a transactional sink that delivers each batch exactly once.
//!
//! This is the only crate that links librdkafka (through `rdkafka`); the engine reaches it
//! through its `RecordSource` and `BatchSink` seams.
//!
//! Architecture Invariant: the checkpoint, not the broker, holds the input offsets. A
//! batch's offset ranges are logged in its plan before it runs and the next offsets are
//! committed in the same RocksDB write as its state (as Spark's Kafka source does). The
//! broker's consumer-group offsets are never read for input.
//!
//! Architecture Invariant: each batch's output is one Kafka transaction (exactly-once
//! delivery), which also commits, as a transactional offset commit of the consumer group
//! named as the transactional id (`statebox-<query id>`, or a group task's
//! `statebox-<group>-<topic>-<partition>`), the batch's id + 1 on partition 0 of the
//! output topic. The broker
//! applies that offset only if the transaction commits, so on start the sink reads it back
//! and knows the last batch Kafka has; the engine then re-runs a batch Kafka has but the
//! checkpoint lacks with its output suppressed.

pub mod client;
mod endpoints;
pub mod group;
pub mod keys;
mod sink;
mod source;

pub use crate::endpoints::{
    InputSettings, OutputSettings, QueryShape, endpoints, missing_key_column, record_key_columns,
};
pub use crate::sink::{Delivery, KafkaSink, SinkOptions};
pub use crate::source::{
    Column, DEFAULT_IDLE_TIMEOUT_MS, KafkaSource, SourceOptions, StartingOffsets,
};

use std::time::Duration;

use rdkafka::ClientConfig;

/// Why a Kafka setting is unusable. Always the user's settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `kafka://` address that does not parse.
    #[error(
        "invalid Kafka address `{url}`: {reason} (expected kafka://HOST:PORT[,HOST:PORT]/TOPIC[,TOPIC])"
    )]
    Url {
        /// The address given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Any other bad setting.
    #[error("{0}")]
    Setting(String),
}

/// A parsed `kafka://HOST:PORT[,HOST:PORT]/TOPIC[,TOPIC]` address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KafkaUrl {
    /// The bootstrap servers, comma-separated (librdkafka's `bootstrap.servers`).
    pub brokers: String,
    /// The topics, in the order given.
    pub topics: Vec<String>,
}

impl KafkaUrl {
    /// Parses `s` if it is a `kafka://` address; `None` for anything else (a file path).
    pub fn parse(s: &str) -> Result<Option<KafkaUrl>, Error> {
        let Some(rest) = s.strip_prefix("kafka://") else {
            return Ok(None);
        };
        let bad = |reason: &str| Error::Url {
            url: s.to_owned(),
            reason: reason.to_owned(),
        };
        let (brokers, topics) = rest
            .split_once('/')
            .ok_or_else(|| bad("no topic after the brokers"))?;
        if brokers.is_empty() {
            return Err(bad("no broker address"));
        }
        for b in brokers.split(',') {
            let (host, port) = b
                .rsplit_once(':')
                .ok_or_else(|| bad(&format!("broker `{b}` has no port")))?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad(&format!("broker `{b}` is not HOST:PORT")));
            }
        }
        let topics: Vec<String> = topics.split(',').map(str::to_owned).collect();
        for t in &topics {
            // Kafka's own rule for topic names.
            let legal = !t.is_empty()
                && t.len() <= 249
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
            if !legal {
                return Err(bad(&format!(
                    "`{t}` is not a topic name (letters, digits, `.`, `_` and `-`)"
                )));
            }
        }
        Ok(Some(KafkaUrl {
            brokers: brokers.to_owned(),
            topics,
        }))
    }
}

/// Parses a `--kafka-option KEY=VALUE`.
pub fn parse_option(s: &str) -> Result<(String, String), Error> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(Error::Setting(format!(
            "invalid Kafka option `{s}` (expected KEY=VALUE, e.g. security.protocol=SASL_SSL)"
        ))),
    }
}

/// How long a single broker operation (metadata, offsets, transaction steps) may take.
const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// A client configuration: the brokers, Statebox's settings, then the user's options
/// (which win, so security settings and tuning reach the client unchanged).
fn client_config(brokers: &str, ours: &[(&str, &str)], user: &[(String, String)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    // librdkafka logs through its own callback; route only warnings and worse.
    config.set("log_level", "4");
    for (k, v) in ours {
        config.set(*k, *v);
    }
    for (k, v) in user {
        config.set(k, v);
    }
    config
}

/// Creates a topic unless it exists (for `statebox bench kafka`; `statebox run` never
/// creates topics).
pub fn create_topic(
    brokers: &str,
    client_options: &[(String, String)],
    name: &str,
    partitions: i32,
) -> Result<(), statebox_engine::EngineError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::types::RDKafkaErrorCode;
    let admin: AdminClient<DefaultClientContext> = client_config(brokers, &[], client_options)
        .create()
        .map_err(|e| io("cannot create a Kafka admin client", e))?;
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(BROKER_TIMEOUT));
    let results = futures::executor::block_on(admin.create_topics([&topic], &opts))
        .map_err(|e| io(format!("cannot create Kafka topic `{name}`"), e))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => {
                return Err(statebox_engine::EngineError::Io(format!(
                    "cannot create Kafka topic `{t}`: {code}"
                )));
            }
        }
    }
    Ok(())
}

/// An rdkafka error as an engine I/O error, with what was being done.
fn io(what: impl std::fmt::Display, e: rdkafka::error::KafkaError) -> statebox_engine::EngineError {
    statebox_engine::EngineError::Io(format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_key_defaults_to_the_grouping_columns_and_must_be_output() {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (grouping, named) = (strings(&["user"]), strings(&["key", "region"]));
        assert_eq!(record_key_columns(&[], &grouping), grouping.as_slice());
        assert_eq!(record_key_columns(&named, &grouping), named.as_slice());
        let output = ["key", "count"];
        assert_eq!(missing_key_column(&grouping, &output), Some("user"));
        assert_eq!(missing_key_column(&named, &output), Some("region"));
        assert_eq!(missing_key_column(&named[..1], &output), None);
        // Case matters, as the sink reads rows.
        assert_eq!(missing_key_column(&strings(&["Key"]), &output), Some("Key"));
        // A processor that declares no columns is not checked.
        assert_eq!(missing_key_column(&grouping, &[]), None);
    }

    #[test]
    fn urls_parse_and_bad_ones_say_why() {
        assert_eq!(KafkaUrl::parse("in.jsonl").unwrap(), None);
        let u = KafkaUrl::parse("kafka://127.0.0.1:9092,127.0.0.1:9093/a,b.c")
            .unwrap()
            .unwrap();
        assert_eq!(u.brokers, "127.0.0.1:9092,127.0.0.1:9093");
        assert_eq!(u.topics, vec!["a", "b.c"]);
        for (bad, why) in [
            ("kafka://127.0.0.1:9092", "no topic"),
            ("kafka:///t", "no broker"),
            ("kafka://host/t", "no port"),
            ("kafka://host:x/t", "not HOST:PORT"),
            ("kafka://h:1/a b", "not a topic name"),
            ("kafka://h:1/a,", "not a topic name"),
        ] {
            let e = KafkaUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn options_parse() {
        assert_eq!(
            parse_option("sasl.password=a=b").unwrap(),
            ("sasl.password".into(), "a=b".into())
        );
        assert!(parse_option("novalue").is_err());
        assert!(parse_option("=x").is_err());
    }
}
