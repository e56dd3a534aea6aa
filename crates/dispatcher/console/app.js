// The Hermes console (docs/console.md). It reads and acts only through the public HTTP API and
// its Server-Sent Events, with the token the user signs in with; it renders every value as
// text, never as HTML.
'use strict';

const app = {
  token: sessionStorage.getItem('hermes.token') || '',
  settings: { traceUrl: '', auth: false },
  // What the current page started: timers to clear and streams to abort when it is left.
  timers: [],
  aborts: [],
};

// ---------------------------------------------------------------- helpers

/** An element: h('td', {class: 'num'}, 'text', child, ...). Strings become text nodes. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replaces `el`'s children; like h(), it takes nested arrays and skips null and false. */
function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

const SVG = 'http://www.w3.org/2000/svg';
function s(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  return el;
}

const num = (v) => Number(v || 0);

function ago(ms) {
  if (!ms) return '';
  return dur(Date.now() - ms) + ' ago';
}

function dur(ms) {
  ms = Math.max(0, Math.round(ms));
  if (ms < 1000) return ms + ' ms';
  const sec = ms / 1000;
  if (sec < 60) return sec.toFixed(sec < 10 ? 1 : 0) + ' s';
  const min = Math.floor(sec / 60);
  if (min < 60) return min + ' min ' + Math.floor(sec % 60) + ' s';
  return Math.floor(min / 60) + ' h ' + (min % 60) + ' min';
}

function pretty(text) {
  if (!text) return '';
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return text; }
}

function parse(text) {
  if (!text) return undefined;
  try { return JSON.parse(text); } catch (_) { return undefined; }
}

function short(text, n) {
  text = String(text || '');
  return text.length > n ? text.slice(0, n - 1) + '…' : text;
}

/** Calls the API; a problem document becomes an Error with `.problem`. */
async function api(path, options = {}) {
  const headers = Object.assign({ Accept: 'application/json' }, options.headers || {});
  if (app.token) headers.Authorization = 'Bearer ' + app.token;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  const text = await response.text();
  const body = text ? (parse(text) ?? text) : null;
  if (!response.ok) {
    const problem = body && typeof body === 'object' ? body : { detail: text || response.statusText };
    const err = new Error(problem.detail || problem.title || response.statusText);
    err.status = response.status;
    err.problem = problem;
    if (response.status === 401) showSignin(true);
    throw err;
  }
  return body;
}

function post(path, body) {
  return api(path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body || {}) });
}

function notice(text, isError) {
  const el = document.getElementById('notice');
  el.textContent = text || '';
  el.hidden = !text;
  el.classList.toggle('error', !!isError);
}

function every(ms, fn) {
  fn();
  app.timers.push(setInterval(fn, ms));
}

// ---------------------------------------------------------------- states

const GOAL_STATES = {
  GOAL_STATUS_PENDING: ['pending', '○', 'pending'],
  GOAL_STATUS_PLANNING: ['running', '…', 'planning'],
  GOAL_STATUS_RUNNING: ['running', '▶', 'running'],
  GOAL_STATUS_REPLANNING: ['running', '↻', 'replanning'],
  GOAL_STATUS_SUMMARIZING: ['running', '…', 'summarizing'],
  GOAL_STATUS_COMPLETED: ['succeeded', '✓', 'completed'],
  GOAL_STATUS_FAILED: ['failed', '✗', 'failed'],
  GOAL_STATUS_CANCELLED: ['cancelled', '⊘', 'cancelled'],
  GOAL_STATUS_NEEDS_INPUT: ['waiting', '?', 'needs input'],
};
const TERMINAL = ['GOAL_STATUS_COMPLETED', 'GOAL_STATUS_FAILED', 'GOAL_STATUS_CANCELLED', 'GOAL_STATUS_NEEDS_INPUT'];

const NODE_STATES = {
  NODE_STATUS_PENDING: ['pending', '○', 'pending'],
  NODE_STATUS_DISPATCHED: ['running', '▶', 'running'],
  NODE_STATUS_SUCCEEDED: ['succeeded', '✓', 'succeeded'],
  NODE_STATUS_FAILED: ['failed', '✗', 'failed'],
  NODE_STATUS_SKIPPED: ['skipped', '–', 'skipped'],
  NODE_STATUS_CANCELLED: ['cancelled', '⊘', 'cancelled'],
};

function goalState(status) { return GOAL_STATES[status] || ['pending', '○', 'pending']; }
function nodeState(status) { return NODE_STATES[status] || NODE_STATES.NODE_STATUS_PENDING; }

function badge([cls, glyph, word]) {
  return h('span', { class: 'badge st-' + cls, dataset: { state: word } }, h('span', { 'aria-hidden': 'true' }, glyph), word);
}

// ---------------------------------------------------------------- events (SSE over fetch)

/**
 * Follows `/v1/goals/{id}/events` with the token in a header (EventSource cannot send one), and
 * resumes from the last event id after a dropped connection. Calls `onEvent(json)` per event.
 */
function followEvents(goalId, onEvent) {
  const controller = new AbortController();
  app.aborts.push(controller);
  let lastId = '';
  let ended = false;
  const run = async () => {
    while (!controller.signal.aborted && !ended) {
      try {
        const headers = lastId ? { 'Last-Event-ID': lastId } : {};
        await readSse('/v1/goals/' + encodeURIComponent(goalId) + '/events', headers, controller.signal, null, (kind, data, id) => {
          if (id) lastId = id;
          if (kind === 'error' || !data) return;
          const event = parse(data);
          if (event) onEvent(event);
        });
        // The server ends the stream after the goal's terminal event.
        ended = true;
      } catch (e) {
        if (controller.signal.aborted) return;
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  };
  run();
}

/**
 * Reads one Server-Sent Events response of `path` with the token in a header: `onOpen()` once
 * it is answered, `onEvent(kind, data, id)` per event; returns when the server ends the stream.
 */
async function readSse(path, extraHeaders, signal, onOpen, onEvent) {
  const headers = Object.assign({ Accept: 'text/event-stream' }, extraHeaders);
  if (app.token) headers.Authorization = 'Bearer ' + app.token;
  const response = await fetch(path, { headers, signal });
  if (!response.ok) { if (response.status === 401) showSignin(true); throw new Error(path + ': ' + response.status); }
  if (onOpen) onOpen();
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let data = '', id = '', kind = '';
      for (const line of block.split('\n')) {
        if (line.startsWith('data:')) data += line.slice(5).trimStart();
        else if (line.startsWith('id:')) id = line.slice(3).trim();
        else if (line.startsWith('event:')) kind = line.slice(6).trim();
      }
      onEvent(kind, data, id);
    }
  }
}

/**
 * One follower of `/v1/changes` for the whole console. Listeners get `(kind, json)`: `goal` (a
 * goal created or changing status), `approval` (asked for or decided), or `lagged` (on every
 * (re)connect too, since changes may have been missed: list again). A page's listeners go with
 * the page; `always` ones stay.
 */
const changeListeners = { page: new Set(), always: new Set() };

