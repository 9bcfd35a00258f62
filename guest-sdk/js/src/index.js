// Write Statebox stateful processors in JavaScript or TypeScript.
//
// A processor is a class (or a plain object) with Spark's `StatefulProcessor` methods:
// `init(handle)`, `handleInputRows(key, rows, timerValues)`, and optionally
// `handleExpiredTimer`, `handleInitialState` and `close`. The module's default export is the
// processor; `build.mjs` bundles it with this SDK and turns it into a WebAssembly component.
//
// Rows, keys and state values cross the boundary as compact JSON text: rows are plain
// objects, keys are arrays of the key columns' values, and the host checks every value
// against the Spark DDL schema its variable was declared with. Integers outside
// ±Number.MAX_SAFE_INTEGER (a `long` beyond 2^53) are `BigInt`s, both ways (`json.js`).
//
// This file is the public facade. The raw WIT imports are reached only here and in
// `export.js`; processors never see them.

import * as wit from 'statebox:processor/handle@0.1.0';
import { log as witLog } from 'statebox:processor/log@0.1.0';
import { formatArgs } from './errors.js';
import { parse, stringify } from './json.js';

/**
 * JSON as the SDK reads and writes it: `parseJson` makes integers beyond ±(2^53 - 1) `BigInt`s,
 * `stringifyJson` writes `BigInt`s as JSON integers (where `JSON.stringify` throws).
 */
export { parse as parseJson, stringify as stringifyJson };

/** How many items an iterator fetches from the host per page. */
const PAGE_SIZE = 256;

/** The key under which the generated bindings keep a resource's destructor. */
const DISPOSE = Symbol.dispose || Symbol.for('dispose');

/**
 * An expected failure of a state or timer operation, raised by the host: a value that does
 * not match its schema, an empty list given to `put`, state touched outside a handler, timers
 * in time mode `none`, and so on. `kind` is the host's error kind, e.g. `"schema-mismatch"`.
 */
export class StateError extends Error {
  constructor(kind, message) {
    super(`${kind}: ${message}`);
    this.name = 'StateError';
    this.kind = kind;
  }
}

/** Converts what a raw import threw into a `StateError`, or rethrows it unchanged. */
function lift(err) {
  const payload = err !== null && typeof err === 'object' ? err.payload : undefined;
  if (payload && typeof payload.kind === 'string') {
    return new StateError(payload.kind, payload.message);
  }
  return err;
}

/** Calls a raw import, turning the host's `state-error` into a `StateError`. */
function host(call) {
  try {
    return call();
  } catch (err) {
    throw lift(err);
  }
}

/**
 * Encodes a state value, a list element or a map key (`role`) of variable `name` as JSON text.
 * The message is built only on failure: this runs on every state write.
 */
export function encode(value, name, role) {
  let json;
  try {
    json = stringify(value);
  } catch (err) {
    throw new TypeError(`cannot encode the ${role} of \`${name}\` as JSON: ${err.message}`);
  }
  if (json === undefined) {
    throw new TypeError(`cannot encode the ${role} of \`${name}\` as JSON: ${typeof value} has no JSON form`);
  }
  return json;
}

/** Encodes every element of an array. */
function encodeAll(values, name) {
  if (!Array.isArray(values)) {
    throw new TypeError(`expected an array of elements of \`${name}\`, got ${typeof values}`);
  }
  const json = new Array(values.length);
  for (let i = 0; i < values.length; i++) json[i] = encode(values[i], name, 'element');
  return json;
}

/**
 * The iterators opened during the handler call in progress and maybe not yet released. An
 * iterator frees its host resource when it is exhausted or abandoned (`return()`, which
 * `for ... of` calls on `break`, `return` or a throw); `endCall` frees the rest (an iterator
 * left half-read) when the call ends, since the host refuses them afterwards anyway.
 */
const open = [];

/**
 * Frees every iterator of the call that just ended (the glue in `export.js` calls it after
 * each key's handler). Using one afterwards throws `invalid-use`, as the host would.
 * @internal
 */
export function endCall() {
  for (let i = 0; i < open.length; i++) open[i].expire();
  open.length = 0;
}

/**
 * A lazy iterator over one of the host's paged iterators (list elements, map keys, values or
 * entries). It fetches `PAGE_SIZE` items per call to the host and decodes each as it is
 * yielded, so a list of a million elements is never in guest memory at once. Valid only
 * during the handler call that created it.
 */
