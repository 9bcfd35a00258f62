// Browser tests of the statebox serve web console: Debian's chromium driven by
// playwright-core. Run by tests/all/console.rs, which starts `statebox serve` and passes:
//   STATEBOX_URL, STATEBOX_ADMIN_TOKEN, STATEBOX_COUNTER_WASM, STATEBOX_PROFILE_V1_WASM,
//   STATEBOX_PROFILE_V2_WASM, STATEBOX_PROFILE_V3_WASM, STATEBOX_KAFKA_BROKER (a broker
//   whose topic `clicks` holds STATEBOX_KAFKA_ROWS counter rows keyed by `user`, and whose
//   topic `counts` the test reads back afterwards), and optionally
//   STATEBOX_SCREENSHOTS (a directory: the main pages are saved there as PNGs).
// Every step waits for what a person would see; any failure exits non-zero with the step.

import { chromium } from 'playwright-core';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const URL = env('STATEBOX_URL');
const ADMIN = env('STATEBOX_ADMIN_TOKEN');
const COUNTER = env('STATEBOX_COUNTER_WASM');
const V1 = env('STATEBOX_PROFILE_V1_WASM');
const V2 = env('STATEBOX_PROFILE_V2_WASM');
const V3 = env('STATEBOX_PROFILE_V3_WASM');
const KAFKA = env('STATEBOX_KAFKA_BROKER');
// Another cluster, for a sink that writes elsewhere than its source reads.
const KAFKA2 = env('STATEBOX_KAFKA_BROKER2');
const KAFKA_ROWS = Number(env('STATEBOX_KAFKA_ROWS'));
const SHOTS = process.env.STATEBOX_SCREENSHOTS || null;
const CHROMIUM = process.env.STATEBOX_CHROMIUM || '/usr/bin/chromium';

let step = 'start';
const log = (s) => { step = s; console.log(`# ${s}`); };

/** HTTP statuses a step provokes on purpose; chromium logs each as a console error. */
const expectedStatuses = new Set();
const consoleErrors = [];

