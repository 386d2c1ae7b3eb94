// server_image.js — images through `squad serve` (docs/images.md, docs/server.md) end to end; run by
// tests/cli_serve_image.sh with the squad binary CTest names.
//
//   node tests/server_image.js path/to/squad
//
// A tiny model with a vision tower (`squad synth --preset tiny-vl`, the real Qwen3 tokenizer) and
// screenshots made here (PNG written with zlib: two of one size that differ in their pixels, so their
// rows have the same ids and only the images tell them apart) and from tests/fixtures/images:
//   1. /v1/ask with a screenshot answers as `squad ask` does with the same image as a file;
//   2. the same screenshot with another question reports cache.reused > 0 (the screenshot is part of
//      the state); a different screenshot of the same size with the same text reuses nothing past the
//      image's start and answers differently; an exact repeat is a request-memo answer, and the memo
//      never answers the other screenshot's request;
//   3. bare base64 is taken as a data: URL is;
//   4. refusals, each a 400 naming the image and the server still answering: an http(s) URL, a
//      corrupt and a truncated PNG, bad base64, an image over --max-image-pixels; a body over
//      --max-body is a 413 however it holds its image; hostile images in flight beside good requests:
//      each refused, every good one answered as when alone;
//   5. /v1/decisions with input_image parts: answered, the image's tokens in usage, the same
//      screenshot with another question cached; a remote URL, a file_id and detail "low" refused;
//   6. /metrics and /v1/stats count image rows, image tokens and the encoder cache;
//   7. a model without a vision tower refuses an image with a 400 naming the model, on both APIs.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const zlib = require('zlib');
const L = require('./server_lib.js');
const { Checks, request } = L;

const SQUAD = path.resolve(process.argv[2] || 'build/squad');
const C = new Checks('server_image');
const TOK = path.resolve('third_party/qwen3/tokenizer.json');
const FIXTURES = path.resolve('tests/fixtures/images');
const MAX_BODY = 262144;
const TOL = 1e-6;

