//! `statebox run --group NAME --state-store URL`: one worker of a query shared by several
//! processes, on the machinery users already run — Kafka's consumer-group protocol decides
//! who owns which input partition, object storage keeps each partition's state.
//!
//! Each owned Kafka partition is a *task*: a single-partition query with its own local
//! checkpoint (`<checkpoint>/tasks/<topic>-<partition>`), its own transactional producer
//! (`statebox-<group>-<topic>-<partition>`, so a new owner fences the old one) and its own
//! part of the state store: the plans of its batches (logged create-only before each batch
//! runs, see `statebox_engine::PlanLog`) and snapshots of its state every
//! `--snapshot-interval` batches. A worker that gains a task claims the next owner
//! generation, restores the latest snapshot and re-runs the logged plans after it (their
//! output, which Kafka already has, is not sent again), then goes on with new batches.
//! Nothing of that happens in the rebalance callback: the membership only records the
//! assignment, and this loop starts and stops task threads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use statebox_cluster::{PlanPut, StateStore, TaskStore};
use statebox_engine::{
    BatchReport, Endpoints, EngineError, PlanLog, ProcessorFactory, Query, QueryOptions,
};
use statebox_kafka::group::{GroupMember, GroupSettings};
use statebox_kafka::{KafkaUrl, SinkOptions, SourceOptions};

/// Called with a task's name and each batch it committed.
pub(crate) type ReportFn = dyn Fn(&str, &BatchReport) + Send + Sync;

/// What every task of this worker shares.
pub(crate) struct Worker {
    /// The consumer group (also names the tasks' producers).
    pub group: String,
    /// This worker's static member id in the group.
    pub member: String,
    pub session_timeout_ms: u64,
    /// librdkafka's `partition.assignment.strategy` for the group.
    pub assignment_strategy: String,
    /// Join with `group.instance.id` = the member name (Kafka static membership).
    pub static_membership: bool,
    /// The input topic and brokers.
    pub input: KafkaUrl,
    /// How each task reads its partition and writes its output.
    pub source: SourceOptions,
    pub sink: SinkOptions,
    /// The query's settings; `checkpoint` is this worker's local directory.
    pub opts: QueryOptions,
    pub store: StateStore,
    pub processor: Arc<dyn ProcessorFactory>,
    pub every: Duration,
    /// Called with each committed batch's report and its task's name.
    pub report: Arc<ReportFn>,
}

/// How often a worker rewrites its member record while nothing changes.
const MEMBER_RECORD_EVERY: Duration = Duration::from_secs(5);

/// A task's name in the state store and on disk: `<topic>-<partition>`.
pub(crate) fn task_name(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
}

/// A running task: its thread and the flag that asks it to stop after its batch.
struct Running {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<anyhow::Result<()>>,
}

