// server_e2e.js — `squad serve` end to end (run by tests/cli_serve.sh; CTest passes the squad binary).
//
//   node tests/server_e2e.js path/to/squad
//
// Starts the real server on free loopback ports with a tiny synthesized model that carries the real
// Qwen3 tokenizer and checks, against squad's own command line as the reference:
//   1. /v1/score equals `squad score` on the same rows (probabilities, reuse figures, row errors);
//      /v1/ask equals `squad ask` (answers, state tokens);
//   2. /v1/decisions and /v1/systemone answer what the rows of docs/decisions-api.md section C give when
//      scored with `squad score` (the rows are rendered here from the contract's text and tokenised
//      with `squad tokenize`), with the response fields of sections A / B;
//   3. the request memo (section G): the same answers, "memo": true, usage all cached;
//   4. every bad input of section F: its status, its error body, a message naming the field or the
//      limit, and the server keeps answering;
//   5. 32 concurrent clients x 100 requests (on a second server with the request memo off and API
//      keys) all get the answers computed one at a time;
//   6. /metrics is Prometheus text (a strict parser below) and its request counters equal what this
//      test sent; /v1/stats says the same;
//   7. SIGTERM with requests in flight: each gets its answer, exit status 0;
//   8. batching: the same requests sent at once to a server with --max-rows 4 and to one with
//      --max-rows 1 (both --precision exact) get the same answers within 1e-5; the batching metrics
//      parse and move (steps, rows and tokens per step, rows in flight, the limits); a request whose
//      client leaves, and one whose --timeout passes, while others are in flight: the others are
//      answered, the same as before;
//   9. start-up: --tokenizer FILE outside a model directory that has no tokenizer.json serves /v1/ask
//      with squad ask's answers; --template FILE changes /v1/ask's answers as `squad ask --template
//      FILE` does; a --template or --tokenizer file that is missing, an empty --api-key and an
//      --api-key-file with no key (empty, or only comments) stop the start with exit 2 and a message.
// What these tests and tests/fuzz/fuzz_http.c find in the server is listed in NOTES-servertest.md.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const L = require('./server_lib.js');
const { spawnSync } = require('child_process');
const { Checks, request } = L;

const SQUAD = path.resolve(process.argv[2] || 'build/squad');
const C = new Checks('server_e2e');
const MAX_POS = 1024;          // the test model's max_position_embeddings (a longer request is refused)
const MAX_BODY = 65536;        // server A's --max-body
const CLIENTS = 32;
const PER_CLIENT = 100;
const API_KEY = 'test-key-123';
const TOL = 1e-6;              // probabilities: the server against the command line

// ---- request tally: what /metrics must count ------------------------------------------------
// key "endpoint status" -> count, per server
function tally(server, endpoint, status) {
  server.sent = server.sent || {};
  const k = `${endpoint} ${status}`;
  server.sent[k] = (server.sent[k] || 0) + 1;
}
async function send(server, method, endpoint, body, headers = {}) {
  const r = await request(server.base, method, endpoint, body, headers);
  tally(server, endpoint, r.status);
  return r;
}

// ---- deep comparison with a tolerance on numbers ---------------------------------------------
function deepClose(a, b, tol, where = '') {
  if (typeof a === 'number' && typeof b === 'number') return Math.abs(a - b) <= tol ? null : `${where}: ${a} vs ${b}`;
  if (Array.isArray(a) !== Array.isArray(b) || typeof a !== typeof b) return `${where}: ${JSON.stringify(a)} vs ${JSON.stringify(b)}`;
  if (a === null || typeof a !== 'object') return a === b ? null : `${where}: ${JSON.stringify(a)} vs ${JSON.stringify(b)}`;
  const ka = Object.keys(a), kb = Object.keys(b);
  if (ka.join() !== kb.join()) return `${where}: keys [${ka}] vs [${kb}]`;
  for (const k of ka) {
    const d = deepClose(a[k], b[k], tol, `${where}.${k}`);
    if (d) return d;
  }
  return null;
}

// ---- requests of the test ---------------------------------------------------------------------
const examples = ['login', 'cart', 'settings'].map((n) => JSON.parse(fs.readFileSync(`examples/${n}.json`, 'utf8')));
const LOGIN = examples[0];

// decisions-API requests: every question type, system / developer messages, input_json parts,
// input_text parts with a cache breakpoint, question instructions as parts, typed choice values
function decisionsRequests(model) {
  return [
    { model, input: 'Page: Login', questions: [
      { type: 'choice', instructions: 'Which button submits the form?',
        choices: [{ value: 'Sign in' }, { value: 'Forgot password?', description: 'a link' }, { value: true }] }] },
    { model, input: [{ role: 'developer', content: LOGIN.system }, { role: 'user', content: LOGIN.state }],
      questions: [
        { type: 'predicate', name: 'empty_password', instructions: 'Is the password field empty?' },
        { type: 'choice', name: 'focus', instructions: [{ type: 'input_text', text: 'Which element' }, { type: 'input_text', text: 'has focus?' }],
          choices: [{ value: 'email' }, { value: 'password', description: 'the password input' }, { value: false }, { value: 'false' }] },
        { type: 'score', name: 'done', instructions: 'How complete is the form?',
          levels: [{ label: 'empty' }, { label: 'partly filled', description: 'some fields' }, { label: 'complete' }] },
        { type: 'predicate', instructions: '' }] },
    { model, input: [
      { type: 'message', role: 'system', content: [{ type: 'input_text', text: 'You grade support tickets.' }] },
      { role: 'developer', content: 'Be strict.' },
      { role: 'user', content: [
        { type: 'input_text', text: 'Ticket:', prompt_cache_breakpoint: { mode: 'explicit' } },
        { type: 'input_json', data: { id: 1042, customer: { name: 'Zoë', tier: 'gold' }, tags: ['billing', 'urgent'], amount: 12.5, refunded: false, note: null } }] },
      { role: 'user', content: 'I was charged twice for order #1042. Please fix this.' }],
    questions: [
      { type: 'choice', name: 'topic', instructions: 'What is the ticket about?',
        choices: [{ value: 'billing' }, { value: 'shipping' }, { value: 'login' }] },
      { type: 'score', name: 'urgency', instructions: '', levels: [{ label: 'low' }, { label: 'medium' }, { label: 'high' }, { label: 'critical' }] }] },
  ];
}

function systemOneRequests(model) {
  return [
    { model, state: 'Page: Login\nThe email field holds ada@example.com; the password field is empty.',
      questions: { can_sign_in: { type: 'noul', instructions: 'Can the user sign in now?', criteria: { true: 'both fields are filled' } } } },
    { state: { page: 'checkout', items: [{ sku: 'A1', qty: 2 }, { sku: 'B7', qty: 1 }], total: 41.5, coupon: null },
      instructions: 'You check checkout pages.',
      questions: {
        kind: { type: 'choice', instructions: 'Which step is this?', criteria: { cart: 'the cart', payment: null, done: 'the confirmation' } },
        quality: { type: 'score', instructions: { ask: 'rate the page', scale: [0, 2] }, criteria: ['unclear', null, 'fine'] },
        paid: { type: 'noul', criteria: { true: 'the order is paid', false: 'payment is pending' } },
        bare: { type: 'noul' } } },
    { model: 'jev-latest', state: LOGIN.state, instructions: LOGIN.system,
      questions: { focus: { type: 'choice', instructions: 'Which element has keyboard focus?', criteria: { email: null, password: null, 'sign in': 'the button' } },
        ready: { type: 'noul', instructions: 'Is the form ready to submit?', criteria: null } } },
  ];
}

// The expected answers of decision requests: their rows rendered here, scored by `squad score`.
function expectDecisions(reqs) {
  const specs = [];
  const plan = reqs.map((r) => {
    const { system, state } = L.decisionsInput(r.input);
    return r.questions.map((q) => { const d = L.decisionsQuestion(q); specs.push({ system, state, ...d }); return d; });
  });
  return { specs, plan };
}
function expectSystemOne(reqs) {
  const specs = [];
  const plan = reqs.map((r) => {
    const state = typeof r.state === 'string' ? r.state : L.pyJson(r.state);
    const ins = r.instructions === undefined || r.instructions === null ? '' : typeof r.instructions === 'string' ? r.instructions : L.pyJson(r.instructions);
    return Object.entries(r.questions).map(([id, q]) => { const d = { id, ...L.systemOneQuestion(q) }; specs.push({ system: ins, state, ...d }); return d; });
  });
  return { specs, plan };
}

function top(ps) { return Math.max(...ps); }

function checkDecisionAnswer(q, d, a, probs, what) {
  C.eq(a.type, q.type, `${what}: type`);
  C.eq(a.name === undefined ? 'absent' : a.name, q.name === undefined ? null : q.name, `${what}: name`);
  if (q.type === 'predicate') {
    C.close([a.probability], [probs[1]], `${what}: P(true) = the row's B`, TOL);
    return;
  }
  const got = (a.probabilities || []).map((p) => p.probability);
  C.close(got, probs, `${what}: probabilities = the row's`, TOL);
  C.ok(a.confidence > 0 && a.confidence <= top(got) + 1e-9, `${what}: 0 < confidence <= top probability`, a.confidence);
  if (q.type === 'choice') {
    C.eq(a.probabilities.map((p) => p.value), q.choices.map((c) => c.value), `${what}: values typed, in request order`);
    const best = probs.indexOf(top(probs));
    C.eq(a.choice, q.choices[best].value, `${what}: choice = the most likely value`);
  } else {
    C.eq(a.probabilities.map((p) => [p.value, p.label]), q.levels.map((l, i) => [i, l.label]), `${what}: levels`);
    const expect = probs.reduce((s, p, i) => s + i * p, 0);
    C.ok(Math.abs(a.score - expect) <= 1e-5, `${what}: score = sum i p_i`, [a.score, expect]);
  }
}

