//! The server's metadata: tenants (with their API token hashes and quotas), processors and
//! pipelines. Kept in one small JSON file, rewritten atomically (temporary file, fsync,
//! rename, fsync of the directory) on every change, so a crash leaves either the old or the
//! new version, never a torn one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use statebox_engine::{OutputMode, TimeMode};

use crate::kafka::{SinkSpec, SourceSpec};

/// Per-tenant quotas and sandbox limits. Every field has a default, so an admin names only
/// what differs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Quotas {
    /// Processors the tenant may have uploaded at once.
    pub max_processors: u32,
    /// Pipelines the tenant may have at once.
    pub max_pipelines: u32,
    /// Largest processor upload, in bytes (HTTP 413 beyond it).
    pub max_upload_bytes: u64,
    /// Largest ingest request body, in bytes (HTTP 413 beyond it).
    pub max_ingest_request_bytes: u64,
    /// State bytes on disk over all the tenant's pipelines. Checked before a batch
    /// commits: a batch whose state writes (values, timers, their change log) would take
    /// the tenant past it commits nothing and fails its pipeline, whose ingest is then
    /// refused (HTTP 403) until it is started again.
    pub max_state_bytes: u64,
    /// CPU deadline of one processor call, in milliseconds.
    pub call_cpu_ms: u64,
    /// CPU budget of one batch's processor calls (all partitions), in milliseconds.
    pub batch_cpu_ms: u64,
    /// Linear memory of one processor instance, in bytes.
    pub memory_bytes: u64,
    /// Output rows one call may emit, in bytes.
    pub output_bytes_per_call: u64,
    /// Sustained ingest rate over all the tenant's pipelines, in rows per second (HTTP 429
    /// beyond it); bursts of up to one second's worth are allowed.
    pub ingest_rows_per_s: u64,
    /// Sustained ingest rate over all the tenant's pipelines, in bytes per second (HTTP 429
    /// beyond it), counted on the rows as stored; bursts of one second's worth.
    pub ingest_bytes_per_s: u64,
    /// Input bytes one batch reads at most (cut at a line boundary; one line longer than
    /// this is read whole), so a pipeline with a large backlog works through it in bounded
    /// memory, batch by batch.
    pub max_batch_bytes: u64,
    /// Worker threads one pipeline's batch runs its partitions on at most, so one pipeline
    /// does not hold every core (never more than the machine has cores: more threads than
    /// cores only adds switching).
    pub max_workers: u32,
    /// Bytes on disk over all the tenant's pipelines (input log, output, state) and
    /// processors (components and their compiled artefacts): ingest and uploads that would
    /// go past it are refused (HTTP 403). Input a pipeline has processed is reclaimed, and
    /// output past its retention (`output_retention_bytes`, `output_retention_ms`).
    pub max_disk_bytes: u64,
    /// Committed output one pipeline keeps at most, in bytes: its oldest rows are dropped
    /// past it, whole segments (an eighth of this) at a time, never the newest one (see
    /// the `retention` module).
    pub output_retention_bytes: u64,
    /// Committed output older than this (since its batch committed) is dropped, in
    /// milliseconds.
    pub output_retention_ms: u64,
    /// Committed state one pipeline keeps in memory in front of its database, in bytes
    /// (the state cache; 0: none). Host memory a tenant's pipelines drive: at most
    /// `max_pipelines` × this.
    pub state_cache_bytes: u64,
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas {
            max_processors: 32,
            max_pipelines: 16,
            max_upload_bytes: 64 << 20,
            max_ingest_request_bytes: 16 << 20,
            max_state_bytes: 4 << 30,
            call_cpu_ms: 10_000,
            batch_cpu_ms: 120_000,
            memory_bytes: 256 << 20,
            output_bytes_per_call: 16 << 20,
            ingest_rows_per_s: 1_000_000,
            ingest_bytes_per_s: 256 << 20,
            max_batch_bytes: 64 << 20,
            max_workers: 4,
            max_disk_bytes: 256 << 30,
            output_retention_bytes: 1 << 30,
            output_retention_ms: 7 * 24 * 3600 * 1000,
            state_cache_bytes: 32 << 20,
        }
    }
}

