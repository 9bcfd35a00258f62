//! API errors: an HTTP status, a stable machine-readable code and a message that says what is
//! wrong, rendered as `{"error": {"code", "message", ...}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An error answered to the client. Never carries a secret.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Extra fields of the error object (e.g. an upgrade report).
    pub details: Option<Value>,
    /// Seconds to wait before retrying (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(what: &str, id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no {what} `{id}`"),
        )
    }

    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    pub fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = json!({"code": self.code, "message": self.message});
        if let (Some(Value::Object(extra)), Value::Object(obj)) = (self.details, &mut error) {
            obj.extend(extra);
        }
        let mut response = (self.status, axum::Json(json!({ "error": error }))).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&seconds.to_string()).expect("digits are a header value"),
            );
        }
        response
    }
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(r: axum::extract::rejection::JsonRejection) -> ApiError {
        ApiError::new(r.status(), "bad_request", r.body_text())
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(r: axum::extract::rejection::QueryRejection) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", r.body_text())
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(r: axum::extract::rejection::PathRejection) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", r.body_text())
    }
}

impl From<crate::app::AppError> for ApiError {
    /// The status and code of each kind of refusal; the message is the error's own.
    fn from(e: crate::app::AppError) -> ApiError {
        use crate::app::AppError as E;
        let message = e.to_string();
        let (status, code) = match &e {
            E::BadInput(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            E::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            E::Conflict { .. } => (StatusCode::CONFLICT, "conflict"),
            E::Quota(_) => (StatusCode::FORBIDDEN, "quota_exceeded"),
            E::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            E::InvalidProcessor(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_processor"),
            E::IncompatibleProcessor { .. } => (StatusCode::CONFLICT, "incompatible_processor"),
            E::KafkaBrokerNotGranted(_) => (StatusCode::FORBIDDEN, "kafka_broker_not_granted"),
            E::ForbiddenKafkaOption(_) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "forbidden_kafka_option")
            }
            E::KafkaSource(_) => (StatusCode::CONFLICT, "kafka_source"),
            E::KafkaSink(_) => (StatusCode::CONFLICT, "kafka_sink"),
            E::Resuming => (StatusCode::SERVICE_UNAVAILABLE, "resuming"),
            E::OutputDropped { .. } => (StatusCode::GONE, "output_dropped"),
            E::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        let mut api = ApiError::new(status, code, message);
        match e {
            E::Conflict {
                report: Some(report),
                ..
            }
            | E::IncompatibleProcessor {
                report: Some(report),
                ..
            } => api = api.with_details(json!({ "report": report })),
            E::RateLimited { retry_after, .. } => api.retry_after = Some(retry_after),
            E::Resuming => api.retry_after = Some(1),
            _ => {}
        }
        api
    }
}
