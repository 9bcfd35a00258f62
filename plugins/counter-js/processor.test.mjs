// Unit tests of the counter, run natively (no WebAssembly) through the SDK's test harness:
// `node --test plugins/counter-js/` (after guest-sdk/js/setup.sh).

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { TestHarness } from '../../guest-sdk/js/testing.mjs';

const load = () => TestHarness.load(new URL('.', import.meta.url).pathname, { timeMode: 'none' });
const rows = (n) => Array.from({ length: n }, () => ({}));

test('counts the rows of one batch', async () => {
  const h = await load();
  assert.deepEqual(await h.handleInputRows(['u1'], rows(3)), [{ key: 'u1', count: 3 }]);
  assert.equal(h.valueState('count', ['u1']), 3);
  assert.deepEqual(h.listState('batchCounts', ['u1']), [3]);
  assert.deepEqual(h.mapState('stats', ['u1']), [[{ name: 'calls' }, { count: 1 }]]);
});

test('accumulates over batches, per key', async () => {
  const h = await load();
  await h.handleInputRows(['u1'], rows(3));
  await h.handleInputRows(['u2'], rows(1));
  assert.deepEqual(await h.handleInputRows(['u1'], rows(2)), [{ key: 'u1', count: 2 }]);
  assert.equal(h.valueState('count', ['u1']), 5);
  assert.deepEqual(h.listState('batchCounts', ['u1']), [3, 2]);
  assert.deepEqual(h.mapState('stats', ['u1']), [[{ name: 'calls' }, { count: 2 }]]);
  assert.equal(h.valueState('count', ['u2']), 1);
  assert.equal(h.valueState('count', ['u3']), undefined);
});

test('labels keys of any shape', async () => {
  const h = await load();
  assert.deepEqual(await h.handleInputRows([7], rows(1)), [{ key: '7', count: 1 }]);
  assert.deepEqual(await h.handleInputRows(['u1', 7], rows(2)), [{ key: '["u1",7]', count: 2 }]);
  assert.equal(h.valueState('count', ['u1', 7]), 2);
});

test('labels long keys beyond 2^53 exactly', async () => {
  const h = await load();
  assert.deepEqual(await h.handleInputRows([9223372036854775807n], rows(1)), [{ key: '9223372036854775807', count: 1 }]);
  assert.deepEqual(await h.handleInputRows(['u1', -9223372036854775808n], rows(1)), [
    { key: '["u1",-9223372036854775808]', count: 1 },
  ]);
});

test('counts many keys in one batched call, as the host calls it', async () => {
  const h = await load();
  const out = await h.handleInputBatch([[['u1'], rows(2)], [['u2'], rows(1)], [['u1', 1], rows(3)]]);
  assert.deepEqual(out, [[{ key: 'u1', count: 2 }], [{ key: 'u2', count: 1 }], [{ key: '["u1",1]', count: 3 }]]);
  assert.equal(h.valueState('count', ['u1']), 2);
  assert.equal(h.valueState('count', ['u2']), 1);
});

test('state survives a restart', async () => {
  const h = await load();
  await h.handleInputRows(['u1'], rows(2));
  await h.restart();
  await h.handleInputRows(['u1'], rows(2));
  assert.equal(h.valueState('count', ['u1']), 4);
});

test('refuses initial state', async () => {
  const h = await load();
  await assert.rejects(h.handleInitialState(['u1'], { count: 1 }), /does not accept initial state/);
});
