//! Outbound HTTP (`wasi:http/outgoing-handler`), the one capability an operator can grant.
//!
//! The `wasi:http` imports are always linked, so a processor that imports them loads; every
//! request it sends goes through [`HttpHooks::send_request`], which checks the request's
//! host and port against the processor's allow-list ([`Limits::http_hosts`]). A request to a
//! host that is not on it — with the default, empty list, every request — never leaves the
//! host: the guest gets the `wasi:http` error code `HTTP-request-denied`, and the call goes
//! on (it is not a trap).
//!
//! Host calls block the calling thread and the epoch deadline cannot interrupt them, so an
//! allowed request is bounded by the deadline of the call that sent it: its connect,
//! first-byte and between-bytes timeouts are at most what is left of the call's CPU
//! deadline, and the response head, the response body and the connection are cut off at the
//! deadline itself. A service that hangs therefore holds the partition's thread at most
//! until the call's deadline, after which the call traps as any call past its deadline does.
//!
//! An operator can also route a granted origin elsewhere ([`Limits::http_routes`]): the
//! processor still asks for `https://api.example.com/...`, the grant is checked against that
//! name, and the request goes to the route's target instead (a test double on loopback, an
//! egress proxy). A route's target is the operator's own choice, so it is not held to the
//! internal-address rule below.
//!
//! Replays are deterministic only as far as the services a processor calls are: a re-run
//! batch sends its requests again and may get different answers.
//!
//! [`Limits::http_hosts`]: crate::Limits::http_hosts
//! [`Limits::http_routes`]: crate::Limits::http_routes

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::uri::{Authority, Scheme};
use http_body::{Body, Frame, SizeHint};
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use crate::sandbox::CallDeadline;

/// One entry of an outbound-HTTP allow-list: a host name or IP address, optionally with a
/// port. Without a port it allows every port of the host.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HttpHost {
    host: String,
    port: Option<u16>,
}

impl HttpHost {
    /// Parses `HOST` or `HOST:PORT` (an IPv6 address in brackets: `[::1]:8080`). Host names
    /// compare case-insensitively; no scheme, path, user or wildcard is accepted.
    pub fn parse(text: &str) -> Result<HttpHost, String> {
        let invalid = |why: &str| format!("invalid HTTP host `{text}`: {why}");
        let authority: Authority = text
            .parse()
            .map_err(|_| invalid("expected HOST or HOST:PORT"))?;
        if authority.as_str().contains('@') {
            return Err(invalid("user information is not allowed"));
        }
        let host = authority.host();
        if host.is_empty() {
            return Err(invalid("the host is empty"));
        }
        let port = authority.port_u16();
        // `host:` and `host:99999` parse as authorities, but name no usable port.
        if port.is_none() && authority.as_str().len() != host.len() {
            return Err(invalid("the port must be a number from 0 to 65535"));
        }
        Ok(HttpHost {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    fn allows(&self, host: &str, port: u16) -> bool {
        self.host.eq_ignore_ascii_case(host) && self.port.is_none_or(|p| p == port)
    }

    /// Whether this entry allows every request `other` names (its host, and its port or
    /// every port).
    pub fn covers(&self, other: &HttpHost) -> bool {
        match other.port {
            Some(port) => self.allows(&other.host, port),
            None => self.port.is_none() && self.host.eq_ignore_ascii_case(&other.host),
        }
    }
}

impl fmt::Display for HttpHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

/// An operator's route: requests to an origin (`scheme://host[:port]`) go to another one
/// instead, path and query unchanged. Written `ORIGIN=TARGET`, e.g.
/// `https://api.example.com=http://127.0.0.1:8080`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRoute {
    from: Origin,
    to: Origin,
}

/// A scheme, a host and a port (the scheme's default port when none is written).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Origin {
    scheme: Scheme,
    host: String,
    port: u16,
    /// The authority as written (for the rewritten request's URI).
    authority: Authority,
}

impl Origin {
    fn parse(text: &str, what: &str) -> Result<Origin, String> {
        let invalid = |why: &str| format!("invalid HTTP route {what} `{text}`: {why}");
        let uri: http::Uri = text
            .parse()
            .map_err(|_| invalid("expected http://HOST[:PORT] or https://HOST[:PORT]"))?;
        let scheme = match uri.scheme() {
            Some(s) if *s == Scheme::HTTP || *s == Scheme::HTTPS => s.clone(),
            _ => return Err(invalid("the scheme must be http:// or https://")),
        };
        let authority = uri.authority().cloned().ok_or_else(|| invalid("no host"))?;
        if authority.as_str().contains('@') {
            return Err(invalid("user information is not allowed"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(invalid("an origin has no path or query"));
        }
        let port = authority.port_u16().unwrap_or(default_port(Some(&scheme)));
        Ok(Origin {
            host: authority.host().to_ascii_lowercase(),
            scheme,
            port,
            authority,
        })
    }

    fn matches(&self, scheme: &Scheme, host: &str, port: u16) -> bool {
        self.scheme == *scheme && self.host.eq_ignore_ascii_case(host) && self.port == port
    }
}

impl HttpRoute {
    /// Parses `ORIGIN=TARGET`, each `http://HOST[:PORT]` or `https://HOST[:PORT]`.
    pub fn parse(text: &str) -> Result<HttpRoute, String> {
        let (from, to) = text.split_once('=').ok_or_else(|| {
            format!("invalid HTTP route `{text}`: expected ORIGIN=TARGET, e.g. https://api.example.com=http://127.0.0.1:8080")
        })?;
        Ok(HttpRoute {
            from: Origin::parse(from.trim(), "origin")?,
            to: Origin::parse(to.trim(), "target")?,
        })
    }

    /// The host name (or address) and port requests are routed from, as an allow-list
    /// entry would name them.
    pub fn origin_host(&self) -> HttpHost {
        HttpHost {
            host: self.from.host.clone(),
            port: Some(self.from.port),
        }
    }
}

impl fmt::Display for HttpRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}={}://{}",
            self.from.scheme, self.from.authority, self.to.scheme, self.to.authority
        )
    }
}

