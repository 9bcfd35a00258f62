"""An aiohttp-compatible HTTP client inside a Statebox component, over ``wasi:http``.

The part of aiohttp's client API an async processor uses to call services, so the
documentation's example (one request per row, ``asyncio.gather``) runs unchanged:

- ``ClientSession(base_url=None, headers=None, timeout=None, raise_for_status=False)``,
  used with ``async with``; ``session.get/post/put/delete/patch/head/options(url, *,
  params=None, data=None, json=None, headers=None, timeout=None, raise_for_status=None,
  allow_redirects=True)`` and ``session.request(method, url, ...)``, awaited or used with
  ``async with``; ``await session.close()``; ``aiohttp.request(method, url, ...)``.
- ``ClientResponse``: ``status``, ``reason``, ``ok``, ``headers`` (case-insensitive),
  ``url``, ``method``, ``await read()``, ``await text(encoding=None)``, ``await
  json(loads=json.loads, content_type="application/json")``, ``raise_for_status()``,
  ``release()``, ``close()``, ``async with``.
- ``ClientTimeout(total=None, connect=None, sock_read=None, sock_connect=None)``.
- Errors: ``ClientError``, ``ClientResponseError`` (``status``, ``message``, ``headers``),
  ``ClientConnectionError``, ``ClientConnectorError``, ``ServerTimeoutError``,
  ``ContentTypeError``, ``InvalidURL``.

Requests run on the SDK's scheduler: ``await``ed together (``asyncio.gather``, which inside
a component is ``statebox.aio.gather``) they are in flight together. The host sends a
request only to hosts the operator granted (``statebox run --allow-http HOST``); others
fail with ``ClientConnectorError`` saying so. Every request is bounded by the call's
deadline. Anything else of aiohttp (cookies, auth helpers, connectors, websockets, proxies,
streaming bodies, the server) raises ``NotImplementedError`` naming it.
"""

import json as _json
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit

from statebox import _http

__all__ = [
    "ClientConnectionError",
    "ClientConnectorError",
    "ClientError",
    "ClientResponse",
    "ClientResponseError",
    "ClientSession",
    "ClientTimeout",
    "ContentTypeError",
    "InvalidURL",
    "ServerTimeoutError",
    "request",
]

_IMPLEMENTED = (
    "ClientSession (get, post, put, delete, patch, head, options, request, close), "
    "ClientResponse (status, reason, ok, headers, url, method, read, text, json, "
    "raise_for_status, release, close), ClientTimeout, aiohttp.request and the client errors"
)


def _missing(what):
    return NotImplementedError(
        f"{what} is not provided by Statebox's aiohttp client, which implements {_IMPLEMENTED}"
    )


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise _missing(f"aiohttp.{name}")


class ClientError(Exception):
    """The base of the client's errors."""


class ClientConnectionError(ClientError):
    """The request did not get a response."""


class ClientConnectorError(ClientConnectionError):
    """The connection could not be made (or the host denied the request)."""


class ServerTimeoutError(ClientConnectionError, TimeoutError):
    """The service did not answer in time."""


class InvalidURL(ClientError, ValueError):
    """The URL is not an absolute http(s) URL."""


class ClientResponseError(ClientError):
    """An error status (``raise_for_status``) or an unreadable response."""

    def __init__(self, request_info=None, history=(), *, status=None, message="", headers=None):
        super().__init__(f"{status}, message={message!r}, url={getattr(request_info, 'url', None)!r}")
        self.request_info = request_info
        self.history = history
        self.status = status
        self.message = message
        self.headers = headers


class ContentTypeError(ClientResponseError):
    """``json()`` of a response whose content type is not JSON."""


class RequestInfo:
    __slots__ = ("url", "method", "headers", "real_url")

    def __init__(self, url, method, headers):
        self.url = url
        self.method = method
        self.headers = headers
        self.real_url = url


class ClientTimeout:
    """Timeouts in seconds. Statebox applies the smallest one given to connecting, the first
    byte and the gaps between bytes of every request; the call's deadline bounds the rest."""

    def __init__(self, total=None, connect=None, sock_read=None, sock_connect=None, ceil_threshold=5):
        self.total = total
        self.connect = connect
        self.sock_read = sock_read
        self.sock_connect = sock_connect

    def seconds(self):
        given = [t for t in (self.total, self.connect, self.sock_read, self.sock_connect) if t]
        return min(given) if given else None