class PagedIterator {
  constructor(source, decode) {
    this.source = source;
    this.decode = decode;
    this.page = [];
    this.index = 0;
    this.expired = false;
    open.push(this);
  }

  [Symbol.iterator]() {
    return this;
  }

  next() {
    while (this.index >= this.page.length) {
      if (this.source === null) {
        if (this.expired) {
          throw new StateError('invalid-use', 'an iterator was used after the call that created it returned');
        }
        return { done: true, value: undefined };
      }
      const page = host(() => this.source.nextPage(PAGE_SIZE));
      if (page.length === 0) {
        this.release();
        return { done: true, value: undefined };
      }
      this.page = page;
      this.index = 0;
    }
    const item = this.page[this.index];
    this.page[this.index] = undefined;
    this.index += 1;
    return { done: false, value: this.decode(item) };
  }

  /**
   * Called by `for ... of` when the loop ends early (`break`, `return`, a throw), and by
   * destructuring: frees the host's iterator at once.
   */
  return(value) {
    this.release();
    this.page = [];
    this.index = 0;
    return { done: true, value };
  }

  /** Collects the remaining items into an array. */
  toArray() {
    return Array.from(this);
  }

  /** Frees the host's iterator now (`using it = list.get()` calls this too). */
  [DISPOSE]() {
    this.return();
  }

  release() {
    const source = this.source;
    if (source === null) return;
    this.source = null;
    // Iterators are mostly finished in the order they were opened; the rest are dropped by
    // `endCall`.
    if (open[open.length - 1] === this) open.pop();
    const dispose = source[DISPOSE];
    if (typeof dispose === 'function') {
      dispose.call(source);
    }
  }

  /** The call that made the iterator ended. */
  expire() {
    if (this.source === null) return;
    this.release();
    this.page = [];
    this.index = 0;
    this.expired = true;
  }
}

/** A single value per grouping key. Mirrors Spark's `ValueState`. */
export class ValueState {
  /** @internal */
  constructor(name, resource) {
    this.name = name;
    this.resource = resource;
  }

  /** Whether the current key has a value. */
  exists() {
    try {
      return this.resource.exists();
    } catch (err) {
      throw lift(err);
    }
  }

  /** The current key's value, or `undefined`. */
  get() {
    let json;
    try {
      json = this.resource.get();
    } catch (err) {
      throw lift(err);
    }
    return json === undefined ? undefined : parse(json);
  }

  /** Replaces the current key's value, restarting its TTL. */
  update(value) {
    const json = encode(value, this.name, 'value');
    try {
      this.resource.update(json);
    } catch (err) {
      throw lift(err);
    }
  }

  /** Removes the current key's value. */
  clear() {
    try {
      this.resource.clear();
    } catch (err) {
      throw lift(err);
    }
  }
}

/**
 * An ordered list of values per grouping key. Mirrors Spark's `ListState`. `get` returns a
 * lazy iterable, fetched from the host page by page.
 */
export class ListState {
  /** @internal */
  constructor(name, resource) {
    this.name = name;
    this.resource = resource;
  }

  /** Whether the current key's list has at least one element. */
  exists() {
    try {
      return this.resource.exists();
    } catch (err) {
      throw lift(err);
    }
  }

  /** The current key's list in insertion order, as a lazy iterable. */
  get() {
    return new PagedIterator(host(() => this.resource.get()), parse);
  }

  /** Replaces the whole list, restarting every element's TTL. Empty lists are refused. */
  put(values) {
    const json = encodeAll(values, this.name);
    try {
      this.resource.put(json);
    } catch (err) {
      throw lift(err);
    }
  }

  /** Appends one element, with its own TTL. */
  appendValue(value) {
    const json = encode(value, this.name, 'element');
    try {
      this.resource.appendValue(json);
    } catch (err) {
      throw lift(err);
    }
  }

  /** Appends elements in order, each with its own TTL. Empty lists are refused. */
  appendList(values) {
    const json = encodeAll(values, this.name);
    try {
      this.resource.appendList(json);
    } catch (err) {
      throw lift(err);
    }
  }

  /** Removes the current key's list. */
  clear() {
    try {
      this.resource.clear();
    } catch (err) {
      throw lift(err);
    }
  }
}

function decodeEntry(entry) {
  return [parse(entry.key), parse(entry.value)];
}

/**
 * A map from user keys to values per grouping key. Mirrors Spark's `MapState`. Iteration is
 * lazy and ordered by the host: ascending by the user key's canonical encoding.
 */
export class MapState {
  /** @internal */
  constructor(name, resource) {
    this.name = name;
    this.resource = resource;
  }

