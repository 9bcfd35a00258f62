// Pipelines: the list with status at a glance, start/stop, and the create form (HTTP or
// Kafka on either side).

import { get, post, seg } from '../api.js';
import { h, fill, field, listItems, table, empty, errorBox, loading, notify, badge, fmtNum, fmtInt, fmtAgo, dialog } from '../ui.js';
import { every, go } from '../app.js';

/** The numbers of a pipeline's list row, from its status and last progress record. */
export function glance(p) {
  const s = p.status || {};
  const last = s.last_progress || null;
  return {
    state: s.state || 'unknown',
    reason: s.failure || s.last_error || p.failure || null,
    rowsPerS: last ? last.rows_per_s : null,
    lastBatch: last ? last.batch_id : null,
    lastBatchMs: last ? last.timestamp_ms : null,
    // A pipeline reading Kafka acknowledges nothing over HTTP: its lag is in the topic.
    lag: p.source && p.source.kafka ? null : (p.rows_acknowledged ?? 0) - (p.rows_processed ?? 0),
  };
}

export async function pipelinesView(main, queryString) {
  const params = new URLSearchParams(queryString || '');
  const list = h('div', {}, loading());
  const status = h('div', { 'aria-live': 'polite' });
  const newButton = h('button', { type: 'button', class: 'primary', onclick: () => createDialog() }, 'New pipeline');
  fill(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Pipelines'), h('div', { class: 'actions' }, newButton)),
    status,
    h('section', { class: 'card' }, list));

  // Null until the server has answered: a click before that must not offer an empty list.
  let processors = null;
  async function refresh(force = true) {
    // The periodic refresh waits while the keyboard is in the table, so focus is not lost.
    if (!force && list.contains(document.activeElement)) return;
    const [{ pipelines }, procs] = await Promise.all([get('/v1/pipelines'), get('/v1/processors')]);
    processors = procs.processors;
    const names = Object.fromEntries(processors.map((p) => [p.id, p.name]));
    pipelines.sort((a, b) => b.created_ms - a.created_ms);
    fill(list, pipelines.length
      ? table([
        { label: 'Pipeline', value: (p) => h('a', { href: `#/pipelines/${seg(p.id)}` }, p.name || p.id, p.name ? h('div', { class: 'mono dim small' }, p.id) : null) },
        { label: 'Processor', value: (p) => h('a', { href: `#/processors/${seg(p.processor)}` }, names[p.processor] || p.processor) },
        {
          label: 'Status',
          value: (p) => {
            const g = glance(p);
            return h('div', {}, badge(g.state), g.reason && g.state !== 'running' ? h('div', { class: 'reason small', title: g.reason }, g.reason) : null);
          },
        },
        { label: 'Rows/s', value: (p) => fmtNum(glance(p).rowsPerS), class: 'num' },
        { label: 'Last batch', value: (p) => { const g = glance(p); return g.lastBatch === null ? '–' : h('span', {}, `#${g.lastBatch} `, h('span', { class: 'dim' }, fmtAgo(g.lastBatchMs))); } },
        { label: 'Lag (rows)', value: (p) => fmtInt(glance(p).lag), class: 'num' },
        { label: 'Processed', value: (p) => fmtInt(p.rows_processed), class: 'num' },
        { label: 'Actions', value: (p) => actions(p) },
      ], pipelines, { label: 'Pipelines', class: 'pipelines' })
      : empty('No pipelines yet.', processors.length
        ? h('button', { type: 'button', class: 'primary', onclick: () => createDialog() }, 'Create your first pipeline')
        : h('p', {}, 'Upload a processor first: ', h('a', { href: '#/processors' }, 'Processors'), '.')));
  }

  function actions(p) {
    const running = ['running', 'starting', 'retrying'].includes(glance(p).state);
    return h('button', {
      type: 'button', class: 'small',
      onclick: async () => {
        try {
          await post(`/v1/pipelines/${seg(p.id)}/${running ? 'stop' : 'start'}`);
          notify(`${p.name || p.id} ${running ? 'stopped' : 'started'}`);
          await refresh();
        } catch (err) { fill(status, errorBox(err, `Cannot ${running ? 'stop' : 'start'} ${p.id}`)); }
      },
    }, running ? 'Stop' : 'Start');
  }

  async function createDialog() {
    // The Kafka brokers granted now (the admin may have changed them since login).
    let brokers;
    try {
      const [procs, me] = await Promise.all([processors === null ? get('/v1/processors') : null, get('/v1/tenant')]);
      if (procs) processors = procs.processors;
      brokers = me.kafka_brokers || [];
    } catch (err) {
      fill(status, errorBox(err, 'Cannot open the form'));
      return;
    }
    const form = createForm(processors, params.get('processor'), brokers, (created) => {
      d.close();
      notify(`Pipeline ${created.id} created`);
      go(`#/pipelines/${seg(created.id)}`);
    });
    const d = dialog('New pipeline', form);
  }

  every(2000, () => refresh(false), main);
  if (params.get('processor')) {
    await refresh();
    await createDialog();
  }
}

