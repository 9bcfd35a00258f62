//! Endpoints the web console needs beyond the original API, public like the rest of `/v1`
//! so a script can do whatever the console does:
//!
//! - `POST /v1/pipelines/{id}/processor/check {"processor": ID}`: the compatibility report of
//!   an upgrade without doing it (the console shows it before the user confirms);
//! - `GET /v1/pipelines/{id}/output/tail?before=OFFSET&limit=N`: the latest committed output
//!   rows, and older ones page by page (the forward reader starts at the beginning);
//! - `GET /v1/whoami`: whether a token is the admin's or a tenant's (the console's login
//!   asks, so neither kind of token meets a 403 just to find out);
//! - `GET /v1/usage` (admin): every tenant's quotas and usage, with its pipelines, so the
//!   admin can see who uses what and grant capabilities.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::App;
use crate::api::{blocking, parse_json};
use crate::app::AppError;
use crate::auth::{Admin, Caller, TenantId};
use crate::error::ApiError;
use crate::pipeline::{PipelineHandle, RunState};

type Result<T> = std::result::Result<T, ApiError>;

pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/v1/pipelines/{id}/processor/check", post(check_upgrade))
        .route("/v1/pipelines/{id}/output/tail", get(output_tail))
        .route("/v1/usage", get(usage))
        .route("/v1/whoami", get(whoami))
}

