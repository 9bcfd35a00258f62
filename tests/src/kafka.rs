//! A real Kafka-protocol broker for the tests: tansu (installed by
//! `host/kafka/install-test-broker.sh`, which `.ci/setup` runs), started on a free loopback
//! port with in-memory storage and killed when dropped; and a producer and a verifier that
//! talk to it through librdkafka, the client Kafka users trust.
//!
//! Known gaps of tansu 0.6 that the tests work around openly, never by weakening Statebox:
//! - records of aborted (or fenced, abandoned) transactions stay visible to `read_committed`
//!   consumers, and abandoned transactions never time out (see `tests/all/kafka.rs`);
//! - ListOffsets (the "end offset" every client asks for, Statebox's source included)
//!   answers one past the *first* offset of the partition's last record batch, not one
//!   past its last record: after a producer sent five records in one batch, the end offset
//!   is short by four, and a reader that trusts it (as Spark's and Statebox's sources do)
//!   stops early. The test producers therefore send one record per batch
//!   (`batch.num.messages=1`), for which tansu's answer is right, and the verifier reads
//!   every partition up to the end the *fetch* reports (`PartitionEOF`), which tansu gets
//!   right, instead of asking ListOffsets. Statebox's transactional sink ends every batch
//!   with a one-record commit marker, so its topics' end offsets are right too;
//! - while a transaction is open, ListOffsets answers 0 as the last stable offset.
//!
//! Tansu applies transactional offset commits only when the transaction commits, which is
//! what Statebox's sink relies on.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Headers;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use statebox_engine::StateReader;

/// The tansu binary: `$STATEBOX_KAFKA_DIR/bin/tansu`, default `~/.cache/statebox/kafka`.
pub fn tansu_bin() -> PathBuf {
    let dir = std::env::var_os("STATEBOX_KAFKA_DIR").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/statebox/kafka")
        },
        PathBuf::from,
    );
    let bin = dir.join("bin/tansu");
    assert!(
        bin.is_file(),
        "the test broker is missing at {}: run host/kafka/install-test-broker.sh (.ci/setup does)",
        bin.display()
    );
    bin
}

/// A tansu broker on 127.0.0.1, killed on drop.
pub struct Broker {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Its log file.
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

/// One record read back.
#[derive(Clone, Debug)]
pub struct Record {
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
    /// The key as text.
    pub key: Option<String>,
    /// The value as JSON.
    pub value: serde_json::Value,
    /// The headers, as text.
    pub headers: BTreeMap<String, String>,
}

impl Broker {
    /// Starts a broker on a free port and waits until it answers metadata requests.
    pub fn start() -> Broker {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
            l.local_addr().expect("local address").port()
        };
        let addr = format!("127.0.0.1:{port}");
        let dir = tempfile::Builder::new()
            .prefix("statebox-tansu-")
            .tempdir()
            .expect("temporary directory");
        let log = dir.path().join("tansu.log");
        let child = Command::new(tansu_bin())
            .arg("broker")
            .args(["--listener-url", &format!("tcp://{addr}")])
            .args(["--advertised-listener-url", &format!("tcp://{addr}")])
            .args(["--storage-engine", "memory://tansu/"])
            // Errors, and the group coordinator's decisions (missed heartbeats, leaders):
            // what a failing group test needs to be understood. `STATEBOX_TANSU_LOG`
            // (a tracing filter, e.g. `tansu_broker::coordinator=debug`) shows more.
            .env(
                "RUST_LOG",
                std::env::var("STATEBOX_TANSU_LOG")
                    .unwrap_or_else(|_| "error,tansu_broker::coordinator=info".into()),
            )
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("broker log"))
            .stderr(Stdio::from(
                std::fs::File::options()
                    .append(true)
                    .open(&log)
                    .expect("broker log"),
            ))
            .spawn()
            .expect("start tansu");
        let broker = Broker {
            child,
            addr,
            log,
            _dir: dir,
        };
        let sock: SocketAddr = broker.addr.parse().expect("an address");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&sock, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {} within 20 s; its log:\n{}",
                broker.addr,
                std::fs::read_to_string(&broker.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        broker
    }

    /// `kafka://127.0.0.1:PORT/<topics>`.
    pub fn url(&self, topics: &str) -> String {
        format!("kafka://{}/{topics}", self.addr)
    }