function onChange(fn, always) {
  if (always) { changeListeners.always.add(fn); return; }
  changeListeners.page.add(fn);
  // Leaving the page drops the listener and whatever it had scheduled.
  app.aborts.push({ abort: () => { changeListeners.page.delete(fn); if (fn.cancel) fn.cancel(); } });
}

function followChanges() {
  const tell = (kind, json) => {
    for (const fn of [...changeListeners.always, ...changeListeners.page]) fn(kind, json);
  };
  const run = async () => {
    for (;;) {
      try {
        await readSse('/v1/changes', {}, undefined, () => tell('lagged', null), (kind, data) => {
          if (kind === 'goal' || kind === 'approval' || kind === 'lagged') tell(kind, parse(data));
        });
      } catch (_) { /* shown by the pages' own lists */ }
      await new Promise((r) => setTimeout(r, 2000));
    }
  };
  run();
}

/** `fn`, once, `ms` after the last of a burst of calls to the function this returns. */
function debounced(fn, ms) {
  let timer = null;
  const call = () => { clearTimeout(timer); timer = setTimeout(fn, ms); };
  call.cancel = () => clearTimeout(timer);
  return call;
}

function eventKind(event) {
  for (const k of Object.keys(event)) {
    if (!['goalId', 'atUnixMs', 'seq', 'sessionId', 'tenant'].includes(k)) return k;
  }
  return 'event';
}

// ---------------------------------------------------------------- pages

const pages = {
  goals: goalsPage,
  goal: goalPage,
  approvals: approvalsPage,
  agents: agentsPage,
  'dead-letters': deadLettersPage,
  'dead-letter': deadLetterPage,
  deliveries: deliveriesPage,
  submit: submitPage,
};

