// Runs a Statebox processor natively in Node, without WebAssembly, so that its logic can be
// unit-tested (with `node --test` or any test runner):
//
//   import { TestHarness } from '../../guest-sdk/js/testing.mjs';
//   const h = await TestHarness.load('plugins/counter-js', { timeMode: 'none' });
//   assert.deepEqual(await h.handleInputRows(['u1'], [{}, {}]), [{ key: 'u1', count: 2 }]);
//   assert.equal(h.valueState('count', ['u1']), 2);
//
// The processor is bundled with the SDK exactly as for a component, but the WIT imports go
// to an in-memory host that follows the Statebox host's rules: per-key state, phases (declare
// in `init`, touch state in handlers), empty lists and null elements refused, TTL against
// the harness's clock, timers fired in ascending (time, key) order, map entries ordered by
// their canonical JSON. It does not check values against their schemas (the real host does).
// Integers outside ±Number.MAX_SAFE_INTEGER are `bigint`s in rows, keys and state, as in a
// component (the harness's JSON is the SDK's).

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

import { bundle, sourceFile, typecheck } from './build.mjs';
import { parse, stringify } from './src/json.js';

process.setSourceMapsEnabled?.(true);

const DISPOSE = Symbol.dispose || Symbol.for('dispose');

/** The in-memory hosts of the live harnesses, by id; the bundles' imports call into them. */
const hosts = (globalThis.__stateboxTestHosts ??= []);
let nextHarness = hosts.length;

/** Bundles already made in this process, by source and type-checking: tests load often. */
const bundles = new Map();

/** What the generated bindings throw for a WIT `state-error`. */
class HostError extends Error {
  constructor(kind, message) {
    super(`${kind}: ${message}`);
    this.payload = { kind, message };
  }
}

/** JSON with object keys sorted: the order of map entries, like the host's canonical encoding. */
function canonical(json) {
  const sort = (v) =>
    Array.isArray(v)
      ? v.map(sort)
      : v !== null && typeof v === 'object'
        ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sort(v[k])]))
        : v;
  return stringify(sort(parse(json)));
}

function checkJson(json, what) {
  try {
    return parse(json);
  } catch (err) {
    throw new HostError('schema-mismatch', `${what} is not JSON: ${err.message}`);
  }
}

/** The in-memory host: state of every variable per key, timers, the call in progress. */
class MemHost {
  constructor(timeMode) {
    this.timeMode = timeMode;
    /** name -> { kind, ttl, data: Map(keyJson -> value | list | Map) } */
    this.vars = new Map();
    /** keyJson -> Set of timer ms */
    this.timers = new Map();
    this.phase = 'idle';
    this.key = null;
    /** The key JSON of each entry of the batched call in progress, or null. */
    this.batchKeys = null;
    this.clock = -1;
    this.generation = 0;
    /** Host iterators not yet dropped, and the most ever open at once. */
    this.openIterators = 0;
    this.maxOpenIterators = 0;
    /** What `getQueryInfo` answers. */
    this.queryInfo = { queryId: '00000000-0000-4000-8000-000000000000', runId: '00000000-0000-4000-8000-000000000001', batchId: 0n };
    const host = this;
    this.handle = {
      getValueState: (name, schema, ttl) => host.declare(name, 'value', ttl),
      getListState: (name, schema, ttl) => host.declare(name, 'list', ttl),
      getMapState: (name, keySchema, valueSchema, ttl) => host.declare(name, 'map', ttl),
      deleteIfExists: (name) => {
        host.inPhase('init', `deleteIfExists(${name})`);
        host.vars.delete(name);
      },
      registerTimer: (ms) => {
        host.timerOp('registerTimer');
        const set = host.timers.get(host.key) ?? new Set();
        set.add(Number(ms));
        host.timers.set(host.key, set);
      },
      deleteTimer: (ms) => {
        host.timerOp('deleteTimer');
        host.timers.get(host.key)?.delete(Number(ms));
      },
      listTimers: () => {
        host.timerOp('listTimers');
        const list = [...(host.timers.get(host.key) ?? [])].sort((a, b) => a - b);
        return BigInt64Array.from(list, BigInt);
      },
      getQueryInfo: () => ({ ...host.queryInfo }),
    };
    this.keys = {
      useKey: (index) => {
        if (host.batchKeys === null || index >= host.batchKeys.length) {
          throw new HostError('invalid-use', `use-key(${index}): no such entry in the call in progress`);
        }
        host.key = host.batchKeys[index];
        // Iterators of the previous key are refused (the SDK frees them before it selects
        // the next key; the host itself only refuses iterators of an earlier call).
        host.generation += 1;
      },
    };
    this.log = {
      log: (level, message) => process.stderr.write(`[${level}] ${message}\n`),
    };
  }