fn default_port(scheme: Option<&Scheme>) -> u16 {
    if scheme == Some(&Scheme::HTTPS) {
        443
    } else {
        80
    }
}

/// The entries of `texts` that `parse` accepts; the others are logged and left out.
fn valid_entries<T>(
    texts: &[String],
    parse: fn(&str) -> Result<T, String>,
    what: &str,
) -> Arc<[T]> {
    texts
        .iter()
        .filter_map(|text| match parse(text) {
            Ok(entry) => Some(entry),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring an invalid {what}");
                None
            }
        })
        .collect()
}

/// The `wasi:http` hooks of one instance: the allow-list, and the deadline of the call in
/// progress that bounds every request it sends.
pub(crate) struct HttpHooks {
    allow: Arc<[HttpHost]>,
    routes: Arc<[HttpRoute]>,
    deadline: CallDeadline,
    /// Requests sent since the current call (or key of a batched call) started.
    sent: usize,
}

/// Most requests one call (one key of a batched call) may send; past it, the guest gets
/// `connection-limit-reached`.
pub(crate) const MAX_REQUESTS_PER_CALL: usize = 64;

impl HttpHooks {
    /// Hooks allowing `hosts` (entries that do not parse allow nothing; the runtime's
    /// callers validate them with [`HttpHost::parse`] first).
    /// Routes are applied after the allow-list check (callers validate them with
    /// [`HttpRoute::parse`] first; entries that do not parse route nothing).
    pub(crate) fn new(hosts: &[String], routes: &[String], deadline: CallDeadline) -> HttpHooks {
        let allow = valid_entries(hosts, HttpHost::parse, "an entry of the HTTP allow-list");
        let routes = valid_entries(routes, HttpRoute::parse, "an HTTP route");
        HttpHooks {
            allow,
            routes,
            deadline,
            sent: 0,
        }
    }

    /// A call (or a key of a batched call) starts: it may send its own requests.
    pub(crate) fn start_call(&mut self) {
        self.sent = 0;
    }

    fn allows(&self, scheme: Option<&Scheme>, authority: Option<&Authority>) -> bool {
        let Some(authority) = authority else {
            return false;
        };
        let port = authority.port_u16().unwrap_or(default_port(scheme));
        self.allow.iter().any(|h| h.allows(authority.host(), port))
    }
}

type ResponseFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), Error>> + Send>,
                ),
                Error,
            >,
        > + Send,
