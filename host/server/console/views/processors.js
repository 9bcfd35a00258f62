// Processors: the list, uploading a .wasm by drag and drop (or the file picker), and one
// processor's schemas and state variables.

import { get, post, del, seg } from '../api.js';
import { h, fill, table, empty, errorBox, loading, notify, fmtBytes, fmtAgo } from '../ui.js';
import { go } from '../app.js';

/** The drop zone: a focusable area (Enter/Space opens the file picker) taking one .wasm. */
function dropZone(onUpload) {
  const input = h('input', { type: 'file', accept: '.wasm,application/wasm', class: 'visually-hidden', id: 'upload-file', 'aria-label': 'Processor .wasm file' });
  const status = h('div', { class: 'upload-status', 'aria-live': 'polite' });
  const zone = h('div', {
    class: 'dropzone', tabindex: '0', role: 'button',
    'aria-describedby': 'dropzone-hint',
    onkeydown: (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); input.click(); } },
    onclick: () => input.click(),
    ondragover: (e) => { e.preventDefault(); zone.classList.add('over'); },
    ondragleave: () => zone.classList.remove('over'),
    ondrop: (e) => {
      e.preventDefault();
      zone.classList.remove('over');
      const file = e.dataTransfer.files[0];
      if (file) upload(file);
    },
  },
  h('div', { class: 'dz-title' }, 'Drop a processor .wasm here'),
  h('div', { class: 'dim', id: 'dropzone-hint' }, 'or press Enter to choose a file. It is checked against the world and precompiled.'));
  input.addEventListener('change', () => { if (input.files[0]) upload(input.files[0]); input.value = ''; });

  async function upload(file) {
    fill(status, loading(`Uploading ${file.name} (${fmtBytes(file.size)})…`));
    try {
      const p = await post('/v1/processors', file, 'application/wasm');
      fill(status, h('div', { class: 'ok-box', role: 'status' }, 'Uploaded ', h('a', { href: `#/processors/${seg(p.id)}` }, p.name), ` as `, h('code', {}, p.id)));
      notify(`Processor ${p.name} uploaded`);
      onUpload(p);
    } catch (err) {
      fill(status, errorBox(err, `${file.name} was refused`));
    }
  }
  return h('section', { class: 'card' }, h('h2', {}, 'Upload'), zone, input, status);
}

export async function processorsView(main) {
  const list = h('div', {}, loading());
  fill(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Processors')),
    dropZone(() => refresh()),
    h('section', { class: 'card' }, h('h2', {}, 'Uploaded'), list));
  async function refresh() {
    try {
      const { processors } = await get('/v1/processors');
      processors.sort((a, b) => b.uploaded_ms - a.uploaded_ms);
      fill(list, processors.length
        ? table([
          { label: 'Name', value: (p) => h('a', { href: `#/processors/${seg(p.id)}` }, p.name) },
          { label: 'Id', value: (p) => h('code', {}, p.id) },
          { label: 'Output schema', value: (p) => h('code', { class: 'wrap' }, p.output_schema) },
          { label: 'State variables', value: (p) => p.state_variables.map((v) => v.name).join(', ') || '–' },
          { label: 'Size', value: (p) => fmtBytes(p.size_bytes), class: 'num' },
          { label: 'Uploaded', value: (p) => fmtAgo(p.uploaded_ms) },
        ], processors, { label: 'Processors' })
        : empty('No processors yet. Drop a .wasm component above to upload one.'));
    } catch (err) {
      fill(list, errorBox(err));
    }
  }
  await refresh();
}

export async function processorView(main, id) {
  fill(main, loading());
  const p = await get(`/v1/processors/${seg(id)}`);
  const vars = table([
    { label: 'Name', value: (v) => h('strong', {}, v.name) },
    { label: 'Kind', value: (v) => v.kind },
    { label: 'Key schema', value: (v) => h('code', {}, v.key_schema || '–') },
    { label: 'Value schema', value: (v) => h('code', { class: 'wrap' }, v.value_schema) },
    { label: 'TTL', value: (v) => (v.ttl_ms ? `${v.ttl_ms} ms` : '–') },
  ], p.state_variables, { empty: 'This processor declares no state variables.', label: 'State variables' });
  const status = h('div', { 'aria-live': 'polite' });
  fill(main,
    h('div', { class: 'page-head' },
      h('div', {}, h('a', { href: '#/processors', class: 'crumb' }, 'Processors'), h('h1', {}, p.name)),
      h('div', { class: 'actions' },
        h('a', { class: 'button', href: `#/pipelines?processor=${seg(p.id)}` }, 'New pipeline…'),
        h('button', {
          type: 'button', class: 'danger',
          onclick: async () => {
            if (!confirm(`Delete processor ${p.name} (${p.id})?`)) return;
            try {
              await del(`/v1/processors/${seg(p.id)}`);
              notify('Processor deleted');
              go('#/processors');
            } catch (err) { fill(status, errorBox(err, 'Cannot delete')); }
          },
        }, 'Delete'))),
    status,
    h('section', { class: 'card' },
      h('dl', { class: 'facts' },
        h('dt', {}, 'Id'), h('dd', {}, h('code', {}, p.id)),
        h('dt', {}, 'Content hash'), h('dd', {}, h('code', { class: 'wrap' }, p.hash)),
        h('dt', {}, 'Size'), h('dd', {}, fmtBytes(p.size_bytes)),
        h('dt', {}, 'Uploaded'), h('dd', {}, fmtAgo(p.uploaded_ms)),
        h('dt', {}, 'Output schema'), h('dd', {}, h('code', { class: 'wrap' }, p.output_schema)),
        h('dt', {}, 'Input schema'), h('dd', {}, p.input_schema ? h('code', { class: 'wrap' }, p.input_schema) : h('span', { class: 'dim' }, 'not declared (rows are passed as JSON)')),
        h('dt', {}, 'Output event time'), h('dd', {}, p.output_event_time_column || '–'))),
    h('section', { class: 'card' }, h('h2', {}, 'State variables'), vars));
}