impl Quotas {
    /// The sandbox limits every call of the tenant's processors runs under.
    pub fn limits(&self) -> statebox_runtime::Limits {
        statebox_runtime::Limits {
            call_timeout: std::time::Duration::from_millis(self.call_cpu_ms),
            memory_bytes: usize::try_from(self.memory_bytes).unwrap_or(usize::MAX),
            output_bytes_per_call: usize::try_from(self.output_bytes_per_call)
                .unwrap_or(usize::MAX),
            // Granted per pipeline, not per tenant (`PUT /v1/pipelines/{id}/capabilities`).
            http_hosts: Vec::new(),
            http_routes: Vec::new(),
            // A budget per load: a pipeline's partitions share their processor's, which the
            // runtime checks inside every call and the meter charges after it.
            batch_cpu: Some(std::sync::Arc::new(statebox_runtime::CpuBudget::new(
                std::time::Duration::from_millis(self.batch_cpu_ms),
            ))),
            // The state a partition's overlay holds until the commit, per batch.
            state_bytes_per_batch: usize::try_from(self.memory_bytes)
                .unwrap_or(usize::MAX)
                .saturating_mul(4),
        }
    }

    /// Refuses settings no pipeline could run under.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("max_upload_bytes", self.max_upload_bytes),
            ("max_ingest_request_bytes", self.max_ingest_request_bytes),
            ("call_cpu_ms", self.call_cpu_ms),
            ("batch_cpu_ms", self.batch_cpu_ms),
            ("memory_bytes", self.memory_bytes),
            ("output_bytes_per_call", self.output_bytes_per_call),
            ("ingest_rows_per_s", self.ingest_rows_per_s),
            ("ingest_bytes_per_s", self.ingest_bytes_per_s),
            ("max_batch_bytes", self.max_batch_bytes),
            ("max_workers", u64::from(self.max_workers)),
            ("max_disk_bytes", self.max_disk_bytes),
            ("output_retention_bytes", self.output_retention_bytes),
            ("output_retention_ms", self.output_retention_ms),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(format!("quota `{name}` must be positive"));
            }
        }
        Ok(())
    }
}

/// One API token of a tenant; only its hash is stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public identifier of the token (not the secret).
    pub id: String,
    /// BLAKE3 of the token, hex.
    pub hash: String,
    /// When it was issued (ms since the epoch).
    pub created_ms: i64,
}

/// A tenant.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tenant {
    pub id: String,
    pub name: String,
    pub created_ms: i64,
    pub tokens: Vec<TokenRecord>,
    pub quotas: Quotas,
    /// Kafka brokers (`HOST:PORT`, host in lower case) the tenant's pipelines may read and
    /// write. Only the admin grants them (`PUT /v1/tenants/{id}/kafka`); empty, the
    /// default, allows none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kafka_brokers: Vec<String>,
}

/// A state variable a processor declares in `init`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VariableInfo {
    pub name: String,
    /// `value`, `list` or `map`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_schema: Option<String>,
    pub value_schema: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// An uploaded processor, stored by content hash.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessorRecord {
    pub id: String,
    pub tenant: String,
    /// BLAKE3 of the component, hex: the blob's name under `processors/`.
    pub hash: String,
    /// The name the processor declares.
    pub name: String,
    pub size_bytes: u64,
    pub uploaded_ms: i64,
    pub output_schema: String,
    pub input_schema: Option<String>,
    pub output_event_time_column: Option<String>,
    pub state_variables: Vec<VariableInfo>,
    /// Bytes of its compiled artefact, counted toward the tenant's disk quota.
    #[serde(default)]
    pub compiled_bytes: u64,
}

/// Event time of a pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventTimeSpec {
    /// Input column with epoch milliseconds or an ISO-8601 timestamp.
    pub column: String,
    /// The watermark trails the largest event time seen by this much.
    #[serde(default)]
    pub watermark_delay_ms: i64,
}

/// Whether a pipeline should be running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Desired {
    Running,
    Stopped,
    Failed,
}

