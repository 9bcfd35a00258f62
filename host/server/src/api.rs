//! The HTTP API under `/v1`, `/metrics`, and request logging: each handler extracts its
//! request (authentication, path, query, a body read within its limit), calls the domain
//! operation of the [`App`] (on a blocking thread when it blocks) and renders its result
//! as JSON; an [`AppError`](crate::app::AppError) becomes its status and error code.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::App;
use crate::app::pipelines::{Pipeline, PipelineSpec};
use crate::app::reads::{ChangesQuery, StateQuery};
use crate::auth::{Admin, Caller, TenantId};
use crate::error::ApiError;
use crate::registry::{PipelineRecord, Tenant};

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
        .route("/v1/pipelines/{id}/kafka/options", put(set_kafka_options))
        .route("/v1/pipelines/{id}/state", get(read_state))
        .route("/v1/pipelines/{id}/state/changes", get(read_changes))
        .route("/v1/pipelines/{id}/state/metadata", get(read_metadata))
        .route(
            "/v1/tenants/{id}/kafka",
            put(grant_kafka).get(get_kafka_grant),
        )
        // The web console and the endpoints it added (their own modules).
        .merge(crate::console::routes())
        .merge(crate::api_console::routes())
        .merge(crate::api_sql::routes())
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
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a server task failed: {e}")))
}

/// Parses a JSON request body; the error names the field at fault.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
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
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.prometheus_text(),
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

async fn create_tenant(
    State(app): AppState,
    _admin: Admin,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, axum::Json<Value>)> {
    let body = read_body(&app, &headers, body, SMALL_BODY, "request body").await?;
    let req: CreateTenant = parse_json(&body)?;
    let (tenant, token) = app.create_tenant(req.name, req.quotas)?;
    let mut body = tenant_json(&tenant);
    body["token"] = json!(token);
    Ok((StatusCode::CREATED, axum::Json(body)))
}

async fn list_tenants(State(app): AppState, _admin: Admin) -> axum::Json<Value> {
    let tenants: Vec<Value> = app.tenants().iter().map(tenant_json).collect();
    axum::Json(json!({ "tenants": tenants }))
}

async fn get_tenant(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    Ok(axum::Json(tenant_json(&app.tenant(&id)?)))
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
    Ok(axum::Json(tenant_json(&app.patch_quotas(&id, patch)?)))
}

