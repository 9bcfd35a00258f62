//! `statebox bench`: throughput of the real pipeline (files in, RocksDB state, files out),
//! for the WebAssembly processor and for the same logic compiled into the host.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use statebox_engine::testing::NativeCounter;
use statebox_engine::{
    BatchReport, BatchTimes, InstanceConfig, KeyRows, PartitionBatch, PartitionProcessor,
    ProcessorFactory, Query, QueryOptions, TimeMode,
};

use crate::SandboxArgs;

mod failover;
mod peers;

#[derive(Subcommand)]
pub(crate) enum BenchCommand {
    /// The counter workload: every key's count, list and map updated once per batch.
    Count(CountArgs),
    /// Timers: `heartbeat-monitor`; every key seen re-arms a processing-time timer, and a
    /// tenth of the keys skip each batch, so their timers fire.
    Timers(TimeArgs),
    /// TTL: `dedup-ttl`; ids are remembered with a TTL and expire as batch time advances.
    Ttl(TimeArgs),
    /// `statebox serve` under load: concurrent ingest requests over loopback HTTP across
    /// several tenants (one `counter` pipeline each); sustained rows/s and ack latency.
    Serve(ServeArgs),
    /// Cold start per guest language (the counter in Rust, Python and JavaScript): component
    /// size, compile time, loading the compiled code from the cache, instantiate + `init`,
    /// and the first and next call.
    Startup(StartupArgs),
    /// Kafka to Kafka: the counter from one topic to another, exactly once, next to the
    /// same events from files (`bench count`) in the same run; then the end-to-end latency
    /// (produce → output committed and visible) with `--trigger interval=100ms`.
    Kafka(KafkaArgs),
    /// The counter workload on Statebox, Flink 2.3 and Spark 4.3 side by side: the input
    /// generated once, every engine run on it in the same run (peers installed by
    /// `bench/peers/setup.sh`); one JSON line per engine, then a table.
    Peers(peers::PeersArgs),
    /// A query shared by workers (`statebox run --group`): the recovery time of a task
    /// with `--state-mb` of state (snapshot download + replay of the logged plans), and
    /// with `--brokers`, throughput with 1, 2 and 3 worker processes.
    Failover(failover::FailoverArgs),
}