  /** Whether the current key's map has at least one entry. */
  exists() {
    try {
      return this.resource.exists();
    } catch (err) {
      throw lift(err);
    }
  }

  /** The value stored under `userKey`, or `undefined`. */
  getValue(userKey) {
    const key = encode(userKey, this.name, 'key');
    let json;
    try {
      json = this.resource.getValue(key);
    } catch (err) {
      throw lift(err);
    }
    return json === undefined ? undefined : parse(json);
  }

  /** Whether `userKey` is present. */
  containsKey(userKey) {
    const key = encode(userKey, this.name, 'key');
    try {
      return this.resource.containsKey(key);
    } catch (err) {
      throw lift(err);
    }
  }

  /** Inserts or replaces the entry for `userKey`, restarting that entry's TTL. */
  updateValue(userKey, value) {
    const key = encode(userKey, this.name, 'key');
    const json = encode(value, this.name, 'value');
    try {
      this.resource.updateValue(key, json);
    } catch (err) {
      throw lift(err);
    }
  }

  /** Removes the entry for `userKey`, if any. */
  removeKey(userKey) {
    const key = encode(userKey, this.name, 'key');
    try {
      this.resource.removeKey(key);
    } catch (err) {
      throw lift(err);
    }
  }

  /** The current key's entries as `[userKey, value]` pairs, lazily, in user-key order. */
  iterator() {
    return new PagedIterator(host(() => this.resource.iterator()), decodeEntry);
  }

  /** The current key's user keys, lazily, in order. */
  keys() {
    return new PagedIterator(host(() => this.resource.keys()), parse);
  }

  /** The current key's values, lazily, in user-key order. */
  values() {
    return new PagedIterator(host(() => this.resource.values()), parse);
  }

  /** Removes every entry of the current key; other keys are untouched. */
  clear() {
    try {
      this.resource.clear();
    } catch (err) {
      throw lift(err);
    }
  }
}

/** The TTL option of a declaration, as the host's `option<u64>`. */
function ttlOption(options, name) {
  const ttlMs = options?.ttlMs;
  if (ttlMs === undefined || ttlMs === null) {
    return undefined;
  }
  if (typeof ttlMs !== 'number' || !Number.isSafeInteger(ttlMs) || ttlMs < 0) {
    throw new TypeError(`ttlMs of \`${name}\` must be a non-negative integer, got ${ttlMs}`);
  }
  return BigInt(ttlMs);
}

/** A timestamp in milliseconds as the host's `s64`. */
function millis(what, ms) {
  if (typeof ms === 'bigint') {
    return ms;
  }
  if (typeof ms !== 'number' || !Number.isSafeInteger(ms)) {
    throw new TypeError(`${what} must be an integer number of milliseconds, got ${ms}`);
  }
  return BigInt(ms);
}

function checkSchema(what, schema) {
  if (typeof schema !== 'string') {
    throw new TypeError(`${what} must be a Spark DDL string such as "count long", got ${typeof schema}`);
  }
}

/**
 * Declares state variables and manages timers. Mirrors Spark's `StatefulProcessorHandle`.
 *
 * Variables are declared in `init` only; keep the returned state objects (and the handle, for
 * timers) in the processor and use them in the handlers, where they act on the key of the call
 * in progress.
 */
export class Handle {
  /** @internal */
  constructor(timeMode) {
    /** The query's time mode: `"none"`, `"processing-time"` or `"event-time"`. */
    this.timeMode = timeMode;
  }

  /** Declares a value state variable whose values match `schema` (Spark DDL). */
  getValueState(name, schema, options) {
    checkSchema(`the schema of \`${name}\``, schema);
    const ttl = ttlOption(options, name);
    return new ValueState(name, host(() => wit.getValueState(name, schema, ttl)));
  }

  /** Declares a list state variable whose elements match `schema` (Spark DDL). */
  getListState(name, schema, options) {
    checkSchema(`the schema of \`${name}\``, schema);
    const ttl = ttlOption(options, name);
    return new ListState(name, host(() => wit.getListState(name, schema, ttl)));
  }

  /** Declares a map state variable from user keys matching `userKeySchema` to values matching `valueSchema`. */
  getMapState(name, userKeySchema, valueSchema, options) {
    checkSchema(`the key schema of \`${name}\``, userKeySchema);
    checkSchema(`the value schema of \`${name}\``, valueSchema);
    const ttl = ttlOption(options, name);
    return new MapState(
      name,
      host(() => wit.getMapState(name, userKeySchema, valueSchema, ttl)),
    );
  }