>;

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> ResponseFuture {
        drop(fut);
        let mut request = request;
        let uri = request.uri().clone();
        if !self.allows(uri.scheme(), uri.authority()) {
            tracing::debug!(%uri, "outbound HTTP request denied: host not on the allow-list");
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }
        if self.sent >= MAX_REQUESTS_PER_CALL {
            tracing::debug!(%uri, "outbound HTTP request denied: too many requests in one call");
            return Box::new(async { Err(Error::ConnectionLimitReached) });
        }
        self.sent += 1;
        let authority = uri.authority().expect("checked by allows");
        let port = authority.port_u16().unwrap_or(default_port(uri.scheme()));
        let routed = uri.scheme().and_then(|scheme| {
            self.routes
                .iter()
                .find(|r| r.from.matches(scheme, authority.host(), port))
        });
        if let Some(route) = routed {
            let mut parts = uri.clone().into_parts();
            parts.scheme = Some(route.to.scheme.clone());
            parts.authority = Some(route.to.authority.clone());
            match http::Uri::from_parts(parts) {
                Ok(to) => {
                    tracing::debug!(from = %uri, %to, "outbound HTTP request routed");
                    *request.uri_mut() = to;
                }
                Err(_) => return Box::new(async { Err(Error::HttpRequestUriInvalid) }),
            }
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        // The address half of the check runs in the request's future.
        let allow = self.allow.clone();
        let routed_request = routed.is_some();
        let deadline = self.deadline.at();
        let remaining = deadline.saturating_duration_since(Instant::now());
        let bound = |asked: Option<Duration>| Some(asked.map_or(remaining, |d| d.min(remaining)));
        let options = RequestOptions {
            connect_timeout: bound(options.and_then(|o| o.connect_timeout)),
            first_byte_timeout: bound(options.and_then(|o| o.first_byte_timeout)),
            between_bytes_timeout: bound(options.and_then(|o| o.between_bytes_timeout)),
        };
        Box::new(async move {
            let deadline = tokio::time::Instant::from_std(deadline);
            // A route's target is the operator's choice; anything else the grant covers,
            // checked where the name points now, not only the name.
            if !routed_request {
                check_addresses(&host, port, &allow, deadline).await?;
            }
            let sent = tokio::time::timeout_at(
                deadline,
                wasmtime_wasi_http::default_send_request(request, Some(options)),
            )
            .await;
            let (response, connection) = match sent {
                Ok(sent) => sent?,
                Err(_) => return Err(Error::HttpResponseTimeout),
            };
            let response = response.map(|body| {
                WasiBody::new(DeadlineBody {
                    inner: Box::pin(body),
                    deadline: Box::pin(tokio::time::sleep_until(deadline)),
                })
            });
            // The connection (which also drives the request body) ends at the deadline too.
            let connection = async move {
                match tokio::time::timeout_at(deadline, connection).await {
                    Ok(done) => done,
                    Err(_) => Err(Error::ConnectionReadTimeout),
                }
            };
            Ok((
                response,
                Box::new(connection) as Box<dyn Future<Output = Result<(), Error>> + Send>,
            ))
        })
    }
}

/// Refuses a request whose `host` resolves (or is) an internal address the allow-list
/// `allow` does not name with `port` (see [`allows_address`]); the lookup ends at `deadline`.
async fn check_addresses(
    host: &str,
    port: u16,
    allow: &[HttpHost],
    deadline: tokio::time::Instant,
) -> Result<(), Error> {
    let addresses: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => {
            match tokio::time::timeout_at(deadline, tokio::net::lookup_host((host, port))).await {
                Ok(Ok(found)) => found.map(|a| a.ip()).collect(),
                Ok(Err(e)) => {
                    return Err(Error::DnsError {
                        rcode: Some(e.to_string().chars().take(200).collect()),
                        info_code: None,
                    });
                }
                Err(_) => return Err(Error::DnsTimeout),
            }
        }
    };
    if let Some(ip) = addresses
        .iter()
        .find(|ip| !allows_address(allow, **ip, port))
    {
        tracing::debug!(%host, %ip, "outbound HTTP request denied: the host resolves to an internal address");
        return Err(Error::DestinationIpProhibited);
    }
    Ok(())
}

/// Whether a request may go to `ip`, an address the request's host name resolved to (or
/// its literal address), under the allow-list `allow`. Addresses inside this machine or its
/// private networks (loopback, private, link-local, unique-local, unspecified, shared,
/// multicast) are refused unless an allow-list entry names that very address with the
/// request's port, so a granted name that resolves (or is re-pointed) to an internal
/// address reaches nothing inside.
fn allows_address(allow: &[HttpHost], ip: IpAddr, port: u16) -> bool {
    if !is_internal(ip) {
        return true;
    }
    allow.iter().any(|h| {
        h.host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            == Ok(ip)
            && h.port.is_none_or(|p| p == port)
    })
}

