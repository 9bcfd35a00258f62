//! Pipelines: creating one (its settings checked, a place reserved under the quota, its
//! processor loaded and its runner started), stopping, starting, upgrading to another
//! processor, granting outbound HTTP, deleting.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use statebox_engine::{OutputMode, TimeMode, UpgradeCheck};
use statebox_runtime::Processor;

use super::tenants::save;
use super::{App, AppError, AppResult, ingest_check};
use crate::MAX_NAME_BYTES;
use crate::kafka::{SinkSpec, SourceSpec};
use crate::pipeline::{PipelineHandle, STILL_STOPPING};
use crate::registry::{
    Desired, EventTimeSpec, PipelineRecord, ProcessorRecord, Registry, now_ms, random_id,
    write_atomically,
};
use crate::rows::compact_line;

/// What a tenant asks for when it creates a pipeline (the body of `POST /v1/pipelines`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PipelineSpec {
    pub processor: String,
    pub key: KeyColumns,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub time_mode: Option<TimeMode>,
    #[serde(default)]
    pub output_mode: Option<OutputMode>,
    #[serde(default)]
    pub partitions: Option<u16>,
    #[serde(default)]
    pub event_time: Option<EventTimeSpec>,
    #[serde(default)]
    pub output_event_time_column: Option<String>,
    #[serde(default)]
    pub trigger_interval_ms: Option<u64>,
    /// Rows of the initial state (JSON objects with the key columns).
    #[serde(default)]
    pub initial_state: Option<Vec<Box<serde_json::value::RawValue>>>,
    /// HTTP ingest (the default) or Kafka topics (see [`crate::kafka`]).
    #[serde(default)]
    pub source: SourceSpec,
    /// The output log (the default) or a Kafka topic.
    #[serde(default)]
    pub sink: SinkSpec,
}

impl PipelineSpec {
    /// A spec with every optional setting at its default.
    #[cfg(test)]
    pub fn new(processor: &str, key: &str) -> PipelineSpec {
        PipelineSpec {
            processor: processor.to_owned(),
            key: KeyColumns::One(key.to_owned()),
            name: None,
            time_mode: None,
            output_mode: None,
            partitions: None,
            event_time: None,
            output_event_time_column: None,
            trigger_interval_ms: None,
            initial_state: None,
            source: SourceSpec::Http,
            sink: SinkSpec::Output,
        }
    }
}

/// `"k"`, `"a,b"` or `["a", "b"]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum KeyColumns {
    One(String),
    Many(Vec<String>),
}

impl KeyColumns {
    fn columns(self) -> Vec<String> {
        match self {
            KeyColumns::One(s) => s.split(',').map(|c| c.trim().to_owned()).collect(),
            KeyColumns::Many(v) => v,
        }
    }
}

/// A pipeline as stored, with its live handle (none only in the moment between its
/// record's and its handle's removal).
#[derive(Clone)]
pub(crate) struct Pipeline {
    pub record: PipelineRecord,
    pub handle: Option<Arc<PipelineHandle>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("record", &self.record)
            .field("status", &self.handle.as_ref().map(|h| h.status()))
            .finish()
    }
}

/// The outcome of an upgrade.
#[derive(Debug)]
pub(crate) struct Upgraded {
    pub pipeline: Pipeline,
    /// The compatibility report of the new processor against the pipeline's state.
    pub report: String,
    /// Whether an outbound-HTTP grant was dropped (it was for the old component).
    pub http_grant_dropped: bool,
}

/// The outcome of a grant of outbound HTTP.
#[derive(Debug)]
pub(crate) struct Granted {
    pub pipeline: Pipeline,
    /// Whether the pipeline's runner restarts with the grant.
    pub restarted: bool,
}

