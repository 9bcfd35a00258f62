//! The Kafka source: topics read by offset ranges that the engine plans, logs and commits.
//!
//! The consumer is assigned partitions explicitly; it joins no group and commits nothing
//! (as Spark's Kafka source). Each plan names, for every known partition, the offsets
//! `start..end` the batch reads; `end` is at most the partition's last stable offset, so a
//! `read_committed` consumer can always read up to it. A re-run reads exactly the same
//! records. New partitions are found at each plan (unbounded runs) and read from their
//! earliest offset, as in Spark; a committed partition that disappeared fails the query.
//!
//! A task of a consumer group reads one partition ([`SourceOptions::partitions`]): its
//! plans name only that one, its identity says which (`kafka:TOPIC[P]`), and each row's
//! grouping key is checked to belong there ([`SourceOptions::key_check`]), because a key
//! whose rows sit in two partitions would be counted apart by two tasks.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::Message;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Timestamp;
use rdkafka::types::RDKafkaErrorCode;
use serde::{Deserialize, Serialize};
use statebox_engine::{EngineError, RecordSource, SourceBatch, SourceText};

use crate::{BROKER_TIMEOUT, Error, KafkaUrl, client_config, io};

/// Where a query with no committed offsets starts (Spark's `startingOffsets`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartingOffsets {
    /// The earliest offset of every partition.
    Earliest,
    /// The end of every partition when the query starts.
    Latest,
    /// Per topic and partition an offset, or -2 (earliest) or -1 (latest), as in Spark's
    /// `{"topicA":{"0":23,"1":-1}}`. Partitions not named start at the earliest offset.
    Offsets(BTreeMap<String, BTreeMap<i32, i64>>),
}

impl std::str::FromStr for StartingOffsets {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim() {
            "earliest" => Ok(StartingOffsets::Earliest),
            "latest" => Ok(StartingOffsets::Latest),
            json => {
                let map: BTreeMap<String, BTreeMap<String, i64>> = serde_json::from_str(json)
                    .map_err(|e| {
                        Error::Setting(format!(
                            "--starting-offsets must be earliest, latest or JSON such as \
                             {{\"topic\":{{\"0\":23,\"1\":-2}}}}: {e}"
                        ))
                    })?;
                let mut out = BTreeMap::new();
                for (topic, parts) in map {
                    let mut p = BTreeMap::new();
                    for (part, offset) in parts {
                        let part: i32 = part.parse().map_err(|_| {
                            Error::Setting(format!(
                                "--starting-offsets: `{part}` of topic `{topic}` is not a partition number"
                            ))
                        })?;
                        if offset < -2 {
                            return Err(Error::Setting(format!(
                                "--starting-offsets: offset {offset} of {topic} partition {part} \
                                 (use -2 for earliest, -1 for latest)"
                            )));
                        }
                        p.insert(part, offset);
                    }
                    out.insert(topic, p);
                }
                Ok(StartingOffsets::Offsets(out))
            }
        }
    }
}

/// A Kafka column added to each row when asked for (named as in Spark's Kafka source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    /// The record key as a string (null without a key).
    Key,
    /// The topic.
    Topic,
    /// The partition.
    Partition,
    /// The offset.
    Offset,
    /// The record timestamp, epoch milliseconds.
    Timestamp,
}

impl Column {
    fn name(self) -> &'static str {
        match self {
            Column::Key => "key",
            Column::Topic => "topic",
            Column::Partition => "partition",
            Column::Offset => "offset",
            Column::Timestamp => "timestamp",
        }
    }
}

impl std::str::FromStr for Column {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s.trim() {
            "key" => Column::Key,
            "topic" => Column::Topic,
            "partition" => Column::Partition,
            "offset" => Column::Offset,
            "timestamp" => Column::Timestamp,
            other => {
                return Err(Error::Setting(format!(
                    "unknown Kafka column `{other}` (expected key, topic, partition, offset or timestamp)"
                )));
            }
        })
    }
}