    fn tansu(&self, args: &[&str]) {
        let out = Command::new(tansu_bin())
            .args(["topic"])
            .args(args)
            .args(["--broker", &format!("tcp://{}", self.addr)])
            .output()
            .expect("run tansu topic");
        assert!(
            out.status.success(),
            "tansu topic {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Creates a topic and waits until its metadata shows every partition.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        self.tansu(&["create", name, "--partitions", &partitions.to_string()]);
        let consumer = self.consumer("read_committed");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let md = consumer.fetch_metadata(Some(name), Duration::from_secs(5));
            let n = md.ok().and_then(|m| {
                m.topics()
                    .iter()
                    .find(|t| t.name() == name && t.error().is_none())
                    .map(|t| t.partitions().len())
            });
            if n == Some(partitions as usize) {
                return;
            }
            assert!(Instant::now() < deadline, "topic {name} did not appear");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Deletes a topic.
    pub fn delete_topic(&self, name: &str) {
        self.tansu(&["delete", name]);
    }

    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.addr).set("log_level", "3");
        c
    }

    /// A producer with Java's key partitioning (as Statebox's sink uses), one record per
    /// batch (tansu's end offsets are wrong after a batch of several; see the module docs).
    pub fn producer(&self) -> ThreadedProducer<DefaultProducerContext> {
        self.config()
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .set("batch.num.messages", "1")
            .create()
            .expect("create a producer")
    }

    /// Produces keyed JSON rows and waits until all are acknowledged. The wait is long: a
    /// test's 120,000 one-record requests outlasted 30 s once on a machine busy with other
    /// work, and the flush returns as soon as the last is acknowledged.
    pub fn produce(&self, topic: &str, rows: &[(String, serde_json::Value)]) {
        let producer = self.producer();
        produce_with(&producer, topic, rows);
        producer
            .flush(Duration::from_secs(120))
            .expect("the broker acknowledges the records within 120 s");
    }

    fn consumer(&self, isolation: &str) -> BaseConsumer {
        self.config()
            .set("group.id", "statebox-test-verifier")
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            .create()
            .expect("create a consumer")
    }

    /// Every record of a topic, read with `isolation` (`read_committed` or
    /// `read_uncommitted`) from the start of every partition up to the end the fetch
    /// reports (not ListOffsets, which tansu gets wrong), in offset order per partition.
    pub fn read_all(&self, topic: &str, isolation: &str) -> Vec<Record> {
        let consumer: BaseConsumer = self
            .config()
            .set("group.id", "statebox-test-verifier")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", isolation)
            .create()
            .expect("create a consumer");
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("topic metadata");
        let mut tpl = TopicPartitionList::new();
        let mut open: Vec<i32> = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
        for &p in &open {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&tpl).expect("assign");
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !open.is_empty() {
            assert!(
                Instant::now() < deadline,
                "reading {topic} stalled; partitions {open:?} never reached their end"
            );
            let m = match consumer.poll(Duration::from_millis(100)) {
                None => continue,
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    open.retain(|&o| o != p);
                    continue;
                }
                Some(Err(e)) => panic!("reading {topic}: {e}"),
                Some(Ok(m)) => m,
            };
            let mut headers = BTreeMap::new();
            if let Some(h) = m.headers() {
                for h in h.iter() {
                    headers.insert(
                        h.key.to_owned(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    );
                }
            }
            let value =
                serde_json::from_slice(m.payload().unwrap_or_default()).unwrap_or_else(|e| {
                    panic!(
                        "record {topic}/{}@{} is not JSON: {e}",
                        m.partition(),
                        m.offset()
                    )
                });
            out.push(Record {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                value,
                headers,
            });
        }
        out.sort_by_key(|r| (r.partition, r.offset));
        out
    }
}

impl Broker {
    /// Produces one JSON row with `key` to an explicit `partition` (not where the key's
    /// hash would put it) and waits until it is acknowledged.
    pub fn produce_to(&self, topic: &str, partition: i32, key: &str, value: &serde_json::Value) {
        let producer = self.producer();
        let payload = value.to_string();
        producer
            .send(
                BaseRecord::to(topic)
                    .partition(partition)
                    .key(key)
                    .payload(payload.as_str()),
            )
            .map_err(|(e, _)| e)
            .expect("queue a record");
        producer
            .flush(Duration::from_secs(30))
            .expect("flush the producer");
    }
}

