//! The HTTP API under `/v1`, `/metrics`, and request logging.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Deserialize;
use serde_json::{Value, json};
use statebox_engine::{EngineError, OutputMode, StateReader, TimeMode};
use statebox_state::catalog::{Catalog, InitOp, VarKind};

use crate::auth::{Admin, Caller, TenantId, token_hash};
use crate::error::ApiError;
use crate::kafka::{SinkSpec, SourceSpec};
use crate::pipeline::{PipelineHandle, RunState, STILL_STOPPING};
use crate::registry::{
    Desired, EventTimeSpec, PipelineRecord, ProcessorRecord, Registry, Tenant, TokenRecord,
    VariableInfo, now_ms, random_id, write_atomically,
};
use crate::{
    App, MAX_NAME_BYTES, MAX_SCHEMA_BYTES, MAX_VARIABLES, Quotas, add, ingest_check, metrics,
};

type Result<T> = std::result::Result<T, ApiError>;
type AppState = State<Arc<App>>;

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/metrics", get(prometheus))
        .route("/v1/tenants", post(create_tenant).get(list_tenants))
        .route("/v1/tenants/{id}", get(get_tenant).delete(delete_tenant))
        .route(
            "/v1/tenants/{id}/quotas",
            axum::routing::patch(patch_quotas),
        )
        .route("/v1/tenants/{id}/tokens", post(issue_token))
        .route(
            "/v1/tenants/{id}/tokens/{token}",
            axum::routing::delete(revoke_token),
        )
        .route("/v1/tenant", get(whoami))
        .route(
            "/v1/processors",
            post(upload_processor).get(list_processors),
        )
        .route(
            "/v1/processors/{id}",
            get(get_processor).delete(delete_processor),
        )
        .route("/v1/pipelines", post(create_pipeline).get(list_pipelines))
        .route(
            "/v1/pipelines/{id}",
            get(get_pipeline).delete(delete_pipeline),
        )
        .route("/v1/pipelines/{id}/rows", post(ingest))
        .route("/v1/pipelines/{id}/output", get(read_output))
        .route("/v1/pipelines/{id}/progress", get(progress))
        .route("/v1/pipelines/{id}/stop", post(stop_pipeline))
        .route("/v1/pipelines/{id}/start", post(start_pipeline))
        .route("/v1/pipelines/{id}/processor", put(upgrade_pipeline))
        .route("/v1/pipelines/{id}/capabilities", put(grant_capabilities))
        .route("/v1/pipelines/{id}/state", get(read_state))
        .route("/v1/pipelines/{id}/state/changes", get(read_changes))
        .route("/v1/pipelines/{id}/state/metadata", get(read_metadata))
        // The web console and the endpoints it added (their own modules).
        .merge(crate::console::routes())
        .merge(crate::api_console::routes())
        .merge(crate::api_sql::routes())
        .merge(crate::kafka::routes())
        .fallback(not_found)
        .layer(axum::middleware::from_fn(log_request))
        .with_state(app)
}

/// `router` with the in-flight limits ([`limit_in_flight`]) over every route.
pub(crate) fn limited(router: Router, app: Arc<App>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(app, limit_in_flight))
}

/// Caps the requests handled at once, over all callers ([`crate::HttpLimits::max_in_flight`],
/// then 503) and per caller ([`crate::HttpLimits::max_in_flight_per_caller`], then 429), so
/// one tenant's slow or many requests cannot take every slot. A caller is its tenant (any of
/// its tokens), the admin, or, for a missing or invalid token, one shared "anonymous".
async fn limit_in_flight(State(app): AppState, request: Request, next: Next) -> Response {
    let caller = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| app.authenticate(t.trim()))
        .map_or_else(
            || "anonymous".to_owned(),
            |c| match c {
                Caller::Admin => "admin".to_owned(),
                Caller::Tenant(t) => t,
            },
        );
    let admitted = match app.admit(&caller) {
        Ok(admitted) => admitted,
        Err(limit) => {
            if caller != "admin" && caller != "anonymous" {
                app.count_rejected(&caller);
            }
            let (status, code) = if limit == "max_in_flight" {
                (StatusCode::SERVICE_UNAVAILABLE, "overloaded")
            } else {
                (StatusCode::TOO_MANY_REQUESTS, "too_many_requests")
            };
            let mut e = ApiError::new(
                status,
                code,
                format!(
                    "too many requests in flight (server limit `{limit}`); retry when some \
                     have finished"
                ),
            );
            e.retry_after = Some(1);
            return e.into_response();
        }
    };
    let response = next.run(request).await;
    drop(admitted);
    response
}

/// Logs every request's method, path, status and latency (never its headers or body).
async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if path.ends_with("/rows") && status < 400 {
        tracing::debug!(%method, %path, status, ms, "request");
    } else {
        tracing::info!(%method, %path, status, ms, "request");
    }
    response
}

async fn not_found(_caller: Caller) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

/// Runs blocking work (disk, wasm) off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a server task failed: {e}")))
}

/// Parses a JSON request body; the error names the field at fault.
fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            ApiError::bad_request(format!("invalid request body: {}", e.inner()))
        } else {
            ApiError::bad_request(format!("invalid request body: `{path}`: {}", e.inner()))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    Ok(value)
}

/// How far past its limit a request body is still read (and dropped, chunk by chunk)
/// before the 413 is answered.
const DRAIN_LIMIT: u64 = 64 << 20;

/// Largest body of the small JSON requests (tenants, quotas, upgrades, grants).
pub(crate) const SMALL_BODY: u64 = 1 << 20;

