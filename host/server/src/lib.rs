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
//!   per call and per batch, memory per instance, output per call, ingest rate.
//! - **Capabilities.** Processors get nothing by default: no files, environment, sockets or
//!   real clock. The admin (never a tenant) can grant a pipeline outbound HTTP (wasi:http)
//!   to an allow-list of hosts with `PUT /v1/pipelines/{id}/capabilities
//!   {"http_hosts": ["api.example.com", "10.0.0.5:8080"]}`; the list is stored in the
//!   registry, shown in the pipeline's `GET`, and applied when the pipeline (re)starts (a
//!   running one restarts at once). A request to any other host fails in the guest with
//!   `HTTP-request-denied`; an allowed one is bounded by the call's CPU deadline. A batch
//!   that is replayed sends its requests again, so replays are deterministic only as far
//!   as the services called are.
//!
//! Metadata (tenants, token hashes, processors, pipelines) lives in `registry.json`, written
//! atomically.

mod api;
mod api_console;
mod api_sql;
mod auth;
pub mod bench;
mod console;
mod error;
mod input_log;
mod meter;
mod metrics;
mod openapi;
mod pipeline;
mod registry;

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
use crate::meter::{BatchBudget, Metered, TenantUsage};
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
}

/// Runs the server until SIGINT or SIGTERM, then shuts down gracefully: stops accepting
/// requests, finishes the ones in flight, lets every pipeline finish its current batch.
pub fn run(config: ServerConfig) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("statebox-http")
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let server = Server::start(config).await?;
        println!("statebox serve listening on http://{}", server.addr());
        use std::io::Write;
        let _ = std::io::stdout().flush();
        server.run_until(shutdown_signal()).await
    })
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
    /// Opens the data directory (locked against a second server), resumes every pipeline
    /// that was running from its checkpoint, and binds the listener.
    pub async fn start(config: ServerConfig) -> anyhow::Result<Server> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let app = tokio::task::spawn_blocking(move || App::open(config))
            .await
            .context("the startup task panicked")??;
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
        axum::serve(self.listener, router)
            .with_graceful_shutdown(shutdown)
            .await
            .context("the HTTP server failed")?;
        let app = self.app.clone();
        tokio::task::spawn_blocking(move || app.shutdown())
            .await
            .context("the shutdown task panicked")?;
        Ok(())
    }
}

