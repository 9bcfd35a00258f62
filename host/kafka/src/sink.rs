//! The Kafka sink: every emitted row as one JSON record, one transaction per batch.
//!
//! Exactly once: the producer's `transactional.id` is `statebox-<query id>` (or
//! [`SinkOptions::transactional_id`], a consumer group's task's own), stable across
//! restarts, so a new run fences the old one's producer and aborts its open transaction;
//! the fenced producer's next step fails with [`EngineError::Fenced`].
//! Each batch's records and a transactional offset commit (group: the transactional id,
//! partition 0 of the output topic, offset = batch id + 1) go in one transaction: the
//! broker applies the offset only if the transaction commits, so it names the last batch
//! Kafka has. The batch id is in the offset itself, not its metadata, because some
//! Kafka-protocol brokers drop commit metadata.
//!
//! At least once: an idempotent producer, no transactions; a batch re-run after a crash is
//! sent again.

use std::collections::BTreeMap;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::value::RawValue;
use statebox_engine::{BatchSink, EngineError};

use crate::{BROKER_TIMEOUT, Error, KafkaUrl, client_config, io};

/// How batches reach Kafka.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// One transaction per batch; `read_committed` consumers see each row once.
    ExactlyOnce,
    /// An idempotent producer without transactions: a batch re-run after a crash is sent
    /// again (cheaper; consumers must tolerate duplicates).
    AtLeastOnce,
}

impl std::str::FromStr for Delivery {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "exactly-once" => Ok(Delivery::ExactlyOnce),
            "at-least-once" => Ok(Delivery::AtLeastOnce),
            _ => Err(Error::Setting(format!(
                "unknown output delivery `{s}` (expected exactly-once or at-least-once)"
            ))),
        }
    }
}

/// Where and how to write.
#[derive(Clone, Debug)]
pub struct SinkOptions {
    /// Brokers and the one output topic.
    pub url: KafkaUrl,
    /// Client settings passed to librdkafka (`--kafka-option`), after Statebox's own.
    pub client_options: Vec<(String, String)>,
    /// The output columns that make each record's key (default: the grouping key columns).
    pub key_columns: Vec<String>,
    /// Exactly once or at least once.
    pub delivery: Delivery,
    /// The producer's `transactional.id` (and the group its batch ids are committed to);
    /// `None` for `statebox-<query id>`. A task of a consumer group has its own,
    /// `statebox-<group>-<topic>-<partition>`, so that its next owner fences this one.
    pub transactional_id: Option<String>,
}

impl Default for SinkOptions {
    /// No brokers or topic (set `url`), no key columns (set them), exactly once, the
    /// query's own transactional id.
    fn default() -> Self {
        SinkOptions {
            url: KafkaUrl::default(),
            client_options: Vec::new(),
            key_columns: Vec::new(),
            delivery: Delivery::ExactlyOnce,
            transactional_id: None,
        }
    }
}

/// Writes batches to a Kafka topic. See the module docs.
pub struct KafkaSink {
    opts: SinkOptions,
    topic: String,
    producer: Option<ThreadedProducer<DefaultProducerContext>>,
    /// Reads the group's committed offset; gives the transaction its group metadata.
    group: Option<BaseConsumer>,
    /// The last batch Kafka has (exactly once).
    last_delivered: Option<u64>,
    /// A batch whose transaction commit was attempted with an unknown outcome.
    in_doubt: Option<u64>,
    /// Makes delivery ids unique: this process's id and start time, and a counter.
    run: String,
    deliveries: u64,
    /// The id [`BatchSink::delivery_id`] gave the next delivery.
    next_id: Option<String>,
    /// The producer's transactional id (set when the sink opens).
    client_id: String,
}