/**
 * One Kafka cluster's fields: its brokers (the tenant's grant offered) and client options.
 * `prefix` keeps two clusters' field names apart. `spec()` gives the API's
 * `{brokers, options}`.
 */
function clusterFields(legend, cls, prefix, brokers) {
  const brokersIn = h('input', { name: `${prefix}kafka_brokers`, value: brokers.join(', '), list: 'granted-brokers', placeholder: 'kafka-1.internal:9092', spellcheck: 'false' });
  const protocol = h('select', { name: `${prefix}security_protocol` },
    ['', 'PLAINTEXT', 'SASL_PLAINTEXT', 'SASL_SSL', 'SSL'].map((v) => h('option', { value: v }, v || 'default (PLAINTEXT)')));
  const mechanism = h('select', { name: `${prefix}sasl_mechanism` },
    ['', 'PLAIN', 'SCRAM-SHA-256', 'SCRAM-SHA-512'].map((v) => h('option', { value: v }, v || 'none')));
  const username = h('input', { name: `${prefix}sasl_username`, autocomplete: 'off', spellcheck: 'false' });
  const password = h('input', { name: `${prefix}sasl_password`, type: 'password', autocomplete: 'new-password' });
  const fieldset = h('fieldset', { class: cls, hidden: true },
    h('legend', {}, legend),
    field('Brokers', brokersIn, brokers.length
      ? `Granted to you: ${brokers.join(', ')}.`
      : 'No brokers are granted to you yet: the admin grants them.'),
    h('div', { class: 'grid2' }, field('Security protocol', protocol), field('SASL mechanism', mechanism)),
    h('div', { class: 'grid2' }, field('SASL username', username), field('SASL password', password)));
  const spec = () => {
    const options = {};
    if (protocol.value) options['security.protocol'] = protocol.value;
    if (mechanism.value) options['sasl.mechanism'] = mechanism.value;
    if (username.value) options['sasl.username'] = username.value;
    if (password.value) options['sasl.password'] = password.value;
    const cluster = { brokers: brokersIn.value.trim() };
    if (Object.keys(options).length) cluster.options = options;
    return cluster;
  };
  return { fieldset, spec };
}

/**
 * The Kafka part of the create form: where the rows come from and go to. One cluster serves
 * both sides unless the sink is set to another.
 */
function kafkaFields(brokers) {
  const source = h('select', { name: 'source' },
    h('option', { value: 'http' }, 'HTTP ingest'), h('option', { value: 'kafka' }, 'Kafka topics'));
  const sink = h('select', { name: 'sink' },
    h('option', { value: 'output' }, 'Output log'), h('option', { value: 'kafka' }, 'Kafka topic'));
  const list = h('datalist', { id: 'granted-brokers' }, brokers.map((b) => h('option', { value: b })));
  const cluster = clusterFields('Kafka cluster', 'kafka', '', brokers);
  const sinkCluster = clusterFields('The sink\'s Kafka cluster', 'kafka-sink-cluster', 'sink_', brokers);
  const otherCluster = h('input', { type: 'checkbox', name: 'sink_other_cluster' });
  const otherClusterRow = h('label', { class: 'check' }, otherCluster, ' on another cluster than the source');
  const topics = h('input', { name: 'kafka_topics', placeholder: 'clicks or clicks, views', spellcheck: 'false' });
  const starting = h('select', { name: 'starting_offsets' },
    h('option', { value: 'earliest' }, 'earliest'), h('option', { value: 'latest' }, 'latest'));
  const maxRecords = h('input', { name: 'max_records_per_batch', type: 'number', min: '1', placeholder: 'no limit' });
  const topic = h('input', { name: 'kafka_topic', placeholder: 'counts', spellcheck: 'false' });
  const key = h('input', { name: 'kafka_key', placeholder: 'the key columns', spellcheck: 'false' });
  const delivery = h('select', { name: 'delivery' },
    h('option', { value: 'exactly-once' }, 'exactly-once'), h('option', { value: 'at-least-once' }, 'at-least-once'));

  const from = h('fieldset', { class: 'kafka-source', hidden: true },
    h('legend', {}, 'Kafka source'),
    field('Topics', topics, 'Comma-separated. Each record\'s value is one JSON row.'),
    h('div', { class: 'grid2' },
      field('Starting offsets', starting, 'Where a new pipeline starts reading.'),
      field('Max records per batch', maxRecords)));
  const to = h('fieldset', { class: 'kafka-sink', hidden: true },
    h('legend', {}, 'Kafka sink'),
    h('div', { class: 'grid2' },
      field('Topic', topic, 'One transaction per batch when exactly-once.'),
      field('Record key columns', key, 'Output columns, comma-separated; default: the pipeline\'s key columns.')),
    field('Delivery', delivery),
    otherClusterRow);
  // With Kafka on both sides the sink may write to another cluster; with Kafka on one
  // side, the one cluster is that side's.
  const sinkElsewhere = () => source.value === 'kafka' && otherCluster.checked;
  const show = () => {
    from.hidden = source.value !== 'kafka';
    to.hidden = sink.value !== 'kafka';
    cluster.fieldset.hidden = from.hidden && to.hidden;
    otherClusterRow.hidden = from.hidden;
    sinkCluster.fieldset.hidden = to.hidden || !sinkElsewhere();
  };
  for (const control of [source, sink, otherCluster]) control.addEventListener('change', show);

  /** Sets `body.source` and `body.sink` when either side is Kafka. */
  function apply(body) {
    if (source.value === 'kafka') {
      body.source = { kafka: { ...cluster.spec(), topics: listItems(topics), starting_offsets: starting.value } };
      if (maxRecords.value) body.source.kafka.max_records_per_batch = Number(maxRecords.value);
    }
    if (sink.value === 'kafka') {
      const sinkSpec = sinkElsewhere() ? sinkCluster.spec() : cluster.spec();
      body.sink = { kafka: { ...sinkSpec, topic: topic.value.trim(), delivery: delivery.value } };
      const recordKey = listItems(key);
      if (recordKey.length) body.sink.kafka.key = recordKey;
    }
  }

  return {
    sides: h('div', { class: 'grid2' }, field('Source', source), field('Sink', sink)),
    fieldsets: [list, cluster.fieldset, from, to, sinkCluster.fieldset],
    apply,
  };
}

