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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::AppError;

    /// The statuses and codes the API answered before the domain errors were typed: a
    /// client (and the end-to-end tests) rely on them.
    #[test]
    fn every_domain_error_keeps_its_status_code_and_message() {
        let cases = [
            (AppError::bad_input("m"), 400, "bad_request", None),
            (AppError::not_found("pipeline", "p"), 404, "not_found", None),
            (AppError::conflict("m"), 409, "conflict", None),
            (AppError::Quota("m".into()), 403, "quota_exceeded", None),
            (
                AppError::RateLimited {
                    message: "m".into(),
                    retry_after: 7,
                },
                429,
                "rate_limited",
                Some(7),
            ),
            (
                AppError::InvalidProcessor("m".into()),
                422,
                "invalid_processor",
                None,
            ),
            (
                AppError::IncompatibleProcessor {
                    message: "m".into(),
                    report: Some("r".into()),
                },
                409,
                "incompatible_processor",
                None,
            ),
            (
                AppError::KafkaBrokerNotGranted("m".into()),
                403,
                "kafka_broker_not_granted",
                None,
            ),
            (
                AppError::ForbiddenKafkaOption("m".into()),
                422,
                "forbidden_kafka_option",
                None,
            ),
            (AppError::KafkaSource("m".into()), 409, "kafka_source", None),
            (AppError::KafkaSink("m".into()), 409, "kafka_sink", None),
            (AppError::Resuming, 503, "resuming", Some(1)),
            (
                AppError::OutputDropped {
                    param: "after",
                    offset: 1,
                    start: 9,
                },
                410,
                "output_dropped",
                None,
            ),
            (AppError::internal("m"), 500, "internal", None),
        ];
        for (error, status, code, retry_after) in cases {
            let message = error.to_string();
            let api = ApiError::from(error);
            assert_eq!(
                (api.status.as_u16(), api.code, api.retry_after),
                (status, code, retry_after),
                "{message}"
            );
            assert_eq!(api.message, message);
        }
        let api = ApiError::from(AppError::not_found("pipeline", "pl_x"));
        assert_eq!(api.message, "no pipeline `pl_x`");
        let api = ApiError::from(AppError::Conflict {
            message: "refused".into(),
            report: Some("the report".into()),
        });
        assert_eq!(api.details, Some(json!({"report": "the report"})));
    }
}
