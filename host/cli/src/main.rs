//! `statebox`: run stateful WebAssembly processors over keyed JSON Lines data.

mod bench;
mod group;
mod job;
mod kafka;
mod plugin;
mod python;
mod scenario;
mod serve;
#[cfg(feature = "sql")]
mod sql;
mod state;
mod tws;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use std::io::IsTerminal;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use statebox_engine::{EventTimeOptions, OutputMode, Query, QueryOptions, TimeMode};
use statebox_runtime::{Limits, Runtime, RuntimeConfig};

// The batch pipeline allocates and frees millions of small buffers per batch; glibc's
// allocator spends a tenth of the run on that, mimalloc a fraction of it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "statebox",
    version,
    about = "Run stateful stream processors as sandboxed WebAssembly components"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a processor over JSON Lines input until all available input is processed.
    Run(Box<RunArgs>),
    /// Run a scenario file: explicit batches, times, restarts and expected output.
    Test(scenario::TestArgs),
    /// Check whether a new processor can run on an existing checkpoint, before deploying it.
    Check(CheckArgs),
    /// Measure throughput of the real pipeline.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Read a checkpoint's state, metadata or progress (read-only; safe while it runs).
    #[command(subcommand)]
    State(state::StateCommand),
    /// Query a checkpoint's state with SQL (read-only; safe while it runs).
    #[cfg(feature = "sql")]
    Sql(sql::SqlArgs),
    /// Serve the multi-tenant HTTP API: tenants, processors, pipelines, output and state.
    Serve(serve::ServeArgs),
    /// Look at a query shared by workers (`statebox run --group`).
    #[command(subcommand)]
    Group(group::GroupCommand),
    /// Build a Python processor file (PySpark's `StatefulProcessor` API) into a component.
    BuildPython(python::BuildPythonArgs),
    /// Drive a processor for PySpark's TwsTester run against the real host (the Python
    /// SDK's `TwsTester(host=True)`): JSON commands on standard input.
    #[command(hide = true)]
    TwsDriver(tws::TwsDriverArgs),
}

