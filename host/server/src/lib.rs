//! The Statebox server (`statebox serve`): a multi-tenant HTTP API that runs stateful
//! processors as pipelines.
//!
//! - **Tenants.** An admin token creates tenants and issues their API tokens (stored as
//!   BLAKE3 hashes). Every request is authenticated; a tenant sees only its own processors,
//!   pipelines, output and state — anything else answers 404.
//! - **Processors.** Uploaded `.wasm` components are checked against the world, precompiled
//!   and stored by content hash under `processors/`.
//! - **Pipelines.** Each pipeline has a directory under `pipelines/<id>/` with its input log
//!   (rows are acknowledged only once fsynced, see [`input_log`]), its output file and its
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
//!   (see [`kafka`]).
//!
//! Metadata (tenants, token hashes, processors, pipelines) lives in `registry.json`, written
//! atomically. Compiled components are loaded only if this server wrote them (see
//! [`artefacts`]).

mod api;
mod api_console;
mod api_sql;
mod artefacts;
mod auth;
pub mod bench;
mod console;
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

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use anyhow::Context;
use statebox_engine::{EventTimeOptions, QueryOptions, StateReader};
use statebox_runtime::{Processor, Runtime, RuntimeConfig};

use crate::auth::{Caller, constant_time_eq, token_hash};
use crate::meter::{BatchBudget, Metered, TenantMeter, TenantUsage};
use crate::pipeline::{IngestCheck, PipelineHandle, RunnerSpec};
pub use crate::registry::Quotas;
use crate::registry::{Desired, PipelineRecord, ProcessorRecord, Registry};

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
pub fn run(config: ServerConfig) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("statebox-http")
        .build()
        .context("cannot start the async runtime")?;
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
    pub async fn start(config: ServerConfig) -> anyhow::Result<Server> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let app = tokio::task::spawn_blocking(move || App::open(config))
            .await
            .context("the startup task panicked")??;
        let resuming = app.clone();
        std::thread::Builder::new()
            .name("statebox-resume".into())
            .spawn(move || resuming.resume_all())
            .context("cannot start the thread resuming pipelines")?;
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
    ) -> anyhow::Result<()> {
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
            .context("the shutdown task panicked")?;
        Ok(())
    }
}

/// Pipelines resumed at once after a restart.
const RESUMING_AT_ONCE: usize = 4;

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