class _Headers(dict):
    """Response headers: case-insensitive lookups; a repeated header keeps every value
    (``getall``)."""

    def __init__(self, pairs):
        super().__init__()
        self._all = {}
        for k, v in pairs:
            key = k.lower()
            self._all.setdefault(key, []).append(v)
            if key not in self:
                dict.__setitem__(self, key, v)

    def __getitem__(self, key):
        return dict.__getitem__(self, key.lower())

    def get(self, key, default=None):
        return dict.get(self, key.lower(), default)

    def __contains__(self, key):
        return dict.__contains__(self, key.lower())

    def getall(self, key, default=None):
        found = self._all.get(key.lower())
        if found is None:
            if default is not None:
                return default
            raise KeyError(key)
        return list(found)

    def getone(self, key, default=None):
        return self.get(key, default)


class ClientResponse:
    """A response, its body already read (``read``/``text``/``json`` need no network)."""

    def __init__(self, method, url, status, headers, body, request_info, history=()):
        self.method = method
        self.url = url
        self.real_url = url
        self.status = status
        self.reason = _REASONS.get(status)
        self.headers = _Headers(headers)
        self._body = body
        self.request_info = request_info
        self.history = tuple(history)
        self.closed = False

    @property
    def ok(self):
        return self.status < 400

    @property
    def content_type(self):
        return (self.headers.get("content-type") or "application/octet-stream").split(";")[0].strip()

    @property
    def charset(self):
        for part in (self.headers.get("content-type") or "").split(";")[1:]:
            key, _, value = part.strip().partition("=")
            if key.lower() == "charset":
                return value.strip('"')
        return None

    async def read(self):
        return self._body

    async def text(self, encoding=None, errors="strict"):
        return self._body.decode(encoding or self.charset or "utf-8", errors)

    async def json(self, *, encoding=None, loads=_json.loads, content_type="application/json"):
        if content_type and content_type not in self.content_type:
            raise ContentTypeError(
                self.request_info,
                self.history,
                status=self.status,
                message=f"Attempt to decode JSON with unexpected mimetype: {self.content_type}",
                headers=self.headers,
            )
        text = self._body.decode(encoding or self.charset or "utf-8")
        return loads(text) if text.strip() else None

    def raise_for_status(self):
        if self.status >= 400:
            raise ClientResponseError(
                self.request_info,
                self.history,
                status=self.status,
                message=self.reason or "",
                headers=self.headers,
            )

    def release(self):
        self.closed = True

    def close(self):
        self.closed = True

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.release()
        return False

    def __repr__(self):
        return f"<ClientResponse({self.url}) [{self.status} {self.reason}]>"


class _RequestContextManager:
    """What ``session.get(...)`` returns: awaitable, and an async context manager."""

    __slots__ = ("_coro", "_response")

    def __init__(self, coro):
        self._coro = coro
        self._response = None

    def __await__(self):
        return self._coro.__await__()

    async def __aenter__(self):
        self._response = await self._coro
        return self._response

    async def __aexit__(self, *exc):
        if self._response is not None:
            self._response.release()
        return False


_UNSUPPORTED_SESSION = {
    "connector", "cookies", "cookie_jar", "auth", "version", "trust_env", "trace_configs",
    "read_bufsize", "requote_redirect_url", "auto_decompress", "skip_auto_headers",
    "connector_owner", "fallback_charset_resolver", "proxy", "proxy_auth",
}
_UNSUPPORTED_REQUEST = {
    "cookies", "auth", "proxy", "proxy_auth", "ssl", "verify_ssl", "fingerprint",
    "ssl_context", "compress", "chunked", "expect100", "read_until_eof", "server_hostname",
    "trace_request_ctx", "skip_auto_headers", "auto_decompress", "max_line_size",
    "max_field_size", "read_bufsize", "proxy_headers", "max_redirects",
}


def _refuse(kind, options, unsupported):
    for name, value in options.items():
        if name in unsupported and value is None:
            continue
        raise _missing(f"{kind}({name}=...)")