#[derive(Args)]
pub(crate) struct KafkaArgs {
    /// The Kafka brokers, `HOST:PORT[,HOST:PORT]`; each run creates two new topics there.
    #[arg(long)]
    brokers: String,
    /// Events to generate.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Partitions of the input and output topics.
    #[arg(long, default_value_t = 4)]
    topic_partitions: i32,
    /// State partitions.
    #[arg(long, default_value_t = 4)]
    partitions: u16,
    /// Records per micro-batch in the throughput run (default: everything in one batch,
    /// as `bench count` reads one file).
    #[arg(long)]
    max_records_per_batch: Option<u64>,
    /// Latency probes, one every 50 ms.
    #[arg(long, default_value_t = 200)]
    probes: u64,
    /// A librdkafka client setting; repeat for more.
    #[arg(long = "kafka-option", value_name = "KEY=VALUE", value_parser = parse_kafka_option)]
    kafka_options: Vec<(String, String)>,
    /// A librdkafka setting of the benchmark's own event producer only (not of Statebox's
    /// clients); repeat for more. On tansu 0.6, `batch.num.messages=1`: after a batch of
    /// several records its end offsets are short, and the run would stop early.
    #[arg(long = "producer-option", value_name = "KEY=VALUE", value_parser = parse_kafka_option)]
    producer_options: Vec<(String, String)>,
    /// The counter component (default: build plugins/counter).
    #[arg(long)]
    processor: Option<PathBuf>,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

fn parse_kafka_option(s: &str) -> Result<(String, String), String> {
    statebox_kafka::parse_option(s).map_err(|e| e.to_string())
}

#[derive(Args)]
pub(crate) struct StartupArgs {
    /// Repetitions of each measurement after the compile; medians are printed.
    #[arg(long, default_value_t = 7)]
    runs: usize,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

#[derive(Args)]
pub(crate) struct TimeArgs {
    /// Events to generate.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Micro-batches the events are split into.
    #[arg(long, default_value_t = 10)]
    batches: u64,
    /// Batch timestamps advance by this many milliseconds per batch.
    #[arg(long, default_value_t = 60_000)]
    step_ms: i64,
    /// State partitions.
    #[arg(long, default_value_t = 4)]
    partitions: u16,
    /// The component (default: build the workload's plugin).
    #[arg(long)]
    processor: Option<PathBuf>,
    /// After the summary, one JSON line per batch: input rows, keys, timers fired and values
    /// expired, read, process (of which timers and TTL cleanup) and commit milliseconds, and
    /// the batch's time relative to the first's.
    #[arg(long)]
    per_batch: bool,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Engine {
    /// The `counter` plugin, run as a WebAssembly component.
    Wasm,
    /// The same logic compiled into the host.
    Native,
    /// Both, one after the other.
    All,
    /// The Python counter (`plugins/counter-py`, built with the Python SDK), next to the
    /// Rust `counter` component.
    Python,
}

#[derive(Args)]
pub(crate) struct CountArgs {
    /// Events to generate.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Micro-batches (input files) the events are split into.
    #[arg(long, default_value_t = 1)]
    batches: u64,
    /// State partitions.
    #[arg(long, default_value_t = 4)]
    partitions: u16,
    /// Which engine(s) to measure.
    #[arg(long, value_enum, default_value_t = Engine::All)]
    engine: Engine,
    /// The counter component (default: build plugins/counter).
    #[arg(long)]
    processor: Option<PathBuf>,
    /// After each engine's summary, one JSON line per batch: its input rows, keys, and
    /// read, process and commit milliseconds, and its time relative to the first batch's.
    #[arg(long)]
    per_batch: bool,
    /// Memory for the query's state, as `statebox run --state-memory`; the summary shows
    /// it next to the process's peak resident memory.
    #[arg(long, value_name = "SIZE", default_value = "512MiB", value_parser = crate::parse_state_memory)]
    state_memory: statebox_state::StateMemory,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

pub(crate) fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Count(args) => count(args),
        BenchCommand::Timers(args) => timed("timers", "heartbeat-monitor", "sensor", args),
        BenchCommand::Ttl(args) => timed("ttl", "dedup-ttl", "id", args),
        BenchCommand::Serve(args) => serve(args),
        BenchCommand::Startup(args) => startup(args),
        BenchCommand::Kafka(args) => kafka(args),
        BenchCommand::Peers(args) => peers::run(args),
        BenchCommand::Failover(args) => failover::run(args),
    }
}

/// Runs a processing-time workload batch by batch with batch timestamps `step_ms` apart.
/// Keys whose number is congruent to the batch number modulo 10 sit the batch out, so
/// timers of about a tenth of the keys fire (and TTL'd state of a tenth expires) per batch.
fn timed(workload: &str, plugin: &str, column: &str, args: TimeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.keys > 0 && args.events > 0 && args.batches > 0 && args.step_ms > 0,
        "--events, --keys, --batches and --step-ms must be positive"
    );
    let scratch = scratch_dir()?;
    let dir = scratch.path();
    let input = dir.join("input");
    std::fs::create_dir_all(&input)?;
    let per_batch = args.events.div_ceil(args.batches);
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut written = 0;
    for b in 0..args.batches {
        let file = std::fs::File::create(input.join(format!("part-{b:05}.jsonl")))?;
        let mut w = std::io::BufWriter::new(file);
        for _ in 0..per_batch.min(args.events - written) {
            let k = loop {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let k = state % args.keys;
                if k % 10 != b % 10 {
                    break k;
                }
            };
            writeln!(w, "{{\"{column}\":\"k{k}\",\"seq\":{written}}}")?;
            written += 1;
        }
        // Make the generated input durable before timing starts: otherwise the first
        // commit's fsync (ext4 journals in order) would pay for writing the input back.
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    let wasm = match &args.processor {
        Some(p) => crate::plugin::resolve(p)?,
        None => crate::plugin::resolve(&workspace_root().join("plugins").join(plugin))?,
    };
    let runtime = args.sandbox.runtime()?;
    let processor = runtime.load_file(&wasm)?;
    let opts = QueryOptions {
        partitions: Some(args.partitions),
        time_mode: Some(statebox_engine::TimeMode::ProcessingTime),
        ..QueryOptions::new(
            input,
            dir.join("out.jsonl"),
            dir.join("checkpoint"),
            vec![column.into()],
        )
    };
    let started = Instant::now();
    let mut query = Query::open(opts, Arc::new(processor))?;
    let mut reports = Vec::new();
    let mut at = 1_000_000;
    while let Some(r) = query.run_next(Some(at))? {
        reports.push(r);
        at += args.step_ms;
    }
    // A snapshot the last batch started is part of the run's work.
    query.wait_for_snapshot();
    let seconds = started.elapsed().as_secs_f64();
    let sum = |f: fn(&BatchReport) -> u64| reports.iter().map(f).sum::<u64>();
    let events = sum(|r| r.commit.input_rows);
    let timers = sum(|r| r.commit.timers_fired);
    let expired = sum(|r| r.commit.ttl_removed);
    let batches = reports.len();
    anyhow::ensure!(
        events == args.events,
        "processed {events} of {} events",
        args.events
    );
    let line = json!({
        "workload": workload,
        "engine": "wasm",
        "events": events,
        "keys": args.keys,
        "batches": batches,
        "partitions": args.partitions,
        "seconds": (seconds * 1000.0).round() / 1000.0,
        "events_per_s": (events as f64 / seconds).round(),
        "timers_fired": timers,
        "timers_fired_per_s": (timers as f64 / seconds).round(),
        "ttl_removed": expired,
        "ttl_removed_per_s": (expired as f64 / seconds).round(),
        "slowest_batch_vs_first": slowest_vs_first(&reports),
        "rocksdb": rocksdb_library(),
    });
    println!("{line}");
    if args.per_batch {
        for line in batch_lines("wasm", &reports) {
            println!("{line}");
        }
    }
    Ok(())
}

/// The slowest batch's wall time over the first's: with state growing batch by batch, how
/// much dearer a batch got (1.0 when every batch took as long as the first).
fn slowest_vs_first(reports: &[BatchReport]) -> Option<f64> {
    let first = reports.first()?.timing.duration_ms.max(1) as f64;
    let slowest = reports.iter().map(|r| r.timing.duration_ms).max()? as f64;
    Some((slowest / first * 100.0).round() / 100.0)
}

/// One line per batch, from the batch's report.
fn batch_lines(engine: &str, reports: &[BatchReport]) -> Vec<serde_json::Value> {
    let first = reports.first().map_or(1, |r| r.timing.duration_ms.max(1)) as f64;
    reports
        .iter()
        .map(|r| {
            let (c, t) = (&r.commit, &r.timing);
            json!({
                "engine": engine,
                "batch": c.batch_id,
                "input_rows": c.input_rows,
                "keys": c.keys,
                "timers_fired": c.timers_fired,
                "ttl_removed": c.ttl_removed,
                "read_ms": t.read_ms,
                "process_ms": t.process_ms,
                "timers_ms": t.timers_ms,
                "ttl_ms": t.ttl_ms,
                "commit_ms": t.commit_ms,
                "duration_ms": t.duration_ms,
                "vs_first": (t.duration_ms as f64 / first * 100.0).round() / 100.0,
            })
        })
        .collect()
}

fn count(args: CountArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.keys > 0 && args.events > 0 && args.batches > 0,
        "--events, --keys and --batches must be positive"
    );
    let scratch = scratch_dir()?;
    let dir = scratch.path();
    let input = dir.join("input");
    generate_count_input(&input, args.events, args.keys, args.batches)?;
    let names: &[&'static str] = match args.engine {
        Engine::Python => &["python", "wasm"],
        Engine::Wasm => &["wasm"],
        Engine::Native => &["native"],
        Engine::All => &["wasm", "native"],
    };
    let mut engines = Vec::new();
    for &name in names {
        engines.push((
            name,
            counter_factory(name, &args.sandbox, args.processor.as_deref())?,
        ));
    }
    args.state_memory.configure_rocksdb();
    for (name, factory) in engines {
        // Each engine's peak is its own: the previous engine's checkpoint is closed.
        reset_peak_rss();
        let run = run_count(
            name,
            factory,
            &input,
            dir,
            args.partitions,
            args.events,
            &args.state_memory,
        )?;
        println!("{}", run.summary(args.keys, args.batches, args.partitions));
        if args.per_batch {
            for line in run.batch_lines() {
                println!("{line}");
            }
        }
    }
    Ok(())
}

/// The counter processor of a Statebox engine: `wasm` (the `counter` plugin, or
/// `processor` if given), `python` (`plugins/counter-py`) or `native` (the same logic as
/// `counter` compiled into the host).
fn counter_factory(
    engine: &str,
    sandbox: &SandboxArgs,
    processor: Option<&Path>,
) -> anyhow::Result<Arc<dyn ProcessorFactory>> {
    let plugin = match (engine, processor) {
        ("native", _) => return Ok(Arc::new(NativeCounter::new())),
        ("wasm", Some(p)) => crate::plugin::resolve(p)?,
        ("wasm", None) => crate::plugin::resolve(&workspace_root().join("plugins/counter"))?,
        ("python", _) => crate::plugin::resolve(&workspace_root().join("plugins/counter-py"))?,
        _ => anyhow::bail!("no Statebox counter engine named {engine}"),
    };
    Ok(Arc::new(sandbox.runtime()?.load_file(&plugin)?))
}

/// One Statebox engine's run of the counter workload.
struct CountRun {
    engine: &'static str,
    events: u64,
    seconds: f64,
    output_rows: u64,
    batches: Vec<statebox_engine::BatchReport>,
    /// The state memory budget (`--state-memory`).
    state_memory_bytes: usize,
    /// The process's peak resident memory during the run (see [`peak_rss_bytes`]).
    peak_rss_bytes: u64,
}

/// Runs the counter `factory` over `input` (the files of [`generate_count_input`]) into a
/// fresh checkpoint under `dir/engine`, and checks that it read `events` rows.
fn run_count(
    engine: &'static str,
    factory: Arc<dyn ProcessorFactory>,
    input: &Path,
    dir: &Path,
    partitions: u16,
    events: u64,
    memory: &statebox_state::StateMemory,
) -> anyhow::Result<CountRun> {
    let run_dir = dir.join(engine);
    let opts = QueryOptions {
        partitions: Some(partitions),
        state_cache_bytes: Some(memory.cache_bytes),
        ..QueryOptions::new(
            input.to_owned(),
            run_dir.join("out.jsonl"),
            run_dir.join("checkpoint"),
            vec!["key".into()],
        )
    };
    let started = Instant::now();
    let mut query = Query::open(opts, factory)?;
    let reports = query.run_available(|_| {})?;
    query.wait_for_snapshot();
    let seconds = started.elapsed().as_secs_f64();
    let peak_rss_bytes = peak_rss_bytes()?;
    let input_rows: u64 = reports.iter().map(|r| r.commit.input_rows).sum();
    anyhow::ensure!(
        input_rows == events,
        "{engine}: processed {input_rows} of {events} events"
    );
    Ok(CountRun {
        engine,
        events,
        seconds,
        output_rows: reports.iter().map(|r| r.commit.output_rows).sum(),
        batches: reports,
        state_memory_bytes: memory.total_bytes,
        peak_rss_bytes,
    })
}

impl CountRun {
    fn events_per_s(&self) -> f64 {
        (self.events as f64 / self.seconds).round()
    }

