//! Plain Kafka clients for `statebox bench kafka`: a producer of keyed JSON rows and a
//! `read_committed` watcher of a topic, so that the CLI needs no Kafka client of its own.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};
use statebox_engine::EngineError;

use crate::{BROKER_TIMEOUT, client_config, io};

/// Sends keyed rows (Java's key partitioning), without transactions.
pub struct RowProducer {
    producer: ThreadedProducer<DefaultProducerContext>,
}

impl RowProducer {
    /// A producer for `brokers`.
    pub fn new(brokers: &str, client_options: &[(String, String)]) -> Result<Self, EngineError> {
        let producer = client_config(
            brokers,
            &[("partitioner", "murmur2_random"), ("linger.ms", "5")],
            client_options,
        )
        .create()
        .map_err(|e| io("cannot create a Kafka producer", e))?;
        Ok(RowProducer { producer })
    }

    /// Queues one row, waiting while the local queue is full.
    pub fn send(&self, topic: &str, key: &str, row: &str) -> Result<(), EngineError> {
        let mut record = BaseRecord::to(topic).key(key).payload(row);
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((e, back)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err((e, _)) => return Err(io(format!("cannot send to `{topic}`"), e)),
            }
        }
    }

    /// Waits until every queued row is acknowledged.
    pub fn flush(&self) -> Result<(), EngineError> {
        self.producer
            .flush(BROKER_TIMEOUT)
            .map_err(|e| io("cannot flush the Kafka producer", e))
    }
}

/// Reads what is committed to a topic from its end at creation on.
pub struct TopicWatcher {
    consumer: BaseConsumer,
}

impl TopicWatcher {
    /// Watches every partition of `topic` from its current end.
    pub fn new(
        brokers: &str,
        client_options: &[(String, String)],
        topic: &str,
    ) -> Result<Self, EngineError> {
        let consumer: BaseConsumer = client_config(
            brokers,
            &[
                ("group.id", "statebox-bench-watcher"),
                ("enable.auto.commit", "false"),
                ("isolation.level", "read_committed"),
                ("fetch.wait.max.ms", "10"),
            ],
            client_options,
        )
        .create()
        .map_err(|e| io("cannot create a Kafka consumer", e))?;
        let md = consumer
            .fetch_metadata(Some(topic), BROKER_TIMEOUT)
            .map_err(|e| io(format!("cannot read the metadata of `{topic}`"), e))?;
        let mut tpl = TopicPartitionList::new();
        for t in md.topics().iter().filter(|t| t.name() == topic) {
            for p in t.partitions() {
                let (_, high) = consumer
                    .fetch_watermarks(topic, p.id(), BROKER_TIMEOUT)
                    .map_err(|e| io("cannot read offsets", e))?;
                tpl.add_partition_offset(topic, p.id(), Offset::Offset(high))
                    .map_err(|e| io("cannot assign", e))?;
            }
        }
        consumer
            .assign(&tpl)
            .map_err(|e| io("cannot assign partitions", e))?;
        Ok(TopicWatcher { consumer })
    }

    /// The next record's key and value, if one arrives within `timeout`.
    pub fn next(&self, timeout: Duration) -> Option<(Option<String>, String)> {
        match self.consumer.poll(timeout)? {
            Ok(m) => Some((
                m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            )),
            Err(_) => None,
        }
    }
}