/// Reads a request body of at most `limit` bytes; larger ones answer 413 without being
/// buffered (a declared `Content-Length` over the limit is refused before any of the body
/// is read; a body without one is read only up to the limit). A body that sends nothing for
/// [`crate::HttpLimits::body_idle_timeout`] answers 408.
pub(crate) async fn read_body(
    app: &App,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
    what: &str,
) -> Result<Bytes> {
    use http_body_util::BodyExt;
    let idle = app.config.http.body_idle_timeout;
    let too_large = || {
        ApiError::too_large(format!(
            "the {what} is larger than the limit of {limit} bytes"
        ))
    };
    let timed_out = || {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the {what} stopped arriving: nothing for {} ms",
                idle.as_millis()
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut body = body;
    if let Some(n) = declared.filter(|&n| n > limit) {
        // Drain (never keep) a moderately oversized body before answering, so a client that
        // sends the whole body before reading the response sees the 413 instead of a reset
        // connection; a body far beyond the limit is refused at once.
        if n <= limit.saturating_add(DRAIN_LIMIT) {
            let mut drained = 0u64;
            while drained < n {
                match tokio::time::timeout(idle, body.frame()).await {
                    Ok(Some(Ok(frame))) => {
                        drained += frame.data_ref().map_or(0, |d| d.len() as u64);
                    }
                    _ => break,
                }
            }
        }
        return Err(too_large());
    }
    let capacity = declared.unwrap_or(0).min(limit).min(16 << 20);
    let mut buf = Vec::with_capacity(capacity as usize);
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(timed_out()),
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(ApiError::bad_request(format!(
                    "cannot read the {what}: {e}"
                )));
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if (buf.len() + data.len()) as u64 > limit {
                        return Err(too_large());
                    }
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
    Ok(Bytes::from(buf))
}

async fn openapi(_caller: Caller) -> impl IntoResponse {
    axum::Json(crate::openapi::document())
}

async fn prometheus(State(app): AppState, _admin: Admin) -> impl IntoResponse {
    let pipelines: Vec<Arc<PipelineHandle>> = app
        .pipelines
        .lock()
        .expect("pipelines lock")
        .values()
        .cloned()
        .collect();
    let mut pipelines = pipelines;
    pipelines.sort_by(|a, b| (&a.tenant, &a.id).cmp(&(&b.tenant, &b.id)));
    let failed: Vec<bool> = pipelines
        .iter()
        .map(|p| p.status().state == RunState::Failed)
        .collect();
    let samples: Vec<metrics::PipelineSample<'_>> = pipelines
        .iter()
        .zip(&failed)
        .map(|(p, &failed)| metrics::PipelineSample {
            tenant: &p.tenant,
            pipeline: &p.id,
            metrics: &p.metrics,
            failed,
        })
        .collect();
    let tenants: Vec<String> = app
        .registry
        .lock()
        .expect("registry lock")
        .data
        .tenants
        .keys()
        .cloned()
        .collect();
    let rejected = app.rejected.lock().expect("rejected lock").clone();
    let usage: Vec<_> = tenants.iter().map(|t| (t, app.usage(t))).collect();
    let tenant_samples: Vec<metrics::TenantSample<'_>> = usage
        .iter()
        .map(|(t, u)| metrics::TenantSample {
            tenant: t,
            cpu_ns: u.cpu_ns.load(Ordering::Relaxed),
            memory_high_water: u.memory_high_water.load(Ordering::Relaxed),
            rejected_requests: rejected.get(*t).copied().unwrap_or(0),
        })
        .collect();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics::render(&samples, &tenant_samples),
    )
}

// ---- Tenants (admin) ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTenant {
    name: String,
    #[serde(default)]
    quotas: Option<Value>,
}

fn tenant_json(t: &Tenant) -> Value {
    json!({
        "id": t.id,
        "name": t.name,
        "created_ms": t.created_ms,
        "quotas": t.quotas,
        "tokens": t.tokens.iter().map(|k| json!({"id": k.id, "created_ms": k.created_ms})).collect::<Vec<_>>(),
        "kafka_brokers": t.kafka_brokers,
    })
}

/// Applies the fields of `patch` (a JSON object) over `base`.
fn merge_quotas(base: &Quotas, patch: Option<Value>) -> Result<Quotas> {
    let mut merged = serde_json::to_value(base).expect("quotas serialise");
    match patch {
        None => {}
        Some(Value::Object(fields)) => {
            merged
                .as_object_mut()
                .expect("quotas are an object")
                .extend(fields);
        }
        Some(_) => return Err(ApiError::bad_request("`quotas` must be a JSON object")),
    }
    let quotas: Quotas = serde_json::from_value(merged)
        .map_err(|e| ApiError::bad_request(format!("invalid quotas: {e}")))?;
    quotas.validate().map_err(ApiError::bad_request)?;
    Ok(quotas)
}

fn new_token() -> Result<(String, TokenRecord)> {
    let token = random_id("sbx_", 32).map_err(|e| ApiError::internal(e.to_string()))?;
    let record = TokenRecord {
        id: random_id("tok_", 6).map_err(|e| ApiError::internal(e.to_string()))?,
        hash: token_hash(&token),
        created_ms: now_ms(),
    };
    Ok((token, record))
}

fn save(registry: &Registry) -> Result<()> {
    registry
        .save()
        .map_err(|e| ApiError::internal(format!("cannot save the registry: {e}")))
}

async fn create_tenant(
    State(app): AppState,
    _admin: Admin,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, axum::Json<Value>)> {
    let body = read_body(&app, &headers, body, SMALL_BODY, "request body").await?;
    let req: CreateTenant = parse_json(&body)?;
    if req.name.trim().is_empty() {
        return Err(ApiError::bad_request("`name` must not be empty"));
    }
    if req.name.len() > MAX_NAME_BYTES {
        return Err(ApiError::bad_request(format!(
            "`name` is {} bytes long, more than the limit of {MAX_NAME_BYTES}",
            req.name.len()
        )));
    }
    let quotas = merge_quotas(&app.config.default_quotas, req.quotas)?;
    let (token, token_record) = new_token()?;
    let tenant = Tenant {
        id: random_id("tn_", 8).map_err(|e| ApiError::internal(e.to_string()))?,
        name: req.name,
        created_ms: now_ms(),
        tokens: vec![token_record],
        quotas,
        kafka_brokers: Vec::new(),
    };
    let mut body = tenant_json(&tenant);
    body["token"] = json!(token);
    {
        let mut registry = app.registry.lock().expect("registry lock");
        registry
            .data
            .tenants
            .insert(tenant.id.clone(), tenant.clone());
        save(&registry)?;
    }
    app.reload_tokens();
    tracing::info!(tenant = %tenant.id, "tenant created");
    Ok((StatusCode::CREATED, axum::Json(body)))
}

async fn list_tenants(State(app): AppState, _admin: Admin) -> axum::Json<Value> {
    let registry = app.registry.lock().expect("registry lock");
    let tenants: Vec<Value> = registry.data.tenants.values().map(tenant_json).collect();
    axum::Json(json!({ "tenants": tenants }))
}

async fn get_tenant(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    let registry = app.registry.lock().expect("registry lock");
    let tenant = registry
        .data
        .tenants
        .get(&id)
        .ok_or_else(|| ApiError::not_found("tenant", &id))?;
    Ok(axum::Json(tenant_json(tenant)))
}

async fn patch_quotas(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<Value>> {
    let body = read_body(&app, &headers, body, SMALL_BODY, "request body").await?;
    let patch: Value = parse_json(&body)?;
    let mut registry = app.registry.lock().expect("registry lock");
    let tenant = registry
        .data
        .tenants
        .get_mut(&id)
        .ok_or_else(|| ApiError::not_found("tenant", &id))?;
    tenant.quotas = merge_quotas(&tenant.quotas, Some(patch))?;
    let body = tenant_json(tenant);
    save(&registry)?;
    Ok(axum::Json(body))
}

async fn issue_token(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<(StatusCode, axum::Json<Value>)> {
    let (token, record) = new_token()?;
    {
        let mut registry = app.registry.lock().expect("registry lock");
        let tenant = registry
            .data
            .tenants
            .get_mut(&id)
            .ok_or_else(|| ApiError::not_found("tenant", &id))?;
        tenant.tokens.push(record.clone());
        save(&registry)?;
    }
    app.reload_tokens();
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({"id": record.id, "token": token, "tenant": id})),
    ))
}