  inPhase(phase, what) {
    if (this.phase !== phase) {
      const where = phase === 'init' ? 'only in init' : 'only in handleInputRows, handleExpiredTimer and handleInitialState';
      throw new HostError('wrong-phase', `${what} is allowed ${where}, not in ${this.phase}`);
    }
    if (phase === 'handler' && this.key === null) {
      throw new HostError('wrong-phase', `${what}: no key is selected; call use-key first in a batched call`);
    }
  }

  timerOp(what) {
    this.inPhase('handler', what);
    if (this.timeMode === 'none') {
      throw new HostError('unsupported-in-time-mode', `${what}: timers need time mode processing-time or event-time`);
    }
  }

  declare(name, kind, ttl) {
    this.inPhase('init', `declaring state \`${name}\``);
    if (ttl !== undefined && this.timeMode === 'none') {
      throw new HostError('unsupported-in-time-mode', `state \`${name}\`: TTL needs time mode processing-time or event-time`);
    }
    let v = this.vars.get(name);
    if (v && v.kind !== kind) {
      throw new HostError('invalid-use', `state \`${name}\` is a ${v.kind} state, not a ${kind} state`);
    }
    if (!v) {
      v = { kind, data: new Map() };
      this.vars.set(name, v);
    }
    v.ttl = ttl === undefined ? undefined : Number(ttl);
    return this.resource(name, v);
  }

  expiry(v) {
    return v.ttl === undefined ? undefined : this.clock + v.ttl;
  }

  live(entry) {
    return entry !== undefined && (entry.expiry === undefined || this.clock < entry.expiry);
  }

  iterator(items, generation) {
    const host = this;
    let index = 0;
    let dropped = false;
    host.openIterators += 1;
    host.maxOpenIterators = Math.max(host.maxOpenIterators, host.openIterators);
    return {
      nextPage(max) {
        if (dropped) throw new Error('an iterator was used after it was dropped (a bug in the SDK)');
        if (generation !== host.generation) {
          throw new HostError('invalid-use', 'an iterator was used after the call that created it');
        }
        const page = items.slice(index, index + max);
        index += page.length;
        return page;
      },
      [DISPOSE]() {
        if (dropped) throw new Error('an iterator was dropped twice (a bug in the SDK)');
        dropped = true;
        host.openIterators -= 1;
      },
    };
  }

  resource(name, v) {
    const host = this;
    const op = (what) => {
      host.inPhase('handler', `${what} of \`${name}\``);
      let data = v.data.get(host.key);
      return data;
    };
    const element = (json) => {
      const value = checkJson(json, `an element of \`${name}\``);
      if (value === null) throw new HostError('null-element', `list \`${name}\`: null elements are not allowed`);
      return { json, expiry: host.expiry(v) };
    };
    const liveList = () => (op('read') ?? []).filter((e) => host.live(e));
    const liveMap = () =>
      [...(op('read') ?? new Map()).entries()]
        .filter(([, e]) => host.live(e))
        .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
        .map(([, e]) => e);
    switch (v.kind) {
      case 'value':
        return {
          exists: () => host.live(op('exists')),
          get: () => {
            const e = op('get');
            return host.live(e) ? e.json : undefined;
          },
          update: (json) => {
            op('update');
            checkJson(json, `the value of \`${name}\``);
            v.data.set(host.key, { json, expiry: host.expiry(v) });
          },
          clear: () => {
            op('clear');
            v.data.delete(host.key);
          },
        };
      case 'list':
        return {
          exists: () => liveList().length > 0,
          get: () => host.iterator(liveList().map((e) => e.json), host.generation),
          put: (list) => {
            op('put');
            if (list.length === 0) throw new HostError('empty-list', `list \`${name}\`: put of an empty list`);
            v.data.set(host.key, list.map(element));
          },
          appendValue: (json) => {
            op('appendValue');
            v.data.set(host.key, [...liveList(), element(json)]);
          },
          appendList: (list) => {
            op('appendList');
            if (list.length === 0) throw new HostError('empty-list', `list \`${name}\`: appendList of an empty list`);
            v.data.set(host.key, [...liveList(), ...list.map(element)]);
          },
          clear: () => {
            op('clear');
            v.data.delete(host.key);
          },
        };
      default: {
        const map = () => {
          let m = op('write');
          if (!m) {
            m = new Map();
            v.data.set(host.key, m);
          }
          return m;
        };
        const keyOf = (json) => {
          checkJson(json, `a key of \`${name}\``);
          return canonical(json);
        };
        return {
          exists: () => liveMap().length > 0,
          getValue: (key) => {
            const e = op('getValue')?.get(keyOf(key));
            return host.live(e) ? e.json : undefined;
          },
          containsKey: (key) => host.live(op('containsKey')?.get(keyOf(key))),
          updateValue: (key, json) => {
            checkJson(json, `a value of \`${name}\``);
            map().set(keyOf(key), { key, json, expiry: host.expiry(v) });
          },
          removeKey: (key) => {
            op('removeKey')?.delete(keyOf(key));
          },
          iterator: () => host.iterator(liveMap().map((e) => ({ key: e.key, value: e.json })), host.generation),
          keys: () => host.iterator(liveMap().map((e) => e.key), host.generation),
          values: () => host.iterator(liveMap().map((e) => e.json), host.generation),
          clear: () => {
            op('clear');
            v.data.delete(host.key);
          },
        };
      }
    }
  }
}

