// server_lib.js — what the server tests share (tests/server_e2e.js, tests/server_clients.js): start
// and stop a real `squad serve` on a free loopback port, HTTP requests over keep-alive connections,
// the `squad` command line (score / ask / tokenize) as the reference, and an independent rendering of
// the decision APIs' questions into rows (docs/decisions-api.md section C, JSON text section E).
//
// The rendering here is written from the contract's text, not from the server's code: the tests
// score these rows with `squad score` and require the server's answers to equal them, so a
// disagreement between the two is a failure of one or the other, never of both at once.
'use strict';
const http = require('http');
const net = require('net');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { spawn, spawnSync } = require('child_process');

// Under AddressSanitizer everything is several times slower; every wait is scaled by this.
const SLOW = process.env.SQUAD_SANITIZED === '1' ? 6 : 1;

// ---- checks ---------------------------------------------------------------------------------
// A test counts its checks and goes on after a failure, so one run shows every problem.
class Checks {
  constructor(name) {
    this.name = name;
    this.passed = 0;
    this.failed = 0;
  }
  ok(cond, what, detail) {
    if (cond) this.passed++;
    else {
      this.failed++;
      console.error(`FAIL: ${what}${detail === undefined ? '' : ': ' + (typeof detail === 'string' ? detail : JSON.stringify(detail))}`);
    }
    return !!cond;
  }
  eq(got, want, what) {
    const g = JSON.stringify(got), w = JSON.stringify(want);
    return this.ok(g === w, what, `got ${clip(g)}, want ${clip(w)}`);
  }
  // probabilities: equal within tol (absolute), same length
  close(got, want, what, tol = 1e-6) {
    const bad = !Array.isArray(got) || !Array.isArray(want) || got.length !== want.length ||
      got.some((g, i) => typeof g !== 'number' || !(Math.abs(g - want[i]) <= tol));
    return this.ok(!bad, what, `got ${clip(JSON.stringify(got))}, want ${clip(JSON.stringify(want))}`);
  }
  has(text, part, what) {
    return this.ok(typeof text === 'string' && text.includes(part), what, `[${clip(String(text))}] lacks [${part}]`);
  }
  summary() {
    console.log(`${this.name}: ${this.passed} passed, ${this.failed} failed`);
    return this.failed === 0 ? 0 : 1;
  }
}
function clip(s, n = 400) { return s && s.length > n ? s.slice(0, n) + '...' : s; }

// ---- the squad command line -----------------------------------------------------------------
function runSquad(squad, args, input) {
  const r = spawnSync(squad, args, { input, encoding: 'utf8', maxBuffer: 256 << 20 });
  if (r.error) throw r.error;
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

// `squad tokenize --jsonl`: many texts in one process. plain: added tokens are ordinary text.
function tokenize(squad, model, texts, plain) {
  const args = ['tokenize', '--model', model, '--jsonl'];
  if (plain) args.push('--plain-special');
  const r = runSquad(squad, args, texts.map((t) => JSON.stringify(t)).join('\n') + '\n');
  const lines = r.stdout.split('\n').filter((l) => l.length);
  if (r.status !== 0 || lines.length !== texts.length) throw new Error(`squad tokenize failed: ${r.stdout}${r.stderr}`);
  return lines.map((l) => JSON.parse(l));
}

// `squad score`: one result line per row, in order.
function scoreRows(squad, model, rows, extra = []) {
  const r = runSquad(squad, ['score', '--model', model, ...extra], rows.map((x) => JSON.stringify(x)).join('\n') + '\n');
  const lines = r.stdout.split('\n').filter((l) => l.length);
  if (lines.length !== rows.length) throw new Error(`squad score gave ${lines.length} lines for ${rows.length} rows: ${r.stderr}`);
  return lines.map((l) => JSON.parse(l));
}

// A small synthesized model carrying the real Qwen3 tokenizer (as tests/cli_ask.sh makes one), with
// max_position_embeddings lowered to maxPos so that "longer than the model supports" is reachable
// with a short request.
function makeModel(squad, dir, maxPos) {
  const tok = path.resolve('third_party/qwen3/tokenizer.json');
  if (!fs.existsSync(tok)) throw new Error(`${tok} is missing (run tools/fetch_test_data.sh)`);
  const r = runSquad(squad, ['synth', '--preset', 'tiny', '--out', dir, '--tokenizer', tok]);
  if (r.status !== 0) throw new Error(`squad synth failed: ${r.stderr}`);
  if (maxPos) {
    const f = path.join(dir, 'config.json');
    const text = fs.readFileSync(f, 'utf8').replace(/"max_position_embeddings": [0-9]+/g, `"max_position_embeddings": ${maxPos}`);
    fs.writeFileSync(f, text);
  }
  return dir;
}

// ---- the server -----------------------------------------------------------------------------
function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// Starts `squad serve --model M --port P extra...` and waits for GET /ready to answer 200. The
// server's stderr is kept (server.log()) for failure messages.
async function startServer(squad, model, extra = [], readyTimeoutMs = 120000 * SLOW) {
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const args = ['serve', '--model', model, '--host', '127.0.0.1', '--port', String(port), ...extra];
    const proc = spawn(squad, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let log = '';
    proc.stdout.on('data', (d) => { log += d; });
    proc.stderr.on('data', (d) => { log += d; });
    const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
    let done = null;
    exited.then((e) => { done = e; });
    const base = `http://127.0.0.1:${port}`;
    const server = { proc, port, base, args, log: () => log, exited, get exit() { return done; } };
    const t0 = Date.now();
    while (Date.now() - t0 < readyTimeoutMs) {
      if (done) break;
      try {
        const r = await request(base, 'GET', '/ready', null, {}, { agent: false, timeoutMs: 5000 });
        if (r.status === 200) return server;
      } catch (e) { /* not listening yet */ }
      await sleep(50);
    }
    if (done && /address already in use|bind/i.test(log) && attempt < 2) continue;  // the port was taken meanwhile
    proc.kill('SIGKILL');
    throw new Error(`squad ${args.join(' ')} did not become ready (${done ? 'exited ' + JSON.stringify(done) : 'timeout'}):\n${log}`);
  }
  throw new Error('no free port');
}

// SIGTERM and wait for the exit (SIGKILL after the timeout, reported as a failure by the caller).
async function stopServer(server, timeoutMs = 30000 * SLOW) {
  if (server.exit) return server.exit;
  server.proc.kill('SIGTERM');
  const t = setTimeout(() => server.proc.kill('SIGKILL'), timeoutMs);
  const e = await server.exited;
  clearTimeout(t);
  return e;
}

function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }

const keepAlive = new http.Agent({ keepAlive: true, maxSockets: 256 });

// One HTTP request. body: a string / Buffer (sent as is) or an object (sent as JSON). Resolves to
// {status, headers, text, json} (json undefined when the body is not JSON).
function request(base, method, urlPath, body, headers = {}, opts = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(urlPath, base);
    let data = null;
    if (body !== null && body !== undefined) data = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    const h = { ...headers };
    if (data) { h['content-type'] = h['content-type'] || 'application/json'; h['content-length'] = data.length; }
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname + u.search, method, headers: h,
      agent: opts.agent === undefined ? keepAlive : opts.agent }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json;
        try { json = JSON.parse(text); } catch (e) { json = undefined; }
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    if (opts.timeoutMs) req.setTimeout(opts.timeoutMs, () => req.destroy(new Error(`timeout after ${opts.timeoutMs} ms`)));
    if (data) req.write(data);
    req.end();
  });
}

// ---- JSON text (section E): what Python's json.dumps(value, ensure_ascii=False) prints --------
function pyFloat(x) {
  if (Number.isInteger(x) && Math.abs(x) < 1e16) return String(x);  // JSON integers stay integers
  // the shortest round-trip digits (as JavaScript finds them), laid out the way Python's repr does:
  // positional for decimal exponents -4 <= e < 16, else d.ddde+XX
  const [mant, expText] = x.toExponential().split('e');
  const e = Number(expText);
  const digits = mant.replace('-', '').replace('.', '');
  const sign = x < 0 ? '-' : '';
  if (e >= -4 && e < 16) {
    if (e < 0) return sign + '0.' + '0'.repeat(-e - 1) + digits;
    const whole = digits.length > e + 1 ? digits.slice(0, e + 1) + '.' + digits.slice(e + 1) : digits + '0'.repeat(e + 1 - digits.length) + '.0';
    return sign + whole;
  }
  const m = digits.length > 1 ? digits[0] + '.' + digits.slice(1) : digits;
  return `${sign}${m}e${e < 0 ? '-' : '+'}${String(Math.abs(e)).padStart(2, '0')}`;
}
function pyJson(v) {
  if (v === null) return 'null';
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (typeof v === 'number') return pyFloat(v);
  if (typeof v === 'string') return JSON.stringify(v);  // the same escapes as Python's with ensure_ascii=False
  if (Array.isArray(v)) return '[' + v.map(pyJson).join(', ') + ']';
  return '{' + Object.keys(v).map((k) => JSON.stringify(k) + ': ' + pyJson(v[k])).join(', ') + '}';
}

// ---- section C: a question as a row ---------------------------------------------------------
const LETTERS = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ';
const CLOSE_LETTER = 'Answer with the letter of one option only.';
const CLOSE_NOUL = 'Answer with yes or no only.';
const CLOSE_LEVEL = 'Answer with the number of one level only.';
const NOUL_LABELS = ['yes', 'no', 'Yes', 'No'];

function optionLine(label, name, description) {
  return typeof description === 'string' && description !== '' ? `${label}: ${name} - ${description}` : `${label}: ${name}`;
}
function block(instructions, lines, closing) {
  const out = [];
  if (instructions !== '') out.push(`Question: ${instructions}`);
  return out.concat(lines, [closing]).join('\n');
}
function partsText(x) { return typeof x === 'string' ? x : x.map((p) => p.text).join('\n'); }

