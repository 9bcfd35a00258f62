//! Authentication: every request carries `Authorization: Bearer TOKEN`, either the admin
//! token or one of a tenant's API tokens. Tenant tokens are 256 random bits; the registry
//! stores only their BLAKE3 hashes, compared in constant time. Tokens are never logged.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};

use crate::App;
use crate::error::ApiError;
use crate::registry::hex;

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Caller {
    Admin,
    Tenant(String),
}

/// A request authenticated with the admin token.
pub(crate) struct Admin;

/// A request authenticated with a tenant's token: the tenant id.
pub(crate) struct TenantId(pub String);

/// The hash stored for a token.
pub(crate) fn token_hash(token: &str) -> String {
    hex(blake3::hash(token.as_bytes()).as_bytes())
}

/// Compares two byte strings in time that depends only on their lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

impl FromRequestParts<Arc<App>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Caller, ApiError> {
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing `Authorization: Bearer TOKEN` header"))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthorized("the Authorization header must be `Bearer TOKEN`"))?;
        app.authenticate(token)
            .ok_or_else(|| unauthorized("invalid token"))
    }
}

impl FromRequestParts<Arc<App>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Admin, ApiError> {
        match Caller::from_request_parts(parts, app).await? {
            Caller::Admin => Ok(Admin),
            Caller::Tenant(_) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this endpoint needs the admin token",
            )),
        }
    }
}

impl FromRequestParts<Arc<App>> for TenantId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<TenantId, ApiError> {
        match Caller::from_request_parts(parts, app).await? {
            Caller::Tenant(id) => Ok(TenantId(id)),
            Caller::Admin => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this endpoint acts for a tenant: use one of the tenant's API tokens, not the admin token",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_contents_and_lengths() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn token_hashes_are_stable_hex() {
        assert_eq!(token_hash("x"), token_hash("x"));
        assert_ne!(token_hash("x"), token_hash("y"));
        assert_eq!(token_hash("x").len(), 64);
    }
}
