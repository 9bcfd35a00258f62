//! What a domain operation of the [`App`](super::App) refuses or fails with, saying whose
//! fault it is. The HTTP layer maps each variant to a status and a stable error code
//! (`From<AppError> for ApiError` in `crate::error`); the messages are the ones answered.

/// Why an operation of the server was refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum AppError {
    /// The caller's input is wrong: a field missing, out of range or inconsistent; the
    /// message names the field (HTTP 400).
    #[error("{0}")]
    BadInput(String),
    /// No such tenant, token, processor or pipeline (for this caller) (HTTP 404).
    #[error("no {what} `{id}`")]
    NotFound { what: &'static str, id: String },
    /// The operation conflicts with what exists: a processor still in use, a pipeline that
    /// cannot start (HTTP 409). `report` is an upgrade's compatibility report.
    #[error("{message}")]
    Conflict {
        message: String,
        report: Option<String>,
    },
    /// The tenant's quota does not allow it (HTTP 403 `quota_exceeded`).
    #[error("{0}")]
    Quota(String),
    /// The tenant's ingest rate limit is exhausted for `retry_after` seconds (HTTP 429).
    #[error("{message}")]
    RateLimited { message: String, retry_after: u64 },
    /// The uploaded component is not a processor the server accepts: it does not load,
    /// declares too much, or its `init` fails (HTTP 422).
    #[error("{0}")]
    InvalidProcessor(String),
    /// A processor is incompatible with a pipeline's state, or cannot be checked against
    /// it (HTTP 409 `incompatible_processor`).
    #[error("{message}")]
    IncompatibleProcessor {
        message: String,
        report: Option<String>,
    },
    /// A Kafka broker the admin did not grant the tenant (HTTP 403).
    #[error("{0}")]
    KafkaBrokerNotGranted(String),
    /// A Kafka client option a tenant may not set (HTTP 422).
    #[error("{0}")]
    ForbiddenKafkaOption(String),
    /// HTTP ingest into a pipeline that reads Kafka (HTTP 409).
    #[error("{0}")]
    KafkaSource(String),
    /// Reading the output log of a pipeline that writes to Kafka (HTTP 409).
    #[error("{0}")]
    KafkaSink(String),
    /// The pipeline is resuming after a restart; retry shortly (HTTP 503).
    #[error("the pipeline is resuming after a restart (loading its processor); retry shortly")]
    Resuming,
    /// Output before `start` was dropped by the pipeline's retention (HTTP 410).
    #[error(
        "the output before offset {start} was dropped by the pipeline's retention (quotas \
         `output_retention_bytes`, `output_retention_ms`), so `{param}` {offset} is gone; \
         the oldest row kept starts at {start}"
    )]
    OutputDropped {
        param: &'static str,
        offset: u64,
        start: u64,
    },
    /// The server failed (a file it cannot write, a task that panicked): not the
    /// caller's fault (HTTP 500).
    #[error("{0}")]
    Internal(String),
}

impl AppError {
    pub fn not_found(what: &'static str, id: &str) -> AppError {
        AppError::NotFound {
            what,
            id: id.to_owned(),
        }
    }

    pub fn bad_input(message: impl Into<String>) -> AppError {
        AppError::BadInput(message.into())
    }

    pub fn conflict(message: impl Into<String>) -> AppError {
        AppError::Conflict {
            message: message.into(),
            report: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> AppError {
        AppError::Internal(message.into())
    }
}

/// The result of a domain operation.
pub(crate) type AppResult<T> = std::result::Result<T, AppError>;