/// How to read.
#[derive(Clone, Debug)]
pub struct SourceOptions {
    /// Brokers and topics.
    pub url: KafkaUrl,
    /// Client settings passed to librdkafka (`--kafka-option`), after Statebox's own.
    pub client_options: Vec<(String, String)>,
    /// Where a new query starts.
    pub starting_offsets: StartingOffsets,
    /// At most this many offsets per batch over all partitions (shared in proportion to
    /// each partition's backlog); unbounded when `None`.
    pub max_records_per_batch: Option<u64>,
    /// Stop at the end offsets seen when the query opens (trigger `available-now`);
    /// otherwise every plan reads up to the current end and finds new partitions.
    pub bounded: bool,
    /// Kafka columns added to every row.
    pub columns: Vec<Column>,
    /// In event-time mode, a partition without records for this long (in batch time) no
    /// longer holds the watermark back.
    pub idle_timeout_ms: i64,
    /// Read only these partitions of each topic (a task of a consumer group reads one):
    /// plans name only them, and partitions added later are not picked up. `None` reads
    /// every partition, including new ones.
    pub partitions: Option<Vec<i32>>,
    /// The grouping key columns, checked against each record's partition: a query that
    /// reads only some partitions (a task) is correct only if every row of a key is in the
    /// same partition. A row passes when its rendered grouping key equals the record's key,
    /// or when Kafka's default partitioner would put that key in the record's partition;
    /// otherwise the batch fails, naming the record. `None` checks nothing.
    pub key_check: Option<Vec<String>>,
}

impl Default for SourceOptions {
    /// No brokers or topics (set `url`), every partition from the earliest offset, batches
    /// unbounded, no Kafka columns, no key check.
    fn default() -> Self {
        SourceOptions {
            url: KafkaUrl::default(),
            client_options: Vec::new(),
            starting_offsets: StartingOffsets::Earliest,
            max_records_per_batch: None,
            bounded: false,
            columns: Vec::new(),
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            partitions: None,
            key_check: None,
        }
    }
}

/// The default of [`SourceOptions::idle_timeout_ms`]: one minute.
pub const DEFAULT_IDLE_TIMEOUT_MS: i64 = 60_000;

/// One partition's share of a batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Range {
    topic: String,
    partition: i32,
    /// First offset read.
    start: i64,
    /// One past the last offset read.
    end: i64,
}

/// A batch's plan: every known partition, in (topic, partition) order.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Plan {
    ranges: Vec<Range>,
}

/// A partition's event-time progress, for the per-partition watermark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct PartitionTime {
    /// The largest record timestamp seen.
    max_ms: i64,
    /// The batch timestamp of the last batch with records from this partition.
    active_ms: i64,
}

type Tp = (String, i32);

/// The source consumer's context. An end-of-partition event that arrives after a batch
/// unassigned its partitions reaches librdkafka's main queue, which reports it as a client
/// error; it is not one, and is logged at debug level. Real errors are logged as errors.
struct SourceContext;

impl ClientContext for SourceContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF) {
            tracing::debug!(%reason, "Kafka partition end reached");
        } else {
            tracing::error!(%error, %reason, "librdkafka");
        }
    }
}

impl ConsumerContext for SourceContext {}

/// Reads Kafka topics for the engine. See the module docs.
pub struct KafkaSource {
    opts: SourceOptions,
    consumer: BaseConsumer<SourceContext>,
    /// The next offset of each known partition: committed, or where a new query starts.
    next: BTreeMap<Tp, i64>,
    /// Where a bounded run stops.
    stop_at: Option<BTreeMap<Tp, i64>>,
    /// Committed event-time progress per partition, and the batch's, applied on commit.
    times: BTreeMap<Tp, PartitionTime>,
    pending_times: BTreeMap<Tp, PartitionTime>,
    /// Each topic's partition count, for the key check (read when the query opens; a
    /// topic that grows later changes where Kafka's partitioner puts keys, which the check
    /// then reports).
    partition_counts: BTreeMap<String, i32>,
}