/// The caller's pipeline `id`; another tenant's answers 404 like a missing one.
pub(crate) fn pipeline(app: &App, tenant: &str, id: &str) -> Result<Arc<PipelineHandle>> {
    app.pipeline(tenant, id)
        .ok_or_else(|| ApiError::not_found("pipeline", id))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckUpgrade {
    processor: String,
}

/// The report `PUT /v1/pipelines/{id}/processor` would act on, without acting: 200 with
/// `compatible` true or false either way, so the console can show why before anything
/// changes.
async fn check_upgrade(
    State(app): State<Arc<App>>,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<axum::Json<Value>> {
    let req: CheckUpgrade = parse_json(&body)?;
    let h = pipeline(&app, &tenant, &id)?;
    let new = app.processor(&tenant, &req.processor)?;
    let current = app
        .registry
        .lock()
        .expect("registry lock")
        .data
        .pipelines
        .get(&id)
        .map(|p| p.processor.clone())
        .unwrap_or_default();
    let processor = new.id.clone();
    let (compatible, report) = blocking(move || {
        app.check_processor_against(&h, &new)
            .map(|(_, check)| (check.is_compatible(), check.to_string()))
    })
    .await??;
    Ok(axum::Json(json!({
        "pipeline": id,
        "current_processor": current,
        "processor": processor,
        "compatible": compatible,
        "report": report,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TailQuery {
    #[serde(default)]
    before: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
}

/// Most rows one tail page holds.
const MAX_TAIL_ROWS: usize = 1000;
/// The most bytes of rows a tail page holds, as a page of `GET .../output` (one longer row
/// is returned whole, up to [`MAX_TAIL_ROW`]).
const MAX_TAIL_BYTES: u64 = 8 << 20;
/// The longest row a tail page returns; a longer one is read with `GET .../output`.
const MAX_TAIL_ROW: u64 = 16 << 20;
/// Bytes read at a time while looking back for the page's first row.
const TAIL_CHUNK: u64 = 64 << 10;

/// The `limit` committed output rows that end at byte offset `before` (default: the end of
/// the committed output), oldest first. `from` is the offset of the first row: pass it as
/// `before` to read the page before; `begin` says there is none.
async fn output_tail(
    State(app): State<Arc<App>>,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    query: std::result::Result<Query<TailQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response> {
    let Query(q) = query?;
    let h = pipeline(&app, &tenant, &id)?;
    app.refuse_output_if_kafka(&id)?;
    let committed = h.status().committed_output_bytes;
    let before = q.before.unwrap_or(committed);
    if before > committed {
        return Err(ApiError::bad_request(format!(
            "`before` {before} is past the committed output ({committed} bytes); leave it out \
             for the latest rows or pass a `from` offset of an earlier page"
        )));
    }
    let limit = q.limit.unwrap_or(50).clamp(1, MAX_TAIL_ROWS);
    // Rows before `start` were dropped by the output's retention.
    let start = h.output_start.load(Ordering::Acquire);
    if before < start {
        return Err(AppError::OutputDropped {
            param: "before",
            offset: before,
            start,
        }
        .into());
    }
    let path = PipelineHandle::output_path(&h.dir);
    let (rows, from) = blocking(move || read_tail(&path, start, before, limit)).await??;
    let start_now = h.output_start.load(Ordering::Acquire);
    if from < start_now {
        return Err(AppError::OutputDropped {
            param: "before",
            offset: from,
            start: start_now,
        }
        .into());
    }
    let body = format!(
        "{{\"rows\":[{}],\"count\":{},\"from\":{from},\"to\":{before},\"committed\":{committed},\"start\":{start},\"begin\":{}}}",
        rows.join(","),
        rows.len(),
        from == start
    );
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// Reads the last `limit` lines that end at `before` in `path` and start at or after
/// `floor` (a row start: the first byte kept), oldest first, and the offset where the first
/// of them starts. At most [`MAX_TAIL_BYTES`] of rows (or one row of up to
/// [`MAX_TAIL_ROW`]): the page's start is found by scanning back [`TAIL_CHUNK`] bytes at a
/// time, then the page alone is read, so a request reads at most about twice its answer
/// from disk and never the rest of the file.
fn read_tail(
    path: &std::path::Path,
    floor: u64,
    before: u64,
    limit: usize,
) -> Result<(Vec<String>, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    if before <= floor {
        return Ok((Vec::new(), before));
    }
    let io = |e: std::io::Error| ApiError::internal(format!("cannot read the output: {e}"));
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut last = [0u8; 1];
    f.seek(SeekFrom::Start(before - 1)).map_err(io)?;
    f.read_exact(&mut last).map_err(io)?;
    if last[0] != b'\n' {
        return Err(ApiError::bad_request(format!(
            "`before` {before} is not at the end of a row; leave it out or pass a `from` \
             offset of an earlier page"
        )));
    }
    // Scan back from the newline that ends the last row for the starts of the rows before.
    let mut from = before;
    let mut rows = 0;
    let mut chunk = vec![0u8; TAIL_CHUNK as usize];
    let mut end = before - 1;
    'scan: while rows < limit {
        if end == floor {
            // The first row kept starts at `floor`.
            if rows > 0 && before - floor > MAX_TAIL_BYTES {
                break;
            }
            from = floor;
            break;
        }
        let start = end.saturating_sub(TAIL_CHUNK).max(floor);
        let piece = &mut chunk[..(end - start) as usize];
        f.seek(SeekFrom::Start(start)).map_err(io)?;
        f.read_exact(piece).map_err(io)?;
        let mut rest = piece.len();
        while let Some(nl) = piece[..rest].iter().rposition(|&b| b == b'\n') {
            let row_start = start + nl as u64 + 1;
            if rows > 0 && before - row_start > MAX_TAIL_BYTES {
                break 'scan;
            }
            if before - row_start > MAX_TAIL_ROW {
                break;
            }
            from = row_start;
            rows += 1;
            if rows == limit {
                break 'scan;
            }
            rest = nl;
        }
        end = start;
        // The row in progress no longer fits: the page is complete (or its only row is
        // too long to return).
        let scanned = before - end;
        if rows == 0 && scanned > MAX_TAIL_ROW {
            return Err(ApiError::bad_request(format!(
                "the row that ends at {before} is longer than {MAX_TAIL_ROW} bytes; read it \
                 with GET .../output"
            )));
        }
        if rows > 0 && scanned > MAX_TAIL_BYTES {
            break;
        }
    }
    let mut page = vec![0u8; (before - from) as usize];
    f.seek(SeekFrom::Start(from)).map_err(io)?;
    f.read_exact(&mut page).map_err(io)?;
    let text = std::str::from_utf8(&page[..page.len() - 1])
        .map_err(|e| ApiError::internal(format!("the output is not UTF-8: {e}")))?;
    Ok((text.split('\n').map(str::to_owned).collect(), from))
}

/// `{"role": "admin"}` or `{"role": "tenant", "tenant": ID, "name": NAME}`.
async fn whoami(State(app): State<Arc<App>>, caller: Caller) -> axum::Json<Value> {
    match caller {
        Caller::Admin => axum::Json(json!({"role": "admin"})),
        Caller::Tenant(id) => {
            let name = app
                .registry
                .lock()
                .expect("registry lock")
                .data
                .tenants
                .get(&id)
                .map(|t| t.name.clone());
            axum::Json(json!({"role": "tenant", "tenant": id, "name": name}))
        }
    }
}

/// Every tenant with its quotas, usage and pipelines.
async fn usage(State(app): State<Arc<App>>, _admin: Admin) -> axum::Json<Value> {
    let (tenants, pipelines, processors) = {
        let registry = app.registry.lock().expect("registry lock");
        (
            registry.data.tenants.values().cloned().collect::<Vec<_>>(),
            registry
                .data
                .pipelines
                .values()
                .cloned()
                .collect::<Vec<_>>(),
            registry
                .data
                .processors
                .values()
                .cloned()
                .collect::<Vec<_>>(),
        )
    };
    let rejected = app.rejected.lock().expect("rejected lock").clone();
    let list: Vec<Value> = tenants
        .iter()
        .map(|t| {
            let usage = app.usage(&t.id);
            let mut state_bytes = 0;
            let own: Vec<Value> = pipelines
                .iter()
                .filter(|p| p.tenant == t.id)
                .map(|p| {
                    let status = app.pipeline(&t.id, &p.id).map(|h| {
                        let bytes = h.metrics.state_bytes.load(Ordering::Relaxed);
                        state_bytes += bytes;
                        (h.status().state, bytes)
                    });
                    json!({
                        "id": p.id,
                        "name": p.name,
                        "processor": p.processor,
                        "state": status.map_or(RunState::Stopped, |s| s.0),
                        "state_bytes": status.map_or(0, |s| s.1),
                        "failure": p.failure,
                        "http_hosts": p.http_hosts,
                    })
                })
                .collect();
            json!({
                "id": t.id,
                "name": t.name,
                "created_ms": t.created_ms,
                "quotas": t.quotas,
                "tokens": t.tokens.iter().map(|k| json!({"id": k.id, "created_ms": k.created_ms})).collect::<Vec<_>>(),
                "kafka_brokers": t.kafka_brokers,
                "usage": {
                    "processors": processors.iter().filter(|p| p.tenant == t.id).count(),
                    "pipelines": own.len(),
                    "state_bytes": state_bytes,
                    "cpu_seconds": usage.cpu_ns.load(Ordering::Relaxed) as f64 / 1e9,
                    "memory_high_water_bytes": usage.memory_high_water.load(Ordering::Relaxed),
                    "rejected_requests": rejected.get(&t.id).copied().unwrap_or(0),
                },
                "pipelines": own,
            })
        })
        .collect();
    axum::Json(json!({ "tenants": list }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(text: &str, before: u64, limit: usize) -> (Vec<String>, u64) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, text).unwrap();
        read_tail(&path, 0, before, limit).unwrap()
    }

    #[test]
    fn the_tail_pages_back_row_by_row_to_the_beginning() {
        let text = "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n";
        let end = text.len() as u64;
        assert_eq!(
            tail(text, end, 2),
            (vec!["{\"a\":2}".to_owned(), "{\"a\":3}".to_owned()], 8)
        );
        assert_eq!(tail(text, 8, 2), (vec!["{\"a\":1}".to_owned()], 0));
        assert_eq!(tail(text, end, 10).0.len(), 3);
        assert_eq!(tail(text, 0, 10), (vec![], 0));
    }

    #[test]
    fn the_tail_stops_at_the_first_row_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        // The first row was dropped: its bytes are zeros now.
        std::fs::write(&path, "\0\0\0\0\0\0\0\0{\"a\":2}\n{\"a\":3}\n").unwrap();
        assert_eq!(
            read_tail(&path, 8, 24, 10).unwrap(),
            (vec!["{\"a\":2}".to_owned(), "{\"a\":3}".to_owned()], 8)
        );
        assert_eq!(read_tail(&path, 8, 8, 10).unwrap(), (vec![], 8));
    }

    #[test]
    fn the_tail_reads_rows_longer_than_its_first_window() {
        let long = format!("{{\"s\":\"{}\"}}", "x".repeat(200 << 10));
        let text = format!("{{\"a\":1}}\n{long}\n");
        let (rows, from) = tail(&text, text.len() as u64, 1);
        assert_eq!(rows, vec![long]);
        assert_eq!(from, 8);
    }

    #[test]
    fn a_tail_page_holds_at_most_its_byte_size() {
        let row = format!("{{\"s\":\"{}\"}}", "x".repeat(1 << 20));
        let text: String = (0..12).map(|_| format!("{row}\n")).collect();
        let end = text.len() as u64;
        let (rows, from) = tail(&text, end, 1000);
        let bytes: u64 = rows.iter().map(|r| r.len() as u64 + 1).sum();
        assert_eq!(rows.len(), 7, "7 rows of just over 1 MiB fit in 8 MiB");
        assert!(bytes <= MAX_TAIL_BYTES, "{bytes}");
        assert_eq!(from, end - bytes);
        // The page before goes on where this one began, back to the first row.
        let (older, first) = tail(&text, from, 1000);
        assert_eq!((older.len(), first), (5, 0));
        // A row longer than a page is returned alone; one past the row limit is refused.
        let long = format!("{{\"s\":\"{}\"}}\n", "y".repeat(10 << 20));
        let (rows, _) = tail(&format!("{text}{long}"), end + long.len() as u64, 5);
        assert_eq!(rows.len(), 1);
        let huge = format!("{{\"s\":\"{}\"}}\n", "z".repeat(17 << 20));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, format!("{text}{huge}")).unwrap();
        let e = read_tail(&path, 0, end + huge.len() as u64, 5).unwrap_err();
        assert!(e.message.contains("longer than"), "{}", e.message);
    }

    #[test]
    fn the_tail_refuses_an_offset_inside_a_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, "{\"a\":1}\n{\"a\":2}\n").unwrap();
        let e = read_tail(&path, 0, 5, 1).unwrap_err();
        assert!(
            e.message.contains("not at the end of a row"),
            "{}",
            e.message
        );
    }
}
