// The glue between a processor and the component's exports. `build.mjs` generates an entry
// module that imports the user's processor and exports the two objects
// `exportProcessor(userDefault)` returns: `processor` and `batchProcessor`, whose camelCase
// functions componentize-js binds to the WIT interfaces `statebox:processor/processor@0.1.0`
// (describe, init, initial state, close; single-key calls) and `batch-processor` (input rows
// and expired timers of many keys per call, the throughput path).
//
// Everything here turns JS conventions into the WIT's: JSON text in and out (with exact
// 64-bit integers, `json.js`), `s64` as BigInt, and every exception into a `processor-error`
// carrying the JS error and its stack (mapped back to the user's source file and line), so a
// throw fails the batch with a readable reason instead of trapping the instance. In a batched
// call the error also names the entry (`batch-error`).

import { describeError } from './errors.js';
import { ExpiredTimerInfo, Handle, TimerValues, endCall, log } from './index.js';
import { parse, stringify } from './json.js';
import { useKey } from 'statebox:processor/keys@0.1.0';

/** Set once the host has called in: imports cannot be called while the build snapshots the module. */
let live = false;

/**
 * Routes `console.*` to the host's log (the host keeps no guest stdout). While the build
 * evaluates the module, messages go to the build's own console.
 */
function routeConsole() {
  const original = globalThis.console;
  const levels = { trace: 'trace', debug: 'debug', log: 'info', info: 'info', warn: 'warn', error: 'error' };
  const routed = Object.create(original ?? null);
  for (const [method, level] of Object.entries(levels)) {
    routed[method] = (...args) => {
      if (live) {
        log[level](...args);
      } else if (original && typeof original[method] === 'function') {
        original[method](...args);
      }
    };
  }
  globalThis.console = routed;
}

/** What the host needs to know before any data, read from the processor's definition. */
function readInfo(definition, isClass) {
  const name = definition.processorName ?? (isClass ? definition.name : undefined);
  if (typeof name !== 'string' || name === '') {
    throw new TypeError(
      'the processor needs a name: set `static processorName = "my-processor"` on the class ' +
        '(or `processorName` on the object)',
    );
  }
  const outputSchema = definition.outputSchema;
  if (typeof outputSchema !== 'string' || outputSchema.trim() === '') {
    throw new TypeError(
      `processor \`${name}\` must declare its output schema in Spark DDL: ` +
        '`static outputSchema = "key string, count long"` on the class (or `outputSchema` on the object)',
    );
  }
  for (const field of ['inputSchema', 'outputEventTimeColumn']) {
    const value = definition[field];
    if (value !== undefined && value !== null && typeof value !== 'string') {
      throw new TypeError(`processor \`${name}\`: \`${field}\` must be a string, got ${typeof value}`);
    }
  }
  return {
    name,
    outputSchema,
    inputSchema: definition.inputSchema ?? undefined,
    outputEventTimeColumn: definition.outputEventTimeColumn ?? undefined,
  };
}

function failed(message) {
  return { tag: 'err', val: { tag: 'failed', val: message } };
}

const OK = { tag: 'ok', val: undefined };

function isThenable(value) {
  return value !== null && (typeof value === 'object' || typeof value === 'function') && typeof value.then === 'function';
}

/**
 * Runs `call`, then `finish` on its result (awaiting it first if it is a promise); any throw
 * or rejection becomes a `failed` processor error with the JS error and its stack (the host
 * adds the processor, the function and the key).
 */
function run(call, finish) {
  const fail = (err) => {
    endCall();
    return failed(describeError(err));
  };
  try {
    const value = call();
    if (isThenable(value)) {
      return value.then((v) => {
        try {
          const result = finish(v);
          endCall();
          return result;
        } catch (err) {
          return fail(err);
        }
      }, fail);
    }
    const result = finish(value);
    endCall();
    return result;
  } catch (err) {
    return fail(err);
  }
}

