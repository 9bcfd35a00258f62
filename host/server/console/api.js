// The console's only way to the server: the public /v1 API, with the token the user typed.
// The token lives in sessionStorage (gone when the tab closes) and travels only in the
// Authorization header, never in a URL.

const KEY = 'statebox.token';

/** An error answered by the API: its status, stable code and message. */
export class ApiError extends Error {
  constructor(status, code, message, error) {
    super(message);
    this.status = status;
    this.code = code;
    this.error = error || {};
  }
}

export const session = {
  get token() { return sessionStorage.getItem(KEY); },
  set token(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  },
  /** Who the token belongs to: {role: 'admin'} or {role: 'tenant', tenant, name}. */
  who: null,
};

/** Calls the API; resolves to the parsed JSON (null for 204), rejects with ApiError. */
export async function api(method, path, body, contentType) {
  const headers = { Authorization: `Bearer ${session.token || ''}` };
  let payload;
  if (body instanceof Blob || body instanceof ArrayBuffer) {
    payload = body;
    headers['Content-Type'] = contentType || 'application/octet-stream';
  } else if (typeof body === 'string') {
    payload = body;
    headers['Content-Type'] = contentType || 'application/json';
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers['Content-Type'] = 'application/json';
  }
  let res;
  try {
    res = await fetch(path, { method, headers, body: payload, cache: 'no-store' });
  } catch (e) {
    throw new ApiError(0, 'network', `The server cannot be reached (${e.message}).`);
  }
  if (res.status === 204) return null;
  const text = await res.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { /* not JSON: reported below */ }
  if (!res.ok) {
    const err = json && json.error;
    if (err) throw new ApiError(res.status, err.code, err.message, err);
    throw new ApiError(res.status, 'http', `${res.status} ${res.statusText}: ${text.slice(0, 200)}`);
  }
  if (json === null && text) throw new ApiError(res.status, 'bad_json', 'The server answered something that is not JSON.');
  return json;
}

export const get = (path) => api('GET', path);
export const post = (path, body, type) => api('POST', path, body === undefined ? {} : body, type);
export const put = (path, body) => api('PUT', path, body);
export const patch = (path, body) => api('PATCH', path, body);
export const del = (path) => api('DELETE', path);

/** Encodes a path segment (ids are plain, but never trust that). */
export const seg = (s) => encodeURIComponent(String(s));

/** Builds a query string from the defined entries of `params`. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}