/// A pipeline: a processor over the tenant's input, with its settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PipelineRecord {
    pub id: String,
    pub tenant: String,
    pub name: Option<String>,
    pub processor: String,
    pub key: Vec<String>,
    pub time_mode: TimeMode,
    pub output_mode: OutputMode,
    pub partitions: u16,
    pub event_time: Option<EventTimeSpec>,
    pub output_event_time_column: Option<String>,
    pub trigger_interval_ms: u64,
    pub has_initial_state: bool,
    pub desired: Desired,
    /// Why the pipeline failed, when it did.
    pub failure: Option<String>,
    pub created_ms: i64,
    /// Hosts (`HOST` or `HOST:PORT`) the pipeline's processor may send HTTP requests to
    /// (wasi:http). Only the admin grants them (`PUT /v1/pipelines/{id}/capabilities`);
    /// empty, the default, denies every request.
    #[serde(default)]
    pub http_hosts: Vec<String>,
    /// BLAKE3 of the component `http_hosts` was granted for (the pipeline's processor at
    /// the time of the grant). The grant applies to that component only: an upgrade to
    /// another one drops it, and a processor is loaded with it only if the digests match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_hosts_for: Option<String>,
    /// Where the pipeline reads: HTTP ingest (the default) or Kafka topics.
    #[serde(default)]
    pub source: SourceSpec,
    /// Where the pipeline writes: its output log (the default) or a Kafka topic.
    #[serde(default)]
    pub sink: SinkSpec,
}

/// Everything the registry file holds.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RegistryData {
    #[serde(default)]
    pub tenants: BTreeMap<String, Tenant>,
    /// Keyed by `tenant/processor-id`.
    #[serde(default)]
    pub processors: BTreeMap<String, ProcessorRecord>,
    #[serde(default)]
    pub pipelines: BTreeMap<String, PipelineRecord>,
}

/// Why the registry cannot be opened: the operator's to fix (the server refuses to start).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The file exists but cannot be read.
    #[error("cannot read the registry {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a registry (damaged, or edited by hand).
    #[error("the registry {} is unreadable", .path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The registry and the file it lives in.
pub struct Registry {
    path: PathBuf,
    pub data: RegistryData,
}

impl Registry {
    /// Loads `path`, or starts empty if it does not exist.
    pub fn open(path: &Path) -> Result<Registry, RegistryError> {
        let data = match std::fs::read(path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| RegistryError::Unreadable {
                    path: path.to_owned(),
                    source,
                })?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => RegistryData::default(),
            Err(source) => {
                return Err(RegistryError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let mut registry = Registry {
            path: path.to_owned(),
            data,
        };
        registry.bind_unbound_grants();
        Ok(registry)
    }

    /// Binds each HTTP grant stored before grants named their component (no
    /// `http_hosts_for`) to the pipeline's processor now, the one it has run with since.
    fn bind_unbound_grants(&mut self) {
        let RegistryData {
            processors,
            pipelines,
            ..
        } = &mut self.data;
        for p in pipelines.values_mut() {
            if !p.http_hosts.is_empty() && p.http_hosts_for.is_none() {
                p.http_hosts_for = processors
                    .get(&Registry::processor_key(&p.tenant, &p.processor))
                    .map(|r| r.hash.clone());
            }
        }
    }

    /// Writes the registry durably and atomically.
    pub fn save(&self) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(&self.data).expect("the registry serialises");
        write_atomically(&self.path, &bytes)
    }

    pub fn processor_key(tenant: &str, id: &str) -> String {
        format!("{tenant}/{id}")
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, with fsyncs, so readers
/// and crashes see either the old or the new content.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(dir)
}

/// Makes a directory's entries (created, renamed or removed files) durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `prefix` and `bytes` random bytes in hex.
pub fn random_id(prefix: &str, bytes: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)
        .map_err(|e| std::io::Error::other(format!("the OS random generator failed: {e}")))?;
    Ok(format!("{prefix}{}", hex(&buf)))
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        write!(s, "{b:02x}").expect("writing to a string");
    }
    s
}