/// Runs the worker until `stop` is set (Ctrl-C or SIGTERM) or a task finds itself fenced.
pub(crate) fn run(worker: Worker, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let topic = match worker.input.topics.as_slice() {
        [topic] => topic.clone(),
        _ => anyhow::bail!(
            "--group reads exactly one Kafka topic (each partition of it is a task); the \
             input names {}",
            worker.input.topics.join(", ")
        ),
    };
    let member = GroupMember::join(GroupSettings {
        brokers: worker.input.brokers.clone(),
        group: worker.group.clone(),
        topics: vec![topic.clone()],
        instance_id: if worker.static_membership {
            worker.member.clone()
        } else {
            String::new()
        },
        session_timeout_ms: worker.session_timeout_ms,
        client_options: {
            let mut options = worker.source.client_options.clone();
            options.push((
                "partition.assignment.strategy".into(),
                worker.assignment_strategy.clone(),
            ));
            options
        },
    })
    .with_context(|| format!("cannot join Kafka consumer group `{}`", worker.group))?;
    eprintln!(
        "worker `{}` joined group `{}` on {}",
        worker.member, worker.group, worker.input.brokers
    );
    let worker = Arc::new(worker);
    let mut tasks: BTreeMap<i32, Running> = BTreeMap::new();
    // Tasks found fenced (another worker claimed them): not restarted until the group
    // assigns them to this worker again.
    let mut fenced: std::collections::BTreeSet<i32> = std::collections::BTreeSet::new();
    let mut last_owned: Vec<i32> = Vec::new();
    let mut announced: Option<Instant> = None;
    let outcome = (|| -> anyhow::Result<()> {
        while !stop.load(Ordering::SeqCst) {
            // A membership the broker ended for good (another live worker with this
            // worker's --member name, a fatal client error): nothing is assigned any more.
            member.failure().with_context(|| {
                format!("worker `{}` left group `{}`", worker.member, worker.group)
            })?;
            let owned: Vec<i32> = member
                .assignment()
                .into_iter()
                .filter(|(t, _)| *t == topic)
                .map(|(_, p)| p)
                .collect();
            if owned != last_owned {
                eprintln!(
                    "worker `{}` owns partitions {owned:?} of {topic}",
                    worker.member
                );
                fenced.retain(|p| owned.contains(p) && last_owned.contains(p));
                last_owned = owned.clone();
                announced = None;
            }
            if announced.is_none_or(|at: Instant| at.elapsed() >= MEMBER_RECORD_EVERY) {
                let running: Vec<&i32> = tasks.keys().collect();
                let record = serde_json::json!({
                    "member": worker.member,
                    "member_id": member.member_id(),
                    "topic": topic,
                    "owned": owned,
                    "running": running,
                    "pid": std::process::id(),
                });
                // Only for `statebox group status`: a failure is logged, not fatal.
                if let Err(e) = worker.store.put_member(&worker.member, &record) {
                    tracing::warn!(error = %e, "cannot write this worker's member record");
                }
                announced = Some(Instant::now());
            }
            // Tasks that moved away stop after their batch; finished tasks are reaped.
            let gone: Vec<i32> = tasks
                .iter()
                .filter(|(p, r)| !owned.contains(p) || r.thread.is_finished())
                .map(|(p, _)| *p)
                .collect();
            for p in gone {
                let running = tasks.remove(&p).expect("listed");
                running.stop.store(true, Ordering::SeqCst);
                let name = task_name(&topic, p);
                match running.thread.join() {
                    Ok(Ok(())) => eprintln!("task {name} stopped"),
                    Ok(Err(e)) if is_fenced(&e) => {
                        // A newer owner has the task: this worker wrote nothing of it after
                        // the newer owner's claim, and stops writing for it.
                        eprintln!("task {name} stopped: {e:#}");
                        fenced.insert(p);
                    }
                    Ok(Err(e)) => {
                        // Anything else: the task is retried while it stays assigned.
                        eprintln!("task {name} failed, retrying: {e:#}");
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    Err(_) => anyhow::bail!("task {name} panicked"),
                }
            }
            for &p in &owned {
                if tasks.contains_key(&p) || fenced.contains(&p) {
                    continue;
                }
                let task_stop = Arc::new(AtomicBool::new(false));
                let (w, s) = (worker.clone(), task_stop.clone());
                let thread = std::thread::Builder::new()
                    .name(format!("task-{}", task_name(&topic, p)))
                    .spawn(move || run_task(&w, p, &s))
                    .context("cannot start a task thread")?;
                tasks.insert(
                    p,
                    Running {
                        stop: task_stop,
                        thread,
                    },
                );
            }
            member.wait_change(Duration::from_millis(200));
        }
        Ok(())
    })();
    for running in tasks.values() {
        running.stop.store(true, Ordering::SeqCst);
    }
    for (p, running) in tasks {
        match running.thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("task {} failed: {e:#}", task_name(&topic, p)),
            Err(_) => eprintln!("task {} panicked", task_name(&topic, p)),
        }
    }
    member.close();
    outcome
}

/// Whether `e` says another process took this task over.
fn is_fenced(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<EngineError>(),
            Some(EngineError::Fenced(_))
        ) || matches!(
            c.downcast_ref::<statebox_cluster::Error>(),
            Some(statebox_cluster::Error::Fenced { .. })
        )
    })
}