impl App {
    /// Creates a pipeline of `tenant` and starts it; the errors name the field at fault.
    /// Blocks while the processor loads and its `init` runs (no lock other requests need
    /// is held meanwhile).
    pub(crate) fn create_pipeline(
        self: &Arc<Self>,
        tenant: &str,
        mut spec: PipelineSpec,
    ) -> AppResult<Pipeline> {
        let quotas = self.quotas(tenant);
        let key = spec.key.columns();
        if key.is_empty() || key.iter().any(|c| c.is_empty()) {
            return Err(AppError::bad_input(
                "`key` must name at least one column, none of them empty",
            ));
        }
        let partitions = spec.partitions.unwrap_or(4);
        if !(1..=1024).contains(&partitions) {
            return Err(AppError::bad_input(
                "`partitions` must be between 1 and 1024",
            ));
        }
        let trigger_interval_ms = spec.trigger_interval_ms.unwrap_or(1000);
        if !(10..=86_400_000).contains(&trigger_interval_ms) {
            return Err(AppError::bad_input(
                "`trigger_interval_ms` must be between 10 and 86400000",
            ));
        }
        let time_mode = spec.time_mode.unwrap_or(TimeMode::None);
        if spec.event_time.is_some() != (time_mode == TimeMode::EventTime) {
            return Err(AppError::bad_input(
                "`event_time` ({\"column\", \"watermark_delay_ms\"}) is required with time_mode \
                 `event-time` and not allowed otherwise",
            ));
        }
        if spec.name.as_ref().is_some_and(|n| n.len() > MAX_NAME_BYTES) {
            return Err(AppError::bad_input(format!(
                "`name` is longer than the limit of {MAX_NAME_BYTES} bytes"
            )));
        }
        crate::kafka::check_spec(&mut spec.source, &mut spec.sink, spec.event_time.is_some())?;
        self.check_kafka_grant(tenant, &spec.source, &spec.sink)?;
        // A place is reserved under the quota; no lock is held while the processor loads
        // and its `init` runs.
        let (processor, _reserved) = {
            let registry = self.registry.lock().expect("registry lock");
            let stored = registry
                .data
                .pipelines
                .values()
                .filter(|p| p.tenant == tenant)
                .count();
            let processor = registry
                .data
                .processors
                .get(&Registry::processor_key(tenant, &spec.processor))
                .cloned()
                .ok_or_else(|| AppError::not_found("processor", &spec.processor))?;
            drop(registry);
            if let Some(why) = crate::kafka::sink_key_missing(
                &spec.sink,
                &key,
                &processor.id,
                &processor.output_schema,
            ) {
                return Err(AppError::bad_input(why));
            }
            let reserved = self
                .reserve(tenant, "pipelines", stored, quotas.max_pipelines)
                .map_err(|count| {
                    self.count_rejected(tenant);
                    AppError::Quota(format!(
                        "the tenant already has {count} pipelines (some may still be \
                         starting), its quota (`max_pipelines`)"
                    ))
                })?;
            (processor, reserved)
        };
        let id = random_id("pl_", 8).map_err(|e| AppError::internal(e.to_string()))?;
        let record = PipelineRecord {
            id: id.clone(),
            tenant: tenant.to_owned(),
            name: spec.name,
            processor: processor.id.clone(),
            key,
            time_mode,
            output_mode: spec.output_mode.unwrap_or(OutputMode::Update),
            partitions,
            event_time: spec.event_time,
            output_event_time_column: spec.output_event_time_column,
            trigger_interval_ms,
            has_initial_state: spec.initial_state.is_some(),
            desired: Desired::Running,
            failure: None,
            created_ms: now_ms(),
            http_hosts: Vec::new(),
            http_hosts_for: None,
            source: spec.source,
            sink: spec.sink,
        };
        let mut initial = String::new();
        for (i, row) in spec.initial_state.iter().flatten().enumerate() {
            if !row.get().trim_start().starts_with('{') {
                return Err(AppError::bad_input(format!(
                    "initial_state row {i}: a row must be a JSON object"
                )));
            }
            initial.push_str(&compact_line(row.get())?);
            initial.push('\n');
        }
        let dir = self.pipeline_dir(&record.id);
        let started = (|| -> Result<Arc<PipelineHandle>, String> {
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            if record.has_initial_state {
                write_atomically(
                    &PipelineHandle::initial_state_path(&dir),
                    initial.as_bytes(),
                )
                .map_err(|e| format!("cannot store the initial state: {e}"))?;
            }
            let loaded = self.load_processor(&record.tenant, &processor)?;
            let handle = Arc::new(
                PipelineHandle::new(
                    &record.id,
                    &record.tenant,
                    &dir,
                    ingest_check(&record, &loaded),
                )
                .map_err(|e| format!("cannot open the input log: {e}"))?,
            );
            handle.start(self.runner_spec(&record, loaded)?, self.me.clone())?;
            Ok(handle)
        })();
        let handle = match started {
            Ok(handle) => handle,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(AppError::bad_input(format!(
                    "cannot start the pipeline: {e}"
                )));
            }
        };
        {
            let mut registry = self.registry.lock().expect("registry lock");
            registry.data.pipelines.insert(id.clone(), record.clone());
            save(&registry)?;
        }
        self.pipelines
            .lock()
            .expect("pipelines lock")
            .insert(id.clone(), handle.clone());
        tracing::info!(tenant = %tenant, pipeline = %id, "pipeline created");
        Ok(Pipeline {
            record,
            handle: Some(handle),
        })
    }

    /// The record of the tenant's pipeline `id`.
    pub(crate) fn pipeline_record(&self, tenant: &str, id: &str) -> AppResult<PipelineRecord> {
        self.registry
            .lock()
            .expect("registry lock")
            .data
            .pipelines
            .get(id)
            .filter(|p| p.tenant == tenant)
            .cloned()
            .ok_or_else(|| AppError::not_found("pipeline", id))
    }

    /// Changes the tenant's pipeline `id`'s stored record with `change` and saves the
    /// registry; returns the record as stored. `change` works on a copy, so a change that
    /// fails leaves the record as it was.
    pub(crate) fn update_pipeline_record(
        &self,
        tenant: &str,
        id: &str,
        change: impl FnOnce(&mut PipelineRecord) -> AppResult<()>,
    ) -> AppResult<PipelineRecord> {
        let mut registry = self.registry.lock().expect("registry lock");
        let record = registry
            .data
            .pipelines
            .get_mut(id)
            .filter(|r| r.tenant == tenant)
            .ok_or_else(|| AppError::not_found("pipeline", id))?;
        let mut updated = record.clone();
        change(&mut updated)?;
        *record = updated.clone();
        save(&registry)?;
        Ok(updated)
    }

    /// The live handle of the tenant's pipeline `id`.
    pub(crate) fn pipeline_handle(&self, tenant: &str, id: &str) -> AppResult<Arc<PipelineHandle>> {
        self.pipeline(tenant, id)
            .ok_or_else(|| AppError::not_found("pipeline", id))
    }

    /// The tenant's pipeline `id`.
    pub(crate) fn pipeline_view(&self, tenant: &str, id: &str) -> AppResult<Pipeline> {
        let record = self.pipeline_record(tenant, id)?;
        Ok(Pipeline {
            record,
            handle: self.pipeline(tenant, id),
        })
    }

    /// The tenant's pipelines.
    pub(crate) fn pipelines_of(&self, tenant: &str) -> Vec<Pipeline> {
        let records: Vec<PipelineRecord> = self
            .registry
            .lock()
            .expect("registry lock")
            .data
            .pipelines
            .values()
            .filter(|p| p.tenant == tenant)
            .cloned()
            .collect();
        records
            .into_iter()
            .map(|record| Pipeline {
                handle: self.pipeline(tenant, &record.id),
                record,
            })
            .collect()
    }

    /// Deletes the tenant's pipeline `id` with its input, output and state; a runner still
    /// in a guest call removes them once it has stopped. Blocks (up to the stop wait).
    pub(crate) fn delete_pipeline(&self, tenant: &str, id: &str) -> AppResult<()> {
        self.pipeline_record(tenant, id)?;
        let handle = self.pipelines.lock().expect("pipelines lock").remove(id);
        {
            let mut registry = self.registry.lock().expect("registry lock");
            registry.data.pipelines.remove(id);
            save(&registry)?;
        }
        self.readers.forget(id);
        let dir = self.pipeline_dir(id);
        match handle {
            // A runner still in a guest call removes the directory once it has stopped.
            Some(h) => {
                h.stop_then(self.config.http.stop_wait, move || {
                    let _ = std::fs::remove_dir_all(dir);
                });
            }
            None => {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        Ok(())
    }

    /// Stops the tenant's pipeline `id` after its current batch (waiting up to the stop
    /// wait; past it the pipeline shows `stopping` and its runner stops after its call
    /// ends). It stays stopped across restarts. Blocks.
    pub(crate) fn stop_pipeline(&self, tenant: &str, id: &str) -> AppResult<Pipeline> {
        let h = self.pipeline_handle(tenant, id)?;
        h.stop(self.config.http.stop_wait);
        let record = self.update_pipeline_record(tenant, id, |r| {
            if r.desired == Desired::Running {
                r.desired = Desired::Stopped;
            }
            Ok(())
        })?;
        Ok(Pipeline {
            record,
            handle: Some(h),
        })
    }

    /// Starts the tenant's pipeline `id` again (after a stop or a failure). Blocks while
    /// its processor loads and its `init` runs.
    pub(crate) fn start_pipeline(self: &Arc<Self>, tenant: &str, id: &str) -> AppResult<Pipeline> {
        let h = self.pipeline_handle(tenant, id)?;
        let record = self.pipeline_record(tenant, id)?;
        self.check_kafka_grant(tenant, &record.source, &record.sink)?;
        self.start_runner(&record, &h)
            .map_err(|e| AppError::conflict(format!("cannot start the pipeline: {e}")))?;
        let record = self.update_pipeline_record(tenant, id, |r| {
            r.desired = Desired::Running;
            r.failure = None;
            Ok(())
        })?;
        Ok(Pipeline {
            record,
            handle: Some(h),
        })
    }

    /// Starts a pipeline's runner with `record`'s settings. Blocks.
    pub(crate) fn start_runner(
        &self,
        record: &PipelineRecord,
        h: &Arc<PipelineHandle>,
    ) -> Result<(), String> {
        if h.is_stopping() {
            return Err(STILL_STOPPING.into());
        }
        let processor = self.processor_record(&record.tenant, &record.processor)?;
        let loaded = self.load_for_pipeline(record, &processor)?;
        *h.ingest.lock().expect("ingest lock") = Arc::new(ingest_check(record, &loaded));
        h.start(self.runner_spec(record, loaded)?, self.me.clone())
    }

    /// Loads processor `new` (under its tenant's limits) and checks it against the state
    /// of the pipeline `h`, changing nothing: whether it could take the pipeline over, and
    /// why not. Blocks.
    pub(crate) fn check_processor_against(
        &self,
        h: &PipelineHandle,
        new: &ProcessorRecord,
    ) -> AppResult<(Processor, UpgradeCheck)> {
        let loaded = self
            .load_processor(&new.tenant, new)
            .map_err(AppError::InvalidProcessor)?;
        let check =
            statebox_engine::check_upgrade(&PipelineHandle::checkpoint_dir(&h.dir), &loaded)
                .map_err(|e| AppError::IncompatibleProcessor {
                    message: format!(
                        "the new processor cannot be checked against the pipeline's state: {e}"
                    ),
                    report: None,
                })?;
        Ok((loaded, check))
    }

    /// Moves the tenant's pipeline `id` to the tenant's processor `processor`, if its
    /// state allows (the report says what was checked); a running pipeline restarts on it
    /// (after its current batch). An outbound-HTTP grant does not pass to another
    /// component. Blocks.
    pub(crate) fn upgrade_pipeline(
        self: &Arc<Self>,
        tenant: &str,
        id: &str,
        processor: &str,
    ) -> AppResult<Upgraded> {
        let h = self.pipeline_handle(tenant, id)?;
        let record = self.pipeline_record(tenant, id)?;
        let new = self
            .processor_record(tenant, processor)
            .map_err(|_| AppError::not_found("processor", processor))?;
        if let Some(why) =
            crate::kafka::sink_key_missing(&record.sink, &record.key, &new.id, &new.output_schema)
        {
            return Err(AppError::IncompatibleProcessor {
                message: format!("{why}; the pipeline keeps its current processor"),
                report: None,
            });
        }
        let mut upgraded = record.clone();
        upgraded.processor = new.id.clone();
        // An outbound-HTTP grant was given for the component the pipeline ran; another
        // component does not inherit it (the admin grants again if it should have it).
        let new_hash = new.hash.clone();
        let mut grant_dropped = !upgraded.http_hosts.is_empty()
            && upgraded.http_hosts_for.as_deref() != Some(new_hash.as_str());
        if grant_dropped {
            upgraded.http_hosts.clear();
            upgraded.http_hosts_for = None;
        }
        let (loaded, check) = self.check_processor_against(&h, &new)?;
        let report = check.to_string();
        if !check.is_compatible() {
            return Err(AppError::IncompatibleProcessor {
                message: format!(
                    "processor `{}` is incompatible with the pipeline's state; the pipeline \
                     keeps its current processor",
                    new.id
                ),
                report: Some(report),
            });
        }
        let was_running = h.is_running();
        if !h.stop(self.config.http.stop_wait) {
            // The runner is inside a processor call: the upgrade completes once it returns.
            let (app, h2, upgraded2) = (self.clone(), h.clone(), upgraded.clone());
            h.stop_then(Duration::ZERO, move || {
                if let Err(e) = app.start_runner(&upgraded2, &h2) {
                    tracing::warn!(pipeline = %h2.id, "the upgraded pipeline cannot start");
                    app.pipeline_failed(&h2.id, &format!("the upgrade was refused: {e}"));
                }
            });
        } else if was_running && let Err(e) = self.start_runner(&upgraded, &h) {
            // Back to the processor that ran before.
            let _ = self.start_runner(&record, &h);
            return Err(AppError::Conflict {
                message: format!("the upgrade was refused: {e}"),
                report: Some(report),
            });
        } else if !was_running {
            *h.ingest.lock().expect("ingest lock") = Arc::new(ingest_check(&upgraded, &loaded));
        }
        let upgraded = self.update_pipeline_record(tenant, id, |r| {
            r.processor = upgraded.processor.clone();
            // Checked again here: a grant stored meanwhile was for the old component.
            if r.http_hosts_for.as_deref() != Some(new_hash.as_str()) {
                grant_dropped |= !r.http_hosts.is_empty();
                r.http_hosts.clear();
                r.http_hosts_for = None;
            }
            Ok(())
        })?;
        tracing::info!(
            pipeline = %id,
            processor = %upgraded.processor,
            http_grant_dropped = grant_dropped,
            "pipeline upgraded"
        );
        Ok(Upgraded {
            pipeline: Pipeline {
                record: upgraded,
                handle: Some(h),
            },
            report,
            http_grant_dropped: grant_dropped,
        })
    }

    /// Sets the hosts pipeline `id`'s processor may send HTTP requests to (wasi:http), for
    /// the component it runs now; the admin's only (a tenant cannot grant its own
    /// processors network access). A running pipeline restarts on the new grant (after its
    /// current batch); a stopped or failed one gets it when it starts again. Blocks.
    pub(crate) fn grant_http_hosts(
        self: &Arc<Self>,
        id: &str,
        http_hosts: &[String],
    ) -> AppResult<Granted> {
        let mut hosts = Vec::with_capacity(http_hosts.len());
        for (i, host) in http_hosts.iter().enumerate() {
            let host = statebox_runtime::HttpHost::parse(host)
                .map_err(|e| AppError::bad_input(format!("`http_hosts[{i}]`: {e}")))?;
            hosts.push(host.to_string());
        }
        hosts.sort();
        hosts.dedup();
        let record = self
            .registry
            .lock()
            .expect("registry lock")
            .data
            .pipelines
            .get(id)
            .cloned()
            .ok_or_else(|| AppError::not_found("pipeline", id))?;
        let h = self.pipeline_handle(&record.tenant, id)?;
        let mut granted = record.clone();
        granted.http_hosts = hosts;
        {
            let mut registry = self.registry.lock().expect("registry lock");
            // The grant is for the component the pipeline runs now (read under the same
            // lock an upgrade stores the new processor under, so it names the one that
            // gets it).
            let Some(current) = registry.data.pipelines.get(id).map(|r| r.processor.clone()) else {
                return Err(AppError::not_found("pipeline", id));
            };
            let digest = registry
                .data
                .processors
                .get(&Registry::processor_key(&record.tenant, &current))
                .map(|p| p.hash.clone())
                .ok_or_else(|| {
                    AppError::internal(format!("the pipeline's processor `{current}` is missing"))
                })?;
            if let Some(r) = registry.data.pipelines.get_mut(id) {
                r.http_hosts = granted.http_hosts.clone();
                r.http_hosts_for = (!r.http_hosts.is_empty()).then_some(digest);
                granted = r.clone();
            }
            save(&registry)?;
        }
        let restarted = self.restart_with(&granted, &h, "the grant")?;
        tracing::info!(pipeline = %id, hosts = ?granted.http_hosts, "pipeline capabilities granted");
        Ok(Granted {
            pipeline: Pipeline {
                record: granted,
                handle: Some(h),
            },
            restarted,
        })
    }

    /// Restarts pipeline `h`, if it is running, with `record`: its settings as just stored
    /// with a change (`what`: "the grant", ...). At once when its runner stops within the
    /// stop wait, else once its current processor call returns (a failure to start then
    /// marks it failed). Returns whether it was running; 409 when it could not start now.
    pub(crate) fn restart_with(
        self: &Arc<Self>,
        record: &PipelineRecord,
        h: &Arc<PipelineHandle>,
        what: &str,
    ) -> AppResult<bool> {
        if !h.is_running() {
            return Ok(false);
        }
        if !h.stop(self.config.http.stop_wait) {
            let (app, h2, record2, what2) =
                (self.clone(), h.clone(), record.clone(), what.to_owned());
            h.stop_then(Duration::ZERO, move || {
                if let Err(e) = app.start_runner(&record2, &h2) {
                    app.pipeline_failed(&h2.id, &format!("cannot restart with {what2}: {e}"));
                }
            });
            return Ok(true);
        }
        self.start_runner(record, h).map_err(|e| {
            AppError::conflict(format!(
                "the pipeline could not restart with {what} (which is stored): {e}"
            ))
        })?;
        Ok(true)
    }
}
