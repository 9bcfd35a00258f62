//! The Statebox server (`statebox serve`): a multi-tenant HTTP API that runs stateful
//! processors as pipelines.
//!
//! - **Tenants.** An admin token creates tenants and issues their API tokens (stored as
//!   BLAKE3 hashes). Every request is authenticated; a tenant sees only its own processors,
//!   pipelines, output and state — anything else answers 404.
//! - **Processors.** Uploaded `.wasm` components are checked against the world, precompiled
//!   and stored by content hash under `processors/`.
//! - **Pipelines.** Each pipeline has a directory under `pipelines/<id>/` with its input log
//!   (rows are acknowledged only once fsynced, see `input_log`), its output file and its
//!   checkpoint; a runner thread owns its [`statebox_engine::Query`]. Exactly-once holds
//!   across crashes: acknowledged rows are durable, and the engine's checkpointed file
//!   offsets and committed output length do the rest.
//! - **Quotas.** Per tenant ([`Quotas`]): counts, upload and request sizes, state bytes, CPU
//!   per call and per batch, memory per instance, output per call, input bytes per batch,
//!   ingest rate in rows and in bytes.
//! - **Limits of the front end** ([`HttpLimits`]): request heads must arrive within a
//!   timeout, bodies must keep flowing, open connections and requests in flight are capped
//!   (per caller too), and a body larger than its limit is refused without being buffered.
//! - **No tenant holds up another.** No lock other requests need is held while guest code
//!   runs or a component compiles; stopping, deleting, upgrading a pipeline and shutting
//!   the server down wait for a runner only up to a bound (a runner stuck in a guest call is
//!   marked stopping and finishes on its own); a restarted server answers requests while
//!   its pipelines resume in the background.
//! - **Capabilities.** Processors get nothing by default: no files, environment, sockets or
//!   real clock. The admin (never a tenant) can grant a pipeline outbound HTTP (wasi:http)
//!   to an allow-list of hosts with `PUT /v1/pipelines/{id}/capabilities
//!   {"http_hosts": ["api.example.com", "10.0.0.5:8080"]}`; the list is stored in the
//!   registry, shown in the pipeline's `GET`, and applied when the pipeline (re)starts (a
//!   running one restarts at once). A request to any other host fails in the guest with
//!   `HTTP-request-denied`; an allowed one is bounded by the call's CPU deadline. A batch
//!   that is replayed sends its requests again, so replays are deterministic only as far
//!   as the services called are.
//! - **Kafka.** A pipeline's source and sink may be Kafka topics instead of HTTP ingest and
//!   the output log, on brokers the admin granted the tenant, with only safe client options
//!   (see `kafka`).
//!
//! Metadata (tenants, token hashes, processors, pipelines) lives in `registry.json`, written
//! atomically. Compiled components are loaded only if this server wrote them (see
//! `artefacts`).

mod api;
mod api_console;
mod api_sql;
mod app;
mod artefacts;
mod auth;
pub mod bench;
mod console;
mod disk;
mod error;
mod input_log;
mod kafka;
mod meter;
mod metrics;
mod openapi;
mod pipeline;
mod readers;
mod registry;
mod retention;
mod rows;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub(crate) use crate::app::App;
pub use crate::artefacts::CacheError;
pub use crate::registry::{Quotas, RegistryError};

/// Why the server could not start, or stopped with an error. Every variant is the
/// operator's to fix (an address in use, a data directory another server holds, a file
/// it cannot read) or a failure of the host; none is a tenant's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The async runtime (or a thread of the server) could not start.
    #[error("{what}")]
    Start {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A file or directory of the data directory cannot be created, read or changed.
    #[error("{what}")]
    DataDir {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Another `statebox serve` holds the data directory.
    #[error("the data directory {} is in use by another statebox serve", .0.display())]
    DataDirInUse(PathBuf),
    /// The registry file cannot be read or parsed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The compiled-component cache is not one the server may trust, or cannot be set up.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The WebAssembly runtime could not set up its engine.
    #[error(transparent)]
    Runtime(#[from] statebox_runtime::RuntimeError),
    /// A task of the server's startup or shutdown panicked (a bug in the host).
    #[error("the {what} task panicked")]
    Panicked {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// How to run the server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Where the registry, processors and pipelines live.
    pub data_dir: PathBuf,
    /// The address to listen on (port 0 picks a free port; the bound address is printed).
    pub listen: SocketAddr,
    /// The admin token. Never logged.
    pub admin_token: String,
    /// Where compiled components are cached (default: `compiled/` in the data directory).
    pub cache_dir: Option<PathBuf>,
    /// Quotas of tenants created without their own.
    pub default_quotas: Quotas,
    /// Attempts of a failing batch before its pipeline is marked failed.
    pub max_attempts: u32,
    /// Wait before the first retry of a failed batch; doubles with every attempt.
    pub retry_backoff: Duration,
    /// Limits of the HTTP front end and of waits on runners.
    pub http: HttpLimits,
}

/// Limits of the HTTP front end, so that no client (slow, many or large) ties the server
/// up, and how long a request waits for a pipeline's runner.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// A request's head (request line and headers) must arrive within this; an idle
    /// keep-alive connection is closed after it too (slowloris).
    pub header_timeout: Duration,
    /// A request body that sends nothing for this long is abandoned (HTTP 408).
    pub body_idle_timeout: Duration,
    /// Open connections at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Requests handled at once over all callers; more are answered 503 at once.
    pub max_in_flight: usize,
    /// Requests handled at once per caller (token); more are answered 429 at once.
    pub max_in_flight_per_caller: usize,
    /// How long stop, delete, upgrade and shutdown wait for a runner to finish its current
    /// batch before they return (the runner then stops on its own).
    pub stop_wait: Duration,
    /// How long creating or starting a pipeline waits for its query to open (the
    /// processor's `init` runs) before it answers with the pipeline `starting`.
    pub open_wait: Duration,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(15),
            max_connections: 2048,
            max_in_flight: 512,
            max_in_flight_per_caller: 64,
            stop_wait: Duration::from_secs(2),
            open_wait: Duration::from_secs(30),
        }
    }
}

