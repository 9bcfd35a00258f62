//! Ingest over HTTP: finding a pipeline that takes rows, the tenant's quotas and rate
//! limits, and appending checked rows to the pipeline's input log (acknowledged once
//! durable).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{App, AppError, AppResult};
use crate::pipeline::PipelineHandle;
use crate::rows::ingest_lines;
use crate::{Quotas, add};

/// How long ingest waits for a resuming pipeline's processor before it is refused
/// ([`AppError::Resuming`]).
pub(crate) const RESUME_WAIT: Duration = Duration::from_secs(30);

/// Bodies larger than this are checked on a blocking thread.
const CHECK_INLINE_BYTES: usize = 1 << 20;

/// A token bucket limiting a tenant's ingest rate (rows or bytes).
pub(crate) struct Bucket {
    pub tokens: f64,
    pub last: Instant,
}

impl Bucket {
    /// Takes `n` tokens at `rate` per second (bursts of one second's worth), or says how
    /// many seconds to wait. A request larger than the bucket is admitted when the bucket
    /// is full (and puts it in debt), so any request size works and the sustained rate
    /// still holds.
    fn check(&mut self, n: u64, rate: u64, now: Instant) -> Result<(), u64> {
        let rate = rate as f64;
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * rate).min(rate);
        self.last = now;
        let n = n as f64;
        if self.tokens < n && self.tokens < rate {
            return Err(((n.min(rate) - self.tokens) / rate).ceil().max(1.0) as u64);
        }
        Ok(())
    }

    fn take(&mut self, n: u64) {
        self.tokens -= n as f64;
    }
}

impl App {
    /// The pipeline `tenant` ingests into by HTTP: refused when it reads Kafka, and, while
    /// it resumes after a restart, waited for (up to [`RESUME_WAIT`]) until its processor's
    /// input checks are loaded.
    pub(crate) async fn ingest_target(
        &self,
        tenant: &str,
        id: &str,
    ) -> AppResult<Arc<PipelineHandle>> {
        let handle = self
            .pipeline(tenant, id)
            .ok_or_else(|| AppError::not_found("pipeline", id))?;
        self.refuse_ingest_if_kafka(id)?;
        // Rows are checked against the processor's input schema before they are
        // acknowledged; while a pipeline resumes after a restart, ingest waits (a while)
        // for it to load.
        let waiting = Instant::now();
        while !handle.checks_ready.load(Ordering::Acquire) && waiting.elapsed() < RESUME_WAIT {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !handle.checks_ready.load(Ordering::Acquire) {
            return Err(AppError::Resuming);
        }
        Ok(handle)
    }

    /// Checks `body` (a JSON array of rows or JSON Lines) against the pipeline's input
    /// checks and the tenant's quotas and rate limits, and appends its rows to the
    /// pipeline's input log; returns how many rows were acknowledged (durable). Either
    /// every row of the body is acknowledged or none is.
    pub(crate) async fn ingest(
        &self,
        handle: &Arc<PipelineHandle>,
        body: axum::body::Bytes,
    ) -> AppResult<u64> {
        let tenant = handle.tenant.as_str();
        let quotas = self.quotas(tenant);
        let stopped_at_quota = handle
            .state_quota_failure
            .lock()
            .expect("state quota lock")
            .clone();
        if let Err(reason) = stopped_at_quota
            .map_or(Ok(()), Err)
            .and_then(|()| self.check_state_quota(tenant))
            .and_then(|()| self.check_disk_quota(tenant, body.len() as u64))
        {
            self.count_rejected(tenant);
            return Err(AppError::Quota(reason));
        }
        let check = handle.ingest.lock().expect("ingest lock").clone();
        let (lines, rows) = if body.len() > CHECK_INLINE_BYTES {
            tokio::task::spawn_blocking(move || ingest_lines(&body, &check))
                .await
                .map_err(|e| AppError::internal(format!("a server task failed: {e}")))??
        } else {
            ingest_lines(&body, &check)?
        };
        if rows == 0 {
            return Ok(0);
        }
        if let Err((quota, wait)) =
            self.take_ingest_tokens(tenant, rows, lines.len() as u64, &quotas)
        {
            self.count_rejected(tenant);
            let limit = if quota == "ingest_rows_per_s" {
                format!("{} rows/s", quotas.ingest_rows_per_s)
            } else {
                format!("{} bytes/s", quotas.ingest_bytes_per_s)
            };
            return Err(AppError::RateLimited {
                message: format!(
                    "the tenant's ingest rate limit of {limit} (`{quota}`) is exhausted; retry \
                     in {wait} s"
                ),
                retry_after: wait,
            });
        }
        let bytes_stored = lines.len() as u64;
        handle
            .log
            .append(lines)
            .await
            .map_err(|e| AppError::internal(format!("the rows were not stored: {e}")))?;
        add(&handle.metrics.disk_bytes, bytes_stored);
        add(&handle.metrics.rows_ingested, rows);
        add(&handle.metrics.ingest_requests, 1);
        handle.notify();
        Ok(rows)
    }

    /// Takes `rows` and `bytes` from the tenant's ingest buckets, or says which limit is
    /// exhausted and how many seconds to wait. Nothing is taken from either bucket unless
    /// both admit the request.
    pub(crate) fn take_ingest_tokens(
        &self,
        tenant: &str,
        rows: u64,
        bytes: u64,
        quotas: &Quotas,
    ) -> Result<(), (&'static str, u64)> {
        let mut buckets = self.buckets.lock().expect("buckets lock");
        let now = Instant::now();
        let (by_rows, by_bytes) = buckets.entry(tenant.to_owned()).or_insert_with(|| {
            (
                Bucket {
                    tokens: quotas.ingest_rows_per_s as f64,
                    last: now,
                },
                Bucket {
                    tokens: quotas.ingest_bytes_per_s as f64,
                    last: now,
                },
            )
        });
        by_rows
            .check(rows, quotas.ingest_rows_per_s, now)
            .map_err(|wait| ("ingest_rows_per_s", wait))?;
        by_bytes
            .check(bytes, quotas.ingest_bytes_per_s, now)
            .map_err(|wait| ("ingest_bytes_per_s", wait))?;
        by_rows.take(rows);
        by_bytes.take(bytes);
        Ok(())
    }
}
