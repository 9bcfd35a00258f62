// The state browser (a variable at any retained batch, timers, the change feed between two
// batches, metadata with schema history) and SQL over the state.

import { get, post, query } from '../api.js';
import { h, fill, field, table, empty, errorBox, loading, columnsOf, cellText, fmtTime, fmtInt } from '../ui.js';

/** A cell of a state row: TTL expiry and timer times also as dates. */
function stateColumns(rows) {
  return columnsOf(rows).map((c) => ({
    label: c,
    value: (r) => {
      const v = r[c];
      if ((c === 'ttl_expiration_ms' || c === 'expiration_timestamp_ms') && typeof v === 'number') {
        return h('span', { title: String(v) }, fmtTime(v));
      }
      return typeof v === 'object' && v !== null ? h('code', { class: 'json' }, cellText(v)) : cellText(v);
    },
  }));
}

export function stateTab(base) {
  const box = h('div', {}, loading('Reading the checkpoint’s metadata…'));
  (async () => {
    let meta;
    try {
      meta = await get(`${base}/state/metadata`);
    } catch (err) {
      fill(box, errorBox(err, 'No state to browse yet'));
      return;
    }
    const vars = meta.variables || [];
    const min = meta.min_batch_id;
    const max = meta.max_batch_id;
    if (max === null || max === undefined) {
      fill(box, empty('No batch has committed yet, so there is no state. Ingest rows first.'));
      return;
    }
    const varSel = h('select', { id: 'state-var' },
      vars.map((v) => h('option', { value: v.name }, `${v.name} (${v.kind})`)),
      // Only a pipeline with a time mode has timers to read.
      meta.time_mode !== 'none' ? h('option', { value: '__timers' }, 'timers') : null);
    const batch = h('input', { id: 'state-batch', type: 'number', min: String(min), max: String(max), value: String(max) });
    const flatten = h('input', { type: 'checkbox', id: 'state-flatten', checked: true });
    const rowsBox = h('div', {});
    const show = h('button', { type: 'submit', class: 'primary' }, 'Show');
    const read = async () => {
      fill(rowsBox, loading());
      const isTimers = varSel.value === '__timers';
      const params = isTimers
        ? { timers: 'true', batch_id: batch.value, limit: 1000 }
        : { var: varSel.value, batch_id: batch.value, flatten: flatten.checked ? 'true' : 'false', limit: 1000 };
      try {
        const r = await get(`${base}/state${query(params)}`);
        fill(rowsBox,
          h('p', { class: 'dim small', 'data-batch': batch.value }, `${isTimers ? 'Timers' : varSel.value} at batch #${batch.value}: ${fmtInt(r.rows.length)} row${r.rows.length === 1 ? '' : 's'}${r.truncated ? ' (first 1,000 shown)' : ''}`),
          table(stateColumns(r.rows), r.rows, { empty: isTimers ? 'No timers were registered at this batch.' : 'This variable had no rows at this batch.', label: 'State rows', class: 'state-rows' }));
      } catch (err) { fill(rowsBox, errorBox(err)); }
    };

    const from = h('input', { id: 'changes-from', type: 'number', min: String(min), max: String(max), value: String(Math.max(min, max - 1)) });
    const to = h('input', { id: 'changes-to', type: 'number', min: String(min), max: String(max), value: String(max) });
    const changeVar = h('select', { id: 'changes-var' }, vars.map((v) => h('option', { value: v.name }, v.name)));
    const changesBox = h('div', {});
    const readChanges = async () => {
      fill(changesBox, loading());
      try {
        const r = await get(`${base}/state/changes${query({ var: changeVar.value, from: from.value, to: to.value, limit: 1000 })}`);
        fill(changesBox, table(stateColumns(r.rows), r.rows, { empty: 'No changes between these batches.', label: 'Change feed', class: 'changes' }));
      } catch (err) { fill(changesBox, errorBox(err)); }
    };

    fill(box,
      h('section', { class: 'card' }, h('h2', {}, 'Browse state'),
        h('form', { class: 'toolbar', onsubmit: (e) => { e.preventDefault(); read(); } },
          field('Variable', varSel),
          field(`Batch (${min}–${max})`, batch),
          h('label', { class: 'check' }, flatten, ' flatten lists and maps'),
          show),
        h('p', { class: 'dim small' }, 'Pick an earlier batch to see the state as it was then (time travel through the retained batches).'),
        rowsBox),
      vars.length ? h('section', { class: 'card' }, h('h2', {}, 'Change feed'),
        h('form', { class: 'toolbar', onsubmit: (e) => { e.preventDefault(); readChanges(); } },
          field('Variable', changeVar), field('From batch', from), field('To batch', to),
          h('button', { type: 'submit' }, 'Show changes')),
        changesBox) : null,
      h('section', { class: 'card' }, h('h2', {}, 'Metadata'),
        h('dl', { class: 'facts' },
          h('dt', {}, 'Operator'), h('dd', {}, `${meta.operator_name || '–'} (id ${meta.operator_id})`),
          h('dt', {}, 'Partitions'), h('dd', {}, String(meta.num_partitions)),
          h('dt', {}, 'Retained batches'), h('dd', {}, `${min} – ${max}`),
          h('dt', {}, 'Key columns'), h('dd', {}, (meta.key_columns || []).join(', '))),
        table([
          { label: 'Variable', value: (v) => h('strong', {}, v.name) },
          { label: 'Kind', value: (v) => v.kind },
          { label: 'TTL', value: (v) => (v.ttl_enabled ? `${v.ttl_duration_ms} ms` : '–') },
          { label: 'Key schema', value: (v) => h('code', {}, v.key_schema || '–') },
          {
            label: 'Schema history (oldest first)',
            value: (v) => h('ol', { class: 'history', start: '0' }, (v.value_schema_history || []).map((s, i) => h('li', {}, h('code', { class: i === v.schema_id ? 'current' : '' }, s)))),
          },
        ], vars, { empty: 'The processor declared no state variables.', label: 'State variables' })));
    read();
  })();
  return [box];
}