/// One task from taking it to giving it up: claim, restore, replay, run.
fn run_task(worker: &Worker, partition: i32, stop: &AtomicBool) -> anyhow::Result<()> {
    let topic = &worker.input.topics[0];
    let name = task_name(topic, partition);
    let task = Arc::new(worker.store.task(&name)?);
    let generation = task
        .claim()
        .with_context(|| format!("cannot claim task {name}"))?;
    let dir = task_dir(&worker.opts.checkpoint, &name);
    let started = Instant::now();
    restore(&task, &dir).with_context(|| format!("cannot restore task {name}"))?;
    let restored = started.elapsed();

    let mut source = worker.source.clone();
    source.partitions = Some(vec![partition]);
    source.key_check = Some(worker.opts.key_columns.clone());
    let mut sink = worker.sink.clone();
    sink.transactional_id = Some(format!("statebox-{}-{name}", worker.group));
    let endpoints = Endpoints {
        source: Some(Box::new(statebox_kafka::KafkaSource::new(source)?)),
        sink: Some(Box::new(statebox_kafka::KafkaSink::new(sink)?)),
        plans: Some(Box::new(TaskPlans {
            task: task.clone(),
            generation,
        })),
    };
    let opts = QueryOptions {
        checkpoint: dir.clone(),
        // Each task is one Kafka partition; its keys still spread over state partitions.
        ..worker.opts.clone()
    };
    let mut query = Query::open_with(opts, worker.processor.clone(), endpoints)
        .with_context(|| format!("cannot open task {name}"))?;
    let mut shares = String::new();
    if let Some(c) = &worker.opts.shared_state_cache {
        let (tasks, mib) = (c.caches(), c.bytes() >> 20);
        shares += &format!("; {tasks} tasks share the state cache's {mib} MiB");
    }
    if let Some(m) = &worker.opts.shared_memtables {
        let tasks = m.databases();
        shares += &format!("; {tasks} tasks share the memtables of one database");
    }
    eprintln!(
        "task {name}: owner generation {generation}, restored in {} ms, at batch {}{shares}",
        restored.as_millis(),
        query
            .head()
            .map_or("none".to_owned(), |h| h.batch_id.to_string())
    );
    let interval = worker.opts.snapshot_interval;
    let staging = upload_staging_dir(&worker.opts.checkpoint, &name);
    remove_staged(&staging).with_context(|| format!("cannot clear {}", staging.display()))?;
    let mut uploads = Uploads::default();
    let mut committed = |query: &Query, report: &BatchReport| -> anyhow::Result<()> {
        (worker.report)(&name, report);
        uploads
            .poll()
            .with_context(|| format!("cannot upload task {name}'s snapshot"))?;
        let batch = report.commit.batch_id;
        if interval > 0 && (batch + 1).is_multiple_of(interval) {
            // Before the next batch's plan is written: the snapshot is exactly the batch's.
            query.wait_for_snapshot();
            // The upload runs beside the next batches, from hard links of the snapshot's
            // files: the engine may remove the snapshot itself meanwhile.
            uploads
                .finish()
                .with_context(|| format!("cannot upload task {name}'s snapshot"))?;
            let Some(staged) = stage_snapshot(&dir, batch, &staging)? else {
                return Ok(());
            };
            let task = task.clone();
            uploads.start(&name, move || {
                let uploaded = upload_dir(&task, generation, &staged, batch);
                let removed = remove_staged(&staged)
                    .with_context(|| format!("cannot remove {}", staged.display()));
                uploaded.and(removed)
            })?;
        }
        Ok(())
    };
    while !stop.load(Ordering::SeqCst) {
        let tick = Instant::now();
        // Logged batches to replay and input backlog run back to back; when there is none,
        // the tick may run one no-data batch (timers and TTL in the time modes) and waits
        // for the next interval.
        let mut ran = false;
        while !stop.load(Ordering::SeqCst) {
            let Some(report) = query.run_next(None)? else {
                break;
            };
            committed(&query, &report)?;
            ran = true;
        }
        if !ran
            && !stop.load(Ordering::SeqCst)
            && let Some(report) = query.run_tick(None)?
        {
            committed(&query, &report)?;
        }
        let mut left = worker.every.saturating_sub(tick.elapsed());
        while !left.is_zero() && !stop.load(Ordering::SeqCst) {
            let step = left.min(Duration::from_millis(50));
            std::thread::sleep(step);
            left -= step;
        }
    }
    uploads
        .finish()
        .with_context(|| format!("cannot upload task {name}'s snapshot"))
}