/** The JSON text of every row a handler returned: an array, any iterable, or nothing. */
function encodeRows(name, returned) {
  if (returned === undefined || returned === null) return [];
  if (typeof returned[Symbol.iterator] !== 'function' || typeof returned === 'string') {
    throw new TypeError(
      `processor \`${name}\` returned ${typeof returned} from a handler; return an array or ` +
        'iterable of row objects (or use a generator and `yield` rows)',
    );
  }
  const out = [];
  for (const row of returned) {
    if (row === null || typeof row !== 'object' || Array.isArray(row)) {
      throw new TypeError(
        `output row ${out.length} is not an object: ${stringify(row) ?? String(row)}`,
      );
    }
    out.push(stringify(row));
  }
  return out;
}

/**
 * Parses a call's input rows, or returns the `bad-input-row` error naming the first row that
 * is not JSON. One `JSON.parse` of the joined rows is much cheaper than one per row in the
 * engine's interpreter; rows are only parsed one by one to find a bad one.
 */
function parseRows(rows) {
  if (rows.length === 0) return [];
  try {
    const parsed = parse(`[${rows.join(',')}]`);
    if (parsed.length === rows.length) return parsed;
  } catch {
    // Find the row below.
  }
  const parsed = new Array(rows.length);
  for (let i = 0; i < rows.length; i++) {
    try {
      parsed[i] = parse(rows[i]);
    } catch (err) {
      return { tag: 'err', val: { tag: 'bad-input-row', val: { index: i, message: err.message } } };
    }
  }
  return parsed;
}

/** The keys of a batched call's entries, parsed at once (one `JSON.parse` for the call). */
function parseKeys(entries) {
  const keys = new Array(entries.length);
  for (let i = 0; i < entries.length; i++) keys[i] = entries[i].key;
  return parse(`[${keys.join(',')}]`);
}

/** A failed entry of a batched call. */
function batchError(index, error) {
  return { tag: 'err', val: { index, error } };
}

/** Selects entry `index` of the batched call in progress as the current key. */
function selectKey(index) {
  try {
    useKey(index);
  } catch (err) {
    const payload = err?.payload;
    const reason = payload ? `${payload.kind}: ${payload.message}` : describeError(err);
    throw new Error(`the host refused to select entry ${index} of the batched call: ${reason}`);
  }
}

/**
 * Runs a batched call's entries in order: for each, `start(i)` selects its key and calls the
 * handler, and `finish(returned)` encodes what it returned (a generator runs here), both
 * while the entry's key is selected. A handler that returns a promise is awaited before the
 * next entry starts, so each key's state operations see only that key. A throw (or a `start`
 * that returns a `processor-error` value: a bad input row) fails the call naming the entry.
 */
function runBatch(count, start, finish) {
  return continueBatch(new Array(count), 0, start, finish);
}

/** Runs entries `i` and on; once a handler returns a promise, the rest runs after it. */
function continueBatch(out, i, start, finish) {
  for (; i < out.length; i++) {
    try {
      const returned = start(i);
      if (isThenable(returned)) return settleEntry(out, i, returned, start, finish);
      if (returned instanceof EntryError) {
        endCall();
        return batchError(i, returned.error);
      }
      out[i] = finish(returned);
      endCall();
    } catch (err) {
      endCall();
      return batchError(i, { tag: 'failed', val: describeError(err) });
    }
  }
  return { tag: 'ok', val: out };
}

/** Finishes entry `i` once its handler's promise settles, then runs the next entries. */
async function settleEntry(out, i, pending, start, finish) {
  try {
    out[i] = finish(await pending);
    endCall();
  } catch (err) {
    endCall();
    return batchError(i, { tag: 'failed', val: describeError(err) });
  }
  return continueBatch(out, i + 1, start, finish);
}

/** A `processor-error` of one entry that is not a throw (a bad input row). */
class EntryError {
  constructor(error) {
    this.error = error;
  }
}

function timerValues(tv) {
  return new TimerValues(Number(tv.currentProcessingTimeMs), Number(tv.currentWatermarkMs));
}

/**
 * Adapts a processor (a class, instantiated once per component instance in `init`, or a plain
 * object) to the WIT `processor` interface. Throws at build time when the definition is not a
 * processor.
 */