/// A token bucket limiting a tenant's ingest rate.
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// The server's shared state.
pub(crate) struct App {
    config: ServerConfig,
    runtime: Runtime,
    registry: Mutex<Registry>,
    /// (token hash, tenant id) of every issued token, for authentication.
    tokens: RwLock<Vec<(String, String)>>,
    pipelines: Mutex<HashMap<String, Arc<PipelineHandle>>>,
    usage: Mutex<HashMap<String, Arc<TenantUsage>>>,
    rejected: Mutex<HashMap<String, u64>>,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Serialises pipeline and processor creation, so quota counts hold.
    creating: tokio::sync::Mutex<()>,
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
        let lock = lock_data_dir(dir)?;
        let registry = Registry::open(&dir.join("registry.json"))?;
        let runtime = Runtime::new(RuntimeConfig {
            cache_dir: Some(
                config
                    .cache_dir
                    .clone()
                    .unwrap_or_else(|| dir.join("compiled")),
            ),
            limits: config.default_quotas.limits(),
            per_key_calls: false,
        })?;
        let app = Arc::new_cyclic(|me| App {
            config,
            runtime,
            registry: Mutex::new(registry),
            tokens: RwLock::new(Vec::new()),
            pipelines: Mutex::new(HashMap::new()),
            usage: Mutex::new(HashMap::new()),
            rejected: Mutex::new(HashMap::new()),
            buckets: Mutex::new(HashMap::new()),
            creating: tokio::sync::Mutex::new(()),
            me: me.clone(),
            _lock: lock,
        });
        app.reload_tokens();
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
            if let Err(e) = app.resume(&record) {
                tracing::warn!(pipeline = %record.id, "cannot resume the pipeline");
                app.pipeline_failed(&record.id, &e);
            }
        }
        Ok(app)
    }

    /// Re-creates a pipeline's handle after a restart and starts it if it was running.
    fn resume(&self, record: &PipelineRecord) -> Result<(), String> {
        let loaded = self
            .processor_record(&record.tenant, &record.processor)
            .and_then(|p| self.load_for_pipeline(record, &p));
        // Without its processor the pipeline is still listed (failed, with the reason) and
        // its input log still takes rows checked for the key columns.
        let check = match &loaded {
            Ok(p) => ingest_check(record, p),
            Err(_) => IngestCheck::new(
                None,
                record.key.clone(),
                record.event_time.as_ref().map(|e| e.column.clone()),
            ),
        };
        let dir = self.pipeline_dir(&record.id);
        let handle = Arc::new(
            PipelineHandle::new(&record.id, &record.tenant, &dir, check)
                .map_err(|e| format!("cannot open the input log: {e}"))?,
        );
        if record.desired == Desired::Failed {
            let mut status = handle.status.lock().expect("status lock");
            status.state = pipeline::RunState::Failed;
            status.failure = record.failure.clone();
        }
        self.pipelines
            .lock()
            .expect("pipelines lock")
            .insert(record.id.clone(), handle.clone());
        let started = loaded.and_then(|loaded| {
            if record.desired == Desired::Running {
                handle.start(self.runner_spec(record, loaded), self.me.clone())?;
            }
            Ok(())
        });
        if let Err(reason) = &started {
            let mut status = handle.status.lock().expect("status lock");
            status.state = pipeline::RunState::Failed;
            status.failure = Some(reason.clone());
        }
        started
    }

    fn shutdown(&self) {
        let handles: Vec<_> = self
            .pipelines
            .lock()
            .expect("pipelines lock")
            .values()
            .cloned()
            .collect();
        for h in handles {
            h.stop();
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

    /// Who `token` belongs to, if anyone. Every comparison is constant-time.
    pub(crate) fn authenticate(&self, token: &str) -> Option<Caller> {
        if constant_time_eq(token.as_bytes(), self.config.admin_token.as_bytes()) {
            return Some(Caller::Admin);
        }
        let hash = token_hash(token);
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

    /// Loads a stored processor under its tenant's sandbox limits. Blocks.
    fn load_processor(&self, tenant: &str, record: &ProcessorRecord) -> Result<Processor, String> {
        let path = self.blob_path(&record.hash);
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("cannot read processor {}: {e}", path.display()))?;
        self.runtime
            .load_with_limits(&bytes, self.quotas(tenant).limits())
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
        let limits = statebox_runtime::Limits {
            http_hosts: pipeline.http_hosts.clone(),
            ..self.quotas(&pipeline.tenant).limits()
        };
        self.runtime
            .load_with_limits(&bytes, limits)
            .map_err(|e| e.to_string())
    }

    fn runner_spec(&self, record: &PipelineRecord, processor: Processor) -> RunnerSpec {
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
        RunnerSpec {
            factory: Arc::new(Metered {
                processor,
                usage: self.usage(&record.tenant),
                budget: Arc::new(BatchBudget::new(quotas.batch_cpu_ms)),
            }),
            opts,
            trigger: Duration::from_millis(record.trigger_interval_ms),
            time_mode: record.time_mode,
            max_attempts: self.config.max_attempts.max(1),
            backoff: self.config.retry_backoff,
        }
    }

    /// Records that a pipeline failed (its runner stopped), durably.
    pub(crate) fn pipeline_failed(&self, id: &str, reason: &str) {
        let mut registry = self.registry.lock().expect("registry lock");
        if let Some(p) = registry.data.pipelines.get_mut(id) {
            p.desired = Desired::Failed;
            p.failure = Some(reason.to_owned());
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

    /// Refuses when the tenant's state is over its quota.
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

    /// Takes `rows` from the tenant's ingest bucket, or says how many seconds to wait.
    fn take_ingest_tokens(&self, tenant: &str, rows: u64, rate: u64) -> Result<(), u64> {
        let mut buckets = self.buckets.lock().expect("buckets lock");
        let now = Instant::now();
        let rate = rate as f64;
        let bucket = buckets.entry(tenant.to_owned()).or_insert(Bucket {
            tokens: rate,
            last: now,
        });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.last).as_secs_f64() * rate).min(rate);
        bucket.last = now;
        // A request larger than the bucket is admitted when the bucket is full (and puts it
        // in debt), so any request size works and the sustained rate still holds.
        let rows = rows as f64;
        if bucket.tokens < rows && bucket.tokens < rate {
            return Err(((rows.min(rate) - bucket.tokens) / rate).ceil().max(1.0) as u64);
        }
        bucket.tokens -= rows;
        Ok(())
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

/// The checks on a pipeline's input rows, from its processor's input schema.
fn ingest_check(record: &PipelineRecord, processor: &Processor) -> IngestCheck {
    IngestCheck::new(
        processor.info().input_schema.clone(),
        record.key.clone(),
        record.event_time.as_ref().map(|e| e.column.clone()),
    )
}

/// Takes an exclusive lock on the data directory, so two servers never share it.
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
