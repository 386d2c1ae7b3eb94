// server_clients.js — third-party clients against `squad serve` (run by tests/cli_serve_clients.sh).
//
//   node tests/server_clients.js path/to/squad
//
// The npm packages `openai` (client.decisions.create) and `@typesafe-ai/sdk` (client.systemOne,
// client.models.list), at the versions pinned in tests/clients/package.json, talk to a real server
// with an API key. Their requests must succeed and their parsed responses must carry the
// probabilities squad computes for the rows of docs/decisions-api.md section C (rendered by
// tests/server_lib.js, scored with `squad score`); a tool-call item must come back as the client's
// 400 error naming it.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const L = require('./server_lib.js');

const SQUAD = path.resolve(process.argv[2] || 'build/squad');
const C = new L.Checks('server_clients');
const KEY = 'sk-squad-test-0001';
const TOL = 1e-6;

const LOGIN = JSON.parse(fs.readFileSync('examples/login.json', 'utf8'));

function loadClients() {
  const dir = path.resolve('tests/clients/node_modules');
  const OpenAI = require(path.join(dir, 'openai'));
  const TS = require(path.join(dir, '@typesafe-ai/sdk'));
  const pins = require(path.resolve('tests/clients/package.json')).dependencies;
  C.eq(require(path.join(dir, 'openai/package.json')).version, pins.openai, 'openai version as pinned');
  C.eq(require(path.join(dir, '@typesafe-ai/sdk/package.json')).version, pins['@typesafe-ai/sdk'], '@typesafe-ai/sdk version as pinned');
  return { OpenAI: OpenAI.OpenAI || OpenAI, TS };
}

// The probabilities of each question's row, in question order.
function rowProbs(M, specs) {
  return L.scoreRows(SQUAD, M, L.renderRows(SQUAD, M, specs)).map((s) => s.probs[0]);
}

async function openaiPart(OpenAI, S, M, model) {
  const client = new OpenAI({ apiKey: KEY, baseURL: `${S.base}/v1`, maxRetries: 0, timeout: 120000 * L.SLOW });
  const questions = [
    { type: 'predicate', name: 'empty', instructions: 'Is the password field empty?' },
    { type: 'choice', name: 'focus', instructions: 'Which element has keyboard focus?',
      choices: [{ value: 'email' }, { value: 'password', description: 'the password input' }, { value: true }] },
    { type: 'score', name: 'done', instructions: [{ type: 'input_text', text: 'How complete is the form?' }],
      levels: [{ label: 'empty' }, { label: 'partly filled' }, { label: 'complete', description: 'ready to submit' }] },
  ];
  const inputs = {
    plain: LOGIN.state,
    'system + developer messages': [
      { role: 'system', content: LOGIN.system },
      { role: 'developer', content: [{ type: 'input_text', text: 'Answer about the page only.' }] },
      { role: 'user', content: LOGIN.state }],
    'an input_json part': [
      { type: 'message', role: 'user', content: [
        { type: 'input_text', text: 'Order record:' },
        { type: 'input_json', data: { order: 1042, items: [{ sku: 'A1', qty: 2 }], paid: false, note: null, total: 41.5 } }] }],
  };
  for (const [what, input] of Object.entries(inputs)) {
    let res;
    try {
      res = await client.decisions.create({ model, input, questions });
    } catch (e) {
      C.ok(false, `openai decisions.create (${what})`, `${e.status || ''} ${e.message}`);
      continue;
    }
    C.ok(true, `openai decisions.create (${what}) succeeded`);
    const { system, state } = L.decisionsInput(input);
    const probs = rowProbs(M, questions.map((q) => ({ system, state, ...L.decisionsQuestion(q) })));
    C.eq(res.model, model, `openai (${what}): model`);
    C.eq(res.answers.map((a) => [a.type, a.name]), questions.map((q) => [q.type, q.name]), `openai (${what}): answers in order`);
    C.close([res.answers[0].probability], [probs[0][1]], `openai (${what}): predicate P(true)`, TOL);
    C.close(res.answers[1].probabilities.map((p) => p.probability), probs[1], `openai (${what}): choice probabilities`, TOL);
    C.eq(res.answers[1].probabilities.map((p) => p.value), ['email', 'password', true], `openai (${what}): typed values`);
    C.close(res.answers[2].probabilities.map((p) => p.probability), probs[2], `openai (${what}): score probabilities`, TOL);
    C.ok(Math.abs(res.answers[2].score - probs[2].reduce((s, p, i) => s + i * p, 0)) < 1e-5, `openai (${what}): score`);
    C.ok(res.usage && res.usage.output_tokens === 3 && res.usage.input_tokens > 0, `openai (${what}): usage`, res.usage);
    // the raw HTTP response of the same request carries the same numbers as the parsed one
    const raw = await L.request(S.base, 'POST', '/v1/decisions', { model, input, questions }, { authorization: `Bearer ${KEY}` });
    C.ok(raw.status === 200 && JSON.stringify(raw.json.answers) === JSON.stringify(res.answers), `openai (${what}): parsed = raw answers`);
  }
  // a tool-call item: the client's 400 error, naming it
  try {
    await client.decisions.create({ model, questions, input: [
      { role: 'user', content: LOGIN.state },
      { type: 'function_call', call_id: 'call_1', name: 'click', arguments: '{"selector": "#sign-in"}' }] });
    C.ok(false, 'openai: a function_call item is refused');
  } catch (e) {
    C.eq(e.status, 400, 'openai: a function_call item -> 400');
    C.has(e.message, 'function_call', 'openai: the 400 names function_call');
    C.ok(e.constructor && e.constructor.name === 'BadRequestError', 'openai: BadRequestError', e.constructor && e.constructor.name);
  }
  // a wrong key: the client's authentication error
  const bad = new OpenAI({ apiKey: 'wrong', baseURL: `${S.base}/v1`, maxRetries: 0 });
  try {
    await bad.decisions.create({ model, input: 'x', questions: [questions[0]] });
    C.ok(false, 'openai: a wrong key is refused');
  } catch (e) {
    C.eq(e.status, 401, 'openai: a wrong key -> 401');
  }
}

