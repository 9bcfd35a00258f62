// One pipeline, live: status and actions, charts over recent batches, the progress table,
// failures, the state browser, SQL, the output tail, the ingest box and upgrades. It polls
// the pipeline and its progress records every second and a half.

import { get, post, put, del, seg, query } from '../api.js';
import {
  h, fill, field, table, empty, errorBox, loading, notify, badge, tabs, columnsOf,
  fmtInt, fmtNum, fmtMs, fmtBytes, fmtAgo, fmtTime, parseRows,
} from '../ui.js';
import { every, go, onLeave } from '../app.js';
import { pipelineCharts } from '../charts.js';
import { glance } from './pipelines.js';
import { stateTab, sqlTab } from './state.js';

const TABS = [
  ['overview', 'Overview'],
  ['progress', 'Progress'],
  ['state', 'State'],
  ['sql', 'SQL'],
  ['output', 'Output'],
  ['ingest', 'Ingest'],
  ['settings', 'Settings & upgrade'],
];

/** How many batches the charts and the progress table show. */
const HISTORY = 120;

export async function pipelineView(main, id, tab) {
  fill(main, loading());
  const base = `/v1/pipelines/${seg(id)}`;
  let p = await get(base);
  const processors = (await get('/v1/processors')).processors;
  let current = TABS.some(([t]) => t === tab) ? tab : 'overview';

  const head = h('div', { class: 'page-head' });
  const summary = h('div', { class: 'summary' });
  const failure = h('div', {});
  const panel = h('div', { class: 'tab-panel', role: 'tabpanel', tabindex: '0' });
  const tabBar = h('div', {});
  fill(main, head, failure, summary, tabBar, panel);

  // Live data shared by the tabs.
  const live = { pipeline: p, progress: [], listeners: new Set() };
  const charts = pipelineCharts(p.time_mode === 'event-time');
  const onResize = () => charts.forEach((c) => c.resize());
  window.addEventListener('resize', onResize);
  onLeave(() => { window.removeEventListener('resize', onResize); charts.forEach((c) => c.destroy()); });

  let headKey = null;
  function drawHead() {
    const g = glance(p);
    const running = ['running', 'starting', 'retrying'].includes(g.state);
    const name = (processors.find((x) => x.id === p.processor) || {}).name || p.processor;
    // Redrawn only when it changes, so keyboard focus on its buttons survives the polling.
    const key = JSON.stringify([g.state, p.name, p.processor, name]);
    if (key !== headKey) {
      headKey = key;
      const focused = head.contains(document.activeElement) ? document.activeElement.textContent : null;
      drawHeadNow(g, running, name);
      if (focused) [...head.querySelectorAll('button')].find((b) => b.textContent === focused)?.focus();
    }
    drawSummary(g);
  }

  function drawHeadNow(g, running, name) {
    fill(head,
      h('div', {},
        h('a', { href: '#/pipelines', class: 'crumb' }, 'Pipelines'),
        h('h1', {}, p.name || p.id, ' ', badge(g.state)),
        h('div', { class: 'dim small' }, h('code', {}, p.id), ' · processor ',
          h('a', { href: `#/processors/${seg(p.processor)}` }, name), ` · key ${p.key.join(', ')} · ${p.time_mode} · ${p.output_mode} · ${p.partitions} partitions · trigger ${fmtMs(p.trigger_interval_ms)}`)),
      h('div', { class: 'actions' },
        h('button', { type: 'button', onclick: () => act(running ? 'stop' : 'start') }, running ? 'Stop' : 'Start'),
        h('button', { type: 'button', class: 'danger', onclick: remove }, 'Delete')));
  }

  function drawSummary(g) {
    const s = p.status || {};
    const last = s.last_progress;
    fill(summary,
      stat('Rows/s (last batch)', fmtNum(g.rowsPerS)),
      stat('Last batch', last ? `#${last.batch_id}` : '–', last ? fmtAgo(last.timestamp_ms) : 'no batch yet'),
      stat('Acknowledged', fmtInt(p.rows_acknowledged)),
      stat('Processed', fmtInt(p.rows_processed)),
      stat('Lag', fmtInt(g.lag), 'acknowledged − processed'),
      stat('State on disk', fmtBytes(s.state_bytes)),
      stat('Output', fmtBytes(s.committed_output_bytes)),
      p.time_mode === 'event-time' && last ? stat('Watermark', last.next_watermark_ms >= 0 ? fmtTime(last.next_watermark_ms) : '–') : null);
    const reason = s.failure || (s.state === 'retrying' ? s.last_error : null);
    fill(failure, reason ? failureBox(s) : null);
  }

  function failureBox(s) {
    const text = s.failure || s.last_error;
    // The runtime's errors read "processor `P` failed in FUNCTION[ for key KEY]: WHAT".
    const m = /failed in ([\w-]+)(?: for key (.*?))?: ([\s\S]*)$/.exec(text || '');
    return h('div', { class: 'error failure', role: 'alert' },
      h('strong', {}, s.state === 'failed' ? 'The pipeline failed' : `The last batch failed (attempt ${s.failed_attempts}); retrying`),
      m ? h('dl', { class: 'facts' },
        h('dt', {}, 'Function'), h('dd', {}, h('code', {}, m[1])),
        h('dt', {}, 'Key'), h('dd', {}, m[2] ? h('code', {}, m[2]) : '–'),
        h('dt', {}, 'Error'), h('dd', {}, m[3])) : null,
      h('pre', { class: 'message failure-text' }, text),
      s.state === 'failed' ? h('p', { class: 'small' }, 'Fix the cause (upgrade the processor, raise a quota), then Start to retry from the last committed batch.') : null);
  }

  async function act(what) {
    try {
      p = await post(`${base}/${what}`);
      notify(`Pipeline ${what === 'stop' ? 'stopped' : 'started'}`);
      drawHead();
    } catch (err) { fill(failure, errorBox(err, `Cannot ${what} the pipeline`)); }
  }

  async function remove() {
    if (!confirm(`Delete pipeline ${p.name || p.id} with its state and output? This cannot be undone.`)) return;
    try {
      await del(base);
      notify('Pipeline deleted');
      go('#/pipelines');
    } catch (err) { fill(failure, errorBox(err, 'Cannot delete the pipeline')); }
  }

  function pick(name) {
    current = name;
    history.replaceState(null, '', `#/pipelines/${seg(id)}/${name}`);
    live.listeners.clear();
    // Keyboard users move between tabs with the arrow keys: keep focus on the tab bar.
    const hadFocus = tabBar.contains(document.activeElement);
    fill(tabBar, tabs(TABS, current, pick));
    panel.setAttribute('aria-labelledby', `tab-${current}`);
    if (hadFocus) tabBar.querySelector(`[data-tab="${current}"]`).focus();
    fill(panel, ...renderTab(name));
  }

  function renderTab(name) {
    switch (name) {
      case 'overview': return overview();
      case 'progress': return progressTab(live);
      case 'state': return stateTab(base);
      case 'sql': return sqlTab(base);
      case 'output': return p.sink && p.sink.kafka ? kafkaNote('output', p.sink.kafka) : outputTab(base, live);
      case 'ingest': return p.source && p.source.kafka ? kafkaNote('ingest', p.source.kafka) : ingestTab(base, live);
      case 'settings': return settingsTab(base, live, processors, (np) => { p = np; live.pipeline = np; drawHead(); });
      default: return [];
    }
  }

  function overview() {
    const grid = h('div', { class: 'charts' }, charts.map((c) => c.el));
    const hint = h('p', { class: 'dim small' }, `The last ${HISTORY} batches, updated every 1.5 s. Hover a chart to read its values.`);
    // Charts need their width, known only once they are in the page.
    requestAnimationFrame(() => { charts.forEach((c) => c.update(live.progress)); onResize(); });
    live.listeners.add(() => charts.forEach((c) => c.update(live.progress)));
    return [hint, grid];
  }

  drawHead();
  pick(current);
  every(1500, async () => {
    const [np, prog] = await Promise.all([get(base), get(`${base}/progress?last=${HISTORY}`)]);
    p = np;
    live.pipeline = np;
    live.progress = prog.progress;
    drawHead();
    for (const f of live.listeners) f();
  }, main);
}