/** The create form. Fields map one to one onto POST /v1/pipelines. */
function createForm(processors, preselect, brokers, done) {
  const proc = h('select', { name: 'processor', required: true },
    processors.map((p) => h('option', { value: p.id, selected: p.id === preselect }, `${p.name} (${p.id})`)));
  const name = h('input', { name: 'name', placeholder: 'optional' });
  const key = h('input', { name: 'key', required: true, placeholder: 'user or user,region', spellcheck: 'false' });
  const timeMode = h('select', { name: 'time_mode' },
    ['none', 'processing-time', 'event-time'].map((m) => h('option', { value: m }, m)));
  const outputMode = h('select', { name: 'output_mode' },
    ['update', 'append'].map((m) => h('option', { value: m }, m)));
  const etColumn = h('input', { name: 'event_time_column', placeholder: 'ts', spellcheck: 'false' });
  const etDelay = h('input', { name: 'watermark_delay_ms', type: 'number', min: '0', value: '10000' });
  const partitions = h('input', { name: 'partitions', type: 'number', min: '1', max: '1024', value: '4' });
  const trigger = h('input', { name: 'trigger_interval_ms', type: 'number', min: '10', max: '86400000', value: '1000' });
  const outEt = h('input', { name: 'output_event_time_column', placeholder: 'optional', spellcheck: 'false' });
  const eventTime = h('fieldset', { class: 'event-time', hidden: true },
    h('legend', {}, 'Event time'),
    h('div', { class: 'grid2' },
      field('Event-time column', etColumn),
      field('Watermark delay (ms)', etDelay, 'The watermark trails the largest event time by this much; older rows are dropped as late.')));
  const suggestKey = () => {
    const p = processors.find((x) => x.id === proc.value);
    if (!p || key.value) return;
    // The counter-style examples key on the first string column of the input schema.
    const first = p.input_schema && p.input_schema.split(',')[0].trim().split(/\s+/)[0];
    if (first) key.placeholder = `e.g. ${first}`;
  };
  proc.addEventListener('change', suggestKey);
  suggestKey();
  timeMode.addEventListener('change', () => { eventTime.hidden = timeMode.value !== 'event-time'; });
  const kafka = kafkaFields(brokers);
  const status = h('div', { 'aria-live': 'assertive' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Create and start');
  if (!processors.length) {
    return empty('Upload a processor first.', h('a', { href: '#/processors' }, 'Processors'));
  }
  return h('form', {
    class: 'create-form',
    onsubmit: async (e) => {
      e.preventDefault();
      const body = {
        processor: proc.value,
        key: listItems(key),
        time_mode: timeMode.value,
        output_mode: outputMode.value,
        partitions: Number(partitions.value),
        trigger_interval_ms: Number(trigger.value),
      };
      if (name.value.trim()) body.name = name.value.trim();
      if (outEt.value.trim()) body.output_event_time_column = outEt.value.trim();
      if (timeMode.value === 'event-time') {
        body.event_time = { column: etColumn.value.trim(), watermark_delay_ms: Number(etDelay.value) };
      }
      kafka.apply(body);
      submit.disabled = true;
      fill(status);
      try {
        done(await post('/v1/pipelines', body));
      } catch (err) {
        fill(status, errorBox(err, 'The pipeline was not created'));
        submit.disabled = false;
      }
    },
  },
  field('Processor', proc),
  h('div', { class: 'grid2' },
    field('Key columns', key, 'Comma-separated; rows are grouped by these columns.'),
    field('Name', name)),
  h('div', { class: 'grid2' }, field('Time mode', timeMode), field('Output mode', outputMode)),
  eventTime,
  kafka.sides,
  ...kafka.fieldsets,
  h('div', { class: 'grid3' },
    field('Partitions', partitions),
    field('Trigger interval (ms)', trigger),
    field('Output event-time column', outEt)),
  status,
  h('div', { class: 'dialog-actions' }, submit));
}