async function typesafePart(TS, S, M, model) {
  const client = new TS.TypeSafeClient({ apiKey: KEY, baseURL: S.base, logLevel: 'off', timeout: 120000 * L.SLOW });
  C.eq(client.defaultModel, 'jev-latest', 'typesafe: its default model');
  const questions = {
    can_sign_in: TS.noul('Can the user sign in now?', { true: 'both fields are filled', false: 'a field is empty' }),
    focus: TS.choice('Which element has keyboard focus?', { email: null, password: 'the password input', 'sign in': null }),
    quality: TS.score('How clear is the error message?', ['unclear', 'acceptable', 'clear']),
    bare: TS.noul(),
  };
  const state = { page: LOGIN.state, url: 'https://app.example.com/login', visits: 2 };
  let res;
  try {
    res = await client.systemOne({ state, instructions: LOGIN.system, questions });
  } catch (e) {
    C.ok(false, 'typesafe systemOne', `${e.status || ''} ${e.message}`);
    return;
  }
  C.ok(true, 'typesafe systemOne (default model) succeeded');
  const specs = Object.entries(questions).map(([id, q]) => ({ system: LOGIN.system, state: L.pyJson(state), id, ...L.systemOneQuestion(q) }));
  const probs = rowProbs(M, specs);
  C.eq(Object.keys(res.answers), Object.keys(questions), 'typesafe: answers under the ids');
  const yes = (p) => (p[0] + p[2]) / (p[0] + p[1] + p[2] + p[3]);
  C.close([res.answers.can_sign_in.noul], [yes(probs[0])], 'typesafe: noul = P(yes)', TOL);
  C.close([res.answers.bare.noul], [yes(probs[3])], 'typesafe: a bare noul', TOL);
  C.close(Object.values(res.answers.focus.probabilities), probs[1], 'typesafe: choice probabilities', TOL);
  C.eq(Object.keys(res.answers.focus.probabilities), ['email', 'password', 'sign in'], 'typesafe: choice names');
  C.close(Object.values(res.answers.quality.probabilities), probs[2], 'typesafe: score probabilities', TOL);
  C.ok(Math.abs(res.answers.quality.score - probs[2].reduce((s, p, i) => s + i * p, 0)) < 1e-5, 'typesafe: score');
  C.ok(res.object === 'structured_decision' && /^decision-/.test(res.id) && res.usage.output_tokens === 4, 'typesafe: response fields', { id: res.id, object: res.object, usage: res.usage });
  // the same through withResponse: the HTTP status and the parsed body
  const wr = await client.systemOne({ state: 'Page: Login', questions: { q: TS.noul('Is this a login page?') } }).withResponse();
  C.eq(wr.response.status, 200, 'typesafe: withResponse status');
  C.ok(wr.data.answers.q.type === 'noul' && wr.data.answers.q.noul >= 0 && wr.data.answers.q.noul <= 1, 'typesafe: withResponse data');
  // models.list: the TypeSafe half of /v1/models
  const models = await client.models.list();
  C.ok(Array.isArray(models) && models.length >= 1 && models.some((m) => m.name === model), 'typesafe: models.list names the served model', models);
  // an unknown model: the client's NotFoundError
  try {
    await client.systemOne({ model: 'gpt-4', state: 'x', questions: { q: TS.noul() } }, { retry: { maxRetries: 0 } });
    C.ok(false, 'typesafe: an unknown model is refused');
  } catch (e) {
    C.eq(e.status, 404, 'typesafe: an unknown model -> 404');
  }
}

async function main() {
  const fetch = L.runSquad('bash', ['tools/fetch_test_clients.sh']);
  if (fetch.status !== 0) console.error(fetch.stdout + fetch.stderr);
  let clients;
  try {
    clients = loadClients();
  } catch (e) {
    C.ok(false, 'the pinned clients are installed (tools/fetch_test_clients.sh)', e.message);
    process.exit(C.summary());
  }
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'squad-clients-'));
  let S = null;
  try {
    const M = L.makeModel(SQUAD, path.join(tmp, 'tiny-model'));
    S = await L.startServer(SQUAD, M, ['--api-key', KEY, '--threads', '1']);
    await openaiPart(clients.OpenAI, S, M, 'tiny-model');
    await typesafePart(clients.TS, S, M, 'tiny-model');
    const e = await L.stopServer(S);
    C.eq(e, { code: 0, signal: null }, 'the server exits 0 on SIGTERM');
  } catch (e) {
    C.ok(false, 'the test ran to its end', e.stack || String(e));
    if (S) console.error(S.log().slice(-4000));
  } finally {
    if (S && !S.exit) S.proc.kill('SIGKILL');
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  process.exit(C.summary());
}

main();