/** The result of a glue call: the value, or the processor's error thrown as an `Error`. */
function unwrap(result, fn) {
  if (result.tag === 'ok') return result.val;
  const err = result.val;
  const message = err.tag === 'bad-input-row' ? `bad input row ${err.val.index}: ${err.val.message}` : err.val;
  const error = new Error(`${fn} failed: ${message}`);
  error.processorError = err;
  throw error;
}

/**
 * A processor loaded natively, with its in-memory state. Keys are arrays (`['u1']`), rows and
 * values plain JSON values, as in the processor itself.
 */
export class TestHarness {
  /**
   * Bundles and loads the processor at `path` (a `.ts`/`.js` file or a plugin folder).
   * `timeMode` is `'none'` (default), `'processing-time'` or `'event-time'`; TypeScript is
   * type-checked unless `typecheck: false`.
   */
  static async load(path, { timeMode = 'none', typecheck: check = true } = {}) {
    const source = sourceFile(path);
    const cacheKey = `${source}\0${check}`;
    let js = bundles.get(cacheKey);
    if (js === undefined) {
      if (check && /\.m?ts$/.test(source)) await typecheck(source);
      js = (await bundle(source, { testHost: true })).js;
      bundles.set(cacheKey, js);
    }
    const harness = new TestHarness(js, timeMode);
    await harness.restart();
    return harness;
  }

  constructor(js, timeMode) {
    // Each harness has its own host, so that several can live in one test process.
    const id = nextHarness++;
    hosts[id] = null;
    this.js = js.replaceAll('globalThis.__stateboxTestHost.', `globalThis.__stateboxTestHosts[${id}].`);
    this.id = id;
    this.host = new MemHost(timeMode);
    this.timeMode = timeMode;
    /** The batch timestamp handlers see (processing-time mode), in ms. */
    this.processingTimeMs = timeMode === 'none' ? -1 : 0;
    /** The watermark handlers see (event-time mode), in ms. */
    this.watermarkMs = timeMode === 'event-time' ? 0 : -1;
    /** The batch id `getQueryInfo()` reports. */
    this.batchId = 0;
    this.loads = 0;
  }