// ---- PNG writing (8-bit RGB, no filter): enough to make screenshots that differ -----------------
const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();
function crc32(buf) {
  let c = 0xffffffff;
  for (const b of buf) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
function chunk(type, data) {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type, 'ascii'), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(td));
  return Buffer.concat([len, td, crc]);
}
function png(w, h, pixel) {
  const raw = Buffer.alloc(h * (1 + 3 * w));
  for (let y = 0; y < h; y++) {
    raw[y * (1 + 3 * w)] = 0;
    for (let x = 0; x < w; x++) {
      const [r, g, b] = pixel(x, y);
      const o = y * (1 + 3 * w) + 1 + 3 * x;
      raw[o] = r; raw[o + 1] = g; raw[o + 2] = b;
    }
  }
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8; ihdr[9] = 2; ihdr[10] = 0; ihdr[11] = 0; ihdr[12] = 0;
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk('IHDR', ihdr),
    chunk('IDAT', zlib.deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}
const dataUrl = (bytes) => 'data:image/png;base64,' + bytes.toString('base64');

// two screenshots of one size (128x96: the tiny-vl processor keeps 128x96, a 8x6 grid, 12 tokens)
const SHOT_A = png(128, 96, (x, y) => (y < 20 ? [30, 60, 200] : x > 40 && x < 90 && y > 50 && y < 70 ? [20, 160, 40] : [245, 245, 245]));
const SHOT_B = png(128, 96, (x, y) => (y < 20 ? [200, 40, 40] : x > 10 && x < 60 && y > 30 && y < 80 ? [250, 200, 0] : [250, 250, 250]));
// a page of text, so the state is long enough for the state cache (--min-prefix 256 by default)
const PAGE = Array.from({ length: 24 }, (_, i) => `Row ${i + 1}: item ${i * 7 % 13}, price $${i * 3 + 1}.99, [Add to cart]`).join('\n');
const Q = [
  { text: 'Which button adds the first item?', options: ['Add to cart', 'Checkout', 'Help'] },
  { text: 'Is the banner red?', options: ['Yes', 'No'] },
];
const ask = (shots, q, extra = {}) => ({ state: PAGE, images: shots, questions: [q], ...extra });
const cacheOf = (r) => (r.json && r.json.cache) || {};
const tokensOf = (r) => (r.json && r.json.tokens) || {};
const probs = (r) => (r.json && r.json.answers ? r.json.answers.map((a) => a.probs) : null);

function decisionsBody(url, instructions, extraPart = {}) {
  return {
    model: 'vl',
    input: [{ role: 'user', content: [{ type: 'input_text', text: PAGE }, { type: 'input_image', image_url: url, ...extraPart }] }],
    questions: [{ type: 'choice', instructions, choices: [{ value: 'Add to cart' }, { value: 'Checkout' }] }],
  };
}

async function expect400(S, endpoint, body, names, what) {
  const r = await request(S.base, 'POST', endpoint, body);
  C.eq(r.status, 400, `${what}: status`);
  C.has(r.json && r.json.error && r.json.error.message, names, `${what}: the message`);
  return r;
}

async function visionServer(dir) {
  const tmpShot = path.join(dir, 'a.png');
  fs.writeFileSync(tmpShot, SHOT_A);
  const S = await L.startServer(SQUAD, path.join(dir, 'vl'), ['--threads', '1', '--served-model-name', 'vl',
    '--max-body', String(MAX_BODY), '--max-image-pixels', String(128 * 96)]);
  try {
    // 1. the answer equals squad ask's with the file
    const r1 = await request(S.base, 'POST', '/v1/ask', ask([dataUrl(SHOT_A)], Q[0]));
    C.eq(r1.status, 200, '/v1/ask with a screenshot: status');
    if (r1.status !== 200) console.error(r1.text);
    const cli = L.runSquad(SQUAD, ['ask', '--model', path.join(dir, 'vl'), '--threads', '1'],
      JSON.stringify(ask([tmpShot], Q[0])));
    C.eq(cli.status, 0, 'squad ask with the file: status');
    let cliJson = null;
    try { cliJson = JSON.parse(cli.stdout); } catch (e) { C.ok(false, 'squad ask output', cli.stdout); }
    if (cliJson && cliJson.answers && probs(r1)) {
      C.close(probs(r1)[0], cliJson.answers[0].probs, '/v1/ask = squad ask (the same image)', TOL);
      C.eq(r1.json.tokens.state, cliJson.tokens.state, 'the state tokens: /v1/ask = squad ask');
    }
    C.ok(cacheOf(r1).computed > 0, 'the first request computes', cacheOf(r1));
    // 2. the same screenshot, another question: the state restored
    const r2 = await request(S.base, 'POST', '/v1/ask', ask([dataUrl(SHOT_A)], Q[1]));
    C.eq(r2.status, 200, 'the same screenshot, another question: status');
    C.ok(cacheOf(r2).reused > 0, 'the same screenshot, another question: cache.reused > 0', cacheOf(r2));
    // the other screenshot, same size and text: the same ids, nothing reused past the image's start
    const r3 = await request(S.base, 'POST', '/v1/ask', ask([dataUrl(SHOT_B)], Q[0]));
    C.eq(r3.status, 200, 'another screenshot: status');
    C.eq(tokensOf(r3).state, tokensOf(r1).state, 'another screenshot of the same size: as many state tokens');
    C.eq(cacheOf(r3).reused, 0, 'another screenshot: nothing reused (the image starts the state)');
    C.eq(r3.json && r3.json.memo, false, 'another screenshot: not a memo answer');
    C.ok(r3.json && r1.json && JSON.stringify(probs(r3)) !== JSON.stringify(probs(r1)), 'another screenshot: other answers',
      [probs(r1), probs(r3)]);
    // an exact repeat: the memo, the same answers
    const r4 = await request(S.base, 'POST', '/v1/ask', ask([dataUrl(SHOT_A)], Q[0]));
    C.eq(r4.json && r4.json.memo, true, 'an exact repeat: a memo answer');
    C.eq(probs(r4), probs(r1), 'an exact repeat: the same answers');
    const r5 = await request(S.base, 'POST', '/v1/ask', ask([dataUrl(SHOT_B)], Q[0]));
    C.eq(probs(r5), probs(r3), 'the other screenshot again: its own answers');
    // 3. bare base64
    const r6 = await request(S.base, 'POST', '/v1/ask', ask([SHOT_A.toString('base64')], Q[0]));
    C.eq(r6.status, 200, 'bare base64: status');
    if (probs(r6) && probs(r1)) C.close(probs(r6)[0], probs(r1)[0], 'bare base64 = the data: URL', TOL);
    // two images, one from the fixtures
    const small = fs.readFileSync(path.join(FIXTURES, 'small_64x48.png'));
    const r7 = await request(S.base, 'POST', '/v1/ask', ask([dataUrl(SHOT_A), dataUrl(small)], Q[0]));
    C.eq(r7.status, 200, 'two images: status');
    C.ok(tokensOf(r1).state > 0 && tokensOf(r7).state === tokensOf(r1).state + 6, 'two images: 4 + 2 more state tokens',
      tokensOf(r7));
    // 4. refusals: 400 naming the image
    await expect400(S, '/v1/ask', ask(['https://example.com/shot.png'], Q[0]), 'remote URLs are not fetched', 'an https URL');
    await expect400(S, '/v1/ask', ask(['http://example.com/shot.png'], Q[0]), 'request.images[0]', 'an http URL');
    const corrupt = Buffer.concat([SHOT_A.subarray(0, 60), Buffer.alloc(200, 7), SHOT_A.subarray(260)]);
    await expect400(S, '/v1/ask', ask([dataUrl(SHOT_A), dataUrl(corrupt)], Q[0]), 'request.images[1]: PNG', 'a corrupt PNG');
    await expect400(S, '/v1/ask', ask([dataUrl(SHOT_A.subarray(0, 100))], Q[0]), 'PNG', 'a truncated PNG');
    await expect400(S, '/v1/ask', ask(['data:image/png;base64,iVBOR*w0KGgo='], Q[0]), 'request.images[0]', 'bad base64');
    const big = png(129, 96, () => [0, 0, 0]);
    await expect400(S, '/v1/ask', ask([dataUrl(big)], Q[0]), 'over the limit', 'over --max-image-pixels');
    const huge = Buffer.alloc(MAX_BODY, 1);
    const r8 = await request(S.base, 'POST', '/v1/ask', ask([dataUrl(huge)], Q[0]));
    C.eq(r8.status, 413, 'a body over --max-body with its image: 413');
    const bad = await request(S.base, 'POST', '/v1/ask', ask('a.png', Q[0]));
    C.eq(bad.status, 422, '"images" not an array: 422');
    const again = await request(S.base, 'POST', '/v1/ask', ask([dataUrl(SHOT_A)], Q[1]));
    C.eq(probs(again), probs(r2), 'after the refusals the server answers as before');
    // hostile images in flight beside good requests: every hostile one refused, every good one answered
    // as alone (nothing in flight lost)
    const hostile = [corrupt, SHOT_A.subarray(0, 100), big, Buffer.from('GIF89a'), Buffer.alloc(64, 0)];
    const mixed = [];
    for (let i = 0; i < 4; i++) {
      mixed.push(request(S.base, 'POST', '/v1/ask', ask([dataUrl(SHOT_A)], Q[1])).then((r) => ['good', r]));
      mixed.push(request(S.base, 'POST', '/v1/ask', ask([dataUrl(SHOT_B)], Q[0])).then((r) => ['goodB', r]));
      for (const h of hostile) mixed.push(request(S.base, 'POST', '/v1/ask', ask([dataUrl(h)], Q[0])).then((r) => ['bad', r]));
    }
    const done = await Promise.all(mixed);
    C.ok(done.filter(([k, r]) => k === 'bad' && r.status === 400).length === 4 * hostile.length,
      'hostile images in flight: every one a 400', done.filter(([k]) => k === 'bad').map(([, r]) => r.status));
    C.ok(done.filter(([k, r]) => k === 'good' && r.status === 200 && JSON.stringify(probs(r)) === JSON.stringify(probs(r2))).length === 4,
      'good requests beside them: all answered, as alone', done.filter(([k]) => k === 'good').map(([, r]) => r.status));
    C.ok(done.filter(([k, r]) => k === 'goodB' && r.status === 200 && JSON.stringify(probs(r)) === JSON.stringify(probs(r3))).length === 4,
      'the other screenshot beside them: all answered, as alone', done.filter(([k]) => k === 'goodB').map(([, r]) => r.status));
    // 5. /v1/decisions
    const d1 = await request(S.base, 'POST', '/v1/decisions', decisionsBody(dataUrl(SHOT_A), 'Which button adds the first item?'));
    C.eq(d1.status, 200, '/v1/decisions with input_image: status');
    if (d1.status !== 200) console.error(d1.text);
    const d2 = await request(S.base, 'POST', '/v1/decisions', decisionsBody(dataUrl(SHOT_A), 'Which button checks out?', { detail: 'high' }));
    C.eq(d2.status, 200, '/v1/decisions, the same screenshot: status');
    const u1 = d1.json && d1.json.usage, u2 = d2.json && d2.json.usage;
    C.ok(u2 && u2.input_tokens_details.cached_tokens > 0, '/v1/decisions, the same screenshot: cached tokens', u2);
    const dText = await request(S.base, 'POST', '/v1/decisions', {
      model: 'vl', input: PAGE, questions: [{ type: 'choice', instructions: 'Which button adds the first item?', choices: [{ value: 'Add to cart' }, { value: 'Checkout' }] }],
    });
    C.ok(u1 && dText.json && u1.input_tokens > dText.json.usage.input_tokens + 12, 'the image counts in input_tokens',
      [u1, dText.json && dText.json.usage]);
    await expect400(S, '/v1/decisions', decisionsBody('https://example.com/a.png', 'q'), 'input[0].content[1].image_url', 'decisions: a remote URL');
    await expect400(S, '/v1/decisions', decisionsBody(dataUrl(corrupt), 'q'), 'PNG', 'decisions: a corrupt PNG');
    const fileId = decisionsBody(dataUrl(SHOT_A), 'q');
    fileId.input[0].content[1] = { type: 'input_image', file_id: 'file-1' };
    await expect400(S, '/v1/decisions', fileId, 'fetches nothing', 'decisions: a file_id');
    await expect400(S, '/v1/decisions', decisionsBody(dataUrl(SHOT_A), 'q', { detail: 'low' }), 'detail', 'decisions: detail low');
    // 6. metrics
    const m = await request(S.base, 'GET', '/metrics');
    const metric = (name) => {
      const line = m.text.split('\n').find((l) => l.startsWith(name + ' '));
      return line ? Number(line.split(' ')[1]) : NaN;
    };
    C.ok(metric('squad_image_rows_total') >= 6, 'squad_image_rows_total', metric('squad_image_rows_total'));
    C.ok(metric('squad_image_tokens_total') >= 6 * 12, 'squad_image_tokens_total', metric('squad_image_tokens_total'));
    C.ok(metric('squad_encoder_cache_misses_total') >= 2, 'squad_encoder_cache_misses_total', metric('squad_encoder_cache_misses_total'));
    C.ok(metric('squad_encoder_cache_budget_bytes') > 0, 'squad_encoder_cache_budget_bytes');
    C.ok(Number.isFinite(metric('squad_encoder_cache_hits_total')), 'squad_encoder_cache_hits_total');
    const st = await request(S.base, 'GET', '/v1/stats');
    const im = st.json && st.json.images;
    C.ok(im && im.rows === metric('squad_image_rows_total') && im.tokens === metric('squad_image_tokens_total') &&
      im.encoder_misses === metric('squad_encoder_cache_misses_total'), '/v1/stats images = /metrics', im);
  } finally {
    const e = await L.stopServer(S);
    C.eq(e.code, 0, 'the vision server stops with 0');
  }
}

async function textServer(dir) {
  const S = await L.startServer(SQUAD, path.join(dir, 'text'), ['--threads', '1', '--served-model-name', 'plain']);
  try {
    await expect400(S, '/v1/ask', ask([dataUrl(SHOT_A)], Q[0]), 'the model "plain" takes no images', 'no tower: /v1/ask');
    const d = await expect400(S, '/v1/decisions', { ...decisionsBody(dataUrl(SHOT_A), 'q'), model: 'plain' },
      'the model "plain" takes no images', 'no tower: /v1/decisions');
    C.eq(d.json && d.json.error && d.json.error.param, 'input[0].content[1].image_url', 'no tower: the param');
    const r = await request(S.base, 'POST', '/v1/ask', { state: PAGE, questions: [Q[0]] });
    C.eq(r.status, 200, 'no tower: a text request is answered');
  } finally {
    await L.stopServer(S);
  }
}

async function main() {
  if (!fs.existsSync(TOK)) {
    C.ok(false, `${TOK} is missing (run tools/fetch_test_data.sh)`);
    return C.summary();
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'squad-image-'));
  try {
    let r = L.runSquad(SQUAD, ['synth', '--preset', 'tiny-vl', '--out', path.join(dir, 'vl'), '--tokenizer', TOK]);
    C.eq(r.status, 0, 'synth tiny-vl');
    r = L.runSquad(SQUAD, ['synth', '--preset', 'tiny', '--out', path.join(dir, 'text'), '--tokenizer', TOK]);
    C.eq(r.status, 0, 'synth tiny');
    await visionServer(dir);
    await textServer(dir);
  } catch (e) {
    C.ok(false, 'server_image', e.stack || String(e));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  return C.summary();
}

main().then((code) => process.exit(code));