const OFFSET_PREFIX: &str = "kafka/";
const TIME_PREFIX: &str = "kafka-time/";

fn name(tp: &Tp) -> String {
    format!("{}/{}", tp.0, tp.1)
}

fn parse_name(s: &str) -> Option<Tp> {
    let (topic, part) = s.rsplit_once('/')?;
    Some((topic.to_owned(), part.parse().ok()?))
}

impl KafkaSource {
    /// A source over `opts.url`'s topics. Connects lazily: nothing is asked of the brokers
    /// until the query opens.
    pub fn new(opts: SourceOptions) -> Result<KafkaSource, EngineError> {
        let consumer: BaseConsumer<SourceContext> = client_config(
            &opts.url.brokers,
            &[
                // Offsets live in the checkpoint: no group, no commits, and a planned
                // offset that is gone (retention) is an error rather than a silent jump.
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("enable.partition.eof", "true"),
                ("auto.offset.reset", "error"),
                ("isolation.level", "read_committed"),
                ("group.id", "statebox-source"),
            ],
            &opts.client_options,
        )
        .create_with_context(SourceContext)
        .map_err(|e| io("cannot create the Kafka consumer", e))?;
        Ok(KafkaSource {
            opts,
            consumer,
            next: BTreeMap::new(),
            stop_at: None,
            times: BTreeMap::new(),
            pending_times: BTreeMap::new(),
            partition_counts: BTreeMap::new(),
        })
    }