  /** Drops the named variable's data for all keys, if it exists. Allowed only in `init`. */
  deleteIfExists(name) {
    try {
      wit.deleteIfExists(name);
    } catch (err) {
      throw lift(err);
    }
  }

  /** Registers a timer for the current key at `expiryMs`; an existing timer is a no-op. */
  registerTimer(expiryMs) {
    const ms = millis('registerTimer(expiryMs)', expiryMs);
    try {
      wit.registerTimer(ms);
    } catch (err) {
      throw lift(err);
    }
  }

  /** Deletes the current key's timer at `expiryMs`; a missing timer is a no-op. */
  deleteTimer(expiryMs) {
    const ms = millis('deleteTimer(expiryMs)', expiryMs);
    try {
      wit.deleteTimer(ms);
    } catch (err) {
      throw lift(err);
    }
  }

  /** The current key's registered timers in milliseconds, ascending. */
  listTimers() {
    // The bindings return a BigInt64Array.
    return Array.from(host(() => wit.listTimers()), Number);
  }

  /**
   * The query and batch this call runs in, like Spark's `getQueryInfo()`: `queryId` (fixed
   * when the checkpoint was created), `runId` (new on each start of the query) and `batchId`
   * (the batch in progress, 0 outside a batch), a number.
   */
  getQueryInfo() {
    const info = wit.getQueryInfo();
    return new QueryInfo(info.queryId, info.runId, Number(info.batchId));
  }
}

/** The query and batch a call runs in. Mirrors Spark's `QueryInfo`. */
export class QueryInfo {
  /** @internal */
  constructor(queryId, runId, batchId) {
    /** The query's id: fixed when its checkpoint is created, the same across restarts. */
    this.queryId = queryId;
    /** This run's id: new each time the query is started. */
    this.runId = runId;
    /** The id of the batch in progress (0 outside a batch). */
    this.batchId = batchId;
  }

  /** Spark's name for `queryId`. */
  getQueryId() {
    return this.queryId;
  }

  /** Spark's name for `runId`. */
  getRunId() {
    return this.runId;
  }

  /** Spark's name for `batchId`. */
  getBatchId() {
    return this.batchId;
  }
}

/** The times a handler call may consult. Mirrors Spark's `TimerValues`. */
export class TimerValues {
  /** @internal */
  constructor(processingTimeMs, watermarkMs) {
    /** The batch timestamp in ms since the Unix epoch; -1 in time mode `none`. */
    this.currentProcessingTimeMs = processingTimeMs;
    /** The watermark in ms since the Unix epoch; -1 unless the time mode is `event-time`. */
    this.currentWatermarkMs = watermarkMs;
  }

  /** Spark's name for `currentProcessingTimeMs`. */
  getCurrentProcessingTimeInMs() {
    return this.currentProcessingTimeMs;
  }

  /** Spark's name for `currentWatermarkMs`. */
  getCurrentWatermarkInMs() {
    return this.currentWatermarkMs;
  }
}

/** Which timer fired. Mirrors Spark's `ExpiredTimerInfo`. */
export class ExpiredTimerInfo {
  /** @internal */
  constructor(expiryTimeMs) {
    /** The timestamp the timer was registered for, in milliseconds. */
    this.expiryTimeMs = expiryTimeMs;
  }

  /** Spark's name for `expiryTimeMs`. */
  getExpiryTimeInMs() {
    return this.expiryTimeMs;
  }
}

/**
 * A base class for processors: `handleExpiredTimer` and `close` do nothing. Extending it is
 * optional; any class or object with `init` and `handleInputRows` is a processor. A processor
 * without `handleInitialState` refuses initial state.
 */
export class StatefulProcessor {
  /** Handles one expired timer of `key`; returns the rows to emit. */
  handleExpiredTimer(_key, _timerValues, _expiredTimerInfo) {
    return [];
  }

  /** Releases resources when the instance is torn down. */
  close() {}
}

/**
 * Logging to the host, which records messages as `tracing` events tagged with the processor
 * (and may drop them past a per-call budget). `console.log` and friends go here too.
 */
export const log = {
  trace: (...args) => witLog('trace', formatArgs(args)),
  debug: (...args) => witLog('debug', formatArgs(args)),
  info: (...args) => witLog('info', formatArgs(args)),
  warn: (...args) => witLog('warn', formatArgs(args)),
  error: (...args) => witLog('error', formatArgs(args)),
};
