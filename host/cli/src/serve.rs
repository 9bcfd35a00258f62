//! `statebox serve`: the multi-tenant HTTP server (see the `statebox-server` crate).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use statebox_server::{HttpLimits, Quotas, ServerConfig};

#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Where the registry, processors and pipelines (input log, output, checkpoint) live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Address to listen on; port 0 picks a free port (the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// File holding the admin token (default: the STATEBOX_ADMIN_TOKEN environment variable).
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// Quotas of tenants created without their own, as JSON, e.g. `{"call_cpu_ms": 2000}`;
    /// fields not named keep their defaults.
    #[arg(long)]
    default_quotas: Option<String>,
    /// Attempts of a failing batch before its pipeline is marked failed.
    #[arg(long, default_value_t = 5)]
    max_attempts: u32,
    /// Wait before the first retry of a failed batch, in milliseconds; doubles per attempt.
    #[arg(long, default_value_t = 500)]
    retry_backoff_ms: u64,
    /// A request's head must arrive within this many milliseconds (slow clients are cut
    /// off); idle keep-alive connections close after it too.
    #[arg(long, default_value_t = 10_000)]
    header_timeout_ms: u64,
    /// A request body that sends nothing for this many milliseconds is answered 408.
    #[arg(long, default_value_t = 15_000)]
    body_timeout_ms: u64,
    /// Open connections at once.
    #[arg(long, default_value_t = 2048)]
    max_connections: usize,
    /// Requests handled at once over all callers (503 beyond).
    #[arg(long, default_value_t = 512)]
    max_in_flight: usize,
    /// Requests handled at once per tenant (429 beyond).
    #[arg(long, default_value_t = 64)]
    max_in_flight_per_caller: usize,
    /// How long stop, delete, upgrade and shutdown wait for a pipeline's current batch, in
    /// milliseconds, before answering (the pipeline then stops on its own).
    #[arg(long, default_value_t = 2000)]
    stop_wait_ms: u64,
    /// How long creating or starting a pipeline waits for the processor's `init`, in
    /// milliseconds, before answering with the pipeline `starting`.
    #[arg(long, default_value_t = 30_000)]
    open_wait_ms: u64,
}

pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    let admin_token = match &args.admin_token_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the admin token file {}", path.display()))?
            .trim()
            .to_owned(),
        None => std::env::var("STATEBOX_ADMIN_TOKEN")
            .context("no admin token: pass --admin-token-file or set STATEBOX_ADMIN_TOKEN")?
            .trim()
            .to_owned(),
    };
    anyhow::ensure!(
        admin_token.len() >= 16,
        "the admin token must be at least 16 characters"
    );
    let default_quotas: Quotas = match &args.default_quotas {
        Some(json) => serde_json::from_str(json).context("invalid --default-quotas")?,
        None => Quotas::default(),
    };
    default_quotas
        .validate()
        .map_err(anyhow::Error::msg)
        .context("invalid --default-quotas")?;
    anyhow::ensure!(args.max_attempts > 0, "--max-attempts must be at least 1");
    let config = ServerConfig {
        data_dir: args.data_dir,
        listen: args.listen,
        admin_token,
        // Compiled components go under the data directory unless a cache is named.
        cache_dir: std::env::var_os("STATEBOX_CACHE_DIR").map(PathBuf::from),
        default_quotas,
        max_attempts: args.max_attempts,
        retry_backoff: Duration::from_millis(args.retry_backoff_ms),
        http: HttpLimits {
            header_timeout: Duration::from_millis(args.header_timeout_ms.max(1)),
            body_idle_timeout: Duration::from_millis(args.body_timeout_ms.max(1)),
            max_connections: args.max_connections.max(1),
            max_in_flight: args.max_in_flight.max(1),
            max_in_flight_per_caller: args.max_in_flight_per_caller.max(1),
            stop_wait: Duration::from_millis(args.stop_wait_ms),
            open_wait: Duration::from_millis(args.open_wait_ms),
        },
    };
    statebox_server::run(config)?;
    Ok(())
}