/// Sends keyed JSON rows and waits until the broker acknowledged every one. A producer that
/// loops on it holds at most one call's rows unacknowledged: on a loaded machine tansu takes
/// one-record requests slower than a loop sends them, and the backlog of a loop that never
/// waited once outlasted its final flush.
pub fn produce_acked(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    rows: &[(String, serde_json::Value)],
) {
    produce_with(producer, topic, rows);
    producer
        .flush(Duration::from_secs(60))
        .expect("the broker acknowledges the records within 60 s");
}

/// Sends keyed JSON rows without waiting for acknowledgements (retries a full queue).
pub fn produce_with(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    rows: &[(String, serde_json::Value)],
) {
    for (key, value) in rows {
        let payload = value.to_string();
        let mut record = BaseRecord::to(topic)
            .key(key.as_str())
            .payload(payload.as_str());
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test shows what the broker did.
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            // Only the tail: the log's folder is deleted with the broker.
            eprintln!(
                "--- the last {} lines of the broker's log ---\n{}",
                tail.len(),
                tail.join("\n")
            );
        }
    }
}

/// How much of the broker's log a failing test prints.
const LOG_TAIL_LINES: usize = 200;

/// One record batch of a partition's log as the broker stores it.
#[derive(Clone, Debug)]
pub struct RawBatch {
    /// The first and the last offset of the batch.
    pub offsets: std::ops::RangeInclusive<i64>,
    /// The producer id (-1 for an idempotence-free producer).
    pub producer_id: i64,
    /// Whether the batch belongs to a transaction.
    pub transactional: bool,
    /// For a control batch (a transaction marker): whether it commits (or aborts).
    pub marker: Option<bool>,
}

impl Broker {
    /// The record batches of one partition, read with a plain Fetch request (version 4,
    /// `read_uncommitted`) and decoded here: unlike a client library, this shows the
    /// transaction markers, so a test can tell which transactions committed even on a broker
    /// that shows aborted records to `read_committed` consumers (tansu; see the module docs).
    pub fn raw_log(&self, topic: &str, partition: i32) -> Vec<RawBatch> {
        use std::io::{Read, Write};
        let mut conn = TcpStream::connect(&self.addr).expect("connect to the broker");
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("a read timeout");
        let mut out: Vec<RawBatch> = Vec::new();
        let mut next = 0i64;
        for correlation in 1i32.. {
            let mut req = Vec::new();
            req.extend(1i16.to_be_bytes()); // api key: Fetch
            req.extend(4i16.to_be_bytes()); // api version
            req.extend(correlation.to_be_bytes());
            put_str(&mut req, "statebox-test-raw");
            req.extend((-1i32).to_be_bytes()); // replica id
            req.extend(100i32.to_be_bytes()); // max wait ms
            req.extend(0i32.to_be_bytes()); // min bytes
            req.extend((8i32 << 20).to_be_bytes()); // max bytes
            req.push(0); // isolation: read_uncommitted
            req.extend(1i32.to_be_bytes()); // one topic
            put_str(&mut req, topic);
            req.extend(1i32.to_be_bytes()); // one partition
            req.extend(partition.to_be_bytes());
            req.extend(next.to_be_bytes());
            req.extend((8i32 << 20).to_be_bytes());
            conn.write_all(&(req.len() as i32).to_be_bytes())
                .and_then(|()| conn.write_all(&req))
                .expect("send a Fetch request");
            let mut len = [0u8; 4];
            conn.read_exact(&mut len).expect("a Fetch response");
            let mut resp = vec![0u8; i32::from_be_bytes(len) as usize];
            conn.read_exact(&mut resp).expect("a Fetch response");
            let mut r = Cursor(&resp);
            assert_eq!(r.i32(), correlation, "response to another request");
            r.i32(); // throttle
            assert_eq!(r.i32(), 1, "one topic in the Fetch response");
            r.str();
            assert_eq!(r.i32(), 1, "one partition in the Fetch response");
            r.i32();
            let error = r.i16();
            assert_eq!(
                error, 0,
                "Fetch of {topic}/{partition} failed with error {error}"
            );
            let high = r.i64();
            r.i64(); // last stable offset
            let aborted = r.i32();
            for _ in 0..aborted.max(0) {
                r.i64();
                r.i64();
            }
            let size = r.i32();
            let mut records = Cursor(r.take(size.max(0) as usize));
            let before = out.len();
            // A response may end with a partial batch; it is fetched again next time.
            while records.0.len() >= 12 {
                let base = records.i64();
                let len = records.i32() as usize;
                if records.0.len() < len {
                    break;
                }
                let mut b = Cursor(records.take(len));
                b.i32(); // partition leader epoch
                assert_eq!(b.take(1)[0], 2, "record batch magic");
                b.i32(); // crc
                let attributes = b.i16();
                let last_delta = b.i32();
                b.i64(); // base timestamp
                b.i64(); // max timestamp
                let producer_id = b.i64();
                b.i16(); // producer epoch
                b.i32(); // base sequence
                b.i32(); // record count
                let control = attributes & 0x20 != 0;
                let marker = control.then(|| {
                    // The control record's key: version (i16), type (i16; 0 abort, 1 commit).
                    b.varint(); // record length
                    b.take(1); // attributes
                    b.varint(); // timestamp delta
                    b.varint(); // offset delta
                    let key_len = b.varint();
                    let mut key = Cursor(b.take(key_len as usize));
                    key.i16();
                    key.i16() == 1
                });
                out.push(RawBatch {
                    offsets: base..=base + i64::from(last_delta),
                    producer_id,
                    transactional: attributes & 0x10 != 0,
                    marker,
                });
                next = base + i64::from(last_delta) + 1;
            }
            if next >= high || out.len() == before {
                assert!(
                    next >= high,
                    "raw Fetch of {topic}/{partition} made no progress at offset {next} of {high}"
                );
                break;
            }
        }
        out
    }

