"""HTTP requests over ``wasi:http/outgoing-handler``, for the SDK's aiohttp client.

Each request is sent as soon as it is made and then awaited on the SDK's scheduler
(``aio.wait_pollable``): while it is in flight the other tasks run, and when every task is
waiting the scheduler polls all their pollables at once, so requests gathered together are
in flight together. The host decides whether a request may leave (``--allow-http``) and
bounds it by the call's deadline.
"""

from urllib.parse import urlsplit

from .aio import wait_pollable

READ_SIZE = 64 * 1024


class TransportError(Exception):
    """The request failed before a response arrived (denied, refused, timed out, ...).
    ``code`` is the ``wasi:http`` error code's name, e.g. ``"HttpRequestDenied"``."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _bindings():
    from componentize_py_types import Err, Ok
    from wit_world.imports import outgoing_handler, streams
    from wit_world.imports import wasi_http_types as http

    return Ok, Err, outgoing_handler, streams, http


_METHODS = {
    "GET": "Method_Get",
    "HEAD": "Method_Head",
    "POST": "Method_Post",
    "PUT": "Method_Put",
    "DELETE": "Method_Delete",
    "CONNECT": "Method_Connect",
    "OPTIONS": "Method_Options",
    "TRACE": "Method_Trace",
    "PATCH": "Method_Patch",
}


def _code_name(err_value):
    name = type(err_value).__name__
    return name[len("ErrorCode_"):] if name.startswith("ErrorCode_") else name


def _transport_error(url, err_value):
    code = _code_name(err_value)
    if code == "HttpRequestDenied":
        host = urlsplit(url).netloc
        message = (
            f"the HTTP request to {url} was denied: the operator grants hosts with "
            f"--allow-http (e.g. --allow-http {host})"
        )
    else:
        detail = getattr(err_value, "value", None)
        message = f"the HTTP request to {url} failed: {code}" + (
            f" ({detail})" if detail is not None else ""
        )
    return TransportError(code, message)


async def fetch(method, url, headers, body, timeout_s=None):
    """Sends one request and returns ``(status, [(name, value)], body_bytes)``."""
    Ok, Err, outgoing_handler, streams, http = _bindings()
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an absolute http(s) URL: {url!r}")
    fields = http.Fields.from_list(
        [(str(k), v if isinstance(v, bytes) else str(v).encode("latin-1")) for k, v in headers]
    )
    request = http.OutgoingRequest(fields)
    name = _METHODS.get(method.upper())
    request.set_method(
        getattr(http, name)() if name is not None else http.Method_Other(method.upper())
    )
    request.set_scheme(http.Scheme_Https() if scheme == "https" else http.Scheme_Http())
    request.set_authority(parts.netloc)
    path = parts.path or "/"
    request.set_path_with_query(path + (f"?{parts.query}" if parts.query else ""))
    options = None
    if timeout_s is not None:
        options = http.RequestOptions()
        ns = int(timeout_s * 1e9)
        for setter in (
            options.set_connect_timeout,
            options.set_first_byte_timeout,
            options.set_between_bytes_timeout,
        ):
            try:
                setter(ns)
            except Err:
                pass  # a timeout the host does not support: the call's deadline bounds it
    outgoing_body = request.body()
    try:
        future = outgoing_handler.handle(request, options)
    except Err as e:
        raise _transport_error(url, e.value) from None
    await _write_body(outgoing_body, body or b"", http, streams, Err)
    while True:
        result = future.get()
        if result is not None:
            break
        await wait_pollable(future.subscribe())
    future.__exit__(None, None, None)
    if isinstance(result, Err):
        raise TransportError("ResponseTaken", f"the response to {url} was already taken")
    inner = result.value
    if isinstance(inner, Err):
        raise _transport_error(url, inner.value)
    response = inner.value
    status = response.status()
    response_headers = [(k, v.decode("latin-1")) for k, v in response.headers().entries()]
    data = await _read_body(response.consume(), http, streams, Err)
    response.__exit__(None, None, None)
    return status, response_headers, data


async def _write_body(outgoing_body, data, http, streams, Err):
    stream = outgoing_body.write()
    offset = 0
    try:
        while offset < len(data):
            room = stream.check_write()
            if room == 0:
                await wait_pollable(stream.subscribe())
                continue
            n = min(room, len(data) - offset, 4096)
            stream.write(data[offset : offset + n])
            offset += n
        if data:
            stream.flush()
            while stream.check_write() == 0:
                await wait_pollable(stream.subscribe())
    except Err as e:
        raise TransportError("BodyWrite", f"writing the request body failed: {e.value}") from None
    finally:
        stream.__exit__(None, None, None)
    http.OutgoingBody.finish(outgoing_body, None)


async def _read_body(incoming_body, http, streams, Err):
    stream = incoming_body.stream()
    chunks = []
    try:
        while True:
            try:
                chunk = stream.read(READ_SIZE)
            except Err as e:
                if isinstance(e.value, streams.StreamError_Closed):
                    break
                raise TransportError(
                    "BodyRead", f"reading the response body failed: {e.value}"
                ) from None
            if chunk:
                chunks.append(chunk)
            else:
                await wait_pollable(stream.subscribe())
    finally:
        stream.__exit__(None, None, None)
    trailers = http.IncomingBody.finish(incoming_body)
    trailers.__exit__(None, None, None)
    return b"".join(chunks)
