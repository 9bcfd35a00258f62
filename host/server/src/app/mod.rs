//! The server's shared state ([`App`]) and its domain operations, one module per kind of
//! thing a tenant or the admin acts on ([`tenants`], [`processors`], [`pipelines`],
//! [`ingest`], [`reads`]). Each operation takes typed arguments and returns a typed result
//! or an [`AppError`] saying whose fault it is; `crate::api` only extracts a request, calls
//! the operation (on a blocking thread when it blocks) and renders the result as JSON. The
//! operations are tested here without HTTP (`tests`).
//!
//! This file holds what the operations share: opening the data directory, resuming
//! pipelines after a restart, authentication, quotas and reservations, loading a
//! processor and building what a pipeline's runner needs.

mod error;
pub(crate) mod ingest;
pub(crate) mod pipelines;
pub(crate) mod processors;
pub(crate) mod reads;
pub(crate) mod tenants;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use statebox_engine::{EventTimeOptions, QueryOptions, StateReader};
use statebox_runtime::{Processor, Runtime, RuntimeConfig};
use statebox_state::SharedMemtables;

pub(crate) use self::error::{AppError, AppResult};
use self::ingest::Bucket;
use crate::auth::{Caller, constant_time_eq, token_hash};
use crate::meter::{BatchBudget, Metered, TenantMeter, TenantUsage};
use crate::pipeline::{IngestCheck, PipelineHandle, RunnerSpec};
use crate::registry::{Desired, PipelineRecord, ProcessorRecord, Registry};
use crate::{Quotas, ServeError, ServerConfig, artefacts, bounded_message, readers};

/// Pipelines resumed at once after a restart.
const RESUMING_AT_ONCE: usize = 4;