async function api(token, method, p, body) {
  const res = await fetch(URL + p, {
    method,
    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

/** Polls `f` until it returns a truthy value. */
async function until(what, f, ms = 30_000) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    try {
      last = await f();
      if (last) return last;
    } catch (e) { last = e; }
    await new Promise((r) => setTimeout(r, 150));
  }
  throw new Error(`timed out waiting for ${what} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`);
}

async function textOf(locator) {
  return (await locator.textContent()) || '';
}

async function waitText(locator, re, what, ms) {
  return until(what || `text ${re}`, async () => {
    const t = await textOf(locator);
    return re.test(t) ? t : false;
  }, ms);
}

async function shot(page, name) {
  if (!SHOTS) return;
  await page.waitForTimeout(300);
  await page.screenshot({ path: path.join(SHOTS, `console-${name}.png`) });
}

async function login(page, token) {
  await page.goto(`${URL}/`);
  await page.locator('input[name="token"]').fill(token);
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.locator('header.top').waitFor();
}

async function logout(page) {
  await page.getByRole('button', { name: 'Log out' }).click();
  await page.locator('input[name="token"]').waitFor();
}

/** Drops a file on the upload zone as a person dragging it from their desktop would. */
async function dropFile(page, file) {
  const b64 = fs.readFileSync(file).toString('base64');
  const dt = await page.evaluateHandle(({ b64, name }) => {
    const bin = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const transfer = new DataTransfer();
    transfer.items.add(new File([bin], name, { type: 'application/wasm' }));
    return transfer;
  }, { b64, name: path.basename(file) });
  await page.dispatchEvent('.dropzone', 'dragover', { dataTransfer: dt });
  await page.dispatchEvent('.dropzone', 'drop', { dataTransfer: dt });
}

async function upload(page, file) {
  await page.locator('#upload-file').setInputFiles(file);
  await waitText(page.locator('.upload-status'), /Uploaded/, `the upload of ${file}`);
}

async function tab(page, name) {
  await page.getByRole('tab', { name }).click();
  await page.locator(`[role="tab"][aria-selected="true"]`, { hasText: name }).waitFor();
}

/** Sends rows from the ingest box; returns the accepted message. */
async function ingest(page, rows) {
  await tab(page, 'Ingest');
  await page.locator('#ingest-rows').fill(JSON.stringify(rows));
  await page.getByRole('button', { name: 'Send rows' }).click();
  return waitText(page.locator('form.ingest'), new RegExp(`Accepted ${rows.length} row`), 'the rows to be accepted');
}

/** The pipeline's processed-row count, as the page's summary shows it. */
async function processed(page) {
  const t = await textOf(page.locator('.stat', { hasText: /^Processed/ }).locator('.stat-value'));
  return Number(t.replace(/,/g, ''));
}

async function main() {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'statebox-chromium-'));
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      `--disk-cache-dir=${path.join(profile, 'cache')}`],
  });
  const context = await browser.newContext({ viewport: { width: 1440, height: 900 }, deviceScaleFactor: 1 });
  const page = await context.newPage();
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(`page error: ${e.message}`));
  page.on('dialog', (d) => d.accept());
  page.setDefaultTimeout(30_000);
  try {
    await run(page);
  } finally {
    await browser.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

async function run(page) {
  log('the console is served at / with a strict content security policy');
  const res = await page.goto(`${URL}/`);
  if (res.status() !== 200) throw new Error(`GET / answered ${res.status()}`);
  const csp = res.headers()['content-security-policy'] || '';
  if (!csp.includes("script-src 'self'")) throw new Error(`no CSP: ${csp}`);
  await page.locator('input[name="token"]').waitFor();
  await shot(page, 'login');

  log('a wrong token is refused with the reason');
  expectedStatuses.add(401);
  await page.locator('input[name="token"]').fill('sbx_wrong');
  await page.getByRole('button', { name: 'Log in' }).click();
  await waitText(page.locator('.login-form'), /not valid[\s\S]*invalid token/);
  if (page.url().includes('sbx_wrong')) throw new Error('the token ended up in the URL');

  log('the admin creates tenant A in the console and reads its token once');
  await login(page, ADMIN);
  await page.getByRole('heading', { name: 'Tenants' }).waitFor();
  await page.getByRole('button', { name: 'New tenant' }).click();
  await page.locator('dialog input[name="name"]').fill('acme');
  await page.locator('dialog').getByRole('button', { name: 'Create' }).click();
  const tokenA = await until('tenant A token', async () => (await page.locator('dialog input.secret').inputValue().catch(() => '')) || false);
  if (!tokenA.startsWith('sbx_')) throw new Error(`not a token: ${tokenA}`);
  await page.keyboard.press('Escape');
  await page.locator('section.tenant', { hasText: 'acme' }).waitFor();
  const stored = await page.evaluate(() => sessionStorage.getItem('statebox.token'));
  if (stored !== ADMIN) throw new Error('the token is not kept in sessionStorage');
  if (page.url().includes(ADMIN)) throw new Error('the admin token ended up in the URL');
  await logout(page);
  // Tenant B, through the API: the console must never show it A's objects.
  const tenantB = await api(ADMIN, 'POST', '/v1/tenants', { name: 'bravo' });

  log('tenant A logs in; empty states say what to do');
  await login(page, tokenA);
  await waitText(page.locator('main'), /No pipelines yet/);
  await page.locator('header nav').getByRole('link', { name: 'Processors' }).click();
  await waitText(page.locator('main'), /No processors yet/);

  log('an invalid upload shows the API\'s validation error');
  expectedStatuses.add(422);
  const junk = path.join(os.tmpdir(), `not-a-processor-${process.pid}.wasm`);
  fs.writeFileSync(junk, 'definitely not wasm');
  await page.locator('#upload-file').setInputFiles(junk);
  await waitText(page.locator('.upload-status'), /was refused[\s\S]*422 invalid_processor[\s\S]*not WebAssembly/);
  fs.rmSync(junk);

  log('a processor is uploaded by drag and drop; the others by the file picker');
  await dropFile(page, COUNTER);
  await waitText(page.locator('.upload-status'), /Uploaded counter/);
  await upload(page, V1);
  await upload(page, V2);
  await upload(page, V3);
  await waitText(page.locator('table'), /counter[\s\S]*key string, count long/);
  await shot(page, 'processors');

  log('processor details list the schemas and state variables');
  await page.getByRole('link', { name: 'counter', exact: true }).first().click();
  await waitText(page.locator('main'), /Output schema[\s\S]*key string, count long/);
  await waitText(page.locator('main'), /count[\s\S]*batchCounts[\s\S]*stats/);

  log('a pipeline is created from the form');
  await page.getByRole('link', { name: 'New pipeline…' }).click();
  await page.locator('dialog input[name="key"]').fill('k');
  await page.locator('dialog input[name="name"]').fill('counts');
  await page.locator('dialog input[name="trigger_interval_ms"]').fill('100');
  await page.locator('dialog').getByRole('button', { name: 'Create and start' }).click();
  await page.waitForURL(/#\/pipelines\/pl_/);
  const counterId = page.url().match(/#\/pipelines\/(pl_[^/]+)/)[1];
  await waitText(page.locator('.page-head h1'), /counts[\s\S]*running/);

  log('rows sent from the ingest box are processed, batch after batch');
  await ingest(page, [{ k: 'x' }]);
  await until('the first batch', async () => (await processed(page)) === 1);
  await ingest(page, [{ k: 'x' }, { k: 'x' }]);
  await until('the second batch', async () => (await processed(page)) === 3);
  const many = Array.from({ length: 30 }, (_, i) => ({ k: `key${String(i).padStart(2, '0')}` }));
  await ingest(page, many);
  await until('the third batch', async () => (await processed(page)) === 33);

  log('the charts plot the batches and update without a reload');
  await tab(page, 'Overview');
  const rate = page.locator('figure[data-chart="Rows per second"]');
  const before = Number(await until('plotted batches', async () => {
    const n = Number(await rate.getAttribute('data-points'));
    return n >= 3 ? n : false;
  }));
  for (const title of ['Batch duration by phase', 'State', 'Timers', 'Expired and late']) {
    await until(`the ${title} chart`, async () => Number(await page.locator(`figure[data-chart="${title}"]`).getAttribute('data-points')) >= 3);
  }
  if (await page.locator('figure[data-chart="Rows per second"] canvas').count() !== 1) throw new Error('no chart canvas');
  const stateLast = JSON.parse(await page.locator('figure[data-chart="State"]').getAttribute('data-last'));
  if (!(stateLast[0] > 0)) throw new Error(`no state rows plotted: ${stateLast}`);
  await shot(page, 'pipeline');
  const url = page.url();
  await ingest(page, [{ k: 'y' }]);
  await tab(page, 'Overview');
  await until('a new point on the chart', async () => Number(await rate.getAttribute('data-points')) > before);
  if (page.url().split('#')[0] !== url.split('#')[0]) throw new Error('the page reloaded');

  log('the progress records are a table');
  await tab(page, 'Progress');
  await until('four progress records', async () => (await page.locator('table.progress tbody tr').count()) >= 4);

  log('the output tail shows the latest rows and pages back');
  await tab(page, 'Output');
  await page.getByLabel('Rows per page').selectOption('20');
  await waitText(page.locator('table.output tbody'), /y1$/, 'the newest row, last');
  await until('20 rows on the latest page', async () => (await page.locator('table.output tbody tr').count()) === 20);
  // 33 rows: x (1), x (2), 30 keys, y. The page before the latest 20 starts at the first.
  await page.getByRole('button', { name: '← Older' }).click();
  await until('the first page', async () => page.getByRole('button', { name: '← Older' }).isDisabled());
  await waitText(page.locator('table.output tbody'), /^x1x2/, 'the first rows');
  if (await page.locator('table.output tbody tr').count() !== 13) throw new Error('the first page should hold 13 rows');
  await page.getByRole('button', { name: 'Latest' }).click();
  await waitText(page.locator('table.output tbody'), /y1$/, 'the latest rows again');

  log('the state browser reads the state at an old batch (time travel)');
  const progress = (await api(tokenA, 'GET', `/v1/pipelines/${counterId}/progress?last=100`)).progress;
  const firstBatch = progress.find((r) => r.input_rows > 0).batch_id;
  await tab(page, 'State');
  await page.locator('#state-var').selectOption('count');
  await waitText(page.locator('table.state-rows'), /key00/);
  await page.locator('#state-batch').fill(String(firstBatch));
  await page.getByRole('button', { name: 'Show', exact: true }).click();
  await waitText(page.locator('[data-batch]'), new RegExp(`batch #${firstBatch}: 1 row`));
  await waitText(page.locator('table.state-rows'), /\{"k":"x"\}\s*1/);
  // Time mode `none` has no timers: the browser does not offer them.
  if (await page.locator('#state-var option[value="__timers"]').count() !== 0) throw new Error('timers offered in time mode none');
  await page.locator('#changes-var').selectOption('count');
  await page.locator('#changes-from').fill(String(firstBatch));
  await page.getByRole('button', { name: 'Show changes' }).click();
  await waitText(page.locator('table.changes'), /update/);
  await waitText(page.locator('main'), /Schema history[\s\S]*long/);
  await page.locator('#state-var').selectOption('count');
  await page.locator('#state-batch').fill(String(firstBatch));
  await page.getByRole('button', { name: 'Show', exact: true }).click();
  await waitText(page.locator('[data-batch]'), /: 1 row/);
  await shot(page, 'state');

  log('SQL over the state shows a table');
  await tab(page, 'SQL');
  await page.locator('#sql-text').fill("SELECT key.k AS k, value FROM read_statestore(stateVarName => 'count') WHERE value > 1 ORDER BY k");
  await page.getByRole('button', { name: 'Run' }).click();
  await waitText(page.locator('table.sql-result'), /k[\s\S]*value[\s\S]*x\s*3/);
  if (await page.locator('table.sql-result tbody tr').count() !== 1) throw new Error('SQL should return one row');
  await shot(page, 'sql');
  log('a bad query shows DataFusion\'s reason');
  expectedStatuses.add(400);
  await page.locator('#sql-text').fill("SELECT * FROM read_statestore(stateVarName => 'nope')");
  await page.keyboard.press('Control+Enter');
  await waitText(page.locator('form.sql'), /The query failed[\s\S]*nope/);

  log('keyboard: arrow keys move between tabs');
  await page.getByRole('tab', { name: 'SQL' }).focus();
  await page.keyboard.press('ArrowRight');
  await page.locator('[role="tab"][aria-selected="true"]', { hasText: 'Output' }).waitFor();

  log('an event-time pipeline charts its watermark gap');
  // The list of processors answers late here: a click before it must still offer them.
  const slowProcessors = async (route) => {
    await new Promise((r) => setTimeout(r, 1500));
    await route.continue();
  };
  await page.route('**/v1/processors', slowProcessors);
  await page.locator('header nav').getByRole('link', { name: 'Pipelines' }).click();
  await page.getByRole('button', { name: 'New pipeline', exact: true }).click();
  await page.locator('dialog input[name="key"]').fill('k');
  await page.unroute('**/v1/processors', slowProcessors);
  const counterProcessor = (await api(tokenA, 'GET', '/v1/processors')).processors.find((p) => p.name === 'counter').id;
  await page.locator('dialog select[name="processor"]').selectOption(counterProcessor);
  await page.locator('dialog input[name="name"]').fill('eventtime-demo');
  await page.locator('dialog select[name="time_mode"]').selectOption('event-time');
  await page.locator('dialog input[name="event_time_column"]').fill('ts');
  await page.locator('dialog input[name="watermark_delay_ms"]').fill('1000');
  // Event time runs a batch every trigger, rows or not: keep a minute of them on the charts.
  await page.locator('dialog input[name="trigger_interval_ms"]').fill('500');
  await page.locator('dialog').getByRole('button', { name: 'Create and start' }).click();
  await page.waitForURL(/#\/pipelines\/pl_/);
  const t0 = Date.now() - 300_000;
  await ingest(page, [{ k: 'a', ts: new Date(t0 + 60_000).toISOString() }]);
  await until('the first event-time batch', async () => (await processed(page)) === 1);
  // The second batch runs with the watermark the first one set (its event time − 1 s);
  // the third row is older than that watermark: late, dropped.
  await ingest(page, [{ k: 'a', ts: new Date(t0 + 120_000).toISOString() }]);
  await until('the second event-time batch', async () => (await processed(page)) === 2);
  await ingest(page, [{ k: 'b', ts: new Date(t0).toISOString() }]);
  await tab(page, 'Overview');
  const gap = page.locator('figure[data-chart="Watermark gap"]');
  await until('the watermark gap', async () => {
    const last = JSON.parse((await gap.getAttribute('data-last')) || '[null]');
    return last[0] > 0;
  });
  await until('the late row on the chart', async () => {
    const max = JSON.parse((await page.locator('figure[data-chart="Expired and late"]').getAttribute('data-max')) || '[null,null]');
    return max[1] === 1;
  });
  await shot(page, 'event-time');
  await tab(page, 'State');
  await page.locator('#state-var').selectOption('__timers');
  await page.getByRole('button', { name: 'Show', exact: true }).click();
  await waitText(page.locator('main'), /Timers at batch #\d+: 0 rows[\s\S]*No timers were registered/);

  log('an incompatible upgrade is refused with the report before anything changes');
  await page.locator('header nav').getByRole('link', { name: 'Pipelines' }).click();
  await page.getByRole('button', { name: 'New pipeline', exact: true }).click();
  const procs = (await api(tokenA, 'GET', '/v1/processors')).processors;
  const idOf = (name) => procs.find((p) => p.name === name).id;
  const v1Id = idOf('user-profile-v1');
  await page.locator('dialog select[name="processor"]').selectOption(v1Id);
  await page.locator('dialog input[name="key"]').fill('user');
  await page.locator('dialog input[name="name"]').fill('profiles');
  await page.locator('dialog input[name="trigger_interval_ms"]').fill('100');
  await page.locator('dialog').getByRole('button', { name: 'Create and start' }).click();
  await page.waitForURL(/#\/pipelines\/pl_/);
  const profilesId = page.url().match(/#\/pipelines\/(pl_[^/]+)/)[1];
  await ingest(page, [{ user: 'a', name: 'Ann', visits: 6 }]);
  await until('the profile batch', async () => (await processed(page)) === 1);
  await tab(page, 'Settings & upgrade');
  await page.locator('#upgrade-processor').selectOption(idOf('user-profile-v3'));
  await page.getByRole('button', { name: 'Check compatibility' }).click();
  await waitText(page.locator('[data-compatible]'), /Refused[\s\S]*incompatible[\s\S]*profile/);
  if (await page.locator('[data-compatible]').getAttribute('data-compatible') !== 'false') throw new Error('v3 should be incompatible');
  if (!(await page.getByRole('button', { name: 'Upgrade', exact: true }).isDisabled())) throw new Error('an incompatible upgrade can be confirmed');
  await shot(page, 'upgrade-refused');
  const still = await api(tokenA, 'GET', `/v1/pipelines/${profilesId}`);
  if (still.processor !== v1Id) throw new Error('the refused upgrade changed the processor');

  log('a compatible upgrade is confirmed after its report');
  await page.locator('#upgrade-processor').selectOption(idOf('user-profile-v2'));
  await page.getByRole('button', { name: 'Check compatibility' }).click();
  await waitText(page.locator('[data-compatible="true"]'), /Compatible/);
  await page.getByRole('button', { name: 'Upgrade', exact: true }).click();
  await waitText(page.locator('.tab-panel'), /Upgraded to/);
  if ((await api(tokenA, 'GET', `/v1/pipelines/${profilesId}`)).processor !== idOf('user-profile-v2')) throw new Error('not upgraded');

  log('the pipelines list shows status at a glance');
  await page.locator('header nav').getByRole('link', { name: 'Pipelines' }).click();
  await waitText(page.locator('table.pipelines'), /profiles[\s\S]*running[\s\S]*eventtime-demo[\s\S]*running[\s\S]*counts[\s\S]*running/);
  await shot(page, 'pipelines');
  await logout(page);

  log('tenant B never sees tenant A\'s objects');
  await login(page, tenantB.token);
  await waitText(page.locator('main'), /No pipelines yet/);
  await page.locator('header nav').getByRole('link', { name: 'Processors' }).click();
  await waitText(page.locator('main'), /No processors yet/);
  expectedStatuses.add(404);
  await page.goto(`${URL}/#/pipelines/${counterId}`);
  await waitText(page.locator('main'), new RegExp(`no pipeline \`${counterId}\``));
  await page.goto(`${URL}/#/processors/${v1Id}`);
  await waitText(page.locator('main'), /no processor/);
  const seen = await page.evaluate(() => document.body.innerText);
  for (const secret of [counterId, profilesId, 'counts', 'profiles', 'eventtime-demo', 'acme']) {
    if (seen.includes(secret) && !seen.includes(`no pipeline \`${secret}\``) && !seen.includes(`no processor \`${secret}\``)) throw new Error(`tenant B sees ${secret}`);
  }
  await logout(page);

  log('the admin sees usage per tenant and grants outbound HTTP');
  await login(page, ADMIN);
  const acme = page.locator('section.tenant', { hasText: 'acme' });
  await waitText(acme, /Pipelines[\s\S]*3 \/ /);
  await waitText(acme, /Refused requests/);
  await acme.locator('tr', { hasText: 'profiles' }).getByRole('button', { name: 'Grant HTTP…' }).click();
  await page.locator('dialog input[name="hosts"]').fill('127.0.0.1:9');
  await page.locator('dialog').getByRole('button', { name: 'Grant' }).click();
  await waitText(acme.locator('tr', { hasText: 'profiles' }), /127\.0\.0\.1:9/);
  const granted = await api(tokenA, 'GET', `/v1/pipelines/${profilesId}`);
  if (!granted.http_hosts.includes('127.0.0.1:9')) throw new Error('the grant was not stored');
  await acme.getByRole('button', { name: 'Issue token' }).click();
  const second = await until('a second token', async () => (await page.locator('dialog input.secret').inputValue().catch(() => '')) || false);
  await page.keyboard.press('Escape');
  await api(second, 'GET', '/v1/tenant');
  await shot(page, 'admin');

  log('the admin grants tenant A the brokers of two Kafka clusters');
  await acme.getByRole('button', { name: 'Kafka brokers…' }).click();
  await page.locator('dialog input[name="brokers"]').fill(`${KAFKA}, ${KAFKA2}`);
  await page.locator('dialog').getByRole('button', { name: 'Grant' }).click();
  await waitText(acme.locator('.kafka-brokers'), new RegExp(KAFKA2.replace(/\./g, '\\.')));
  const grant = (await api(tokenA, 'GET', '/v1/tenant')).kafka_brokers;
  const granted2 = [KAFKA, KAFKA2].sort();
  if (JSON.stringify(grant) !== JSON.stringify(granted2)) throw new Error(`the Kafka grant was not stored: ${JSON.stringify(grant)}`);
  await logout(page);

  log('tenant A creates a pipeline from a Kafka topic to a Kafka topic in the form');
  await login(page, tokenA);
  await page.getByRole('button', { name: 'New pipeline', exact: true }).click();
  await page.locator('dialog select[name="processor"]').selectOption(counterProcessor);
  await page.locator('dialog input[name="key"]').fill('user');
  await page.locator('dialog input[name="name"]').fill('kafka-counts');
  await page.locator('dialog input[name="trigger_interval_ms"]').fill('200');
  if (await page.locator('dialog fieldset.kafka').isVisible()) throw new Error('Kafka fields shown for an HTTP pipeline');
  await page.locator('dialog select[name="source"]').selectOption('kafka');
  // The brokers granted are offered; this pipeline uses the first cluster on both sides.
  if (await page.locator('dialog input[name="kafka_brokers"]').inputValue() !== granted2.join(', ')) throw new Error('the granted brokers are not filled in');
  await page.locator('dialog input[name="kafka_brokers"]').fill(KAFKA);
  await page.locator('dialog input[name="kafka_topics"]').fill('clicks');
  await page.locator('dialog select[name="sink"]').selectOption('kafka');
  if (await page.locator('dialog fieldset.kafka-sink-cluster').isVisible()) throw new Error('a second cluster shown before it was asked for');
  await page.locator('dialog input[name="kafka_topic"]').fill('counts');
  // The counter's rows are {key, count}: the grouping column `user` is not among them.
  await page.locator('dialog input[name="kafka_key"]').fill('key');
  await shot(page, 'kafka-form');
  await page.locator('dialog').getByRole('button', { name: 'Create and start' }).click();
  await page.waitForURL(/#\/pipelines\/pl_/);
  const kafkaId = page.url().match(/#\/pipelines\/(pl_[^/]+)/)[1];
  const created = await api(tokenA, 'GET', `/v1/pipelines/${kafkaId}`);
  const source = created.source && created.source.kafka;
  const sink = created.sink && created.sink.kafka;
  if (!source || JSON.stringify(source.topics) !== '["clicks"]' || source.starting_offsets !== 'earliest') throw new Error(`not the Kafka source asked for: ${JSON.stringify(created.source)}`);
  if (!sink || sink.topic !== 'counts' || JSON.stringify(sink.key) !== '["key"]' || sink.delivery !== 'exactly-once') throw new Error(`not the Kafka sink asked for: ${JSON.stringify(created.sink)}`);
  const one = (brokers, want) => JSON.stringify(brokers) === JSON.stringify([want]);
  if (!one(source.brokers, KAFKA) || !one(sink.brokers, KAFKA)) throw new Error(`not the cluster asked for: ${JSON.stringify(created)}`);
  await until('every record of the topic processed', async () => (await processed(page)) === KAFKA_ROWS, 60_000)
    .catch(async (e) => {
      const p = await api(tokenA, 'GET', `/v1/pipelines/${kafkaId}`);
      throw new Error(`${e.message}; the pipeline: ${JSON.stringify(p.status)} ${p.failure || ''}`);
    });
  await tab(page, 'Ingest');
  await waitText(page.locator('main'), /reads the Kafka topic clicks on/);
  await tab(page, 'Output');
  await waitText(page.locator('main'), /writes its output to the Kafka topic counts on/);

  log('tenant A rotates the Kafka source\'s credentials in the settings tab');
  await tab(page, 'Settings & upgrade');
  const sourceForm = page.locator('form.kafka-options.source');
  await sourceForm.locator('input[name="source-kafka-sasl.username"]').fill('rotated');
  await sourceForm.locator('input[name="source-kafka-sasl.password"]').fill('p4ss-1');
  await sourceForm.getByRole('button', { name: 'Save and restart' }).click();
  await waitText(sourceForm, /Saved the source's options; the pipeline restarted with them/);
  const rotatedOnce = (await api(tokenA, 'GET', `/v1/pipelines/${kafkaId}`)).source.kafka.options || {};
  if (rotatedOnce['sasl.username'] !== 'rotated' || rotatedOnce['sasl.password'] !== '<redacted>') throw new Error(`the rotated options were not stored: ${JSON.stringify(rotatedOnce)}`);
  // An empty password field keeps the stored password.
  if (await sourceForm.locator('input[name="source-kafka-sasl.password"]').getAttribute('placeholder') !== 'unchanged') throw new Error('the password field does not say it keeps the stored one');
  await sourceForm.locator('input[name="source-kafka-sasl.username"]').fill('rotated-again');
  await sourceForm.getByRole('button', { name: 'Save and restart' }).click();
  await waitText(sourceForm, /Saved the source's options/);
  await until('the second rotation stored', async () => {
    const o = (await api(tokenA, 'GET', `/v1/pipelines/${kafkaId}`)).source.kafka.options || {};
    return o['sasl.username'] === 'rotated-again' && o['sasl.password'] === '<redacted>';
  });
  await shot(page, 'kafka-credentials');
  await until('the pipeline running again after the rotations', async () => {
    const p = await api(tokenA, 'GET', `/v1/pipelines/${kafkaId}`);
    return p.status && p.status.state === 'running';
  }, 30_000);

  log('tenant A creates a pipeline reading one Kafka cluster and writing to another');
  await page.goto(`${URL}/#/pipelines`);
  await page.getByRole('button', { name: 'New pipeline', exact: true }).click();
  await page.locator('dialog select[name="processor"]').selectOption(counterProcessor);
  await page.locator('dialog input[name="key"]').fill('user');
  await page.locator('dialog input[name="name"]').fill('kafka-elsewhere');
  await page.locator('dialog input[name="trigger_interval_ms"]').fill('200');
  await page.locator('dialog select[name="source"]').selectOption('kafka');
  await page.locator('dialog input[name="kafka_brokers"]').fill(KAFKA);
  await page.locator('dialog input[name="kafka_topics"]').fill('clicks');
  await page.locator('dialog select[name="sink"]').selectOption('kafka');
  await page.locator('dialog input[name="kafka_topic"]').fill('counts');
  await page.locator('dialog input[name="kafka_key"]').fill('key');
  await page.locator('dialog input[name="sink_other_cluster"]').check();
  await page.locator('dialog fieldset.kafka-sink-cluster').waitFor({ state: 'visible' });
  await page.locator('dialog input[name="sink_kafka_brokers"]').fill(KAFKA2);
  await page.locator('dialog').getByRole('button', { name: 'Create and start' }).click();
  await page.waitForURL((u) => /#\/pipelines\/pl_/.test(u.hash) && !u.hash.includes(kafkaId));
  const elsewhereId = page.url().match(/#\/pipelines\/(pl_[^/]+)/)[1];
  const elsewhere = await api(tokenA, 'GET', `/v1/pipelines/${elsewhereId}`);
  if (!one(elsewhere.source.kafka.brokers, KAFKA) || !one(elsewhere.sink.kafka.brokers, KAFKA2)) throw new Error(`not the clusters asked for: ${JSON.stringify(elsewhere)}`);
  await until('every record of the topic processed by the second pipeline', async () => (await processed(page)) === KAFKA_ROWS, 60_000)
    .catch(async (e) => {
      const p = await api(tokenA, 'GET', `/v1/pipelines/${elsewhereId}`);
      throw new Error(`${e.message}; the pipeline: ${JSON.stringify(p.status)} ${p.failure || ''}`);
    });
}

main().then(() => {
  const unexpected = consoleErrors.filter((m) => {
    const s = /Failed to load resource: the server responded with a status of (\d+)/.exec(m);
    return !(s && expectedStatuses.has(Number(s[1])));
  });
  if (unexpected.length) {
    console.error(`FAILED: the browser console had errors:\n${unexpected.join('\n')}`);
    process.exit(1);
  }
  console.log(`ok: every step passed (${consoleErrors.length} expected error responses logged by the browser)`);
}, (e) => {
  console.error(`FAILED at step "${step}": ${e.stack || e}`);
  if (consoleErrors.length) console.error(`browser console errors:\n${consoleErrors.join('\n')}`);
  process.exit(1);
});
