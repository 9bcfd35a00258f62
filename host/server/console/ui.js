// Small DOM helpers: elements without innerHTML (text is always text, so a value from the
// server can never become markup), formatting, tables, dialogs and notices.

/** Creates an element: h('a', {href: '#/x', class: 'y', onclick: f}, 'text', child, ...). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'value') el.value = v;
    else if (k === 'checked') el.checked = !!v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

let uid = 0;
export const nextId = (prefix = 'f') => `${prefix}-${++uid}`;

/** A labelled form field: the label points at the control. */
export function field(label, control, hint) {
  if (!control.id) control.id = nextId();
  const hintEl = hint ? h('div', { class: 'hint', id: `${control.id}-hint` }, hint) : null;
  if (hintEl) control.setAttribute('aria-describedby', hintEl.id);
  return h('div', { class: 'field' }, h('label', { for: control.id }, label), control, hintEl);
}

/** The items of a comma-separated field, trimmed, empty ones dropped. */
export const listItems = (input) => input.value.split(',').map((s) => s.trim()).filter(Boolean);

// ---- Formatting ----

export function fmtInt(n) {
  if (n === undefined || n === null || Number.isNaN(n)) return '–';
  return Math.round(n).toLocaleString('en-US');
}

export function fmtNum(n, digits = 1) {
  if (n === undefined || n === null || !Number.isFinite(n)) return '–';
  if (Math.abs(n) >= 1000) return fmtInt(n);
  return n.toFixed(digits).replace(/\.0+$/, '');
}

