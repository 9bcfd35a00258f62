//! Membership of a Kafka consumer group, and what a group looks like from outside.
//!
//! Workers of one query (`statebox run --group NAME` on several machines) share a topic's
//! partitions through the consumer-group protocol: each is a [`GroupMember`], and the
//! partitions assigned to it are the tasks it runs. The member is only a membership: its
//! consumer subscribes to the topics and joins the group, but every partition it is
//! assigned is paused at once, so it never fetches records (the tasks read their partitions
//! through [`KafkaSource`](crate::KafkaSource), by offsets their checkpoints hold, and this
//! group commits no offsets).
//!
//! Assignment is `cooperative-sticky` (a rebalance moves only the partitions that change
//! owner; the others keep running) with static membership (`group.instance.id`: a worker
//! that restarts within the session timeout gets its partitions back without a rebalance
//! of the others). librdkafka needs its consumer polled to heartbeat and to run rebalances,
//! so a thread of the member polls it; the rebalance callback only records the new
//! assignment. Whoever owns a task does the restore work outside it, after
//! [`GroupMember::wait_change`] or [`GroupMember::changes`] tell it to.
//!
//! Architecture Invariant: the group decides who *should* run a task, not who may write
//! for it. Two workers can briefly both believe they own a partition (a member that missed
//! its session is removed before it notices); the task's own fencing (owner generations
//! in the state store, one transactional id per task) keeps only the newest writing.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, TopicPartitionList};

use crate::{BROKER_TIMEOUT, client_config};

/// A set of `(topic, partition)`.
pub type Assignment = BTreeSet<(String, i32)>;

/// Why the group could not be joined, described or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// A setting is unusable (the user's).
    #[error("{0}")]
    Setting(String),
    /// The client could not be created or could not talk to the brokers.
    #[error("{what}: {error}")]
    Kafka {
        /// What was being done.
        what: String,
        /// librdkafka's error.
        error: KafkaError,
    },
    /// The membership ended for good: librdkafka raised a fatal error (for instance
    /// another member joined with the same `group.instance.id` and fenced this one). The
    /// member owns nothing any more.
    #[error("the group membership failed for good: {0}")]
    Fatal(String),
}

fn kafka(what: impl Into<String>) -> impl FnOnce(KafkaError) -> GroupError {
    let what = what.into();
    move |error| GroupError::Kafka { what, error }
}

/// How to join.
#[derive(Clone, Debug)]
pub struct GroupSettings {
    /// Bootstrap servers (`HOST:PORT[,HOST:PORT]`).
    pub brokers: String,
    /// The consumer group.
    pub group: String,
    /// The topics whose partitions are shared.
    pub topics: Vec<String>,
    /// The static member id (`group.instance.id`): stable across restarts of one worker
    /// and unique in the group. A worker restarting within the session timeout keeps its
    /// partitions; a second live member with the same id fences the first
    /// ([`GroupError::Fatal`]). Empty for a dynamic member (a restart is a leave and a
    /// join: its partitions move away and back).
    pub instance_id: String,
    /// How long the group waits for a silent member (a killed one) before giving its
    /// partitions to others (`session.timeout.ms`; heartbeats go every tenth of it).
    pub session_timeout_ms: u64,
    /// librdkafka settings, after Statebox's own (so security settings reach the client).
    pub client_options: Vec<(String, String)>,
}

/// What the polling thread and the rebalance callback share with the member.
#[derive(Default)]
struct State {
    assignment: Assignment,
    /// Bumped at every change of `assignment`.
    version: u64,
    member_id: Option<String>,
    fatal: Option<String>,
    subscribers: Vec<Sender<Assignment>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; use it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the assignment and tells whoever waits, if it changed.
    fn set(&self, assignment: Assignment, member_id: Option<String>) {
        let mut s = self.lock();
        if member_id.is_some() {
            s.member_id = member_id;
        }
        if s.assignment != assignment {
            tracing::info!(partitions = ?assignment, "consumer group assignment changed");
            s.assignment = assignment.clone();
            s.version += 1;
            s.subscribers
                .retain(|tx| tx.send(assignment.clone()).is_ok());
            self.changed.notify_all();
        }
    }