class ClientSession:
    """An HTTP session. See the module's documentation for what is implemented."""

    def __init__(self, base_url=None, *, headers=None, timeout=None, raise_for_status=False,
                 json_serialize=_json.dumps, **options):
        _refuse("ClientSession", options, _UNSUPPORTED_SESSION)
        self._base_url = str(base_url) if base_url is not None else None
        self._headers = list(_header_pairs(headers))
        self._timeout = timeout
        self._raise_for_status = raise_for_status
        self._json_serialize = json_serialize
        self.closed = False

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
        return False

    async def close(self):
        self.closed = True

    def request(self, method, url, **kwargs):
        return _RequestContextManager(self._request(method, url, **kwargs))

    def get(self, url, **kwargs):
        return self.request("GET", url, **kwargs)

    def post(self, url, **kwargs):
        return self.request("POST", url, **kwargs)

    def put(self, url, **kwargs):
        return self.request("PUT", url, **kwargs)

    def delete(self, url, **kwargs):
        return self.request("DELETE", url, **kwargs)

    def patch(self, url, **kwargs):
        return self.request("PATCH", url, **kwargs)

    def head(self, url, **kwargs):
        kwargs.setdefault("allow_redirects", False)
        return self.request("HEAD", url, **kwargs)

    def options(self, url, **kwargs):
        return self.request("OPTIONS", url, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise _missing(f"ClientSession.{name}")

    async def _request(self, method, url, *, params=None, data=None, json=None, headers=None,
                       timeout=None, raise_for_status=None, allow_redirects=True, **options):
        _refuse(f"ClientSession.{method.lower()}", options, _UNSUPPORTED_REQUEST)
        if self.closed:
            raise RuntimeError("Session is closed")
        url = str(url)
        if self._base_url is not None:
            url = urljoin(self._base_url, url)
        if params:
            items = params.items() if hasattr(params, "items") else params
            parts = urlsplit(url)
            query = "&".join(p for p in (parts.query, urlencode(list(items))) if p)
            url = urlunsplit(parts._replace(query=query))
        if urlsplit(url).scheme.lower() not in ("http", "https") or not urlsplit(url).netloc:
            raise InvalidURL(url)
        pairs = self._headers + list(_header_pairs(headers))
        names = {k.lower() for k, _ in pairs}
        body = b""
        if json is not None and data is not None:
            raise ValueError("data and json parameters can not be used at the same time")
        if json is not None:
            body = self._json_serialize(json).encode("utf-8")
            if "content-type" not in names:
                pairs.append(("Content-Type", "application/json"))
        elif data is not None:
            if isinstance(data, str):
                body = data.encode("utf-8")
                if "content-type" not in names:
                    pairs.append(("Content-Type", "text/plain; charset=utf-8"))
            elif isinstance(data, (bytes, bytearray, memoryview)):
                body = bytes(data)
                if "content-type" not in names:
                    pairs.append(("Content-Type", "application/octet-stream"))
            elif isinstance(data, dict) or isinstance(data, (list, tuple)):
                items = data.items() if isinstance(data, dict) else data
                body = urlencode(list(items)).encode("ascii")
                if "content-type" not in names:
                    pairs.append(("Content-Type", "application/x-www-form-urlencoded"))
            else:
                raise _missing(f"a request body of type {type(data).__name__}")
        if body and "content-length" not in names:
            pairs.append(("Content-Length", str(len(body))))
        timeout = timeout if timeout is not None else self._timeout
        seconds = timeout.seconds() if isinstance(timeout, ClientTimeout) else timeout
        history = []
        for _ in range(10):
            info = RequestInfo(url, method, pairs)
            try:
                status, response_headers, data_ = await _http.fetch(method, url, pairs, body, seconds)
            except _http.TransportError as e:
                if e.code in ("ConnectionTimeout", "ConnectionReadTimeout", "HttpResponseTimeout"):
                    raise ServerTimeoutError(str(e)) from None
                raise ClientConnectorError(str(e)) from None
            except ValueError as e:
                raise InvalidURL(url) from e
            response = ClientResponse(method, url, status, response_headers, data_, info, history)
            location = response.headers.get("location")
            if allow_redirects and status in (301, 302, 303, 307, 308) and location:
                history.append(response)
                url = urljoin(url, location)
                if status == 303 or (status in (301, 302) and method == "POST"):
                    method, body = "GET", b""
                    pairs = [(k, v) for k, v in pairs if k.lower() not in ("content-type", "content-length")]
                continue
            check = self._raise_for_status if raise_for_status is None else raise_for_status
            if check:
                response.raise_for_status()
            return response
        raise ClientResponseError(info, history, status=status, message="Too many redirects")


def _header_pairs(headers):
    if not headers:
        return []
    items = headers.items() if hasattr(headers, "items") else headers
    return [(str(k), str(v)) for k, v in items]


def request(method, url, **kwargs):
    """``aiohttp.request(method, url, ...)``: one request on a session of its own."""
    return ClientSession().request(method, url, **kwargs)


_REASONS = {
    200: "OK", 201: "Created", 202: "Accepted", 204: "No Content", 301: "Moved Permanently",
    302: "Found", 303: "See Other", 304: "Not Modified", 307: "Temporary Redirect",
    308: "Permanent Redirect", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 409: "Conflict", 429: "Too Many Requests",
    500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
    504: "Gateway Timeout",
}