#[derive(Args)]
struct CheckArgs {
    /// The new processor: a `.wasm` component or a plugin folder.
    #[arg(long)]
    processor: PathBuf,
    /// The checkpoint it would run on (read-only; may be in use by a running pipeline).
    #[arg(long)]
    checkpoint: PathBuf,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

#[derive(Args)]
struct RunArgs {
    /// The processor: a `.wasm` component, or a plugin folder (built with cargo if needed).
    #[arg(long)]
    processor: PathBuf,
    /// Input JSON Lines file, a directory read file by file in name order, or Kafka topics:
    /// `kafka://HOST:PORT[,HOST:PORT]/TOPIC[,TOPIC]` (each record's value is one JSON row).
    #[arg(long)]
    input: PathBuf,
    /// Output JSON Lines file, appended exactly once per batch; or a Kafka topic,
    /// `kafka://HOST:PORT/TOPIC`, written one transaction per batch.
    #[arg(long)]
    output: PathBuf,
    /// Checkpoint directory (state, offsets, commits).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Grouping key column(s), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    key: Vec<String>,
    /// Number of state partitions (fixed when the checkpoint is created; default 4).
    #[arg(long)]
    partitions: Option<u16>,
    /// Output mode: update or append (fixed when the checkpoint is created; default update).
    #[arg(long)]
    output_mode: Option<OutputMode>,
    /// Time mode: none, processing-time or event-time (fixed per checkpoint; default none).
    #[arg(long)]
    time_mode: Option<TimeMode>,
    /// Files read per micro-batch (default 1; with --max-bytes-per-batch, as many as fit).
    #[arg(long)]
    max_files_per_batch: Option<usize>,
    /// Input bytes read per micro-batch at most, e.g. `64MiB` (as Spark's
    /// `maxBytesPerTrigger`; default: unbounded). A file with more unread bytes is cut at a
    /// line boundary and read on by the next batches; a line longer than this is read
    /// whole; without --max-files-per-batch a batch reads as many files as fit. Bounds the
    /// batch in flight, which `--state-memory` does not count.
    #[arg(long, value_name = "SIZE", value_parser = parse_batch_bytes)]
    max_bytes_per_batch: Option<u64>,
    /// Memory for the query's state, e.g. `512MiB`, `2GiB`: split between the state cache,
    /// RocksDB's block cache (index and filter blocks included) and its memtables. Not
    /// counted: the batch in flight, the processor's WebAssembly memory, code. With
    /// --group, each task's checkpoint has its own state cache and memtables.
    #[arg(long, value_name = "SIZE", default_value = "512MiB", value_parser = parse_state_memory)]
    state_memory: statebox_state::StateMemory,
    /// Input column with each row's event time (epoch ms or ISO-8601); event-time mode.
    #[arg(long, requires = "watermark_delay")]
    event_time: Option<String>,
    /// How far the watermark trails the largest event time seen, e.g. `10s`, `500ms`, `1m`.
    #[arg(long, value_parser = parse_duration_ms, requires = "event_time")]
    watermark_delay: Option<i64>,
    /// Output column with each emitted row's event time (overrides the processor's).
    #[arg(long)]
    output_event_time: Option<String>,
    /// Initial state (JSON Lines file or directory, grouped by the same key columns),
    /// applied in the first batch of a new checkpoint only.
    #[arg(long)]
    initial_state: Option<PathBuf>,
    /// How many of the latest batches keep their change log (`statebox state changes`).
    #[arg(long, default_value_t = statebox_engine::DEFAULT_MIN_BATCHES_TO_RETAIN)]
    min_batches_to_retain: u64,
    /// Keep a snapshot of the state every this many batches (0: none), so reading an
    /// earlier batch (`statebox state read --batch-id`) undoes at most this many batches.
    #[arg(long, default_value_t = statebox_engine::DEFAULT_SNAPSHOT_INTERVAL)]
    snapshot_interval: u64,
    /// Print each batch's commit record (its progress report) as a JSON line on stdout.
    #[arg(long)]
    progress_json: bool,
    /// `available-now` (process what exists, then exit) or `interval=DURATION` (keep
    /// running, one batch per interval, including no-data batches; Ctrl-C stops cleanly).
    #[arg(long, default_value = "available-now", value_parser = parse_trigger)]
    trigger: Trigger,
    #[command(flatten)]
    kafka: kafka::KafkaArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

/// Running one query on several workers (`--group`).
#[derive(Args)]
struct ClusterArgs {
    /// Run as one worker of the query shared by every `statebox run` in Kafka consumer
    /// group NAME: the group assigns the input topic's partitions among the workers, each
    /// partition is a task with its own state, and `--checkpoint` is this worker's local
    /// working directory. Needs Kafka input and output, --state-store and an interval
    /// trigger.
    #[arg(long, value_name = "NAME", requires = "state_store")]
    group: Option<String>,
    /// Where the group's tasks keep their state snapshots and batch plans, reachable by
    /// every worker: `s3://BUCKET/PREFIX` (credentials and endpoint from the AWS_*
    /// environment variables) or a directory (`file:///PATH` or a path; shared by workers
    /// on one machine only).
    #[arg(long, value_name = "URL", requires = "group")]
    state_store: Option<String>,
    /// This worker's stable name in the group (Kafka static membership: a worker that
    /// restarts under the same name within the session timeout keeps its partitions).
    /// Default: host name and process id.
    #[arg(long, requires = "group")]
    member: Option<String>,
    /// How long the group waits for a silent worker (killed, partitioned) before moving
    /// its partitions to the others.
    #[arg(long, default_value = "10s", value_parser = parse_duration_ms)]
    session_timeout: i64,
    /// Join as a dynamic member instead of a static one (no `group.instance.id`): a
    /// restarting worker then rejoins as a new member and the group rebalances, and a gone
    /// worker is removed when its session times out, on brokers that do not expire static
    /// members.
    #[arg(long, requires = "group")]
    no_static_membership: bool,
    /// How the group assigns partitions (librdkafka's `partition.assignment.strategy`):
    /// `cooperative-sticky` moves only the partitions that change owner in a rebalance;
    /// `range` or `roundrobin` (eager) stop every task at each rebalance and restart them,
    /// for brokers whose group coordinator stalls on cooperative rebalances.
    #[arg(long, default_value = "cooperative-sticky", value_parser = ["cooperative-sticky", "range", "roundrobin"])]
    group_assignment: String,
}

/// When batches run.
#[derive(Clone, Copy, Debug)]
enum Trigger {
    /// Process all available input, then exit.
    AvailableNow,
    /// Run a batch every interval until interrupted.
    Interval(Duration),
}

fn parse_trigger(s: &str) -> Result<Trigger, String> {
    if s == "available-now" {
        return Ok(Trigger::AvailableNow);
    }
    match s.strip_prefix("interval=") {
        Some(d) => {
            let ms = parse_duration_ms(d)?;
            if ms <= 0 {
                return Err("the trigger interval must be positive".into());
            }
            Ok(Trigger::Interval(Duration::from_millis(ms as u64)))
        }
        None => Err(format!(
            "unknown trigger `{s}` (expected available-now or interval=DURATION)"
        )),
    }
}

/// Parses `1500`, `1500ms`, `10s`, `5m`, `2h` or `1d` into milliseconds.
pub(crate) fn parse_duration_ms(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("invalid duration `{s}` (e.g. 500ms, 10s, 5m)"))?;
    let factor = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(format!(
                "unknown duration unit `{other}` in `{s}` (use ms, s, m, h or d)"
            ));
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("duration `{s}` is too large"))
}