/// Runs the server until SIGINT or SIGTERM, then shuts down gracefully: stops accepting
/// requests, finishes the ones in flight, lets every pipeline finish its current batch.
pub fn run(config: ServerConfig) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("statebox-http")
        .build()
        .map_err(|source| ServeError::Start {
            what: "cannot start the async runtime",
            source,
        })?;
    let result = runtime.block_on(async move {
        let server = Server::start(config).await?;
        println!("statebox serve listening on http://{}", server.addr());
        use std::io::Write;
        let _ = std::io::stdout().flush();
        server.run_until(shutdown_signal()).await
    });
    // Blocking tasks still running are inside a guest call (an upload's `init`, say): they
    // end with the process, not before it.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install the SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
    tracing::info!("shutting down: finishing requests in flight and current batches");
}

/// A started server: listening, pipelines resumed.
pub struct Server {
    app: Arc<App>,
    listener: tokio::net::TcpListener,
}

impl Server {
    /// Opens the data directory (locked against a second server), recovers every
    /// pipeline's input log, binds the listener, and resumes the pipelines that were running
    /// in the background: loading a processor runs guest code and may compile, and requests
    /// are answered meanwhile (a resuming pipeline shows state `starting`).
    pub async fn start(config: ServerConfig) -> Result<Server, ServeError> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServeError::Listen {
                addr: config.listen,
                source,
            })?;
        let app = tokio::task::spawn_blocking(move || App::open(config))
            .await
            .map_err(|source| ServeError::Panicked {
                what: "startup",
                source,
            })??;
        let resuming = app.clone();
        std::thread::Builder::new()
            .name("statebox-resume".into())
            .spawn(move || resuming.resume_all())
            .map_err(|source| ServeError::Start {
                what: "cannot start the thread resuming pipelines",
                source,
            })?;
        Ok(Server { app, listener })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `shutdown` resolves, then stops every pipeline after its current batch.
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let router = api::router(self.app.clone());
        let router = api::limited(router, self.app.clone());
        serve(
            self.listener,
            router,
            self.app.config.http.clone(),
            shutdown,
        )
        .await;
        let app = self.app.clone();
        tokio::task::spawn_blocking(move || app.shutdown())
            .await
            .map_err(|source| ServeError::Panicked {
                what: "shutdown",
                source,
            })?;
        Ok(())
    }
}

/// How long a shutdown waits for requests in flight (one may be an upload whose `init`
/// never returns).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Serves HTTP/1.1 on `listener` until `shutdown` resolves, then lets requests in flight
/// finish (for up to [`SHUTDOWN_GRACE`]). Unlike `axum::serve`, every connection has a header read
/// timeout (a client sending its head byte by byte is cut off) and open connections are
/// capped.
async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: HttpLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => {
                permit.expect("the connection semaphore is never closed")
            }
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, typically: wait for connections to close.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.header_timeout);
        let connection =
            graceful.watch(builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {
            tracing::warn!(
                "requests still in flight after {} s; shutting down without them",
                SHUTDOWN_GRACE.as_secs()
            );
        }
    }
}

/// Longest processor name, state variable name and output event-time column a processor
/// may declare, in bytes; a larger one is refused at upload (HTTP 422) before anything is
/// stored.
pub(crate) const MAX_NAME_BYTES: usize = 256;
/// Longest schema (DDL) a processor may declare, in bytes.
pub(crate) const MAX_SCHEMA_BYTES: usize = 64 << 10;
/// Most state variables a processor may declare.
pub(crate) const MAX_VARIABLES: usize = 1024;
/// Longest failure message kept (in the registry and in a pipeline's status), in bytes; a
/// longer one (a guest's message with a backtrace, say) is cut, saying how much was cut.
pub(crate) const MAX_MESSAGE_BYTES: usize = 4096;

/// `message` cut to at most [`MAX_MESSAGE_BYTES`] (on a character boundary).
pub(crate) fn bounded_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE_BYTES - 64;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… ({} more bytes cut)",
        &message[..end],
        message.len() - end
    )
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}
