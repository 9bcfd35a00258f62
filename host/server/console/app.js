// The console's shell: the header, the hash router and the polling each page registers.
// Routes live in the fragment (#/pipelines/pl_x) so any page can be bookmarked; nothing
// secret is ever in it.

import { get, session, ApiError } from './api.js';
import { h, fill, errorBox } from './ui.js';
import { loginView } from './views/login.js';
import { processorsView, processorView } from './views/processors.js';
import { pipelinesView } from './views/pipelines.js';
import { pipelineView } from './views/pipeline.js';
import { adminView } from './views/admin.js';

const routes = [
  [/^#\/pipelines\/([^/]+)(?:\/([a-z]+))?$/, pipelineView, 'tenant'],
  [/^#\/pipelines(?:\?(.*))?$/, pipelinesView, 'tenant'],
  [/^#\/processors\/([^/]+)$/, processorView, 'tenant'],
  [/^#\/processors$/, processorsView, 'tenant'],
  [/^#\/admin$/, adminView, 'admin'],
];

/** What the current page started (timers, listeners): stopped when the page changes. */
let cleanups = [];

/** Registers something to undo when the user leaves the page. */
export function onLeave(f) { cleanups.push(f); }

/**
 * Calls `f` now and every `ms` while the page `owner` (its main element) is shown; skipped
 * while the browser tab is hidden. A page left before it got here never starts polling.
 */
export function every(ms, f, owner) {
  let stopped = false;
  let timer = null;
  const tick = async () => {
    if (stopped || !owner.isConnected) return;
    if (!document.hidden) {
      try { await f(); } catch (e) { console.warn('refresh failed', e); }
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  onLeave(() => { stopped = true; clearTimeout(timer); });
}

function leave() {
  for (const f of cleanups) {
    try { f(); } catch { /* a cleanup must not stop the others */ }
  }
  cleanups = [];
}

const root = () => document.getElementById('app');

function shell() {
  const who = session.who;
  const link = (href, label) => h('a', { href, 'data-nav': href }, label);
  const nav = who.role === 'admin'
    ? [link('#/admin', 'Tenants')]
    : [link('#/pipelines', 'Pipelines'), link('#/processors', 'Processors')];
  const main = h('main', { id: 'main', tabindex: '-1' });
  fill(root(),
    h('header', { class: 'top' },
      h('a', { class: 'brand', href: who.role === 'admin' ? '#/admin' : '#/pipelines' },
        h('span', { class: 'logo', 'aria-hidden': 'true' }, '▦'), 'Statebox'),
      h('nav', { 'aria-label': 'Main' }, nav),
      h('div', { class: 'who' },
        h('span', { class: 'role' }, who.role === 'admin' ? 'admin' : `tenant ${who.name || ''}`),
        who.role === 'tenant' ? h('span', { class: 'mono dim' }, who.tenant) : null,
        h('button', { type: 'button', class: 'link', onclick: logout }, 'Log out'))),
    main,
    h('div', { id: 'notices', class: 'notices', 'aria-live': 'polite' }));
  return main;
}

export function logout() {
  session.token = null;
  session.who = null;
  leave();
  location.hash = '#/login';
  render();
}

/** Finds out whose token is stored; false if none or it no longer works. */
async function identify() {
  if (!session.token) return false;
  if (session.who) return true;
  try {
    session.who = await get('/v1/whoami');
    return true;
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      session.token = null;
      return false;
    }
    throw e;
  }
}

export async function render() {
  leave();
  let known;
  try {
    known = await identify();
  } catch (e) {
    fill(root(), h('main', { id: 'main' }, errorBox(e, 'The server cannot be reached')));
    return;
  }
  if (!known) {
    if (location.hash !== '#/login') history.replaceState(null, '', '#/login');
    fill(root(), loginView(() => {
      location.hash = session.who.role === 'admin' ? '#/admin' : '#/pipelines';
      render();
    }));
    return;
  }
  const hash = location.hash || '';
  const match = routes.find(([re, , role]) => role === session.who.role && re.test(hash));
  if (!match) {
    history.replaceState(null, '', session.who.role === 'admin' ? '#/admin' : '#/pipelines');
    return render();
  }
  const main = shell();
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (hash.startsWith(a.dataset.nav)) a.setAttribute('aria-current', 'page');
  }
  const [re, view] = match;
  const args = hash.match(re).slice(1).map((s) => (s === undefined ? s : decodeURIComponent(s)));
  try {
    await view(main, ...args);
  } catch (e) {
    fill(main, errorBox(e));
  }
}

/** Goes to a page; `replace` keeps the history entry (tabs inside a page). */
export function go(hash, replace = false) {
  if (replace) {
    history.replaceState(null, '', hash);
  } else {
    location.hash = hash;
  }
}

// Tabs inside a page change the fragment with replaceState, which fires no hashchange.
window.addEventListener('hashchange', () => render());

document.addEventListener('click', (e) => {
  const skip = e.target.closest('.skip');
  if (skip) {
    e.preventDefault();
    const main = document.getElementById('main');
    if (main) main.focus();
  }
});

render();