function route() {
  for (const t of app.timers) clearInterval(t);
  for (const a of app.aborts) a.abort();
  app.timers = [];
  app.aborts = [];
  delete document.body.dataset.ready;
  notice('');
  const [name, ...rest] = (location.hash.replace(/^#\/?/, '') || 'goals').split('/');
  const page = pages[name] ? name : 'goals';
  const top = page === 'goal' ? 'goals' : page === 'dead-letter' ? 'dead-letters' : page;
  for (const a of document.querySelectorAll('nav a')) {
    if (a.dataset.page === top) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  const view = document.getElementById('view');
  view.replaceChildren();
  pages[page](view, rest.map(decodeURIComponent));
}

// ---- Goals

function goalsPage(view) {
  document.title = 'Goals · Hermes';
  const status = h('select', { id: 'filter-status', name: 'status' },
    h('option', { value: '' }, 'any'),
    ...['running', 'planning', 'completed', 'failed', 'cancelled', 'needs_input', 'pending', 'replanning', 'summarizing']
      .map((v) => h('option', { value: v }, v.replace('_', ' '))));
  const session = h('input', { id: 'filter-session', name: 'session', placeholder: 'session id' });
  const text = h('input', { id: 'filter-text', name: 'q', type: 'search', placeholder: 'text contains' });
  const tbody = h('tbody', { id: 'goal-rows' });
  const count = h('p', { class: 'muted', id: 'goal-count' });
  view.append(
    h('h1', {}, 'Goals'),
    h('form', { class: 'filters', role: 'search', onsubmit: (e) => { e.preventDefault(); refresh(); } },
      h('label', {}, 'Status', status), h('label', {}, 'Session', session), h('label', {}, 'Text', text),
      h('button', { type: 'submit', class: 'secondary' }, 'Filter')),
    h('div', { class: 'table-wrap' }, h('table', { class: 'goals' },
      h('thead', {}, h('tr', {}, ['Goal', 'Status', 'Age', 'Duration', 'Nodes', 'Tokens', 'Cost']
        .map((c, i) => h('th', { scope: 'col', class: i >= 4 ? 'num' : undefined }, c)))),
      tbody)),
    count);
  for (const input of [status, session, text]) input.addEventListener('change', () => refresh());
  const rows = new Map();
  let first = true;
  async function refresh() {
    const q = new URLSearchParams({ limit: '100' });
    if (status.value) q.set('status', status.value);
    if (session.value.trim()) q.set('session', session.value.trim());
    if (text.value.trim()) q.set('q', text.value.trim());
    let list;
    try { list = await api('/v1/goals?' + q); } catch (e) { notice('Cannot list goals: ' + e.message, true); return; }
    // The page was left while the list was on its way.
    if (!tbody.isConnected) return;
    notice('');
    const goals = list.goals || [];
    const seen = new Set();
    let before = null;
    for (let i = goals.length - 1; i >= 0; i--) {
      const g = goals[i];
      seen.add(g.goalId);
      const row = goalRow(g, !first && !rows.has(g.goalId));
      const old = rows.get(g.goalId);
      if (old) old.replaceWith(row);
      rows.set(g.goalId, row);
      tbody.insertBefore(row, before);
      before = row;
    }
    for (const [id, row] of rows) if (!seen.has(id)) { row.remove(); rows.delete(id); }
    count.textContent = goals.length ? '' : 'No goals yet. Submit one on the Submit page, or with hermes submit.';
    first = false;
    document.body.dataset.ready = 'goals';
  }
  // Listed again when a goal is created or changes status, not on a timer.
  refresh();
  onChange(debounced(refresh, 200));
}

function goalRow(g, isNew) {
  const nodes = g.nodes || [];
  const done = nodes.filter((n) => n.status === 'NODE_STATUS_SUCCEEDED').length;
  const failed = nodes.filter((n) => n.status === 'NODE_STATUS_FAILED').length;
  const created = num(g.createdUnixMs);
  const end = TERMINAL.includes(g.status) ? num(g.updatedUnixMs) : Date.now();
  const tokens = num(g.tokens && g.tokens.inputTokens) + num(g.tokens && g.tokens.outputTokens);
  const label = g.text ? short(g.text, 80) : (g.plan && g.plan.nodes ? 'plan: ' + g.plan.nodes.map((n) => n.taskType).filter((v, i, a) => a.indexOf(v) === i).slice(0, 4).join(', ') : '');
  return h('tr', { class: isNew ? 'new' : undefined, dataset: { goalId: g.goalId, status: goalState(g.status)[2] } },
    h('td', {}, h('a', { href: '#/goal/' + encodeURIComponent(g.goalId) }, g.goalId), h('div', { class: 'muted' }, label)),
    h('td', {}, badge(goalState(g.status))),
    h('td', {}, ago(created)),
    h('td', {}, created ? dur(end - created) : ''),
    h('td', { class: 'num' }, nodes.length ? `${done}/${nodes.length}` + (failed ? ` (${failed} failed)` : '') : '–'),
    h('td', { class: 'num' }, tokens ? tokens.toLocaleString() : '–'),
    h('td', { class: 'num' }, num(g.costUsd) ? '$' + num(g.costUsd).toFixed(4) : '–'));
}

// ---- Goal

/** Above this many nodes the DAG is drawn as small cells, without edges. */
const COMPACT_ABOVE = 300;

function goalPage(view, [goalId]) {
  document.title = goalId + ' · Hermes';
  const started = performance.now();
  // `routed`: the agent each node's latest task went to, from its TaskDispatched event (the
  // goal's state names the agent once it answers).
  const g = { goal: null, events: [], routed: new Map(), selected: null, nodeEls: new Map(), layoutKey: '' };
  const head = h('div', { id: 'goal-head' });
  const dag = h('div', { class: 'dag-wrap', id: 'dag' });
  const gantt = h('div', { class: 'dag-wrap', id: 'timeline' });
  const detail = h('aside', { class: 'panel', id: 'node-detail', 'aria-live': 'polite' },
    h('p', { class: 'muted' }, 'Select a node (click, or Tab to it and press Enter) to see its inputs, output, error, tool calls and routing.'));
  const answer = h('div', { id: 'answer' });
  const log = h('ol', { class: 'events', id: 'event-log' });
  view.append(head,
    h('div', { class: 'layout' },
      h('section', { class: 'panel', 'aria-label': 'Plan' },
        h('h2', {}, 'Plan'),
        h('div', { class: 'legend' }, Object.values(NODE_STATES).map(badge)),
        dag,
        h('h2', {}, 'Timeline'), gantt),
      detail),
    h('section', { 'aria-label': 'Answer' }, answer),
    h('section', { class: 'panel', 'aria-label': 'Events' }, h('h2', {}, 'Events'), log));

  let pending = null;
  let fetching = false;
  async function load() {
    if (fetching) { pending = pending || setTimeout(() => { pending = null; load(); }, 150); return; }
    fetching = true;
    try {
      g.goal = await api('/v1/goals/' + encodeURIComponent(goalId));
      render();
      if (!document.body.dataset.ready) {
        document.body.dataset.ready = 'goal';
        document.body.dataset.renderMs = String(Math.round(performance.now() - started));
      }
    } catch (e) {
      if (!g.goal) view.replaceChildren(h('h1', {}, goalId), h('div', { class: 'error-box', role: 'alert' }, e.message));
    } finally {
      fetching = false;
    }
  }
  // Refetch soon after each event, at most every so often for big goals.
  let timer = null;
  function soon() {
    if (timer) return;
    const size = g.goal && g.goal.nodes ? g.goal.nodes.length : 0;
    timer = setTimeout(() => { timer = null; load(); }, size > COMPACT_ABOVE ? 600 : 100);
  }

  function render() {
    renderHead(head, g.goal, () => load());
    renderDag(dag, g, (id) => select(id));
    renderGantt(gantt, g.goal);
    renderAnswer(answer, g.goal);
    if (g.selected) renderDetail(detail, g, g.selected);
  }

  function select(nodeId) {
    g.selected = nodeId;
    for (const [id, el] of g.nodeEls) el.classList.toggle('selected', id === nodeId);
    renderDetail(detail, g, nodeId);
  }

  load();
  followEvents(goalId, (event) => {
    g.events.push(event);
    if (event.taskDispatched && event.taskDispatched.agentId) g.routed.set(event.taskDispatched.nodeId, event.taskDispatched.agentId);
    log.append(eventItem(event));
    soon();
  });
  // The clock of running nodes and the goal's age, and a fallback refresh.
  every(2000, () => { if (g.goal && !TERMINAL.includes(g.goal.status)) soon(); });
}

function renderHead(head, goal, reload) {
  const tokens = num(goal.tokens && goal.tokens.inputTokens) + num(goal.tokens && goal.tokens.outputTokens);
  const maxTokens = num(goal.maxTokens);
  const cost = num(goal.costUsd);
  const maxCost = num(goal.maxCostUsd);
  const created = num(goal.createdUnixMs);
  const end = TERMINAL.includes(goal.status) ? num(goal.updatedUnixMs) : Date.now();
  const meter = (v, max) => max ? h('span', { class: 'meter', role: 'img', 'aria-label': `${Math.round(100 * v / max)}% of the budget` },
    h('span', { style: undefined, dataset: { pct: Math.min(100, Math.round(100 * v / max)) } })) : null;
  const facts = h('dl', { class: 'facts' },
    h('div', {}, h('dt', {}, 'Status'), h('dd', { id: 'goal-status' }, badge(goalState(goal.status)))),
    h('div', {}, h('dt', {}, 'Age'), h('dd', {}, ago(created))),
    h('div', {}, h('dt', {}, 'Duration'), h('dd', {}, created ? dur(end - created) : '')),
    h('div', {}, h('dt', {}, 'Nodes'), h('dd', {}, String((goal.nodes || []).length))),
    h('div', {}, h('dt', {}, 'Tokens'), h('dd', {}, tokens.toLocaleString() + (maxTokens ? ' / ' + maxTokens.toLocaleString() : ''), ' ', meter(tokens, maxTokens))),
    h('div', {}, h('dt', {}, 'Cost'), h('dd', {}, '$' + cost.toFixed(4) + (maxCost ? ' / $' + maxCost.toFixed(2) : ''), ' ', meter(cost, maxCost))),
    goal.sessionId ? h('div', {}, h('dt', {}, 'Session'), h('dd', {}, goal.sessionId)) : null);
  const trace = app.settings.traceUrl && goal.traceId
    ? h('a', { href: app.settings.traceUrl.replace('{trace_id}', goal.traceId), target: '_blank', rel: 'noopener', id: 'trace-link' }, 'Trace ↗')
    : null;
  const cancel = TERMINAL.includes(goal.status) ? null : h('button', {
    type: 'button', class: 'danger', id: 'cancel-goal',
    onclick: async (e) => {
      e.target.disabled = true;
      try { await post('/v1/goals/' + encodeURIComponent(goal.goalId) + ':cancel', { reason: 'cancelled from the console' }); reload(); }
      catch (err) { notice('Cancel failed: ' + err.message, true); e.target.disabled = false; }
    },
  }, 'Cancel goal');
  const replans = (goal.nodes || []).reduce((a, n) => a + num(n.replans), 0);
  fill(head,
    h('div', { class: 'goal-head' }, h('h1', {}, goal.goalId), trace, cancel),
    goal.text ? h('p', {}, goal.text) : null,
    facts,
    replans ? h('p', { class: 'muted' }, `Replanned ${replans} time(s); see PlanPatched in the events.`) : null,
    goal.error && goal.error.code ? errorBox(goal.error, 'goal-error') : null);
  for (const span of head.querySelectorAll('.meter > span')) span.style.width = span.dataset.pct + '%';
}

function errorBox(error, id) {
  return h('div', { class: 'error-box', role: 'alert', id },
    h('code', { class: 'error-code' }, error.code || 'ERROR'), ' ',
    h('span', { class: 'error-message' }, error.message || ''),
    error.nodeId ? h('span', { class: 'muted' }, ' (node ' + error.nodeId + ')') : null,
    error.retryable ? h('span', { class: 'muted' }, ' · retryable') : null);
}

/** Nodes by level: a node's level is one more than its deepest dependency's. */
function levels(plan) {
  const nodes = (plan && plan.nodes) || [];
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const deps = new Map(nodes.map((n) => [n.id, dependencies(n).filter((d) => byId.has(d))]));
  const level = new Map();
  const visit = (id, stack) => {
    if (level.has(id)) return level.get(id);
    if (stack.has(id)) return 0;
    stack.add(id);
    const l = deps.get(id).reduce((m, d) => Math.max(m, visit(d, stack) + 1), 0);
    stack.delete(id);
    level.set(id, l);
    return l;
  };
  for (const n of nodes) visit(n.id, new Set());
  const out = [];
  for (const n of nodes) (out[level.get(n.id)] = out[level.get(n.id)] || []).push(n);
  return { levels: out.filter(Boolean), deps };
}

/** `depends_on` and every `$ref` in the inputs. */
function dependencies(node) {
  const out = new Set(node.dependsOn || []);
  const walk = (v) => {
    if (Array.isArray(v)) v.forEach(walk);
    else if (v && typeof v === 'object') {
      const keys = Object.keys(v);
      if (keys.length === 1 && keys[0] === '$ref' && typeof v.$ref === 'string') out.add(v.$ref.split('.')[0]);
      else keys.forEach((k) => walk(v[k]));
    }
  };
  walk(parse(node.inputsJson));
  return [...out];
}

function renderDag(container, g, onSelect) {
  const goal = g.goal;
  const plan = goal.plan;
  const states = new Map((goal.nodes || []).map((n) => [n.nodeId, n]));
  const key = JSON.stringify(((plan && plan.nodes) || []).map((n) => [n.id, n.dependsOn || []]));
  if (key !== g.layoutKey) {
    g.layoutKey = key;
    drawDag(container, g, plan, onSelect);
  }
  // Update each node's state in place.
  for (const [id, el] of g.nodeEls) {
    const n = Object.assign({}, states.get(id));
    if (!n.agentId && n.status === 'NODE_STATUS_DISPATCHED') n.agentId = g.routed.get(id);
    const [cls, glyph, word] = nodeState(n.status);
    el.setAttribute('class', (el.dataset.kind || 'node') + ' st-' + cls + (g.selected === id ? ' selected' : ''));
    el.dataset.state = word;
    const glyphEl = el.querySelector('text.glyph');
    if (glyphEl) glyphEl.textContent = glyph;
    const sub = el.querySelector('text.sub');
    if (sub) sub.textContent = nodeLine(n);
    const title = el.querySelector('title');
    if (title) title.textContent = `${id} (${el.dataset.type}): ${word}` + (n.agentId ? ', agent ' + n.agentId : '');
    el.setAttribute('aria-label', `${id}, ${el.dataset.type}, ${word}`);
  }
  if (!plan || !plan.nodes || !plan.nodes.length) {
    container.replaceChildren(h('p', { class: 'muted' }, goal.status === 'GOAL_STATUS_PLANNING' ? 'Waiting for the planner...' : 'No plan.'));
    g.layoutKey = '';
  }
}

function nodeLine(n) {
  const parts = [];
  if (n.agentId) parts.push(n.agentId);
  if (num(n.attempt) > 1) parts.push('try ' + n.attempt);
  if (num(n.elapsedMs)) parts.push(dur(num(n.elapsedMs)));
  else if (n.status === 'NODE_STATUS_DISPATCHED' && num(n.dispatchedUnixMs)) parts.push(dur(Date.now() - num(n.dispatchedUnixMs)));
  return parts.join(' · ');
}

function drawDag(container, g, plan, onSelect) {
  g.nodeEls = new Map();
  const { levels: rows, deps } = levels(plan);
  const n = (plan && plan.nodes) ? plan.nodes.length : 0;
  const compact = n > COMPACT_ABOVE;
  const width = Math.max(600, container.clientWidth || 900) - 8;
  const [w, hgt, gapX, gapY] = compact ? [12, 12, 3, 3] : [168, 46, 14, 34];
  const perRow = Math.max(1, Math.floor((width - 40) / (w + gapX)));
  const pos = new Map();
  let y = 8;
  const svg = s('svg', { class: 'dag', role: 'group', 'aria-label': `Plan: ${n} nodes in ${rows.length} levels` });
  const edges = s('g', {});
  svg.append(edges);
  rows.forEach((level, li) => {
    const label = s('text', { x: 0, y: y + 10, class: 'level-label' });
    label.textContent = 'L' + li;
    svg.append(label);
    level.forEach((node, i) => {
      const x = 28 + (i % perRow) * (w + gapX);
      const yy = y + Math.floor(i / perRow) * (hgt + (compact ? gapY : 10));
      pos.set(node.id, [x, yy]);
      const el = s('g', { class: compact ? 'cell' : 'node', tabindex: 0, role: 'button', transform: `translate(${x},${yy})` });
      el.dataset.node = node.id;
      el.dataset.type = node.taskType;
      el.dataset.kind = compact ? 'cell' : 'node';
      const title = s('title', {});
      el.append(title, s('rect', { width: w, height: hgt, rx: compact ? 2 : 6 }));
      if (!compact) {
        const glyph = s('text', { x: 8, y: 18, class: 'glyph' });
        const name = s('text', { x: 24, y: 18 });
        name.textContent = short(node.id, 20);
        const type = s('text', { x: 8, y: 32, class: 'sub type' });
        type.textContent = short(node.taskType, 26);
        type.setAttribute('class', 'type');
        const sub = s('text', { x: 8, y: 42, class: 'sub' });
        el.append(glyph, name, type, sub);
      }
      el.addEventListener('click', () => onSelect(node.id));
      el.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); onSelect(node.id); } });
      g.nodeEls.set(node.id, el);
      svg.append(el);
    });
    y += Math.ceil(level.length / perRow) * (hgt + (compact ? gapY : 10)) + gapY + (compact ? 8 : 4);
  });
  if (!compact) {
    // One path for every edge: cheaper to draw than one element each.
    let d = '';
    let count = 0;
    for (const [id, ds] of deps) {
      const to = pos.get(id);
      for (const dep of ds) {
        const from = pos.get(dep);
        if (!from || !to) continue;
        const x1 = from[0] + w / 2, y1 = from[1] + hgt, x2 = to[0] + w / 2, y2 = to[1];
        const my = (y1 + y2) / 2;
        d += `M${x1},${y1}C${x1},${my} ${x2},${my} ${x2},${y2}`;
        count++;
      }
    }
    // Many edges fade, so the nodes stay readable.
    if (d) edges.append(s('path', { d, class: count > 60 ? 'edge many' : 'edge' }));
  }
  svg.setAttribute('width', Math.min(width, 40 + perRow * (w + gapX)));
  svg.setAttribute('height', y + 8);
  fill(container, svg,
    compact ? h('p', { class: 'muted' }, `${n} nodes: drawn as cells without edges; select one to see its dependencies.`) : null);
}