    fn fail(&self, why: String) {
        let mut s = self.lock();
        if s.fatal.is_none() {
            tracing::error!(error = %why, "consumer group membership failed");
            s.fatal = Some(why);
            s.assignment.clear();
            s.version += 1;
            // Dropping the senders ends the subscribers' receivers: nothing more comes.
            s.subscribers.clear();
            self.changed.notify_all();
        }
    }
}

/// The membership consumer's context: records rebalances, pauses what it is assigned.
struct MemberContext {
    shared: Arc<Shared>,
}

impl ClientContext for MemberContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            self.shared.fail(reason.to_owned());
        } else {
            tracing::warn!(%error, %reason, "librdkafka (consumer group member)");
        }
    }
}

impl ConsumerContext for MemberContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                // Never fetch: the tasks read their partitions themselves.
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!(error = %e, "cannot pause assigned partitions");
                }
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "consumer group rebalance failed");
            }
        }
        let assignment = match consumer.assignment() {
            Ok(tpl) => to_set(&tpl),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the consumer group assignment");
                return;
            }
        };
        self.shared.set(assignment, member_id(consumer));
    }
}

fn to_set(tpl: &TopicPartitionList) -> Assignment {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

/// The member id the coordinator gave this consumer (empty before the first join).
fn member_id(consumer: &BaseConsumer<MemberContext>) -> Option<String> {
    let ptr = consumer.client().native_ptr();
    // SAFETY: `ptr` is the live consumer's handle; `rd_kafka_memberid` returns a string
    // librdkafka allocated for the caller (or null), which is copied and then released with
    // `rd_kafka_mem_free`, as librdkafka's documentation asks.
    unsafe {
        let raw = rdkafka::bindings::rd_kafka_memberid(ptr);
        if raw.is_null() {
            return None;
        }
        let id = std::ffi::CStr::from_ptr(raw).to_string_lossy().into_owned();
        rdkafka::bindings::rd_kafka_mem_free(ptr, raw.cast());
        (!id.is_empty()).then_some(id)
    }
}

/// A member of a consumer group. See the module docs. Dropping it leaves the group.
pub struct GroupMember {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Says when the polling thread has closed the consumer.
    closed: Receiver<()>,
    /// How long leaving may take before the member gives up waiting.
    close_timeout: Duration,
    /// The assignment version the owner last saw (through [`GroupMember::assignment`] or
    /// [`GroupMember::wait_change`]).
    seen: AtomicU64,
    group: String,
}

impl GroupMember {
    /// Joins `settings.group`, subscribed to its topics. Returns once the consumer is
    /// subscribed; the first assignment arrives later (see [`GroupMember::wait_change`]).
    pub fn join(settings: GroupSettings) -> Result<GroupMember, GroupError> {
        if settings.group.trim().is_empty() {
            return Err(GroupError::Setting(
                "the consumer group name is empty".into(),
            ));
        }
        if settings.topics.is_empty() {
            return Err(GroupError::Setting(format!(
                "consumer group `{}`: no topics to share",
                settings.group
            )));
        }
        if settings.session_timeout_ms < 1_000 {
            return Err(GroupError::Setting(format!(
                "consumer group session timeout {} ms is too short (at least 1000 ms)",
                settings.session_timeout_ms
            )));
        }
        let session = settings.session_timeout_ms.to_string();
        // Heartbeats a tenth of the session apart: a member survives a few lost ones.
        let heartbeat = (settings.session_timeout_ms / 10).max(100).to_string();
        let client_id = if settings.instance_id.is_empty() {
            format!("statebox-{}", settings.group)
        } else {
            format!("statebox-{}", settings.instance_id)
        };
        let mut ours: Vec<(&str, &str)> = vec![
            ("group.id", &settings.group),
            ("client.id", &client_id),
            ("partition.assignment.strategy", "cooperative-sticky"),
            ("session.timeout.ms", &session),
            ("heartbeat.interval.ms", &heartbeat),
            // A membership, not a reader: no offsets committed or stored, and nothing to
            // fetch (assigned partitions are paused at once; should a fetch slip in before
            // the pause, from the end of the partition, its records are dropped).
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "latest"),
        ];
        if !settings.instance_id.is_empty() {
            ours.push(("group.instance.id", &settings.instance_id));
        }
        let shared = Arc::new(Shared::default());
        let consumer: BaseConsumer<MemberContext> =
            client_config(&settings.brokers, &ours, &settings.client_options)
                .create_with_context(MemberContext {
                    shared: shared.clone(),
                })
                .map_err(kafka("cannot create the consumer group client"))?;
        let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).map_err(kafka(format!(
            "cannot subscribe to {}",
            settings.topics.join(", ")
        )))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (closed_tx, closed) = std::sync::mpsc::channel();
        let thread = {
            let (stop, shared) = (stop.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("group-{}", settings.group))
                .spawn(move || {
                    poll(consumer, &stop, &shared);
                    let _ = closed_tx.send(());
                })
                .map_err(|e| GroupError::Setting(format!("cannot start a thread: {e}")))?
        };
        Ok(GroupMember {
            shared,
            stop,
            thread: Some(thread),
            closed,
            close_timeout: Duration::from_millis(settings.session_timeout_ms) + BROKER_TIMEOUT,
            seen: AtomicU64::new(0),
            group: settings.group,
        })
    }

    /// The partitions assigned to this member now.
    pub fn assignment(&self) -> Assignment {
        let s = self.shared.lock();
        self.seen.store(s.version, Ordering::SeqCst);
        s.assignment.clone()
    }

    /// Waits up to `timeout` for the assignment to change since this member's last
    /// [`assignment`](Self::assignment) or `wait_change` (returns at once if it already
    /// has). `Some(new assignment)` if it changed, `None` on timeout. After a fatal error
    /// (see [`GroupMember::failure`]) it returns the empty assignment at once.
    pub fn wait_change(&self, timeout: Duration) -> Option<Assignment> {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.lock();
        loop {
            if s.version != self.seen.load(Ordering::SeqCst) {
                self.seen.store(s.version, Ordering::SeqCst);
                return Some(s.assignment.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            s = self
                .shared
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Every later assignment, as it happens (the channel ends if the membership fails
    /// for good). Each call makes a new receiver.
    pub fn changes(&self) -> Receiver<Assignment> {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut s = self.shared.lock();
        if s.fatal.is_none() {
            s.subscribers.push(tx);
        }
        rx
    }

    /// The member id the group coordinator gave this member, once it joined.
    pub fn member_id(&self) -> Option<String> {
        self.shared.lock().member_id.clone()
    }

    /// Why the membership ended for good, if it did: it then owns nothing and must be
    /// joined again.
    pub fn failure(&self) -> Result<(), GroupError> {
        match &self.shared.lock().fatal {
            Some(why) => Err(GroupError::Fatal(why.clone())),
            None => Ok(()),
        }
    }

    /// Leaves the group: the consumer is closed, which gives up its partitions (the rest
    /// of the group rebalances at once for a dynamic member; a static member's partitions
    /// wait for it for the session timeout, as Kafka's static membership intends).
    pub fn close(mut self) {
        self.leave();
    }

    fn leave(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            // librdkafka's close waits for the group's answer, without a limit; a broker
            // that never gives one (tansu, in a rebalance that does not complete) must not
            // hang the worker. Past the limit the closing thread is left to finish alone.
            match self.closed.recv_timeout(self.close_timeout) {
                Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    if thread.join().is_err() {
                        tracing::error!(group = %self.group, "the consumer group thread panicked");
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    tracing::warn!(
                        group = %self.group,
                        "leaving the consumer group did not finish within {:?}; going on",
                        self.close_timeout
                    );
                }
            }
        }
        self.shared.set(Assignment::new(), None);
    }
}

impl Drop for GroupMember {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Polls the consumer (heartbeats, rebalances) until asked to stop, then closes it.
fn poll(consumer: BaseConsumer<MemberContext>, stop: &AtomicBool, shared: &Shared) {
    let mut dropped = 0u64;
    while !stop.load(Ordering::SeqCst) {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(_)) => {
                // A fetch that slipped in before its partition was paused: not ours to
                // read (the tasks read by their own offsets).
                dropped += 1;
                if dropped == 1 {
                    tracing::debug!("consumer group member dropped a fetched record");
                }
            }
            Some(Err(e)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) => {
                let why = consumer
                    .client()
                    .fatal_error()
                    .map_or_else(|| e.to_string(), |(code, m)| format!("{m} ({code})"));
                shared.fail(why);
                break;
            }
            Some(Err(e)) => tracing::warn!(error = %e, "consumer group member"),
        }
        if let Some((code, m)) = consumer.client().fatal_error() {
            shared.fail(format!("{m} ({code})"));
            break;
        }
    }
    // Dropping the consumer closes it: it leaves the group (a static member does not send
    // a LeaveGroup; its partitions wait out the session timeout) after the final
    // revocation ran through the context.
    drop(consumer);
}

/// A consumer group as its coordinator describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDescription {
    /// The group.
    pub group: String,
    /// `Stable`, `PreparingRebalance`, `CompletingRebalance`, `Empty`, `Dead`, ...
    pub state: String,
    /// The assignor chosen (`cooperative-sticky`, `range`, ...).
    pub protocol: String,
    /// The members with their assignments.
    pub members: Vec<MemberDescription>,
}

/// A member of a described group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberDescription {
    /// The id the coordinator gave it.
    pub member_id: String,
    /// Its `group.instance.id`: not in librdkafka's group listing (DescribeGroups v0), so
    /// taken from the client id [`GroupMember`] sets (`statebox-<instance id>`) when the
    /// member id is that instance id's (`<instance id>-<uuid>`, as Kafka names static
    /// members); `None` otherwise.
    pub instance_id: Option<String>,
    /// Its `client.id`.
    pub client_id: String,
    /// The host it connects from.
    pub host: String,
    /// The partitions assigned to it.
    pub assignment: Assignment,
}

