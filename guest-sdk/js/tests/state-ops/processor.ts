// A test processor of the SDK (not an example): see the class comment.

import {
  type ExpiredTimerInfo, type Handle, type Key, type ListState, type MapState, StateError,
  StatefulProcessor, type TimerValues, type ValueState,
} from '@statebox/sdk';

interface Op { user: string; op: string; n?: number }
interface Out { user: string; op: string; result: string }

/**
 * Exercises the whole SDK API from TypeScript: one state or timer operation per input row
 * (`op`), emitting what it saw as JSON text in `result`. Driven by `tests/all/js.rs`.
 */
export default class Ops extends StatefulProcessor<Op, Out, { total: number }> {
  static processorName = 'js-ops';
  static outputSchema = 'user string, op string, result string';

  private handle!: Handle;
  private total!: ValueState<number>;
  private items!: ListState<{ n: number }>;
  private seen!: MapState<string, number>;
  private recent!: ValueState<string>;

  init(handle: Handle) {
    this.handle = handle;
    this.total = handle.getValueState('total', 'long');
    this.items = handle.getListState('items', 'n int');
    this.seen = handle.getMapState('seen', 'string', 'long');
    this.recent = handle.getValueState('recent', 'string', { ttlMs: 1000 });
  }

  async handleInputRows([user]: Key, rows: Op[], tv: TimerValues) {
    const out: Out[] = [];
    const emit = (op: string, result: unknown) => out.push({ user, op, result: JSON.stringify(result) });
    for (const { op, n } of rows) {
      switch (op) {
        case 'add':
          this.total.update((this.total.get() ?? 0) + n!);
          this.items.appendValue({ n: n! });
          this.seen.updateValue(`k${n}`, (this.seen.getValue(`k${n}`) ?? 0) + 1);
          this.recent.update(`${n}@${tv.currentProcessingTimeMs}`);
          break;
        case 'many':
          this.items.appendList(Array.from({ length: n! }, (_, i) => ({ n: i })));
          break;
        case 'read':
          emit('read', {
            total: this.total.get() ?? null,
            exists: [this.total.exists(), this.items.exists(), this.seen.exists()],
            items: [...this.items.get()].length,
            first: this.items.get().next().value ?? null,
            seen: this.seen.iterator().toArray(),
            keys: [...this.seen.keys()],
            values: [...this.seen.values()],
            contains: [this.seen.containsKey('k1'), this.seen.containsKey('nope')],
            recent: this.recent.get() ?? null,
          });
          break;
        case 'sum': {
          let sum = 0;
          for (const item of this.items.get()) sum += item.n;
          emit('sum', sum);
          break;
        }
        case 'put':
          this.items.put([{ n: 100 }, { n: 200 }]);
          break;
        case 'bad-value':
          try { this.items.appendValue({ n: 'x' } as any); } catch (e) {
            emit('bad-value', e instanceof StateError ? [e.kind, e.message.includes('items')] : String(e));
          }
          break;
        case 'empty-put':
          try { this.items.put([]); } catch (e) { emit('empty-put', (e as StateError).kind); }
          break;
        case 'timer':
          this.handle.registerTimer(tv.currentProcessingTimeMs + n!);
          emit('timer', this.handle.listTimers());
          break;
        case 'clear':
          this.total.clear(); this.items.clear(); this.seen.removeKey('k1'); this.seen.clear();
          break;
        case 'throw-in-promise':
          await Promise.resolve();
          throw new TypeError('async failure');
      }
    }
    return out;
  }

  *handleExpiredTimer([user]: Key, tv: TimerValues, info: ExpiredTimerInfo) {
    yield { user, op: 'fired', result: JSON.stringify([info.expiryTimeMs, tv.currentProcessingTimeMs, this.handle.listTimers()]) };
  }

  handleInitialState([user]: Key, state: { total: number }, _tv: TimerValues) {
    this.total.update(state.total);
  }
}
