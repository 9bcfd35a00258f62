//! `statebox`: run stateful WebAssembly processors over keyed JSON Lines data.

mod bench;
mod plugin;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use statebox_engine::{OutputMode, Query, QueryOptions, TimeMode};
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
    Run(RunArgs),
    /// Measure throughput of the real pipeline.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

#[derive(Args)]
struct RunArgs {
    /// The processor: a `.wasm` component, or a plugin folder (built with cargo if needed).
    #[arg(long)]
    processor: PathBuf,
    /// Input JSON Lines file, or a directory read file by file in name order.
    #[arg(long)]
    input: PathBuf,
    /// Output JSON Lines file; emitted rows are appended exactly once per batch.
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
    /// Files read per micro-batch.
    #[arg(long, default_value_t = 1)]
    max_files_per_batch: usize,
    #[command(flatten)]
    sandbox: SandboxArgs,
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
}

impl SandboxArgs {
    pub(crate) fn runtime(&self) -> anyhow::Result<Runtime> {
        let limits = Limits {
            call_timeout: Duration::from_millis(self.call_timeout_ms),
            memory_bytes: self.memory_limit_mb << 20,
            output_bytes_per_call: self.output_limit_mb << 20,
        };
        Runtime::new(RuntimeConfig {
            cache_dir: cache_dir(),
            limits,
        })
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::Bench(cmd) => bench::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let wasm = plugin::resolve(&args.processor)?;
    let runtime = args.sandbox.runtime()?;
    let processor = runtime
        .load_file(&wasm)
        .with_context(|| format!("cannot load processor {}", wasm.display()))?;
    let opts = QueryOptions {
        input: args.input,
        output: args.output.clone(),
        checkpoint: args.checkpoint,
        key_columns: args.key,
        partitions: args.partitions,
        output_mode: args.output_mode,
        time_mode: args.time_mode,
        max_files_per_batch: args.max_files_per_batch,
        workers: None,
    };
    let mut query = Query::open(opts, Arc::new(processor))?;
    let reports = query.run_available(|r| {
        let c = &r.commit;
        eprintln!(
            "batch {}: {} rows, {} keys, {} output rows in {} ms (read {} ms, process {} ms, commit {} ms)",
            c.batch_id, c.input_rows, c.keys, c.output_rows, c.duration_ms, c.read_ms, c.process_ms, c.commit_ms
        );
    })?;
    if reports.is_empty() {
        eprintln!(
            "no new input; output is up to date in {}",
            args.output.display()
        );
    }
    Ok(())
}
