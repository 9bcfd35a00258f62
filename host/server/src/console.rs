//! The web console (issue 18): a single-page app served at `/`, its files embedded in the
//! binary so a server on an offline machine serves it as it is (no CDN, no Node at run time).
//!
//! The pages hold no data and need no token: everything the console shows it reads through
//! the authenticated `/v1` API, with the token the user typed (kept in the browser's session
//! storage, never in a URL). So the console can do nothing a script with the same token
//! cannot.

use std::sync::Arc;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::App;

/// One embedded file: its name under `/assets/`, its media type and its bytes.
struct Asset {
    name: &'static str,
    media_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $media_type:expr) => {
        Asset {
            name: $name,
            media_type: $media_type,
            bytes: include_bytes!(concat!("../console/", $name)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file of the console. `index.html` is served at `/`.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("ui.js", JS),
    asset!("charts.js", JS),
    asset!("views/login.js", JS),
    asset!("views/processors.js", JS),
    asset!("views/pipelines.js", JS),
    asset!("views/pipeline.js", JS),
    asset!("views/state.js", JS),
    asset!("views/admin.js", JS),
    asset!("vendor/uPlot.esm.js", JS),
    asset!("vendor/uPlot.min.css", "text/css; charset=utf-8"),
    asset!("vendor/uPlot.LICENSE", "text/plain; charset=utf-8"),
];

/// The console's routes: `/` and `/assets/{path}`.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/assets/{*path}", get(asset))
}

/// Headers that keep the console's pages to themselves: scripts only from this server (no
/// inline script, so an injected string cannot run), no framing (clickjacking), no referrer
/// (the URL holds no secret, but there is no reason to hand it on).
fn secured(asset: &Asset) -> Response {
    let headers: [(HeaderName, HeaderValue); 6] = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.media_type),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                 img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; \
                 base-uri 'none'; form-action 'none'",
            ),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        // The files change with the binary; revalidating costs little on a console.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, asset.bytes).into_response()
}

fn find(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.name == name)
}

async fn index() -> Response {
    secured(find("index.html").expect("index.html is embedded"))
}

async fn asset(Path(path): Path<String>) -> Response {
    match find(&path) {
        Some(asset) => secured(asset),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("no console asset `{path}`"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_console_imports_is_embedded() {
        // A module imported by another but missing from ASSETS would 404 in the browser and
        // leave a blank page; catch it here rather than in the browser tests.
        for asset in ASSETS.iter().filter(|a| a.media_type == JS) {
            let text = std::str::from_utf8(asset.bytes).expect("JavaScript is UTF-8");
            for line in text.lines() {
                let line = line.trim();
                let Some(rest) = line
                    .strip_prefix("import ")
                    .and_then(|l| l.split(" from ").nth(1))
                else {
                    continue;
                };
                let spec = rest.trim_end_matches(';').trim_matches(['\'', '"']);
                let base = asset.name.rsplit_once('/').map_or("", |(dir, _)| dir);
                let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
                for part in spec.split('/') {
                    match part {
                        "." => {}
                        ".." => {
                            parts.pop();
                        }
                        p => parts.push(p),
                    }
                }
                let resolved = parts.join("/");
                assert!(
                    find(&resolved).is_some(),
                    "{} imports {spec} ({resolved}), which is not embedded",
                    asset.name
                );
            }
        }
    }

    #[test]
    fn index_references_only_embedded_assets() {
        let index = std::str::from_utf8(find("index.html").unwrap().bytes).unwrap();
        for part in index.split("/assets/").skip(1) {
            let name = part.split(['"', '\'']).next().unwrap();
            assert!(find(name).is_some(), "index.html references {name}");
        }
    }
}
