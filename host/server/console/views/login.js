// Logging in: the tenant's or the admin's token, checked against the server and kept in
// sessionStorage for this tab only.

import { get, session, ApiError } from '../api.js';
import { h, field, fill, errorBox } from '../ui.js';

export function loginView(done) {
  const input = h('input', {
    type: 'password', name: 'token', autocomplete: 'current-password', required: true,
    spellcheck: 'false', placeholder: 'sbx_… or the admin token',
  });
  const status = h('div', { 'aria-live': 'assertive' });
  const button = h('button', { type: 'submit', class: 'primary' }, 'Log in');
  const form = h('form', {
    class: 'login-form',
    onsubmit: async (e) => {
      e.preventDefault();
      const token = input.value.trim();
      if (!token) { fill(status, errorBox({ message: 'Paste a token first.' }, 'No token')); return; }
      button.disabled = true;
      fill(status);
      session.token = token;
      try {
        session.who = await get('/v1/whoami');
        done();
      } catch (err) {
        session.token = null;
        const title = err instanceof ApiError && err.status === 401 ? 'This token is not valid' : 'Cannot log in';
        fill(status, errorBox(err, title));
        button.disabled = false;
        input.focus();
      }
    },
  },
  h('h1', {}, 'Statebox console'),
  h('p', { class: 'dim' }, 'Deploy, watch and debug stateful stream processors.'),
  field('API token', input, 'A tenant token shows that tenant’s processors and pipelines; the admin token shows tenants, quotas and grants. It stays in this browser tab only.'),
  button,
  status);
  setTimeout(() => input.focus(), 0);
  return h('main', { id: 'main', class: 'login' }, form);
}