    /// The slowest batch's wall time over the first's: with state growing batch by batch,
    /// how much dearer a batch got (1.0 when every batch took as long as the first).
    fn slowest_vs_first(&self) -> Option<f64> {
        slowest_vs_first(&self.batches)
    }

    fn summary(&self, keys: u64, batches: u64, partitions: u16) -> serde_json::Value {
        json!({
            "workload": "count",
            "engine": self.engine,
            "events": self.events,
            "keys": keys,
            "batches": batches,
            "partitions": partitions,
            "seconds": (self.seconds * 1000.0).round() / 1000.0,
            "events_per_s": self.events_per_s(),
            "output_rows": self.output_rows,
            "slowest_batch_vs_first": self.slowest_vs_first(),
            "state_memory_mib": mib(self.state_memory_bytes as u64),
            "peak_rss_mib": mib(self.peak_rss_bytes),
            "rocksdb": rocksdb_library(),
        })
    }

    /// One line per batch, from the batch's commit record.
    fn batch_lines(&self) -> Vec<serde_json::Value> {
        let first = self
            .batches
            .first()
            .map_or(1, |r| r.timing.duration_ms.max(1)) as f64;
        self.batches
            .iter()
            .map(|r| {
                let (c, t) = (&r.commit, &r.timing);
                json!({
                    "engine": self.engine,
                    "batch": c.batch_id,
                    "input_rows": c.input_rows,
                    "keys": c.keys,
                    "read_ms": t.read_ms,
                    "process_ms": t.process_ms,
                    "commit_ms": t.commit_ms,
                    "duration_ms": t.duration_ms,
                    "vs_first": (t.duration_ms as f64 / first * 100.0).round() / 100.0,
                })
            })
            .collect()
    }
}

/// The RocksDB this process runs on, for a summary line: the shared library's path (`null`
/// when linked in statically) and whether it was built with assertions on. Builds link the
/// release library `host/state/install-rocksdb.sh` installs, which has them off, where it is
/// installed; Debian's librocksdb, which a build made without it links, has them on (no
/// `-DNDEBUG`), and a batch's commit takes about a third longer on it (README, "RocksDB built
/// with assertions").
fn rocksdb_library() -> serde_json::Value {
    let library = std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|maps| {
            maps.lines()
                .filter_map(|line| line.split_whitespace().nth(5))
                .find(|path| {
                    path.rsplit('/')
                        .next()
                        .is_some_and(|file| file.starts_with("librocksdb.so"))
                })
                .map(str::to_owned)
        });
    // RocksDB compiles its test sync points only where assertions are on.
    let sync_points = c"_ZN7rocksdb9SyncPoint11GetInstanceEv";
    // SAFETY: dlsym only looks the NUL-terminated name up; the result is not called.
    let assertions = unsafe { !libc::dlsym(libc::RTLD_DEFAULT, sync_points.as_ptr()).is_null() };
    json!({ "library": library, "assertions": assertions })
}

