// Types of the Statebox JavaScript/TypeScript SDK (`@statebox/sdk`).
//
// A processor is the default export of its module: a class (instantiated once per component
// instance, before `init`) or a plain object, with Spark's `StatefulProcessor` methods.
//
// JSON is the wire format: rows are plain objects, grouping keys are arrays of the key
// columns' values, and state values are whatever `JSON.stringify` makes of them. The host
// checks every value against the Spark DDL schema its variable was declared with (`"long"`,
// `"name string, visits int"`, `"array<string>"`, ...). Integers outside
// ±Number.MAX_SAFE_INTEGER (a `long` beyond ±(2^53 - 1)) are `bigint`s, exactly: in rows, keys
// and state values read back; a `bigint` is written as a plain JSON integer.

/**
 * A JSON value: what rows, keys and state values are made of. An integer literal outside
 * ±Number.MAX_SAFE_INTEGER (2^53 - 1) is a `bigint` holding its exact value (safe integers and
 * numbers with a fraction or exponent are `number`s), and a `bigint` is written as a JSON
 * integer. So a Spark `long` is `number | bigint`; `typeof v === 'bigint'` tells which.
 */
export type Json = null | boolean | number | bigint | string | Json[] | { [field: string]: Json };

/**
 * A Spark `long`: a `number` when within ±Number.MAX_SAFE_INTEGER, else an exact `bigint`.
 * Either may be stored or emitted.
 */
export type Long = number | bigint;

/** One row: a JSON object. */
export type Row = { [column: string]: any };

/**
 * The grouping key of a call: the values of the query's key columns, in order, e.g. `["u1"]`
 * (a `long` column beyond ±(2^53 - 1) is a `bigint`).
 */
export type Key = any[];

/** How time advances for a query, fixed when its checkpoint is created. */
export type TimeMode = 'none' | 'processing-time' | 'event-time';

/** The kinds of expected failure of a state or timer operation (see `StateError`). */
export type StateErrorKind =
  | 'invalid-schema'
  | 'schema-mismatch'
  | 'empty-list'
  | 'null-element'
  | 'wrong-phase'
  | 'unsupported-in-time-mode'
  | 'invalid-use'
  | 'limit-exceeded';

/**
 * An expected failure of a state or timer operation, raised by the host: a value that does not
 * match its schema, an empty list given to `put`, state touched outside a handler, timers in
 * time mode `none`, ... Not caught, it fails the batch.
 */
export declare class StateError extends Error {
  readonly kind: StateErrorKind;
}

/** Options of a state variable. */
export interface StateOptions {
  /**
   * Time to live in milliseconds: a value expires this long after the batch that wrote it
   * (measured against the batch timestamp, or the watermark in event-time mode). Needs a time
   * mode other than `none`.
   */
  ttlMs?: number;
}

/**
 * A lazy iterable over state fetched from the host page by page. Valid only during the handler
 * call that created it. Use it in `for ... of`, spread it, or call `toArray()`.
 */
export interface StateIterator<T> extends IterableIterator<T> {
  /** Collects the remaining items into an array. */
  toArray(): T[];
  /**
   * Abandons the iterator and frees the host's iterator at once. `for ... of` calls it when the
   * loop ends early (`break`, `return`, a throw); an iterator left half-read otherwise is freed
   * when the handler call ends.
   */
  return(value?: any): IteratorResult<T, any>;
}

/** A single value per grouping key. Mirrors Spark's `ValueState`. */
export declare class ValueState<T = Json> {
  private constructor();
  /** The variable's name. */
  readonly name: string;
  /** Whether the current key has a value. */
  exists(): boolean;
  /** The current key's value, or `undefined`. */
  get(): T | undefined;
  /** Replaces the current key's value, restarting its TTL. */
  update(value: T): void;
  /** Removes the current key's value. */
  clear(): void;
}

