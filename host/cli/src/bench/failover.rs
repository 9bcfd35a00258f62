//! `statebox bench failover`: the figures of a query shared by workers (`statebox run
//! --group`).
//!
//! 1. **Recovery.** One task is built the real way: the engine runs batches of new keys
//!    over a plan log in a task store (the worker's `TaskPlans`) until its RocksDB state
//!    reaches `--state-mb`; a snapshot is taken where the engine keeps its own and uploaded
//!    with the worker's `upload`; `--replay-batches` more batches run, their plans logged.
//!    Then, as a worker that gains the task does: claim the next owner generation, restore
//!    the latest snapshot into a fresh directory (the worker's `restore`), open the query
//!    over the plan log and run until every logged plan is replayed. The replayed output is
//!    compared byte for byte with the first owner's, so a replay that computed something
//!    else fails the bench instead of being timed.
//! 2. **Scaling** (with `--brokers`): the same events in a topic, then 1, 2, 3 worker
//!    processes (`statebox run --group`, this binary) on a fresh group each, timed until
//!    their batch reports (`--progress-json`) account for every event.
//!
//! File input and output are used for the recovery part: the replay re-runs the logged
//! plans, which name byte ranges of the input files, so no broker is needed. The Kafka
//! sink would suppress the replayed batches' output (it has them); the file sink appends
//! it again, after a stand-in for the first owner's output up to the snapshot (a sparse
//! file of that length), so the figure includes writing it.

use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::json;
use statebox_cluster::StateStore;
use statebox_engine::testing::NativeCounter;
use statebox_engine::{Endpoints, ProcessorFactory, Query, QueryOptions};

use crate::group::{self, TaskPlans};

#[derive(Args)]
pub(crate) struct FailoverArgs {
    /// MiB of task state (RocksDB files on disk) to build before the snapshot.
    #[arg(long, default_value_t = 1024)]
    state_mb: u64,
    /// Batches run after the snapshot, with their plans logged: what the new owner replays.
    #[arg(long, default_value_t = 5)]
    replay_batches: u64,
    /// Events per batch. Building the state, each event is a new key; the replayed batches
    /// update keys already in the state.
    #[arg(long, default_value_t = 100_000)]
    batch_events: u64,
    /// Bytes of each key (random hex): long keys make the state grow fast.
    #[arg(long, default_value_t = 200)]
    key_bytes: usize,
    /// Where the task's plans and snapshot go: `s3://BUCKET/PREFIX` (with the AWS_*
    /// environment, e.g. a local moto) or a directory (default: a temporary one).
    #[arg(long)]
    state_store: Option<String>,
    /// The Kafka brokers, HOST:PORT: also measure throughput with 1, 2 and 3 workers.
    #[arg(long)]
    brokers: Option<String>,
    /// Partitions of the scaling run's input and output topics (its tasks).
    #[arg(long, default_value_t = 6)]
    topic_partitions: i32,
    /// Events of the scaling run.
    #[arg(long, default_value_t = 600_000)]
    events: u64,
    /// Distinct keys of the scaling run.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Worker counts of the scaling run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    workers: Vec<usize>,
    /// How the scaling run's workers are assigned partitions (`statebox run
    /// --group-assignment`). `range` by default: tansu stalls cooperative rebalances of
    /// three members. Workers join as dynamic members (tansu never expires static ones).
    #[arg(long, default_value = "range", value_parser = ["cooperative-sticky", "range", "roundrobin"])]
    group_assignment: String,
    /// Records per batch of each scaling-run task (`statebox run --max-records-per-batch`):
    /// tansu answers a fetch of a whole 100,000-record partition too slowly on a loaded
    /// machine (the task's 30 s read deadline passes and it retries).
    #[arg(long, default_value_t = 20_000)]
    max_records_per_batch: u64,
    /// Give up on a scaling run that has not counted every event after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// A librdkafka client setting (the workers' and the bench's); repeat for more.
    #[arg(long = "kafka-option", value_name = "KEY=VALUE", value_parser = super::parse_kafka_option)]
    kafka_options: Vec<(String, String)>,
    /// A librdkafka setting of the bench's own event producer only; on tansu,
    /// `batch.num.messages=1` (see `bench kafka`).
    #[arg(long = "producer-option", value_name = "KEY=VALUE", value_parser = super::parse_kafka_option)]
    producer_options: Vec<(String, String)>,
    /// The counter component the scaling run's workers load (default: build
    /// plugins/counter).
    #[arg(long)]
    processor: Option<PathBuf>,
}