/// Describes consumer group `group` (its coordinator's view: state, members and their
/// assignments).
pub fn describe(
    brokers: &str,
    group: &str,
    client_options: &[(String, String)],
) -> Result<GroupDescription, GroupError> {
    let consumer: BaseConsumer = client_config(brokers, &[], client_options)
        .create()
        .map_err(kafka("cannot create a Kafka client"))?;
    let list = consumer
        .fetch_group_list(Some(group), BROKER_TIMEOUT)
        .map_err(kafka(format!("cannot describe consumer group `{group}`")))?;
    let Some(info) = list.groups().iter().find(|g| g.name() == group) else {
        return Ok(GroupDescription {
            group: group.to_owned(),
            state: "Dead".into(),
            protocol: String::new(),
            members: Vec::new(),
        });
    };
    let mut members = Vec::with_capacity(info.members().len());
    for m in info.members() {
        let assignment = match m.assignment() {
            Some(bytes) if !bytes.is_empty() => decode_assignment(bytes).map_err(|e| {
                GroupError::Setting(format!(
                    "member `{}` of group `{group}` has an assignment that does not decode \
                     (not a consumer group?): {e}",
                    m.id()
                ))
            })?,
            _ => Assignment::new(),
        };
        let instance_id = m
            .client_id()
            .strip_prefix("statebox-")
            .filter(|i| {
                m.id()
                    .strip_prefix(i)
                    .is_some_and(|rest| rest.starts_with('-'))
            })
            .map(str::to_owned);
        members.push(MemberDescription {
            member_id: m.id().to_owned(),
            instance_id,
            client_id: m.client_id().to_owned(),
            host: m.client_host().to_owned(),
            assignment,
        });
    }
    members.sort_by(|a, b| a.member_id.cmp(&b.member_id));
    Ok(GroupDescription {
        group: group.to_owned(),
        state: info.state().to_owned(),
        protocol: info.protocol().to_owned(),
        members,
    })
}