function renderGantt(container, goal) {
  const nodes = (goal.nodes || []).filter((n) => num(n.dispatchedUnixMs));
  if (!nodes.length) { container.replaceChildren(h('p', { class: 'muted' }, 'Nothing has run yet.')); return; }
  nodes.sort((a, b) => num(a.dispatchedUnixMs) - num(b.dispatchedUnixMs));
  const t0 = num(goal.createdUnixMs) || num(nodes[0].dispatchedUnixMs);
  const now = Date.now();
  const endOf = (n) => num(n.finishedUnixMs) || (TERMINAL.includes(goal.status) ? num(goal.updatedUnixMs) : now);
  const t1 = Math.max(...nodes.map(endOf), t0 + 1);
  const compact = nodes.length > 60;
  const rowH = compact ? Math.max(1, Math.min(6, Math.floor(600 / nodes.length))) : 16;
  const labelW = compact ? 0 : 140;
  const width = Math.max(500, (container.clientWidth || 800) - 10);
  const scale = (width - labelW - 10) / (t1 - t0);
  const svg = s('svg', { class: 'gantt', width, height: nodes.length * rowH + 20, role: 'img',
    'aria-label': `Timeline of ${nodes.length} nodes over ${dur(t1 - t0)}` });
  nodes.forEach((n, i) => {
    const x = labelW + (num(n.dispatchedUnixMs) - t0) * scale;
    const bar = s('rect', { x, y: i * rowH + 2, width: Math.max(2, (endOf(n) - num(n.dispatchedUnixMs)) * scale), height: Math.max(1, rowH - 4), class: 'bar st-' + nodeState(n.status)[0] });
    const title = s('title', {});
    title.textContent = `${n.nodeId}: ${dur(endOf(n) - num(n.dispatchedUnixMs))}`;
    bar.append(title);
    svg.append(bar);
    if (!compact) {
      const t = s('text', { x: 0, y: i * rowH + 12 });
      t.textContent = short(n.nodeId, 22);
      svg.append(t);
    }
  });
  const axis = s('text', { x: labelW, y: nodes.length * rowH + 16 });
  axis.textContent = `0 → ${dur(t1 - t0)}`;
  svg.append(axis);
  container.replaceChildren(svg);
}