// A decisions-API question -> {block, labels, kind}
function decisionsQuestion(q) {
  const ins = partsText(q.instructions);
  if (q.type === 'predicate')
    return { kind: 'predicate', labels: ['A', 'B'], block: block(ins, ['A: false', 'B: true'], CLOSE_LETTER) };
  if (q.type === 'choice') {
    const labels = q.choices.map((_, i) => LETTERS[i]);
    return { kind: 'choice', labels, block: block(ins, q.choices.map((c, i) => optionLine(labels[i], pyJson(c.value), c.description)), CLOSE_LETTER) };
  }
  const labels = q.levels.map((_, i) => LETTERS[i]);
  return { kind: 'score', labels, block: block(ins, q.levels.map((l, i) => optionLine(labels[i], l.label, l.description)), CLOSE_LETTER) };
}

// A decisions-API input -> {system, state}
function decisionsInput(input) {
  if (typeof input === 'string') return { system: '', state: input };
  const user = [], sys = [];
  for (const item of input) {
    const text = typeof item.content === 'string' ? item.content
      : item.content.map((p) => (p.type === 'input_json' ? pyJson(p.data) : p.text)).join('\n');
    (item.role === 'user' ? user : sys).push(text);
  }
  return { system: sys.join('\n\n'), state: user.join('\n\n') };
}

function textOrJson(x) { return x === null || x === undefined ? '' : typeof x === 'string' ? x : pyJson(x); }

// A System One question -> {block, labels, kind}
function systemOneQuestion(q) {
  const ins = textOrJson(q.instructions);
  if (q.type === 'noul') {
    const c = q.criteria || {};
    const lines = [];
    if (c.true !== undefined && c.true !== null && c.true !== '') lines.push(`yes: ${textOrJson(c.true)}`);
    if (c.false !== undefined && c.false !== null && c.false !== '') lines.push(`no: ${textOrJson(c.false)}`);
    return { kind: 'noul', labels: NOUL_LABELS, block: block(ins, lines, CLOSE_NOUL) };
  }
  if (q.type === 'choice') {
    const names = Object.keys(q.criteria);
    const labels = names.map((_, i) => LETTERS[i]);
    return { kind: 'choice', names, labels, block: block(ins, names.map((n, i) => optionLine(labels[i], n, q.criteria[n])), CLOSE_LETTER) };
  }
  const labels = q.criteria.map((_, i) => String(i));
  return { kind: 'score', legend: q.criteria.map((c) => (c === null ? '' : c)), labels,
    block: block(ins, q.criteria.map((c, i) => `${labels[i]}: ${c === null ? '' : c}`), CLOSE_LEVEL) };
}

// The row of one question: the chat markup of section C, tokenised with special tokens only in the
// markup (request text is plain), cut after the prefix "...{state}\n\n" (state_len). Tokenising is
// batched: renderRows takes many {system, state, block, labels} and calls `squad tokenize` twice.
const SPECIAL = ['<|im_start|>', '<|im_end|>', '<think>', '</think>'];
function renderRows(squad, model, specs) {
  const sp = tokenize(squad, model, SPECIAL, false);
  for (const ids of sp) if (ids.length !== 1) throw new Error('a chat-markup token is not one token');
  const [IM_START, IM_END, THINK, END_THINK] = sp.map((x) => x[0]);
  const texts = [];
  const at = (t) => { texts.push(t); return texts.length - 1; };
  const jobs = specs.map((s) => ({
    sys: s.system ? at('system\n' + s.system) : -1,
    prefix: at('user\n' + s.state + '\n\n'),
    block: at(s.block),
    labels: s.labels.map((l) => at('\n\n' + l)),
  }));
  const nl = at('\n'), asst = at('assistant\n'), nn = at('\n\n');
  const ids = tokenize(squad, model, texts, true);
  return jobs.map((j) => {
    let row = [];
    if (j.sys >= 0) row = row.concat([IM_START], ids[j.sys], [IM_END], ids[nl]);
    row = row.concat([IM_START], ids[j.prefix]);
    const stateLen = row.length;
    row = row.concat(ids[j.block], [IM_END], ids[nl], [IM_START], ids[asst], [THINK], ids[nn], [END_THINK], ids[nn]);
    const letters = j.labels.map((k) => {
      const t = ids[k];
      if (t.length !== 2 || t[0] !== ids[nn][0]) throw new Error(`label ${texts[k]} is not one token after "\\n\\n"`);
      return t[1];
    });
    return { ids: row, slots: [row.length - 1], nopts: [letters.length], letters, state_len: stateLen };
  });
}

module.exports = {
  SLOW, Checks, runSquad, tokenize, scoreRows, makeModel, freePort, startServer, stopServer, sleep, request,
  keepAlive, pyJson, decisionsQuestion, decisionsInput, systemOneQuestion, renderRows, LETTERS,
};