async fn issue_token(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<(StatusCode, axum::Json<Value>)> {
    let (record, token) = app.issue_token(&id)?;
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
    app.revoke_token(&id, &token)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes a tenant with everything it has (see [`App::delete_tenant`]).
async fn delete_tenant(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    blocking(move || app.delete_tenant(&id)).await??;
    Ok(StatusCode::NO_CONTENT)
}

async fn whoami(State(app): AppState, TenantId(tenant): TenantId) -> Result<axum::Json<Value>> {
    let t = app.tenant_usage(&tenant)?;
    Ok(axum::Json(json!({
        "id": t.id,
        "name": t.name,
        "quotas": t.quotas,
        // The Kafka brokers its pipelines may use (granted by the admin).
        "kafka_brokers": t.kafka_brokers,
        "usage": {
            "processors": t.processors,
            "pipelines": t.pipelines,
            "state_bytes": t.state_bytes,
            "disk_bytes": t.disk_bytes,
            "cpu_seconds": t.cpu_ns as f64 / 1e9,
            "memory_high_water_bytes": t.memory_high_water_bytes,
        },
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KafkaGrant {
    /// The complete list: it replaces the tenant's previous one.
    #[serde(deserialize_with = "crate::kafka::list_or_commas")]
    brokers: Vec<String>,
}

async fn get_kafka_grant(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    let t = app.tenant(&id)?;
    Ok(axum::Json(
        json!({"tenant": id, "brokers": t.kafka_brokers}),
    ))
}

/// Sets the Kafka brokers a tenant's pipelines may read and write (see
/// [`App::grant_kafka_brokers`]).
async fn grant_kafka(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<Value>> {
    let body = read_body(&app, &headers, body, SMALL_BODY, "request body").await?;
    let req: KafkaGrant = parse_json(&body)?;
    let (brokers, stopped) = blocking(move || app.grant_kafka_brokers(&id, &req.brokers)).await??;
    Ok(axum::Json(json!({"brokers": brokers, "stopped": stopped})))
}

// ---- Processors ----

async fn upload_processor(
    State(app): AppState,
    TenantId(tenant): TenantId,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, axum::Json<Value>)> {
    let limit = app.quotas(&tenant).max_upload_bytes;
    let bytes = read_body(&app, &headers, body, limit, "processor upload").await?;
    let uploaded = blocking(move || app.upload_processor(&tenant, &bytes)).await??;
    let status = if uploaded.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(json!(uploaded.record))))
}

async fn list_processors(State(app): AppState, TenantId(tenant): TenantId) -> axum::Json<Value> {
    axum::Json(json!({ "processors": app.processors(&tenant) }))
}

async fn get_processor(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    Ok(axum::Json(json!(app.processor(&tenant, &id)?)))
}

async fn delete_processor(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    app.delete_processor(&tenant, &id)?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- Pipelines ----

/// A pipeline as its tenant sees it: its record (without the tenant, secrets among its
/// Kafka options redacted) and, while it has a runner's handle, its live status.
fn pipeline_json(
    record: &PipelineRecord,
    handle: Option<&crate::pipeline::PipelineHandle>,
) -> Value {
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

fn pipeline_view_json(p: &Pipeline) -> Value {
    pipeline_json(&p.record, p.handle.as_deref())
}

async fn create_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, axum::Json<Value>)> {
    let limit = app.quotas(&tenant).max_ingest_request_bytes;
    let bytes = read_body(&app, &headers, body, limit, "pipeline definition").await?;
    let spec: PipelineSpec = parse_json(&bytes)?;
    let pipeline = blocking(move || app.create_pipeline(&tenant, spec)).await??;
    Ok((
        StatusCode::CREATED,
        axum::Json(pipeline_view_json(&pipeline)),
    ))
}

async fn list_pipelines(State(app): AppState, TenantId(tenant): TenantId) -> axum::Json<Value> {
    let list: Vec<Value> = app
        .pipelines_of(&tenant)
        .iter()
        .map(pipeline_view_json)
        .collect();
    axum::Json(json!({ "pipelines": list }))
}

async fn get_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    Ok(axum::Json(pipeline_view_json(
        &app.pipeline_view(&tenant, &id)?,
    )))
}

async fn delete_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    blocking(move || app.delete_pipeline(&tenant, &id)).await??;
    Ok(StatusCode::NO_CONTENT)
}

async fn ingest(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<Value>> {
    let handle = app.ingest_target(&tenant, &id).await?;
    let limit = app.quotas(&tenant).max_ingest_request_bytes;
    let body = read_body(&app, &headers, body, limit, "request").await?;
    let rows = app.ingest(&handle, body).await?;
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

async fn read_output(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    query: std::result::Result<Query<OutputQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response> {
    let Query(q) = query?;
    let page = app.read_output(&tenant, &id, q.after, q.limit).await?;
    let body = format!(
        "{{\"rows\":{},\"count\":{},\"next\":{},\"committed\":{},\"start\":{},\"end\":{}}}",
        page.rows_json,
        page.count,
        page.next,
        page.committed,
        page.start,
        page.next == page.committed
    );
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgressQuery {
    #[serde(default)]
    last: Option<usize>,
}

async fn progress(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    query: std::result::Result<Query<ProgressQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<Value>> {
    let Query(q) = query?;
    let last = q.last.unwrap_or(10).min(1000);
    let records = app.progress(&tenant, &id, last).await?;
    Ok(axum::Json(json!({ "progress": records })))
}

async fn stop_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    // Past the stop wait the pipeline shows `stopping`; its runner stops after its call
    // ends.
    let pipeline = blocking(move || app.stop_pipeline(&tenant, &id)).await??;
    Ok(axum::Json(pipeline_view_json(&pipeline)))
}

async fn start_pipeline(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    let pipeline = blocking(move || app.start_pipeline(&tenant, &id)).await??;
    Ok(axum::Json(pipeline_view_json(&pipeline)))
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
    let upgraded = blocking(move || app.upgrade_pipeline(&tenant, &id, &req.processor)).await??;
    let mut body = pipeline_view_json(&upgraded.pipeline);
    body["upgrade_report"] = json!(upgraded.report);
    body["http_grant_dropped"] = json!(upgraded.http_grant_dropped);
    Ok(axum::Json(body))
}

/// Replaces a pipeline's Kafka client options, e.g. to rotate its SASL credentials (see
/// [`App::set_kafka_options`]).
async fn set_kafka_options(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<Value>> {
    let body = read_body(&app, &headers, body, SMALL_BODY, "request body").await?;
    let change: crate::kafka::KafkaOptionsChange = parse_json(&body)?;
    let (pipeline, restarted) =
        blocking(move || app.set_kafka_options(&tenant, &id, change)).await??;
    let mut body = pipeline_view_json(&pipeline);
    body["restarted"] = json!(restarted);
    Ok(axum::Json(body))
}

// ---- Capabilities (admin) ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Capabilities {
    /// The complete allow-list: it replaces the pipeline's previous one.
    http_hosts: Vec<String>,
}

/// Sets the hosts a pipeline's processor may send HTTP requests to (see
/// [`App::grant_http_hosts`]).
async fn grant_capabilities(
    State(app): AppState,
    _admin: Admin,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<Value>> {
    let body = read_body(&app, &headers, body, SMALL_BODY, "request body").await?;
    let req: Capabilities = parse_json(&body)?;
    let granted = blocking(move || app.grant_http_hosts(&id, &req.http_hosts)).await??;
    let mut body = pipeline_view_json(&granted.pipeline);
    body["tenant"] = json!(granted.pipeline.record.tenant);
    body["restarted"] = json!(granted.restarted);
    Ok(axum::Json(body))
}

async fn read_state(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    query: std::result::Result<Query<StateQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<Value>> {
    let Query(q) = query?;
    let (rows, truncated) = app.read_state(&tenant, &id, q).await?;
    Ok(axum::Json(json!({ "rows": rows, "truncated": truncated })))
}

async fn read_changes(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    query: std::result::Result<Query<ChangesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<Value>> {
    let Query(q) = query?;
    let (rows, truncated) = app.read_changes(&tenant, &id, q).await?;
    Ok(axum::Json(json!({ "rows": rows, "truncated": truncated })))
}

async fn read_metadata(
    State(app): AppState,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>> {
    Ok(axum::Json(app.read_metadata(&tenant, &id).await?))
}