    /// The offsets of `topic`'s data records that a correct `read_committed` consumer sees:
    /// those outside transactions and those of committed transactions, decided from the
    /// transaction markers in the raw log. Also returns how many records belong to aborted
    /// transactions, or to transactions still open (no marker yet).
    pub fn committed_offsets(&self, topic: &str, partitions: i32) -> (Vec<(i32, i64)>, usize) {
        let mut committed = Vec::new();
        let mut not_committed = 0;
        for p in 0..partitions {
            let log = self.raw_log(topic, p);
            for (i, batch) in log.iter().enumerate() {
                if batch.marker.is_some() {
                    continue;
                }
                let ok = !batch.transactional
                    || log[i + 1..]
                        .iter()
                        .find(|m| m.marker.is_some() && m.producer_id == batch.producer_id)
                        .and_then(|m| m.marker)
                        .unwrap_or(false);
                if ok {
                    committed.extend(batch.offsets.clone().map(|o| (p, o)));
                } else {
                    not_committed += batch.offsets.clone().count();
                }
            }
        }
        (committed, not_committed)
    }
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend((s.len() as i16).to_be_bytes());
    buf.extend(s.as_bytes());
}

/// Big-endian reads over a Kafka protocol message.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        assert!(self.0.len() >= n, "a Kafka message ended early");
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn i16(&mut self) -> i16 {
        i16::from_be_bytes(self.take(2).try_into().expect("2 bytes"))
    }
    fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    fn i64(&mut self) -> i64 {
        i64::from_be_bytes(self.take(8).try_into().expect("8 bytes"))
    }
    fn str(&mut self) -> String {
        let n = self.i16();
        String::from_utf8_lossy(self.take(n.max(0) as usize)).into_owned()
    }
    /// A zig-zag varint (record fields).
    fn varint(&mut self) -> i64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let b = self.take(1)[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        ((v >> 1) as i64) ^ -((v & 1) as i64)
    }
}

/// `count` of `plugins/counter` per key, from a checkpoint.
pub fn counts_in_state(checkpoint: &std::path::Path) -> BTreeMap<String, i64> {
    let reader = StateReader::open(checkpoint).expect("open the checkpoint");
    let mut out = BTreeMap::new();
    reader
        .read_state("count", true, None, |row| {
            let key = row["key"]["user"]
                .as_str()
                .unwrap_or_else(|| panic!("a state row keyed by user: {row}"))
                .to_owned();
            out.insert(key, row["value"].as_i64().expect("a count"));
            Ok(())
        })
        .expect("read count");
    out
}