function stat(label, value, sub) {
  return h('div', { class: 'stat' }, h('div', { class: 'stat-label' }, label), h('div', { class: 'stat-value' }, value), sub ? h('div', { class: 'stat-sub dim' }, sub) : null);
}

function progressTab(live) {
  const box = h('div', {}, loading());
  const draw = () => {
    const rows = [...live.progress].reverse();
    fill(box, table([
      { label: 'Batch', value: (r) => `#${r.batch_id}`, class: 'num' },
      { label: 'Time', value: (r) => fmtTime(r.timestamp_ms) },
      { label: 'Input rows', value: (r) => fmtInt(r.input_rows), class: 'num' },
      { label: 'Output rows', value: (r) => fmtInt(r.output_rows), class: 'num' },
      { label: 'Keys', value: (r) => fmtInt(r.keys), class: 'num' },
      { label: 'Rows/s', value: (r) => fmtNum(r.rows_per_s), class: 'num' },
      { label: 'Duration', value: (r) => fmtMs(r.duration_ms), class: 'num' },
      { label: 'read / process / timers / TTL / commit (ms)', value: (r) => `${r.read_ms} / ${r.process_ms} / ${r.timers_ms} / ${r.ttl_ms} / ${r.commit_ms}`, class: 'num' },
      { label: 'State rows', value: (r) => fmtInt(r.state_rows_total), class: 'num' },
      { label: 'Timers', value: (r) => `+${r.timers_registered} / fired ${r.timers_fired}`, class: 'num' },
      { label: 'Late', value: (r) => fmtInt(r.late_rows), class: 'num' },
      { label: 'Watermark', value: (r) => (r.watermark_ms > 0 ? fmtTime(r.watermark_ms) : '–') },
    ], rows, { empty: 'No batch has run yet. Ingest rows to start one.', label: 'Progress records', class: 'progress' }));
  };
  live.listeners.add(draw);
  if (live.progress.length) draw();
  return [h('p', { class: 'dim small' }, 'One record per committed batch, newest first.'), box];
}