/// Bytes in MiB, one decimal.
fn mib(bytes: u64) -> f64 {
    (bytes as f64 / f64::from(1 << 20) * 10.0).round() / 10.0
}

/// The process's peak resident memory (`VmHWM` of `/proc/self/status`) since it started or
/// since the last [`reset_peak_rss`].
fn peak_rss_bytes() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .context("cannot read /proc/self/status for the peak resident memory")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .context("/proc/self/status has no VmHWM line")?;
    Ok(kib * 1024)
}

/// Resets the peak resident memory to the current one (Linux: `5` to
/// `/proc/self/clear_refs`), so the next [`peak_rss_bytes`] is the peak of what runs in
/// between. Where that is refused, the peak stays the process's, which is never lower.
fn reset_peak_rss() {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        tracing::debug!(error = %e, "cannot reset the peak resident memory");
    }
}

fn startup(args: StartupArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.runs > 0, "--runs must be positive");
    let ms = |d: std::time::Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    let us = |d: std::time::Duration| (d.as_secs_f64() * 1e7).round() / 10.0;
    let median = |mut v: Vec<std::time::Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let key = r#"["u1"]"#;
    let rows = [r#"{"user":"u1"}"#];
    for (language, plugin) in [
        ("rust", "counter"),
        ("python", "counter-py"),
        ("javascript", "counter-js"),
    ] {
        let wasm = crate::plugin::resolve(&workspace_root().join("plugins").join(plugin))?;
        let bytes = std::fs::metadata(&wasm)
            .with_context(|| format!("read {}", wasm.display()))?
            .len();
        let scratch = scratch_dir()?;
        // A cache of its own, so the first load compiles.
        let mut config = args.sandbox.runtime_config();
        config.cache_dir = Some(scratch.path().join("compiled"));
        let runtime = statebox_runtime::Runtime::new(config)?;
        let started = Instant::now();
        runtime.load_file(&wasm)?;
        let compile = started.elapsed();
        let (mut load, mut init, mut first, mut next) = (vec![], vec![], vec![], vec![]);
        for run in 0..args.runs {
            let started = Instant::now();
            let processor = runtime.load_file(&wasm)?;
            load.push(started.elapsed());
            let checkpoint =
                statebox_state::Checkpoint::open(&scratch.path().join(run.to_string()))?;
            let started = Instant::now();
            let mut instance = processor.instantiate(InstanceConfig {
                query_id: "bench".into(),
                run_id: "bench".into(),
                ..InstanceConfig::detached(TimeMode::None)
            })?;
            init.push(started.elapsed());
            let times = BatchTimes {
                batch_id: 0,
                batch_timestamp_ms: 0,
                watermark_ms: -1,
            };
            let mut batch = PartitionBatch::new(checkpoint.txn(0), times);
            instance.start_batch();
            for timings in [&mut first, &mut next] {
                let started = Instant::now();
                instance
                    .handle_input_batch(&mut batch, &[KeyRows { key, rows: &rows }])
                    .map_err(|f| f.error)?;
                timings.push(started.elapsed());
            }
        }
        let line = json!({
            "workload": "startup",
            "language": language,
            "plugin": plugin,
            "component_bytes": bytes,
            "compile_ms": ms(compile),
            "load_cached_ms": ms(median(load)),
            "instantiate_init_ms": ms(median(init)),
            "first_call_us": us(median(first)),
            "next_call_us": us(median(next)),
        });
        println!("{line}");
    }
    Ok(())
}