export function exportProcessor(definition) {
  routeConsole();
  if (definition === undefined || definition === null) {
    throw new TypeError(
      'the processor module has no default export: `export default class MyProcessor { ... }`',
    );
  }
  const isClass = typeof definition === 'function';
  const info = readInfo(definition, isClass);
  const prototype = isClass ? definition.prototype : definition;
  for (const method of ['init', 'handleInputRows']) {
    if (typeof prototype[method] !== 'function') {
      throw new TypeError(`processor \`${info.name}\` has no \`${method}\` method`);
    }
  }

  /** The processor instance, created by `init`. */
  let instance = null;

  function processorFor(fn) {
    if (instance === null) throw new Error(`processor \`${info.name}\` was called (${fn}) before init`);
    return instance;
  }

  const encode = (returned) => encodeRows(info.name, returned);

  const batchProcessor = {
    // Rows always come as objects: JSON.parse of an object is as fast as of an array here.
    positionalRows() {
      return false;
    },
    handleInputBatch(groups, _columns, tv) {
      let p;
      let keys;
      try {
        p = processorFor('handleInputBatch');
        keys = parseKeys(groups);
      } catch (err) {
        return batchError(0, { tag: 'failed', val: describeError(err) });
      }
      const timers = timerValues(tv);
      return runBatch(
        groups.length,
        (i) => {
          const rows = parseRows(groups[i].rows);
          if (!Array.isArray(rows)) return new EntryError(rows.val);
          selectKey(i);
          return p.handleInputRows(keys[i], rows, timers);
        },
        encode,
      );
    },

    handleExpiredTimers(entries, tv) {
      let p;
      let keys;
      try {
        p = processorFor('handleExpiredTimers');
        if (typeof p.handleExpiredTimer !== 'function') {
          return { tag: 'ok', val: Array.from(entries, () => []) };
        }
        keys = parseKeys(entries);
      } catch (err) {
        return batchError(0, { tag: 'failed', val: describeError(err) });
      }
      const timers = timerValues(tv);
      return runBatch(
        entries.length,
        (i) => {
          selectKey(i);
          const expired = new ExpiredTimerInfo(Number(entries[i].expiredTimerInfo.expiryTimeMs));
          return p.handleExpiredTimer(keys[i], timers, expired);
        },
        encode,
      );
    },
  };

  const processor = {
    describe() {
      return info;
    },

    init(timeMode) {
      live = true;
      return run(
        () => {
          const created = isClass ? new definition() : definition;
          instance = null;
          const done = created.init(new Handle(timeMode));
          return isThenable(done) ? done.then(() => created) : created;
        },
        (created) => {
          instance = created;
          return OK;
        },
      );
    },

    handleInputRows(key, rows, tv) {
      const parsed = parseRows(rows);
      if (!Array.isArray(parsed)) return parsed;
      return run(
        () => processorFor('handleInputRows').handleInputRows(parse(key), parsed, timerValues(tv)),
        (returned) => ({ tag: 'ok', val: encode(returned) }),
      );
    },

    handleExpiredTimer(key, tv, expired) {
      return run(
        () => {
          const p = processorFor('handleExpiredTimer');
          if (typeof p.handleExpiredTimer !== 'function') return [];
          return p.handleExpiredTimer(
            parse(key),
            timerValues(tv),
            new ExpiredTimerInfo(Number(expired.expiryTimeMs)),
          );
        },
        (returned) => ({ tag: 'ok', val: encode(returned) }),
      );
    },

    handleInitialState(key, initialState, tv) {
      return run(
        () => {
          const p = processorFor('handleInitialState');
          if (typeof p.handleInitialState !== 'function') {
            throw new Error(
              `processor \`${info.name}\` does not accept initial state (it has no handleInitialState method)`,
            );
          }
          return p.handleInitialState(parse(key), parse(initialState), timerValues(tv));
        },
        () => OK,
      );
    },

    close() {
      const p = instance;
      instance = null;
      if (p === null || typeof p.close !== 'function') return OK;
      return run(
        () => p.close(),
        () => OK,
      );
    },
  };

  return { processor, batchProcessor };
}
