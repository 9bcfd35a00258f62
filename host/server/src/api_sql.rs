//! `POST /v1/pipelines/{id}/sql {"sql": "...", "limit": N}`: SQL over a pipeline's committed
//! state, as `statebox sql` runs it on a checkpoint (`read_statestore`,
//! `read_state_metadata`; queries only, nothing is written). The answer is
//! `{"columns", "rows", "count", "truncated"}`, every row a JSON object with the columns in
//! the query's order.
//!
//! Queries run on the blocking pool, at most [`SLOTS`] at a time per server, and stop
//! reading once `limit` rows (or [`MAX_BYTES`]) are out.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;

use crate::App;
#[cfg(feature = "sql")]
use crate::api::blocking;
use crate::api::parse_json;
use crate::api_console::pipeline;
use crate::auth::TenantId;
use crate::error::ApiError;

type Result<T> = std::result::Result<T, ApiError>;

/// SQL queries running at once, over every tenant: DataFusion plans use every core, so more
/// would only slow the pipelines down.
#[cfg(feature = "sql")]
const SLOTS: usize = 2;
/// Most rows a query returns.
const MAX_ROWS: usize = 10_000;
/// Most bytes of rows a query returns.
#[cfg(feature = "sql")]
const MAX_BYTES: usize = 8 << 20;
/// Longest query text.
const MAX_SQL_BYTES: usize = 64 << 10;

#[cfg(feature = "sql")]
static RUNNING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(SLOTS);

pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new().route("/v1/pipelines/{id}/sql", post(sql))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SqlRequest {
    sql: String,
    #[serde(default)]
    limit: Option<usize>,
}

async fn sql(
    State(app): State<Arc<App>>,
    TenantId(tenant): TenantId,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let req: SqlRequest = parse_json(&body)?;
    if req.sql.trim().is_empty() {
        return Err(ApiError::bad_request("`sql` must not be empty"));
    }
    if req.sql.len() > MAX_SQL_BYTES {
        return Err(ApiError::bad_request(format!(
            "`sql` is longer than {MAX_SQL_BYTES} bytes"
        )));
    }
    let h = pipeline(&app, &tenant, &id)?;
    let limit = req.limit.unwrap_or(1000).clamp(1, MAX_ROWS);
    let checkpoint = crate::pipeline::PipelineHandle::checkpoint_dir(&h.dir);
    let result = run(checkpoint, req.sql, limit).await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], result).into_response())
}

#[cfg(feature = "sql")]
async fn run(checkpoint: std::path::PathBuf, sql: String, limit: usize) -> Result<String> {
    let _slot = RUNNING
        .acquire()
        .await
        .map_err(|e| ApiError::internal(format!("the SQL slots are closed: {e}")))?;
    blocking(move || -> Result<String> {
        let mut rows = RowSink::new(limit);
        let outcome = statebox_sql::run(
            &checkpoint,
            &sql,
            statebox_sql::OutputFormat::Jsonl,
            &mut rows,
        );
        match outcome {
            Ok(()) => {}
            // The sink refused more rows: the result is cut, not failed.
            Err(_) if rows.full => {}
            Err(statebox_sql::SqlError::State(e)) => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "no_state",
                    format!("cannot read the pipeline's state: {e}"),
                ));
            }
            Err(e) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_query",
                    e.to_string(),
                ));
            }
        }
        Ok(rows.into_body())
    })
    .await?
}

#[cfg(not(feature = "sql"))]
async fn run(_checkpoint: std::path::PathBuf, _sql: String, _limit: usize) -> Result<String> {
    Err(ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "sql_not_built",
        "this server was built without SQL (the `sql` feature of the statebox crate)",
    ))
}

/// Collects the JSON Lines the printer writes, up to `limit` rows and [`MAX_BYTES`], then
/// refuses more, which stops the query.
#[cfg(feature = "sql")]
struct RowSink {
    limit: usize,
    rows: Vec<u8>,
    /// Bytes of a row whose end has not been written yet.
    partial: Vec<u8>,
    count: usize,
    full: bool,
}

#[cfg(feature = "sql")]
impl RowSink {
    fn new(limit: usize) -> RowSink {
        RowSink {
            limit,
            rows: Vec::new(),
            partial: Vec::new(),
            count: 0,
            full: false,
        }
    }

    /// The answer: the columns of the first row (the query's order), the rows as they were
    /// printed (JSON objects whose keys keep that order), the count and whether it was cut.
    fn into_body(self) -> String {
        let columns = match self.rows.split(|&b| b == b'\n').next() {
            Some(first) if !first.is_empty() => column_names(first),
            _ => "[]".to_owned(),
        };
        let mut body = format!("{{\"columns\":{columns},\"rows\":[");
        let mut first = true;
        for line in self.rows.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            if !first {
                body.push(',');
            }
            first = false;
            body.push_str(std::str::from_utf8(line).unwrap_or("null"));
        }
        body.push_str(&format!(
            "],\"count\":{},\"truncated\":{}}}",
            self.count, self.full
        ));
        body
    }
}

/// The keys of one JSON object, in their order, as a JSON array.
#[cfg(feature = "sql")]
fn column_names(object: &[u8]) -> String {
    struct Keys(Vec<String>);
    impl<'de> serde::Deserialize<'de> for Keys {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Keys, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Keys;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> std::result::Result<Keys, A::Error> {
                    let mut keys = Vec::new();
                    while let Some(k) = map.next_key::<String>()? {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        keys.push(k);
                    }
                    Ok(Keys(keys))
                }
            }
            d.deserialize_map(V)
        }
    }
    let keys = serde_json::from_slice::<Keys>(object).map_or_else(|_| Vec::new(), |k| k.0);
    serde_json::to_string(&keys).expect("strings serialise")
}

#[cfg(feature = "sql")]
impl std::io::Write for RowSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let full = || std::io::Error::other("the result is cut at its row limit");
        if self.full {
            return Err(full());
        }
        for (i, &b) in buf.iter().enumerate() {
            // Only a row past the limit marks the result as cut.
            if self.count >= self.limit || self.rows.len() >= MAX_BYTES {
                self.full = true;
                return if i == 0 { Err(full()) } else { Ok(i) };
            }
            self.partial.push(b);
            if b == b'\n' {
                self.rows.append(&mut self.partial);
                self.count += 1;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(all(test, feature = "sql"))]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_sink_keeps_whole_rows_up_to_its_limit_and_names_the_columns_in_order() {
        let mut sink = RowSink::new(2);
        sink.write_all(b"{\"z\":1,\"a\":{\"b\":2}}\n{\"z\":")
            .unwrap();
        sink.write_all(b"3,\"a\":null}\n").unwrap();
        assert!(!sink.full, "exactly `limit` rows are not a cut result");
        assert!(sink.write_all(b"{\"z\":5}\n").is_err());
        assert!(sink.full);
        let body: serde_json::Value = serde_json::from_str(&sink.into_body()).unwrap();
        assert_eq!(body["columns"], serde_json::json!(["z", "a"]));
        assert_eq!(body["count"], 2);
        assert_eq!(body["truncated"], true);
        assert_eq!(body["rows"][1]["z"], 3);
    }
}