export function fmtBytes(n) {
  if (n === undefined || n === null) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

export function fmtMs(ms) {
  if (ms === undefined || ms === null) return '–';
  if (ms < 10) return `${fmtNum(ms, 1)} ms`;
  if (ms < 1000) return `${fmtNum(ms, 0)} ms`;
  if (ms < 60_000) return `${fmtNum(ms / 1000, 1)} s`;
  if (ms < 3_600_000) return `${fmtNum(ms / 60_000, 1)} min`;
  return `${fmtNum(ms / 3_600_000, 1)} h`;
}

export function fmtTime(ms) {
  if (ms === undefined || ms === null || ms < 0) return '–';
  return new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

export function fmtAgo(ms) {
  if (!ms) return 'never';
  const d = Date.now() - ms;
  if (d < 5_000) return 'just now';
  return `${fmtMs(d)} ago`;
}

/** A value as it reads in a table cell: objects as compact JSON. */
export function cellText(v) {
  if (v === undefined) return '';
  if (v === null) return 'null';
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

// ---- Components ----

const STATE_CLASS = {
  running: 'ok', starting: 'info', retrying: 'warn', stopped: 'muted', failed: 'bad',
};

export function badge(state) {
  const s = state || 'unknown';
  return h('span', { class: `badge ${STATE_CLASS[s] || 'muted'}`, 'data-state': s }, s);
}

/** A table of `rows` with `columns` [{label, value: row => node|text, class}] or keys. */
export function table(columns, rows, opts = {}) {
  const cols = columns.map((c) => (typeof c === 'string' ? { label: c, value: (r) => cellText(r[c]) } : c));
  if (!rows.length) return empty(opts.empty || 'Nothing here yet.');
  return h('div', { class: 'table-wrap' },
    h('table', { class: opts.class || '', 'aria-label': opts.label || null },
      h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col', class: c.class }, c.label)))),
      h('tbody', {}, rows.map((r) => h('tr', {}, cols.map((c) => h('td', { class: c.class }, c.value(r))))))));
}

/** The columns of a list of JSON rows, in first-seen order. */
export function columnsOf(rows) {
  const seen = new Set();
  for (const r of rows) for (const k of Object.keys(r || {})) seen.add(k);
  return [...seen];
}

export function empty(text, ...more) {
  return h('div', { class: 'empty', role: 'status' }, h('p', {}, text), ...more);
}

/** An error shown where it happened: the API's message as it gave it. */
export function errorBox(err, title) {
  const message = err && err.message ? err.message : String(err);
  const code = err && err.code ? err.code : null;
  return h('div', { class: 'error', role: 'alert' },
    h('strong', {}, title || 'Error'),
    code && err.status ? h('span', { class: 'code' }, ` ${err.status} ${code}`) : null,
    h('div', { class: 'message' }, message),
    err && err.error && err.error.report ? h('pre', { class: 'report' }, err.error.report) : null);
}

export function loading(text = 'Loading…') {
  return h('div', { class: 'loading', role: 'status' }, text);
}

/** A short notice at the corner of the screen, read out by screen readers. */
export function notify(text, kind = 'ok') {
  const box = document.getElementById('notices');
  if (!box) return;
  const n = h('div', { class: `notice ${kind}`, role: kind === 'bad' ? 'alert' : 'status' }, text);
  box.append(n);
  setTimeout(() => n.remove(), kind === 'bad' ? 8000 : 4000);
}

/** A modal dialog (native <dialog>: focus is trapped, Escape closes). Resolves on close. */
export function dialog(title, body, actions) {
  const dlg = h('dialog', { class: 'dialog', 'aria-labelledby': nextId('dlg') });
  const heading = h('h2', { id: dlg.getAttribute('aria-labelledby') }, title);
  const close = () => dlg.close();
  dlg.append(
    h('div', { class: 'dialog-head' }, heading,
      h('button', { class: 'icon', type: 'button', 'aria-label': 'Close', onclick: close }, '×')),
    h('div', { class: 'dialog-body' }, body),
    actions ? h('div', { class: 'dialog-actions' }, actions) : null);
  document.body.append(dlg);
  const done = new Promise((resolve) => dlg.addEventListener('close', () => { dlg.remove(); resolve(dlg.returnValue); }));
  dlg.showModal();
  return { dlg, close, done };
}

/** A secret shown once, with a copy button. */
export function secret(value) {
  const input = h('input', { class: 'mono secret', readonly: true, value, 'aria-label': 'Token', size: 48 });
  return h('div', { class: 'secret-row' }, input,
    h('button', {
      type: 'button',
      onclick: async () => {
        input.select();
        try { await navigator.clipboard.writeText(value); notify('Copied'); } catch { notify('Select the token and copy it', 'warn'); }
      },
    }, 'Copy'));
}

/** Tabs with roving focus (arrow keys), ARIA roles; `onpick(name)` when one is chosen. */
export function tabs(names, current, onpick) {
  const list = h('div', { class: 'tabs', role: 'tablist' });
  const buttons = names.map(([name, label]) => h('button', {
    type: 'button',
    role: 'tab',
    id: `tab-${name}`,
    'aria-selected': name === current ? 'true' : 'false',
    tabindex: name === current ? '0' : '-1',
    'data-tab': name,
    onclick: () => onpick(name),
  }, label));
  list.addEventListener('keydown', (e) => {
    const i = buttons.indexOf(document.activeElement);
    if (i < 0) return;
    let j = null;
    if (e.key === 'ArrowRight') j = (i + 1) % buttons.length;
    if (e.key === 'ArrowLeft') j = (i - 1 + buttons.length) % buttons.length;
    if (e.key === 'Home') j = 0;
    if (e.key === 'End') j = buttons.length - 1;
    if (j !== null) { e.preventDefault(); buttons[j].focus(); onpick(names[j][0]); }
  });
  list.append(...buttons);
  return list;
}

/** Parses rows typed by a person: a JSON array of objects, one object, or JSON Lines. */
export function parseRows(text) {
  const t = text.trim();
  if (!t) throw new Error('Type at least one row.');
  if (t.startsWith('[')) {
    const v = JSON.parse(t);
    if (!Array.isArray(v)) throw new Error('Expected a JSON array of objects.');
    return v;
  }
  try { return [JSON.parse(t)]; } catch { /* JSON Lines below */ }
  return t.split('\n').filter((l) => l.trim()).map((l, i) => {
    try { return JSON.parse(l); } catch (e) { throw new Error(`Line ${i + 1}: ${e.message}`); }
  });
}