/** An ordered list of values per grouping key. Mirrors Spark's `ListState`. */
export declare class ListState<T = Json> {
  private constructor();
  /** The variable's name. */
  readonly name: string;
  /** Whether the current key's list has at least one element. */
  exists(): boolean;
  /** The current key's list in insertion order, fetched lazily. */
  get(): StateIterator<T>;
  /** Replaces the whole list, restarting every element's TTL. Empty lists are refused. */
  put(values: T[]): void;
  /** Appends one element, with its own TTL. `null` is refused. */
  appendValue(value: T): void;
  /** Appends elements in order, each with its own TTL. Empty lists are refused. */
  appendList(values: T[]): void;
  /** Removes the current key's list. */
  clear(): void;
}

/**
 * A map from user keys to values per grouping key. Mirrors Spark's `MapState`. Iteration is
 * ordered by the user key's canonical encoding.
 */
export declare class MapState<K = Json, V = Json> {
  private constructor();
  /** The variable's name. */
  readonly name: string;
  /** Whether the current key's map has at least one entry. */
  exists(): boolean;
  /** The value stored under `userKey`, or `undefined`. */
  getValue(userKey: K): V | undefined;
  /** Whether `userKey` is present. */
  containsKey(userKey: K): boolean;
  /** Inserts or replaces the entry for `userKey`, restarting that entry's TTL. */
  updateValue(userKey: K, value: V): void;
  /** Removes the entry for `userKey`, if any. */
  removeKey(userKey: K): void;
  /** The current key's entries as `[userKey, value]` pairs, fetched lazily. */
  iterator(): StateIterator<[K, V]>;
  /** The current key's user keys, fetched lazily. */
  keys(): StateIterator<K>;
  /** The current key's values, in user-key order, fetched lazily. */
  values(): StateIterator<V>;
  /** Removes every entry of the current key; other keys are untouched. */
  clear(): void;
}

/**
 * Declares state variables and manages timers. Mirrors Spark's `StatefulProcessorHandle`.
 * Variables are declared in `init` only; keep the state objects (and the handle, for timers)
 * in the processor.
 */
export declare class Handle {
  private constructor();
  /** The query's time mode. */
  readonly timeMode: TimeMode;
  /** Declares a value state variable whose values match `schema` (Spark DDL, e.g. `"long"`). */
  getValueState<T = Json>(name: string, schema: string, options?: StateOptions): ValueState<T>;
  /** Declares a list state variable whose elements match `schema`. */
  getListState<T = Json>(name: string, schema: string, options?: StateOptions): ListState<T>;
  /** Declares a map state variable from user keys matching `userKeySchema` to values matching `valueSchema`. */
  getMapState<K = Json, V = Json>(
    name: string,
    userKeySchema: string,
    valueSchema: string,
    options?: StateOptions,
  ): MapState<K, V>;
  /** Drops the named variable's data for all keys, if it exists. Allowed only in `init`. */
  deleteIfExists(name: string): void;
  /** Registers a timer for the current key at `expiryMs`; registering an existing timer is a no-op. */
  registerTimer(expiryMs: number): void;
  /** Deletes the current key's timer at `expiryMs`; deleting a missing timer is a no-op. */
  deleteTimer(expiryMs: number): void;
  /** The current key's registered timers in milliseconds, ascending. */
  listTimers(): number[];
  /** The query and batch this call runs in (Spark's `getQueryInfo()`). */
  getQueryInfo(): QueryInfo;
}

/** Identifies the query and batch a processor runs in. Mirrors Spark's `QueryInfo`. */
export declare class QueryInfo {
  private constructor();
  /** The query's id: fixed when its checkpoint is created, the same across restarts. */
  readonly queryId: string;
  /** This run's id: new each time the query is started. */
  readonly runId: string;
  /**
   * The id of the batch in progress (0 outside a batch), a `number`: exact up to 2^53 - 1
   * batches (the host's `u64`).
   */
  readonly batchId: number;
  /** Spark's name for `queryId`. */
  getQueryId(): string;
  /** Spark's name for `runId`. */
  getRunId(): string;
  /** Spark's name for `batchId`. */
  getBatchId(): number;
}

/** The times a handler call may consult, identical for every call of a batch and on replay. */
export declare class TimerValues {
  private constructor();
  /** The batch timestamp in ms since the Unix epoch; -1 in time mode `none`. */
  readonly currentProcessingTimeMs: number;
  /** The watermark in ms since the Unix epoch; -1 unless the time mode is `event-time`. */
  readonly currentWatermarkMs: number;
  /** Spark's name for `currentProcessingTimeMs`. */
  getCurrentProcessingTimeInMs(): number;
  /** Spark's name for `currentWatermarkMs`. */
  getCurrentWatermarkInMs(): number;
}