/// Sandbox limits for every processor call.
#[derive(Args, Clone)]
pub(crate) struct SandboxArgs {
    /// CPU time limit of one processor call, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    call_timeout_ms: u64,
    /// Memory limit of one processor instance, in MiB.
    #[arg(long, default_value_t = 256)]
    memory_limit_mb: usize,
    /// Limit on the rows one call may emit, in MiB.
    #[arg(long, default_value_t = 16)]
    output_limit_mb: usize,
    /// Lets processors send HTTP requests (wasi:http) to HOST or HOST:PORT; repeat for more
    /// hosts. Without it every request is denied. Replays of a batch are deterministic only
    /// as far as the services called are.
    #[arg(long = "allow-http", value_name = "HOST", value_parser = parse_http_host)]
    allow_http: Vec<String>,
    /// Sends the processor's allowed requests to ORIGIN to TARGET instead, path and query
    /// unchanged, e.g. `https://api.example.com=http://127.0.0.1:8080` (a local test double,
    /// an egress proxy); repeat for more. ORIGIN must be granted with --allow-http.
    #[arg(long = "http-route", value_name = "ORIGIN=TARGET", value_parser = parse_http_route)]
    http_route: Vec<String>,
    /// Call the processor key by key even if it takes many keys per call (exports
    /// `batch-processor`): slower, for comparing the two.
    #[arg(long)]
    per_key_calls: bool,
}

fn parse_http_host(s: &str) -> Result<String, String> {
    statebox_runtime::HttpHost::parse(s).map(|h| h.to_string())
}

fn parse_http_route(s: &str) -> Result<String, String> {
    statebox_runtime::HttpRoute::parse(s).map(|r| r.to_string())
}

impl SandboxArgs {
    pub(crate) fn runtime(&self) -> anyhow::Result<Runtime> {
        self.check_http_routes()?;
        Ok(Runtime::new(self.runtime_config())?)
    }

    /// A route grants nothing: its origin must be on the allow-list.
    fn check_http_routes(&self) -> anyhow::Result<()> {
        for route in &self.http_route {
            let route = statebox_runtime::HttpRoute::parse(route).map_err(anyhow::Error::msg)?;
            let origin = route.origin_host();
            let granted = self
                .allow_http
                .iter()
                .any(|h| statebox_runtime::HttpHost::parse(h).is_ok_and(|h| h.covers(&origin)));
            if !granted {
                anyhow::bail!(
                    "--http-route {route}: its origin {origin} is not granted; add --allow-http {origin}"
                );
            }
        }
        Ok(())
    }