fn workspace_root() -> PathBuf {
    // The CLI lives in host/cli; the plugins are two levels up.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A temporary directory for a benchmark's data, removed when dropped (also on errors).
/// Sends the rows `generate_count_input` wrote (one file) to `topic`, keyed by their key
/// column, and waits until all are acknowledged; the seconds it took.
fn produce_generated(
    producer: &statebox_kafka::client::RowProducer,
    input: &Path,
    topic: &str,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let text = std::fs::read_to_string(input.join("part-00000.jsonl"))?;
    for line in text.lines() {
        let key = line
            .split('"')
            .nth(3)
            .context("generated rows have a string key")?;
        producer.send(topic, key, line)?;
    }
    producer.flush()?;
    Ok(started.elapsed().as_secs_f64())
}

fn scratch_dir() -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("statebox-bench-")
        .tempdir()
        .context("cannot create a temporary directory")
}

/// Writes `batches` files of events `{"key": "k<n>", "value": <i>}` over `keys` keys,
/// chosen by a fixed pseudo-random sequence so every run sees the same data.
fn generate_count_input(dir: &Path, events: u64, keys: u64, batches: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let per_batch = events.div_ceil(batches);
    let mut written = 0;
    for b in 0..batches {
        let file = std::fs::File::create(dir.join(format!("part-{b:05}.jsonl")))?;
        let mut w = std::io::BufWriter::new(file);
        for _ in 0..per_batch.min(events - written) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            writeln!(w, "{{\"key\":\"k{}\",\"value\":{written}}}", state % keys)?;
            written += 1;
        }
        // Make the generated input durable before timing starts: otherwise the first
        // commit's fsync (ext4 journals in order) would pay for writing the input back.
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    Ok(())
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Tenants, each with one pipeline.
    #[arg(long, default_value_t = 4)]
    tenants: usize,
    /// Concurrent clients per tenant.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Requests per client, sent one after the other.
    #[arg(long, default_value_t = 100)]
    requests: usize,
    /// Rows per request.
    #[arg(long, default_value_t = 100)]
    rows: usize,
    /// Distinct keys per pipeline.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// The counter component (default: build plugins/counter).
    #[arg(long)]
    processor: Option<PathBuf>,
}

