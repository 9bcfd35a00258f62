//! Processors: uploading a component (checked against the world, its declarations
//! bounded, its `init` run in describe mode, stored by content hash), listing and deleting.

use std::sync::Arc;

use statebox_state::catalog::{Catalog, InitOp, VarKind};

use super::tenants::save;
use super::{App, AppError, AppResult};
use crate::registry::{ProcessorRecord, Registry, VariableInfo, now_ms, write_atomically};
use crate::{MAX_NAME_BYTES, MAX_SCHEMA_BYTES, MAX_VARIABLES, bounded_message};

/// The outcome of an upload.
#[derive(Clone, Debug)]
pub(crate) struct Uploaded {
    pub record: ProcessorRecord,
    /// False when the tenant had uploaded the same component before (nothing changed).
    pub created: bool,
}

fn kind_name(kind: VarKind) -> &'static str {
    match kind {
        VarKind::Value => "value",
        VarKind::List => "list",
        VarKind::Map => "map",
    }
}

impl App {
    /// Uploads the component `bytes` for `tenant`: refused over the tenant's quotas, or
    /// when it does not load, declares too much, or its `init` fails. The same component
    /// uploaded again returns the stored record. No lock other requests need is held while
    /// the component compiles and its guest code runs. Blocks.
    pub(crate) fn upload_processor(
        self: &Arc<Self>,
        tenant: &str,
        bytes: &[u8],
    ) -> AppResult<Uploaded> {
        if bytes.is_empty() {
            return Err(AppError::bad_input(
                "the request body is empty: send the processor's .wasm component as the body",
            ));
        }
        let quotas = self.quotas(tenant);
        if let Err(reason) = self.check_disk_quota(tenant, bytes.len() as u64) {
            self.count_rejected(tenant);
            return Err(AppError::Quota(reason));
        }
        let hash = crate::registry::hex(blake3::hash(bytes).as_bytes());
        let id = format!("pr_{}", &hash[..24]);
        let key = Registry::processor_key(tenant, &id);
        // A place is reserved under the quota; no lock is held while the component
        // compiles and its `describe` and `init` run, which take as long as the guest
        // makes them.
        let _reserved = {
            let registry = self.registry.lock().expect("registry lock");
            if let Some(existing) = registry.data.processors.get(&key) {
                return Ok(Uploaded {
                    record: existing.clone(),
                    created: false,
                });
            }
            let stored = registry
                .data
                .processors
                .values()
                .filter(|p| p.tenant == tenant)
                .count();
            drop(registry);
            self.reserve(tenant, "processors", stored, quotas.max_processors)
                .map_err(|count| {
                    self.count_rejected(tenant);
                    AppError::Quota(format!(
                        "the tenant already has {count} processors (some may still be \
                         uploading), its quota (`max_processors`)"
                    ))
                })?
        };
        let invalid = |message: String| AppError::InvalidProcessor(message);
        let processor = self
            .load(bytes, quotas.limits())
            .map_err(|e| invalid(bounded_message(&e.to_string())))?;
        // What the guest declared is bounded before anything else is done with it: it
        // ends up in the registry, which every request reads and every change rewrites.
        check_declared(processor.info()).map_err(invalid)?;
        // The state variables, from `init` in describe mode (processing time, so TTL'd
        // variables are accepted).
        let described = processor
            .describe_init(
                statebox_contract::TimeMode::ProcessingTime,
                &Catalog::default(),
            )
            .map_err(|e| invalid(bounded_message(&format!("its `init` failed: {e}"))))?;
        if let Some(e) = &described.init_error {
            return Err(invalid(bounded_message(&format!("its `init` failed: {e}"))));
        }
        let state_variables = described
            .ops
            .iter()
            .filter_map(|(op, outcome)| match (op, outcome) {
                (InitOp::Declare(d), Ok(())) => Some(VariableInfo {
                    name: d.name.clone(),
                    kind: kind_name(d.kind).to_owned(),
                    key_schema: d.key_schema.clone(),
                    value_schema: d.value_schema.clone(),
                    ttl_ms: d.ttl_ms,
                }),
                _ => None,
            })
            .collect::<Vec<VariableInfo>>();
        check_variables(&state_variables).map_err(invalid)?;
        let path = self.blob_path(&hash);
        if !path.exists() {
            write_atomically(&path, bytes)
                .map_err(|e| AppError::internal(format!("cannot store the processor: {e}")))?;
        }
        let info = processor.info();
        let record = ProcessorRecord {
            id: id.clone(),
            tenant: tenant.to_owned(),
            hash: hash.clone(),
            name: info.name.clone(),
            size_bytes: bytes.len() as u64,
            uploaded_ms: now_ms(),
            output_schema: info.output_schema.to_ddl(),
            input_schema: info.input_schema.as_ref().map(|s| s.to_ddl()),
            output_event_time_column: info.output_event_time_column.clone(),
            state_variables,
            compiled_bytes: self.compiled_bytes(&hash),
        };
        let mut registry = self.registry.lock().expect("registry lock");
        registry.data.processors.insert(key, record.clone());
        save(&registry)?;
        tracing::info!(tenant = %tenant, processor = %record.id, "processor uploaded");
        Ok(Uploaded {
            record,
            created: true,
        })
    }