/// Decodes a consumer protocol `MemberAssignment`: version (i16), then topics (i32 count;
/// each a string: i16 length and bytes, and partitions: i32 count and i32 each), then
/// user data (which is skipped).
pub fn decode_assignment(bytes: &[u8]) -> Result<Assignment, String> {
    let mut r = Reader(bytes);
    let version = r.i16()?;
    if version < 0 {
        return Err(format!("version {version}"));
    }
    let mut out = Assignment::new();
    let topics = r.i32()?;
    for _ in 0..topics.max(0) {
        let len = r.i16()?;
        let name = r.take(len.max(0) as usize)?;
        let topic = std::str::from_utf8(name)
            .map_err(|_| "a topic name is not UTF-8".to_owned())?
            .to_owned();
        let partitions = r.i32()?;
        for _ in 0..partitions.max(0) {
            out.insert((topic.clone(), r.i32()?));
        }
    }
    Ok(out)
}

/// Big-endian reads that say where a message ended early.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "it ends early ({} bytes left, {n} needed)",
                self.0.len()
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
}

/// The end offset of every partition of `topic` as a `read_committed` consumer sees it
/// (the last stable offset), for lag.
pub fn end_offsets(
    brokers: &str,
    topic: &str,
    client_options: &[(String, String)],
) -> Result<std::collections::BTreeMap<i32, i64>, GroupError> {
    let consumer: BaseConsumer = client_config(
        brokers,
        &[("isolation.level", "read_committed")],
        client_options,
    )
    .create()
    .map_err(kafka("cannot create a Kafka client"))?;
    let md = consumer
        .fetch_metadata(Some(topic), BROKER_TIMEOUT)
        .map_err(kafka(format!(
            "cannot read the metadata of topic `{topic}`"
        )))?;
    let Some(t) = md
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
    else {
        return Err(GroupError::Setting(format!(
            "Kafka topic `{topic}` does not exist on {brokers}"
        )));
    };
    let mut out = std::collections::BTreeMap::new();
    for p in t.partitions() {
        let (_, high) = consumer
            .fetch_watermarks(topic, p.id(), BROKER_TIMEOUT)
            .map_err(kafka(format!(
                "cannot read the offsets of topic {topic} partition {}",
                p.id()
            )))?;
        out.insert(p.id(), high);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment_bytes(topics: &[(&str, &[i32])], user_data: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(3i16.to_be_bytes());
        b.extend((topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            b.extend((t.len() as i16).to_be_bytes());
            b.extend(t.as_bytes());
            b.extend((ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend((user_data.len() as i32).to_be_bytes());
        b.extend(user_data);
        b
    }

    #[test]
    fn member_assignments_decode() {
        let bytes = assignment_bytes(&[("orders", &[0, 3, 5]), ("b", &[1])], b"sticky");
        let want: Assignment = [
            ("orders".to_owned(), 0),
            ("orders".to_owned(), 3),
            ("orders".to_owned(), 5),
            ("b".to_owned(), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(decode_assignment(&bytes).unwrap(), want);
        assert_eq!(
            decode_assignment(&assignment_bytes(&[], b"")).unwrap(),
            Assignment::new()
        );
        // Cut anywhere inside the topics, it says so instead of making partitions up.
        for cut in 1..bytes.len() - 10 {
            let e = decode_assignment(&bytes[..cut]).unwrap_err();
            assert!(e.contains("ends early"), "{cut}: {e}");
        }
    }
}
