//! Tenants (the admin's): creating them with their first API token, quotas, tokens,
//! deleting a tenant with everything it has; and what a tenant sees of itself.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;

use super::{App, AppError, AppResult};
use crate::auth::token_hash;
use crate::pipeline::PipelineHandle;
use crate::registry::{Registry, Tenant, TokenRecord, now_ms, random_id};
use crate::{MAX_NAME_BYTES, Quotas};

/// A tenant as it sees itself: its settings and what it uses.
#[derive(Clone, Debug)]
pub(crate) struct TenantUsageView {
    pub id: String,
    pub name: String,
    pub quotas: Quotas,
    /// The Kafka brokers its pipelines may use (granted by the admin).
    pub kafka_brokers: Vec<String>,
    pub processors: usize,
    pub pipelines: usize,
    pub state_bytes: u64,
    pub disk_bytes: u64,
    pub cpu_ns: u64,
    pub memory_high_water_bytes: u64,
}

/// Applies the fields of `patch` (a JSON object) over `base`; the error names what is
/// wrong.
pub(crate) fn merge_quotas(base: &Quotas, patch: Option<Value>) -> AppResult<Quotas> {
    let mut merged = serde_json::to_value(base).expect("quotas serialise");
    match patch {
        None => {}
        Some(Value::Object(fields)) => {
            merged
                .as_object_mut()
                .expect("quotas are an object")
                .extend(fields);
        }
        Some(_) => return Err(AppError::bad_input("`quotas` must be a JSON object")),
    }
    let quotas: Quotas = serde_json::from_value(merged)
        .map_err(|e| AppError::bad_input(format!("invalid quotas: {e}")))?;
    quotas.validate().map_err(AppError::BadInput)?;
    Ok(quotas)
}

/// A new API token and the record stored for it (its hash, never the token).
fn new_token() -> AppResult<(String, TokenRecord)> {
    let token = random_id("sbx_", 32).map_err(|e| AppError::internal(e.to_string()))?;
    let record = TokenRecord {
        id: random_id("tok_", 6).map_err(|e| AppError::internal(e.to_string()))?,
        hash: token_hash(&token),
        created_ms: now_ms(),
    };
    Ok((token, record))
}

/// Writes the registry, or fails the operation (its change stays in memory only until
/// the next successful save).
pub(crate) fn save(registry: &Registry) -> AppResult<()> {
    registry
        .save()
        .map_err(|e| AppError::internal(format!("cannot save the registry: {e}")))
}

impl App {
    /// Creates a tenant named `name` with the default quotas patched by `quotas` (a JSON
    /// object of the fields that differ); returns it and its first API token (shown once).
    pub(crate) fn create_tenant(
        &self,
        name: String,
        quotas: Option<Value>,
    ) -> AppResult<(Tenant, String)> {
        if name.trim().is_empty() {
            return Err(AppError::bad_input("`name` must not be empty"));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(AppError::bad_input(format!(
                "`name` is {} bytes long, more than the limit of {MAX_NAME_BYTES}",
                name.len()
            )));
        }
        let quotas = merge_quotas(&self.config.default_quotas, quotas)?;
        let (token, token_record) = new_token()?;
        let tenant = Tenant {
            id: random_id("tn_", 8).map_err(|e| AppError::internal(e.to_string()))?,
            name,
            created_ms: now_ms(),
            tokens: vec![token_record],
            quotas,
            kafka_brokers: Vec::new(),
        };
        {
            let mut registry = self.registry.lock().expect("registry lock");
            registry
                .data
                .tenants
                .insert(tenant.id.clone(), tenant.clone());
            save(&registry)?;
        }
        self.reload_tokens();
        tracing::info!(tenant = %tenant.id, "tenant created");
        Ok((tenant, token))
    }

    /// Every tenant.
    pub(crate) fn tenants(&self) -> Vec<Tenant> {
        let registry = self.registry.lock().expect("registry lock");
        registry.data.tenants.values().cloned().collect()
    }

    /// The tenant `id`.
    pub(crate) fn tenant(&self, id: &str) -> AppResult<Tenant> {
        self.registry
            .lock()
            .expect("registry lock")
            .data
            .tenants
            .get(id)
            .cloned()
            .ok_or_else(|| AppError::not_found("tenant", id))
    }

    /// Changes the fields of tenant `id`'s quotas that `patch` (a JSON object) names.
    pub(crate) fn patch_quotas(&self, id: &str, patch: Value) -> AppResult<Tenant> {
        let mut registry = self.registry.lock().expect("registry lock");
        let tenant = registry
            .data
            .tenants
            .get_mut(id)
            .ok_or_else(|| AppError::not_found("tenant", id))?;
        tenant.quotas = merge_quotas(&tenant.quotas, Some(patch))?;
        let tenant = tenant.clone();
        save(&registry)?;
        Ok(tenant)
    }