impl KafkaSink {
    /// A sink writing to `opts.url`'s single topic. Connects when the query opens.
    pub fn new(opts: SinkOptions) -> Result<KafkaSink, EngineError> {
        let [topic] = opts.url.topics.as_slice() else {
            return Err(EngineError::Config(format!(
                "--output names {} Kafka topics; the sink writes to exactly one",
                opts.url.topics.len()
            )));
        };
        if opts.key_columns.is_empty() {
            return Err(EngineError::Config(
                "--output-key needs at least one column".into(),
            ));
        }
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        Ok(KafkaSink {
            topic: topic.clone(),
            opts,
            producer: None,
            group: None,
            last_delivered: None,
            in_doubt: None,
            run: format!("{}-{started:x}", std::process::id()),
            deliveries: 0,
            next_id: None,
            client_id: String::new(),
        })
    }

    fn new_id(&mut self, batch_id: u64) -> String {
        self.deliveries += 1;
        format!("{}-{batch_id}-{}", self.run, self.deliveries)
    }

    fn config(&self, ours: &[(&str, &str)]) -> ClientConfig {
        client_config(&self.opts.url.brokers, ours, &self.opts.client_options)
    }

    /// The record key of an output row: the key column's value (a string's text), or for
    /// several columns the JSON array of their values.
    fn key_of(&self, row: &str) -> Result<Option<Vec<u8>>, EngineError> {
        let fields: BTreeMap<String, &RawValue> = serde_json::from_str(row).map_err(|e| {
            EngineError::Io(format!("an output row is not a JSON object ({e}): {row}"))
        })?;
        let mut values = Vec::with_capacity(self.opts.key_columns.len());
        for c in &self.opts.key_columns {
            let v = fields.get(c).ok_or_else(|| {
                EngineError::Config(format!(
                    "an output row has no column `{c}` for the Kafka record key; name the \
                     key's output columns (`statebox run --output-key`, or the sink's `key` \
                     in a server pipeline; the default is the grouping key)"
                ))
            })?;
            values.push(v.get());
        }
        Ok(match values.as_slice() {
            ["null"] => None,
            [one] if one.starts_with('"') => Some(
                serde_json::from_str::<String>(one)
                    .expect("a JSON string")
                    .into_bytes(),
            ),
            [one] => Some(one.as_bytes().to_vec()),
            many => Some(format!("[{}]", many.join(",")).into_bytes()),
        })
    }

    /// A producer error as an engine error: [`EngineError::Fenced`] when another producer
    /// with this transactional id took over (a newer owner of the query or task: this one
    /// must stop writing), an I/O error otherwise. A fenced producer's later calls fail
    /// with librdkafka's generic fatal error, so its recorded fatal error is asked too.
    fn fail(
        &self,
        producer: &ThreadedProducer<DefaultProducerContext>,
        what: impl std::fmt::Display,
        e: rdkafka::error::KafkaError,
    ) -> EngineError {
        let fenced = e.rdkafka_error_code().is_some_and(is_fenced)
            || producer
                .client()
                .fatal_error()
                .is_some_and(|(code, _)| is_fenced(code));
        if fenced {
            return EngineError::Fenced(format!(
                "{what}: another producer with transactional id `{}` took over (a newer owner \
                 of this query or task); this one stops writing: {e}",
                self.client_id
            ));
        }
        io(what, e)
    }

