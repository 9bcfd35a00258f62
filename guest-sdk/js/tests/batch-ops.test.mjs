// The batched path (many keys per call), exact longs, getQueryInfo and abandoned iterators,
// in the test harness: the batch-ops processor through the steps `tests/all/js.rs`
// (`batched_calls_exact_longs_and_query_info`) runs as a component.
// Run: `node --test guest-sdk/js/tests/`.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { TestHarness } from '../testing.mjs';
import { parse, stringify } from '../src/json.js';

const BIG = [9007199254740993n, -9223372036854775808n, 9223372036854775807n];
const load = () => TestHarness.load(new URL('batch-ops', import.meta.url).pathname, { timeMode: 'none' });

test('the SDK JSON keeps integers beyond 2^53 exact, and only those are bigints', () => {
  const text = '{"a":9007199254740993,"b":-9223372036854775808,"c":9223372036854775807,"d":9007199254740991,"e":1.5,"f":1e300,"g":"12345678901234567890","h":[12345678901234567.5,-0]}';
  const v = parse(text);
  assert.equal(v.a, 9007199254740993n);
  assert.equal(v.b, -9223372036854775808n);
  assert.equal(v.c, 9223372036854775807n);
  assert.equal(v.d, 9007199254740991);
  assert.equal(v.e, 1.5);
  assert.equal(v.f, 1e300);
  assert.equal(v.g, '12345678901234567890');
  assert.equal(typeof v.h[0], 'number');
  assert.equal(stringify(v), '{"a":9007199254740993,"b":-9223372036854775808,"c":9223372036854775807,"d":9007199254740991,"e":1.5,"f":1e+300,"g":"12345678901234567890","h":[12345678901234568,0]}');
  assert.equal(stringify({ x: 1, y: undefined, z: [undefined, 2n] }), '{"x":1,"z":[null,2]}');
  assert.throws(() => parse('[1,'), SyntaxError);
  assert.throws(() => parse('[12345678901234567890,'), SyntaxError);
  assert.throws(() => parse('{"a":12345678901234567890} x'), SyntaxError);
});

test('longs beyond 2^53 round-trip exactly through keys, input, state and output', async () => {
  const h = await load();
  const key = 9223372036854775807n;
  const stored = await h.handleInputBatch([[[key], BIG.map((n) => ({ k: key, op: 'store', n }))]]);
  assert.deepEqual(stored[0].map((r) => [r.k, r.n, r.result]), BIG.map((n) => [key, n, 'bigint']));
  const [read] = await h.handleInputBatch([[[key], [{ k: key, op: 'read' }]]]);
  const sortedBig = [...BIG].sort((a, b) => (a < b ? -1 : 1));
  assert.deepEqual(read.map((r) => [r.op, r.n, r.result]), [
    ['value', BIG[2], 'bigint'],
    ...BIG.map((n) => ['list', n, 'bigint']),
    // The harness orders map entries by their canonical JSON text.
    ...[...BIG].sort((a, b) => (String(a) < String(b) ? -1 : 1)).flatMap((n) => [['map-key', n, 'bigint'], ['map-value', n, 'bigint']]),
  ]);
  assert.equal(sortedBig.length, 3);
  assert.equal(h.valueState('last', [key]), BIG[2]);
  assert.deepEqual(h.listState('all', [key]), BIG);
  // Safe integers stay numbers.
  const [small] = await h.handleInputBatch([[[5], [{ k: 5, op: 'store', n: 9007199254740991 }]]]);
  assert.deepEqual(small, [{ k: 5, op: 'store', n: 9007199254740991, result: 'number' }]);
});

test('a batched call runs each key with its own state, and a failing key is named', async () => {
  const h = await load();
  const out = await h.handleInputBatch([
    [[1], [{ k: 1, op: 'store', n: 10 }, { k: 1, op: 'store', n: 11 }]],
    [[2], [{ k: 2, op: 'store', n: 20 }]],
    [[3], [{ k: 3, op: 'read' }]],
  ]);
  assert.deepEqual(out.map((rows) => rows.map((r) => r.n)), [[10, 11], [20], [null]]);
  assert.deepEqual(h.listState('all', [1]), [10, 11]);
  assert.deepEqual(h.listState('all', [2]), [20]);
  await assert.rejects(
    h.handleInputBatch([[[1], [{ k: 1, op: 'read' }]], [[-9223372036854775808n], [{ k: 0, op: 'fail' }]], [[2], [{ k: 2, op: 'read' }]]]),
    (err) => {
      assert.equal(err.index, 1);
      assert.match(err.message, /key \[-9223372036854775808\]/);
      assert.match(err.message, /RangeError: cannot handle key -9223372036854775808/);
      return true;
    },
  );
});

test('getQueryInfo reports the query, the run and the batch', async () => {
  const h = await load();
  h.batchId = 7;
  const [[row]] = await h.handleInputBatch([[[1], [{ k: 1, op: 'info' }]]]);
  assert.equal(row.n, 7);
  assert.deepEqual(JSON.parse(row.result), { queryId: h.host.queryInfo.queryId, runId: h.host.queryInfo.runId, batchId: 7, type: 'number' });
});

test('breaking out of an iteration frees its host iterator at once, and iterating again works', async () => {
  const h = await load();
  await h.handleInputBatch([[[1], [{ k: 1, op: 'store', n: 5 }, { k: 1, op: 'many', m: 600 }]]]);
  h.host.maxOpenIterators = 0;
  const [[row]] = await h.handleInputBatch([[[1], [{ k: 1, op: 'break' }]]]);
  assert.equal(row.n, 601);
  const result = JSON.parse(row.result);
  assert.deepEqual(result.firsts, [['5', '0'], ['5', '0'], ['5', '0']]);
  assert.equal(result.mapSize, 1);
  assert.equal(h.host.maxOpenIterators, 1, 'never more than one host iterator open');
  assert.equal(h.host.openIterators, 0);
});

test('an iterator left half-read is freed when the call ends and refused afterwards', async () => {
  const h = await load();
  const [[stashed]] = await h.handleInputBatch([[[1], [{ k: 1, op: 'many', m: 300 }, { k: 1, op: 'stash' }]]]);
  assert.equal(stashed.n, 0);
  assert.equal(h.host.openIterators, 0, 'freed when the call ended');
  const [[used]] = await h.handleInputBatch([[[1], [{ k: 1, op: 'use-stashed' }]]]);
  assert.equal(used.result, 'invalid-use');
});

test('due timers of several keys fire through the batched call, each key in ascending order', async () => {
  const h = await TestHarness.load(new URL('state-ops', import.meta.url).pathname, { timeMode: 'processing-time' });
  h.processingTimeMs = 1000;
  await h.handleInputBatch([
    [['a'], [{ user: 'a', op: 'timer', n: 500 }, { user: 'a', op: 'timer', n: 100 }]],
    [['b'], [{ user: 'b', op: 'timer', n: 300 }]],
  ]);
  const fired = await h.advanceTo(2000);
  assert.deepEqual(fired.map((r) => [r.user, JSON.parse(r.result)]), [
    ['a', [1100, 2000, [1100, 1500]]],
    ['b', [1300, 2000, [1300]]],
    ['a', [1500, 2000, [1500]]],
  ]);
});