    /// The tenant's processors.
    pub(crate) fn processors(&self, tenant: &str) -> Vec<ProcessorRecord> {
        let registry = self.registry.lock().expect("registry lock");
        registry
            .data
            .processors
            .values()
            .filter(|p| p.tenant == tenant)
            .cloned()
            .collect()
    }

    /// The tenant's processor `id`.
    pub(crate) fn processor(&self, tenant: &str, id: &str) -> AppResult<ProcessorRecord> {
        self.processor_record(tenant, id)
            .map_err(|_| AppError::not_found("processor", id))
    }

    /// Deletes the tenant's processor `id`, refused while a pipeline uses it; its
    /// component (and compiled artefact) goes once no tenant's processor uses it.
    pub(crate) fn delete_processor(&self, tenant: &str, id: &str) -> AppResult<()> {
        let mut registry = self.registry.lock().expect("registry lock");
        let key = Registry::processor_key(tenant, id);
        let Some(record) = registry.data.processors.get(&key).cloned() else {
            return Err(AppError::not_found("processor", id));
        };
        let users: Vec<&str> = registry
            .data
            .pipelines
            .values()
            .filter(|p| p.tenant == tenant && p.processor == id)
            .map(|p| p.id.as_str())
            .collect();
        if !users.is_empty() {
            return Err(AppError::conflict(format!(
                "processor `{id}` is used by pipeline(s) {}; delete them or upgrade them to \
                 another processor first",
                users.join(", ")
            )));
        }
        registry.data.processors.remove(&key);
        save(&registry)?;
        if !registry
            .data
            .processors
            .values()
            .any(|p| p.hash == record.hash)
        {
            // Reclaimed with the blob: the compiled artefact in the server's own cache.
            let _ = std::fs::remove_file(self.blob_path(&record.hash));
            self.forget_compiled(&record.hash);
        }
        Ok(())
    }
}

/// Refuses a processor whose declared name, schemas or event-time column are over their
/// limits ([`MAX_NAME_BYTES`], [`MAX_SCHEMA_BYTES`]), naming which.
fn check_declared(info: &statebox_contract::ProcessorInfo) -> Result<(), String> {
    let over = |what: &str, len: usize, max: usize| {
        format!("its {what} is {len} bytes long, more than the limit of {max} bytes")
    };
    if info.name.len() > MAX_NAME_BYTES {
        return Err(over("name", info.name.len(), MAX_NAME_BYTES));
    }
    if let Some(c) = &info.output_event_time_column
        && c.len() > MAX_NAME_BYTES
    {
        return Err(over("output event-time column", c.len(), MAX_NAME_BYTES));
    }
    let output = info.output_schema.to_ddl();
    if output.len() > MAX_SCHEMA_BYTES {
        return Err(over("output schema", output.len(), MAX_SCHEMA_BYTES));
    }
    if let Some(input) = &info.input_schema {
        let input = input.to_ddl();
        if input.len() > MAX_SCHEMA_BYTES {
            return Err(over("input schema", input.len(), MAX_SCHEMA_BYTES));
        }
    }
    Ok(())
}

/// Refuses state variables over their limits ([`MAX_VARIABLES`], [`MAX_NAME_BYTES`],
/// [`MAX_SCHEMA_BYTES`]), naming which.
fn check_variables(vars: &[VariableInfo]) -> Result<(), String> {
    if vars.len() > MAX_VARIABLES {
        return Err(format!(
            "it declares {} state variables, more than the limit of {MAX_VARIABLES}",
            vars.len()
        ));
    }
    for v in vars {
        if v.name.len() > MAX_NAME_BYTES {
            return Err(format!(
                "a state variable's name is {} bytes long, more than the limit of \
                 {MAX_NAME_BYTES} bytes",
                v.name.len()
            ));
        }
        let schemas = v.value_schema.len() + v.key_schema.as_ref().map_or(0, String::len);
        if schemas > MAX_SCHEMA_BYTES {
            return Err(format!(
                "state variable `{}` has schemas of {schemas} bytes, more than the limit of \
                 {MAX_SCHEMA_BYTES} bytes",
                v.name
            ));
        }
    }
    Ok(())
}