/// The snapshot upload a task runs beside its next batches: at most one at a time. Dropping
/// it waits for the upload (a task that fails still lets it finish, and its staged files
/// go before the task is retried).
#[derive(Default)]
struct Uploads {
    running: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Uploads {
    /// Starts `upload` on a thread of its own. Call [`Self::finish`] first.
    fn start(
        &mut self,
        task: &str,
        upload: impl FnOnce() -> anyhow::Result<()> + Send + 'static,
    ) -> anyhow::Result<()> {
        debug_assert!(self.running.is_none(), "one upload at a time");
        let thread = std::thread::Builder::new()
            .name(format!("upload-{task}"))
            .spawn(upload)
            .context("cannot start a snapshot upload")?;
        self.running = Some(thread);
        Ok(())
    }

    /// The outcome of an upload that has finished; does not wait for one that has not.
    fn poll(&mut self) -> anyhow::Result<()> {
        if self.running.as_ref().is_some_and(JoinHandle::is_finished) {
            self.finish()
        } else {
            Ok(())
        }
    }

    /// Waits for the upload in flight, if any, and returns its outcome.
    fn finish(&mut self) -> anyhow::Result<()> {
        match self.running.take() {
            None => Ok(()),
            Some(thread) => thread
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the snapshot upload panicked"))),
        }
    }
}

impl Drop for Uploads {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            eprintln!("snapshot upload failed: {e:#}");
        }
    }
}

/// `<checkpoint>/uploads/<name>`: where a task's snapshot being uploaded is staged.
fn upload_staging_dir(local: &Path, name: &str) -> PathBuf {
    local.join("uploads").join(name)
}

/// Hard-links (or copies) the files of the local snapshot the engine took after `batch` into
/// `staging/<batch>`, which is returned; `None` if there is no such snapshot (the engine
/// logs why it could not take it; the next interval tries again).
fn stage_snapshot(dir: &Path, batch: u64, staging: &Path) -> anyhow::Result<Option<PathBuf>> {
    let snapshot = snapshot_dir(dir, batch);
    if !snapshot.is_dir() {
        return Ok(None);
    }
    let staged = staging.join(batch.to_string());
    let stage = || -> std::io::Result<()> {
        remove_staged(&staged)?;
        std::fs::create_dir_all(&staged)?;
        for entry in std::fs::read_dir(&snapshot)? {
            let (from, to) = {
                let entry = entry?;
                (entry.path(), staged.join(entry.file_name()))
            };
            // A file system without hard links gets copies (as RocksDB's checkpoint does).
            if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to)?;
            }
        }
        Ok(())
    };
    stage().with_context(|| {
        format!(
            "cannot stage snapshot {} in {}",
            snapshot.display(),
            staged.display()
        )
    })?;
    Ok(Some(staged))
}