function renderAnswer(container, goal) {
  if (goal.status === 'GOAL_STATUS_COMPLETED') {
    container.replaceChildren(h('div', { class: 'panel' }, h('h2', {}, 'Answer'), outputView(goal, goal.outputJson, 'goal-output')));
  } else if (goal.status === 'GOAL_STATUS_NEEDS_INPUT' && goal.error) {
    container.replaceChildren(h('div', { class: 'panel' }, h('h2', {}, 'Needs input'), h('p', {}, goal.error.message || '')));
  } else {
    container.replaceChildren();
  }
}

/** Pretty JSON, with a link for an `$artifact` stub (a large output kept by reference). */
function outputView(goal, text, id) {
  const value = parse(text);
  const pre = h('pre', { id }, pretty(text));
  if (value && typeof value === 'object' && typeof value.$artifact === 'string') {
    const href = '/v1/goals/' + encodeURIComponent(goal.goalId) + '/artifacts/' + encodeURIComponent(value.$artifact);
    return h('div', {},
      h('p', {}, 'Kept by reference (' + num(value.size_bytes).toLocaleString() + ' bytes): ',
        h('a', { href, target: '_blank', rel: 'noopener', class: 'artifact-link', onclick: (e) => openArtifact(e, href) }, 'open the artifact')),
      pre);
  }
  return pre;
}

async function openArtifact(e, href) {
  if (!app.token) return;
  // With auth on the link needs the token: fetch it and open the bytes.
  e.preventDefault();
  try {
    const response = await fetch(href, { headers: { Authorization: 'Bearer ' + app.token } });
    if (!response.ok) throw new Error(String(response.status));
    window.open(URL.createObjectURL(await response.blob()), '_blank', 'noopener');
  } catch (err) { notice('Cannot open the artifact: ' + err.message, true); }
}

/** Follows `node_id.path` into the outputs the goal has, as the dispatcher does. */
function resolveRefs(value, outputs) {
  if (Array.isArray(value)) return value.map((v) => resolveRefs(v, outputs));
  if (value && typeof value === 'object') {
    const keys = Object.keys(value);
    if (keys.length === 1 && keys[0] === '$ref' && typeof value.$ref === 'string') {
      const [node, ...path] = value.$ref.split('.');
      if (!outputs.has(node)) return value;
      let v = outputs.get(node);
      for (const p of path) {
        if (v === null || typeof v !== 'object' || !(p in v)) return value;
        v = v[p];
      }
      return v;
    }
    const out = {};
    for (const k of keys) out[k] = resolveRefs(value[k], outputs);
    return out;
  }
  return value;
}

function renderDetail(panel, g, nodeId) {
  const goal = g.goal;
  const node = ((goal.plan && goal.plan.nodes) || []).find((n) => n.id === nodeId);
  const state = (goal.nodes || []).find((n) => n.nodeId === nodeId) || {};
  if (!node) { panel.replaceChildren(h('p', { class: 'muted' }, 'That node is no longer in the plan.')); return; }
  const outputs = new Map();
  for (const n of goal.nodes || []) { const v = parse(n.outputJson); if (v !== undefined) outputs.set(n.nodeId, v); }
  const inputs = parse(node.inputsJson);
  const hasRefs = dependencies({ inputsJson: node.inputsJson }).length > 0;
  const mine = g.events.filter((e) => {
    const k = eventKind(e);
    return e[k] && e[k].nodeId === nodeId;
  });
  const routes = mine.filter((e) => e.taskDispatched).map((e) => e.taskDispatched);
  const calls = mine.filter((e) => e.toolCalled).map((e) => e.toolCalled);
  const waits = mine.filter((e) => e.modelWaiting).map((e) => e.modelWaiting);
  const lastWait = waits[waits.length - 1];
  const succeeded = mine.filter((e) => e.taskSucceeded).map((e) => e.taskSucceeded).pop();
  const errors = state.errors && state.errors.length ? state.errors : (state.error ? [state.error] : []);
  const start = num(state.dispatchedUnixMs);
  fill(panel,
    h('h2', {}, 'Node ', h('code', {}, nodeId)),
    h('dl', { class: 'kv' },
      h('dt', {}, 'Task type'), h('dd', {}, node.taskType),
      h('dt', {}, 'State'), h('dd', { id: 'node-state' }, badge(nodeState(state.status)),
        lastWait && lastWait.waiting && state.status === 'NODE_STATUS_DISPATCHED' ? h('span', { class: 'muted', id: 'node-model-wait' }, ' waiting for model slot') : null,
        succeeded && succeeded.cached ? h('span', { class: 'muted', id: 'node-cached' }, ` cached, age ${Math.round(num(succeeded.cachedAgeMs) / 1000)} s`) : null),
      h('dt', {}, 'Attempt'), h('dd', {}, String(num(state.attempt) || '–')),
      h('dt', {}, 'Agent'), h('dd', {}, state.agentId || (g.routed.get(nodeId) ? g.routed.get(nodeId) + ' (routed to)' : '–')),
      h('dt', {}, 'Duration'), h('dd', {}, num(state.elapsedMs) ? dur(num(state.elapsedMs)) : start ? dur(Date.now() - start) + ' so far' : '–'),
      h('dt', {}, 'Depends on'), h('dd', {}, dependencies(node).join(', ') || 'nothing'),
      num(state.replans) ? [h('dt', {}, 'Replans'), h('dd', {}, String(state.replans))] : null,
      state.tokens ? [h('dt', {}, 'Tokens'), h('dd', {}, String(num(state.tokens.inputTokens) + num(state.tokens.outputTokens)))] : null),
    errors.length ? [h('h2', {}, errors.length > 1 ? 'Errors (oldest first)' : 'Error'), errors.map((e) => errorBox(e, 'node-error'))] : null,
    h('h2', {}, 'Inputs', hasRefs ? h('span', { class: 'muted' }, ' ($refs resolved)') : null),
    h('pre', { id: 'node-inputs' }, inputs === undefined ? node.inputsJson || '{}' : JSON.stringify(resolveRefs(inputs, outputs), null, 2)),
    state.outputJson ? [h('h2', {}, 'Output'), outputView(goal, state.outputJson, 'node-output')] : null,
    routes.length ? [h('h2', {}, 'Routing'), h('ul', { id: 'node-routing' }, routes.map((r) =>
      h('li', {}, `attempt ${r.attempt || 1}: `, r.agentId ? `agent ${r.agentId}, score ${num(r.score).toFixed(2)}` : 'its pool', ' — ', r.reason || '', h('div', { class: 'muted' }, r.subject || ''))))] : null,
    calls.length ? [h('h2', {}, 'Tool calls'), h('ol', { id: 'node-tool-calls' }, calls.map((c) =>
      h('li', {}, h('code', {}, c.tool), ` step ${num(c.step)}: `, c.ok ? '✓ ok' : '✗ ' + (c.errorCode || 'failed'), ` (${dur(num(c.elapsedMs))})`, c.cached ? h('span', { class: 'muted cached' }, ` cached, age ${Math.round(num(c.cachedAgeMs) / 1000)} s`) : null, h('pre', {}, pretty(c.argumentsJson)))))] : null,
    waits.length ? [h('h2', {}, 'Model slots'), h('ul', { id: 'node-model-waits' }, waits.map((w) =>
      h('li', {}, w.waiting ? `waiting for model slot of ${w.model} (${(w.reason || '').replace(/_/g, ' ')})` : `got a model slot of ${w.model} after ${dur(num(w.waitedMs))}`)))] : null);
}