/// Checks a counter query's Kafka output and state after crashes (`statebox run` or a
/// `statebox serve` pipeline): on the records a correct
/// `read_committed` consumer sees, each key's counts add up to the records produced for it,
/// each batch the checkpoint committed is in Kafka in exactly one committed transaction (the
/// one the checkpoint names) with exactly the batch's rows, and state holds the same counts.
/// Returns the batches, the committed output records and the records of transactions that
/// did not commit.
pub fn assert_counted_exactly_once(
    broker: &Broker,
    topic: &str,
    partitions: i32,
    checkpoint: &std::path::Path,
    produced: &BTreeMap<String, i64>,
) -> (usize, usize, usize) {
    let reader = StateReader::open(checkpoint).expect("open the checkpoint");
    let commits = reader.progress(usize::MAX).expect("commit records");
    drop(reader);
    let delivery: BTreeMap<u64, (String, u64)> = commits
        .iter()
        .map(|c| {
            let id = c
                .sink_delivery
                .clone()
                .unwrap_or_else(|| panic!("batch {} names no delivery", c.batch_id));
            (c.batch_id, (id, c.output_rows))
        })
        .collect();
    // What a correct broker shows a `read_committed` consumer: the records of committed
    // transactions, decided from the transaction markers in the raw log (tansu would also
    // show the aborted ones; see the module docs).
    let (committed, aborted) = broker.committed_offsets(topic, partitions);
    let committed: std::collections::BTreeSet<(i32, i64)> = committed.into_iter().collect();
    let records = broker.read_all(topic, "read_committed");
    let kept: Vec<&Record> = records
        .iter()
        .filter(|r| committed.contains(&(r.partition, r.offset)))
        .collect();
    assert_eq!(
        kept.len(),
        committed.len(),
        "the consumer did not see every committed record"
    );
    // Each batch the checkpoint committed is in Kafka exactly once: in one committed
    // transaction (the delivery the checkpoint names), with exactly the batch's rows.
    let mut per_batch: BTreeMap<u64, (std::collections::BTreeSet<String>, u64)> = BTreeMap::new();
    for r in &kept {
        let batch: u64 = r.headers["statebox.batch"].parse().expect("a batch id");
        let e = per_batch.entry(batch).or_default();
        e.0.insert(r.headers["statebox.delivery"].clone());
        e.1 += 1;
    }
    for (batch, (ids, n)) in &per_batch {
        let (id, rows) = delivery.get(batch).unwrap_or_else(|| {
            panic!("Kafka committed rows of batch {batch}, which the checkpoint never committed")
        });
        assert_eq!(
            ids.iter().collect::<Vec<_>>(),
            vec![id],
            "batch {batch}: committed in Kafka by other transactions than the checkpoint's"
        );
        assert_eq!(
            n, rows,
            "batch {batch}: the committed delivery holds other rows"
        );
    }
    for (batch, (_, rows)) in &delivery {
        assert!(
            *rows == 0 || per_batch.contains_key(batch),
            "batch {batch}: {rows} rows committed in the checkpoint, none in Kafka"
        );
    }
    let totals = counted_per_key(kept.iter().copied());
    assert_eq!(&totals, produced, "output totals differ from the input");
    assert_eq!(
        &counts_in_state(checkpoint),
        produced,
        "state differs from the input"
    );
    (commits.len(), kept.len(), aborted)
}

/// Per key, the sum of the `count`s of a counter's output records (`{"key", "count"}`).
pub fn counted_per_key<'a>(records: impl IntoIterator<Item = &'a Record>) -> BTreeMap<String, i64> {
    let mut totals: BTreeMap<String, i64> = BTreeMap::new();
    for r in records {
        let key = r.value["key"].as_str();
        let count = r.value["count"].as_i64();
        let (Some(key), Some(count)) = (key, count) else {
            panic!("not a counter row: {}", r.value);
        };
        *totals.entry(key.to_owned()).or_default() += count;
    }
    totals
}

/// Per key, how many keyed rows there are (what a counter should count).
pub fn rows_per_key(rows: &[(String, serde_json::Value)]) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for (key, _) in rows {
        *out.entry(key.clone()).or_default() += 1;
    }
    out
}
