//! Reads of a pipeline's results: pages of its committed output, and its state, timers,
//! changes, metadata and progress through a shared checkpoint reader (see
//! [`crate::readers`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::Deserialize;
use serde_json::Value;
use statebox_engine::{EngineError, StateReader};

use super::{App, AppError, AppResult};
use crate::pipeline::PipelineHandle;

/// Most rows one output page holds, and the most bytes it reads.
pub(crate) const MAX_PAGE_ROWS: usize = 10_000;
const MAX_PAGE_BYTES: u64 = 8 << 20;

/// Most rows a state read returns.
pub(crate) const MAX_STATE_ROWS: usize = 100_000;

/// A page of a pipeline's committed output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OutputPage {
    /// The rows, as a JSON array (each row as it was written).
    pub rows_json: String,
    pub count: usize,
    /// The offset of the next page.
    pub next: u64,
    /// Bytes of committed output.
    pub committed: u64,
    /// The offset of the oldest row kept (earlier ones were dropped by retention).
    pub start: u64,
}

/// What a state read returns: its rows, and whether more were there than its limit.
pub(crate) type Rows = (Vec<Value>, bool);

/// What a state read asks for (the query of `GET /v1/pipelines/{id}/state`): a state
/// variable (`var`; `flatten` gives a list or map one row per element) or the timers, at a
/// batch (default: the last committed), up to `limit` rows.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StateQuery {
    #[serde(default)]
    pub var: Option<String>,
    #[serde(default)]
    pub timers: bool,
    #[serde(default = "yes")]
    pub flatten: bool,
    #[serde(default)]
    pub batch_id: Option<u64>,
    #[serde(default)]
    pub limit: Option<usize>,
}

fn yes() -> bool {
    true
}

/// What a read of a variable's changes asks for (the query of
/// `GET /v1/pipelines/{id}/state/changes`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChangesQuery {
    pub var: String,
    pub from: u64,
    #[serde(default)]
    pub to: Option<u64>,
    #[serde(default)]
    pub limit: Option<usize>,
}

fn engine_error(e: EngineError) -> AppError {
    match e {
        EngineError::Config(m) => AppError::BadInput(m),
        other => AppError::internal(other.to_string()),
    }
}

/// Runs blocking work off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> AppResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AppError::internal(format!("a server task failed: {e}")))
}