    /// Every partition of the source's topics, from the brokers' metadata.
    fn partitions(&self) -> Result<Vec<Tp>, EngineError> {
        let mut out = Vec::new();
        for topic in &self.opts.url.topics {
            let md = self
                .consumer
                .fetch_metadata(Some(topic), BROKER_TIMEOUT)
                .map_err(|e| io(format!("cannot read the metadata of topic `{topic}`"), e))?;
            let t = md.topics().iter().find(|t| t.name() == topic);
            match t {
                Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                    let ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
                    match &self.opts.partitions {
                        None => out.extend(ids.iter().map(|&p| (topic.clone(), p))),
                        Some(only) => {
                            let missing: Vec<String> = only
                                .iter()
                                .filter(|p| !ids.contains(p))
                                .map(i32::to_string)
                                .collect();
                            if !missing.is_empty() {
                                return Err(EngineError::Config(format!(
                                    "Kafka topic `{topic}` has no partition {} (it has {} \
                                     partitions)",
                                    missing.join(", "),
                                    ids.len()
                                )));
                            }
                            out.extend(only.iter().map(|&p| (topic.clone(), p)));
                        }
                    }
                }
                _ => {
                    return Err(EngineError::Config(format!(
                        "Kafka topic `{topic}` does not exist on {}",
                        self.opts.url.brokers
                    )));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Each topic's number of partitions (all of them, whatever the source reads).
    fn partition_counts(&self) -> Result<BTreeMap<String, i32>, EngineError> {
        let mut out = BTreeMap::new();
        for topic in &self.opts.url.topics {
            let md = self
                .consumer
                .fetch_metadata(Some(topic), BROKER_TIMEOUT)
                .map_err(|e| io(format!("cannot read the metadata of topic `{topic}`"), e))?;
            let n = md
                .topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none())
                .map_or(0, |t| t.partitions().len());
            if n == 0 {
                return Err(EngineError::Config(format!(
                    "Kafka topic `{topic}` does not exist on {}",
                    self.opts.url.brokers
                )));
            }
            out.insert(topic.clone(), n as i32);
        }
        Ok(out)
    }

    /// The earliest and the end offset of a partition (the end is the last stable offset
    /// for `read_committed`: librdkafka asks with the consumer's isolation level).
    fn watermarks(&self, tp: &Tp) -> Result<(i64, i64), EngineError> {
        self.consumer
            .fetch_watermarks(&tp.0, tp.1, BROKER_TIMEOUT)
            .map_err(|e| io(format!("cannot read the offsets of {}", describe(tp)), e))
    }

    /// Where a partition without a committed offset starts.
    fn initial_offset(&self, tp: &Tp, new_query: bool) -> Result<i64, EngineError> {
        let (low, high) = self.watermarks(tp)?;
        // Partitions found after the query started are read from the start, as in Spark.
        if !new_query {
            tracing::info!(topic = %tp.0, partition = tp.1, "new Kafka partition; reading it from its earliest offset");
            return Ok(low);
        }
        let wanted = match &self.opts.starting_offsets {
            StartingOffsets::Earliest => -2,
            StartingOffsets::Latest => -1,
            StartingOffsets::Offsets(map) => map
                .get(&tp.0)
                .and_then(|p| p.get(&tp.1))
                .copied()
                .unwrap_or(-2),
        };
        Ok(match wanted {
            -2 => low,
            -1 => high,
            o if o < low || o > high => {
                return Err(EngineError::Config(format!(
                    "--starting-offsets asks for offset {o} of {}, which holds offsets {low}..{high}",
                    describe(tp)
                )));
            }
            o => o,
        })
    }
}

fn describe(tp: &Tp) -> String {
    format!("topic {} partition {}", tp.0, tp.1)
}

impl RecordSource for KafkaSource {
    fn identity(&self) -> String {
        let mut topics = self.opts.url.topics.clone();
        topics.sort();
        match &self.opts.partitions {
            None => format!("kafka:{}", topics.join(",")),
            // A checkpoint of some partitions is not one of others (or of all).
            Some(only) => {
                let mut only = only.clone();
                only.sort_unstable();
                only.dedup();
                let only: Vec<String> = only.iter().map(i32::to_string).collect();
                format!("kafka:{}[{}]", topics.join(","), only.join(","))
            }
        }
    }

    fn restore(
        &mut self,
        committed: Vec<(String, Vec<u8>)>,
        new_query: bool,
    ) -> Result<(), EngineError> {
        let unreadable = |what: &str| {
            EngineError::corrupt_record(
                &format!("Kafka progress `{what}`"),
                "its name or value does not decode",
            )
        };
        for (key, value) in committed {
            if let Some(rest) = key.strip_prefix(OFFSET_PREFIX) {
                let tp = parse_name(rest).ok_or_else(|| unreadable(&key))?;
                let offset = serde_json::from_slice(&value).map_err(|_| unreadable(&key))?;
                self.next.insert(tp, offset);
            } else if let Some(rest) = key.strip_prefix(TIME_PREFIX) {
                let tp = parse_name(rest).ok_or_else(|| unreadable(&key))?;
                let t = serde_json::from_slice(&value).map_err(|_| unreadable(&key))?;
                self.times.insert(tp, t);
            }
        }
        if let Some(only) = &self.opts.partitions {
            let other: Vec<String> = self
                .next
                .keys()
                .filter(|tp| !only.contains(&tp.1))
                .map(describe)
                .collect();
            if !other.is_empty() {
                return Err(EngineError::Config(format!(
                    "the checkpoint has read from {}, but this source reads only partition(s) \
                     {only:?}; use the checkpoint of those partitions",
                    other.join(", ")
                )));
            }
        }
        if self.opts.key_check.is_some() {
            self.partition_counts = self.partition_counts()?;
        }
        let live = self.partitions()?;
        // A partition the checkpoint read from is gone (its topic was deleted, perhaps
        // re-created with fewer partitions): its unread records are lost. Spark fails the
        // query then (failOnDataLoss); so does Statebox, naming them.
        let gone: Vec<String> = self
            .next
            .keys()
            .filter(|tp| !live.contains(tp))
            .map(describe)
            .collect();
        if !gone.is_empty() {
            return Err(EngineError::Config(format!(
                "the checkpoint has read from {}, which no longer exist on {}; their unread \
                 records may be lost (use a new --checkpoint to start over)",
                gone.join(", "),
                self.opts.url.brokers
            )));
        }
        for tp in &live {
            match self.next.get(tp) {
                None => {
                    let start = self.initial_offset(tp, new_query)?;
                    self.next.insert(tp.clone(), start);
                }
                // Records the checkpoint has not read are gone (retention), or the
                // partition's offsets went back (the topic was re-created): either way
                // input would be lost or read twice; fail as Spark does (failOnDataLoss).
                Some(&next) => {
                    let (low, high) = self.watermarks(tp)?;
                    if next < low || next > high {
                        return Err(EngineError::Config(format!(
                            "the checkpoint reads {} from offset {next}, but the partition now \
                             holds offsets {low}..{high}: {}; use a new --checkpoint (with \
                             --starting-offsets) to go on",
                            describe(tp),
                            if next < low {
                                "unread records were deleted"
                            } else {
                                "its offsets went back (was the topic re-created?)"
                            }
                        )));
                    }
                }
            }
        }
        if self.opts.bounded {
            let mut stop = BTreeMap::new();
            for tp in &live {
                stop.insert(tp.clone(), self.watermarks(tp)?.1);
            }
            self.stop_at = Some(stop);
        }
        Ok(())
    }

    fn plan(&mut self) -> Result<Option<serde_json::Value>, EngineError> {
        if !self.opts.bounded {
            for tp in self.partitions()? {
                if !self.next.contains_key(&tp) {
                    let start = self.initial_offset(&tp, false)?;
                    self.next.insert(tp, start);
                }
            }
        }
        let mut ranges = Vec::with_capacity(self.next.len());
        for (tp, &start) in &self.next {
            let end = match &self.stop_at {
                Some(stop) => stop.get(tp).copied().unwrap_or(start),
                None => self.watermarks(tp)?.1,
            };
            ranges.push(Range {
                topic: tp.0.clone(),
                partition: tp.1,
                start,
                end: end.max(start),
            });
        }
        let backlog: u64 = ranges.iter().map(|r| (r.end - r.start) as u64).sum();
        if backlog == 0 {
            return Ok(None);
        }
        if let Some(max) = self.opts.max_records_per_batch.filter(|m| backlog > *m) {
            // Each partition gets a share of the budget in proportion to its backlog (at
            // least one offset if it has any), so none is starved by a larger one.
            for r in &mut ranges {
                let avail = (r.end - r.start) as u64;
                if avail > 0 {
                    let share = ((avail as u128 * max as u128) / backlog as u128).max(1) as u64;
                    r.end = r.start + share.min(avail) as i64;
                }
            }
        }
        Ok(Some(
            serde_json::to_value(Plan { ranges }).expect("serialises"),
        ))
    }

    fn read(&mut self, plan: &serde_json::Value) -> Result<SourceBatch, EngineError> {
        let plan: Plan = serde_json::from_value(plan.clone())
            .map_err(|e| EngineError::corrupt_record("Kafka batch plan", e))?;
        let mut assignment = TopicPartitionList::new();
        let mut index = BTreeMap::new();
        let mut texts: Vec<SourceText> = Vec::with_capacity(plan.ranges.len());
        let mut done = Vec::with_capacity(plan.ranges.len());
        // The next offset expected per range: records fetched for an earlier assignment
        // may still arrive, and a record must never be taken twice.
        let mut expect: Vec<i64> = plan.ranges.iter().map(|r| r.start).collect();
        let mut progress = Vec::with_capacity(plan.ranges.len());
        for (i, r) in plan.ranges.iter().enumerate() {
            let tp = (r.topic.clone(), r.partition);
            texts.push(SourceText {
                name: describe(&tp),
                text: String::new(),
                positions: Vec::new(),
            });
            progress.push((
                format!("{OFFSET_PREFIX}{}", name(&tp)),
                serde_json::to_vec(&r.end).expect("serialises"),
            ));
            done.push(r.start >= r.end);
            if r.start < r.end {
                assignment
                    .add_partition_offset(&r.topic, r.partition, rdkafka::Offset::Offset(r.start))
                    .map_err(|e| io("cannot assign Kafka partitions", e))?;
                index.insert(tp, i);
            }
        }
        if assignment.count() > 0 {
            self.consumer
                .assign(&assignment)
                .map_err(|e| io("cannot assign Kafka partitions", e))?;
        }
        let mut last_progress = Instant::now();
        while done.iter().any(|d| !d) {
            let polled = self.consumer.poll(Duration::from_millis(100));
            let msg = match polled {
                Some(Ok(m)) => m,
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    // The consumer reached the end of partition `p` after delivering every
                    // record before it. A range may end with a transaction marker, which is
                    // never delivered, so the position (past the marker), not the last
                    // record, tells that the range has been read.
                    if let Ok(positions) = self.consumer.position() {
                        for (tp, &i) in &index {
                            let at = positions
                                .find_partition(&tp.0, tp.1)
                                .and_then(|e| e.offset().to_raw());
                            if tp.1 == p && at.is_some_and(|at| at >= plan.ranges[i].end) {
                                done[i] = true;
                            }
                        }
                    }
                    continue;
                }
                None => {
                    if done.iter().any(|d| !d) && last_progress.elapsed() > BROKER_TIMEOUT {
                        let waiting: Vec<String> = plan
                            .ranges
                            .iter()
                            .zip(&done)
                            .filter(|(_, d)| !**d)
                            .map(|(r, _)| {
                                format!(
                                    "{} partition {} offsets {}..{}",
                                    r.topic, r.partition, r.start, r.end
                                )
                            })
                            .collect();
                        return Err(EngineError::Io(format!(
                            "Kafka did not deliver the planned records of {} within {}s",
                            waiting.join(", "),
                            BROKER_TIMEOUT.as_secs()
                        )));
                    }
                    continue;
                }
                Some(Err(e)) => return Err(io("cannot read from Kafka", e)),
            };
            let tp = (msg.topic().to_owned(), msg.partition());
            let Some(&i) = index.get(&tp) else { continue };
            let r = &plan.ranges[i];
            let offset = msg.offset();
            if done[i] || offset < expect[i] || offset >= r.end {
                if offset >= r.end {
                    done[i] = true;
                }
                continue;
            }
            last_progress = Instant::now();
            expect[i] = offset + 1;
            self.append(&mut texts[i], &tp, &msg)?;
            if offset + 1 >= r.end {
                done[i] = true;
            }
        }
        if assignment.count() > 0 {
            // Stop fetching until the next batch's assignment.
            let _ = self.consumer.unassign();
        }
        Ok(SourceBatch { texts, progress })
    }

    fn committed(&mut self, plan: &serde_json::Value) {
        if let Ok(plan) = serde_json::from_value::<Plan>(plan.clone()) {
            for r in plan.ranges {
                self.next.insert((r.topic, r.partition), r.end);
            }
        }
        self.times.append(&mut self.pending_times);
    }

    fn event_time_seen(
        &mut self,
        plan: &serde_json::Value,
        per_text_max_ms: &[Option<i64>],
        batch_timestamp_ms: i64,
    ) -> (Option<i64>, Vec<(String, Vec<u8>)>) {
        let Ok(plan) = serde_json::from_value::<Plan>(plan.clone()) else {
            return (per_text_max_ms.iter().flatten().copied().max(), Vec::new());
        };
        let mut times = self.times.clone();
        let mut writes = Vec::new();
        self.pending_times.clear();
        for (r, max) in plan.ranges.iter().zip(per_text_max_ms) {
            let Some(max) = *max else { continue };
            let tp = (r.topic.clone(), r.partition);
            let t = times.entry(tp.clone()).or_insert(PartitionTime {
                max_ms: max,
                active_ms: batch_timestamp_ms,
            });
            t.max_ms = t.max_ms.max(max);
            t.active_ms = batch_timestamp_ms;
            let t = *t;
            self.pending_times.insert(tp.clone(), t);
            writes.push((
                format!("{TIME_PREFIX}{}", name(&tp)),
                serde_json::to_vec(&t).expect("serialises"),
            ));
        }
        (
            watermark_basis(&times, batch_timestamp_ms, self.opts.idle_timeout_ms),
            writes,
        )
    }
}

/// The event time the watermark follows: the minimum over partitions of each one's
/// largest event time, leaving out partitions idle for longer than `idle_timeout_ms`
/// (and those that never had a record). If every partition is idle, the maximum.
fn watermark_basis(
    times: &BTreeMap<Tp, PartitionTime>,
    now_ms: i64,
    idle_timeout_ms: i64,
) -> Option<i64> {
    let active = times
        .values()
        .filter(|t| now_ms.saturating_sub(t.active_ms) <= idle_timeout_ms)
        .map(|t| t.max_ms)
        .min();
    active.or_else(|| times.values().map(|t| t.max_ms).max())
}

impl KafkaSource {
    /// Appends one record's row to its partition's text.
    fn append(
        &self,
        text: &mut SourceText,
        tp: &Tp,
        msg: &rdkafka::message::BorrowedMessage<'_>,
    ) -> Result<(), EngineError> {
        let offset = msg.offset();
        let bad = |message: String| EngineError::Record {
            at: format!("{} offset {offset}", describe(tp)),
            message,
        };
        let value = match msg.payload() {
            Some(v) if !v.iter().all(u8::is_ascii_whitespace) => v,
            _ => return Err(bad("the record has no value (expected one JSON row)".into())),
        };
        let value = std::str::from_utf8(value)
            .map_err(|_| bad("the record's value is not UTF-8 JSON".into()))?;
        let mut row = std::borrow::Cow::Borrowed(value.trim());
        let appended_from = text.text.len() + usize::from(!text.positions.is_empty());
        if row.contains(['\n', '\r']) {
            // Line breaks can only be whitespace between JSON tokens (never inside a
            // string), so a valid row loses nothing when they become spaces; checked
            // first, so that an invalid one is not made valid by it.
            serde_json::from_str::<serde::de::IgnoredAny>(&row)
                .map_err(|e| bad(format!("the record's value is not JSON: {e}")))?;
            row = std::borrow::Cow::Owned(row.replace(['\n', '\r'], " "));
        }
        if !text.positions.is_empty() {
            text.text.push('\n');
        }
        if self.opts.columns.is_empty() {
            text.text.push_str(&row);
        } else {
            let body = row
                .strip_prefix('{')
                .ok_or_else(|| bad("the record's value is not a JSON object".into()))?;
            text.text.push('{');
            for c in &self.opts.columns {
                if body.contains(&format!("\"{}\"", c.name())) {
                    // A cheap test first; parse only when the name appears at all.
                    let fields: BTreeMap<String, serde::de::IgnoredAny> =
                        serde_json::from_str(&row)
                            .map_err(|e| bad(format!("the record's value is not JSON: {e}")))?;
                    if fields.contains_key(c.name()) {
                        return Err(bad(format!(
                            "the row already has a column `{}`, which the Kafka column of that \
                             name would replace",
                            c.name()
                        )));
                    }
                }
                text.text.push('"');
                text.text.push_str(c.name());
                text.text.push_str("\":");
                match c {
                    Column::Key => match msg.key() {
                        None => text.text.push_str("null"),
                        Some(k) => {
                            let k = std::str::from_utf8(k)
                                .map_err(|_| bad("the record's key is not UTF-8".into()))?;
                            text.text
                                .push_str(&serde_json::to_string(k).expect("serialises"));
                        }
                    },
                    Column::Topic => text
                        .text
                        .push_str(&serde_json::to_string(&tp.0).expect("serialises")),
                    Column::Partition => text.text.push_str(&tp.1.to_string()),
                    Column::Offset => text.text.push_str(&offset.to_string()),
                    Column::Timestamp => match msg.timestamp() {
                        Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) if t >= 0 => {
                            text.text.push_str(&t.to_string())
                        }
                        _ => text.text.push_str("null"),
                    },
                }
                text.text.push(',');
            }
            if body.trim_start().starts_with('}') {
                // `{}`: no fields after ours, so no comma.
                text.text.pop();
            }
            text.text.push_str(body);
        }
        if let Some(columns) = &self.opts.key_check {
            self.check_key(tp, offset, msg.key(), &text.text[appended_from..], columns)?;
        }
        text.positions.push(offset);
        Ok(())
    }