/// The server's shared state.
pub(crate) struct App {
    pub(crate) config: ServerConfig,
    pub(crate) runtime: Runtime,
    pub(crate) artefacts: artefacts::ArtefactGuard,
    /// Open checkpoint readers shared by state queries.
    pub(crate) readers: readers::ReaderCache,
    pub(crate) registry: Mutex<Registry>,
    /// (token hash, tenant id) of every issued token, for authentication.
    pub(crate) tokens: RwLock<Vec<(String, String)>>,
    pub(crate) pipelines: Mutex<HashMap<String, Arc<PipelineHandle>>>,
    pub(crate) usage: Mutex<HashMap<String, Arc<TenantUsage>>>,
    /// The memtable room of one database per tenant, shared by its pipelines' databases:
    /// a tenant's memtables do not grow with its pipelines, nor shrink with another's.
    pub(crate) memtables: Mutex<HashMap<String, Arc<SharedMemtables>>>,
    pub(crate) rejected: Mutex<HashMap<String, u64>>,
    /// Ingest buckets per tenant: rows, bytes.
    pub(crate) buckets: Mutex<HashMap<String, (Bucket, Bucket)>>,
    /// Processors and pipelines being created, per (tenant, kind): counted against the
    /// quotas with the registry's, so the count holds without a lock held while guest code
    /// runs or a component compiles.
    pub(crate) creating: Mutex<HashMap<(String, &'static str), u32>>,
    /// Requests in flight, over all callers and per caller.
    pub(crate) in_flight: Arc<tokio::sync::Semaphore>,
    pub(crate) in_flight_by_caller: Mutex<HashMap<String, usize>>,
    /// The BLAKE3 hash of the admin token, compared against each request token's hash: the
    /// comparison takes the same time whatever the token's length or content.
    pub(crate) admin_hash: String,
    pub(crate) me: Weak<App>,
    _lock: std::fs::File,
}

impl App {
    pub(crate) fn open(config: ServerConfig) -> Result<Arc<App>, ServeError> {
        let dir = &config.data_dir;
        for sub in ["processors", "pipelines", "compiled"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|source| ServeError::DataDir {
                what: format!("cannot create {}", dir.join(sub).display()),
                source,
            })?;
        }
        restrict_to_owner(dir)?;
        let lock = lock_data_dir(dir)?;
        let registry = Registry::open(&dir.join("registry.json"))?;
        let own_cache = config.cache_dir.is_none();
        let cache_dir = config
            .cache_dir
            .clone()
            .unwrap_or_else(|| dir.join("compiled"));
        let artefacts = artefacts::ArtefactGuard::open(&cache_dir, own_cache)?;
        let runtime = Runtime::new(RuntimeConfig {
            cache_dir: Some(cache_dir),
            // The server's own cache loses a processor's artefact when the processor is
            // deleted; a cache the operator named is bounded like the CLI's.
            cache_max_bytes: (!own_cache).then_some(statebox_runtime::cache::COMPILED_MAX_BYTES),
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
            memtables: Mutex::new(HashMap::new()),
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
        for record in app.pipeline_records() {
            if let Err(e) = app.reopen(&record) {
                tracing::warn!(pipeline = %record.id, "cannot reopen the pipeline");
                app.pipeline_failed(&record.id, &e);
            }
        }
        Ok(app)
    }

    /// Every pipeline's record, as the registry holds it now.
    fn pipeline_records(&self) -> Vec<PipelineRecord> {
        self.registry
            .lock()
            .expect("registry lock")
            .data
            .pipelines
            .values()
            .cloned()
            .collect()
    }

    /// Re-creates a pipeline's handle after a restart (its input log recovered), with the
    /// key checks only until its processor is loaded.
    pub(crate) fn reopen(&self, record: &PipelineRecord) -> Result<(), String> {
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
            .store(crate::disk::pipeline_disk_bytes(&dir), Ordering::Relaxed);
        {
            let mut status = handle.status.lock().expect("status lock");
            match record.desired {
                Desired::Failed => {
                    status.state = crate::pipeline::RunState::Failed;
                    status.failure = record.failure.clone();
                }
                Desired::Running => status.state = crate::pipeline::RunState::Starting,
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
    pub(crate) fn resume_all(self: &Arc<Self>) {
        let queue = Arc::new(Mutex::new(self.pipeline_records()));
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

    pub(crate) fn resume_one(&self, record: PipelineRecord) {
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
                status.state = crate::pipeline::RunState::Failed;
                status.failure = Some(bounded_message(&reason));
            }
            if record.desired == Desired::Running {
                self.pipeline_failed(&record.id, &reason);
            }
        }
    }

    pub(crate) fn resume(
        &self,
        record: &PipelineRecord,
        handle: &Arc<PipelineHandle>,
    ) -> Result<(), String> {
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
    pub(crate) fn shutdown(&self) {
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

    pub(crate) fn reload_tokens(&self) {
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

    pub(crate) fn pipeline_dir(&self, id: &str) -> PathBuf {
        self.config.data_dir.join("pipelines").join(id)
    }

    pub(crate) fn blob_path(&self, hash: &str) -> PathBuf {
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

    pub(crate) fn quotas(&self, tenant: &str) -> Quotas {
        self.registry
            .lock()
            .expect("registry lock")
            .data
            .tenants
            .get(tenant)
            .map(|t| t.quotas.clone())
            .unwrap_or_else(|| self.config.default_quotas.clone())
    }

    pub(crate) fn usage(&self, tenant: &str) -> Arc<TenantUsage> {
        per_tenant(&self.usage, tenant)
    }

    /// The memtable room `tenant`'s pipelines share.
    pub(crate) fn memtables(&self, tenant: &str) -> Arc<SharedMemtables> {
        per_tenant(&self.memtables, tenant)
    }

    pub(crate) fn count_rejected(&self, tenant: &str) {
        *self
            .rejected
            .lock()
            .expect("rejected lock")
            .entry(tenant.to_owned())
            .or_default() += 1;
    }

    pub(crate) fn processor_record(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<ProcessorRecord, String> {
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
    pub(crate) fn load_processor(
        &self,
        tenant: &str,
        record: &ProcessorRecord,
    ) -> Result<Processor, String> {
        let path = self.blob_path(&record.hash);
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("cannot read processor {}: {e}", path.display()))?;
        self.load(&bytes, self.quotas(tenant).limits())
            .map_err(|e| e.to_string())
    }

    /// Loads a pipeline's processor under its tenant's sandbox limits and the capabilities
    /// the admin granted the pipeline. Blocks.
    pub(crate) fn load_for_pipeline(
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
    pub(crate) fn runner_spec(
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
            state_cache_bytes: Some(
                usize::try_from(quotas.state_cache_bytes).unwrap_or(usize::MAX),
            ),
            shared_memtables: Some(self.memtables(&record.tenant)),
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
    pub(crate) fn state_bytes(&self, tenant: &str) -> u64 {
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

    pub(crate) fn pipeline(&self, tenant: &str, id: &str) -> Option<Arc<PipelineHandle>> {
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
pub(crate) fn ingest_check(record: &PipelineRecord, processor: &Processor) -> IngestCheck {
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
fn restrict_to_owner(dir: &Path) -> Result<(), ServeError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir)
        .map_err(|source| ServeError::DataDir {
            what: format!("cannot read {}", dir.display()),
            source,
        })?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(
            |source| ServeError::DataDir {
                what: format!("cannot make {} accessible by its owner only", dir.display()),
                source,
            },
        )?;
        tracing::info!(
            dir = %dir.display(),
            was = format!("{:o}", mode & 0o777),
            "the data directory is now accessible by its owner only (700)"
        );
    }
    Ok(())
}

fn lock_data_dir(dir: &Path) -> Result<std::fs::File, ServeError> {
    use std::os::fd::AsRawFd;
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| ServeError::DataDir {
            what: format!("cannot open {}", path.display()),
            source,
        })?;
    // SAFETY: flock on a file descriptor this function owns; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(ServeError::DataDirInUse(dir.to_owned()));
    }
    Ok(file)
}

/// `tenant`'s entry of a per-tenant map of shared parts, made on its first use.
fn per_tenant<T: Default>(map: &Mutex<HashMap<String, Arc<T>>>, tenant: &str) -> Arc<T> {
    map.lock()
        .expect("per-tenant map lock")
        .entry(tenant.to_owned())
        .or_default()
        .clone()
}