    /// Reads the last batch Kafka has from the group's committed offset.
    fn read_last_delivered(&self) -> Result<Option<u64>, EngineError> {
        let group = self.group.as_ref().expect("opened");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, 0);
        let committed = group
            .committed_offsets(tpl, BROKER_TIMEOUT)
            .map_err(|e| io("cannot read which batches Kafka has", e))?;
        Ok(committed
            .find_partition(&self.topic, 0)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) if o > 0 => Some(o as u64 - 1),
                _ => None,
            }))
    }

    fn send(
        &self,
        producer: &ThreadedProducer<DefaultProducerContext>,
        batch_id: u64,
        id: &str,
        rows: &[String],
    ) -> Result<(), EngineError> {
        let batch = batch_id.to_string();
        for row in rows {
            let key = self.key_of(row)?;
            let headers = OwnedHeaders::new_with_capacity(2)
                .insert(Header {
                    key: "statebox.batch",
                    value: Some(batch.as_str()),
                })
                .insert(Header {
                    key: "statebox.delivery",
                    value: Some(id),
                });
            let mut record = BaseRecord::to(&self.topic)
                .payload(row.as_str())
                .headers(headers);
            if let Some(k) = &key {
                record = record.key(k.as_slice());
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((e, back))
                        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) =>
                    {
                        // The local queue is full: wait for deliveries to drain it.
                        record = back;
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    Err((e, _)) => {
                        return Err(self.fail(
                            producer,
                            format!("cannot send to Kafka topic `{}`", self.topic),
                            e,
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

impl BatchSink for KafkaSink {
    fn open(
        &mut self,
        query_id: &str,
        last_committed: Option<u64>,
        pending: Option<u64>,
    ) -> Result<(), EngineError> {
        // Any previous producer may be in a fatal state; start over.
        self.producer = None;
        self.in_doubt = None;
        let client_id = self
            .opts
            .transactional_id
            .clone()
            .unwrap_or_else(|| format!("statebox-{query_id}"));
        self.client_id = client_id.clone();
        let producer: ThreadedProducer<DefaultProducerContext> = match self.opts.delivery {
            Delivery::ExactlyOnce => self.config(&[
                ("transactional.id", &client_id),
                ("client.id", &client_id),
                // Keys land on the partitions a Java client would choose.
                ("partitioner", "murmur2_random"),
                ("linger.ms", "5"),
            ]),
            Delivery::AtLeastOnce => self.config(&[
                ("enable.idempotence", "true"),
                ("client.id", &client_id),
                ("partitioner", "murmur2_random"),
                ("linger.ms", "5"),
            ]),
        }
        .create()
        .map_err(|e| io("cannot create the Kafka producer", e))?;
        // The topic must exist: Statebox does not create topics behind the operator's back.
        let md = producer
            .client()
            .fetch_metadata(Some(&self.topic), BROKER_TIMEOUT)
            .map_err(|e| {
                io(
                    format!("cannot reach Kafka at {}", self.opts.url.brokers),
                    e,
                )
            })?;
        let exists = md
            .topics()
            .iter()
            .any(|t| t.name() == self.topic && t.error().is_none() && !t.partitions().is_empty());
        if !exists {
            return Err(EngineError::Config(format!(
                "Kafka output topic `{}` does not exist on {}; create it first",
                self.topic, self.opts.url.brokers
            )));
        }
        if self.opts.delivery == Delivery::AtLeastOnce {
            self.producer = Some(producer);
            return Ok(());
        }
        // Fences any earlier producer of this query and aborts its open transaction, so the
        // committed offset read next is final.
        producer
            .init_transactions(BROKER_TIMEOUT)
            .map_err(|e| self.fail(&producer, "cannot start Kafka transactions", e))?;
        let group: BaseConsumer = self
            .config(&[
                ("group.id", &client_id),
                ("enable.auto.commit", "false"),
                ("isolation.level", "read_committed"),
            ])
            .create()
            .map_err(|e| io("cannot create the Kafka group client", e))?;
        self.group = Some(group);
        self.producer = Some(producer);
        let last = self.read_last_delivered()?;
        // Kafka may be one batch ahead (delivered, then the run died before the checkpoint
        // committed it), never more: that would be output the checkpoint cannot account for.
        let newest = pending.or(last_committed);
        if last.is_some_and(|l| newest.is_none_or(|n| l > n)) {
            return Err(EngineError::Config(format!(
                "Kafka topic `{}` already has batch {} of query {query_id}, but the checkpoint \
                 is at {}; the checkpoint is older than its output (restored from a copy?) \
                 and re-running it would deliver batches twice",
                self.topic,
                last.unwrap_or_default(),
                newest.map_or("no batch".to_owned(), |n| format!("batch {n}"))
            )));
        }
        self.last_delivered = last;
        tracing::info!(last_delivered = ?last, "Kafka sink ready");
        Ok(())
    }

    fn has_batch(&mut self, batch_id: u64) -> Result<bool, EngineError> {
        Ok(self.last_delivered.is_some_and(|l| l >= batch_id))
    }

    fn delivery_id(&mut self, batch_id: u64) -> Option<String> {
        // At least once, nothing needs to know which delivery holds a batch: no id is
        // logged (saving the engine a synced write per batch); records still carry one.
        if self.opts.delivery == Delivery::AtLeastOnce {
            return None;
        }
        let id = self.new_id(batch_id);
        self.next_id = Some(id.clone());
        Some(id)
    }

    fn deliver(&mut self, batch_id: u64, rows: &[String]) -> Result<(), EngineError> {
        if self.producer.is_none() {
            return Err(EngineError::Io("the Kafka sink was not opened".into()));
        }
        let id = match self.next_id.take() {
            Some(id) => id,
            None => self.new_id(batch_id),
        };
        let producer = self.producer.as_ref().expect("checked above");
        if self.opts.delivery == Delivery::AtLeastOnce {
            self.send(producer, batch_id, &id, rows)?;
            drain(producer)?;
            return producer.flush(BROKER_TIMEOUT).map_err(|e| {
                self.fail(
                    producer,
                    format!("cannot deliver batch {batch_id} to Kafka"),
                    e,
                )
            });
        }
        producer
            .begin_transaction()
            .map_err(|e| self.fail(producer, "cannot begin a Kafka transaction", e))?;
        let sent = self.send(producer, batch_id, &id, rows).and_then(|()| {
            let mut offsets = TopicPartitionList::new();
            offsets
                .add_partition_offset(&self.topic, 0, Offset::Offset(batch_id as i64 + 1))
                .map_err(|e| io("cannot record the batch id", e))?;
            let metadata = self
                .group
                .as_ref()
                .and_then(|g| g.group_metadata())
                .ok_or_else(|| EngineError::Io("no Kafka group metadata".into()))?;
            producer
                .send_offsets_to_transaction(&offsets, &metadata, BROKER_TIMEOUT)
                .map_err(|e| {
                    self.fail(
                        producer,
                        "cannot add the batch id to the Kafka transaction",
                        e,
                    )
                })
        });
        if let Err(e) = sent {
            // A fenced producer has nothing to abort (the newer one aborted its open
            // transaction) and would only wait out the timeout trying.
            if !matches!(e, EngineError::Fenced(_))
                && let Err(abort) = producer.abort_transaction(BROKER_TIMEOUT)
            {
                tracing::warn!(error = %abort, "cannot abort the Kafka transaction");
            }
            return Err(e);
        }
        // From here until the commit returns, Kafka may or may not have the batch.
        self.in_doubt = Some(batch_id);
        // Records the broker refused (a fenced producer's) leave the queue as failures; the
        // commit below then reports why.
        drain(producer)?;
        producer.commit_transaction(BROKER_TIMEOUT).map_err(|e| {
            self.fail(
                producer,
                format!("cannot commit batch {batch_id} to Kafka"),
                e,
            )
        })?;
        self.in_doubt = None;
        self.last_delivered = Some(batch_id);
        Ok(())
    }

    fn may_have_delivered(&self, batch_id: u64) -> bool {
        self.in_doubt == Some(batch_id) || self.last_delivered.is_some_and(|l| l >= batch_id)
    }
}

/// Whether a librdkafka error code says a newer producer with the same transactional id
/// fenced this one.
fn is_fenced(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
    )
}

/// Waits until every record sent is acknowledged (the producer's own thread serves the
/// delivery reports), in steps of a millisecond. rdkafka's `flush` (which `commit_transaction`
/// calls first) polls in steps of a whole 100 ms when anything is outstanding, which cost
/// every batch 100 ms; after this wait it finds nothing outstanding and returns at once.
fn drain(producer: &ThreadedProducer<DefaultProducerContext>) -> Result<(), EngineError> {
    let deadline = std::time::Instant::now() + BROKER_TIMEOUT;
    while producer.in_flight_count() > 0 {
        if std::time::Instant::now() >= deadline {
            return Err(EngineError::Io(format!(
                "Kafka did not acknowledge {} records within {}s",
                producer.in_flight_count(),
                BROKER_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Ok(())
}