function eventItem(event) {
  const kind = eventKind(event);
  const body = event[kind] || {};
  const at = num(event.atUnixMs) ? new Date(num(event.atUnixMs)).toLocaleTimeString() : '';
  const bits = [];
  if (body.nodeId) bits.push('node ' + body.nodeId);
  if (body.agentId) bits.push('agent ' + body.agentId);
  if (body.attempt) bits.push('attempt ' + body.attempt);
  if (body.error) bits.push((body.error.code || '') + ' ' + (body.error.message || ''));
  if (body.reason) bits.push(body.reason);
  if (body.tool) bits.push('tool ' + body.tool);
  if (body.cached) bits.push(`cached, age ${Math.round(num(body.cachedAgeMs) / 1000)} s`);
  if (kind === 'modelWaiting') bits.push(body.waiting ? `waiting for model slot of ${body.model} (${(body.reason || '').replace(/_/g, ' ')})` : `got a model slot after ${dur(num(body.waitedMs))}`);
  return h('li', { dataset: { kind } }, h('span', { class: 'muted' }, (num(event.seq) ? '#' + event.seq + ' ' : '') + at + ' '),
    h('span', { class: 'kind' }, kind.replace(/^./, (c) => c.toUpperCase())), ' ', short(bits.join(' · '), 240));
}

// ---- Approvals

function approvalsPage(view) {
  document.title = 'Approvals · Hermes';
  const cards = h('div', { class: 'cards', id: 'approval-cards' });
  const empty = h('p', { class: 'muted', id: 'approvals-empty' });
  view.append(h('h1', {}, 'Approvals'),
    h('p', { class: 'muted' }, 'Tool calls waiting for a person, across every goal. A decision taken elsewhere (CLI, gRPC) disappears here.'),
    cards, empty);
  const shown = new Map();
  async function refresh() {
    let list;
    try { list = await api('/v1/approvals'); } catch (e) { notice('Cannot list approvals: ' + e.message, true); return; }
    if (!cards.isConnected) return;
    const approvals = list.approvals || [];
    const seen = new Set();
    for (const a of approvals) {
      const key = a.goalId + '/' + a.callId;
      seen.add(key);
      if (!shown.has(key)) {
        const card = approvalCard(a, () => { card.remove(); shown.delete(key); refresh(); });
        shown.set(key, card);
        cards.append(card);
      }
    }
    for (const [key, card] of shown) if (!seen.has(key)) { card.remove(); shown.delete(key); }
    empty.textContent = shown.size ? '' : 'Nothing is waiting for a decision.';
    document.body.dataset.ready = 'approvals';
  }
  // Listed again when an approval is asked for or decided, not on a timer.
  refresh();
  const later = debounced(refresh, 100);
  const listener = (kind) => { if (kind !== 'goal') later(); };
  listener.cancel = later.cancel;
  onChange(listener);
  every(1000, () => {
    for (const el of cards.querySelectorAll('[data-expires]')) {
      const left = num(el.dataset.expires) - Date.now();
      el.textContent = left > 0 ? 'expires in ' + dur(left) : 'expired: it will be denied';
    }
  });
}

function approvalCard(a, done) {
  const reason = h('input', { type: 'text', name: 'reason', placeholder: 'reason (optional)', 'aria-label': 'Reason for ' + a.tool });
  const status = h('p', { class: 'field-error', role: 'alert' });
  const decide = (approve) => async (e) => {
    for (const b of card.querySelectorAll('button')) b.disabled = true;
    try {
      await post(`/v1/approvals/${encodeURIComponent(a.goalId)}/${encodeURIComponent(a.callId)}:${approve ? 'approve' : 'deny'}`, { reason: reason.value });
      done();
    } catch (err) {
      status.textContent = (approve ? 'Approve' : 'Deny') + ' failed: ' + err.message;
      for (const b of card.querySelectorAll('button')) b.disabled = false;
    }
  };
  const card = h('article', { class: 'card approval', dataset: { goalId: a.goalId, callId: a.callId } },
    h('h2', {}, h('code', {}, a.tool)),
    h('dl', { class: 'kv' },
      h('dt', {}, 'Goal'), h('dd', {}, h('a', { href: '#/goal/' + encodeURIComponent(a.goalId) }, a.goalId)),
      h('dt', {}, 'Node'), h('dd', {}, a.nodeId || ''),
      a.reason ? [h('dt', {}, 'Why'), h('dd', {}, a.reason)] : null,
      h('dt', {}, 'Expiry'), h('dd', { class: 'countdown', dataset: { expires: num(a.expiresUnixMs) } }, '')),
    h('pre', { class: 'arguments' }, pretty(a.argumentsJson)),
    h('div', { class: 'actions' }, reason,
      h('button', { type: 'button', class: 'approve', onclick: decide(true) }, 'Approve'),
      h('button', { type: 'button', class: 'deny danger', onclick: decide(false) }, 'Deny')),
    status);
  return card;
}

/** The count of pending approvals beside the nav link, on every page. */
async function approvalCount() {
  try {
    const list = await api('/v1/approvals');
    const n = (list.approvals || []).length;
    document.getElementById('approval-count').textContent = n ? String(n) : '';
  } catch (_) { /* shown on the page itself */ }
}

// ---- Agents