/// A token bucket limiting a tenant's ingest rate (rows or bytes).
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Takes `n` tokens at `rate` per second (bursts of one second's worth), or says how
    /// many seconds to wait. A request larger than the bucket is admitted when the bucket
    /// is full (and puts it in debt), so any request size works and the sustained rate
    /// still holds.
    fn check(&mut self, n: u64, rate: u64, now: Instant) -> Result<(), u64> {
        let rate = rate as f64;
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * rate).min(rate);
        self.last = now;
        let n = n as f64;
        if self.tokens < n && self.tokens < rate {
            return Err(((n.min(rate) - self.tokens) / rate).ceil().max(1.0) as u64);
        }
        Ok(())
    }

    fn take(&mut self, n: u64) {
        self.tokens -= n as f64;
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

/// The server's shared state.
pub(crate) struct App {
    config: ServerConfig,
    runtime: Runtime,
    artefacts: artefacts::ArtefactGuard,
    /// Open checkpoint readers shared by state queries.
    readers: readers::ReaderCache,
    registry: Mutex<Registry>,
    /// (token hash, tenant id) of every issued token, for authentication.
    tokens: RwLock<Vec<(String, String)>>,
    pipelines: Mutex<HashMap<String, Arc<PipelineHandle>>>,
    usage: Mutex<HashMap<String, Arc<TenantUsage>>>,
    rejected: Mutex<HashMap<String, u64>>,
    /// Ingest buckets per tenant: rows, bytes.
    buckets: Mutex<HashMap<String, (Bucket, Bucket)>>,
    /// Processors and pipelines being created, per (tenant, kind): counted against the
    /// quotas with the registry's, so the count holds without a lock held while guest code
    /// runs or a component compiles.
    creating: Mutex<HashMap<(String, &'static str), u32>>,
    /// Requests in flight, over all callers and per caller.
    in_flight: Arc<tokio::sync::Semaphore>,
    in_flight_by_caller: Mutex<HashMap<String, usize>>,
    /// The BLAKE3 hash of the admin token, compared against each request token's hash: the
    /// comparison takes the same time whatever the token's length or content.
    admin_hash: String,
    me: Weak<App>,
    _lock: std::fs::File,
}

impl App {
    fn open(config: ServerConfig) -> anyhow::Result<Arc<App>> {
        let dir = &config.data_dir;
        for sub in ["processors", "pipelines", "compiled"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("cannot create {}", dir.join(sub).display()))?;
        }
        restrict_to_owner(dir)?;
        let lock = lock_data_dir(dir)?;
        let registry = Registry::open(&dir.join("registry.json"))?;
        let cache_dir = config
            .cache_dir
            .clone()
            .unwrap_or_else(|| dir.join("compiled"));
        let artefacts = artefacts::ArtefactGuard::open(&cache_dir, config.cache_dir.is_none())?;
        let runtime = Runtime::new(RuntimeConfig {
            cache_dir: Some(cache_dir),
            limits: config.default_quotas.limits(),
            per_key_calls: false,
        })?;
        let admin_hash = token_hash(&config.admin_token);
        let max_in_flight = config.http.max_in_flight.max(1);
        let app = Arc::new_cyclic(|me| App {
            config,
            runtime,
            artefacts,
            readers: readers::ReaderCache::new(),
            registry: Mutex::new(registry),
            tokens: RwLock::new(Vec::new()),
            pipelines: Mutex::new(HashMap::new()),
            usage: Mutex::new(HashMap::new()),
            rejected: Mutex::new(HashMap::new()),
            buckets: Mutex::new(HashMap::new()),
            creating: Mutex::new(HashMap::new()),
            in_flight: Arc::new(tokio::sync::Semaphore::new(max_in_flight)),
            in_flight_by_caller: Mutex::new(HashMap::new()),
            admin_hash,
            me: me.clone(),
            _lock: lock,
        });
        app.reload_tokens();
        // Every pipeline is listed (and takes rows) at once; the ones that were running
        // start in the background (`resume_all`).
        let records: Vec<PipelineRecord> = app
            .registry
            .lock()
            .expect("registry lock")
            .data
            .pipelines
            .values()
            .cloned()
            .collect();
        for record in records {
            if let Err(e) = app.reopen(&record) {
                tracing::warn!(pipeline = %record.id, "cannot reopen the pipeline");
                app.pipeline_failed(&record.id, &e);
            }
        }
        Ok(app)
    }

    /// Re-creates a pipeline's handle after a restart (its input log recovered), with the
    /// key checks only until its processor is loaded.
    fn reopen(&self, record: &PipelineRecord) -> Result<(), String> {
        let check = IngestCheck::new(
            None,
            record.key.clone(),
            record.event_time.as_ref().map(|e| e.column.clone()),
        );
        let dir = self.pipeline_dir(&record.id);
        let handle = Arc::new(
            PipelineHandle::new(&record.id, &record.tenant, &dir, check)
                .map_err(|e| format!("cannot open the input log: {e}"))?,
        );
        handle.checks_ready.store(false, Ordering::Release);
        handle
            .metrics
            .disk_bytes
            .store(pipeline::pipeline_disk_bytes(&dir), Ordering::Relaxed);
        {
            let mut status = handle.status.lock().expect("status lock");
            match record.desired {
                Desired::Failed => {
                    status.state = pipeline::RunState::Failed;
                    status.failure = record.failure.clone();
                }
                Desired::Running => status.state = pipeline::RunState::Starting,
                Desired::Stopped => {}
            }
        }
        self.pipelines
            .lock()
            .expect("pipelines lock")
            .insert(record.id.clone(), handle);
        Ok(())
    }

    /// Loads every pipeline's processor (for the input checks) and starts the ones that
    /// were running, [`RESUMING_AT_ONCE`] at a time. Runs after startup, while requests are
    /// served: a processor that is slow to load or to start holds up only its own
    /// pipeline's resumption (and one of the resuming threads for a while).
    fn resume_all(self: &Arc<Self>) {
        let records: Vec<PipelineRecord> = self
            .registry
            .lock()
            .expect("registry lock")
            .data
            .pipelines
            .values()
            .cloned()
            .collect();
        let queue = Arc::new(Mutex::new(records));
        let workers: Vec<_> = (0..RESUMING_AT_ONCE)
            .filter_map(|i| {
                let (app, queue) = (self.clone(), queue.clone());
                std::thread::Builder::new()
                    .name(format!("statebox-resume-{i}"))
                    .spawn(move || {
                        loop {
                            let next = queue.lock().expect("resume queue lock").pop();
                            let Some(record) = next else { break };
                            app.resume_one(record);
                        }
                    })
                    .ok()
            })
            .collect();
        for w in workers {
            let _ = w.join();
        }
    }

    fn resume_one(&self, record: PipelineRecord) {
        let Some(handle) = self
            .pipelines
            .lock()
            .expect("pipelines lock")
            .get(&record.id)
            .cloned()
        else {
            return;
        };
        let resumed = self.resume(&record, &handle);
        // Without its processor the pipeline is still listed (failed, with the reason)
        // and its input log still takes rows checked for the key columns.
        handle.checks_ready.store(true, Ordering::Release);
        if let Err(reason) = resumed {
            tracing::warn!(pipeline = %record.id, "cannot resume the pipeline");
            {
                let mut status = handle.status.lock().expect("status lock");
                status.state = pipeline::RunState::Failed;
                status.failure = Some(bounded_message(&reason));
            }
            if record.desired == Desired::Running {
                self.pipeline_failed(&record.id, &reason);
            }
        }
    }

    fn resume(&self, record: &PipelineRecord, handle: &Arc<PipelineHandle>) -> Result<(), String> {
        let loaded = self
            .processor_record(&record.tenant, &record.processor)
            .and_then(|p| self.load_for_pipeline(record, &p))?;
        *handle.ingest.lock().expect("ingest lock") = Arc::new(ingest_check(record, &loaded));
        handle.checks_ready.store(true, Ordering::Release);
        if record.desired == Desired::Running {
            handle.start(self.runner_spec(record, loaded)?, self.me.clone())?;
        }
        Ok(())
    }

    /// Stops every pipeline after its current batch, waiting at most
    /// [`HttpLimits::stop_wait`] over all of them: a runner stuck in a guest call is left
    /// to end with the process (its batch commits nothing).
    fn shutdown(&self) {
        let handles: Vec<_> = self
            .pipelines
            .lock()
            .expect("pipelines lock")
            .values()
            .cloned()
            .collect();
        for h in &handles {
            h.request_stop();
        }
        let deadline = Instant::now() + self.config.http.stop_wait;
        for h in &handles {
            if !h.wait_stopped(deadline.saturating_duration_since(Instant::now())) {
                tracing::warn!(pipeline = %h.id, "the pipeline's runner did not stop in time");
            }
        }
    }

    fn reload_tokens(&self) {
        let registry = self.registry.lock().expect("registry lock");
        let tokens = registry
            .data
            .tenants
            .values()
            .flat_map(|t| t.tokens.iter().map(|k| (k.hash.clone(), t.id.clone())))
            .collect();
        *self.tokens.write().expect("tokens lock") = tokens;
    }

    /// Who `token` belongs to, if anyone. Only hashes are compared, in constant time, so
    /// neither the admin token's length nor its content leaks through timing.
    pub(crate) fn authenticate(&self, token: &str) -> Option<Caller> {
        let hash = token_hash(token);
        if constant_time_eq(hash.as_bytes(), self.admin_hash.as_bytes()) {
            return Some(Caller::Admin);
        }
        let mut found = None;
        for (stored, tenant) in self.tokens.read().expect("tokens lock").iter() {
            if constant_time_eq(stored.as_bytes(), hash.as_bytes()) {
                found = Some(tenant.clone());
            }
        }
        found.map(Caller::Tenant)
    }

    fn pipeline_dir(&self, id: &str) -> PathBuf {
        self.config.data_dir.join("pipelines").join(id)
    }

    fn blob_path(&self, hash: &str) -> PathBuf {
        self.config
            .data_dir
            .join("processors")
            .join(format!("{hash}.wasm"))
    }

    /// Removes the compiled artefact of a component no processor uses any more, when the
    /// cache is the server's own (`compiled/` in the data directory); a cache the operator
    /// named may be shared with other hosts, which keep their entries.
    pub(crate) fn forget_compiled(&self, hash: &str) {
        if self.config.cache_dir.is_none() {
            self.artefacts.remove(hash);
        }
    }

    fn quotas(&self, tenant: &str) -> Quotas {
        self.registry
            .lock()
            .expect("registry lock")
            .data
            .tenants
            .get(tenant)
            .map(|t| t.quotas.clone())
            .unwrap_or_else(|| self.config.default_quotas.clone())
    }

    fn usage(&self, tenant: &str) -> Arc<TenantUsage> {
        self.usage
            .lock()
            .expect("usage lock")
            .entry(tenant.to_owned())
            .or_default()
            .clone()
    }

    fn count_rejected(&self, tenant: &str) {
        *self
            .rejected
            .lock()
            .expect("rejected lock")
            .entry(tenant.to_owned())
            .or_default() += 1;
    }

    fn processor_record(&self, tenant: &str, id: &str) -> Result<ProcessorRecord, String> {
        self.registry
            .lock()
            .expect("registry lock")
            .data
            .processors
            .get(&Registry::processor_key(tenant, id))
            .cloned()
            .ok_or_else(|| format!("no processor `{id}`"))
    }

    /// Compiles (or loads from the cache, if this server wrote the cached artefact) and
    /// describes a component. Blocks.
    pub(crate) fn load(
        &self,
        bytes: &[u8],
        limits: statebox_runtime::Limits,
    ) -> Result<Processor, statebox_runtime::LoadError> {
        let hash = crate::registry::hex(blake3::hash(bytes).as_bytes());
        self.artefacts.before_load(&hash);
        let loaded = self.runtime.load_with_limits(bytes, limits);
        self.artefacts.after_load(&hash);
        loaded
    }

    /// Loads a stored processor under its tenant's sandbox limits. Blocks.
    fn load_processor(&self, tenant: &str, record: &ProcessorRecord) -> Result<Processor, String> {
        let path = self.blob_path(&record.hash);
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("cannot read processor {}: {e}", path.display()))?;
        self.load(&bytes, self.quotas(tenant).limits())
            .map_err(|e| e.to_string())
    }

    /// Loads a pipeline's processor under its tenant's sandbox limits and the capabilities
    /// the admin granted the pipeline. Blocks.
    fn load_for_pipeline(
        &self,
        pipeline: &PipelineRecord,
        record: &ProcessorRecord,
    ) -> Result<Processor, String> {
        let path = self.blob_path(&record.hash);
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("cannot read processor {}: {e}", path.display()))?;
        // A grant is for the component it was given for, never for another one.
        let http_hosts = if pipeline.http_hosts_for.as_deref() == Some(record.hash.as_str()) {
            pipeline.http_hosts.clone()
        } else {
            Vec::new()
        };
        let limits = statebox_runtime::Limits {
            http_hosts,
            ..self.quotas(&pipeline.tenant).limits()
        };
        self.load(&bytes, limits).map_err(|e| e.to_string())
    }

    /// What a pipeline's runner needs; refuses Kafka brokers the tenant's grant does not
    /// list.
    fn runner_spec(
        &self,
        record: &PipelineRecord,
        processor: Processor,
    ) -> Result<RunnerSpec, String> {
        let endpoints = self.kafka_endpoints(record)?;
        let dir = self.pipeline_dir(&record.id);
        let quotas = self.quotas(&record.tenant);
        let checkpoint = PipelineHandle::checkpoint_dir(&dir);
        let initial = PipelineHandle::initial_state_path(&dir);
        // Initial state belongs to the first batch only; once a batch committed, the engine
        // would just warn about it on every start.
        let first_batch_pending = StateReader::open(&checkpoint)
            .ok()
            .and_then(|r| r.latest_batch_id())
            .is_none();
        let opts = QueryOptions {
            partitions: Some(record.partitions),
            output_mode: Some(record.output_mode),
            time_mode: Some(record.time_mode),
            max_files_per_batch: 64,
            max_bytes_per_batch: quotas.max_batch_bytes,
            // A cap, not a demand: never more threads than cores.
            workers: Some(
                (quotas.max_workers as usize)
                    .min(std::thread::available_parallelism().map_or(1, |n| n.get())),
            ),
            event_time: record.event_time.as_ref().map(|e| EventTimeOptions {
                column: e.column.clone(),
                watermark_delay_ms: e.watermark_delay_ms,
            }),
            output_event_time_column: record.output_event_time_column.clone(),
            initial_state: (record.has_initial_state && first_batch_pending).then_some(initial),
            ..QueryOptions::new(
                PipelineHandle::input_dir(&dir),
                PipelineHandle::output_path(&dir),
                checkpoint,
                record.key.clone(),
            )
        };
        let budget = processor.limits().batch_cpu.clone().unwrap_or_else(|| {
            Arc::new(BatchBudget::new(Duration::from_millis(quotas.batch_cpu_ms)))
        });
        Ok(RunnerSpec {
            factory: Arc::new(Metered {
                inner: processor,
                meter: TenantMeter {
                    usage: self.usage(&record.tenant),
                    budget,
                },
            }),
            opts,
            endpoints,
            trigger: Duration::from_millis(record.trigger_interval_ms),
            time_mode: record.time_mode,
            max_attempts: self.config.max_attempts.max(1),
            backoff: self.config.retry_backoff,
            open_wait: self.config.http.open_wait,
        })
    }

    /// Records that a pipeline failed (its runner stopped), durably. The reason is cut to
    /// [`MAX_MESSAGE_BYTES`]: it may carry a guest's message.
    pub(crate) fn pipeline_failed(&self, id: &str, reason: &str) {
        let mut registry = self.registry.lock().expect("registry lock");
        if let Some(p) = registry.data.pipelines.get_mut(id) {
            p.desired = Desired::Failed;
            p.failure = Some(bounded_message(reason));
            if let Err(e) = registry.save() {
                tracing::error!(error = %e, "cannot save the registry");
            }
        }
    }

    /// Bytes of state on disk over all of a tenant's pipelines.
    fn state_bytes(&self, tenant: &str) -> u64 {
        self.pipelines
            .lock()
            .expect("pipelines lock")
            .values()
            .filter(|p| p.tenant == tenant)
            .map(|p| p.metrics.state_bytes.load(Ordering::Relaxed))
            .sum()
    }

    /// Bytes on disk of a tenant's pipelines and processors (see [`Quotas::max_disk_bytes`]).
    pub(crate) fn disk_bytes(&self, tenant: &str) -> u64 {
        let pipelines: u64 = self
            .pipelines
            .lock()
            .expect("pipelines lock")
            .values()
            .filter(|p| p.tenant == tenant)
            .map(|p| p.metrics.disk_bytes.load(Ordering::Relaxed))
            .sum();
        let processors: u64 = self
            .registry
            .lock()
            .expect("registry lock")
            .data
            .processors
            .values()
            .filter(|p| p.tenant == tenant)
            .map(|p| p.size_bytes + p.compiled_bytes)
            .sum();
        pipelines + processors
    }

    /// Refuses `more` bytes when they would take the tenant past its disk quota.
    pub(crate) fn check_disk_quota(&self, tenant: &str, more: u64) -> Result<(), String> {
        let limit = self.quotas(tenant).max_disk_bytes;
        let used = self.disk_bytes(tenant);
        if used.saturating_add(more) > limit {
            return Err(format!(
                "the tenant's pipelines and processors take {used} bytes on disk; {more} more \
                 would take it past its quota of {limit} bytes (`max_disk_bytes`)"
            ));
        }
        Ok(())
    }

    /// Bytes of the compiled artefact of the component with BLAKE3 `hash`, if cached.
    pub(crate) fn compiled_bytes(&self, hash: &str) -> u64 {
        self.artefacts.size(hash)
    }

    /// The bytes of state the tenant's pipelines take on disk, and its quota.
    pub(crate) fn state_usage(&self, tenant: &str) -> (u64, u64) {
        (
            self.state_bytes(tenant),
            self.quotas(tenant).max_state_bytes,
        )
    }

    /// Refuses when the tenant's state is over its quota (an admin lowered it below what
    /// the tenant holds).
    pub(crate) fn check_state_quota(&self, tenant: &str) -> Result<(), String> {
        let limit = self.quotas(tenant).max_state_bytes;
        let used = self.state_bytes(tenant);
        if used > limit {
            return Err(format!(
                "the tenant's state takes {used} bytes on disk, more than its quota of {limit} \
                 bytes (`max_state_bytes`)"
            ));
        }
        Ok(())
    }

    /// Takes `rows` and `bytes` from the tenant's ingest buckets, or says which limit is
    /// exhausted and how many seconds to wait. Nothing is taken from either bucket unless
    /// both admit the request.
    fn take_ingest_tokens(
        &self,
        tenant: &str,
        rows: u64,
        bytes: u64,
        quotas: &Quotas,
    ) -> Result<(), (&'static str, u64)> {
        let mut buckets = self.buckets.lock().expect("buckets lock");
        let now = Instant::now();
        let (by_rows, by_bytes) = buckets.entry(tenant.to_owned()).or_insert_with(|| {
            (
                Bucket {
                    tokens: quotas.ingest_rows_per_s as f64,
                    last: now,
                },
                Bucket {
                    tokens: quotas.ingest_bytes_per_s as f64,
                    last: now,
                },
            )
        });
        by_rows
            .check(rows, quotas.ingest_rows_per_s, now)
            .map_err(|wait| ("ingest_rows_per_s", wait))?;
        by_bytes
            .check(bytes, quotas.ingest_bytes_per_s, now)
            .map_err(|wait| ("ingest_bytes_per_s", wait))?;
        by_rows.take(rows);
        by_bytes.take(bytes);
        Ok(())
    }

    /// Reserves a place for one more `kind` (`processors` or `pipelines`) of `tenant`
    /// against `limit`, counting those stored and those being created. The reservation
    /// ends when the returned guard drops (after the new record is stored, or on failure).
    pub(crate) fn reserve(
        self: &Arc<Self>,
        tenant: &str,
        kind: &'static str,
        stored: usize,
        limit: u32,
    ) -> Result<Reservation, usize> {
        let mut creating = self.creating.lock().expect("creating lock");
        let pending = creating.entry((tenant.to_owned(), kind)).or_default();
        let count = stored + *pending as usize;
        if count >= limit as usize {
            return Err(count);
        }
        *pending += 1;
        Ok(Reservation {
            app: self.clone(),
            key: (tenant.to_owned(), kind),
        })
    }

    /// Admits one more request of `caller`, or says which limit is reached.
    pub(crate) fn admit(self: &Arc<Self>, caller: &str) -> Result<Admitted, &'static str> {
        let global = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| "max_in_flight")?;
        let mut by_caller = self.in_flight_by_caller.lock().expect("in-flight lock");
        let n = by_caller.entry(caller.to_owned()).or_default();
        if *n >= self.config.http.max_in_flight_per_caller.max(1) {
            return Err("max_in_flight_per_caller");
        }
        *n += 1;
        Ok(Admitted {
            app: self.clone(),
            caller: caller.to_owned(),
            _global: global,
        })
    }

    fn pipeline(&self, tenant: &str, id: &str) -> Option<Arc<PipelineHandle>> {
        self.pipelines
            .lock()
            .expect("pipelines lock")
            .get(id)
            .filter(|p| p.tenant == tenant)
            .cloned()
    }
}