/// Removes `dir` and what it holds, if it exists.
fn remove_staged(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The state of the local snapshot the engine takes after `batch`.
fn snapshot_dir(dir: &Path, batch: u64) -> PathBuf {
    statebox_engine::reader::snapshots_dir(dir)
        .join(statebox_engine::reader::snapshot_name(batch))
        .join("state")
}

/// `<checkpoint>/tasks/<name>`: a task's local checkpoint on this worker.
fn task_dir(local: &Path, name: &str) -> PathBuf {
    local.join("tasks").join(name)
}

/// Replaces the task's local checkpoint with the latest snapshot in the store (or nothing,
/// for a task that has none yet: its logged plans then re-run from batch 0).
///
/// A local checkpoint this worker kept from an earlier ownership is reused when it is at
/// or past the latest snapshot: every batch it committed ran a plan from the store's log
/// (the engine logs or adopts each plan there first, and commits only after Kafka took the
/// batch's output), so it is a prefix of the task's history, and the logged plans after
/// it re-run as after a restore.
pub(crate) fn restore(task: &TaskStore, dir: &Path) -> anyhow::Result<()> {
    let latest = task.latest_snapshot()?;
    let local_head = statebox_engine::StateReader::open(dir)
        .ok()
        .and_then(|r| r.progress(1).ok())
        .and_then(|p| p.last().map(|c| c.batch_id));
    if let Some(head) = local_head
        && latest.as_ref().is_none_or(|m| m.batch <= head)
    {
        return Ok(());
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if let Some(manifest) = latest {
        task.restore(&manifest, &dir.join("state"))?;
    }
    Ok(())
}

/// Uploads the local snapshot the engine took after `batch`.
pub(crate) fn upload(
    task: &TaskStore,
    generation: u64,
    dir: &Path,
    batch: u64,
) -> anyhow::Result<()> {
    let snapshot = snapshot_dir(dir, batch);
    if !snapshot.is_dir() {
        // The engine logs why it could not take it; the next interval tries again.
        return Ok(());
    }
    upload_dir(task, generation, &snapshot, batch)
}

/// Uploads `snapshot`, the state after `batch`, and deletes the plans no kept snapshot
/// needs.
fn upload_dir(
    task: &TaskStore,
    generation: u64,
    snapshot: &Path,
    batch: u64,
) -> anyhow::Result<()> {
    let retention = statebox_cluster::Retention::default();
    task.upload_snapshot(generation, batch, snapshot, &retention)?;
    // Plans before the oldest kept snapshot can never be replayed again.
    if let Some(&oldest) = task.snapshot_batches()?.first() {
        task.delete_plans_before(generation, oldest + 1)?;
    }
    Ok(())
}

/// The engine's plan log over a task's plans in the state store.
pub(crate) struct TaskPlans {
    pub task: Arc<TaskStore>,
    pub generation: u64,
}

fn store_error(e: statebox_cluster::Error) -> EngineError {
    match e {
        statebox_cluster::Error::Fenced { .. } => EngineError::Fenced(e.to_string()),
        other => EngineError::Io(format!("state store: {other}")),
    }
}

impl PlanLog for TaskPlans {
    fn put(&mut self, batch_id: u64, plan: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        match self
            .task
            .put_plan(self.generation, batch_id, plan)
            .map_err(store_error)?
        {
            PlanPut::Written => Ok(None),
            PlanPut::Exists(logged) => Ok(Some(logged)),
        }
    }

    fn get(&mut self, batch_id: u64) -> Result<Option<Vec<u8>>, EngineError> {
        self.task.get_plan(batch_id).map_err(store_error)
    }

    fn last(&mut self) -> Result<Option<u64>, EngineError> {
        self.task.latest_plan().map_err(store_error)
    }
}

/// `statebox group …`: looking at a query shared by workers.
#[derive(clap::Subcommand)]
pub(crate) enum GroupCommand {
    /// Show a group's members and the partitions each owns, and per task its last logged
    /// batch, its lag (input records not yet planned) and its last state snapshot (JSON).
    Status(StatusArgs),
}

#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    /// The group's input: `kafka://HOST:PORT/TOPIC`.
    #[arg(long)]
    input: String,
    /// The consumer group.
    #[arg(long)]
    group: String,
    /// The group's state store (as given to its workers).
    #[arg(long)]
    state_store: String,
    /// A librdkafka client setting, e.g. `security.protocol=SASL_SSL`; repeat for more.
    #[arg(long = "kafka-option", value_name = "KEY=VALUE", value_parser = parse_kafka_option)]
    kafka_options: Vec<(String, String)>,
}

fn parse_kafka_option(s: &str) -> Result<(String, String), String> {
    statebox_kafka::parse_option(s).map_err(|e| e.to_string())
}

pub(crate) fn run_command(cmd: GroupCommand) -> anyhow::Result<()> {
    match cmd {
        GroupCommand::Status(args) => status(args),
    }
}

fn status(args: StatusArgs) -> anyhow::Result<()> {
    let Some(url) = KafkaUrl::parse(&args.input)? else {
        anyhow::bail!("--input must be a kafka://HOST:PORT/TOPIC address");
    };
    let [topic] = url.topics.as_slice() else {
        anyhow::bail!("--input names one topic, as the workers' --input does");
    };
    let group = statebox_kafka::group::describe(&url.brokers, &args.group, &args.kafka_options)
        .with_context(|| format!("cannot describe Kafka consumer group `{}`", args.group))?;
    let ends = statebox_kafka::group::end_offsets(&url.brokers, topic, &args.kafka_options)
        .with_context(|| format!("cannot read the end offsets of topic `{topic}`"))?;
    let store = StateStore::open_read_only(&args.state_store)
        .with_context(|| format!("cannot open the state store {}", args.state_store))?;
    let summaries: BTreeMap<String, statebox_cluster::TaskSummary> = store
        .tasks()?
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    let mut owners: BTreeMap<i32, String> = BTreeMap::new();
    let members: Vec<serde_json::Value> = group
        .members
        .iter()
        .map(|m| {
            let owned: Vec<i32> = m
                .assignment
                .iter()
                .filter(|(t, _)| t == topic)
                .map(|(_, p)| *p)
                .collect();
            for p in &owned {
                owners.insert(*p, m.instance_id.clone().unwrap_or(m.member_id.clone()));
            }
            serde_json::json!({
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "client_id": m.client_id,
                "host": m.host,
                "partitions": owned,
            })
        })
        .collect();
    let mut tasks = Vec::new();
    for (&partition, &end) in &ends {
        let name = task_name(topic, partition);
        let summary = summaries.get(&name);
        let task = store.task(&name)?;
        // The end of the input the task's last logged plan reads: what is behind it in
        // the partition is its lag.
        let planned_to = match summary.and_then(|s| s.latest_plan) {
            Some(batch) => task
                .get_plan(batch)?
                .and_then(|bytes| planned_end(&bytes, topic, partition)),
            None => None,
        };
        tasks.push(serde_json::json!({
            "task": name,
            "partition": partition,
            "owner": owners.get(&partition),
            "owner_generation": summary.and_then(|s| s.owner_generation),
            "last_planned_batch": summary.and_then(|s| s.latest_plan),
            "end_offset": end,
            "planned_offset": planned_to,
            "lag": end - planned_to.unwrap_or(0),
            "last_snapshot_batch": summary.and_then(|s| s.snapshot_batch),
            "last_snapshot_at_ms": summary.and_then(|s| s.snapshot_at_ms),
        }));
    }
    // What each worker last wrote about itself (every few seconds while it runs): shown
    // even where the broker's DescribeGroups lists no members.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let workers: Vec<serde_json::Value> = store
        .members()?
        .into_iter()
        .map(|m| {
            serde_json::json!({
                "member": m.name,
                "owned": m.body.get("owned"),
                "running": m.body.get("running"),
                "member_id": m.body.get("member_id"),
                "seconds_since_record": (now_ms - m.written_at_ms).max(0) / 1000,
            })
        })
        .collect();
    for t in &mut tasks {
        if t["owner"].is_null() {
            let p = t["partition"].clone();
            let fresh = workers.iter().find(|w| {
                w["seconds_since_record"].as_i64().is_some_and(|s| s <= 30)
                    && w["owned"].as_array().is_some_and(|o| o.contains(&p))
            });
            if let Some(w) = fresh {
                t["owner"] = w["member"].clone();
            }
        }
    }
    let out = serde_json::json!({
        "group": args.group,
        "state": group.state,
        "members": members,
        "workers": workers,
        "tasks": tasks,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// The end offset of `topic`/`partition` in a logged batch plan (the Kafka source's part of
/// it: `{"source": {"ranges": [{topic, partition, start, end}]}}`).
fn planned_end(plan: &[u8], topic: &str, partition: i32) -> Option<i64> {
    let plan: serde_json::Value = serde_json::from_slice(plan).ok()?;
    plan["source"]["ranges"]
        .as_array()?
        .iter()
        .find(|r| r["topic"] == topic && r["partition"] == partition)
        .and_then(|r| r["end"].as_i64())
}

/// A checkpoint to read: a directory as given, or a task in a state store
/// (`s3://BUCKET/PREFIX/tasks/TOPIC-PARTITION`, or `file:///DIR/tasks/TOPIC-PARTITION`),
/// whose latest snapshot is downloaded into a temporary directory (kept alive by the
/// returned guard). A snapshot holds the batches it retains (`--min-batches-to-retain`), so
/// any of them can be read; batches after it are only in the owner's local checkpoint.
pub(crate) fn readable_checkpoint(
    arg: &Path,
) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    let text = arg.to_string_lossy();
    if !text.contains("://") {
        return Ok((arg.to_owned(), None));
    }
    let Some((store_url, task)) = text.rsplit_once("/tasks/") else {
        anyhow::bail!(
            "{text} is not a task in a state store: expected URL/tasks/TOPIC-PARTITION, \
             e.g. s3://bucket/query/tasks/orders-3 (see `statebox group status`)"
        );
    };
    let store = StateStore::open_read_only(store_url)
        .with_context(|| format!("cannot open the state store {store_url}"))?;
    let task = store.task(task.trim_end_matches('/'))?;
    let Some(manifest) = task.latest_snapshot()? else {
        anyhow::bail!(
            "task {} has no state snapshot in {store_url} yet (one is taken every \
             --snapshot-interval batches)",
            task.name()
        );
    };
    let tmp = tempfile::Builder::new()
        .prefix("statebox-task-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    task.restore(&manifest, &tmp.path().join("state"))?;
    Ok((tmp.path().to_owned(), Some(tmp)))
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn an_upload_runs_beside_the_task_and_its_outcome_comes_back_when_finished() {
        let mut uploads = Uploads::default();
        let (go, wait) = mpsc::channel::<()>();
        let (done, finished) = mpsc::channel::<()>();
        uploads
            .start("t-0", move || {
                wait.recv().unwrap();
                done.send(()).unwrap();
                anyhow::bail!("the store refused it")
            })
            .unwrap();
        // Running: polling neither waits for it nor reports anything.
        uploads.poll().unwrap();
        assert!(uploads.running.is_some());
        go.send(()).unwrap();
        finished.recv().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !uploads.running.as_ref().unwrap().is_finished() {
            assert!(Instant::now() < deadline, "the upload did not end");
            std::thread::sleep(Duration::from_millis(5));
        }
        let failed = uploads.poll().unwrap_err();
        assert_eq!(failed.to_string(), "the store refused it");
        // Reported once; nothing is left to wait for.
        uploads.finish().unwrap();

        uploads.start("t-0", || Ok(())).unwrap();
        uploads.finish().unwrap();
        assert!(uploads.running.is_none());
    }

    #[test]
    fn dropping_the_uploads_waits_for_the_one_in_flight() {
        let uploaded = Arc::new(AtomicBool::new(false));
        let mut uploads = Uploads::default();
        let flag = uploaded.clone();
        uploads
            .start("t-0", move || {
                std::thread::sleep(Duration::from_millis(200));
                flag.store(true, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        drop(uploads);
        assert!(uploaded.load(Ordering::SeqCst));
    }

    #[test]
    fn a_staged_snapshot_outlives_the_engines_removal_of_the_snapshot() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("tasks").join("t-0");
        let snapshot = snapshot_dir(&dir, 9);
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::write(snapshot.join("000012.sst"), b"table").unwrap();
        std::fs::write(snapshot.join("CURRENT"), b"MANIFEST-000005\n").unwrap();
        let staging = upload_staging_dir(root.path(), "t-0");

        assert!(
            stage_snapshot(&dir, 8, &staging).unwrap().is_none(),
            "no snapshot of 8"
        );
        let staged = stage_snapshot(&dir, 9, &staging).unwrap().unwrap();
        assert_eq!(staged, staging.join("9"));
        // The engine removes snapshots past their retention, whenever it likes.
        std::fs::remove_dir_all(statebox_engine::reader::snapshots_dir(&dir)).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&staged)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["000012.sst", "CURRENT"]);
        assert_eq!(std::fs::read(staged.join("000012.sst")).unwrap(), b"table");

        // Staging again (a retried task) replaces what an interrupted run left.
        std::fs::create_dir_all(snapshot_dir(&dir, 9)).unwrap();
        std::fs::write(snapshot_dir(&dir, 9).join("CURRENT"), b"MANIFEST-000007\n").unwrap();
        let again = stage_snapshot(&dir, 9, &staging).unwrap().unwrap();
        let names: Vec<_> = std::fs::read_dir(&again).unwrap().collect();
        assert_eq!(names.len(), 1);
        remove_staged(&staging).unwrap();
        assert!(!staging.exists());
        remove_staged(&staging).unwrap();
    }
}