function checkSystemOneAnswer(d, a, diag, probs, what) {
  C.eq(a.type, d.kind, `${what}: type`);
  C.ok(diag && diag.label_mass > 0 && diag.label_mass <= 1 + 1e-9 && typeof diag.argmax_is_label === 'boolean',
    `${what}: diagnostics`, diag);
  let p, topP;
  if (d.kind === 'noul') {
    const sum = probs.reduce((s, x) => s + x, 0);
    const yes = (probs[0] + probs[2]) / sum, no = (probs[1] + probs[3]) / sum;
    C.close([a.noul, a.probabilities.yes, a.probabilities.no], [yes, yes, no], `${what}: noul = p(yes) + p(Yes)`, TOL);
    topP = Math.max(yes, no);
  } else if (d.kind === 'choice') {
    C.eq(Object.keys(a.probabilities), d.names, `${what}: names in order`);
    p = Object.values(a.probabilities);
    C.close(p, probs, `${what}: probabilities = the row's`, TOL);
    C.eq(a.choice, d.names[probs.indexOf(top(probs))], `${what}: choice`);
    topP = top(p);
  } else {
    C.eq(Object.keys(a.probabilities), d.labels, `${what}: levels 0..`);
    p = Object.values(a.probabilities);
    C.close(p, probs, `${what}: probabilities = the row's`, TOL);
    C.eq(a.legend, Object.fromEntries(d.legend.map((t, i) => [String(i), t])), `${what}: legend`);
    C.ok(Math.abs(a.score - probs.reduce((s, x, i) => s + i * x, 0)) <= 1e-5, `${what}: score = expected level`, a.score);
    topP = top(p);
  }
  if (diag) C.ok(Math.abs(a.confidence - topP * diag.label_mass) <= 1e-6, `${what}: confidence = top x label_mass`, [a.confidence, topP, diag.label_mass]);
}

// What the concurrency phase compares: a response without its per-call fields.
function normal(endpoint, j) {
  if (!j) return j;
  if (endpoint === '/v1/ask') return { answers: j.answers, state: j.tokens && j.tokens.state };
  if (endpoint === '/v1/score') return { results: (j.results || []).map((r) => (r.error ? { error: r.error } : { probs: r.probs })) };
  if (endpoint === '/v1/decisions') return { model: j.model, answers: j.answers };
  return { model: j.model, answers: j.answers, diagnostics: j.diagnostics };
}

