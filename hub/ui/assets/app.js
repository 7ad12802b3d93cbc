// Tether console: a small single-page app over the hub's API. No build step,
// no framework; every value from the server reaches the page as text
// (textContent), never as markup.
'use strict';

(function () {
  let me = null;          // GET /ui/api/me: operator, admin, csrf
  let cleanup = [];       // closers of the current page (event streams, sockets)

  // --- helpers ----------------------------------------------------------

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (k === 'text') e.textContent = v;
      else e.setAttribute(k, v === true ? '' : v);
    }
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined) continue;
      e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return e;
  }

  async function call(method, path, body) {
    const opts = { method, headers: {}, credentials: 'same-origin' };
    if (method !== 'GET') opts.headers['X-CSRF-Token'] = me ? me.csrf : '';
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    const r = await fetch(path, opts);
    if (r.status === 401) { signedOut(); throw new Error('signed out'); }
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = text; }
    if (!r.ok) throw new Error((data && data.error) || (r.status + ' ' + r.statusText));
    return data;
  }
  const api = (method, path, body) => call(method, '/ui/api' + path, body);

  function stateBadge(s) { return el('span', { class: 'state state-' + s, text: s }); }
  function labels(m) { return Object.entries(m || {}).sort().map(([k, v]) => el('span', { class: 'label', text: k + '=' + v })); }
  function ago(t) {
    if (!t || t.startsWith('0001')) return 'never';
    const s = Math.round((Date.now() - Date.parse(t)) / 1000);
    if (s < 5) return 'now';
    if (s < 120) return s + 's ago';
    if (s < 7200) return Math.round(s / 60) + 'm ago';
    if (s < 172800) return Math.round(s / 3600) + 'h ago';
    return Math.round(s / 86400) + 'd ago';
  }
  // onChange wraps a view's render so that data equal to what it last
  // rendered is skipped: a view polled every few seconds would otherwise
  // replace its buttons while the pointer is on them and swallow the click.
  // forget() makes the next call render whatever it gets (after an error
  // shown in the view's place).
  function onChange(render) {
    let last;
    const f = d => { const s = JSON.stringify(d); if (s !== last) { last = s; render(d); } };
    f.forget = () => { last = undefined; };
    return f;
  }
  function when(t) { return t && !t.startsWith('0001') ? new Date(t).toLocaleString() : '—'; }
  function showError(where, err) { where.replaceChildren(el('p', { class: 'error', text: String(err.message || err) })); }

  function signedOut() {
    cleanupPage();
    document.getElementById('main').replaceChildren(
      el('h1', { text: 'Signed out' }),
      el('p', {}, 'Run ', el('code', { text: 'tether ui' }), ' for a new one-time sign-in link.'));
    document.getElementById('who').textContent = '';
    document.getElementById('signout').hidden = true;
    me = null;
  }

  function cleanupPage() { cleanup.forEach(f => { try { f(); } catch (e) { /* closing */ } }); cleanup = []; }

  // --- routing ----------------------------------------------------------

  function go(path) { history.pushState(null, '', path); route(); }

  document.addEventListener('click', ev => {
    const a = ev.target.closest('a');
    if (!a || !a.getAttribute('href') || !a.getAttribute('href').startsWith('/ui/') || ev.ctrlKey || ev.metaKey) return;
    ev.preventDefault();
    go(a.getAttribute('href'));
  });
  window.addEventListener('popstate', route);

  function route() {
    cleanupPage();
    if (!me) return;
    const p = location.pathname;
    const main = document.getElementById('main');
    main.replaceChildren();
    let m, section = 'fleet';
    if ((m = p.match(/^\/ui\/nodes\/([^/]+)$/))) nodePage(main, decodeURIComponent(m[1]));
    else if ((m = p.match(/^\/ui\/jobs\/([^/]+)$/))) { section = 'jobs'; jobPage(main, decodeURIComponent(m[1])); }
    else if (p === '/ui/jobs') { section = 'jobs'; jobsPage(main); }
    else if (p === '/ui/audit') { section = 'audit'; auditPage(main); }
    else if (p === '/ui/upgrades' && me.upgrades) { section = 'upgrades'; upgradesPage(main); }
    else if ((m = p.match(/^\/ui\/upgrades\/([^/]+)$/)) && me.upgrades) { section = 'upgrades'; rolloutPage(main, decodeURIComponent(m[1])); }
    else fleetPage(main);
    document.querySelectorAll('#nav a').forEach(a => a.classList.toggle('active', a.dataset.nav === section));
  }

  // --- fleet ------------------------------------------------------------

  const fleetState = { q: '', state: '', label: '', version: '', os: '', sort: 'name', offset: 0, limit: 50 };

  function fleetPage(main) {
    const f = fleetState;
    const counts = el('div', { class: 'counts', id: 'counts' });
    const table = el('div', { id: 'fleet' });
    const status = el('span', { class: 'live', id: 'live' });
    const search = el('input', { id: 'search', type: 'search', placeholder: 'search name or hostname', value: f.q });
    const label = el('input', { id: 'label-filter', placeholder: 'labels: site=berlin,env=dev', value: f.label, size: 28 });
    const state = el('select', { id: 'state-filter' },
      ['', 'online', 'stale', 'offline', 'revoked'].map(s => el('option', { value: s, text: s || 'any state', selected: s === f.state })));
    const version = el('select', { id: 'version-filter' }, el('option', { value: '', text: 'any version' }));
    const os = el('select', { id: 'os-filter' }, el('option', { value: '', text: 'any OS' }));
    const sort = el('select', { id: 'sort' },
      [['name', 'name'], ['state', 'state'], ['site', 'site'], ['version', 'agent version'], ['os', 'OS'], ['-last_seen', 'last seen (newest)'], ['last_seen', 'last seen (oldest)']]
        .map(([v, t]) => el('option', { value: v, text: 'sort: ' + t, selected: v === f.sort })));
    let timer = null;
    const changed = () => { f.q = search.value.trim(); f.label = label.value.trim(); f.state = state.value; f.version = version.value; f.os = os.value; f.sort = sort.value; f.offset = 0; load(); };
    search.addEventListener('input', () => { clearTimeout(timer); timer = setTimeout(changed, 200); });
    label.addEventListener('change', changed);
    [state, version, os, sort].forEach(s => s.addEventListener('change', changed));

    main.append(el('div', { class: 'row' }, el('h1', { text: 'Fleet' }), status), counts,
      el('div', { class: 'filters' }, search, label, state, version, os, sort), table);

    function fillMenu(sel, m, cur) {
      const keep = sel.value;
      sel.replaceChildren(sel.firstChild);
      Object.keys(m).sort().forEach(k => sel.append(el('option', { value: k, text: (k || '(none)') + ' (' + m[k] + ')', selected: k === cur })));
      sel.value = keep;
    }

    async function load() {
      const qs = new URLSearchParams();
      for (const k of ['q', 'state', 'label', 'version', 'os', 'sort']) if (f[k]) qs.set(k, f[k]);
      qs.set('offset', f.offset); qs.set('limit', f.limit);
      let page;
      try { page = await api('GET', '/fleet?' + qs); } catch (e) { showError(table, e); return; }
      counts.replaceChildren(
        el('div', { class: 'count', id: 'count-total' }, el('b', { text: page.matched }), page.matched === page.total ? 'nodes' : 'of ' + page.total + ' nodes'),
        ...['online', 'stale', 'offline', 'revoked'].map(s => el('div', {
          class: 'count', id: 'count-' + s, onclick: () => { state.value = f.state === s ? '' : s; changed(); }
        }, el('b', { text: page.counts[s] || 0 }), stateBadge(s))));
      fillMenu(version, page.versions, f.version);
      fillMenu(os, page.oses, f.os);
      const head = el('tr', {}, ['name', 'state', 'site', 'labels', 'version', 'OS', 'transport', 'last seen'].map(h => el('th', { text: h })));
      const rows = page.nodes.map(n => el('tr', { 'data-node': n.name, 'data-state': n.state },
        el('td', {}, el('a', { href: '/ui/nodes/' + encodeURIComponent(n.name), text: n.name })),
        el('td', {}, stateBadge(n.state)), el('td', { text: n.site || '—' }), el('td', {}, labels(n.labels)),
        el('td', { text: n.agent_version || '—' }), el('td', { text: [n.os, n.arch].filter(Boolean).join(' ') || '—' }),
        el('td', { text: n.transport || '—' }), el('td', { text: n.state === 'online' ? 'now' : ago(n.last_seen) })));
      const last = f.offset + page.nodes.length;
      table.replaceChildren(el('table', { id: 'fleet-table' }, el('thead', {}, head), el('tbody', {}, rows)),
        el('div', { class: 'pager' },
          el('button', { id: 'prev', disabled: f.offset === 0, onclick: () => { f.offset = Math.max(0, f.offset - f.limit); load(); } }, '‹ prev'),
          el('span', { class: 'muted', text: page.matched ? (f.offset + 1) + '–' + last + ' of ' + page.matched : 'no node matches' }),
          el('button', { id: 'next', disabled: last >= page.matched, onclick: () => { f.offset += f.limit; load(); } }, 'next ›')));
      window.tetherFleetRendered = performance.now(); // for the scale test's timings
    }
    load();
    const es = new EventSource('/ui/api/fleet/events');
    es.addEventListener('open', () => { status.textContent = '● live'; });
    es.addEventListener('fleet', () => load());
    es.addEventListener('signedout', () => signedOut());
    es.addEventListener('error', () => { status.textContent = '○ reconnecting'; });
    cleanup.push(() => es.close());
  }

  // --- node -------------------------------------------------------------

  async function nodePage(main, name) {
    const errBox = el('div');
    main.append(el('p', {}, el('a', { href: '/ui/', text: '← fleet' })), errBox);
    let n;
    try { n = await api('GET', '/fleet/nodes/' + encodeURIComponent(name)); } catch (e) { showError(errBox, e); return; }
    const facts = n.facts || {};
    const dl = el('dl', { class: 'grid', id: 'node-facts' });
    const add = (k, v) => dl.append(el('dt', { text: k }), el('dd', {}, v));
    add('state', stateBadge(n.state));
    add('id', n.id);
    add('site', (n.labels || {}).site || '—');
    add('labels', labels(n.labels));
    add('reported labels', labels(n.reported_labels));
    add('agent version', n.agent_version || '—');
    add('OS', [n.os, n.arch].filter(Boolean).join(' ') || '—');
    add('hostname', n.hostname || '—');
    add('transport', n.transport || '—');
    add('last seen', n.online ? 'now' : when(n.last_seen));
    add('joined', when(n.created_at));
    add('certificate', (n.cert_serial || '—') + ' until ' + when(n.cert_expires));
    for (const [k, v] of Object.entries(facts)) if (v !== '' && v !== null && typeof v !== 'object') add(k.replace(/_/g, ' '), String(v));
    main.append(el('h1', { id: 'node-name', text: n.name }), dl);

    // Terminal: the logins the operator's roles allow here.
    const term = el('section', { id: 'terminal-section' }, el('h2', { text: 'Terminal' }));
    main.append(term);
    if (!n.logins || n.logins.length === 0) {
      term.append(el('p', { class: 'muted', text: me.operator === 'local-admin'
        ? 'The local admin has no terminal: sign in as an operator (tether login, then tether ui).'
        : 'Your roles allow no login on this node.' }));
    } else {
      const any = n.logins.includes('*');
      const login = any ? el('input', { id: 'login', value: 'root', size: 12 })
        : el('select', { id: 'login' }, n.logins.map(l => el('option', { value: l, text: l })));
      const open = el('button', { id: 'open-terminal', class: 'primary', text: 'Open terminal' });
      const box = el('div', { id: 'terminal', hidden: true });
      const msg = el('span', { id: 'terminal-status', class: 'muted' });
      open.addEventListener('click', () => { open.disabled = true; openTerminal(box, msg, n.name, login.value, () => { open.disabled = false; }); });
      term.append(el('div', { class: 'row' }, 'login', login, open, msg), box);
    }

    if (me.upgrades) {
      const upBox = el('div', { id: 'node-upgrades' }, el('p', { class: 'muted', text: 'loading…' }));
      main.append(el('h2', { text: 'Upgrades' }), upBox);
      nodeUpgrades(upBox, n.name);
    }
    if (me.admin) {
      const jobsBox = el('div', { id: 'node-jobs' }, el('p', { class: 'muted', text: 'loading…' }));
      const auditBox = el('div', { id: 'node-audit' }, el('p', { class: 'muted', text: 'loading…' }));
      main.append(el('h2', { text: 'Jobs' }), jobsBox, el('h2', { text: 'Audit trail' }), auditBox);
      nodeJobs(jobsBox, n.name);
      api('GET', '/v1/audit?limit=50&node=' + encodeURIComponent(n.name))
        .then(evs => auditBox.replaceChildren(auditTable(evs.reverse())), e => showError(auditBox, e));
    }
  }

  async function nodeJobs(box, node) {
    try {
      const jobs = await api('GET', '/v1/jobs?limit=25');
      const rows = [];
      for (const j of jobs) {
        const d = await api('GET', '/v1/jobs/' + j.id);
        const run = (d.nodes || []).find(x => x.node === node);
        if (run) rows.push(el('tr', {}, el('td', {}, el('a', { href: '/ui/jobs/' + j.id, text: j.id })), el('td', { text: jobWhat(j) }),
          el('td', {}, stateBadge(run.state)), el('td', { text: run.exit_code ?? '—' }), el('td', { text: when(j.created_at) })));
      }
      box.replaceChildren(rows.length ? el('table', {}, el('tr', {}, ['job', 'what', 'state here', 'exit', 'created'].map(h => el('th', { text: h }))), rows)
        : el('p', { class: 'muted', text: 'No recent job ran here.' }));
    } catch (e) { showError(box, e); }
  }

  function openTerminal(box, msg, node, login, done) {
    if (!window.Terminal) { msg.textContent = 'terminal library failed to load'; done(); return; }
    box.hidden = false;
    box.replaceChildren();
    const t = new window.Terminal({ cursorBlink: true, fontSize: 14, scrollback: 2000 });
    t.open(box);
    if (t.fit) t.fit();
    t.focus();
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const ws = new WebSocket(proto + '//' + location.host + '/ui/api/terminal?node=' + encodeURIComponent(node) + '&login=' + encodeURIComponent(login));
    ws.binaryType = 'arraybuffer';
    const dec = new TextDecoder();
    let closed = false;
    const finish = why => { if (closed) return; closed = true; msg.textContent = why; window.removeEventListener('resize', onResize); done(); };
    const onResize = () => { if (t.fit) t.fit(); };
    window.addEventListener('resize', onResize);
    ws.onopen = () => {
      ws.send(JSON.stringify({ csrf: me.csrf, cols: t.cols, rows: t.rows }));
      msg.textContent = 'connected to ' + login + '@' + node;
      box.dataset.connected = 'true';
    };
    ws.onmessage = ev => {
      if (typeof ev.data === 'string') {
        const m = JSON.parse(ev.data);
        if (m.type === 'error') { t.write('\r\n\x1b[31m' + m.error + '\x1b[0m\r\n'); finish('refused: ' + m.error); }
        if (m.type === 'exit') finish('shell exited');
        return;
      }
      t.write(dec.decode(ev.data, { stream: true }));
    };
    ws.onclose = () => finish('disconnected');
    t.on('data', d => { if (ws.readyState === 1) ws.send(JSON.stringify({ type: 'input', data: d })); });
    t.on('resize', s => { if (ws.readyState === 1) ws.send(JSON.stringify({ type: 'resize', cols: s.cols, rows: s.rows })); });
    // The terminal's text, for tests and the curious (the canvas renderer
    // draws no DOM text).
    window.tetherTerminal = t;
    window.tetherTerminalText = () => {
      const b = t._core.buffer;
      const out = [];
      for (let i = 0; i < b.lines.length; i++) out.push(b.translateBufferLineToString(i, true));
      return out.join('\n');
    };
    cleanup.push(() => { ws.close(); t.destroy(); });
  }

  // --- jobs -------------------------------------------------------------

  function jobWhat(j) { const s = j.spec || {}; return s.command || s.script_name || j.kind; }

  async function jobsPage(main) {
    main.append(el('h1', { text: 'Jobs' }));
    if (!me.admin) { main.append(el('p', { class: 'muted', text: 'Jobs need the admin role or an API token, as in the API.' })); return; }
    const sel = el('input', { id: 'job-selector', placeholder: 'selector, e.g. env=dev (or * for all)', size: 30 });
    const cmd = el('input', { id: 'job-command', placeholder: 'command, e.g. uptime', size: 50 });
    const err = el('div');
    const run = el('button', { id: 'job-run', class: 'primary', text: 'Run' });
    run.addEventListener('click', async () => {
      err.replaceChildren();
      try {
        const j = await api('POST', '/v1/jobs', { selector: sel.value.trim() || '*', command: cmd.value });
        go('/ui/jobs/' + j.id);
      } catch (e) { showError(err, e); }
    });
    main.append(el('div', { class: 'filters' }, sel, cmd, run), err);
    const box = el('div', { id: 'jobs' });
    main.append(box);
    const show = onChange(jobs => box.replaceChildren(el('table', { id: 'jobs-table' },
      el('tr', {}, ['job', 'what', 'state', 'nodes', 'by', 'created'].map(h => el('th', { text: h }))),
      jobs.map(j => el('tr', { 'data-job': j.id }, el('td', {}, el('a', { href: '/ui/jobs/' + j.id, text: j.id })),
        el('td', { text: jobWhat(j) }), el('td', {}, stateBadge(j.state)),
        el('td', { text: Object.entries(j.counts || {}).map(([k, v]) => v + ' ' + k).join(', ') }),
        el('td', { text: j.created_by }), el('td', { text: when(j.created_at) }))))));
    const load = async () => {
      try { show(await api('GET', '/v1/jobs?limit=100')); } catch (e) { show.forget(); showError(box, e); }
    };
    load();
    const t = setInterval(load, 3000);
    cleanup.push(() => clearInterval(t));
  }

  async function jobPage(main, id) {
    main.append(el('p', {}, el('a', { href: '/ui/jobs', text: '← jobs' })));
    const head = el('div'), nodes = el('div', { id: 'job-nodes' }), log = el('pre', { class: 'log', id: 'job-log' });
    const err = el('div');
    main.append(head, err, el('h2', { text: 'Nodes' }), nodes, el('h2', {}, 'Log ', el('span', { class: 'live', id: 'log-status' })), log);
    const render = onChange(d => {
      head.replaceChildren(el('h1', {}, 'Job ' + d.id + ' ', stateBadge(d.state)),
        el('p', { class: 'muted', text: jobWhat(d) + ' · by ' + d.created_by + ' · ' + when(d.created_at) }),
        el('div', { class: 'row' },
          el('button', { id: 'job-cancel', class: 'danger', disabled: d.state !== 'running', onclick: () => act('cancel', {}) }, 'Cancel'),
          el('button', { id: 'job-rerun-failed', disabled: d.state === 'running', onclick: () => act('rerun', { failed: true }) }, 'Rerun failed')));
      nodes.replaceChildren(el('table', {}, el('tr', {}, ['node', 'state', 'exit', 'error', 'output'].map(h => el('th', { text: h }))),
        (d.nodes || []).map(n => el('tr', { 'data-node': n.node, 'data-state': n.state },
          el('td', {}, el('a', { href: '/ui/nodes/' + encodeURIComponent(n.node), text: n.node })), el('td', {}, stateBadge(n.state)),
          el('td', { text: n.exit_code ?? '—' }), el('td', { text: n.error || '' }), el('td', { text: n.log_bytes + ' B' })))));
    });
    const act = async (what, body) => {
      err.replaceChildren();
      try {
        const r = await api('POST', '/v1/jobs/' + id + '/' + what, body);
        if (what === 'rerun' && r && r.id) go('/ui/jobs/' + r.id); else refresh();
      } catch (e) { showError(err, e); }
    };
    const refresh = async () => { try { render(await api('GET', '/v1/jobs/' + id)); } catch (e) { showError(err, e); } };
    await refresh();
    // Follow the log: the API's NDJSON event stream, read as it comes.
    const ctl = new AbortController();
    cleanup.push(() => ctl.abort());
    const status = document.getElementById('log-status');
    try {
      status.textContent = '● following';
      const r = await fetch('/ui/api/v1/jobs/' + id + '/events', { signal: ctl.signal, credentials: 'same-origin' });
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i); buf = buf.slice(i + 1);
          if (!line) continue;
          const ev = JSON.parse(line);
          if (ev.type === 'output' && ev.data) log.append(document.createTextNode('[' + ev.node + '] ' + new TextDecoder().decode(Uint8Array.from(atob(ev.data), c => c.charCodeAt(0)))));
          else if (ev.type === 'node') { log.append(document.createTextNode('[' + ev.node + '] → ' + ev.state + (ev.exit_code !== undefined ? ' (exit ' + ev.exit_code + ')' : '') + '\n')); refresh(); }
          else if (ev.type === 'error') log.append(document.createTextNode('error: ' + ev.error + '\n'));
          log.scrollTop = log.scrollHeight;
        }
      }
      status.textContent = 'finished';
      refresh();
    } catch (e) { if (e.name !== 'AbortError') status.textContent = 'log stream ended: ' + e.message; }
  }

  // --- upgrades ---------------------------------------------------------

  async function nodeUpgrades(box, node) {
    try {
      const ups = await api('GET', '/v1/upgrades');
      const rows = [];
      for (const u of ups.slice(0, 25)) {
        const d = await api('GET', '/v1/upgrades/' + encodeURIComponent(u.name));
        const un = (d.nodes || []).find(x => x.node === node);
        if (un) rows.push(el('tr', {}, el('td', {}, el('a', { href: '/ui/upgrades/' + encodeURIComponent(u.name), text: u.name })),
          el('td', { text: (u.version || '') + ' ' + u.kind }), el('td', {}, stateBadge(un.step)), el('td', { text: un.from_version || '' }),
          el('td', { text: un.reason || '' }), el('td', { text: when(un.updated_at) })));
      }
      box.replaceChildren(rows.length ? el('table', {}, el('tr', {}, ['upgrade', 'to', 'step here', 'from', 'reason', 'updated'].map(h => el('th', { text: h }))), rows)
        : el('p', { class: 'muted', text: 'No upgrade has targeted this node.' }));
    } catch (e) { showError(box, e); }
  }

  async function upgradesPage(main) {
    main.append(el('h1', { text: 'Upgrades' }));
    const box = el('div', { id: 'upgrades' });
    main.append(box);
    const show = onChange(ups => box.replaceChildren(ups.length === 0 ? el('p', { class: 'muted', text: 'No upgrade yet: create one with tether upgrade create.' }) :
      el('table', { id: 'upgrades-table' }, el('tr', {}, ['upgrade', 'artifact', 'state', 'progress', 'by', 'created'].map(h => el('th', { text: h }))),
        ups.map(u => el('tr', { 'data-upgrade': u.name, 'data-state': u.state },
          el('td', {}, el('a', { href: '/ui/upgrades/' + encodeURIComponent(u.name), text: u.name })),
          el('td', { text: u.kind + ' ' + (u.version || '') + ' ' + u.reference }), el('td', {}, stateBadge(u.state)),
          el('td', { text: stepSummary(u.counts, u.total) }), el('td', { text: u.created_by }), el('td', { text: when(u.created_at) }))))));
    const load = async () => {
      try { show(await api('GET', '/v1/upgrades')); } catch (e) { show.forget(); showError(box, e); }
    };
    load();
    const t = setInterval(load, 3000);
    cleanup.push(() => clearInterval(t));
  }

  function stepSummary(counts, total) {
    const done = (counts || {}).succeeded || 0;
    return done + '/' + total + ' succeeded' + Object.entries(counts || {}).filter(([k]) => k !== 'succeeded').map(([k, v]) => ', ' + v + ' ' + k.replace(/_/g, ' ')).join('');
  }

  async function rolloutPage(main, name) {
    main.append(el('p', {}, el('a', { href: '/ui/upgrades', text: '← upgrades' })));
    const head = el('div'), err = el('div'), body = el('div', { id: 'rollout' });
    main.append(head, err, body);
    const act = async (path, payload) => {
      err.replaceChildren();
      try { await api('POST', '/v1/upgrades/' + encodeURIComponent(name) + '/' + path, payload); load(); } catch (e) { showError(err, e); }
    };
    const load = async () => {
      let d;
      try { d = await api('GET', '/v1/upgrades/' + encodeURIComponent(name)); } catch (e) { showError(err, e); return; }
      render(d);
    };
    const render = onChange(d => {
      head.replaceChildren(...[el('h1', {}, 'Upgrade ' + d.name + ' ', stateBadge(d.state)),
        d.reason ? el('p', { class: 'error', id: 'rollout-reason', text: d.reason }) : null,
        el('dl', { class: 'grid' }, el('dt', { text: 'artifact' }), el('dd', { text: d.kind + ' ' + (d.version || '') + ' · ' + d.reference }),
          el('dt', { text: 'digest' }), el('dd', { text: d.digest }), el('dt', { text: 'progress' }), el('dd', { id: 'rollout-progress', text: stepSummary(d.counts, d.total) }),
          el('dt', { text: 'created' }), el('dd', { text: when(d.created_at) + ' by ' + d.created_by })),
        me.admin ? el('div', { class: 'row' },
          el('button', { id: 'rollout-pause', disabled: d.state !== 'running', onclick: () => act('pause', {}) }, 'Pause'),
          el('button', { id: 'rollout-resume', disabled: d.state !== 'paused', onclick: () => act('resume', {}) }, 'Resume')) : null].filter(Boolean));
      const batches = {};
      for (const n of d.nodes || []) (batches[n.batch] = batches[n.batch] || []).push(n);
      body.replaceChildren(...Object.keys(batches).sort((a, b) => a - b).map(b => {
        const nodes = batches[b];
        const ok = nodes.filter(n => n.step === 'succeeded').length;
        return el('section', { class: 'batch', 'data-batch': b },
          el('h2', {}, 'Batch ' + b + ' ', el('span', { class: 'muted', text: ok + '/' + nodes.length + ' succeeded' })),
          el('table', {}, el('tr', {}, ['node', 'step', 'reason', 'from', 'confirmed by', 'updated', ''].map(h => el('th', { text: h }))),
            nodes.map(n => el('tr', { 'data-node': n.node, 'data-step': n.step },
              el('td', {}, el('a', { href: '/ui/nodes/' + encodeURIComponent(n.node), text: n.node })), el('td', {}, stateBadge(n.step)),
              el('td', { text: n.reason || '' }), el('td', { text: n.from_version || '' }), el('td', { text: n.confirmed_by || '' }),
              el('td', { text: when(n.updated_at) }),
              el('td', {}, n.step === 'awaiting_confirmation' ? el('button', { class: 'primary confirm', 'data-node': n.node,
                onclick: () => act('confirm', { node: n.node }) }, 'Confirm') : null)))));
      }));
    });
    load();
    const t = setInterval(load, 2000);
    cleanup.push(() => clearInterval(t));
  }

  // --- audit ------------------------------------------------------------

  function auditTable(evs) {
    return el('table', { class: 'audit-table' },
      el('tr', {}, ['time', 'kind', 'operator', 'node', 'result', 'detail', 'bytes ↑/↓'].map(h => el('th', { text: h }))),
      evs.map(e => el('tr', { 'data-kind': e.kind }, el('td', { text: when(e.at) }), el('td', { text: e.kind }), el('td', { text: e.operator || '' }),
        el('td', { text: e.node || '' }), el('td', {}, stateBadge(String(e.result).split(':')[0])), el('td', { text: e.detail || '' }),
        el('td', { text: e.bytes_to_node || e.bytes_from_node ? (e.bytes_to_node || 0) + ' / ' + (e.bytes_from_node || 0) : '' }))));
  }

  function auditPage(main) {
    main.append(el('h1', { text: 'Audit' }));
    if (!me.admin) { main.append(el('p', { class: 'muted', text: 'The audit log needs the admin role, as in the API.' })); return; }
    const node = el('input', { id: 'audit-node', placeholder: 'node' });
    const op = el('input', { id: 'audit-operator', placeholder: 'operator' });
    const kind = el('input', { id: 'audit-kind', placeholder: 'kind (jump, console_terminal, …)' });
    const since = el('input', { id: 'audit-since', type: 'datetime-local', title: 'since' });
    const until = el('input', { id: 'audit-until', type: 'datetime-local', title: 'until' });
    const box = el('div', { id: 'audit' });
    const search = async () => {
      const qs = new URLSearchParams({ limit: '500' });
      if (node.value.trim()) qs.set('node', node.value.trim());
      if (op.value.trim()) qs.set('operator', op.value.trim());
      if (kind.value.trim()) qs.set('kind', kind.value.trim());
      if (since.value) qs.set('since', new Date(since.value).toISOString().replace(/\.\d+Z$/, 'Z'));
      if (until.value) qs.set('until', new Date(until.value).toISOString().replace(/\.\d+Z$/, 'Z'));
      try { box.replaceChildren(auditTable((await api('GET', '/v1/audit?' + qs)).reverse())); } catch (e) { showError(box, e); }
    };
    const btn = el('button', { id: 'audit-search', class: 'primary', text: 'Search', onclick: search });
    [node, op, kind].forEach(i => i.addEventListener('keydown', e => { if (e.key === 'Enter') search(); }));
    main.append(el('div', { class: 'filters' }, node, op, kind, 'since', since, 'until', until, btn), box);
    search();
  }

  // --- start ------------------------------------------------------------

  document.getElementById('signout').addEventListener('click', async () => {
    try { await call('POST', '/ui/signout'); } catch (e) { /* signed out either way */ }
    signedOut();
  });

  (async function start() {
    try {
      me = await call('GET', '/ui/api/me');
    } catch (e) {
      if (me === null && e.message !== 'signed out') showError(document.getElementById('main'), e);
      return;
    }
    document.getElementById('who').textContent = me.operator + (me.admin ? ' (admin)' : '');
    document.getElementById('nav-upgrades').hidden = !me.upgrades;
    route();
  })();
})();
