// Counts rows per grouping key: Spark's `SimpleCounterProcessor` example, in TypeScript. The
// JavaScript twin of `plugins/counter` (Rust): same state variables and schemas, same output,
// so either can continue the other's checkpoint.
//
// Input rows may be any JSON objects; the processor only counts them. Per key it keeps:
//
// | variable      | kind  | schema                                | holds                                 |
// |---------------|-------|---------------------------------------|---------------------------------------|
// | `count`       | value | `long`                                | rows seen for the key, over all batches |
// | `batchCounts` | list  | `long`                                | rows of each call, one element per call |
// | `stats`       | map   | key `name string`, value `count long` | `{"name":"calls"}` → calls for the key |
//
// and emits one row per call, `{"key": ..., "count": <rows of the key in this call>}`.

import {
  type Handle,
  type Key,
  type ListState,
  type MapState,
  type Row,
  StatefulProcessor,
  stringifyJson,
  type TimerValues,
  type ValueState,
} from '@statebox/sdk';

/** The row emitted per call. */
interface KeyCount {
  /** The key's label (see `keyLabel`). */
  key: string;
  /** Rows of this key in this call. */
  count: number;
}

/** A user key of the `stats` map; schema `name string`. */
interface StatName {
  name: string;
}

/** A value of the `stats` map; schema `count long`. */
interface StatCount {
  count: number;
}

/** The `stats` entry counting calls. */
const CALLS: StatName = { name: 'calls' };

/**
 * The label of a key in the output: a single string column as is, any other single column as
 * its JSON text, several columns as the key's JSON array text. (`stringifyJson` writes a `long`
 * beyond 2^53, a `bigint`, exactly, where `JSON.stringify` would throw.)
 */
function keyLabel(key: Key): string {
  if (key.length === 1) {
    return typeof key[0] === 'string' ? key[0] : stringifyJson(key[0])!;
  }
  return stringifyJson(key)!;
}

export default class Counter extends StatefulProcessor<Row, KeyCount> {
  static processorName = 'counter';
  static outputSchema = 'key string, count long';

  private count!: ValueState<number>;
  private batchCounts!: ListState<number>;
  private stats!: MapState<StatName, StatCount>;

  init(handle: Handle): void {
    this.count = handle.getValueState('count', 'long');
    this.batchCounts = handle.getListState('batchCounts', 'long');
    this.stats = handle.getMapState('stats', 'name string', 'count long');
  }

  *handleInputRows(key: Key, rows: Row[], _timerValues: TimerValues): Generator<KeyCount> {
    const batch = rows.length;
    this.count.update((this.count.get() ?? 0) + batch);
    this.batchCounts.appendValue(batch);
    const calls = (this.stats.getValue(CALLS)?.count ?? 0) + 1;
    this.stats.updateValue(CALLS, { count: calls });
    yield { key: keyLabel(key), count: batch };
  }
}
