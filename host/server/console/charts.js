// Time-series charts over recent batches, on uPlot (vendored, MIT). One chart per metric
// family; x is the batch's time. Each chart's container carries data-points (batches
// plotted), data-last (the newest values) and data-max (each series' largest), which the
// browser tests read.

import uPlot from './vendor/uPlot.esm.js';
import { h, fmtNum, fmtBytes, fmtMs } from './ui.js';

const COLORS = ['#2f6fde', '#e0742b', '#2a9d6f', '#b04fc4', '#c9a227', '#d1495b', '#5c6b7a'];

/**
 * A chart: `series` [{label, value: record => number|null, scale?}], `format` for the
 * y axis; `axes2` names a second scale shown on the right.
 */
export function chart({ title, series, format = fmtNum, right = null, note = null }) {
  const box = h('figure', { class: 'chart', 'data-chart': title, 'data-points': '0' },
    h('figcaption', {}, title, note ? h('span', { class: 'dim small' }, ` ${note}`) : null));
  const plotBox = h('div', { class: 'plot', role: 'img', 'aria-label': `${title}: no batches yet` });
  const legend = h('div', { class: 'legend' });
  box.append(plotBox, legend);
  let plot = null;
  let records = [];

  function options(width) {
    const scales = { x: { time: true } };
    const axes = [
      { stroke: '#6b7785', grid: { stroke: '#eef0f3' }, ticks: { stroke: '#dde1e6' } },
      { stroke: '#6b7785', grid: { stroke: '#eef0f3' }, ticks: { stroke: '#dde1e6' }, size: 60, values: (u, vals) => vals.map((v) => format(v)) },
    ];
    if (right) {
      scales[right.scale] = {};
      axes.push({ scale: right.scale, side: 1, stroke: '#6b7785', grid: { show: false }, size: 64, values: (u, vals) => vals.map((v) => right.format(v)) });
    }
    return {
      width,
      height: 180,
      legend: { show: false },
      cursor: { drag: { x: false, y: false } },
      scales,
      axes,
      series: [{}, ...series.map((s, i) => ({
        label: s.label,
        scale: s.scale || 'y',
        stroke: s.color || COLORS[i % COLORS.length],
        width: 1.75,
        points: { size: 4 },
        spanGaps: false,
      }))],
    };
  }

  function data() {
    const xs = records.map((r) => r.timestamp_ms / 1000);
    return [xs, ...series.map((s) => records.map((r, i) => {
      const v = s.value(r, records[i - 1]);
      return v === undefined || v === null || !Number.isFinite(v) ? null : v;
    }))];
  }

  function width() {
    return Math.max(260, plotBox.clientWidth || box.clientWidth || 400);
  }

  function drawLegend() {
    const latest = records[records.length - 1];
    legend.replaceChildren(...series.map((s, i) => {
      const v = latest ? s.value(latest, records[records.length - 2]) : null;
      const f = s.scale && right && s.scale === right.scale ? right.format : format;
      return h('span', { class: 'key' },
        h('span', { class: 'swatch', style: `background:${s.color || COLORS[i % COLORS.length]}` }),
        `${s.label} `, h('strong', {}, v === null || v === undefined ? '–' : f(v)));
    }));
  }

  return {
    el: box,
    /** Plots `recs` (progress records, oldest first). */
    update(recs) {
      records = recs;
      box.dataset.points = String(records.length);
      const d = data();
      box.dataset.last = JSON.stringify(d.slice(1).map((col) => col[col.length - 1] ?? null));
      box.dataset.max = JSON.stringify(d.slice(1).map((col) => col.reduce((m, v) => (v !== null && (m === null || v > m) ? v : m), null)));
      plotBox.setAttribute('aria-label', `${title}: ${records.length} batches`);
      drawLegend();
      if (!records.length) return;
      if (!plot) {
        plot = new uPlot(options(width()), d, plotBox);
      } else {
        plot.setData(d);
      }
    },
    resize() {
      if (plot) plot.setSize({ width: width(), height: 180 });
    },
    destroy() {
      if (plot) plot.destroy();
      plot = null;
    },
  };
}

/** Rows per second between a record and the one before it (Spark's input rate). */
function inputRate(r, prev) {
  if (!prev) return null;
  const dt = (r.timestamp_ms - prev.timestamp_ms) / 1000;
  return dt > 0 ? r.input_rows / dt : null;
}

/** The pipeline page's charts; `eventTime` adds the watermark gap. */
export function pipelineCharts(eventTime) {
  const list = [
    chart({
      title: 'Rows per second',
      series: [
        { label: 'input', value: inputRate },
        { label: 'processed', value: (r) => r.rows_per_s },
      ],
    }),
    chart({
      title: 'Batch duration by phase',
      format: (v) => fmtMs(v),
      series: [
        { label: 'read', value: (r) => r.read_ms },
        { label: 'process', value: (r) => r.process_ms },
        { label: 'timers', value: (r) => r.timers_ms },
        { label: 'TTL', value: (r) => r.ttl_ms },
        { label: 'commit', value: (r) => r.commit_ms },
        { label: 'total', value: (r) => r.duration_ms, color: '#5c6b7a' },
      ],
    }),
    chart({
      title: 'State',
      series: [
        { label: 'rows', value: (r) => r.state_rows_total },
        { label: 'bytes on disk', value: (r) => r.state_bytes_on_disk, scale: 'bytes' },
      ],
      format: fmtNum,
      right: { scale: 'bytes', format: fmtBytes },
    }),
    chart({
      title: 'Timers',
      series: [
        { label: 'registered', value: (r) => r.timers_registered },
        { label: 'fired', value: (r) => r.timers_fired },
        { label: 'pending', value: (r) => r.timers_total },
      ],
    }),
    chart({
      title: 'Expired and late',
      series: [
        { label: 'values expired (TTL)', value: (r) => r.ttl_removed },
        { label: 'late rows dropped', value: (r) => r.late_rows },
      ],
    }),
  ];
  if (eventTime) {
    list.push(chart({
      title: 'Watermark gap',
      note: '(batch time − watermark)',
      format: (v) => fmtMs(v),
      // Until the first event time is seen the watermark is 0 (or -1): no gap to show.
      series: [{ label: 'gap', value: (r) => (r.watermark_ms > 0 ? r.timestamp_ms - r.watermark_ms : null) }],
    }));
  }
  return list;
}
