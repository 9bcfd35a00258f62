// The admin's view: tenants with their quotas and usage, creating tenants, issuing tokens,
// changing quotas, granting tenants Kafka brokers and granting pipelines outbound HTTP.

import { get, post, put, patch, seg } from '../api.js';
import { h, fill, field, listItems, table, empty, errorBox, loading, notify, badge, dialog, secret, fmtBytes, fmtInt, fmtMs, fmtAgo } from '../ui.js';
import { every } from '../app.js';

/** "used / quota" with a bar, red when over. */
function meter(used, quota, fmt) {
  const pct = quota ? Math.min(100, (used / quota) * 100) : 0;
  return h('div', { class: 'meter' },
    h('div', { class: 'meter-text' }, `${fmt(used)} / ${fmt(quota)}`),
    h('div', { class: `meter-bar${used > quota ? ' over' : ''}`, role: 'meter', 'aria-valuemin': '0', 'aria-valuemax': String(quota), 'aria-valuenow': String(used), 'aria-label': 'used of quota' },
      h('div', { class: 'meter-fill', style: `width:${pct.toFixed(1)}%` })));
}

export async function adminView(main) {
  const list = h('div', {}, loading());
  const status = h('div', { 'aria-live': 'polite' });
  fill(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Tenants'),
      h('div', { class: 'actions' }, h('button', { type: 'button', class: 'primary', onclick: createTenant }, 'New tenant'))),
    status,
    list);

  async function refresh(force = true) {
    // The periodic refresh waits while a dialog is open or the keyboard is in the list.
    if (!force && (document.querySelector('dialog[open]') || list.contains(document.activeElement))) return;
    const open = new Set([...list.querySelectorAll('details[open]')].map((d) => d.closest('[data-tenant]').dataset.tenant));
    const { tenants } = await get('/v1/usage');
    tenants.sort((a, b) => a.created_ms - b.created_ms);
    fill(list, tenants.length ? tenants.map(tenantCard) : h('section', { class: 'card' }, empty('No tenants yet. Create one to hand out its token.')));
    for (const d of list.querySelectorAll('[data-tenant] details')) {
      if (open.has(d.closest('[data-tenant]').dataset.tenant)) d.open = true;
    }
  }

  function tenantCard(t) {
    const u = t.usage;
    const q = t.quotas;
    return h('section', { class: 'card tenant', 'data-tenant': t.id },
      h('div', { class: 'card-head' },
        h('h2', {}, t.name, ' ', h('code', { class: 'dim small' }, t.id)),
        h('div', { class: 'actions' },
          h('button', { type: 'button', onclick: () => issueToken(t) }, 'Issue token'),
          h('button', { type: 'button', onclick: () => editQuotas(t) }, 'Edit quotas'),
          h('button', { type: 'button', onclick: () => grantKafka(t) }, 'Kafka brokers…'))),
      h('div', { class: 'usage' },
        h('div', { class: 'stat' }, h('div', { class: 'stat-label' }, 'Processors'), meter(u.processors, q.max_processors, fmtInt)),
        h('div', { class: 'stat' }, h('div', { class: 'stat-label' }, 'Pipelines'), meter(u.pipelines, q.max_pipelines, fmtInt)),
        h('div', { class: 'stat' }, h('div', { class: 'stat-label' }, 'State on disk'), meter(u.state_bytes, q.max_state_bytes, fmtBytes)),
        h('div', { class: 'stat' }, h('div', { class: 'stat-label' }, 'CPU used'), h('div', { class: 'stat-value' }, fmtMs(u.cpu_seconds * 1000))),
        h('div', { class: 'stat' }, h('div', { class: 'stat-label' }, 'Memory high water'), h('div', { class: 'stat-value' }, `${fmtBytes(u.memory_high_water_bytes)}`), h('div', { class: 'stat-sub dim' }, `limit ${fmtBytes(q.memory_bytes)} per instance`)),
        h('div', { class: 'stat' }, h('div', { class: 'stat-label' }, 'Refused requests'), h('div', { class: `stat-value${u.rejected_requests ? ' warn-text' : ''}` }, fmtInt(u.rejected_requests))),
        h('div', { class: 'stat kafka-brokers' }, h('div', { class: 'stat-label' }, 'Kafka brokers'),
          t.kafka_brokers.length
            ? h('div', { class: 'stat-sub mono' }, t.kafka_brokers.join(', '))
            : h('div', { class: 'stat-sub dim' }, 'none granted'))),
      h('details', {}, h('summary', {}, 'All quotas'),
        table(['quota', 'value'], Object.entries(q).map(([k, v]) => ({ quota: k, value: v })), { label: 'Quotas' })),
      h('h3', {}, 'Pipelines'),
      table([
        { label: 'Pipeline', value: (p) => h('span', {}, p.name || p.id, p.name ? h('div', { class: 'mono dim small' }, p.id) : null) },
        { label: 'Status', value: (p) => h('div', {}, badge(p.state), p.failure ? h('div', { class: 'reason small' }, p.failure) : null) },
        { label: 'State', value: (p) => fmtBytes(p.state_bytes), class: 'num' },
        { label: 'Outbound HTTP', value: (p) => (p.http_hosts.length ? p.http_hosts.join(', ') : h('span', { class: 'dim' }, 'none')) },
        { label: '', value: (p) => h('button', { type: 'button', class: 'small', onclick: () => grant(p) }, 'Grant HTTP…') },
      ], t.pipelines, { empty: 'No pipelines.', label: `Pipelines of ${t.name}` }),
      h('p', { class: 'dim small' }, `Created ${fmtAgo(t.created_ms)} · ${t.tokens.length} token${t.tokens.length === 1 ? '' : 's'}`));
  }

  function createTenant() {
    const name = h('input', { name: 'name', required: true });
    const quotas = h('textarea', { rows: '4', class: 'mono', spellcheck: 'false' }, '{}');
    const out = h('div', { 'aria-live': 'polite' });
    const submit = h('button', { type: 'submit', class: 'primary' }, 'Create');
    const form = h('form', {
      onsubmit: async (e) => {
        e.preventDefault();
        let q;
        try { q = JSON.parse(quotas.value || '{}'); } catch (err) { fill(out, errorBox(err, 'Quotas are not JSON')); return; }
        try {
          const t = await post('/v1/tenants', { name: name.value, quotas: q });
          submit.disabled = true;
          fill(out, h('div', { class: 'ok-box', role: 'status' }, h('p', {}, `Tenant ${t.name} created. Its token is shown once: hand it over now.`), secret(t.token)));
          refresh();
        } catch (err) { fill(out, errorBox(err, 'The tenant was not created')); }
      },
    }, field('Name', name), field('Quotas (JSON, optional)', quotas, 'Any subset, e.g. {"max_pipelines": 4, "ingest_rows_per_s": 1000}; the rest are the server defaults.'), h('div', { class: 'dialog-actions' }, submit), out);
    dialog('New tenant', form);
  }

  async function issueToken(t) {
    try {
      const r = await post(`/v1/tenants/${seg(t.id)}/tokens`);
      dialog(`Token for ${t.name}`, h('div', {}, h('p', {}, 'Shown once; only its hash is stored.'), secret(r.token)));
      refresh();
    } catch (err) { fill(status, errorBox(err, 'No token was issued')); }
  }

  function editQuotas(t) {
    const text = h('textarea', { rows: '12', class: 'mono', spellcheck: 'false' }, JSON.stringify(t.quotas, null, 2));
    const out = h('div', { 'aria-live': 'polite' });
    const form = h('form', {
      onsubmit: async (e) => {
        e.preventDefault();
        let q;
        try { q = JSON.parse(text.value); } catch (err) { fill(out, errorBox(err, 'Not JSON')); return; }
        try {
          await patch(`/v1/tenants/${seg(t.id)}/quotas`, q);
          d.close();
          notify('Quotas saved');
          refresh();
        } catch (err) { fill(out, errorBox(err, 'The quotas were not saved')); }
      },
    }, field('Quotas', text, 'CPU, memory and output limits apply to pipelines started after the change.'), out, h('div', { class: 'dialog-actions' }, h('button', { type: 'submit', class: 'primary' }, 'Save')));
    const d = dialog(`Quotas of ${t.name}`, form);
  }

  /** A dialog editing a grant, a comma-separated list; `save(list)` stores it and returns the notice. */
  function grantDialog({ title, name, values, placeholder, label, hint, save }) {
    const input = h('input', { name, value: values.join(', '), placeholder, spellcheck: 'false' });
    const out = h('div', { 'aria-live': 'polite' });
    const form = h('form', {
      onsubmit: async (e) => {
        e.preventDefault();
        try {
          const notice = await save(listItems(input));
          d.close();
          notify(notice);
          refresh();
        } catch (err) { fill(out, errorBox(err, 'The grant was refused')); }
      },
    }, field(label, input, hint), out,
    h('div', { class: 'dialog-actions' }, h('button', { type: 'submit', class: 'primary' }, 'Grant')));
    const d = dialog(title, form);
  }

  function grantKafka(t) {
    grantDialog({
      title: `Kafka brokers of ${t.name}`,
      name: 'brokers',
      values: t.kafka_brokers,
      placeholder: 'kafka-1.internal:9092, kafka-2.internal:9092',
      label: 'Brokers',
      hint: 'HOST:PORT, comma-separated: the complete list, replacing the previous one; empty revokes every grant. Running pipelines that use a broker no longer listed stop. A grant covers the whole cluster behind the address.',
      save: async (list) => {
        const r = await put(`/v1/tenants/${seg(t.id)}/kafka`, { brokers: list });
        const stopped = r.stopped.length ? `; stopped ${r.stopped.join(', ')}` : '';
        return `Kafka brokers of ${t.name}: ${r.brokers.length ? r.brokers.join(', ') : 'none'}${stopped}`;
      },
    });
  }

  function grant(p) {
    grantDialog({
      title: `Outbound HTTP for ${p.name || p.id}`,
      name: 'hosts',
      values: p.http_hosts,
      placeholder: 'api.example.com, 10.0.0.5:8080',
      label: 'Allowed hosts',
      hint: 'HOST allows every port, HOST:PORT one port; empty revokes every grant. A running pipeline restarts with the new list.',
      save: async (list) => {
        const r = await put(`/v1/pipelines/${seg(p.id)}/capabilities`, { http_hosts: list });
        return `Outbound HTTP for ${p.id}: ${r.http_hosts.length ? r.http_hosts.join(', ') : 'none'}${r.restarted ? ' (restarted)' : ''}`;
      },
    });
  }

  every(3000, () => refresh(false), main);
}