/** What the Output or Ingest tab says when that side of the pipeline is a Kafka topic. */
function kafkaNote(side, k) {
  const brokers = k.brokers.join(', ');
  return [side === 'output'
    ? empty(`This pipeline writes its output to the Kafka topic ${k.topic} on ${brokers}, one transaction per batch. Read it with a Kafka consumer (isolation.level=read_committed sees each row once).`)
    : empty(`This pipeline reads the Kafka topic${k.topics.length === 1 ? '' : 's'} ${k.topics.join(', ')} on ${brokers}, a batch every trigger interval. Produce rows to ${k.topics.length === 1 ? 'it' : 'them'}; HTTP ingest is refused.`)];
}

function outputTab(base, live) {
  const box = h('div', {}, loading());
  const info = h('div', { class: 'dim small', 'aria-live': 'polite' });
  let before = null; // null: the latest page, following new rows.
  let page = null;
  const older = h('button', { type: 'button', onclick: () => { if (page) { before = page.from; load(); } } }, '← Older');
  const latest = h('button', { type: 'button', onclick: () => { before = null; load(); } }, 'Latest');
  const limitSel = h('select', { 'aria-label': 'Rows per page', onchange: () => load() },
    ['20', '50', '200', '1000'].map((n) => h('option', { value: n, selected: n === '50' }, `${n} rows`)));
  let seq = 0;
  async function load() {
    // Polling and clicks overlap: only the newest request's answer is shown.
    const mine = ++seq;
    try {
      const answer = await get(`${base}/output/tail${query({ before, limit: limitSel.value })}`);
      if (mine !== seq) return;
      page = answer;
      older.disabled = page.begin;
      latest.disabled = before === null;
      fill(info, page.count
        ? `Rows at bytes ${fmtInt(page.from)}–${fmtInt(page.to)} of ${fmtInt(page.committed)} committed${before === null ? ' · following new output' : ''}`
        : '');
      const cols = columnsOf(page.rows);
      fill(box, table(cols, page.rows, { empty: 'No output yet. Rows appear here once a batch emits them.', label: 'Output rows', class: 'output' }));
    } catch (err) { if (mine === seq) fill(box, errorBox(err)); }
  }
  live.listeners.add(() => { if (before === null) load(); });
  load();
  return [h('div', { class: 'toolbar' }, older, latest, limitSel, info), box];
}