    /// Issues tenant `id` another API token; returns its record and the token (shown once).
    pub(crate) fn issue_token(&self, id: &str) -> AppResult<(TokenRecord, String)> {
        let (token, record) = new_token()?;
        {
            let mut registry = self.registry.lock().expect("registry lock");
            let tenant = registry
                .data
                .tenants
                .get_mut(id)
                .ok_or_else(|| AppError::not_found("tenant", id))?;
            tenant.tokens.push(record.clone());
            save(&registry)?;
        }
        self.reload_tokens();
        Ok((record, token))
    }

    /// Revokes tenant `id`'s token `token` (its public id): requests with it are refused
    /// from now on.
    pub(crate) fn revoke_token(&self, id: &str, token: &str) -> AppResult<()> {
        {
            let mut registry = self.registry.lock().expect("registry lock");
            let tenant = registry
                .data
                .tenants
                .get_mut(id)
                .ok_or_else(|| AppError::not_found("tenant", id))?;
            let before = tenant.tokens.len();
            tenant.tokens.retain(|t| t.id != token);
            if tenant.tokens.len() == before {
                return Err(AppError::not_found("token", token));
            }
            save(&registry)?;
        }
        self.reload_tokens();
        tracing::info!(tenant = %id, token = %token, "token revoked");
        Ok(())
    }

    /// Deletes tenant `id` with everything it has: its tokens stop working at once, its
    /// pipelines stop (a runner inside a processor call stops when the call returns) and
    /// are removed with their input, output and state, and its processors are removed
    /// with their compiled artefacts. Blocks (up to the stop wait).
    pub(crate) fn delete_tenant(&self, id: &str) -> AppResult<()> {
        let (pipelines, hashes) = {
            let mut registry = self.registry.lock().expect("registry lock");
            if registry.data.tenants.remove(id).is_none() {
                return Err(AppError::not_found("tenant", id));
            }
            let pipelines: Vec<String> = registry
                .data
                .pipelines
                .values()
                .filter(|p| p.tenant == id)
                .map(|p| p.id.clone())
                .collect();
            for p in &pipelines {
                registry.data.pipelines.remove(p);
                self.readers.forget(p);
            }
            let mut hashes: Vec<String> = registry
                .data
                .processors
                .values()
                .filter(|p| p.tenant == id)
                .map(|p| p.hash.clone())
                .collect();
            registry.data.processors.retain(|_, p| p.tenant != id);
            // A blob another tenant uploaded too stays.
            hashes.retain(|h| !registry.data.processors.values().any(|p| &p.hash == h));
            save(&registry)?;
            (pipelines, hashes)
        };
        self.reload_tokens();
        let handles: Vec<(String, Option<Arc<PipelineHandle>>)> = {
            let mut map = self.pipelines.lock().expect("pipelines lock");
            pipelines
                .iter()
                .map(|p| (p.clone(), map.remove(p)))
                .collect()
        };
        self.usage.lock().expect("usage lock").remove(id);
        self.memtables.lock().expect("memtables lock").remove(id);
        self.buckets.lock().expect("buckets lock").remove(id);
        for h in handles.iter().filter_map(|(_, h)| h.as_ref()) {
            h.request_stop();
        }
        for (pipeline, h) in handles {
            let dir = self.pipeline_dir(&pipeline);
            match h {
                Some(h) => {
                    h.stop_then(self.config.http.stop_wait, move || {
                        let _ = std::fs::remove_dir_all(dir);
                    });
                }
                None => {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
        }
        for hash in hashes {
            let _ = std::fs::remove_file(self.blob_path(&hash));
            self.forget_compiled(&hash);
        }
        tracing::info!(tenant = %id, "tenant deleted");
        Ok(())
    }

    /// What tenant `id` sees of itself: its settings and usage.
    pub(crate) fn tenant_usage(&self, id: &str) -> AppResult<TenantUsageView> {
        let (name, quotas, kafka_brokers, processors, pipelines) = {
            let registry = self.registry.lock().expect("registry lock");
            let t = registry
                .data
                .tenants
                .get(id)
                .ok_or_else(|| AppError::not_found("tenant", id))?;
            (
                t.name.clone(),
                t.quotas.clone(),
                t.kafka_brokers.clone(),
                registry
                    .data
                    .processors
                    .values()
                    .filter(|p| p.tenant == id)
                    .count(),
                registry
                    .data
                    .pipelines
                    .values()
                    .filter(|p| p.tenant == id)
                    .count(),
            )
        };
        let usage = self.usage(id);
        Ok(TenantUsageView {
            id: id.to_owned(),
            name,
            quotas,
            kafka_brokers,
            processors,
            pipelines,
            state_bytes: self.state_bytes(id),
            disk_bytes: self.disk_bytes(id),
            cpu_ns: usage.cpu_ns.load(Ordering::Relaxed),
            memory_high_water_bytes: usage.memory_high_water.load(Ordering::Relaxed),
        })
    }
}
