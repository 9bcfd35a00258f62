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