    pub(crate) fn runtime_config(&self) -> RuntimeConfig {
        let limits = Limits {
            call_timeout: Duration::from_millis(self.call_timeout_ms),
            memory_bytes: self.memory_limit_mb << 20,
            output_bytes_per_call: self.output_limit_mb << 20,
            http_hosts: self.allow_http.clone(),
            http_routes: self.http_route.clone(),
            ..Limits::default()
        };
        RuntimeConfig {
            cache_dir: cache_dir(),
            cache_max_bytes: Some(statebox_runtime::cache::COMPILED_MAX_BYTES),
            limits,
            per_key_calls: self.per_key_calls,
        }
    }
}

/// Compiled components are cached under `$STATEBOX_CACHE_DIR`, else `$XDG_CACHE_HOME/statebox`
/// or `~/.cache/statebox`.
fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("STATEBOX_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("statebox").join("components"))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STATEBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // `statebox run job.py`: a whole PySpark streaming job script (see `job`).
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if job::is_job(&argv) {
        return match job::run(&argv) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(*args),
        Command::Test(args) => scenario::run(args),
        Command::Check(args) => check(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::State(cmd) => state::run(cmd),
        #[cfg(feature = "sql")]
        Command::Sql(args) => sql::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Group(cmd) => group::run_command(cmd),
        Command::BuildPython(args) => python::run(args),
        Command::TwsDriver(args) => tws::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(args: CheckArgs) -> anyhow::Result<()> {
    let wasm = plugin::resolve(&args.processor)?;
    let runtime = args.sandbox.runtime()?;
    let processor = runtime
        .load_file(&wasm)
        .with_context(|| format!("cannot load processor {}", wasm.display()))?;
    let check = statebox_engine::check_upgrade(&args.checkpoint, &processor)?;
    print!("{check}");
    if !check.is_compatible() {
        anyhow::bail!(
            "processor `{}` is incompatible with checkpoint {}; `statebox run` would refuse it",
            processor.info().name,
            args.checkpoint.display()
        );
    }
    println!("compatible: `statebox run` would accept it");
    Ok(())
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let wasm = plugin::resolve(&args.processor)?;
    let runtime = args.sandbox.runtime()?;
    let processor = runtime
        .load_file(&wasm)
        .with_context(|| format!("cannot load processor {}", wasm.display()))?;
    args.state_memory.configure_rocksdb();
    tracing::info!(state_memory = %args.state_memory, "state memory budget");
    let opts = QueryOptions {
        partitions: args.partitions,
        output_mode: args.output_mode,
        time_mode: args.time_mode,
        // A byte bound alone sizes batches by bytes, as Spark's maxBytesPerTrigger does.
        max_files_per_batch: args
            .max_files_per_batch
            .unwrap_or(match args.max_bytes_per_batch {
                Some(_) => usize::MAX,
                None => 1,
            }),
        max_bytes_per_batch: args.max_bytes_per_batch.unwrap_or(u64::MAX),
        state_cache_bytes: Some(args.state_memory.cache_bytes),
        event_time: args.event_time.clone().map(|column| EventTimeOptions {
            column,
            watermark_delay_ms: args.watermark_delay.unwrap_or(0),
        }),
        output_event_time_column: args.output_event_time.clone(),
        initial_state: args.initial_state.clone(),
        min_batches_to_retain: args.min_batches_to_retain,
        snapshot_interval: args.snapshot_interval,
        ..QueryOptions::new(
            args.input.clone(),
            args.output.clone(),
            args.checkpoint.clone(),
            args.key.clone(),
        )
    };
    if args.max_bytes_per_batch.is_some() && kafka::is_kafka(&opts.input)? {
        anyhow::bail!(
            "--max-bytes-per-batch bounds a file input; a Kafka input's batches are bounded \
             by --max-records-per-batch"
        );
    }
    let bounded = matches!(args.trigger, Trigger::AvailableNow);
    kafka::check_output_key(
        &args.kafka,
        &kafka::Wiring::of(&opts, bounded),
        processor.info(),
    )?;
    if let Some(group) = args.cluster.group.clone() {
        return run_group(args, opts, Arc::new(processor), group);
    }
    let endpoints = kafka::endpoints(&args.kafka, kafka::Wiring::of(&opts, bounded))?;
    let mut query = Query::open_with(opts, Arc::new(processor), endpoints)?;
    let progress_json = args.progress_json;
    let live = std::io::stderr().is_terminal();
    let line_open = std::cell::Cell::new(false);
    let report = |r: &statebox_engine::BatchReport| {
        let (c, t) = (&r.commit, &r.timing);
        if progress_json {
            println!("{}", serde_json::to_string(r).expect("a report serialises"));
        }
        let line = format!(
            "batch {}: {} rows ({} rows/s), {} keys, {} output rows, {} late, {} timers fired, \
             {} expired by TTL, {} state rows, {} timers, watermark {} in {} ms (read {} ms, \
             process {} ms, commit {} ms)",
            c.batch_id,
            c.input_rows,
            t.rows_per_s,
            c.keys,
            c.output_rows,
            c.late_rows,
            c.timers_fired,
            c.ttl_removed,
            c.state_rows_total,
            c.timers_total,
            c.watermark_ms,
            t.duration_ms,
            t.read_ms,
            t.process_ms,
            t.commit_ms
        );
        // On a terminal the line is rewritten in place (a live progress line); in a log
        // every batch keeps its line.
        if live {
            eprint!("\r\x1b[2K{line}");
            line_open.set(true);
        } else {
            eprintln!("{line}");
        }
    };
    let outcome = (|| -> anyhow::Result<()> {
        match args.trigger {
            Trigger::AvailableNow => {
                let reports = query.run_available(report)?;
                if reports.is_empty() {
                    eprintln!(
                        "no new input; output is up to date in {}",
                        args.output.display()
                    );
                }
            }
            Trigger::Interval(every) => {
                let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let flag = stop.clone();
                ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
                    .context("cannot install the Ctrl-C handler")?;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let started = std::time::Instant::now();
                    // Without new input, a tick may still run a no-data batch so timers
                    // and TTL fire (the engine's `idle_tick_runs_no_data`).
                    if let Some(r) = query.run_tick(None)? {
                        report(&r);
                    }
                    let elapsed = started.elapsed();
                    let mut left = every.saturating_sub(elapsed);
                    while !left.is_zero() && !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let step = left.min(Duration::from_millis(50));
                        std::thread::sleep(step);
                        left -= step;
                    }
                }
                if line_open.replace(false) {
                    eprintln!();
                }
                eprintln!("stopped after the last committed batch");
            }
        }
        Ok(())
    })();
    // End the live progress line before any further message.
    if line_open.get() {
        eprintln!();
    }
    outcome
}

/// `statebox run --group`: this process is one worker of the query (see `group`).
fn run_group(
    args: RunArgs,
    opts: QueryOptions,
    processor: Arc<dyn statebox_engine::ProcessorFactory>,
    group: String,
) -> anyhow::Result<()> {
    let Trigger::Interval(every) = args.trigger else {
        anyhow::bail!(
            "--group needs --trigger interval=DURATION: a worker runs until stopped, while \
             the group moves partitions between workers"
        );
    };
    if opts.initial_state.is_some() {
        anyhow::bail!("--initial-state is not supported with --group");
    }
    // The worker's tasks share the state cache's and the memtables' parts of --state-memory
    // (as they share RocksDB's block cache), however many the group gives it.
    let opts = QueryOptions {
        shared_state_cache: opts
            .state_cache_bytes
            .map(statebox_state::SharedCacheBudget::new),
        shared_memtables: Some(Default::default()),
        ..opts
    };
    let (input, source, sink) = kafka::task_options(&args.kafka, kafka::Wiring::of(&opts, false))?;
    let url = args.cluster.state_store.clone().expect("clap requires it");
    let store = statebox_cluster::StateStore::open(&url)
        .with_context(|| format!("cannot open the state store {url}"))?;
    let member = args.cluster.member.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "worker".into());
        format!("{host}-{}", std::process::id())
    });
    let progress_json = args.progress_json;
    let report = Arc::new(move |task: &str, r: &statebox_engine::BatchReport| {
        if progress_json {
            let mut v = serde_json::to_value(r).expect("a report serialises");
            v["task"] = serde_json::Value::from(task);
            println!("{v}");
        }
        let c = &r.commit;
        eprintln!(
            "task {task} batch {}: {} rows, {} output rows in {} ms",
            c.batch_id, c.input_rows, c.output_rows, r.timing.duration_ms
        );
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
        .context("cannot install the Ctrl-C handler")?;
    group::run(
        group::Worker {
            group,
            member,
            session_timeout_ms: args.cluster.session_timeout.max(1) as u64,
            assignment_strategy: args.cluster.group_assignment.clone(),
            static_membership: !args.cluster.no_static_membership,
            input,
            source,
            sink,
            opts,
            store,
            processor,
            every,
            report,
        },
        stop,
    )?;
    eprintln!("stopped after each task's last committed batch");
    Ok(())
}

/// Parses `--state-memory` (clap names the flag in the error).
pub(crate) fn parse_state_memory(s: &str) -> Result<statebox_state::StateMemory, String> {
    statebox_state::StateMemory::parse(s).map_err(|e| e.to_string())
}

/// Parses `--max-bytes-per-batch`: a size of at least one byte.
pub(crate) fn parse_batch_bytes(s: &str) -> Result<u64, String> {
    match statebox_state::memory::parse_size(s).map_err(|e| e.to_string())? {
        0 => Err("a batch must be allowed at least 1 byte".into()),
        n => Ok(n as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `statebox run`'s command line with its required flags and `flag`, parsed.
    fn parse_run(flag: &str) -> Result<Cli, String> {
        use clap::Parser;
        Cli::try_parse_from([
            "statebox",
            "run",
            "--processor=p.wasm",
            "--input=in",
            "--output=out",
            "--checkpoint=cp",
            "--key=k",
            flag,
        ])
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_bad_state_memory_is_refused_naming_the_flag() {
        let run = |memory: &str| parse_run(&format!("--state-memory={memory}")).map(|_| ());
        let e = run("8MiB").unwrap_err();
        assert!(e.contains("--state-memory"), "{e}");
        assert!(
            e.contains("8 MiB is below the minimum state memory of 32 MiB"),
            "{e}"
        );
        let e = run("a lot").unwrap_err();
        assert!(e.contains("--state-memory"), "{e}");
        assert!(e.contains("`a lot` is not a size"), "{e}");
        run("1GiB").unwrap();
    }

    #[test]
    fn max_bytes_per_batch_takes_a_size_of_at_least_one_byte() {
        let run = |bytes: &str| parse_run(&format!("--max-bytes-per-batch={bytes}"));
        let bytes = |bytes: &str| match run(bytes).expect("parses").command {
            Command::Run(args) => args.max_bytes_per_batch,
            _ => unreachable!("a run"),
        };
        assert_eq!(bytes("64MiB"), Some(64 << 20));
        assert_eq!(bytes("1000"), Some(1000));
        for (bad, why) in [("0", "at least 1 byte"), ("lots", "`lots` is not a size")] {
            let e = run(bad).map(|_| ()).unwrap_err();
            assert!(e.contains("--max-bytes-per-batch"), "{e}");
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration_ms("1500"), Ok(1500));
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("5m"), Ok(300_000));
        assert!(parse_duration_ms("10 parsecs").is_err());
        assert!(parse_duration_ms("s").is_err());
    }

    #[test]
    fn triggers_parse() {
        assert!(matches!(
            parse_trigger("available-now"),
            Ok(Trigger::AvailableNow)
        ));
        assert!(
            matches!(parse_trigger("interval=1s"), Ok(Trigger::Interval(d)) if d == Duration::from_secs(1))
        );
        assert!(parse_trigger("interval=0s").is_err());
        assert!(parse_trigger("sometimes").is_err());
    }
}
