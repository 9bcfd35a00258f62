//! A processor that calls an HTTP service, so the end-to-end tests can check the
//! outbound-HTTP capability (SPEC §10): denied by default, allowed per host by the operator.
//!
//! Grouped by `k`. For each input row `{"k": ..., "url": ...}` it performs a `GET` of `url`
//! through `wasi:http/outgoing-handler` and emits `{"k", "status", "body", "error"}`: the
//! response's status and body (as text), or status -1 and the error the host returned (for
//! example `HttpRequestDenied` when the host is not on the pipeline's allow-list). The
//! unused one of `body` and `error` is null.

use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// One input row.
#[derive(Debug, Deserialize)]
pub struct Row {
    /// The grouping key.
    pub k: String,
    /// The URL to `GET` (`http://host[:port]/path` or `https://…`).
    pub url: String,
}

/// One output row.
#[derive(Debug, Serialize)]
pub struct Out {
    /// The grouping key.
    pub k: String,
    /// The HTTP status, or -1 when the request failed.
    pub status: i32,
    /// The response body, when the request succeeded.
    pub body: Option<String>,
    /// Why the request failed, when it did.
    pub error: Option<String>,
}

/// The processor. See the [crate docs](crate).
pub struct HttpCall;

impl StatefulProcessor for HttpCall {
    type Input = Row;
    type Output = Out;
    type InitialState = NoInitialState;

    const NAME: &'static str = "http-call";
    const OUTPUT_SCHEMA: &'static str = "k string, status int, body string, error string";
    const INPUT_SCHEMA: Option<&'static str> = Some("k string, url string");

    fn init(_handle: &mut Handle) -> Result<Self> {
        Ok(HttpCall)
    }

    fn handle_input_rows(
        &mut self,
        _key: &Key,
        rows: Vec<Row>,
        _timer_values: TimerValues,
        out: &mut Emitter<Out>,
    ) -> Result<()> {
        for row in rows {
            let (status, body, error) = match get(&row.url) {
                Ok((status, body)) => (i32::from(status), Some(body), None),
                Err(e) => (-1, None, Some(e)),
            };
            out.emit(Out {
                k: row.k,
                status,
                body,
                error,
            })?;
        }
        Ok(())
    }
}

statebox_sdk::export_processor!(HttpCall);

/// Splits `http://host:port/path?query` into (is https, authority, path with query).
fn split_url(url: &str) -> std::result::Result<(bool, &str, &str), String> {
    let (https, rest) = if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else {
        return Err(format!(
            "unsupported URL `{url}`: expected http:// or https://"
        ));
    };
    Ok(match rest.find('/') {
        Some(i) => (https, &rest[..i], &rest[i..]),
        None => (https, rest, "/"),
    })
}

/// `GET`s `url` through wasi:http; returns the status and the body as text.
#[cfg(target_arch = "wasm32")]
fn get(url: &str) -> std::result::Result<(u16, String), String> {
    use wasi::http::outgoing_handler;
    use wasi::http::types::{Fields, IncomingBody, Method, OutgoingRequest, Scheme};
    use wasi::io::streams::StreamError;

    let (https, authority, path) = split_url(url)?;
    let request = OutgoingRequest::new(Fields::new());
    let refused = |what: &str| format!("the host refused the request's {what}");
    request
        .set_method(&Method::Get)
        .map_err(|()| refused("method"))?;
    let scheme = if https { Scheme::Https } else { Scheme::Http };
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| refused("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| refused("authority"))?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| refused("path"))?;

    let pending = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(format!("{code:?}")),
        Some(Err(())) => return Err("the response was already taken".into()),
        None => return Err("the response is not ready after waiting for it".into()),
    };
    let status = response.status();
    let body = response
        .consume()
        .map_err(|()| "the body was already taken".to_owned())?;
    let stream = body
        .stream()
        .map_err(|()| "the body stream was already taken".to_owned())?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(format!("reading the body failed: {}", e.to_debug_string()));
            }
        }
    }
    drop(stream);
    drop(IncomingBody::finish(body));
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// Natively (under the test harness) there is no wasi:http; every request fails.
#[cfg(not(target_arch = "wasm32"))]
fn get(url: &str) -> std::result::Result<(u16, String), String> {
    split_url(url)?;
    Err("wasi:http is only available inside the Statebox host".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_urls() {
        assert_eq!(
            split_url("http://127.0.0.1:8080/a?b=1"),
            Ok((false, "127.0.0.1:8080", "/a?b=1"))
        );
        assert_eq!(
            split_url("https://example.com"),
            Ok((true, "example.com", "/"))
        );
        assert!(split_url("ftp://x").is_err());
    }
}