function agentsPage(view) {
  document.title = 'Agents · Hermes';
  const tbody = h('tbody', { id: 'agent-rows' });
  const empty = h('p', { class: 'muted' });
  view.append(h('h1', {}, 'Agents'),
    h('div', { class: 'table-wrap' }, h('table', {},
      h('thead', {}, h('tr', {}, ['Agent', 'State', 'Routing', 'Pool', 'Task types', 'Tags', 'Load', 'Latency', 'Last heartbeat', 'Version'].map((c) => h('th', { scope: 'col' }, c)))),
      tbody)), empty);
  async function refresh() {
    let list;
    try { list = await api('/v1/agents'); } catch (e) { notice('Cannot list agents: ' + e.message, true); return; }
    const agents = (list.agents || []).slice().sort((a, b) => (a.heartbeat.agentId < b.heartbeat.agentId ? -1 : 1));
    tbody.replaceChildren(...agents.map((a) => {
      const hb = a.heartbeat || {};
      const state = !a.online ? ['skipped', '○', 'offline'] : hb.draining ? ['waiting', '↓', 'draining'] : ['succeeded', '●', 'online'];
      const max = num(hb.maxConcurrency);
      // Routing's view (docs/routing.md): in rotation, cooling off after its own failures, one
      // probe task deciding, or its heartbeat late.
      const health = a.health || 'ok';
      const left = Math.max(0, Math.ceil((num(a.coolOffUntilUnixMs) - Date.now()) / 1000));
      const routing = health === 'ok' ? ['succeeded', '●', 'in rotation']
        : health === 'cool-off' ? ['failed', '✗', `cool-off, ${left} s left`]
        : health === 'probing' ? ['waiting', '?', 'probing'] : ['waiting', '…', 'heartbeat late'];
      const latencies = Object.entries(a.latencyMs || {}).map(([t, ms]) => `${t} ${Number(ms).toFixed(1)} ms`);
      return h('tr', { dataset: { agentId: hb.agentId, state: state[2], health } },
        h('td', {}, h('code', {}, hb.agentId)),
        h('td', {}, badge(state)),
        h('td', { class: 'health' }, badge(routing)),
        h('td', {}, hb.pool || ''),
        h('td', { class: 'types' }, (hb.taskTypes || []).join(', ')),
        h('td', {}, (hb.tags || []).join(', ')),
        h('td', { class: 'load' }, `${num(a.load)}/${max || '∞'}`),
        h('td', { class: 'latency' }, latencies.join(', ') || (num(hb.latencyMs) ? `${Number(hb.latencyMs).toFixed(1)} ms` : '–')),
        h('td', {}, ago(num(a.lastSeenUnixMs))),
        h('td', {}, hb.version || ''));
    }));
    empty.textContent = agents.length ? '' : 'No agents have registered.';
    document.body.dataset.ready = 'agents';
  }
  every(2000, refresh);
}

// ---- Dead letters

function deadLettersPage(view) {
  document.title = 'Dead letters · Hermes';
  const tbody = h('tbody', { id: 'dead-letter-rows' });
  const empty = h('p', { class: 'muted' });
  view.append(h('h1', {}, 'Dead letters'),
    h('p', { class: 'muted' }, 'Messages that could not be processed, with the reason. Open one to read it and replay it.'),
    h('div', { class: 'table-wrap' }, h('table', {},
      h('thead', {}, h('tr', {}, ['#', 'Kind', 'Reason', 'Goal', 'When', 'Size'].map((c) => h('th', { scope: 'col' }, c)))),
      tbody)), empty);
  async function refresh() {
    let list;
    try { list = await api('/v1/dead-letters?limit=200'); } catch (e) { notice('Cannot list dead letters: ' + e.message, true); return; }
    const letters = list.deadLetters || [];
    tbody.replaceChildren(...letters.map((l) => h('tr', { dataset: { sequence: l.sequence } },
      h('td', {}, h('a', { href: '#/dead-letter/' + l.sequence }, '#' + l.sequence)),
      h('td', {}, l.subject || ''),
      h('td', {}, short(l.reason, 160)),
      h('td', {}, l.goalId ? h('a', { href: '#/goal/' + encodeURIComponent(l.goalId) }, l.goalId) : '–'),
      h('td', {}, ago(num(l.atUnixMs))),
      h('td', { class: 'num' }, num(l.sizeBytes).toLocaleString() + ' B'))));
    empty.textContent = letters.length ? '' : 'No dead letters.';
    document.body.dataset.ready = 'dead-letters';
  }
  every(3000, refresh);
}

async function deadLetterPage(view, [sequence]) {
  document.title = 'Dead letter #' + sequence + ' · Hermes';
  view.append(h('p', {}, h('a', { href: '#/dead-letters' }, '← Dead letters')));
  let l;
  try { l = await api('/v1/dead-letters/' + encodeURIComponent(sequence)); } catch (e) {
    view.append(h('h1', {}, 'Dead letter #' + sequence), h('div', { class: 'error-box', role: 'alert' }, e.message));
    return;
  }
  const result = h('p', { id: 'replay-result', role: 'status' });
  view.append(h('h1', {}, 'Dead letter #' + l.sequence),
    h('dl', { class: 'kv' },
      h('dt', {}, 'Kind'), h('dd', {}, l.subject || ''),
      h('dt', {}, 'Reason'), h('dd', { id: 'dead-letter-reason' }, l.reason || ''),
      h('dt', {}, 'First published on'), h('dd', {}, l.originalSubject || ''),
      h('dt', {}, 'From'), h('dd', {}, l.origin || ''),
      h('dt', {}, 'Goal'), h('dd', {}, l.goalId ? h('a', { href: '#/goal/' + encodeURIComponent(l.goalId) }, l.goalId) : '–'),
      h('dt', {}, 'When'), h('dd', {}, num(l.atUnixMs) ? new Date(num(l.atUnixMs)).toLocaleString() : '')),
    h('h2', {}, 'Payload'), h('pre', {}, l.decoded || ''),
    h('div', { class: 'actions' }, h('button', {
      type: 'button', id: 'replay',
      onclick: async (e) => {
        e.target.disabled = true;
        try {
          const r = await post('/v1/dead-letters/' + encodeURIComponent(l.sequence) + ':replay', {});
          result.textContent = `Replayed: published again on ${r.subject} (stream sequence ${r.sequence}).`;
        } catch (err) {
          result.textContent = 'Replay failed: ' + err.message;
          e.target.disabled = false;
        }
      },
    }, 'Replay')), result);
  document.body.dataset.ready = 'dead-letter';
}

// ---- Webhook deliveries