function ingestTab(base, live) {
  const p = live.pipeline;
  const example = Object.fromEntries(p.key.map((k) => [k, 'a']));
  if (p.event_time) example[p.event_time.column] = new Date().toISOString();
  const text = h('textarea', { rows: '10', class: 'mono', spellcheck: 'false', id: 'ingest-rows' },
    `${JSON.stringify([example, { ...example, [p.key[0]]: 'b' }], null, 2)}`);
  const status = h('div', { 'aria-live': 'polite' });
  const send = h('button', { type: 'submit', class: 'primary' }, 'Send rows');
  const form = h('form', {
    class: 'ingest',
    onsubmit: async (e) => {
      e.preventDefault();
      let rows;
      try { rows = parseRows(text.value); } catch (err) { fill(status, errorBox(err, 'These rows are not JSON')); return; }
      send.disabled = true;
      try {
        const r = await post(`${base}/rows`, rows);
        fill(status, h('div', { class: 'ok-box', role: 'status' }, `Accepted ${r.accepted} row${r.accepted === 1 ? '' : 's'}: durable in the input log, processed in the next batch.`));
      } catch (err) {
        fill(status, errorBox(err, 'No row was accepted'));
      } finally { send.disabled = false; }
    },
  },
  field('Rows', text, 'A JSON array of objects, one object, or JSON Lines. Every row needs the key columns. Ctrl+Enter sends.'),
  h('div', { class: 'toolbar' }, send),
  status);
  text.addEventListener('keydown', (e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); } });
  return [form];
}

function settingsTab(base, live, processors, changed) {
  const p = live.pipeline;
  const others = processors.filter((x) => x.id !== p.processor);
  const select = h('select', { id: 'upgrade-processor' },
    others.map((x) => h('option', { value: x.id }, `${x.name} (${x.id})`)));
  const result = h('div', { 'aria-live': 'polite' });
  const check = h('button', {
    type: 'button',
    onclick: async () => {
      fill(result, loading('Checking the processor against the pipeline’s state…'));
      try {
        const r = await post(`${base}/processor/check`, { processor: select.value });
        showReport(r);
      } catch (err) { fill(result, errorBox(err, 'The check failed')); }
    },
  }, 'Check compatibility');

  function showReport(r) {
    const confirmButton = h('button', {
      type: 'button', class: 'primary', disabled: !r.compatible,
      onclick: async () => {
        confirmButton.disabled = true;
        try {
          const np = await put(`${base}/processor`, { processor: r.processor });
          changed(np);
          fill(result, h('div', { class: 'ok-box', role: 'status' }, `Upgraded to ${r.processor}.`), h('pre', { class: 'report' }, np.upgrade_report || ''));
          notify('Pipeline upgraded');
        } catch (err) { fill(result, errorBox(err, 'The upgrade was refused')); }
      },
    }, 'Upgrade');
    fill(result,
      h('div', { class: r.compatible ? 'ok-box' : 'error', role: r.compatible ? 'status' : 'alert', 'data-compatible': String(r.compatible) },
        h('strong', {}, r.compatible
          ? 'Compatible: the new processor can take over this state.'
          : 'Refused: the new processor is incompatible with this pipeline’s state. The pipeline keeps its current processor.'),
        h('pre', { class: 'report' }, r.report)),
      h('div', { class: 'toolbar' }, confirmButton, h('button', { type: 'button', onclick: () => fill(result) }, 'Cancel')));
  }

  const grantList = (p.http_hosts || []).length ? p.http_hosts.join(', ') : 'none (only the admin can grant them)';
  const kafkaSides = [['source', p.source && p.source.kafka], ['sink', p.sink && p.sink.kafka]].filter(([, k]) => k);
  return [
    ...kafkaSides.map(([side, k]) => kafkaOptionsCard(base, side, k, changed)),
    h('section', { class: 'card' }, h('h2', {}, 'Upgrade the processor'),
      others.length
        ? h('div', {}, h('p', { class: 'dim small' }, 'The check runs the new processor’s init in describe mode against every state variable’s schema history; nothing changes until you confirm.'),
          h('div', { class: 'toolbar' }, field('New processor', select), check), result)
        : empty('Upload another processor to upgrade to.', h('a', { href: '#/processors' }, 'Processors'))),
    h('section', { class: 'card' }, h('h2', {}, 'Settings'),
      h('dl', { class: 'facts' },
        h('dt', {}, 'Key columns'), h('dd', {}, p.key.join(', ')),
        h('dt', {}, 'Time mode'), h('dd', {}, p.time_mode),
        h('dt', {}, 'Event time'), h('dd', {}, p.event_time ? `${p.event_time.column}, watermark delay ${fmtMs(p.event_time.watermark_delay_ms)}` : '–'),
        h('dt', {}, 'Output mode'), h('dd', {}, p.output_mode),
        h('dt', {}, 'Partitions'), h('dd', {}, String(p.partitions)),
        h('dt', {}, 'Trigger interval'), h('dd', {}, fmtMs(p.trigger_interval_ms)),
        h('dt', {}, 'Outbound HTTP'), h('dd', {}, grantList),
        h('dt', {}, 'Created'), h('dd', {}, fmtTime(p.created_ms)))),
  ];
}