/** Which timer fired. Mirrors Spark's `ExpiredTimerInfo`. */
export declare class ExpiredTimerInfo {
  private constructor();
  /** The timestamp the timer was registered for, in milliseconds. */
  readonly expiryTimeMs: number;
  /** Spark's name for `expiryTimeMs`. */
  getExpiryTimeInMs(): number;
}

/** What a handler may return: rows to emit, as an array, any iterable (a generator), or nothing. */
export type Emitted<O> = Iterable<O> | void | undefined | null;

/** A processor's methods. Only `init` and `handleInputRows` are required. */
export interface Processor<I extends Row = Row, O extends Row = Row, S = Row> {
  /** Declares state variables through `handle`. Called once per instance, before anything else. */
  init(handle: Handle): void | Promise<void>;
  /** Handles all rows of one key in one batch, in arrival order; returns the rows to emit. */
  handleInputRows(key: Key, rows: I[], timerValues: TimerValues): Emitted<O> | Promise<Emitted<O>>;
  /** Handles one expired timer of `key`; returns the rows to emit. The firing timer is still listed. */
  handleExpiredTimer?(
    key: Key,
    timerValues: TimerValues,
    expiredTimerInfo: ExpiredTimerInfo,
  ): Emitted<O> | Promise<Emitted<O>>;
  /** Applies one initial-state row of `key`, in the first batch of a new query only. */
  handleInitialState?(key: Key, initialState: S, timerValues: TimerValues): void | Promise<void>;
  /** Releases resources when the instance is torn down. State cannot be touched here. */
  close?(): void | Promise<void>;
}

/** What the host learns about a processor before any data. Static fields of a processor class. */
export interface ProcessorInfo {
  /** A short name for logs and errors, e.g. `"counter"` (a class defaults to its class name). */
  processorName?: string;
  /** The schema of every emitted row, in Spark DDL, e.g. `"key string, count long"`. */
  outputSchema: string;
  /** The schema input rows must match, if the host should check them before calling the processor. */
  inputSchema?: string;
  /** The output column holding each row's event time (event-time mode only). */
  outputEventTimeColumn?: string;
}

/**
 * A base class for processors: `handleExpiredTimer` and `close` do nothing. Extending it is
 * optional. Declare the processor's info as static fields:
 *
 * ```ts
 * export default class Counter extends StatefulProcessor<Row, { key: string; count: number }> {
 *   static processorName = 'counter';
 *   static outputSchema = 'key string, count long';
 *   ...
 * }
 * ```
 */
export declare abstract class StatefulProcessor<I extends Row = Row, O extends Row = Row, S = Row>
  implements Processor<I, O, S>
{
  abstract init(handle: Handle): void | Promise<void>;
  abstract handleInputRows(key: Key, rows: I[], timerValues: TimerValues): Emitted<O> | Promise<Emitted<O>>;
  handleExpiredTimer(
    key: Key,
    timerValues: TimerValues,
    expiredTimerInfo: ExpiredTimerInfo,
  ): Emitted<O> | Promise<Emitted<O>>;
  close(): void | Promise<void>;
}

/**
 * Parses JSON text as the SDK does: integers outside ±Number.MAX_SAFE_INTEGER become exact
 * `bigint`s, every other number a `number`.
 */
export declare function parseJson(text: string): Json;

/**
 * `JSON.stringify` that writes a `bigint` as a plain JSON integer (where `JSON.stringify`
 * throws a `TypeError`), as the SDK writes rows and state values.
 */
export declare function stringifyJson(value: unknown): string | undefined;

/** Logging to the host (recorded as `tracing` events tagged with the processor). `console.*` goes here too. */
export declare const log: {
  trace(...args: unknown[]): void;
  debug(...args: unknown[]): void;
  info(...args: unknown[]): void;
  warn(...args: unknown[]): void;
  error(...args: unknown[]): void;
};