// Every webhook delivery of the caller's tenant's goals (of one goal at #/deliveries/<goal>), with
// each attempt, and a button that sends a delivered or dead-lettered one again.
function deliveriesPage(view, [goalId]) {
  document.title = 'Deliveries · Hermes';
  const tbody = h('tbody', { id: 'delivery-rows' });
  const empty = h('p', { class: 'muted' });
  const result = h('p', { id: 'resend-result', role: 'status' });
  view.append(h('h1', {}, goalId ? 'Deliveries of ' + goalId : 'Deliveries'),
    h('p', { class: 'muted' }, 'Webhooks sent when goals end or wait for a person, newest first, with every attempt (docs/webhooks.md).'),
    result,
    h('div', { class: 'table-wrap' }, h('table', {},
      h('thead', {}, h('tr', {}, ['Event', 'Goal', 'Endpoint', 'State', 'Attempts', 'Last attempt', ''].map((c) => h('th', { scope: 'col' }, c)))),
      tbody)), empty);
  const lastAttempt = (d) => {
    const a = (d.attempts || [])[(d.attempts || []).length - 1];
    if (!a) return '–';
    const what = a.status ? 'HTTP ' + a.status : short(a.error || 'no answer', 120);
    return `${what}, ${num(a.latencyMs)} ms, ${ago(num(a.atUnixMs))}`;
  };
  const resend = (d) => h('button', {
    type: 'button', class: 'resend', dataset: { id: d.id },
    onclick: async (e) => {
      e.target.disabled = true;
      try {
        await post('/v1/webhooks/deliveries/' + encodeURIComponent(d.id) + ':resend', {});
        result.textContent = `Sending ${d.eventType} of ${d.goalId} again.`;
      } catch (err) {
        result.textContent = 'Resend failed: ' + err.message;
        e.target.disabled = false;
      }
    },
  }, 'Resend');
  async function refresh() {
    let list;
    const query = goalId ? '?goal_id=' + encodeURIComponent(goalId) : '';
    try { list = await api('/v1/webhooks/deliveries' + query); } catch (e) { notice('Cannot list deliveries: ' + e.message, true); return; }
    const deliveries = list.deliveries || [];
    tbody.replaceChildren(...deliveries.map((d) => h('tr', { dataset: { id: d.id, state: d.state } },
      h('td', {}, d.eventType || ''),
      h('td', {}, h('a', { href: '#/goal/' + encodeURIComponent(d.goalId) }, d.goalId)),
      h('td', {}, d.endpointId || ''),
      h('td', { class: 'state' }, (d.state || '').replace(/_/g, ' ')),
      h('td', { class: 'num' }, String((d.attempts || []).length)),
      h('td', {}, h('details', {}, h('summary', {}, lastAttempt(d)),
        h('ol', {}, (d.attempts || []).map((a) => h('li', {},
          `${new Date(num(a.atUnixMs)).toLocaleString()}: ${a.status ? 'HTTP ' + a.status : 'no answer'}, ${num(a.latencyMs)} ms${a.error ? ' (' + a.error + ')' : ''}`))))),
      h('td', {}, d.state === 'pending' ? '' : resend(d)))));
    empty.textContent = deliveries.length ? '' : 'No deliveries.';
    document.body.dataset.ready = 'deliveries';
  }
  every(3000, refresh);
}

// ---- Submit

function submitPage(view) {
  document.title = 'Submit · Hermes';
  const kind = (value, label, checked) => h('label', { class: 'row' }, h('input', { type: 'radio', name: 'kind', value, checked }), label);
  const body = h('textarea', { id: 'goal-body', name: 'body', 'aria-describedby': 'body-error', spellcheck: 'false',
    placeholder: 'What should be done, in plain language; or a plan in YAML or JSON:\n\nnodes:\n  - id: total\n    task_type: math.evaluate\n    inputs: {expression: "2 + 2"}' });
  const session = h('input', { id: 'goal-session', name: 'session' });
  const key = h('input', { id: 'goal-key', name: 'idempotency_key' });
  const maxTokens = h('input', { id: 'goal-max-tokens', name: 'max_tokens', type: 'number', min: 0 });
  const error = h('div', { id: 'body-error', class: 'field-error', role: 'alert' });
  const button = h('button', { type: 'submit', id: 'submit-goal' }, 'Submit');
  const form = h('form', { class: 'form', novalidate: true, onsubmit: async (e) => {
    e.preventDefault();
    error.replaceChildren();
    const asPlan = form.querySelector('input[name=kind]:checked').value === 'plan';
    const text = body.value.trim();
    if (!text) { error.textContent = asPlan ? 'Paste a plan.' : 'Say what should be done.'; body.focus(); return; }
    button.disabled = true;
    try {
      let goal;
      const extra = { session_id: session.value.trim(), idempotency_key: key.value.trim(), max_tokens: num(maxTokens.value) };
      if (asPlan) {
        // The plan as written (YAML is a superset of JSON); the options go in as one document.
        const options = Object.entries(extra).filter(([, v]) => v).map(([k, v]) => `${k}: ${JSON.stringify(v)}\n`).join('');
        const indented = text.split('\n').map((l) => '  ' + l).join('\n');
        const looksWrapped = /^\s*(plan|text)\s*:/m.test(text) || /^\s*\{\s*"(plan|text)"/.test(text);
        goal = await api('/v1/goals', { method: 'POST', headers: { 'Content-Type': 'application/yaml' },
          body: looksWrapped ? text : options + 'plan:\n' + indented + '\n' });
      } else {
        goal = await post('/v1/goals', Object.assign({ text }, extra));
      }
      location.hash = '#/goal/' + encodeURIComponent(goal.goalId);
    } catch (err) {
      const p = err.problem || {};
      error.append(h('p', { class: 'problem-detail' }, (p.code ? p.code + ': ' : '') + (p.detail || err.message)));
      if (p.problems && p.problems.length) error.append(h('ul', { class: 'problems' }, p.problems.map((x) => h('li', {}, x))));
      body.setAttribute('aria-invalid', 'true');
      body.focus();
    } finally {
      button.disabled = false;
    }
  } },
  h('fieldset', { class: 'row' }, h('legend', {}, 'The goal is'), kind('text', 'text, for the planner', true), kind('plan', 'a plan (YAML or JSON)', false)),
  h('label', { for: 'goal-body' }, 'Goal'), body, error,
  h('div', { class: 'row' }, h('label', {}, 'Session', session), h('label', {}, 'Idempotency key', key), h('label', {}, 'Token budget', maxTokens)),
  h('div', {}, button));
  view.append(h('h1', {}, 'Submit a goal'), form);
  document.body.dataset.ready = 'submit';
}

// ---------------------------------------------------------------- sign-in and start

function showSignin(needed) {
  const form = document.getElementById('signin');
  form.hidden = !needed && !!app.token;
  document.getElementById('signout').hidden = !app.token;
  if (needed && !app.token) notice('Sign in with an API token to use the console.');
  if (needed && app.token) notice('The API refused the token: sign in again.', true);
}

async function start() {
  try { app.settings = await (await fetch('/console/settings.json')).json(); } catch (_) { /* defaults */ }
  const form = document.getElementById('signin');
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    app.token = document.getElementById('token').value.trim();
    sessionStorage.setItem('hermes.token', app.token);
    form.hidden = true;
    document.getElementById('signout').hidden = !app.token;
    route();
  });
  document.getElementById('signout').addEventListener('click', () => {
    app.token = '';
    sessionStorage.removeItem('hermes.token');
    showSignin(true);
    route();
  });
  form.hidden = !app.settings.auth || !!app.token;
  document.getElementById('signout').hidden = !app.token;
  window.addEventListener('hashchange', route);
  route();
  approvalCount();
  const count = debounced(approvalCount, 100);
  onChange((kind) => { if (kind !== 'goal') count(); }, true);
  followChanges();
}

start();