export function sqlTab(base) {
  const text = h('textarea', { id: 'sql-text', rows: '5', class: 'mono', spellcheck: 'false', 'aria-describedby': 'sql-hint' },
    'SELECT * FROM read_state_metadata()');
  const result = h('div', { 'aria-live': 'polite' });
  const run = h('button', { type: 'submit', class: 'primary' }, 'Run');
  const form = h('form', {
    class: 'sql',
    onsubmit: async (e) => {
      e.preventDefault();
      run.disabled = true;
      fill(result, loading('Running…'));
      const started = performance.now();
      try {
        const r = await post(`${base}/sql`, { sql: text.value, limit: 1000 });
        const cols = r.columns.length ? r.columns : columnsOf(r.rows);
        fill(result,
          h('p', { class: 'dim small' }, `${fmtInt(r.count)} row${r.count === 1 ? '' : 's'}${r.truncated ? ' (cut at 1,000)' : ''} in ${Math.round(performance.now() - started)} ms`),
          table(cols.map((c) => ({ label: c, value: (row) => (typeof row[c] === 'object' && row[c] !== null ? h('code', { class: 'json' }, cellText(row[c])) : cellText(row[c])) })),
            r.rows, { empty: 'The query returned no rows.', label: 'Query result', class: 'sql-result' }));
      } catch (err) {
        fill(result, errorBox(err, 'The query failed'));
      } finally { run.disabled = false; }
    },
  },
  h('label', { for: 'sql-text' }, 'SQL over the committed state'),
  text,
  h('div', { class: 'hint', id: 'sql-hint' },
    'Table functions: ', h('code', {}, "read_statestore(stateVarName => 'NAME', batchId => N, readChangeFeed => true, changeStartBatchId => N, readRegisteredTimers => true)"),
    ' and ', h('code', {}, 'read_state_metadata()'), '. Only queries run; Ctrl+Enter runs.'),
  h('div', { class: 'toolbar' }, run),
  result);
  text.addEventListener('keydown', (e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); } });
  // Offer a query over the first variable once the metadata is known.
  get(`${base}/state/metadata`).then((meta) => {
    const v = (meta.variables || [])[0];
    if (v && text.value === 'SELECT * FROM read_state_metadata()') {
      text.value = `SELECT * FROM read_statestore(stateVarName => '${v.name}') LIMIT 100`;
    }
  }).catch(() => { /* no state yet: the metadata query stays */ });
  return [form];
}