/**
 * A Kafka side's authentication, editable: how credentials are rotated. Saving replaces the
 * side's client options (PUT .../kafka/options); options without a field here are kept, and
 * an empty password keeps the stored one. A running pipeline restarts with them.
 */
function kafkaOptionsCard(base, side, k, changed) {
  // The side's options as last stored (`sasl.password` shown as `<redacted>`).
  let stored = k.options || {};
  const hasPassword = () => 'sasl.password' in stored;
  const prefix = `${side}-kafka-`;
  // A stored value the list lacks (another spelling librdkafka accepts) stays selectable, so
  // saving the other fields keeps it.
  const choice = (name, values, none) => h('select', { name: `${prefix}${name}` },
    [...new Set([...values, stored[name] || ''])].map((v) => h('option', { value: v, selected: v === (stored[name] || '') }, v || none)));
  const protocol = choice('security.protocol', ['', 'PLAINTEXT', 'SASL_PLAINTEXT', 'SASL_SSL', 'SSL'], 'default (PLAINTEXT)');
  const mechanism = choice('sasl.mechanism', ['', 'PLAIN', 'SCRAM-SHA-256', 'SCRAM-SHA-512'], 'none');
  const username = h('input', { name: `${prefix}sasl.username`, value: stored['sasl.username'] || '', autocomplete: 'off', spellcheck: 'false' });
  const password = h('input', { name: `${prefix}sasl.password`, type: 'password', autocomplete: 'new-password' });
  const passwordHint = () => {
    password.placeholder = hasPassword() ? 'unchanged' : '';
    return hasPassword() ? 'Leave empty to keep the stored password.' : 'No password is stored.';
  };
  const passwordField = field('SASL password', password, passwordHint());
  const result = h('div', { 'aria-live': 'polite' });
  const save = h('button', { type: 'submit', class: 'primary' }, 'Save and restart');
  const form = h('form', {
    class: `kafka-options ${side}`,
    onsubmit: async (e) => {
      e.preventDefault();
      const options = { ...stored };
      for (const [name, control] of [['security.protocol', protocol], ['sasl.mechanism', mechanism], ['sasl.username', username]]) {
        if (control.value) options[name] = control.value; else delete options[name];
      }
      // The server shows the stored password redacted and keeps it when sent back so.
      if (password.value) options['sasl.password'] = password.value;
      else if (!hasPassword()) delete options['sasl.password'];
      save.disabled = true;
      try {
        const np = await put(`${base}/kafka/options`, { [side]: options });
        changed(np);
        stored = np[side].kafka.options || {};
        password.value = '';
        passwordField.querySelector('.hint').textContent = passwordHint();
        fill(result, h('div', { class: 'ok-box', role: 'status' },
          `Saved the ${side}'s options${np.restarted ? '; the pipeline restarted with them' : '; the pipeline gets them at its next start'}.`));
        notify('Kafka options saved');
      } catch (err) { fill(result, errorBox(err, 'The options were refused')); } finally { save.disabled = false; }
    },
  },
  h('p', { class: 'dim small' }, `${side === 'source' ? 'Reads' : 'Writes'} ${side === 'source' ? k.topics.join(', ') : k.topic} on ${k.brokers.join(', ')}. Brokers and topics stay; the pipeline carries on from its offsets.`),
  h('div', { class: 'grid2' }, field('Security protocol', protocol), field('SASL mechanism', mechanism)),
  h('div', { class: 'grid2' }, field('SASL username', username), passwordField),
  h('div', { class: 'toolbar' }, save),
  result);
  return h('section', { class: 'card' }, h('h2', {}, `Kafka ${side}: credentials`), form);
}