  /**
   * Tears the processor down (`close`) and starts a fresh instance of its module on the same
   * state, as a restarted query would: module-level variables start over.
   */
  async restart() {
    if (this.processor) unwrap(await this.call('idle', null, () => this.processor.close()), 'close');
    const dir = await mkdtemp(join(tmpdir(), 'statebox-test-'));
    const file = join(dir, `processor-${++this.loads}.mjs`);
    try {
      await writeFile(file, this.js);
      hosts[this.id] = this.host;
      // The SDK routes `console` to the host's log in a component; under Node the test's own
      // console is better, so it is put back.
      const console = globalThis.console;
      try {
        ({ processor: this.processor, batchProcessor: this.batchProcessor } = await import(pathToFileURL(file).href));
      } finally {
        globalThis.console = console;
      }
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    /** What the processor declared about itself (`processorName`, `outputSchema`, ...). */
    this.info = this.processor.describe();
    unwrap(await this.call('init', null, () => this.processor.init(this.timeMode)), 'init');
  }

  async call(phase, key, fn, batchKeys = null) {
    const host = this.host;
    host.phase = phase;
    host.key = key === null ? null : stringify(key);
    host.batchKeys = batchKeys;
    host.generation += 1;
    host.clock = this.timeMode === 'event-time' ? this.watermarkMs : this.processingTimeMs;
    host.queryInfo.batchId = BigInt(this.batchId);
    try {
      return await fn();
    } finally {
      host.phase = 'idle';
      host.key = null;
      host.batchKeys = null;
      host.generation += 1;
    }
  }

  timerValues() {
    return { currentProcessingTimeMs: this.processingTimeMs, currentWatermarkMs: this.watermarkMs };
  }

  /** Calls `handleInputRows` for `key` with `rows`; returns the emitted rows. */
  async handleInputRows(key, rows) {
    const out = await this.call('handler', key, () =>
      this.processor.handleInputRows(stringify(key), rows.map((r) => stringify(r)), this.timerValues()),
    );
    return unwrap(out, 'handleInputRows').map((r) => parse(r));
  }

  /**
   * Calls the batched `handleInputBatch` (as the host does, many keys per call) with
   * `[key, rows]` pairs of distinct keys; returns the rows emitted for each entry. A failing
   * entry throws an `Error` whose `index` names it (and `processorError` is the processor's
   * error), as the host names the entry's key.
   */
  async handleInputBatch(groups) {
    const keys = groups.map(([key]) => stringify(key));
    const wire = groups.map(([, rows], i) => ({ key: keys[i], rows: rows.map((r) => stringify(r)) }));
    const out = await this.call('handler', null, () => this.batchProcessor.handleInputBatch(wire, undefined, this.timerValues()), keys);
    if (out.tag === 'err') {
      const { index, error } = out.val;
      const message = error.tag === 'bad-input-row' ? `bad input row ${error.val.index}: ${error.val.message}` : error.val;
      const err = new Error(`handleInputBatch failed for entry ${index} (key ${keys[index]}): ${message}`);
      err.index = index;
      err.processorError = error;
      throw err;
    }
    return out.val.map((rows) => rows.map((r) => parse(r)));
  }

  /** Calls `handleInitialState` for `key` with one initial-state row. */
  async handleInitialState(key, row) {
    const out = await this.call('handler', key, () =>
      this.processor.handleInitialState(stringify(key), stringify(row), this.timerValues()),
    );
    unwrap(out, 'handleInitialState');
  }

  /**
   * Moves time to `ms` (the batch timestamp in processing-time mode, the watermark in
   * event-time mode) and fires every due timer, like the end of a batch: as the host does,
   * through the batched `handleExpiredTimers`, each call taking the earliest due timer of
   * every key that has one (in ascending (time, key) order), until none is due; so a key's
   * timers fire one at a time in ascending order. Returns the rows the timer handlers emitted.
   */
  async advanceTo(ms) {
    if (this.timeMode === 'none') throw new Error('advanceTo: time does not advance in time mode none');
    if (this.timeMode === 'event-time') this.watermarkMs = ms;
    else this.processingTimeMs = ms;
    const rows = [];
    for (;;) {
      const due = [];
      for (const [key, set] of this.host.timers) {
        let first;
        for (const t of set) if (t <= ms && (first === undefined || t < first)) first = t;
        if (first !== undefined) due.push([first, key]);
      }
      if (due.length === 0) break;
      due.sort(([a, ka], [b, kb]) => a - b || (ka < kb ? -1 : ka > kb ? 1 : 0));
      const keys = due.map(([, key]) => key);
      const entries = due.map(([t, key]) => ({ key, expiredTimerInfo: { expiryTimeMs: BigInt(t) } }));
      const out = await this.call('handler', null, () => this.batchProcessor.handleExpiredTimers(entries, this.timerValues()), keys);
      for (const [t, key] of due) this.host.timers.get(key)?.delete(t);
      if (out.tag === 'err') {
        const { index, error } = out.val;
        const err = new Error(`handleExpiredTimers failed for key ${keys[index]}: ${error.val}`);
        err.index = index;
        err.processorError = error;
        throw err;
      }
      for (const emitted of out.val) rows.push(...emitted.map((r) => parse(r)));
    }
    return rows;
  }

  /** The value of value state `name` for `key`, or `undefined`. */
  valueState(name, key) {
    const e = this.data(name, 'value').get(stringify(key));
    return this.host.live(e) ? parse(e.json) : undefined;
  }

  /** The elements of list state `name` for `key`. */
  listState(name, key) {
    const list = this.data(name, 'list').get(stringify(key)) ?? [];
    return list.filter((e) => this.host.live(e)).map((e) => parse(e.json));
  }

  /** The entries of map state `name` for `key`, as `[userKey, value]` pairs in order. */
  mapState(name, key) {
    const map = this.data(name, 'map').get(stringify(key)) ?? new Map();
    return [...map.entries()]
      .filter(([, e]) => this.host.live(e))
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([, e]) => [parse(e.key), parse(e.json)]);
  }

  /** The registered timers of `key`, ascending. */
  timers(key) {
    return [...(this.host.timers.get(stringify(key)) ?? [])].sort((a, b) => a - b);
  }

  data(name, kind) {
    this.host.clock = this.timeMode === 'event-time' ? this.watermarkMs : this.processingTimeMs;
    const v = this.host.vars.get(name);
    if (!v) throw new Error(`the processor declared no state \`${name}\``);
    if (v.kind !== kind) throw new Error(`state \`${name}\` is a ${v.kind} state, not a ${kind} state`);
    return v.data;
  }
}