/// Revokes one of a tenant's API tokens: requests with it answer 401 from now on.
async fn revoke_token(
    State(app): AppState,
    _admin: Admin,
    Path((id, token)): Path<(String, String)>,
) -> Result<StatusCode> {
    {
        let mut registry = app.registry.lock().expect("registry lock");
        let tenant = registry
            .data
            .tenants
            .get_mut(&id)
            .ok_or_else(|| ApiError::not_found("tenant", &id))?;
        let before = tenant.tokens.len();
        tenant.tokens.retain(|t| t.id != token);
        if tenant.tokens.len() == before {
            return Err(ApiError::not_found("token", &token));
        }
        save(&registry)?;
    }
    app.reload_tokens();
    tracing::info!(tenant = %id, token = %token, "token revoked");
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes a tenant with everything it has: its tokens stop working at once, its
/// pipelines stop (a runner inside a processor call stops when the call returns) and are
/// removed with their input, output and state, and its processors are removed with their
/// compiled artefacts.
async fn delete_tenant(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let (pipelines, hashes) = {
        let mut registry = app.registry.lock().expect("registry lock");
        if registry.data.tenants.remove(&id).is_none() {
            return Err(ApiError::not_found("tenant", &id));
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
            app.readers.forget(p);
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
    app.reload_tokens();
    let handles: Vec<(String, Option<Arc<PipelineHandle>>)> = {
        let mut map = app.pipelines.lock().expect("pipelines lock");
        pipelines
            .iter()
            .map(|p| (p.clone(), map.remove(p)))
            .collect()
    };
    app.usage.lock().expect("usage lock").remove(&id);
    app.buckets.lock().expect("buckets lock").remove(&id);
    let app2 = app.clone();
    blocking(move || {
        for h in handles.iter().filter_map(|(_, h)| h.as_ref()) {
            h.request_stop();
        }
        for (pipeline, h) in handles {
            let dir = app2.pipeline_dir(&pipeline);
            match h {
                Some(h) => {
                    h.stop_then(app2.config.http.stop_wait, move || {
                        let _ = std::fs::remove_dir_all(dir);
                    });
                }
                None => {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
        }
        for hash in hashes {
            let _ = std::fs::remove_file(app2.blob_path(&hash));
            app2.forget_compiled(&hash);
        }
    })
    .await?;
    tracing::info!(tenant = %id, "tenant deleted");
    Ok(StatusCode::NO_CONTENT)
}

async fn whoami(State(app): AppState, TenantId(tenant): TenantId) -> Result<axum::Json<Value>> {
    let (name, quotas, processors, pipelines) = {
        let registry = app.registry.lock().expect("registry lock");
        let t = registry
            .data
            .tenants
            .get(&tenant)
            .ok_or_else(|| ApiError::not_found("tenant", &tenant))?;
        (
            t.name.clone(),
            t.quotas.clone(),
            registry
                .data
                .processors
                .values()
                .filter(|p| p.tenant == tenant)
                .count(),
            registry
                .data
                .pipelines
                .values()
                .filter(|p| p.tenant == tenant)
                .count(),
        )
    };
    let usage = app.usage(&tenant);
    Ok(axum::Json(json!({
        "id": tenant,
        "name": name,
        "quotas": quotas,
        // The Kafka brokers its pipelines may use (granted by the admin).
        "kafka_brokers": app.kafka_grant(&tenant),
        "usage": {
            "processors": processors,
            "pipelines": pipelines,
            "state_bytes": app.state_bytes(&tenant),
            "disk_bytes": app.disk_bytes(&tenant),
            "cpu_seconds": usage.cpu_ns.load(Ordering::Relaxed) as f64 / 1e9,
            "memory_high_water_bytes": usage.memory_high_water.load(Ordering::Relaxed),
        },
    })))
}

// ---- Processors ----

fn kind_name(kind: VarKind) -> &'static str {
    match kind {
        VarKind::Value => "value",
        VarKind::List => "list",
        VarKind::Map => "map",
    }
}

async fn upload_processor(
    State(app): AppState,
    TenantId(tenant): TenantId,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, axum::Json<Value>)> {
    let quotas = app.quotas(&tenant);
    let bytes = read_body(
        &app,
        &headers,
        body,
        quotas.max_upload_bytes,
        "processor upload",
    )
    .await?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            "the request body is empty: send the processor's .wasm component as the body",
        ));
    }
    if let Err(reason) = app.check_disk_quota(&tenant, bytes.len() as u64) {
        app.count_rejected(&tenant);
        return Err(ApiError::quota(reason));
    }
    let hash = crate::registry::hex(blake3::hash(&bytes).as_bytes());
    let id = format!("pr_{}", &hash[..24]);
    let key = Registry::processor_key(&tenant, &id);
    // A place is reserved under the quota; no lock is held while the component compiles
    // and its `describe` and `init` run, which take as long as the guest makes them.
    let _reserved = {
        let registry = app.registry.lock().expect("registry lock");
        if let Some(existing) = registry.data.processors.get(&key) {
            return Ok((StatusCode::OK, axum::Json(json!(existing))));
        }
        let stored = registry
            .data
            .processors
            .values()
            .filter(|p| p.tenant == tenant)
            .count();
        drop(registry);
        app.reserve(&tenant, "processors", stored, quotas.max_processors)
            .map_err(|count| {
                app.count_rejected(&tenant);
                ApiError::quota(format!(
                    "the tenant already has {count} processors (some may still be uploading), \
                     its quota (`max_processors`)"
                ))
            })?
    };
    let app2 = app.clone();
    let tenant2 = tenant.clone();
    let record = blocking(move || -> Result<ProcessorRecord> {
        let invalid = |message: String| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_processor",
                message,
            )
        };
        let processor = app2
            .load(&bytes, quotas.limits())
            .map_err(|e| invalid(crate::bounded_message(&e.to_string())))?;
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
            .map_err(|e| invalid(crate::bounded_message(&format!("its `init` failed: {e}"))))?;
        if let Some(e) = &described.init_error {
            return Err(invalid(crate::bounded_message(&format!(
                "its `init` failed: {e}"
            ))));
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
        let path = app2.blob_path(&hash);
        if !path.exists() {
            write_atomically(&path, &bytes)
                .map_err(|e| ApiError::internal(format!("cannot store the processor: {e}")))?;
        }
        let info = processor.info();
        Ok(ProcessorRecord {
            id: id.clone(),
            tenant: tenant2,
            hash: hash.clone(),
            name: info.name.clone(),
            size_bytes: bytes.len() as u64,
            uploaded_ms: now_ms(),
            output_schema: info.output_schema.to_ddl(),
            input_schema: info.input_schema.as_ref().map(|s| s.to_ddl()),
            output_event_time_column: info.output_event_time_column.clone(),
            state_variables,
            compiled_bytes: app2.compiled_bytes(&hash),
        })
    })
    .await??;
    let mut registry = app.registry.lock().expect("registry lock");
    registry.data.processors.insert(key, record.clone());
    save(&registry)?;
    tracing::info!(tenant = %tenant, processor = %record.id, "processor uploaded");
    Ok((StatusCode::CREATED, axum::Json(json!(record))))
}