/// Whether `ip` is an address of this machine or of a private or special-purpose network
/// rather than of the public internet.
fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                // Shared address space (carrier-grade NAT), 100.64.0.0/10.
                || (a == 100 && (64..128).contains(&b))
                // IETF protocol assignments, 192.0.0.0/24.
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                // Benchmarking, 198.18.0.0/15; reserved, 240.0.0.0/4.
                || (a == 198 && (18..20).contains(&b))
                || a >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // Unique local fc00::/7 and link-local fe80::/10.
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
        }
    }
}

/// A response body that fails once the deadline of the call that sent the request passed.
struct DeadlineBody<B> {
    inner: Pin<Box<B>>,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl<B: Body<Error = Error>> Body for DeadlineBody<B> {
    type Data = B::Data;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, Error>>> {
        if let Poll::Ready(frame) = self.inner.as_mut().poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Error::ConnectionReadTimeout))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks(hosts: &[&str]) -> HttpHooks {
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        HttpHooks::new(&hosts, &[], CallDeadline::default())
    }

    fn allows(hooks: &HttpHooks, url: &str) -> bool {
        let uri: http::Uri = url.parse().unwrap();
        hooks.allows(uri.scheme(), uri.authority())
    }

    #[test]
    fn parses_hosts_and_refuses_anything_else() {
        assert_eq!(
            HttpHost::parse("Example.COM").unwrap().to_string(),
            "example.com"
        );
        assert_eq!(
            HttpHost::parse("127.0.0.1:8080").unwrap().to_string(),
            "127.0.0.1:8080"
        );
        assert_eq!(HttpHost::parse("[::1]:80").unwrap().to_string(), "[::1]:80");
        for bad in [
            "", "http://x", "x/y", "user@x", "x:", "x:99999", "x:port", "a b",
        ] {
            assert!(HttpHost::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn checks_host_and_port() {
        let empty = hooks(&[]);
        assert!(!allows(&empty, "http://127.0.0.1:80/"));
        let h = hooks(&["127.0.0.1:8080", "api.example.com"]);
        assert!(allows(&h, "http://127.0.0.1:8080/x"));
        assert!(!allows(&h, "http://127.0.0.1:8081/x"));
        assert!(!allows(&h, "http://127.0.0.1/x"));
        assert!(!allows(&h, "http://localhost:8080/x"));
        assert!(allows(&h, "https://API.example.com/x"));
        assert!(allows(&h, "http://api.example.com:9000/x"));
        assert!(!allows(&h, "http://api.example.com.evil.test/x"));
        let p = hooks(&["example.com:443"]);
        assert!(allows(&p, "https://example.com/"));
        assert!(!allows(&p, "http://example.com/"));
    }

    #[test]
    fn internal_addresses_need_a_grant_that_names_them() {
        let h = hooks(&["api.example.com", "127.0.0.1:8080", "[::1]"]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // A public address is fine for any granted name.
        assert!(allows_address(&h.allow, ip("93.184.216.34"), 443));
        assert!(allows_address(&h.allow, ip("2606:2800:220:1::1"), 443));
        // Internal addresses only where the grant names that address (and port).
        assert!(allows_address(&h.allow, ip("127.0.0.1"), 8080));
        assert!(!allows_address(&h.allow, ip("127.0.0.1"), 8081));
        assert!(allows_address(&h.allow, ip("::1"), 9));
        for internal in [
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "127.0.0.2",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "::",
        ] {
            assert!(is_internal(ip(internal)), "{internal}");
            assert!(!allows_address(&h.allow, ip(internal), 80), "{internal}");
        }
    }

    #[test]
    fn parses_routes_and_refuses_anything_else() {
        let r = HttpRoute::parse("https://API.example.com=http://127.0.0.1:8080").unwrap();
        assert_eq!(
            r.to_string(),
            "https://API.example.com=http://127.0.0.1:8080"
        );
        assert_eq!(r.origin_host().to_string(), "api.example.com:443");
        assert!(r.from.matches(&Scheme::HTTPS, "api.example.com", 443));
        assert!(!r.from.matches(&Scheme::HTTP, "api.example.com", 443));
        assert!(!r.from.matches(&Scheme::HTTPS, "api.example.com", 8443));
        assert_eq!((r.to.host.as_str(), r.to.port), ("127.0.0.1", 8080));
        for bad in [
            "",
            "https://a",
            "https://a=",
            "a=http://b",
            "ftp://a=http://b",
            "https://a/x=http://b",
            "https://a=http://b/x",
            "https://u@a=http://b",
        ] {
            assert!(HttpRoute::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