/// Collects rows up to `limit`; reports whether more were there.
fn collect_rows(
    limit: usize,
    read: impl FnOnce(&mut dyn FnMut(Value) -> Result<(), EngineError>) -> Result<(), EngineError>,
) -> AppResult<Rows> {
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

/// Reads one page of `path` from `after` up to `committed`: up to `limit` rows or
/// [`MAX_PAGE_BYTES`] (at least one row, however long), so a page never reads more than
/// itself and one row. Returns the rows as a JSON array, the next offset and the count.
fn read_page(
    path: &std::path::Path,
    after: u64,
    committed: u64,
    limit: usize,
) -> AppResult<(String, u64, usize)> {
    use std::io::{BufRead, Read, Seek, SeekFrom};
    let io = |e: std::io::Error| AppError::internal(format!("cannot read the output: {e}"));
    if after == committed {
        return Ok(("[]".to_owned(), after, 0));
    }
    let mut f = std::fs::File::open(path).map_err(io)?;
    if after > 0 {
        let mut prev = [0u8; 1];
        f.seek(SeekFrom::Start(after - 1)).map_err(io)?;
        f.read_exact(&mut prev).map_err(io)?;
        if prev[0] != b'\n' {
            return Err(AppError::bad_input(format!(
                "`after` {after} is not at the start of a row; pass 0 or a `next` offset from \
                 an earlier page"
            )));
        }
    }
    f.seek(SeekFrom::Start(after)).map_err(io)?;
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
            .map_err(|e| AppError::internal(format!("the output is not UTF-8: {e}")))?;
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
}

impl App {
    /// A page of the tenant's pipeline `id`'s committed output after byte `after` (0: from
    /// the oldest row kept), of at most `limit` rows.
    pub(crate) async fn read_output(
        &self,
        tenant: &str,
        id: &str,
        after: u64,
        limit: Option<usize>,
    ) -> AppResult<OutputPage> {
        let handle = self.pipeline_handle(tenant, id)?;
        self.refuse_output_if_kafka(id)?;
        let mut committed = handle.status().committed_output_bytes;
        let limit = limit.unwrap_or(1000).clamp(1, MAX_PAGE_ROWS);
        if after > committed {
            return Err(AppError::bad_input(format!(
                "`after` {after} is past the committed output ({committed} bytes); pass 0 or a \
                 `next` offset from an earlier page"
            )));
        }
        // 0 is the oldest row kept; rows before it were dropped by the output's retention.
        let asked = after;
        let mut start = handle.output_start.load(Ordering::Acquire);
        let mut after = if asked == 0 { start } else { asked };
        if after < start {
            return Err(AppError::OutputDropped {
                param: "after",
                offset: after,
                start,
            });
        }
        loop {
            let path = PipelineHandle::output_path(&handle.dir);
            let (rows_json, next, count) =
                blocking(move || read_page(&path, after, committed, limit)).await??;
            // Dropped while it was read: what was read may be the zeros of freed blocks. A
            // read from the oldest row (`after` 0) reads again from the new oldest row.
            let start_now = handle.output_start.load(Ordering::Acquire);
            if after >= start_now {
                return Ok(OutputPage {
                    rows_json,
                    count,
                    next,
                    committed,
                    start,
                });
            }
            if asked != 0 {
                return Err(AppError::OutputDropped {
                    param: "after",
                    offset: after,
                    start: start_now,
                });
            }
            // The new oldest row is committed, and may lie past the committed offset seen
            // first.
            committed = handle.status().committed_output_bytes;
            (start, after) = (start_now, start_now);
        }
    }

    /// A shared reader of the tenant's pipeline `id`'s checkpoint, with a turn to read:
    /// the turn ends when the returned permit drops.
    async fn reader(
        &self,
        tenant: &str,
        id: &str,
    ) -> AppResult<(Arc<StateReader>, tokio::sync::OwnedSemaphorePermit)> {
        let h = self.pipeline_handle(tenant, id)?;
        let turn = self
            .readers
            .reading
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| AppError::internal("the readers are closed"))?;
        let batch = h.status().last_progress.map(|c| c.batch_id);
        let app = self.me.upgrade().expect("the app outlives its requests");
        let reader = blocking(move || {
            app.readers
                .get(&h.id, &PipelineHandle::checkpoint_dir(&h.dir), batch)
                .map_err(engine_error)
        })
        .await??;
        Ok((reader, turn))
    }

    /// The progress records of the pipeline's last `last` batches, as JSON objects.
    pub(crate) async fn progress(
        &self,
        tenant: &str,
        id: &str,
        last: usize,
    ) -> AppResult<Vec<Value>> {
        let (reader, turn) = self.reader(tenant, id).await?;
        blocking(move || {
            let _turn = turn;
            let records = reader.progress(last).map_err(engine_error)?;
            Ok(records.iter().map(|r| serde_json::json!(r)).collect())
        })
        .await?
    }

    /// Rows of the tenant's pipeline `id`'s state as `q` asks.
    pub(crate) async fn read_state(
        &self,
        tenant: &str,
        id: &str,
        q: StateQuery,
    ) -> AppResult<Rows> {
        let limit = q.limit.unwrap_or(10_000).clamp(1, MAX_STATE_ROWS);
        let (reader, turn) = self.reader(tenant, id).await?;
        blocking(move || {
            let _turn = turn;
            match (q.var.as_deref(), q.timers) {
                (Some(_), true) => Err(AppError::bad_input(
                    "pass either `var` or `timers=true`, not both",
                )),
                (None, false) => Err(AppError::bad_input(format!(
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
        .await?
    }

    /// The changes of a state variable between two batches, as `q` asks.
    pub(crate) async fn read_changes(
        &self,
        tenant: &str,
        id: &str,
        q: ChangesQuery,
    ) -> AppResult<Rows> {
        let limit = q.limit.unwrap_or(10_000).clamp(1, MAX_STATE_ROWS);
        let (reader, turn) = self.reader(tenant, id).await?;
        blocking(move || {
            let _turn = turn;
            collect_rows(limit, |f| reader.read_changes(&q.var, q.from, q.to, f))
        })
        .await?
    }

    /// The pipeline's checkpoint metadata.
    pub(crate) async fn read_metadata(&self, tenant: &str, id: &str) -> AppResult<Value> {
        let (reader, turn) = self.reader(tenant, id).await?;
        blocking(move || {
            let _turn = turn;
            reader.metadata().map_err(engine_error)
        })
        .await?
    }
}
