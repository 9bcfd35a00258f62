// A test processor of the SDK (not an example): see the class comment.

import {
  type Handle, type Key, type ListState, type Long, type MapState, StateError, StatefulProcessor, type TimerValues,
  type ValueState,
} from '@statebox/sdk';

interface Op { k: Long; op: string; n?: Long; m?: number }
interface Out { k: Long; op: string; n: Long | null; result: string }

/** The host's handle number of a state iterator (a white-box peek at the generated bindings). */
function rawHandle(iterator: unknown): unknown {
  const source = (iterator as { source?: object }).source;
  if (!source) return null;
  const symbol = Object.getOwnPropertySymbols(source).find((s) => s.description === 'handle');
  return symbol === undefined ? null : (source as Record<symbol, unknown>)[symbol];
}

/**
 * What the batched (many keys per call) path and exact longs need, driven by `tests/all/js.rs`
 * and `tests/batch-ops.test.mjs`. The key is a `long` column `k`; one operation per row:
 * - `store n`: `n` into a value, a list and a map (as key and value); emits `n` back and its
 *   JS type (`bigint` beyond ±(2^53 - 1)).
 * - `read`: emits every long stored for the key: the value, the list, the map's keys and values.
 * - `info`: emits `getQueryInfo()`.
 * - `fail`: throws (the error names the key).
 * - `many m`: appends `m` small elements to the list.
 * - `break`: abandons three iterations of the list after two elements, then reads it whole
 *   (and the map): the abandoned host iterators are freed at once, so each new one gets the
 *   handle number the previous one had.
 * - `stash`: keeps a half-read iterator of the list; `use-stashed` (a later call) uses it,
 *   which throws `invalid-use`.
 */
export default class BatchOps extends StatefulProcessor<Op, Out> {
  static processorName = 'js-batch-ops';
  static outputSchema = 'k long, op string, n long, result string';

  private handle!: Handle;
  private last!: ValueState<Long>;
  private all!: ListState<Long>;
  private byN!: MapState<Long, Long>;
  private stashed?: Iterator<Long>;

  init(handle: Handle) {
    this.handle = handle;
    this.last = handle.getValueState('last', 'long');
    this.all = handle.getListState('all', 'long');
    this.byN = handle.getMapState('byN', 'long', 'long');
  }

  *handleInputRows([k]: Key, rows: Op[], _tv: TimerValues): Generator<Out> {
    for (const { op, n, m } of rows) {
      switch (op) {
        case 'store':
          this.last.update(n!);
          this.all.appendValue(n!);
          this.byN.updateValue(n!, n!);
          yield { k, op, n: n!, result: typeof n };
          break;
        case 'read': {
          const last = this.last.get();
          yield { k, op: 'value', n: last ?? null, result: typeof last };
          for (const v of this.all.get()) yield { k, op: 'list', n: v, result: typeof v };
          for (const [key, value] of this.byN.iterator()) {
            yield { k, op: 'map-key', n: key, result: typeof key };
            yield { k, op: 'map-value', n: value, result: typeof value };
          }
          break;
        }
        case 'info': {
          const info = this.handle.getQueryInfo();
          yield {
            k, op, n: info.batchId,
            result: JSON.stringify({ queryId: info.queryId, runId: info.runId, batchId: info.getBatchId(), type: typeof info.batchId }),
          };
          break;
        }
        case 'fail':
          throw new RangeError(`cannot handle key ${k}`);
        case 'many':
          this.all.appendList(Array.from({ length: m! }, (_, i) => i));
          break;
        case 'stash': {
          const it = this.all.get();
          yield { k, op, n: it.next().value ?? null, result: String(rawHandle(it)) };
          this.stashed = it;
          break;
        }
        case 'use-stashed': {
          let result: string;
          try {
            result = `next: ${JSON.stringify(this.stashed!.next())}`;
          } catch (e) {
            result = e instanceof StateError ? e.kind : String(e);
          }
          yield { k, op, n: null, result };
          break;
        }
        case 'break': {
          const handles: unknown[] = [];
          const firsts: Long[][] = [];
          for (let round = 0; round < 3; round++) {
            const it = this.all.get();
            handles.push(rawHandle(it));
            const seen: Long[] = [];
            for (const v of it) {
              seen.push(v);
              if (seen.length === 2) break;
            }
            firsts.push(seen);
          }
          // A half-read map iteration, abandoned by a throw.
          try {
            for (const _ of this.byN.keys()) throw new Error('stop');
          } catch {}
          let count = 0;
          for (const _ of this.all.get()) count++;
          const after = this.all.get();
          handles.push(rawHandle(after));
          after.return();
          yield {
            k, op, n: count,
            result: JSON.stringify({
              firsts: firsts.map((f) => f.map(String)),
              mapSize: this.byN.keys().toArray().length,
              sameHandle: handles.every((h) => h === handles[0]),
              handles: handles.map(String),
            }),
          };
          break;
        }
      }
    }
  }
}