// ---- Prometheus text: a strict parser ---------------------------------------------------------
// Returns {families: name -> {type, help, samples: [{name, labels, value}]}} or throws with the line.
function parsePrometheus(text) {
  const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
  const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
  const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);
  if (!text.endsWith('\n')) throw new Error('the text does not end with a newline');
  const families = {};
  const seen = new Set();
  const familyOf = (name) => {
    if (families[name]) return name;
    for (const suf of ['_bucket', '_sum', '_count', '_total', '_created']) {
      const base = name.endsWith(suf) ? name.slice(0, -suf.length) : null;
      if (base && families[base]) return base;
    }
    return null;
  };
  const lines = text.split('\n');
  lines.pop();
  lines.forEach((line, n) => {
    const fail = (why) => { throw new Error(`line ${n + 1}: ${why}: ${line}`); };
    if (line === '') return;
    if (line.startsWith('#')) {
      const m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line);
      if (!m) return;  // a plain comment
      if (!NAME.test(m[2])) fail('bad metric name');
      const f = families[m[2]] || (families[m[2]] = { samples: [] });
      if (m[1] === 'TYPE') {
        if (f.type) fail('a second TYPE');
        if (f.samples.length) fail('TYPE after samples');
        if (!TYPES.has(m[3])) fail('unknown type');
        f.type = m[3];
      } else {
        if (f.help !== undefined) fail('a second HELP');
        f.help = m[3];
      }
      return;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([^ ]+)( -?[0-9]+)?$/.exec(line);
    if (!m) fail('not a sample');
    const labels = {};
    if (m[2]) {
      const body = m[2].slice(1, -1);
      const re = /\s*([^=\s]+)="((?:[^"\\\n]|\\["\\n])*)"\s*(,|$)/y;
      let at = 0;
      while (at < body.length) {
        re.lastIndex = at;
        const lm = re.exec(body);
        if (!lm) fail('bad labels');
        if (!LABEL.test(lm[1])) fail('bad label name');
        if (lm[1] in labels) fail('a label twice');
        labels[lm[1]] = lm[2].replace(/\\(["\\n])/g, (_, c) => (c === 'n' ? '\n' : c));
        at = re.lastIndex;
        if (lm[3] === '' ) break;
      }
    }
    const v = m[3];
    if (!/^([+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]Inf|NaN)$/.test(v)) fail('bad value');
    const value = v === '+Inf' ? Infinity : v === '-Inf' ? -Infinity : Number(v);
    const fam = familyOf(m[1]);
    if (!fam) fail('a sample without a TYPE or HELP line for its family');
    const f = families[fam];
    if (!f.type) fail('a sample before its TYPE');
    if (f.type === 'counter' && !(value >= 0)) fail('a negative counter');
    const key = m[1] + JSON.stringify(Object.entries(labels).sort());
    if (seen.has(key)) fail('a series twice');
    seen.add(key);
    f.samples.push({ name: m[1], labels, value });
  });
  // histograms: buckets cumulative, +Inf = _count, per label set
  for (const [name, f] of Object.entries(families)) {
    if (f.type !== 'histogram') continue;
    const groups = {};
    for (const s of f.samples) {
      const { le, ...rest } = s.labels;
      const g = groups[JSON.stringify(Object.entries(rest).sort())] || (groups[JSON.stringify(Object.entries(rest).sort())] = { buckets: [] });
      if (s.name === name + '_bucket') {
        if (le === undefined) throw new Error(`${name}_bucket without le`);
        g.buckets.push([le === '+Inf' ? Infinity : Number(le), s.value]);
      } else if (s.name === name + '_count') g.count = s.value;
      else if (s.name === name + '_sum') g.sum = s.value;
      else throw new Error(`${s.name} in histogram ${name}`);
    }
    for (const [k, g] of Object.entries(groups)) {
      g.buckets.sort((x, y) => x[0] - y[0]);
      for (let i = 1; i < g.buckets.length; i++)
        if (g.buckets[i][1] < g.buckets[i - 1][1]) throw new Error(`${name}${k}: buckets not cumulative`);
      const inf = g.buckets[g.buckets.length - 1];
      if (!inf || inf[0] !== Infinity) throw new Error(`${name}${k}: no +Inf bucket`);
      if (g.count !== inf[1]) throw new Error(`${name}${k}: _count ${g.count} != +Inf bucket ${inf[1]}`);
      if (g.sum === undefined) throw new Error(`${name}${k}: no _sum`);
    }
  }
  return families;
}

// The request counters of /metrics against the test's tally. The family that counts requests by
// endpoint and status is found by its labels (an "endpoint" or "path" label and a "status" or
// "code" label), so the check does not depend on one spelling of its name.
function checkMetrics(server, what, fams) {
  let fam = null;
  for (const [name, f] of Object.entries(fams)) {
    if (f.type !== 'counter') continue;
    const s = f.samples[0];
    if (s && ('endpoint' in s.labels || 'path' in s.labels) && ('status' in s.labels || 'code' in s.labels)) { fam = name; break; }
  }
  if (!C.ok(fam, `${what}: a counter of requests by endpoint and status`, Object.keys(fams))) return;
  const got = {};
  for (const s of fams[fam].samples) {
    const ep = s.labels.endpoint !== undefined ? s.labels.endpoint : s.labels.path;
    const st = s.labels.status !== undefined ? s.labels.status : s.labels.code;
    got[`${ep} ${st}`] = (got[`${ep} ${st}`] || 0) + s.value;
  }
  for (const [k, n] of Object.entries(server.sent)) {
    const [ep] = k.split(' ');
    if (!/^\/v1\/(ask|score|decisions|systemone)$/.test(ep)) continue;  // the API endpoints are what must add up
    C.eq(got[k] || 0, n, `${what}: ${fam}{${k}}`);
  }
  const histo = Object.entries(fams).find(([, f]) => f.type === 'histogram');
  C.ok(histo, `${what}: a latency histogram`);
}

// ---- the phases -------------------------------------------------------------------------------
async function phaseScoreAsk(A, M) {
  // /v1/score against `squad score`: decision rows (long state: cached), plain short rows, a bad row
  const dreq = decisionsRequests('m');
  const { specs } = expectDecisions(dreq);
  const rows = L.renderRows(SQUAD, M, specs);
  const mixed = rows.concat([{ ids: [5, 9, 12, 40], slots: [3], nopts: [3], letters: [1, 2, 3] },
    { ids: [1, 2], slots: [5], nopts: [2], letters: [1, 2] }, rows[1]]);
  const want = L.scoreRows(SQUAD, M, mixed);
  const r = await send(A, 'POST', '/v1/score', { rows: mixed });
  C.eq(r.status, 200, '/v1/score status');
  if (C.ok(r.json && Array.isArray(r.json.results) && r.json.results.length === mixed.length, '/v1/score results', r.text)) {
    r.json.results.forEach((g, i) => {
      const w = want[i];
      if (w.error) {
        C.ok(typeof g.error === 'string' && g.error.length > 0, `/v1/score row ${i}: an error, as squad score gives`, g);
        C.eq(g.error, w.error, `/v1/score row ${i}: the same message as squad score`);
      } else {
        C.ok(!deepClose(g.probs, w.probs, TOL), `/v1/score row ${i}: probs = squad score's`, [g.probs, w.probs]);
        C.eq([g.reused, g.computed], [w.reused, w.computed], `/v1/score row ${i}: reused / computed = squad score's (same order, fresh cache)`);
      }
    });
  }
  // /v1/ask against `squad ask`
  for (const [i, ex] of examples.entries()) {
    const cli = L.runSquad(SQUAD, ['ask', '--model', M], JSON.stringify(ex));
    const want = JSON.parse(cli.stdout);
    const r = await send(A, 'POST', '/v1/ask', ex);
    C.eq(r.status, 200, `/v1/ask example ${i} status`);
    if (!r.json) { C.ok(false, `/v1/ask example ${i} JSON`, r.text); continue; }
    const d = deepClose(r.json.answers, want.answers, TOL);
    C.ok(!d, `/v1/ask example ${i}: answers = squad ask's`, d);
    C.eq(r.json.tokens && r.json.tokens.state, want.tokens.state, `/v1/ask example ${i}: tokens.state`);
    C.eq(r.json.memo, false, `/v1/ask example ${i}: "memo": false the first time`);
    C.ok(typeof r.json.ms === 'number', `/v1/ask example ${i}: ms`);
  }
  return rows;
}

async function phaseDecisions(A, M, model) {
  const dreq = decisionsRequests(model);
  const sreq = systemOneRequests(model);
  const de = expectDecisions(dreq), se = expectSystemOne(sreq);
  const rows = L.renderRows(SQUAD, M, de.specs.concat(se.specs));
  const scored = L.scoreRows(SQUAD, M, rows);
  const probsOf = scored.map((s) => s.probs[0]);
  let k = 0;
  const out = [];
  for (const [i, req] of dreq.entries()) {
    const r = await send(A, 'POST', '/v1/decisions', req);
    const what = `/v1/decisions request ${i}`;
    if (!C.eq(r.status, 200, `${what} status`) || !r.json) { console.error(r.text); k += req.questions.length; continue; }
    C.eq(r.json.model, model, `${what}: model`);
    C.eq(r.json.answers.length, req.questions.length, `${what}: an answer per question`);
    let inTok = 0;
    req.questions.forEach((q, j) => {
      checkDecisionAnswer(q, de.plan[i][j], r.json.answers[j] || {}, probsOf[k], `${what} question ${j}`);
      inTok += rows[k].ids.length;
      k++;
    });
    const u = r.json.usage || {};
    C.eq(u.input_tokens, inTok, `${what}: usage.input_tokens = the rows' tokens`);
    C.eq(u.output_tokens, req.questions.length, `${what}: usage.output_tokens = questions`);
    C.eq(u.total_tokens, inTok + req.questions.length, `${what}: usage.total_tokens`);
    C.eq(u.output_tokens_details, { reasoning_tokens: 0 }, `${what}: reasoning_tokens 0`);
    const c = u.input_tokens_details || {};
    C.ok(c.cached_tokens >= 0 && c.cached_tokens <= inTok && c.cache_write_tokens >= 0, `${what}: cache figures`, c);
    out.push({ endpoint: '/v1/decisions', body: req, json: r.json });
  }
  for (const [i, req] of sreq.entries()) {
    const r = await send(A, 'POST', '/v1/systemone', req);
    const what = `/v1/systemone request ${i}`;
    const ids = Object.keys(req.questions);
    if (!C.eq(r.status, 200, `${what} status`) || !r.json) { console.error(r.text); k += ids.length; continue; }
    C.ok(/^decision-\S+$/.test(r.json.id), `${what}: id`, r.json.id);
    C.eq(r.json.object, 'structured_decision', `${what}: object`);
    C.ok(Math.abs(r.json.created - Date.now() / 1000) < 120, `${what}: created`, r.json.created);
    C.eq(Object.keys(r.json.answers || {}), ids, `${what}: answers under the ids, in order`);
    let inTok = 0;
    ids.forEach((id, j) => {
      checkSystemOneAnswer(se.plan[i][j], r.json.answers[id] || {}, (r.json.diagnostics || {})[id], probsOf[k], `${what} ${id}`);
      inTok += rows[k].ids.length;
      k++;
    });
    C.eq(r.json.usage, { input_tokens: inTok, output_tokens: ids.length }, `${what}: usage`);
    out.push({ endpoint: '/v1/systemone', body: req, json: r.json });
  }
  // a state no earlier request used (over 256 tokens), three questions: the first computes and
  // checkpoints it (cache_write_tokens), the others restore it (cached_tokens)
  const fresh = { model, input: `${LOGIN.state}\nA banner no earlier page had: ${'offer '.repeat(40)}`,
    questions: [{ type: 'predicate', instructions: 'Is there a banner?' }, { type: 'predicate', instructions: 'Is it an offer?' },
      { type: 'predicate', instructions: 'Is the form valid?' }] };
  const fr = await send(A, 'POST', '/v1/decisions', fresh);
  const fu = (fr.json && fr.json.usage && fr.json.usage.input_tokens_details) || {};
  C.ok(fu.cached_tokens > 0, '/v1/decisions, a new state: the later questions restore what the first computed', fr.text);
  C.ok(fu.cache_write_tokens > 0, '/v1/decisions, a new state: its new checkpoints are counted in cache_write_tokens', fr.text);
  // one more question about a page already seen: its state comes from the cache
  const again = { model, input: [{ role: 'developer', content: LOGIN.system }, { role: 'user', content: LOGIN.state }],
    questions: [{ type: 'predicate', instructions: 'Is there a link to create an account?' }] };
  const r = await send(A, 'POST', '/v1/decisions', again);
  C.ok(r.status === 200 && r.json.usage.input_tokens_details.cached_tokens >= 256,
    '/v1/decisions: a new question about a cached page restores its state', r.json && r.json.usage);
  return out;
}

async function memoHits(S) {
  const m = await request(S.base, 'GET', '/metrics');
  const f = parsePrometheus(m.text).squad_request_memo_hits_total;
  return f ? f.samples[0].value : NaN;
}

async function phaseMemo(A, done) {
  const hits0 = await memoHits(A);
  for (const { endpoint, body, json } of done) {
    const r = await send(A, 'POST', endpoint, body);
    const what = `memo ${endpoint}`;
    if (!C.eq(r.status, 200, `${what} status`)) continue;
    C.ok(!deepClose(normal(endpoint, r.json), normal(endpoint, json), 0), `${what}: the same answers`);
    if (endpoint === '/v1/decisions') {
      const u = r.json.usage;
      C.eq([u.input_tokens_details.cached_tokens, u.input_tokens_details.cache_write_tokens], [u.input_tokens, 0], `${what}: usage all cached, none written`);
      C.eq(u.input_tokens, json.usage.input_tokens, `${what}: the same input tokens`);
    } else {
      C.ok(r.json.id !== json.id, `${what}: a new id`, [r.json.id, json.id]);
      C.eq(r.json.usage, json.usage, `${what}: usage`);
    }
  }
  const ask = await send(A, 'POST', '/v1/ask', LOGIN);
  C.eq(ask.json && ask.json.memo, true, 'memo /v1/ask: "memo": true');
  const first = examples[0];
  const r2 = await send(A, 'POST', '/v1/ask', JSON.stringify(first, null, 1));  // other bytes: not the memo
  C.eq(r2.json && r2.json.memo, false, 'memo: a body with other bytes is not a repeat');
  const sc = { rows: [{ ids: [5, 9, 12, 40], slots: [3], nopts: [3], letters: [1, 2, 3] }] };
  const s1 = await send(A, 'POST', '/v1/score', sc), s2 = await send(A, 'POST', '/v1/score', sc);
  C.ok(s2.json && !deepClose(normal('/v1/score', s1.json), normal('/v1/score', s2.json), 0) && s2.json.memo === true,
    'memo /v1/score: the same results, "memo": true', s2.text);
  C.eq(await memoHits(A) - hits0, done.length + 2, '/metrics: squad_request_memo_hits_total counts the repeats sent');
}

// Each bad input: [endpoint, body (string: sent as is), status, text the message must contain]
function badInputs(model) {
  const q = [{ type: 'predicate', instructions: 'x' }];
  const sq = { a: { type: 'noul' } };
  const longState = 'word '.repeat(MAX_POS + 100);
  const many = (n, f) => Array.from({ length: n }, (_, i) => f(i));
  const dec = (o) => ({ model, input: 'Page', questions: q, ...o });
  const so = (o) => ({ state: 'Page', questions: sq, ...o });
  const ask = (o) => ({ state: 'Page', questions: [{ text: 'q', options: ['a', 'b'] }], ...o });
  return [
    // malformed JSON, invalid UTF-8, duplicate keys: 400 everywhere
    ...['/v1/decisions', '/v1/systemone', '/v1/ask', '/v1/score'].flatMap((ep) => [
      [ep, '{"model": ', 400, 'JSON'],
      [ep, Buffer.from([0x7b, 0x22, 0x73, 0x74, 0x61, 0x74, 0x65, 0x22, 0x3a, 0x20, 0x22, 0xff, 0xfe, 0x22, 0x7d]), 400, 'UTF-8'],
      [ep, '{"state": "a", "state": "b"}', 400, 'state'],
      [ep, '[1, 2]', 400, 'must be a JSON object, not an array'],  // one reader: the same on every endpoint
    ]),
    ['/v1/decisions', dec({ model: undefined }), 400, 'model'],
    ['/v1/decisions', dec({ model: 7 }), 400, 'model'],
    ['/v1/decisions', dec({ model: 'no-such-model' }), 404, 'no-such-model'],
    ['/v1/decisions', dec({ temperature: 0 }), 400, 'temperature'],
    ['/v1/decisions', dec({ input: undefined }), 400, 'input'],
    ['/v1/decisions', dec({ input: 5 }), 400, 'input'],
    ['/v1/decisions', dec({ input: [{ role: 'assistant', content: 'hi' }] }), 400, 'assistant'],
    ['/v1/decisions', dec({ input: [{ type: 'function_call', call_id: 'c1', name: 'click', arguments: '{}' }] }), 400, 'function_call'],
    ['/v1/decisions', dec({ input: [{ type: 'function_call_output', call_id: 'c1', output: 'ok' }] }), 400, 'function_call_output'],
    ['/v1/decisions', dec({ input: [{ type: 'custom_tool_call', call_id: 'c1', name: 't', input: 'x' }] }), 400, 'custom_tool_call'],
    ['/v1/decisions', dec({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://x/y.png' }] }] }), 400, 'input[0].content[0].image_url'],
    ['/v1/decisions', dec({ questions: [] }), 400, 'questions'],
    ['/v1/decisions', dec({ questions: many(65, () => q[0]) }), 400, 'questions'],
    ['/v1/decisions', dec({ questions: [{ type: 'guess', instructions: 'x' }] }), 400, 'type'],
    ['/v1/decisions', dec({ questions: [{ type: 'predicate' }] }), 400, 'instructions'],
    ['/v1/decisions', dec({ questions: [{ type: 'predicate', instructions: 'x', extra: 1 }] }), 400, 'extra'],
    ['/v1/decisions', dec({ questions: [{ type: 'choice', instructions: 'x', choices: [{ value: 'a' }] }] }), 400, 'choices'],
    ['/v1/decisions', dec({ questions: [{ type: 'choice', instructions: 'x', choices: many(27, (i) => ({ value: 'v' + i })) }] }), 400, 'choices'],
    ['/v1/decisions', dec({ questions: [{ type: 'choice', instructions: 'x', choices: [{ value: 'a' }, { value: 'a' }] }] }), 400, 'choices'],
    ['/v1/decisions', dec({ questions: [{ type: 'choice', instructions: 'x', choices: [{ value: 1 }, { value: 'a' }] }] }), 400, 'value'],
    ['/v1/decisions', dec({ questions: [{ type: 'score', instructions: 'x', levels: many(11, (i) => ({ label: 'l' + i })) }] }), 400, 'levels'],
    ['/v1/decisions', dec({ input: longState }), 400, 'token'],
    ['/v1/systemone', so({ state: undefined, questions: sq }), 400, 'state'],
    ['/v1/systemone', so({ model: 'gpt-4' }), 404, 'gpt-4'],
    ['/v1/systemone', so({ questions: {} }), 400, 'questions'],
    ['/v1/systemone', so({ questions: [] }), 400, 'questions'],
    ['/v1/systemone', so({ questions: { a: { type: 'noul', extra: 1 } } }), 400, 'extra'],
    ['/v1/systemone', so({ questions: { a: { type: 'choice', criteria: {} } } }), 400, 'criteria'],
    ['/v1/systemone', so({ questions: { a: { type: 'score', criteria: ['only one'] } } }), 400, 'criteria'],
    ['/v1/systemone', so({ questions: { a: { type: 'noul', criteria: { maybe: 'x' } } } }), 400, 'maybe'],
    ['/v1/systemone', so({ questions: { a: { type: 'dice' } } }), 400, 'type'],
    ['/v1/systemone', so({ unknown_field: 1 }), 400, 'unknown_field'],
    ['/v1/systemone', so({ state: longState }), 400, 'token'],
    ['/v1/ask', ask({ state: '' }), 422, 'state'],
    ['/v1/ask', ask({ questions: undefined }), 422, 'questions'],
    ['/v1/ask', ask({ questions: [{ text: 'q', options: ['a', 7] }] }), 422, 'options[1]'],
    ['/v1/ask', ask({ questions: [{ text: 'q', options: many(27, (i) => 'o' + i) }] }), 422, '27'],
    ['/v1/ask', ask({ colour: 'red' }), 422, 'colour'],
    ['/v1/ask', ask({ state: longState }), 422, 'token'],
    ['/v1/score', { rows: 5 }, 400, 'rows'],
    ['/v1/score', { lines: [] }, 400, 'rows'],
  ];
}

async function phaseBad(A, model) {
  for (const [ep, body, status, part] of badInputs(model)) {
    const payload = typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body);
    const r = await send(A, 'POST', ep, payload);
    const what = `bad input ${ep} ${String(payload).slice(0, 80)}`;
    C.eq(r.status, status, `${what}: status`);
    const e = r.json && r.json.error;
    if (!C.ok(e && typeof e.message === 'string' && e.message.length > 0 && typeof e.type === 'string', `${what}: error body`, r.text)) continue;
    if (part) C.has(e.message, part, `${what}: the message names it`);
    if (ep === '/v1/decisions' || ep === '/v1/systemone') {
      C.eq(e.code, status, `${what}: error.code`);
      C.ok('param' in e, `${what}: error.param`, e);
    }
  }
  // /v1/score: a row that fails validation is that row's error, the others are answered
  const r = await send(A, 'POST', '/v1/score', { rows: [{ ids: [5, 9, 12, 40], slots: [3], nopts: [3], letters: [1, 2, 3] }, { ids: [1], slots: [4], nopts: [2], letters: [1, 2] }, { ids: Array(MAX_POS + 10).fill(7), slots: [MAX_POS + 5], nopts: [2], letters: [1, 2] }] });
  C.ok(r.status === 200 && r.json.results[0].probs && r.json.results[1].error && /token|long|support/.test(r.json.results[2].error || ''),
    '/v1/score: bad rows get their own errors (200)', r.text);
  // over --max-body: 413
  const big = JSON.stringify({ state: 'x'.repeat(MAX_BODY + 10), questions: [{ text: 'q', options: ['a', 'b'] }] });
  for (const ep of ['/v1/ask', '/v1/score', '/v1/decisions', '/v1/systemone']) {
    const r = await send(A, 'POST', ep, big);
    C.eq(r.status, 413, `${ep} over --max-body: 413`);
    C.ok(r.json && r.json.error && /bod|large|max/i.test(r.json.error.message), `${ep} 413 message`, r.text);
  }
  // unknown paths and methods
  const r404 = await request(A.base, 'GET', '/v1/nothing-here');
  C.eq(r404.status, 404, 'unknown path: 404');
  for (const ep of ['/v1/ask', '/v1/decisions']) {
    const r405 = await request(A.base, 'GET', ep);
    C.eq(r405.status, 405, `GET ${ep}: 405`);
    tally(A, ep, r405.status);
  }
  const r405b = await request(A.base, 'DELETE', '/v1/models');
  C.eq(r405b.status, 405, 'DELETE /v1/models: 405');
  // and the server still answers
  const ok = await send(A, 'POST', '/v1/ask', examples[1]);
  C.eq(ok.status, 200, 'after the bad inputs, a good request is answered');
}

async function phaseAuth(B, model) {
  const body = { model, input: 'Page', questions: [{ type: 'predicate', instructions: 'x' }] };
  for (const ep of ['/v1/decisions', '/v1/systemone', '/v1/ask', '/v1/score']) {
    const r = await send(B, 'POST', ep, body);
    C.eq(r.status, 401, `${ep} without a key: 401`);
    const w = await send(B, 'POST', ep, body, { authorization: 'Bearer wrong' });
    C.eq(w.status, 401, `${ep} with a wrong key: 401`);
    C.ok(w.json && w.json.error && w.json.error.message, `${ep} 401 body`, w.text);
  }
  for (const ep of ['/health', '/ready', '/metrics', '/v1/models']) {
    const r = await request(B.base, 'GET', ep);
    C.eq(r.status, 200, `${ep} needs no key`);
  }
  const cc = await request(B.base, 'POST', '/v1/cache/clear', '');
  C.eq(cc.status, 401, '/v1/cache/clear needs the key');
  const cc2 = await request(B.base, 'POST', '/v1/cache/clear', '', { authorization: `Bearer ${API_KEY}` });
  C.eq(cc2.status, 200, '/v1/cache/clear with the key');
}

async function phaseConcurrent(B, pool) {
  const auth = { authorization: `Bearer ${API_KEY}` };
  let wrong = 0, failed = 0, firstBad = null;
  const t0 = Date.now();
  await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
    for (let i = 0; i < PER_CLIENT; i++) {
      const p = pool[(c * 7 + i * 13) % pool.length];
      let r;
      try {
        r = await send(B, 'POST', p.endpoint, p.text, auth);
      } catch (e) {
        failed++;
        firstBad = firstBad || String(e);
        continue;
      }
      const d = r.status === 200 ? deepClose(normal(p.endpoint, r.json), p.want, TOL) : `HTTP ${r.status} ${r.text}`;
      if (d) { wrong++; firstBad = firstBad || `${p.endpoint}: ${d}`; }
    }
  }));
  C.ok(wrong === 0 && failed === 0, `${CLIENTS} clients x ${PER_CLIENT} requests: every answer correct`, { wrong, failed, firstBad });
  console.log(`server_e2e: ${CLIENTS * PER_CLIENT} concurrent requests in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}

async function phaseMetrics(S, what) {
  const m = await request(S.base, 'GET', '/metrics');
  C.eq(m.status, 200, `${what}: /metrics status`);
  C.ok(/^text\/plain/.test(m.headers['content-type'] || ''), `${what}: /metrics content type`, m.headers['content-type']);
  let fams = null;
  try { fams = parsePrometheus(m.text); } catch (e) { C.ok(false, `${what}: /metrics parses as Prometheus text`, e.message); }
  if (fams) { C.ok(true, `${what}: /metrics parses`); checkMetrics(S, what, fams); }
  const st = await request(S.base, 'GET', '/v1/stats', null, S.key ? { authorization: `Bearer ${S.key}` } : {});
  C.ok(st.status === 200 && st.json && typeof st.json === 'object', `${what}: /v1/stats is JSON`, st.text);
  // /v1/stats says the same as /metrics: the API endpoints' requests by status
  if (fams && st.json && st.json.requests && fams.squad_http_requests_total) {
    let same = true;
    const diffs = [];
    for (const smp of fams.squad_http_requests_total.samples) {
      const ep = smp.labels.endpoint;
      if (!/^\/v1\/(ask|score|decisions|systemone)$/.test(ep)) continue;
      const j = ((st.json.requests[ep] || {}).by_status || {})[smp.labels.code];
      if (j !== smp.value) { same = false; diffs.push([ep, smp.labels.code, smp.value, j]); }
    }
    C.ok(same, `${what}: /v1/stats counts the requests /metrics counts`, diffs);
  }
  return { fams, stats: st.json };
}

// SIGTERM while requests are in flight: every request already sent gets its full answer. The
// requests are rows never seen before (so each needs the engine), their answers from `squad score`.
async function phaseSigterm(S, M, auth) {
  const N = 24, LEN = 700;
  let seed = 12345;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const rows = Array.from({ length: N }, () => {
    const ids = Array.from({ length: LEN }, () => rnd(150000));
    return { ids, slots: [LEN - 1], nopts: [3], letters: [32, 33, 34], state_len: LEN - 20 };
  });
  const want = L.scoreRows(SQUAD, M, rows).map((w) => w.probs);
  let firstDone = null;
  const started = new Promise((res) => { firstDone = res; });
  const pending = rows.map((row, i) => request(S.base, 'POST', '/v1/score', { rows: [row] }, auth, { agent: false })
    .then((r) => { firstDone(); return { i, r }; }, (e) => { firstDone(); return { i, e }; }));
  await Promise.race([started, L.sleep(5000 * L.SLOW)]);
  S.proc.kill('SIGTERM');
  const results = await Promise.all(pending);
  const exit = await S.exited;
  let lost = 0, wrong = 0, first = null;
  for (const { i, r, e } of results) {
    if (e || !r) { lost++; first = first || String(e); continue; }
    const d = r.status === 200 && r.json.results ? deepClose(r.json.results[0].probs, want[i], TOL) : `HTTP ${r.status} ${r.text}`;
    if (d) { wrong++; first = first || d; }
  }
  C.ok(lost === 0 && wrong === 0, `SIGTERM with ${N} requests in flight: every one answered correctly`, { lost, wrong, first });
  C.eq(exit, { code: 0, signal: null }, 'SIGTERM: exit status 0');
  const again = await request(S.base, 'GET', '/health', null, {}, { agent: false }).then(() => 'answered', () => 'refused');
  C.eq(again, 'refused', 'after SIGTERM nothing listens');
}

// A full queue and --timeout: 503 with Retry-After and a message naming the limit; every request
// still gets an answer, and the server goes on answering.
async function phaseOverload(S, M, model) {
  let seed = 777;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  // 400 rows of 1000 tokens: far more than any CPU runs within --timeout (the timeout, not the
  // work, bounds what this costs: the engine stops at its next chunk)
  const longRows = Array.from({ length: 400 }, () => {
    const ids = Array.from({ length: 1000 }, () => rnd(150000));
    return { ids, slots: [999], nopts: [3], letters: [32, 33, 34], state_len: 980 };
  });
  const t = await send(S, 'POST', '/v1/score', { rows: longRows });
  C.eq(t.status, 503, '--timeout passed while running: 503');
  C.ok(t.headers['retry-after'] !== undefined, '--timeout: Retry-After', t.headers);
  C.ok(t.json && t.json.error && /timeout/.test(t.json.error.message), '--timeout: the message names it', t.text);
  // 32 requests at once, each a new state of 700-900 tokens: with one running and one waiting, the
  // others find the queue full
  const reqs = Array.from({ length: 32 }, (_, i) => ({ model, input: `Page ${i}: ` + 'a long list of items, '.repeat(110 + i),
    questions: [{ type: 'predicate', instructions: 'Is the list long?' }, { type: 'predicate', instructions: `Item ${i}?` }] }));
  const results = await Promise.all(reqs.map((b) => send(S, 'POST', '/v1/decisions', b).catch((e) => ({ status: 0, text: String(e) }))));
  const full = results.filter((r) => r.status === 503);
  C.ok(results.every((r) => r.status === 200 || r.status === 503), 'a full queue: every request answered 200 or 503',
    results.map((r) => r.status));
  C.ok(full.length > 0, 'a full queue (--queue 1, 32 at once): some requests get 503', results.map((r) => r.status));
  C.ok(full.every((r) => r.headers['retry-after'] !== undefined && r.json && r.json.error && r.json.error.code === 503 &&
    /queue|timeout/.test(r.json.error.message)), 'a full queue: 503 bodies with Retry-After, code and the limit named',
  full.map((r) => r.text));
  C.ok(full.some((r) => /queue/.test(r.json.error.message)), 'a full queue: a message names the queue', full.map((r) => r.text));
  const ok = await send(S, 'POST', '/v1/decisions', reqs[0]);
  C.eq(ok.status, 200, 'after the overload a request is answered');
}

// A server started with --max-tokens under the model's positions: the engine's limit is the
// server's, and a longer request gets section F's status (decisions 400, ask 422, score 200 with the
// row's error) with a message naming the limit; requests under it are answered.
const SMALL_MAX = 96;
async function phaseMaxTokens(S, model) {
  const longState = 'word '.repeat(SMALL_MAX + 50);  // past SMALL_MAX tokens, far under the model's MAX_POS
  const cases = [
    ['/v1/decisions', { model, input: longState, questions: [{ type: 'predicate', instructions: 'x' }] }, 400],
    ['/v1/systemone', { state: longState, questions: { a: { type: 'noul' } } }, 400],
    ['/v1/ask', { state: longState, questions: [{ text: 'q', options: ['a', 'b'] }] }, 422],
  ];
  for (const [ep, body, status] of cases) {
    const r = await send(S, 'POST', ep, body);
    C.eq(r.status, status, `--max-tokens ${SMALL_MAX}: ${ep} longer than the limit`);
    C.ok(r.json && r.json.error && String(r.json.error.message).includes(String(SMALL_MAX)),
      `--max-tokens ${SMALL_MAX}: ${ep}'s message names the limit`, r.text);
  }
  const row = (n) => ({ ids: Array(n).fill(7), slots: [n - 1], nopts: [2], letters: [1, 2] });
  const r = await send(S, 'POST', '/v1/score', { rows: [row(SMALL_MAX + 20), row(SMALL_MAX), row(12)] });
  C.eq(r.status, 200, `--max-tokens ${SMALL_MAX}: /v1/score with a row past it: 200`);
  const res = (r.json && r.json.results) || [];
  C.ok(res.length === 3 && typeof res[0].error === 'string' && res[0].error.includes(String(SMALL_MAX)),
    `--max-tokens ${SMALL_MAX}: the long row's own error names the limit`, r.text);
  C.ok(res.length === 3 && Array.isArray(res[1].probs) && Array.isArray(res[2].probs),
    `--max-tokens ${SMALL_MAX}: rows up to the limit are answered`, r.text);
  const ok = await send(S, 'POST', '/v1/decisions', { model, input: 'Page', questions: [{ type: 'predicate', instructions: 'x' }] });
  C.eq(ok.status, 200, `--max-tokens ${SMALL_MAX}: a short decision request is answered`);
}

// A server started with --specialists (a synthesized squad: labels trunk / e2e / nav): routes and
// the router's probabilities equal `squad score --specialists` / `squad ask --specialists` on the
// same rows; a forced specialist through /v1/score ("specialist"), /v1/ask ("specialist") and the
// decision APIs' model names; /v1/models lists the served name and each route; /metrics counts rows
// per route and mispredictions; the request memo keeps forced and routed answers apart.
async function routeRows(S) {
  const m = await request(S.base, 'GET', '/metrics');
  const out = {};
  for (const s of ((parsePrometheus(m.text).squad_route_rows_total || {}).samples || [])) out[s.labels.route] = s.value;
  return out;
}

async function phaseSpecialists(S, SM, SP, model, labels) {
  const spArgs = ['--specialists', SP];
  // /v1/models: the served name first (the router decides), then each route's label
  const mods = await request(S.base, 'GET', '/v1/models');
  C.eq(mods.json && mods.json.data.map((d) => d.id), [model, ...labels], '--specialists: /v1/models data lists the served name and each route');
  C.eq(mods.json && mods.json.models.map((d) => d.name), [model, ...labels], '--specialists: /v1/models models lists them too');

  // /v1/score, the router deciding, against squad score --specialists (fresh caches on both sides)
  const de = expectDecisions(decisionsRequests(model));
  const rows = L.renderRows(SQUAD, SM, de.specs).concat([{ ids: [5, 9, 12, 40, 77, 3], slots: [5], nopts: [3], letters: [1, 2, 3] }]);
  const want = L.scoreRows(SQUAD, SM, rows, spArgs);
  const r = await send(S, 'POST', '/v1/score', { rows });
  const got = (r.json && r.json.results) || [];
  C.eq(got.length, rows.length, '--specialists: /v1/score results', r.text);
  got.forEach((g, i) => {
    C.ok(labels.includes(g.route), `--specialists: /v1/score row ${i}: a route label`, g);
    C.eq(g.route, want[i].route, `--specialists: /v1/score row ${i}: route = squad score's`);
    C.close(g.router, want[i].router, `--specialists: /v1/score row ${i}: router = squad score's`, TOL);
    C.close(g.probs[0], want[i].probs[0], `--specialists: /v1/score row ${i}: probs = squad score's`, TOL);
  });
  // forced through the rows, each label, and an unknown one
  const forcedRows = labels.map((l, i) => ({ ...rows[i % rows.length], specialist: l })).concat([{ ...rows[0], specialist: 'auto' }]);
  const wantF = L.scoreRows(SQUAD, SM, forcedRows, spArgs);
  const before = await routeRows(S);
  const rf = await send(S, 'POST', '/v1/score', { rows: forcedRows.concat([{ ...rows[0], specialist: 'nope' }]) });
  const gf = (rf.json && rf.json.results) || [];
  labels.forEach((l, i) => {
    C.eq(gf[i] && gf[i].route, l, `--specialists: /v1/score "specialist": "${l}" forces it`);
    C.close(gf[i] && gf[i].probs[0], wantF[i].probs[0], `--specialists: /v1/score forced ${l}: probs = squad score's`, TOL);
  });
  C.eq(gf[labels.length] && gf[labels.length].route, wantF[labels.length].route, '--specialists: /v1/score "specialist": "auto" routes as squad score does');
  C.ok(gf[labels.length + 1] && /unknown specialist 'nope'/.test(gf[labels.length + 1].error || ''), '--specialists: /v1/score an unknown label is that row\'s error', rf.text);
  // /metrics: rows per route moved by what that request ran
  const after = await routeRows(S);
  const moved = {};
  for (const g of gf) if (g.route) moved[g.route] = (moved[g.route] || 0) + 1;
  for (const l of labels) C.eq((after[l] || 0) - (before[l] || 0), moved[l] || 0, `--specialists: /metrics squad_route_rows_total{route="${l}"} counts that request's rows`);

  // /v1/ask: routes as squad ask --specialists; "specialist" forces; an unknown label is a 422
  const ex = examples[1];
  const cli = JSON.parse(L.runSquad(SQUAD, ['ask', '--model', SM, ...spArgs], JSON.stringify(ex)).stdout);
  const a = await send(S, 'POST', '/v1/ask', ex);
  C.eq(a.status, 200, '--specialists: /v1/ask');
  C.eq(a.json && a.json.route, cli.route, '--specialists: /v1/ask "route" = squad ask\'s');
  C.ok(a.json && a.json.router && !deepClose(a.json.router, cli.router, TOL), '--specialists: /v1/ask "router" = squad ask\'s', [a.json && a.json.router, cli.router]);
  C.eq(a.json && a.json.answers.map((x) => x.route), cli.answers.map((x) => x.route), '--specialists: /v1/ask each answer\'s route = squad ask\'s');
  for (const l of labels.slice(1)) {
    const cf = JSON.parse(L.runSquad(SQUAD, ['ask', '--model', SM, ...spArgs, '--specialist', l], JSON.stringify(ex)).stdout);
    const af = await send(S, 'POST', '/v1/ask', { ...ex, specialist: l });
    C.ok(af.json && af.json.answers.every((x) => x.route === l), `--specialists: /v1/ask "specialist": "${l}" forces it`, af.text);
    const d = af.json ? deepClose(af.json.answers, cf.answers, TOL) : 'no JSON';
    C.ok(!d, `--specialists: /v1/ask forced ${l}: answers = squad ask --specialist's`, d);
    C.eq(af.json && af.json.memo, false, `--specialists: /v1/ask forced ${l}: not the memo of another specialist's body`);
    const again = await send(S, 'POST', '/v1/ask', { ...ex, specialist: l });
    C.ok(again.json && again.json.memo === true && again.json.answers.every((x) => x.route === l), `--specialists: /v1/ask forced ${l} again: the memo, same route`, again.text);
  }
  const bad = await send(S, 'POST', '/v1/ask', { ...ex, specialist: 'nope' });
  C.eq(bad.status, 422, '--specialists: /v1/ask an unknown specialist: 422');
  C.has(bad.json && bad.json.error && bad.json.error.message, 'nope', '--specialists: /v1/ask the message names it');

  // the decision APIs: model = a label forces it, the served name lets the router decide
  for (const name of [labels[2], model]) {
    const dreq = decisionsRequests(name);
    const e = expectDecisions(dreq);
    const drows = L.renderRows(SQUAD, SM, e.specs).map((x) => (name === model ? x : { ...x, specialist: name }));
    const probs = L.scoreRows(SQUAD, SM, drows, spArgs).map((x) => x.probs[0]);
    const b0 = await routeRows(S);
    let k = 0, n = 0;
    for (const [i, req] of dreq.entries()) {
      const rr = await send(S, 'POST', '/v1/decisions', req);
      if (!C.eq(rr.status, 200, `--specialists: /v1/decisions model ${name} request ${i}`) || !rr.json) { k += req.questions.length; continue; }
      C.eq(rr.json.model, name, `--specialists: /v1/decisions model ${name}: echoed`);
      req.questions.forEach((q, j) => { checkDecisionAnswer(q, e.plan[i][j], rr.json.answers[j] || {}, probs[k], `--specialists: /v1/decisions model ${name} request ${i} question ${j}`); k++; n++; });
    }
    if (name !== model) {
      const b1 = await routeRows(S);
      C.eq((b1[name] || 0) - (b0[name] || 0), n, `--specialists: /metrics counts the rows /v1/decisions forced to ${name}`);
    }
  }
  const so = await send(S, 'POST', '/v1/systemone', { model: labels[1], state: 'Short page', questions: { a: { type: 'noul', instructions: 'Visible?' } } });
  C.eq(so.status, 200, '--specialists: /v1/systemone with a specialist\'s name');
  const no = await send(S, 'POST', '/v1/decisions', { model: 'nope', input: 'Page', questions: [{ type: 'predicate', instructions: 'x' }] });
  C.eq(no.status, 404, '--specialists: /v1/decisions an unknown model: 404');
  // mispredictions: a counter in /metrics, the same figure in /v1/stats
  const m = parsePrometheus((await request(S.base, 'GET', '/metrics')).text);
  const mis = m.squad_router_mispredictions_total;
  const st = (await request(S.base, 'GET', '/v1/stats')).json;
  C.ok(mis && mis.samples.length === 1 && st && st.router && mis.samples[0].value === st.router.mispredictions,
    '--specialists: squad_router_mispredictions_total = /v1/stats router.mispredictions', [mis, st && st.router]);
  C.eq(st && st.router && Object.keys(st.router.routes), labels, '--specialists: /v1/stats router.routes by label');
}

// ---- batching ---------------------------------------------------------------------------------
const BATCH_TOL = 1e-5;  // --precision exact: batched against one at a time
const BATCH_TIMEOUT_MARGIN = 4;   // R4's --timeout over R1's first round of the same requests
const BATCH_TIMEOUT_MIN_S = 1.5;  // and at least this (times L.SLOW)
const SIGTERM_TIMEOUT_S = 300;    // server B's --timeout (times L.SLOW): the drain's grace too

// Requests that exercise batching: several questions about new pages (a request's rows share a
// state), pages shared between requests, every endpoint, a /v1/score request with a bad row.
function batchRequests(model) {
  const reqs = [];
  for (let v = 0; v < 6; v++) {
    const page = `${LOGIN.state}\nBatch page ${v % 3}: ${'rows of a table, '.repeat(30 + 10 * (v % 3))}`;
    reqs.push(['/v1/decisions', { model, input: [{ role: 'developer', content: LOGIN.system }, { role: 'user', content: page }],
      questions: [{ type: 'predicate', instructions: `Is row ${v} visible?` }, decisionsRequests(model)[1].questions[1],
        { type: 'score', instructions: 'How full is the table?', levels: [{ label: 'empty' }, { label: 'some' }, { label: 'full' }] }] }]);
  }
  for (let v = 0; v < 3; v++)
    reqs.push(['/v1/systemone', { state: `Batch page ${v}: ${'an item, '.repeat(40)}`, questions: {
      a: { type: 'noul', instructions: `Item ${v} visible?` }, b: { type: 'score', criteria: ['bad', 'ok', 'good'] } } }]);
  for (const ex of examples) reqs.push(['/v1/ask', ex]);
  let seed = 4242;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  for (let v = 0; v < 3; v++) {
    const rows = Array.from({ length: 3 + v }, (_, i) => {
      const n = 40 + 150 * i;
      return { ids: Array.from({ length: n }, () => rnd(150000)), slots: [n - 1], nopts: [3], letters: [32, 33, 34], state_len: n - 5 };
    });
    rows.push({ ids: [1, 2], slots: [5], nopts: [2], letters: [1, 2] });  // a bad row: its own error
    reqs.push(['/v1/score', { rows }]);
  }
  return reqs.map(([endpoint, body]) => ({ endpoint, text: JSON.stringify(body) }));
}

async function sendAll(S, reqs) {
  return Promise.all(reqs.map((p) => send(S, 'POST', p.endpoint, p.text).then((r) => r, (e) => ({ status: 0, text: String(e) }))));
}

// The batching figures of /metrics (and /v1/stats' "batching"): a snapshot.
async function batchFigures(S) {
  const fams = parsePrometheus((await request(S.base, 'GET', '/metrics')).text);
  const one = (name) => (fams[name] && fams[name].samples.length === 1 ? fams[name].samples[0].value : NaN);
  const histo = (name) => {
    const f = fams[name];
    if (!f || f.type !== 'histogram') return null;
    const h = { buckets: {} };
    for (const smp of f.samples) {
      if (smp.name === `${name}_bucket`) h.buckets[smp.labels.le] = smp.value;
      else if (smp.name === `${name}_sum`) h.sum = smp.value;
      else if (smp.name === `${name}_count`) h.count = smp.value;
    }
    return h;
  };
  const st = (await request(S.base, 'GET', '/v1/stats')).json;
  return {
    steps: one('squad_engine_steps_total'), maxRows: one('squad_engine_max_rows'), batchTokens: one('squad_engine_batch_tokens'),
    inFlight: one('squad_rows_in_flight'), running: one('squad_rows_running'), cancelled: one('squad_jobs_cancelled_total'),
    timeout: one('squad_jobs_timeout_total'), rows: histo('squad_engine_step_rows'), tokens: histo('squad_engine_step_tokens'),
    seconds: histo('squad_engine_step_seconds'),
    graphs: one('squad_device_graphs'), captureS: one('squad_device_graph_capture_seconds_total'),
    stats: st && st.batching, t: Date.now(),
  };
}

function checkBatchFigures(what, before, after, maxRows) {
  C.eq(after.maxRows, maxRows, `${what}: squad_engine_max_rows = --max-rows`);
  C.ok(after.batchTokens > 0, `${what}: squad_engine_batch_tokens`, after.batchTokens);
  C.ok(after.stats && after.stats.max_rows === maxRows && after.stats.batch_tokens === after.batchTokens &&
    after.stats.steps === after.steps && after.stats.rows_per_step.count === after.rows.count &&
    after.stats.tokens_per_step.sum === after.tokens.sum && after.stats.seconds_per_step.count === after.seconds.count,
    `${what}: /v1/stats "batching" says what /metrics says`, after.stats);
  C.ok(after.steps > before.steps, `${what}: squad_engine_steps_total moved`, [before.steps, after.steps]);
  C.ok(after.rows && after.rows.count === after.steps && after.tokens && after.tokens.count === after.steps,
    `${what}: one rows and one tokens observation per step`, [after.steps, after.rows, after.tokens]);
  C.ok(after.rows.sum > before.rows.sum && after.tokens.sum > before.tokens.sum, `${what}: rows and tokens per step moved`,
    [before.rows.sum, after.rows.sum, before.tokens.sum, after.tokens.sum]);
  // each step's wall time, once per step; the time moved, and no more than the wall time between the two reads
  // (plus a second: a step running at the first read counts whole at the second)
  C.ok(after.seconds && after.seconds.count === after.steps && after.seconds.buckets['+Inf'] === after.steps,
    `${what}: one squad_engine_step_seconds observation per step`, [after.steps, after.seconds]);
  C.ok(after.seconds.sum > before.seconds.sum && after.seconds.sum - before.seconds.sum <= (after.t - before.t) / 1000 + 1.0,
    `${what}: step seconds moved, within the wall time`, [before.seconds.sum, after.seconds.sum, after.t - before.t]);
  C.eq(after.rows.buckets[String(maxRows)], after.rows.count, `${what}: no step ran more than --max-rows rows`);
  C.ok(after.rows.sum <= after.steps * maxRows, `${what}: rows per step sum <= steps x --max-rows`, [after.rows.sum, after.steps]);
  C.eq([after.inFlight, after.running], [0, 0], `${what}: idle: squad_rows_in_flight and squad_rows_running 0`);
  // the tests' server runs on the CPU: no CUDA graphs, and both places say so
  C.eq([after.graphs, after.captureS, after.stats.graphs, after.stats.graph_capture_s], [0, 0, 0, 0],
    `${what}: CUDA graph figures 0 on the CPU in /metrics and /v1/stats`);
}

// The same requests, all at once, twice (new states, then their cached ones), on --max-rows 1 and on
// --max-rows 4: the same answers. R4 is started here, once R1 has shown how long the requests' first
// round takes on this machine: its --timeout is that time times BATCH_TIMEOUT_MARGIN (at least
// BATCH_TIMEOUT_MIN_S), so the requests never meet it however slow the build or busy the machine, while
// longScore's request (~80x the round's tokens) always does. Returns the --max-rows 1 answers by
// request, R4 and its --timeout.
async function phaseBatchEqual(R1, startR4, reqs) {
  const want = [];
  const firstRoundS = await batchRounds(R1, 1, reqs, want);
  const [R4, timeoutS] = await startR4(firstRoundS);
  await batchRounds(R4, 4, reqs, want);
  checkRequestLog('batching --max-rows 4 (--log-requests)', R4.log());
  return { want, R4, timeoutS };
}

// phaseBatchEqual's two rounds on one server: --max-rows 1's first round fills want, every other
// round is checked against it. Returns the first round's seconds.
async function batchRounds(S, maxRows, reqs, want) {
  const what = `batching --max-rows ${maxRows}`;
  const before = await batchFigures(S);
  let firstS = 0;
  for (let round = 0; round < 2; round++) {
    const t0 = Date.now();
    const got = await sendAll(S, reqs);
    const seconds = (Date.now() - t0) / 1000;
    console.log(`server_e2e: ${what} round ${round}: ${reqs.length} requests in ${seconds.toFixed(1)} s`);
    if (round === 0) firstS = seconds;
    got.forEach((r, i) => {
      const p = reqs[i];
      const tag = `${what} round ${round} ${p.endpoint} request ${i}`;
      if (!C.eq(r.status, 200, `${tag}: status`)) { console.error(r.text); return; }
      const n = normal(p.endpoint, r.json);
      if (maxRows === 1 && round === 0) { want[i] = n; return; }
      const d = deepClose(n, want[i], BATCH_TOL);
      C.ok(!d, `${tag}: the answers of --max-rows 1 within ${BATCH_TOL}`, d);
    });
  }
  checkBatchFigures(what, before, await batchFigures(S), maxRows);
  return firstS;
}

// --log-requests: a line per request the engine took saying where its time went: its time split into
// before the engine and in it within the total, and a request that computed tokens ran in a step
// (the row memo answers without one), its longest step within its engine time.
function checkRequestLog(what, log) {
  const re = /(\/v1\/\w+) 200 ([0-9.]+) ms \(before the engine ([0-9.]+) ms, engine ([0-9.]+) ms: (\d+) steps ran its rows, (\d+) ran others' only, the longest ([0-9.]+) ms; (\d+) tokens computed, (\d+) reused\)/g;
  const lines = [...log.matchAll(re)];
  C.ok(lines.length >= 4, `${what}: a log line per request with its time split`, log.slice(-600));
  const bad = lines.filter((m) => !((Number(m[8]) === 0 || Number(m[5]) >= 1) &&
    Number(m[3]) + Number(m[4]) <= Number(m[2]) + 0.05 && Number(m[8]) + Number(m[9]) > 0 &&
    Number(m[7]) <= Number(m[4]) + 0.05 && (Number(m[5]) === 0 || Number(m[7]) > 0)));
  C.eq(bad.map((m) => m[0]), [], `${what}: tokens computed in a step, the parts and the longest step within the ` +
    'total, tokens counted');
  C.ok(lines.some((m) => Number(m[8]) > 0), `${what}: some request computed tokens`, lines.length);
}

// Long rows no cache holds: a request that keeps the engine busy for seconds.
function longScore(seed0) {
  let seed = seed0;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  return { rows: Array.from({ length: 400 }, () => {
    const ids = Array.from({ length: 1000 }, () => rnd(150000));
    return { ids, slots: [999], nopts: [3], letters: [32, 33, 34], state_len: 980 };
  }) };
}

async function waitFor(S, pred, ms) {
  const t0 = Date.now();
  let f = await batchFigures(S);
  while (!pred(f) && Date.now() - t0 < ms) { await L.sleep(50); f = await batchFigures(S); }
  return f;
}

// One long request among several in flight ends early (its client leaves; its --timeout passes):
// the others are answered, with the answers they get alone.
async function phaseBatchCancel(S, reqs, want, timeoutS) {
  const others = reqs.map((p, i) => ({ ...p, i })).filter((p, i) => i % 2 === 0);
  const check = (got, what) => got.forEach((r, k) => {
    const p = others[k];
    if (!C.eq(r.status, 200, `${what}: ${p.endpoint} request ${p.i} answered`)) { console.error(r.text); return; }
    const d = deepClose(normal(p.endpoint, r.json), want[p.i], BATCH_TOL);
    C.ok(!d, `${what}: ${p.endpoint} request ${p.i}: its answers`, d);
  });
  // the client of the long request leaves (its socket closed after 400 ms without an answer)
  let before = await batchFigures(S);
  const first = sendAll(S, others.slice(0, 3));  // in the engine before the long one comes
  const gone = request(S.base, 'POST', '/v1/score', longScore(99), {}, { agent: false, timeoutMs: 400 * L.SLOW })
    .then((r) => `answered ${r.status}`, (e) => String(e));
  await L.sleep(100);
  const rest = sendAll(S, others.slice(3));
  const [g1, g2, gm] = await Promise.all([first, rest, gone]);
  C.has(gm, 'timeout', 'batching, a client leaves: its request was abandoned by the client');
  check(g1.concat(g2), 'batching, a client leaves');
  let after = await waitFor(S, (f) => f.cancelled > before.cancelled && f.inFlight === 0, 10000 * L.SLOW);
  C.eq(after.cancelled - before.cancelled, 1, 'batching, a client leaves: squad_jobs_cancelled_total counts it');
  C.eq(after.inFlight, 0, 'batching, a client leaves: its rows left the engine');
  // the long request's --timeout passes while others wait and run
  before = after;
  const late = send(S, 'POST', '/v1/score', longScore(7));
  await L.sleep(500 * timeoutS);
  const got = await sendAll(S, others);
  const t = await late;
  C.eq(t.status, 503, 'batching, --timeout passes: the long request gets 503');
  C.ok(t.json && t.json.error && /timeout/.test(t.json.error.message), 'batching, --timeout passes: the message names it', t.text);
  check(got, 'batching, --timeout passes');
  after = await waitFor(S, (f) => f.timeout > before.timeout && f.inFlight === 0, 10000 * L.SLOW);
  C.eq(after.timeout - before.timeout, 1, 'batching, --timeout passes: squad_jobs_timeout_total counts it');
  C.eq(after.inFlight, 0, 'batching, --timeout passes: its rows left the engine');
}

// ---- 9. start-up: the text side's files and the keys -----------------------------------------
// `squad serve` with args must stop at start with exit 2 and a message matching why (a server that
// started instead is killed at the timeout: status null).
function startFails(M, args, what, why) {
  const r = spawnSync(SQUAD, ['serve', '--model', M, '--host', '127.0.0.1', '--port', '0', ...args],
    { encoding: 'utf8', timeout: 60000 * L.SLOW });
  C.eq(r.status, 2, `start-up, ${what}: exit 2`);
  C.ok(why.test(r.stderr || ''), `start-up, ${what}: the message says why`, r.stderr);
}

async function askLike(S, ex, cliArgs, what) {
  const want = JSON.parse(L.runSquad(SQUAD, ['ask', ...cliArgs], JSON.stringify(ex)).stdout);
  const r = await request(S.base, 'POST', '/v1/ask', ex);
  C.eq(r.status, 200, `${what}: /v1/ask status`);
  const d = r.json ? deepClose(r.json.answers, want.answers, TOL) : 'no JSON';
  C.ok(!d, `${what}: /v1/ask answers = squad ask ${cliArgs.join(' ')}'s`, d);
  return r.json;
}

async function phaseStartup(M, tmp, servers) {
  startFails(M, ['--template', '/nonexistent.json'], '--template /nonexistent.json', /--template \/nonexistent\.json/);
  startFails(M, ['--tokenizer', path.join(tmp, 'none.json')], '--tokenizer of a missing file', /--tokenizer .*none\.json/);
  startFails(M, ['--api-key', ''], "--api-key ''", /--api-key is empty/);
  const emptyKeys = path.join(tmp, 'keys-empty'), commentKeys = path.join(tmp, 'keys-comments');
  fs.writeFileSync(emptyKeys, '');
  fs.writeFileSync(commentKeys, '# the keys\n\n   \n# none yet\n');
  startFails(M, ['--api-key-file', emptyKeys], 'an empty --api-key-file', /has no key/);
  startFails(M, ['--api-key-file', commentKeys], 'an --api-key-file of comments only', /has no key/);

  // --tokenizer FILE: a model directory without tokenizer.json, the tokenizer elsewhere
  const bare = path.join(tmp, 'bare-model'), tokDir = path.join(tmp, 'elsewhere');
  fs.mkdirSync(bare);
  fs.mkdirSync(tokDir);
  for (const f of fs.readdirSync(M)) if (f !== 'tokenizer.json') fs.copyFileSync(path.join(M, f), path.join(bare, f));
  const tokFile = path.join(tokDir, 'my-tokenizer.json');
  fs.copyFileSync(path.join(M, 'tokenizer.json'), tokFile);
  startFails(bare, [], 'a model directory without tokenizer.json and no --tokenizer', /tokenizer\.json/);
  const K = await L.startServer(SQUAD, bare, ['--tokenizer', tokFile, '--memo-mb', '0', '--threads', '1']);
  servers.push(K);
  await askLike(K, LOGIN, ['--model', M], '--tokenizer FILE outside the model directory');
  C.eq(await L.stopServer(K), { code: 0, signal: null }, 'server --tokenizer: exit 0');

  // --template FILE: three questions a row, as squad ask --template FILE gives; not the default's
  const tpl = path.join(tmp, 'three-a-row.json');
  fs.writeFileSync(tpl, JSON.stringify({ questions_per_row: 3 }));
  const T = await L.startServer(SQUAD, M, ['--template', tpl, '--memo-mb', '0', '--threads', '1']);
  servers.push(T);
  const got = await askLike(T, LOGIN, ['--model', M, '--template', tpl], '--template FILE');
  const plain = JSON.parse(L.runSquad(SQUAD, ['ask', '--model', M], JSON.stringify(LOGIN)).stdout);
  C.ok(got && deepClose(got.answers, plain.answers, TOL), '--template FILE: the answers differ from the default template\'s',
    got && got.answers);
  C.eq(await L.stopServer(T), { code: 0, signal: null }, 'server --template: exit 0');
}

async function main() {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'squad-serve-'));
  const servers = [];
  try {
    const M = L.makeModel(SQUAD, path.join(tmp, 'tiny'), MAX_POS);
    const model = path.basename(M);  // the served name: the model directory's name
    await phaseStartup(M, tmp, servers);
    const A = await L.startServer(SQUAD, M, ['--max-body', String(MAX_BODY), '--threads', '1']);
    servers.push(A);
    for (const ep of ['/health', '/ready']) C.eq((await request(A.base, 'GET', ep)).status, 200, `${ep}: 200 once ready`);
    const models = await request(A.base, 'GET', '/v1/models');
    C.ok(models.status === 200 && models.json.object === 'list' && models.json.data[0].id === model &&
      models.json.data[0].object === 'model' && models.json.data[0].owned_by === 'squad' && Array.isArray(models.json.models) &&
      models.json.models[0].name, '/v1/models: both lists', models.text);

    await phaseScoreAsk(A, M);
    const done = await phaseDecisions(A, M, model);
    await phaseMemo(A, done);
    await phaseBad(A, model);
    await phaseMetrics(A, 'server A');

    // the pool of the concurrent phase: every endpoint, answers computed one at a time on A
    const pool = [];
    const add = async (endpoint, body) => {
      const text = JSON.stringify(body);
      const r = await send(A, 'POST', endpoint, text);
      if (C.eq(r.status, 200, `pool ${endpoint}`)) pool.push({ endpoint, text, want: normal(endpoint, r.json) });
    };
    for (let v = 0; v < 6; v++) {
      const page = `${LOGIN.state}\nVisit ${v}: ${'the list grew. '.repeat(v)}`;
      await add('/v1/decisions', { model, input: [{ role: 'developer', content: LOGIN.system }, { role: 'user', content: page }],
        questions: [{ type: 'predicate', instructions: `Is visit ${v} the first?` }, decisionsRequests(model)[1].questions[1]] });
      await add('/v1/systemone', { state: `Short page ${v}`, questions: { q: { type: 'noul', instructions: `Item ${v} visible?` }, s: { type: 'score', criteria: ['bad', 'ok', 'good'] } } });
      await add('/v1/ask', { state: page, questions: [{ text: `Which visit is this (${v})?`, options: ['first', 'second', 'later'] }] });
      await add('/v1/score', { rows: [{ ids: [5 + v, 9, 12, 40, 77, 3], slots: [5], nopts: [3], letters: [1, 2, 3] }] });
    }
    await phaseMetrics(A, 'server A (with the pool)');
    const e = await L.stopServer(A);
    C.eq(e, { code: 0, signal: null }, 'server A: SIGTERM when idle, exit 0');

    // B's --timeout is not what its phases check (its default, 30 s, is less than the SIGTERM phase's
    // rows take in a sanitized build on a busy machine): lifted so that only the drain is tested
    const B = await L.startServer(SQUAD, M, ['--api-key', API_KEY, '--memo-mb', '0', '--threads', '1',
      '--timeout', String(SIGTERM_TIMEOUT_S * L.SLOW)]);
    servers.push(B);
    B.key = API_KEY;
    await phaseAuth(B, model);
    await phaseConcurrent(B, pool);
    await phaseMetrics(B, 'server B');
    const open = await request(B.base, 'GET', '/v1/stats');
    C.eq(open.status, 401, 'server B: /v1/stats needs the key');
    await phaseSigterm(B, M, { authorization: `Bearer ${API_KEY}` });

    const O = await L.startServer(SQUAD, M, ['--queue', '1', '--timeout', String(0.3 * L.SLOW), '--memo-mb', '0', '--threads', '1']);
    servers.push(O);
    await phaseOverload(O, M, model);
    await phaseMetrics(O, 'server C (overload)');
    C.eq(await L.stopServer(O), { code: 0, signal: null }, 'server C: exit 0');

    // batching: --max-rows 1 against --max-rows 4, exact arithmetic, no request memo
    const R1 = await L.startServer(SQUAD, M, ['--max-rows', '1', '--precision', 'exact', '--memo-mb', '0', '--threads', '1']);
    servers.push(R1);
    const startR4 = async (roundS) => {
      const BT = Number(Math.max(BATCH_TIMEOUT_MIN_S * L.SLOW, BATCH_TIMEOUT_MARGIN * roundS).toFixed(1));
      const S = await L.startServer(SQUAD, M, ['--max-rows', '4', '--precision', 'exact', '--memo-mb', '0', '--threads', '1',
        '--timeout', String(BT), '--log-requests']);
      servers.push(S);
      return [S, BT];
    };
    const breqs = batchRequests(model);
    const { want: bwant, R4, timeoutS: BT } = await phaseBatchEqual(R1, startR4, breqs);
    await phaseBatchCancel(R4, breqs, bwant, BT);
    await phaseMetrics(R4, 'server R4 (--max-rows 4)');
    C.eq(await L.stopServer(R1), { code: 0, signal: null }, 'server R1 (--max-rows 1): exit 0');
    C.eq(await L.stopServer(R4), { code: 0, signal: null }, 'server R4 (--max-rows 4): exit 0');

    const T = await L.startServer(SQUAD, M, ['--max-tokens', String(SMALL_MAX), '--memo-mb', '0', '--threads', '1']);
    servers.push(T);
    await phaseMaxTokens(T, model);
    C.eq(await L.stopServer(T), { code: 0, signal: null }, 'server D (--max-tokens): exit 0');

    const SM = path.join(tmp, 'squad'), SP = path.join(tmp, 'specialists');
    const syn = L.runSquad(SQUAD, ['synth', '--preset', 'tiny', '--out', SM, '--tokenizer', path.resolve('third_party/qwen3/tokenizer.json'), '--specialists', SP]);
    if (syn.status !== 0) throw new Error(`squad synth --specialists failed: ${syn.stderr}`);
    const labels = JSON.parse(fs.readFileSync(path.join(SP, 'squad-specialists.json'), 'utf8')).router.labels;
    const E = await L.startServer(SQUAD, SM, ['--specialists', SP, '--threads', '1']);
    servers.push(E);
    await phaseSpecialists(E, SM, SP, path.basename(SM), labels);
    await phaseMetrics(E, 'server E (--specialists)');
    C.eq(await L.stopServer(E), { code: 0, signal: null }, 'server E (--specialists): exit 0');
  } catch (e) {
    C.ok(false, 'the test ran to its end', e.stack || String(e));
    for (const s of servers) if (!s.exit) console.error(`--- server log (${s.args.join(' ')}):\n${s.log().slice(-4000)}`);
  } finally {
    for (const s of servers) if (!s.exit) s.proc.kill('SIGKILL');
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  process.exit(C.summary());
}

main();
