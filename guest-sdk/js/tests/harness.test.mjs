// The test harness against the same expectations as the real host: the state-ops processor
// through the steps `tests/all/js.rs` (`the_sdk_api_end_to_end`) runs as a component.
// Run: `node --test guest-sdk/js/tests/`.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { TestHarness } from '../testing.mjs';

const op = (o, n) => (n === undefined ? { user: 'a', op: o } : { user: 'a', op: o, n });
const results = (rows) => rows.map((r) => [r.op, JSON.parse(r.result)]);

test('state, TTL, timers, initial state and errors follow the host', async () => {
  const h = await TestHarness.load(new URL('state-ops', import.meta.url).pathname, { timeMode: 'processing-time' });
  h.processingTimeMs = 1000;
  await h.handleInitialState(['z'], { total: 40 });
  const first = await h.handleInputRows(['a'], [
    op('add', 1), op('add', 2), op('add', 1), op('read'), op('many', 600), op('sum'),
    op('bad-value'), op('empty-put'), op('timer', 500),
  ]);
  assert.deepEqual(results(first), [
    ['read', { total: 4, exists: [true, true, true], items: 3, first: { n: 1 }, seen: [['k1', 2], ['k2', 1]], keys: ['k1', 'k2'], values: [2, 1], contains: [true, false], recent: '1@1000' }],
    ['sum', 179704],
    // No `bad-value` row: the harness does not check schemas (the host refuses `{n: "x"}` for
    // `n int`), so the element is stored and nothing is thrown.
    ['empty-put', 'empty-list'],
    ['timer', [1500]],
  ]);
  assert.equal(h.valueState('total', ['z']), 40);
  assert.deepEqual(h.timers(['a']), [1500]);

  await h.restart();
  h.processingTimeMs = 2000;
  const second = await h.handleInputRows(['a'], [op('read'), op('put'), op('sum'), op('clear'), op('read')]);
  assert.equal(results(second)[0][1].items, 604, '603 and the element the host would refuse');
  assert.equal(results(second)[0][1].recent, null, 'TTL of 1000 ms written at 1000 has expired at 2000');
  assert.deepEqual(results(second).slice(1), [
    ['sum', 300],
    ['read', { total: null, exists: [false, false, false], items: 0, first: null, seen: [], keys: [], values: [], contains: [false, false], recent: null }],
  ]);
  assert.deepEqual(results(await h.advanceTo(2000)), [['fired', [1500, 2000, [1500]]]]);
  assert.deepEqual(h.timers(['a']), []);

  await assert.rejects(h.handleInputRows(['a'], [op('throw-in-promise')]), /TypeError: async failure/);
});

test('TTL is refused in time mode none, as by the host', async () => {
  await assert.rejects(
    TestHarness.load(new URL('state-ops', import.meta.url).pathname, { timeMode: 'none', typecheck: false }),
    /unsupported-in-time-mode: state `recent`: TTL needs time mode/,
  );
});