pub(crate) fn run(args: FailoverArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.state_mb > 0 && args.replay_batches > 0 && args.batch_events > 0,
        "--state-mb, --replay-batches and --batch-events must be positive"
    );
    anyhow::ensure!(
        args.key_bytes >= 16,
        "--key-bytes must be at least 16 (keys are numbered)"
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let line = recovery(&args, cores)?;
    println!("{line}");
    match &args.brokers {
        Some(brokers) => scaling(&args, brokers, cores)?,
        None => eprintln!(
            "no --brokers given: only the recovery figure was measured (the scaling run \
             needs a Kafka broker)"
        ),
    }
    Ok(())
}

/// Key number `n` as `--key-bytes` characters: its number, then hex from a generator
/// seeded with it, so that keys neither share prefixes nor compress.
fn key(n: u64, len: usize) -> String {
    let mut s = format!("{n:010}-");
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    while s.len() < len {
        // splitmix64
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        s.push_str(&format!("{z:016x}"));
    }
    s.truncate(len);
    s
}

/// Writes one batch's input file: `{"key": …, "value": …}` for each key number.
fn write_batch(
    input: &Path,
    batch: u64,
    keys: impl Iterator<Item = u64>,
    len: usize,
) -> anyhow::Result<()> {
    let path = input.join(format!("part-{batch:06}.jsonl"));
    let file =
        std::fs::File::create(&path).with_context(|| format!("create {}", path.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    for n in keys {
        writeln!(w, "{{\"key\":\"{}\",\"value\":{n}}}", key(n, len))?;
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(())
}

/// The bytes of the regular files under `dir`, recursively (hard links counted each time).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// A name no earlier run used: the process id and the clock.
fn run_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{}-{ms}", std::process::id())
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// Part 1: see the module docs.
fn recovery(args: &FailoverArgs, cores: usize) -> anyhow::Result<serde_json::Value> {
    let scratch = super::scratch_dir()?;
    let dir = scratch.path();
    let input = dir.join("input");
    std::fs::create_dir_all(&input)?;
    let store_url = match &args.state_store {
        Some(url) => format!("{}/failover-{}", url.trim_end_matches('/'), run_id()),
        None => dir.join("store").to_string_lossy().into_owned(),
    };
    let kind = match store_url.split_once("://") {
        Some((scheme, _)) => scheme.to_owned(),
        None => "directory".to_owned(),
    };
    let store = StateStore::open(&store_url)
        .with_context(|| format!("cannot open the state store {store_url}"))?;
    let task = Arc::new(store.task(&group::task_name("bench", 0))?);
    let factory: Arc<dyn ProcessorFactory> = Arc::new(NativeCounter::new());
    let options = |checkpoint: PathBuf, output: PathBuf| QueryOptions {
        partitions: Some(4),
        // The bench takes the snapshot itself, where the engine keeps its own.
        snapshot_interval: 0,
        ..QueryOptions::new(input.clone(), output, checkpoint, vec!["key".into()])
    };
    let open = |opts: QueryOptions, generation: u64| {
        let plans = TaskPlans {
            task: task.clone(),
            generation,
        };
        Query::open_with(
            opts,
            factory.clone(),
            Endpoints {
                plans: Some(Box::new(plans)),
                ..Default::default()
            },
        )
    };

    // The first owner builds the state: each batch brings `batch_events` new keys.
    let first_dir = dir.join("owner-1");
    let first_output = dir.join("owner-1.jsonl");
    let generation = task.claim()?;
    let target = args.state_mb << 20;
    let started = Instant::now();
    let mut query = open(options(first_dir.clone(), first_output.clone()), generation)?;
    let (mut batch, mut keys) = (0u64, 0u64);
    let mut state_bytes = 0;
    while state_bytes < target {
        write_batch(
            &input,
            batch,
            keys..keys + args.batch_events,
            args.key_bytes,
        )?;
        let report = query
            .run_next(None)?
            .context("a batch of new input ran nothing")?;
        anyhow::ensure!(
            report.commit.batch_id == batch && report.commit.input_rows == args.batch_events,
            "building batch {batch}: the engine ran batch {} with {} rows",
            report.commit.batch_id,
            report.commit.input_rows
        );
        keys += args.batch_events;
        batch += 1;
        state_bytes = dir_bytes(&first_dir.join("state"));
        eprintln!(
            "built batch {}: {keys} keys, {} MiB of state",
            batch - 1,
            state_bytes >> 20
        );
    }
    let build_seconds = started.elapsed();
    let snapshot_batch = batch - 1;
    drop(query);

    // The snapshot, where the engine takes its own, uploaded as a worker does.
    let checkpoint = statebox_state::Checkpoint::open(&first_dir)?;
    let taken = statebox_engine::reader::snapshots_dir(&first_dir)
        .join(statebox_engine::reader::snapshot_name(snapshot_batch));
    anyhow::ensure!(
        checkpoint.snapshot(&taken)?,
        "the checkpoint took no snapshot"
    );
    drop(checkpoint);
    let snapshot_bytes = dir_bytes(&taken.join("state"));
    let output_at_snapshot = std::fs::metadata(&first_output)?.len();
    let started = Instant::now();
    group::upload(&task, generation, &first_dir, snapshot_batch)?;
    let upload_seconds = started.elapsed();
    let manifest = task
        .latest_snapshot()?
        .filter(|m| m.batch == snapshot_batch)
        .context("the upload left no manifest of the snapshot's batch")?;
    // The local snapshot's hard links would keep the state's files alive twice over.
    std::fs::remove_dir_all(statebox_engine::reader::snapshots_dir(&first_dir))?;

    // More batches after the snapshot: they update keys already in the state, spread over
    // all of it, and their plans are logged. A new owner replays them.
    let mut query = open(options(first_dir.clone(), first_output.clone()), generation)?;
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D;
    let started = Instant::now();
    for _ in 0..args.replay_batches {
        let picks: Vec<u64> = (0..args.batch_events)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % keys
            })
            .collect();
        write_batch(&input, batch, picks.into_iter(), args.key_bytes)?;
        let report = query
            .run_next(None)?
            .context("a batch of new input ran nothing")?;
        anyhow::ensure!(
            report.commit.batch_id == batch,
            "batch {batch} ran as {}",
            report.commit.batch_id
        );
        batch += 1;
    }
    let last_batch = batch - 1;
    let first_run_seconds = started.elapsed();
    drop(query);
    // The first owner is gone (its output stays, to compare the replay with); its state
    // would only take disk space.
    std::fs::remove_dir_all(&first_dir)?;
    anyhow::ensure!(
        task.latest_plan()? == Some(last_batch),
        "the store's plan log does not end at batch {last_batch}"
    );

    // The new owner: claim, restore, replay.
    let new_dir = dir.join("owner-2");
    let new_output = dir.join("owner-2.jsonl");
    let started = Instant::now();
    let new_generation = task.claim()?;
    group::restore(&task, &new_dir)?;
    let restore_seconds = started.elapsed();
    // Stands in for the first owner's output up to the snapshot, which the restored
    // checkpoint's commit record counts: the replay appends after it.
    std::fs::File::create(&new_output)?.set_len(output_at_snapshot)?;
    let started = Instant::now();
    let mut query = open(options(new_dir.clone(), new_output.clone()), new_generation)?;
    let restored_at = query.head().map(|h| h.batch_id);
    anyhow::ensure!(
        restored_at == Some(snapshot_batch),
        "the restored checkpoint is at batch {restored_at:?}, not the snapshot's \
         {snapshot_batch}"
    );
    let mut replayed = 0u64;
    while query.head().is_some_and(|h| h.batch_id < last_batch) {
        query
            .run_next(None)?
            .context("the new owner found no logged plan to replay")?;
        replayed += 1;
    }
    let replay_seconds = started.elapsed();
    drop(query);
    let recovery_seconds = restore_seconds + replay_seconds;
    anyhow::ensure!(
        replayed == args.replay_batches,
        "replayed {replayed} batches, {} were logged after the snapshot",
        args.replay_batches
    );
    // The replay is the same computation as the first run: the same rows after the
    // snapshot's output.
    let tail = |path: &Path| -> anyhow::Result<Vec<u8>> {
        let bytes = std::fs::read(path)?;
        Ok(bytes[output_at_snapshot as usize..].to_vec())
    };
    anyhow::ensure!(
        tail(&first_output)? == tail(&new_output)?,
        "the new owner's replayed output differs from the first owner's"
    );
    Ok(json!({
        "workload": "failover-recovery",
        "processor": "counter-native",
        "store": kind,
        "store_url": store_url,
        "task": task.name(),
        "owner_generation": new_generation,
        "last_batch": last_batch,
        "cores": cores,
        "keys": keys,
        "key_bytes": args.key_bytes,
        "state_bytes": state_bytes,
        "snapshot_bytes": snapshot_bytes,
        "snapshot_files": manifest.files.len(),
        "snapshot_batch": snapshot_batch,
        "build_seconds": secs(build_seconds),
        "upload_seconds": secs(upload_seconds),
        "download_seconds": secs(restore_seconds),
        "download_mib_per_s": ((snapshot_bytes as f64 / (1 << 20) as f64)
            / restore_seconds.as_secs_f64().max(1e-9))
        .round(),
        "replay_batches": replayed,
        "replay_events": replayed * args.batch_events,
        "replay_seconds": secs(replay_seconds),
        // The same batches when the first owner ran them (input files written included):
        // what the replay compares with.
        "first_run_seconds": secs(first_run_seconds),
        "recovery_seconds": secs(recovery_seconds),
        "replay_output_identical": true,
    }))
}

/// A worker process of the scaling run, its batch reports collected by a reader thread.
struct WorkerProc {
    child: Child,
    log: PathBuf,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl WorkerProc {
    /// Sends SIGINT (a clean stop after each task's batch) and waits up to a minute, then
    /// kills it.
    fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.child.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break Some(status);
            }
            if Instant::now() >= deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        match status {
            Some(s) if s.success() => Ok(()),
            Some(s) => anyhow::bail!("a worker stopped with {s}; its log: {}", self.log.display()),
            None => anyhow::bail!(
                "a worker did not stop within 60 s of SIGINT; its log: {}",
                self.log.display()
            ),
        }
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        // Only reached with the child still running when the bench fails midway.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Input rows per (task, batch) from the workers' batch reports: a batch run twice (a
/// task that moved in a rebalance replays its logged plans) counts once.
type Counted = Arc<Mutex<BTreeMap<(String, u64), u64>>>;

/// Part 2: see the module docs.
fn scaling(args: &FailoverArgs, brokers: &str, cores: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.events > 0 && args.keys > 0 && args.topic_partitions > 0,
        "--events, --keys and --topic-partitions must be positive"
    );
    anyhow::ensure!(
        !args.workers.is_empty() && args.workers.iter().all(|&n| n > 0),
        "--workers lists positive worker counts"
    );
    let wasm = match &args.processor {
        Some(p) => crate::plugin::resolve(p)?,
        None => crate::plugin::resolve(&super::workspace_root().join("plugins/counter"))?,
    };
    let opts = &args.kafka_options;
    let scratch = super::scratch_dir()?;
    let dir = scratch.path();
    let input = dir.join("input");
    super::generate_count_input(&input, args.events, args.keys, 1)?;
    let run_id = run_id();
    let in_topic = format!("statebox-failover-{run_id}-in");
    statebox_kafka::create_topic(brokers, opts, &in_topic, args.topic_partitions)?;
    let producer_opts: Vec<(String, String)> =
        opts.iter().chain(&args.producer_options).cloned().collect();
    let producer = statebox_kafka::client::RowProducer::new(brokers, &producer_opts)?;
    let seconds = super::produce_generated(&producer, &input, &in_topic)?;
    drop(producer);
    eprintln!(
        "produced {} events to {in_topic} in {seconds:.1} s",
        args.events
    );
    let mut exe = std::env::current_exe().context("cannot find this statebox binary")?;
    if !exe.exists() {
        // Rebuilt while this ran: Linux names the old file `… (deleted)`. The workers run
        // the new build at the same path (copy the binary away for figures that matter).
        if let Some(path) = exe.to_str().and_then(|p| p.strip_suffix(" (deleted)")) {
            eprintln!("this statebox binary was replaced while running; the workers run {path}");
            exe = PathBuf::from(path);
        }
    }
    for &n in &args.workers {
        let out_topic = format!("statebox-failover-{run_id}-out-{n}");
        statebox_kafka::create_topic(brokers, opts, &out_topic, args.topic_partitions)?;
        let group = format!("statebox-failover-{run_id}-{n}");
        let store = match &args.state_store {
            Some(url) => format!("{}/scaling-{run_id}-{n}", url.trim_end_matches('/')),
            None => dir
                .join(format!("store-{n}"))
                .to_string_lossy()
                .into_owned(),
        };
        let counted: Counted = Arc::default();
        let started = Instant::now();
        let mut workers = Vec::new();
        for w in 0..n {
            let local = dir.join(format!("n{n}-w{w}"));
            let log = dir.join(format!("n{n}-w{w}.log"));
            let mut cmd = std::process::Command::new(&exe);
            cmd.arg("run")
                .arg("--processor")
                .arg(&wasm)
                .args(["--input", &format!("kafka://{brokers}/{in_topic}")])
                .args(["--output", &format!("kafka://{brokers}/{out_topic}")])
                .arg("--checkpoint")
                .arg(&local)
                .args(["--key", "key", "--output-key", "key"])
                .args(["--group", &group, "--member", &format!("w{w}")])
                .args(["--state-store", &store])
                .args(["--trigger", "interval=200ms", "--progress-json"])
                .args(["--group-assignment", &args.group_assignment])
                .arg("--no-static-membership")
                .args(["--session-timeout", "6s"])
                .args([
                    "--max-records-per-batch",
                    &args.max_records_per_batch.to_string(),
                ]);
            for (k, v) in opts {
                cmd.args(["--kafka-option", &format!("{k}={v}")]);
            }
            let mut child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(std::fs::File::create(&log)?))
                .spawn()
                .context("cannot start a worker")?;
            let stdout = child.stdout.take().context("the worker's stdout")?;
            let counted = counted.clone();
            let reader = std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let Ok(report) = serde_json::from_str::<serde_json::Value>(&line) else {
                        continue;
                    };
                    if let (Some(task), Some(batch), Some(rows)) = (
                        report["task"].as_str(),
                        report["batch_id"].as_u64(),
                        report["input_rows"].as_u64(),
                    ) {
                        counted
                            .lock()
                            .expect("lock")
                            .insert((task.to_owned(), batch), rows);
                    }
                }
            });
            workers.push(WorkerProc {
                child,
                log,
                reader: Some(reader),
            });
        }
        let deadline = started + Duration::from_secs(args.timeout_s);
        let mut first_batch: Option<Duration> = None;
        let total = loop {
            let (total, batches) = {
                let c = counted.lock().expect("lock");
                (c.values().sum::<u64>(), c.len())
            };
            if batches > 0 && first_batch.is_none() {
                first_batch = Some(started.elapsed());
            }
            if total >= args.events {
                break total;
            }
            for w in &mut workers {
                if let Some(status) = w.child.try_wait()? {
                    anyhow::bail!(
                        "{n} workers: a worker exited with {status} after counting {total} of \
                         {} events; its log: {}",
                        args.events,
                        w.log.display()
                    );
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{n} workers counted {total} of {} events in {} s; logs in {}",
                args.events,
                args.timeout_s,
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let seconds = started.elapsed();
        let (tasks, batches) = {
            let c = counted.lock().expect("lock");
            let tasks: std::collections::BTreeSet<&String> = c.keys().map(|(t, _)| t).collect();
            (tasks.len(), c.len())
        };
        for w in workers {
            w.stop()?;
        }
        anyhow::ensure!(
            total == args.events,
            "{n} workers' batches read {total} rows, {} events were produced",
            args.events
        );
        let first = first_batch.unwrap_or(seconds);
        println!(
            "{}",
            json!({
                "workload": "failover-scaling",
                "processor": "counter (wasm)",
                "workers": n,
                "cores": cores,
                "events": args.events,
                "keys": args.keys,
                "topic_partitions": args.topic_partitions,
                "max_records_per_batch": args.max_records_per_batch,
                "tasks": tasks,
                "batches": batches,
                "seconds": secs(seconds),
                "events_per_s": (args.events as f64 / seconds.as_secs_f64()).round(),
                // From starting the workers to the first batch report: joining the
                // group, the first assignment and the first batch.
                "first_batch_seconds": secs(first),
            })
        );
    }
    Ok(())
}