/// Refuses a processor whose declared name, schemas or event-time column are over their
/// limits ([`MAX_NAME_BYTES`], [`MAX_SCHEMA_BYTES`]), naming which.
fn check_declared(info: &statebox_contract::ProcessorInfo) -> std::result::Result<(), String> {
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
fn check_variables(vars: &[VariableInfo]) -> std::result::Result<(), String> {
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

async fn list_processors(State(app): AppState, TenantId(tenant): TenantId) -> axum::Json<Value> {
    let registry = app.registry.lock().expect("registry lock");
    let list: Vec<&ProcessorRecord> = registry
        .data
        .processors
        .values()
        .filter(|p| p.tenant == tenant)
        .collect();
    axum::Json(json!({ "processors": list }))
}

async fn get_processor(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    let registry = app.registry.lock().expect("registry lock");
    let p = registry
        .data
        .processors
        .get(&Registry::processor_key(&tenant, &id))
        .ok_or_else(|| ApiError::not_found("processor", &id))?;
    Ok(axum::Json(json!(p)))
}

async fn delete_processor(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let mut registry = app.registry.lock().expect("registry lock");
    let key = Registry::processor_key(&tenant, &id);
    let Some(record) = registry.data.processors.get(&key).cloned() else {
        return Err(ApiError::not_found("processor", &id));
    };
    let users: Vec<&str> = registry
        .data
        .pipelines
        .values()
        .filter(|p| p.tenant == tenant && p.processor == id)
        .map(|p| p.id.as_str())
        .collect();
    if !users.is_empty() {
        return Err(ApiError::conflict(format!(
            "processor `{id}` is used by pipeline(s) {}; delete them or upgrade them to another \
             processor first",
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
        let _ = std::fs::remove_file(app.blob_path(&record.hash));
        app.forget_compiled(&record.hash);
    }
    Ok(StatusCode::NO_CONTENT)
}

// ---- Pipelines ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreatePipeline {
    processor: String,
    key: KeyColumns,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    time_mode: Option<TimeMode>,
    #[serde(default)]
    output_mode: Option<OutputMode>,
    #[serde(default)]
    partitions: Option<u16>,
    #[serde(default)]
    event_time: Option<EventTimeSpec>,
    #[serde(default)]
    output_event_time_column: Option<String>,
    #[serde(default)]
    trigger_interval_ms: Option<u64>,
    /// Rows of the initial state (JSON objects with the key columns).
    #[serde(default)]
    initial_state: Option<Vec<Box<serde_json::value::RawValue>>>,
    /// HTTP ingest (the default) or Kafka topics (see [`crate::kafka`]).
    #[serde(default)]
    source: SourceSpec,
    /// The output log (the default) or a Kafka topic.
    #[serde(default)]
    sink: SinkSpec,
}

/// `"k"`, `"a,b"` or `["a", "b"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum KeyColumns {
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

fn pipeline_json(record: &PipelineRecord, handle: Option<&PipelineHandle>) -> Value {
    let mut v = json!(record);
    if let Some(h) = handle {
        let status = h.status();
        v["status"] = json!(status);
        v["rows_acknowledged"] = json!(h.metrics.rows_ingested.load(Ordering::Relaxed));
        v["rows_processed"] = json!(h.metrics.input_rows.load(Ordering::Acquire));
    }
    if let Value::Object(o) = &mut v {
        o.remove("tenant");
    }
    crate::kafka::redact(&mut v);
    v
}

fn compact_line(raw: &str) -> Result<String> {
    if raw.contains(['\n', '\r']) {
        let value: Value = serde_json::from_str(raw)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
        Ok(value.to_string())
    } else {
        Ok(raw.to_owned())
    }
}

async fn create_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, axum::Json<Value>)> {
    let quotas = app.quotas(&tenant);
    let bytes = read_body(
        &app,
        &headers,
        body,
        quotas.max_ingest_request_bytes,
        "pipeline definition",
    )
    .await?;
    let mut req: CreatePipeline = parse_json(&bytes)?;
    let key = req.key.columns();
    if key.is_empty() || key.iter().any(|c| c.is_empty()) {
        return Err(ApiError::bad_request(
            "`key` must name at least one column, none of them empty",
        ));
    }
    let partitions = req.partitions.unwrap_or(4);
    if !(1..=1024).contains(&partitions) {
        return Err(ApiError::bad_request(
            "`partitions` must be between 1 and 1024",
        ));
    }
    let trigger_interval_ms = req.trigger_interval_ms.unwrap_or(1000);
    if !(10..=86_400_000).contains(&trigger_interval_ms) {
        return Err(ApiError::bad_request(
            "`trigger_interval_ms` must be between 10 and 86400000",
        ));
    }
    let time_mode = req.time_mode.unwrap_or(TimeMode::None);
    if req.event_time.is_some() != (time_mode == TimeMode::EventTime) {
        return Err(ApiError::bad_request(
            "`event_time` ({\"column\", \"watermark_delay_ms\"}) is required with time_mode \
             `event-time` and not allowed otherwise",
        ));
    }
    if req.name.as_ref().is_some_and(|n| n.len() > MAX_NAME_BYTES) {
        return Err(ApiError::bad_request(format!(
            "`name` is longer than the limit of {MAX_NAME_BYTES} bytes"
        )));
    }
    crate::kafka::check_spec(&mut req.source, &mut req.sink, req.event_time.is_some())?;
    app.check_kafka_grant(&tenant, &req.source, &req.sink)?;
    // A place is reserved under the quota; no lock is held while the processor loads and
    // its `init` runs.
    let (processor, _reserved) = {
        let registry = app.registry.lock().expect("registry lock");
        let stored = registry
            .data
            .pipelines
            .values()
            .filter(|p| p.tenant == tenant)
            .count();
        let processor = registry
            .data
            .processors
            .get(&Registry::processor_key(&tenant, &req.processor))
            .cloned()
            .ok_or_else(|| ApiError::not_found("processor", &req.processor))?;
        drop(registry);
        let reserved = app
            .reserve(&tenant, "pipelines", stored, quotas.max_pipelines)
            .map_err(|count| {
                app.count_rejected(&tenant);
                ApiError::quota(format!(
                    "the tenant already has {count} pipelines (some may still be starting), \
                     its quota (`max_pipelines`)"
                ))
            })?;
        (processor, reserved)
    };
    let id = random_id("pl_", 8).map_err(|e| ApiError::internal(e.to_string()))?;
    let record = PipelineRecord {
        id: id.clone(),
        tenant: tenant.clone(),
        name: req.name,
        processor: processor.id.clone(),
        key,
        time_mode,
        output_mode: req.output_mode.unwrap_or(OutputMode::Update),
        partitions,
        event_time: req.event_time,
        output_event_time_column: req.output_event_time_column,
        trigger_interval_ms,
        has_initial_state: req.initial_state.is_some(),
        desired: Desired::Running,
        failure: None,
        created_ms: now_ms(),
        http_hosts: Vec::new(),
        http_hosts_for: None,
        source: req.source,
        sink: req.sink,
    };
    let mut initial = String::new();
    for (i, row) in req.initial_state.iter().flatten().enumerate() {
        if !row.get().trim_start().starts_with('{') {
            return Err(ApiError::bad_request(format!(
                "initial_state row {i}: a row must be a JSON object"
            )));
        }
        initial.push_str(&compact_line(row.get())?);
        initial.push('\n');
    }
    let app2 = app.clone();
    let record2 = record.clone();
    let handle = blocking(
        move || -> std::result::Result<Arc<PipelineHandle>, String> {
            let dir = app2.pipeline_dir(&record2.id);
            let started = (|| -> std::result::Result<Arc<PipelineHandle>, String> {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                if record2.has_initial_state {
                    write_atomically(
                        &PipelineHandle::initial_state_path(&dir),
                        initial.as_bytes(),
                    )
                    .map_err(|e| format!("cannot store the initial state: {e}"))?;
                }
                let loaded = app2.load_processor(&record2.tenant, &processor)?;
                let handle = Arc::new(
                    PipelineHandle::new(
                        &record2.id,
                        &record2.tenant,
                        &dir,
                        ingest_check(&record2, &loaded),
                    )
                    .map_err(|e| format!("cannot open the input log: {e}"))?,
                );
                handle.start(app2.runner_spec(&record2, loaded)?, app2.me.clone())?;
                Ok(handle)
            })();
            if started.is_err() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            started
        },
    )
    .await?
    .map_err(|e| ApiError::bad_request(format!("cannot start the pipeline: {e}")))?;
    {
        let mut registry = app.registry.lock().expect("registry lock");
        registry.data.pipelines.insert(id.clone(), record.clone());
        save(&registry)?;
    }
    app.pipelines
        .lock()
        .expect("pipelines lock")
        .insert(id.clone(), handle.clone());
    tracing::info!(tenant = %tenant, pipeline = %id, "pipeline created");
    Ok((
        StatusCode::CREATED,
        axum::Json(pipeline_json(&record, Some(&handle))),
    ))
}

fn pipeline_record(app: &App, tenant: &str, id: &str) -> Result<PipelineRecord> {
    app.registry
        .lock()
        .expect("registry lock")
        .data
        .pipelines
        .get(id)
        .filter(|p| p.tenant == tenant)
        .cloned()
        .ok_or_else(|| ApiError::not_found("pipeline", id))
}

fn handle(app: &App, tenant: &str, id: &str) -> Result<Arc<PipelineHandle>> {
    app.pipeline(tenant, id)
        .ok_or_else(|| ApiError::not_found("pipeline", id))
}

async fn list_pipelines(State(app): AppState, TenantId(tenant): TenantId) -> axum::Json<Value> {
    let records: Vec<PipelineRecord> = app
        .registry
        .lock()
        .expect("registry lock")
        .data
        .pipelines
        .values()
        .filter(|p| p.tenant == tenant)
        .cloned()
        .collect();
    let list: Vec<Value> = records
        .iter()
        .map(|r| pipeline_json(r, app.pipeline(&tenant, &r.id).as_deref()))
        .collect();
    axum::Json(json!({ "pipelines": list }))
}

async fn get_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    let record = pipeline_record(&app, &tenant, &id)?;
    Ok(axum::Json(pipeline_json(
        &record,
        app.pipeline(&tenant, &id).as_deref(),
    )))
}

async fn delete_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let _ = pipeline_record(&app, &tenant, &id)?;
    let handle = app.pipelines.lock().expect("pipelines lock").remove(&id);
    {
        let mut registry = app.registry.lock().expect("registry lock");
        registry.data.pipelines.remove(&id);
        save(&registry)?;
    }
    app.readers.forget(&id);
    let dir = app.pipeline_dir(&id);
    let wait = app.config.http.stop_wait;
    blocking(move || match handle {
        // A runner still in a guest call removes the directory once it has stopped.
        Some(h) => {
            h.stop_then(wait, move || {
                let _ = std::fs::remove_dir_all(dir);
            });
        }
        None => {
            let _ = std::fs::remove_dir_all(dir);
        }
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Splits an ingest body (a JSON array of objects, or JSON Lines) into checked, compact
/// JSON Lines.
fn ingest_lines(body: &[u8], check: &crate::pipeline::IngestCheck) -> Result<(Vec<u8>, u64)> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not UTF-8: {e}")))?;
    let mut out = Vec::with_capacity(body.len() + 16);
    let mut rows = 0u64;
    let mut push = |i: usize, line: &str| -> Result<()> {
        check.check(line).map_err(|e| {
            ApiError::bad_request(format!("row {i}: {e}; no row of this request was accepted"))
        })?;
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
        rows += 1;
        Ok(())
    };
    if text.trim_start().starts_with('[') {
        let array: Vec<&serde_json::value::RawValue> = serde_json::from_str(text).map_err(|e| {
            ApiError::bad_request(format!("the body is not a JSON array of rows: {e}"))
        })?;
        for (i, raw) in array.iter().enumerate() {
            push(i, &compact_line(raw.get())?)?;
        }
    } else {
        for (i, line) in text
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .filter(|l| !l.trim().is_empty())
            .enumerate()
        {
            push(i, line)?;
        }
    }
    Ok((out, rows))
}

async fn ingest(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<Value>> {
    let handle = handle(&app, &tenant, &id)?;
    app.refuse_ingest_if_kafka(&id)?;
    // Rows are checked against the processor's input schema before they are acknowledged;
    // while a pipeline resumes after a restart, ingest waits (a while) for it to load.
    let waiting = Instant::now();
    while !handle.checks_ready.load(Ordering::Acquire) && waiting.elapsed() < RESUME_WAIT {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !handle.checks_ready.load(Ordering::Acquire) {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "resuming",
            "the pipeline is resuming after a restart (loading its processor); retry shortly",
        );
        e.retry_after = Some(1);
        return Err(e);
    }
    let quotas = app.quotas(&tenant);
    let body = read_body(
        &app,
        &headers,
        body,
        quotas.max_ingest_request_bytes,
        "request",
    )
    .await?;
    let stopped_at_quota = handle
        .state_quota_failure
        .lock()
        .expect("state quota lock")
        .clone();
    if let Err(reason) = stopped_at_quota
        .map_or(Ok(()), Err)
        .and_then(|()| app.check_state_quota(&tenant))
        .and_then(|()| app.check_disk_quota(&tenant, body.len() as u64))
    {
        app.count_rejected(&tenant);
        return Err(ApiError::quota(reason));
    }
    let check = handle.ingest.lock().expect("ingest lock").clone();
    let (lines, rows) = if body.len() > 1 << 20 {
        blocking(move || ingest_lines(&body, &check)).await??
    } else {
        ingest_lines(&body, &check)?
    };
    if rows == 0 {
        return Ok(axum::Json(json!({"accepted": 0})));
    }
    if let Err((quota, wait)) = app.take_ingest_tokens(&tenant, rows, lines.len() as u64, &quotas) {
        app.count_rejected(&tenant);
        let limit = if quota == "ingest_rows_per_s" {
            format!("{} rows/s", quotas.ingest_rows_per_s)
        } else {
            format!("{} bytes/s", quotas.ingest_bytes_per_s)
        };
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "the tenant's ingest rate limit of {limit} (`{quota}`) is exhausted; retry in \
                 {wait} s"
            ),
        );
        e.retry_after = Some(wait);
        return Err(e);
    }
    let bytes_stored = lines.len() as u64;
    handle
        .log
        .append(lines)
        .await
        .map_err(|e| ApiError::internal(format!("the rows were not stored: {e}")))?;
    add(&handle.metrics.disk_bytes, bytes_stored);
    add(&handle.metrics.rows_ingested, rows);
    add(&handle.metrics.ingest_requests, 1);
    handle.notify();
    Ok(axum::Json(json!({ "accepted": rows })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputQuery {
    #[serde(default)]
    after: u64,
    #[serde(default)]
    limit: Option<usize>,
}

/// How long ingest waits for a resuming pipeline's processor before answering 503.
const RESUME_WAIT: Duration = Duration::from_secs(30);

/// Most rows one output page holds, and the most bytes it reads.
const MAX_PAGE_ROWS: usize = 10_000;
const MAX_PAGE_BYTES: u64 = 8 << 20;

async fn read_output(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    query: std::result::Result<Query<OutputQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response> {
    let Query(q) = query?;
    let handle = handle(&app, &tenant, &id)?;
    app.refuse_output_if_kafka(&id)?;
    let mut committed = handle.status().committed_output_bytes;
    let limit = q.limit.unwrap_or(1000).clamp(1, MAX_PAGE_ROWS);
    if q.after > committed {
        return Err(ApiError::bad_request(format!(
            "`after` {} is past the committed output ({committed} bytes); pass 0 or a `next` \
             offset from an earlier page",
            q.after
        )));
    }
    // 0 is the oldest row kept; rows before it were dropped by the output's retention.
    let mut start = handle.output_start.load(Ordering::Acquire);
    let mut after = if q.after == 0 { start } else { q.after };
    if after < start {
        return Err(output_dropped("after", after, start));
    }
    let page = loop {
        let path = PipelineHandle::output_path(&handle.dir);
        let page = blocking(move || -> Result<(String, u64, usize)> {
            use std::io::{BufRead, Read, Seek, SeekFrom};
            let io = |e: std::io::Error| ApiError::internal(format!("cannot read the output: {e}"));
            if after == committed {
                return Ok(("[]".to_owned(), after, 0));
            }
            let mut f = std::fs::File::open(&path).map_err(io)?;
            if after > 0 {
                let mut prev = [0u8; 1];
                f.seek(SeekFrom::Start(after - 1)).map_err(io)?;
                f.read_exact(&mut prev).map_err(io)?;
                if prev[0] != b'\n' {
                    return Err(ApiError::bad_request(format!(
                        "`after` {after} is not at the start of a row; pass 0 or a `next` offset \
                     from an earlier page"
                    )));
                }
            }
            f.seek(SeekFrom::Start(after)).map_err(io)?;
            // Row by row, up to `limit` rows or MAX_PAGE_BYTES (at least one row, however
            // long): a page never reads more than itself and one row.
            let mut reader = std::io::BufReader::with_capacity(64 << 10, f.take(committed - after));
            let mut body = String::from("[");
            let mut next = after;
            let mut rows = 0;
            let mut taken = 0u64;
            let mut line = Vec::new();
            while rows < limit && taken < MAX_PAGE_BYTES {
                line.clear();
                let n = reader.read_until(b'\n', &mut line).map_err(io)? as u64;
                if n == 0 || line.last() != Some(&b'\n') {
                    break;
                }
                if rows > 0 && taken + n > MAX_PAGE_BYTES {
                    break;
                }
                let text = std::str::from_utf8(&line[..line.len() - 1])
                    .map_err(|e| ApiError::internal(format!("the output is not UTF-8: {e}")))?;
                if rows > 0 {
                    body.push(',');
                }
                body.push_str(text);
                rows += 1;
                taken += n;
                next += n;
            }
            body.push(']');
            Ok((body, next, rows))
        })
        .await??;
        // Dropped while it was read: what was read may be the zeros of freed blocks. A read
        // from the oldest row (`after` 0) reads again from the new oldest row.
        let start_now = handle.output_start.load(Ordering::Acquire);
        if after >= start_now {
            break page;
        }
        if q.after != 0 {
            return Err(output_dropped("after", after, start_now));
        }
        // The new oldest row is committed, and may lie past the committed offset seen first.
        committed = handle.status().committed_output_bytes;
        (start, after) = (start_now, start_now);
    };
    let (rows_json, next, count) = page;
    let body = format!(
        "{{\"rows\":{rows_json},\"count\":{count},\"next\":{next},\"committed\":{committed},\"start\":{start},\"end\":{}}}",
        next == committed
    );
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The answer to a read of output that the pipeline's retention dropped.
pub(crate) fn output_dropped(param: &str, offset: u64, start: u64) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "output_dropped",
        format!(
            "the output before offset {start} was dropped by the pipeline's retention \
             (quotas `output_retention_bytes`, `output_retention_ms`), so `{param}` {offset} \
             is gone; the oldest row kept starts at {start}"
        ),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgressQuery {
    #[serde(default)]
    last: Option<usize>,
}

/// A shared reader of the pipeline's checkpoint (see [`crate::readers`]), with a turn to
/// read: the turn ends when the returned permit drops.
async fn reader(
    app: &Arc<App>,
    h: &Arc<PipelineHandle>,
) -> Result<(Arc<StateReader>, tokio::sync::OwnedSemaphorePermit)> {
    let turn = app
        .readers
        .reading
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::internal("the readers are closed"))?;
    let batch = h.status().last_progress.map(|c| c.batch_id);
    let (app2, h2) = (app.clone(), h.clone());
    let reader = blocking(move || {
        app2.readers
            .get(&h2.id, &PipelineHandle::checkpoint_dir(&h2.dir), batch)
            .map_err(engine_error)
    })
    .await??;
    Ok((reader, turn))
}

fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::Config(m) => ApiError::bad_request(m),
        other => ApiError::internal(other.to_string()),
    }
}

async fn progress(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    query: std::result::Result<Query<ProgressQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<Value>> {
    let Query(q) = query?;
    let handle = handle(&app, &tenant, &id)?;
    let last = q.last.unwrap_or(10).min(1000);
    let (reader, turn) = reader(&app, &handle).await?;
    let records = blocking(move || {
        let _turn = turn;
        reader.progress(last).map_err(engine_error)
    })
    .await??;
    Ok(axum::Json(json!({ "progress": records })))
}

async fn stop_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    let h = handle(&app, &tenant, &id)?;
    let h2 = h.clone();
    let wait = app.config.http.stop_wait;
    // Past the wait the pipeline shows `stopping`; its runner stops after its call ends.
    blocking(move || h2.stop(wait)).await?;
    let record = {
        let mut registry = app.registry.lock().expect("registry lock");
        let record = registry
            .data
            .pipelines
            .get_mut(&id)
            .ok_or_else(|| ApiError::not_found("pipeline", &id))?;
        if record.desired == Desired::Running {
            record.desired = Desired::Stopped;
        }
        let record = record.clone();
        save(&registry)?;
        record
    };
    Ok(axum::Json(pipeline_json(&record, Some(&h))))
}

/// Starts a pipeline's runner with its current record; blocks.
fn start_runner(
    app: &Arc<App>,
    record: &PipelineRecord,
    h: &Arc<PipelineHandle>,
) -> std::result::Result<(), String> {
    if h.is_stopping() {
        return Err(STILL_STOPPING.into());
    }
    let processor = app.processor_record(&record.tenant, &record.processor)?;
    let loaded = app.load_for_pipeline(record, &processor)?;
    *h.ingest.lock().expect("ingest lock") = Arc::new(ingest_check(record, &loaded));
    h.start(app.runner_spec(record, loaded)?, app.me.clone())
}

async fn start_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    let h = handle(&app, &tenant, &id)?;
    let mut record = pipeline_record(&app, &tenant, &id)?;
    app.check_kafka_grant(&tenant, &record.source, &record.sink)?;
    let (app2, record2, h2) = (app.clone(), record.clone(), h.clone());
    blocking(move || start_runner(&app2, &record2, &h2))
        .await?
        .map_err(|e| ApiError::conflict(format!("cannot start the pipeline: {e}")))?;
    {
        let mut registry = app.registry.lock().expect("registry lock");
        if let Some(r) = registry.data.pipelines.get_mut(&id) {
            r.desired = Desired::Running;
            r.failure = None;
            record = r.clone();
        }
        save(&registry)?;
    }
    Ok(axum::Json(pipeline_json(&record, Some(&h))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Upgrade {
    processor: String,
}

async fn upgrade_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<Value>> {
    let body = read_body(&app, &headers, body, SMALL_BODY, "request body").await?;
    let req: Upgrade = parse_json(&body)?;
    let h = handle(&app, &tenant, &id)?;
    let record = pipeline_record(&app, &tenant, &id)?;
    let new = app
        .processor_record(&tenant, &req.processor)
        .map_err(|_| ApiError::not_found("processor", &req.processor))?;
    let (app2, h2) = (app.clone(), h.clone());
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
    let upgraded2 = upgraded.clone();
    let report = blocking(move || -> Result<String> {
        let loaded = app2
            .load_processor(&tenant, &new)
            .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_processor", e))?;
        let check =
            statebox_engine::check_upgrade(&PipelineHandle::checkpoint_dir(&h2.dir), &loaded)
                .map_err(|e| {
                    ApiError::new(
                        StatusCode::CONFLICT,
                        "incompatible_processor",
                        format!(
                            "the new processor cannot be checked against the pipeline's state: {e}"
                        ),
                    )
                })?;
        let report = check.to_string();
        if !check.is_compatible() {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "incompatible_processor",
                format!(
                    "processor `{}` is incompatible with the pipeline's state; the pipeline \
                     keeps its current processor",
                    new.id
                ),
            )
            .with_details(json!({ "report": report })));
        }
        let was_running = h2.is_running();
        if !h2.stop(app2.config.http.stop_wait) {
            // The runner is inside a processor call: the upgrade completes once it returns.
            let (app3, h3) = (app2.clone(), h2.clone());
            h2.stop_then(Duration::ZERO, move || {
                if let Err(e) = start_runner(&app3, &upgraded2, &h3) {
                    tracing::warn!(pipeline = %h3.id, "the upgraded pipeline cannot start");
                    app3.pipeline_failed(&h3.id, &format!("the upgrade was refused: {e}"));
                }
            });
            return Ok(report);
        }
        if was_running && let Err(e) = start_runner(&app2, &upgraded2, &h2) {
            // Back to the processor that ran before.
            let _ = start_runner(&app2, &record, &h2);
            return Err(ApiError::conflict(format!("the upgrade was refused: {e}"))
                .with_details(json!({ "report": report })));
        }
        if !was_running {
            *h2.ingest.lock().expect("ingest lock") = Arc::new(ingest_check(&upgraded2, &loaded));
        }
        Ok(report)
    })
    .await??;
    {
        let mut registry = app.registry.lock().expect("registry lock");
        if let Some(r) = registry.data.pipelines.get_mut(&id) {
            r.processor = upgraded.processor.clone();
            // Checked again here: a grant stored meanwhile was for the old component.
            if r.http_hosts_for.as_deref() != Some(new_hash.as_str()) {
                grant_dropped |= !r.http_hosts.is_empty();
                r.http_hosts.clear();
                r.http_hosts_for = None;
            }
            upgraded = r.clone();
        }
        save(&registry)?;
    }
    tracing::info!(
        pipeline = %id,
        processor = %upgraded.processor,
        http_grant_dropped = grant_dropped,
        "pipeline upgraded"
    );
    let mut body = pipeline_json(&upgraded, Some(&h));
    body["upgrade_report"] = json!(report);
    body["http_grant_dropped"] = json!(grant_dropped);
    Ok(axum::Json(body))
}

// ---- Capabilities (admin) ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Capabilities {
    /// The complete allow-list: it replaces the pipeline's previous one.
    http_hosts: Vec<String>,
}

/// Sets the hosts a pipeline's processor may send HTTP requests to (wasi:http). Only the
/// admin may: a tenant cannot grant its own processors network access. A running pipeline
/// restarts on the new grant (after its current batch); a stopped or failed one gets it when
/// it starts again.
async fn grant_capabilities(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<Value>> {
    let body = read_body(&app, &headers, body, SMALL_BODY, "request body").await?;
    let req: Capabilities = parse_json(&body)?;
    let mut hosts = Vec::with_capacity(req.http_hosts.len());
    for (i, host) in req.http_hosts.iter().enumerate() {
        let host = statebox_runtime::HttpHost::parse(host)
            .map_err(|e| ApiError::bad_request(format!("`http_hosts[{i}]`: {e}")))?;
        hosts.push(host.to_string());
    }
    hosts.sort();
    hosts.dedup();
    let record = app
        .registry
        .lock()
        .expect("registry lock")
        .data
        .pipelines
        .get(&id)
        .cloned()
        .ok_or_else(|| ApiError::not_found("pipeline", &id))?;
    let h = handle(&app, &record.tenant, &id)?;
    let mut granted = record.clone();
    granted.http_hosts = hosts;
    {
        let mut registry = app.registry.lock().expect("registry lock");
        // The grant is for the component the pipeline runs now (read under the same lock
        // an upgrade stores the new processor under, so it names the one that gets it).
        let Some(current) = registry
            .data
            .pipelines
            .get(&id)
            .map(|r| r.processor.clone())
        else {
            return Err(ApiError::not_found("pipeline", &id));
        };
        let digest = registry
            .data
            .processors
            .get(&Registry::processor_key(&record.tenant, &current))
            .map(|p| p.hash.clone())
            .ok_or_else(|| {
                ApiError::internal(format!("the pipeline's processor `{current}` is missing"))
            })?;
        if let Some(r) = registry.data.pipelines.get_mut(&id) {
            r.http_hosts = granted.http_hosts.clone();
            r.http_hosts_for = (!r.http_hosts.is_empty()).then_some(digest);
            granted = r.clone();
        }
        save(&registry)?;
    }
    let (app2, h2, granted2) = (app.clone(), h.clone(), granted.clone());
    let restarted = blocking(move || -> std::result::Result<bool, String> {
        if !h2.is_running() {
            return Ok(false);
        }
        if !h2.stop(app2.config.http.stop_wait) {
            // Restarts with the grant once the current processor call returns.
            let (app3, h3) = (app2.clone(), h2.clone());
            h2.stop_then(Duration::ZERO, move || {
                if let Err(e) = start_runner(&app3, &granted2, &h3) {
                    app3.pipeline_failed(&h3.id, &format!("cannot restart with the grant: {e}"));
                }
            });
            return Ok(true);
        }
        start_runner(&app2, &granted2, &h2).map(|()| true)
    })
    .await?
    .map_err(|e| {
        ApiError::conflict(format!(
            "the grant is stored, but the pipeline could not restart with it: {e}"
        ))
    })?;
    tracing::info!(pipeline = %id, hosts = ?granted.http_hosts, "pipeline capabilities granted");
    let mut body = pipeline_json(&granted, Some(&h));
    body["tenant"] = json!(granted.tenant);
    body["restarted"] = json!(restarted);
    Ok(axum::Json(body))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StateQuery {
    #[serde(default)]
    var: Option<String>,
    #[serde(default)]
    timers: bool,
    #[serde(default = "yes")]
    flatten: bool,
    #[serde(default)]
    batch_id: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
}

fn yes() -> bool {
    true
}

/// Most rows a state read returns.
const MAX_STATE_ROWS: usize = 100_000;

/// Collects rows up to `limit`; reports whether more were there.
fn collect_rows(
    limit: usize,
    read: impl FnOnce(
        &mut dyn FnMut(Value) -> std::result::Result<(), EngineError>,
    ) -> std::result::Result<(), EngineError>,
) -> Result<(Vec<Value>, bool)> {
    let mut rows = Vec::new();
    let mut truncated = false;
    let result = read(&mut |row| {
        if rows.len() >= limit {
            truncated = true;
            return Err(EngineError::Io(String::new()));
        }
        rows.push(row);
        Ok(())
    });
    match result {
        Ok(()) => Ok((rows, false)),
        Err(_) if truncated => Ok((rows, true)),
        Err(e) => Err(engine_error(e)),
    }
}

async fn read_state(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    query: std::result::Result<Query<StateQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<Value>> {
    let Query(q) = query?;
    let h = handle(&app, &tenant, &id)?;
    let limit = q.limit.unwrap_or(10_000).clamp(1, MAX_STATE_ROWS);
    let (reader, turn) = reader(&app, &h).await?;
    let (rows, truncated) = blocking(move || {
        let _turn = turn;
        match (q.var.as_deref(), q.timers) {
            (Some(_), true) => Err(ApiError::bad_request(
                "pass either `var` or `timers=true`, not both",
            )),
            (None, false) => Err(ApiError::bad_request(format!(
                "pass `var=NAME` (one of: {}) or `timers=true`",
                reader
                    .catalog()
                    .vars()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
            (None, true) => collect_rows(limit, |f| reader.read_timers_at(q.batch_id, f)),
            (Some(var), false) => {
                collect_rows(limit, |f| reader.read_state(var, q.flatten, q.batch_id, f))
            }
        }
    })
    .await??;
    Ok(axum::Json(json!({ "rows": rows, "truncated": truncated })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangesQuery {
    var: String,
    from: u64,
    #[serde(default)]
    to: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
}

async fn read_changes(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    query: std::result::Result<Query<ChangesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<Value>> {
    let Query(q) = query?;
    let h = handle(&app, &tenant, &id)?;
    let limit = q.limit.unwrap_or(10_000).clamp(1, MAX_STATE_ROWS);
    let (reader, turn) = reader(&app, &h).await?;
    let (rows, truncated) = blocking(move || {
        let _turn = turn;
        collect_rows(limit, |f| reader.read_changes(&q.var, q.from, q.to, f))
    })
    .await??;
    Ok(axum::Json(json!({ "rows": rows, "truncated": truncated })))
}

async fn read_metadata(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    let h = handle(&app, &tenant, &id)?;
    let (reader, turn) = reader(&app, &h).await?;
    let metadata = blocking(move || {
        let _turn = turn;
        reader.metadata().map_err(engine_error)
    })
    .await??;
    Ok(axum::Json(metadata))
}