/// A place reserved by [`App::reserve`].
pub(crate) struct Reservation {
    app: Arc<App>,
    key: (String, &'static str),
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut creating = self.app.creating.lock().expect("creating lock");
        if let Some(n) = creating.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                creating.remove(&self.key);
            }
        }
    }
}

/// A request admitted by [`App::admit`]; frees its place when dropped.
pub(crate) struct Admitted {
    app: Arc<App>,
    caller: String,
    _global: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut by_caller = self.app.in_flight_by_caller.lock().expect("in-flight lock");
        if let Some(n) = by_caller.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                by_caller.remove(&self.caller);
            }
        }
    }
}

/// The checks on a pipeline's input rows, from its processor's input schema.
fn ingest_check(record: &PipelineRecord, processor: &Processor) -> IngestCheck {
    IngestCheck::new(
        processor.info().input_schema.clone(),
        record.key.clone(),
        record.event_time.as_ref().map(|e| e.column.clone()),
    )
}

/// Takes an exclusive lock on the data directory, so two servers never share it.
/// Makes the data directory accessible by its owner only (as PostgreSQL requires of its
/// own): it holds every tenant's input, output and state, and the registry with their Kafka
/// client options, which no other local user may read.
fn restrict_to_owner(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).with_context(
            || format!("cannot make {} accessible by its owner only", dir.display()),
        )?;
        tracing::info!(
            dir = %dir.display(),
            was = format!("{:o}", mode & 0o777),
            "the data directory is now accessible by its owner only (700)"
        );
    }
    Ok(())
}

fn lock_data_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock on a file descriptor this function owns; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        anyhow::bail!(
            "the data directory {} is in use by another statebox serve",
            dir.display()
        );
    }
    Ok(file)
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}