/// Runs the server load test and prints its report as one JSON line.
fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let processor = match &args.processor {
        Some(p) => crate::plugin::resolve(p)?,
        None => crate::plugin::resolve(&workspace_root().join("plugins/counter"))?,
    };
    let report = statebox_server::bench::run(statebox_server::bench::BenchOptions {
        processor,
        tenants: args.tenants,
        clients_per_tenant: args.clients,
        requests_per_client: args.requests,
        rows_per_request: args.rows,
        keys: args.keys,
    })?;
    println!("{report}");
    Ok(())
}

/// `bench kafka`: see [`BenchCommand::Kafka`].
fn kafka(args: KafkaArgs) -> anyhow::Result<()> {
    use statebox_engine::Endpoints;
    use statebox_kafka::client::{RowProducer, TopicWatcher};
    use statebox_kafka::{
        Delivery, KafkaSink, KafkaSource, KafkaUrl, SinkOptions, SourceOptions, StartingOffsets,
    };
    anyhow::ensure!(
        args.keys > 0 && args.events > 0 && args.topic_partitions > 0,
        "--events, --keys and --topic-partitions must be positive"
    );
    let opts = &args.kafka_options;
    let wasm = match &args.processor {
        Some(p) => crate::plugin::resolve(p)?,
        None => crate::plugin::resolve(&workspace_root().join("plugins/counter"))?,
    };
    let runtime = args.sandbox.runtime()?;
    let processor: Arc<dyn ProcessorFactory> = Arc::new(runtime.load_file(&wasm)?);
    let scratch = scratch_dir()?;
    let dir = scratch.path();
    let input = dir.join("input");
    generate_count_input(&input, args.events, args.keys, 1)?;

    // Files, as `bench count` runs them.
    let options = |checkpoint: &str| QueryOptions {
        partitions: Some(args.partitions),
        ..QueryOptions::new(
            input.clone(),
            dir.join(format!("{checkpoint}.jsonl")),
            dir.join(checkpoint),
            vec!["key".into()],
        )
    };
    let started = Instant::now();
    let mut query = Query::open(options("files"), processor.clone())?;
    let reports = query.run_available(|_| {})?;
    query.wait_for_snapshot();
    let file_seconds = started.elapsed().as_secs_f64();
    let input_rows: u64 = reports.iter().map(|r| r.commit.input_rows).sum();
    anyhow::ensure!(input_rows == args.events, "files: read {input_rows} events");
    drop(query);

    // The same events in a topic.
    let run_id = std::process::id();
    let (in_topic, out_topic) = (
        format!("statebox-bench-{run_id}-in"),
        format!("statebox-bench-{run_id}-out"),
    );
    for t in [&in_topic, &out_topic] {
        statebox_kafka::create_topic(&args.brokers, opts, t, args.topic_partitions)?;
    }
    let producer_opts: Vec<(String, String)> =
        opts.iter().chain(&args.producer_options).cloned().collect();
    let producer = RowProducer::new(&args.brokers, &producer_opts)?;
    let produce_seconds = produce_generated(&producer, &input, &in_topic)?;

    let url = |topic: &str| KafkaUrl {
        brokers: args.brokers.clone(),
        topics: vec![topic.to_owned()],
    };
    let endpoints = |bounded: bool, max: Option<u64>| -> anyhow::Result<Endpoints> {
        Ok(Endpoints {
            source: Some(Box::new(KafkaSource::new(SourceOptions {
                url: url(&in_topic),
                client_options: opts.clone(),
                starting_offsets: if bounded {
                    StartingOffsets::Earliest
                } else {
                    StartingOffsets::Latest
                },
                max_records_per_batch: max,
                bounded,
                columns: Vec::new(),
                idle_timeout_ms: statebox_kafka::DEFAULT_IDLE_TIMEOUT_MS,
                ..Default::default()
            })?)),
            sink: Some(Box::new(KafkaSink::new(SinkOptions {
                url: url(&out_topic),
                client_options: opts.clone(),
                key_columns: vec!["key".into()],
                delivery: Delivery::ExactlyOnce,
                ..Default::default()
            })?)),
            plans: None,
        })
    };
    let started = Instant::now();
    let mut query = Query::open_with(
        options("kafka"),
        processor.clone(),
        endpoints(true, args.max_records_per_batch)?,
    )?;
    let reports = query.run_available(|_| {})?;
    query.wait_for_snapshot();
    let kafka_seconds = started.elapsed().as_secs_f64();
    let kafka_rows: u64 = reports.iter().map(|r| r.commit.input_rows).sum();
    anyhow::ensure!(kafka_rows == args.events, "kafka: read {kafka_rows} events");
    let output_rows: u64 = reports.iter().map(|r| r.commit.output_rows).sum();
    drop(query);
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    println!(
        "{}",
        json!({
            "workload": "count", "source": "files", "sink": "file",
            "events": args.events, "keys": args.keys, "partitions": args.partitions,
            "seconds": round(file_seconds),
            "events_per_s": (args.events as f64 / file_seconds).round(),
        })
    );
    println!(
        "{}",
        json!({
            "workload": "count", "source": "kafka", "sink": "kafka (exactly once)",
            "events": args.events, "keys": args.keys, "partitions": args.partitions,
            "topic_partitions": args.topic_partitions, "batches": reports.len(),
            "output_rows": output_rows,
            "seconds": round(kafka_seconds),
            "events_per_s": (args.events as f64 / kafka_seconds).round(),
            "produce_events_per_s": (args.events as f64 / produce_seconds).round(),
        })
    );

    // Latency: a query with an interval trigger of 100 ms, new events one every 50 ms,
    // each with a fresh key, and a read_committed consumer of the output that notes when
    // each key's row appears.
    let interval = std::time::Duration::from_millis(100);
    let mut query = Query::open_with(options("latency"), processor, endpoints(false, None)?)?;
    let watcher = TopicWatcher::new(&args.brokers, opts, &out_topic)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let sent: Mutex<std::collections::HashMap<String, Instant>> = Mutex::default();
    let mut latencies: Vec<f64> = Vec::new();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let runner = s.spawn(|| -> anyhow::Result<()> {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let t = Instant::now();
                query.run_next(None)?;
                std::thread::sleep(interval.saturating_sub(t.elapsed()));
            }
            Ok(())
        });
        let sender = s.spawn(|| -> anyhow::Result<()> {
            for i in 0..args.probes {
                let key = format!("probe-{i}");
                sent.lock()
                    .expect("lock")
                    .insert(key.clone(), Instant::now());
                producer.send(&in_topic, &key, &json!({ "key": key }).to_string())?;
                producer.flush()?;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Ok(())
        });
        let deadline = Instant::now() + std::time::Duration::from_secs(60 + args.probes / 10);
        while (latencies.len() as u64) < args.probes && Instant::now() < deadline {
            if let Some((Some(key), _)) = watcher.next(std::time::Duration::from_millis(100))
                && let Some(at) = sent.lock().expect("lock").remove(&key)
            {
                latencies.push(at.elapsed().as_secs_f64() * 1000.0);
            }
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        sender.join().expect("the sender")?;
        runner.join().expect("the runner")?;
        Ok(())
    })?;
    anyhow::ensure!(
        latencies.len() as u64 == args.probes,
        "only {} of {} probes came through",
        latencies.len(),
        args.probes
    );
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
    println!(
        "{}",
        json!({
            "workload": "latency", "source": "kafka", "sink": "kafka (exactly once)",
            "trigger": "interval=100ms", "probes": args.probes,
            "p50_ms": (pct(0.5) * 10.0).round() / 10.0,
            "p99_ms": (pct(0.99) * 10.0).round() / 10.0,
            "max_ms": (pct(1.0) * 10.0).round() / 10.0,
        })
    );
    Ok(())
}