    /// Fails unless the row's grouping key belongs to the record's partition: it equals the
    /// record's key (then every row of the key has that record key, so whatever the
    /// producer's partitioner, they share one partition), or Kafka's default partitioner
    /// puts it in this partition. See [`SourceOptions::key_check`].
    fn check_key(
        &self,
        tp: &Tp,
        offset: i64,
        record_key: Option<&[u8]>,
        row: &str,
        columns: &[String],
    ) -> Result<(), EngineError> {
        let bad = |message: String| EngineError::Record {
            at: format!("{} offset {offset}", describe(tp)),
            message,
        };
        let key = crate::keys::grouping_key(row, columns).map_err(bad)?;
        if record_key == Some(key.as_slice()) {
            return Ok(());
        }
        let partitions = self.partition_counts.get(&tp.0).copied().unwrap_or(0);
        if partitions > 0 && crate::keys::java_partition(&key, partitions) == tp.1 {
            return Ok(());
        }
        let shown = |k: &[u8]| match std::str::from_utf8(k) {
            Ok(s) => format!("`{s}`"),
            Err(_) => format!("{} bytes that are not UTF-8", k.len()),
        };
        Err(bad(format!(
            "the row's grouping key {} ({}) belongs to partition {} of {partitions} by \
             Kafka's default partitioner, and the record's key is {}: rows of one key spread \
             over partitions would be counted apart by the group's tasks (one per partition); \
             produce records keyed by the grouping key columns (the key's text for one string \
             column, its JSON for another column, a JSON array for several), or partition the \
             topic by them",
            shown(&key),
            columns.join(", "),
            if partitions > 0 {
                crate::keys::java_partition(&key, partitions)
            } else {
                -1
            },
            record_key.map_or("missing".to_owned(), shown),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starting_offsets_parse_like_spark() {
        assert_eq!(
            "earliest".parse::<StartingOffsets>().unwrap(),
            StartingOffsets::Earliest
        );
        assert_eq!(
            "latest".parse::<StartingOffsets>().unwrap(),
            StartingOffsets::Latest
        );
        let StartingOffsets::Offsets(m) = r#"{"a":{"0":23,"1":-2}}"#.parse().unwrap() else {
            panic!("expected offsets")
        };
        assert_eq!(m["a"][&0], 23);
        assert_eq!(m["a"][&1], -2);
        assert!(r#"{"a":{"x":1}}"#.parse::<StartingOffsets>().is_err());
        assert!(r#"{"a":{"0":-3}}"#.parse::<StartingOffsets>().is_err());
        assert!("sometime".parse::<StartingOffsets>().is_err());
    }

    #[test]
    fn the_slowest_active_partition_holds_the_watermark() {
        let mut times = BTreeMap::new();
        times.insert(
            ("t".into(), 0),
            PartitionTime {
                max_ms: 100,
                active_ms: 1_000,
            },
        );
        times.insert(
            ("t".into(), 1),
            PartitionTime {
                max_ms: 50,
                active_ms: 1_000,
            },
        );
        assert_eq!(watermark_basis(&times, 1_000, 60_000), Some(50));
        // Partition 1 has been idle past the timeout: it no longer holds the watermark.
        assert_eq!(watermark_basis(&times, 1_000 + 60_001, 60_000), Some(100));
        times.get_mut(&("t".into(), 0)).unwrap().active_ms = 61_001;
        assert_eq!(watermark_basis(&times, 61_001, 60_000), Some(100));
        assert_eq!(watermark_basis(&BTreeMap::new(), 0, 1), None);
    }
}
