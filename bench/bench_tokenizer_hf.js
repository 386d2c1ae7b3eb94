#!/usr/bin/env node
// bench_tokenizer_hf.js — the reference for bench_tokenizer.c: Hugging Face tokenizers (the npm package
// @anush008/tokenizers@0.6.0, native tokenizers 0.22) encoding the same documents one at a time,
// single-threaded, add_special_tokens false; prints MB/s, tokens/s and the total token count, by wall
// time and by process CPU time (all threads: the encode runs on one worker thread while the main
// thread waits; on a shared machine the CPU-time figure is the steadier one).
//
//   tmp=$(mktemp -d) && (cd "$tmp" && npm install @anush008/tokenizers@0.6.0)
//   build/bench_tokenizer --write-docs /tmp/tok-docs.jsonl
//   RAYON_NUM_THREADS=1 NODE_PATH="$tmp/node_modules" node bench/bench_tokenizer_hf.js /tmp/tok-docs.jsonl [tokenizer.json] [passes]
'use strict';
process.env.RAYON_NUM_THREADS = process.env.RAYON_NUM_THREADS || '1';
process.env.TOKENIZERS_PARALLELISM = 'false';
const fs = require('fs');
const { Tokenizer } = require('@anush008/tokenizers');

async function main() {
  const docsPath = process.argv[2];
  const tokPath = process.argv[3] || 'third_party/qwen3/tokenizer.json';
  const passes = Number(process.argv[4] || 4);
  if (!docsPath) { console.error('usage: bench_tokenizer_hf.js DOCS.jsonl [tokenizer.json] [passes]'); process.exit(2); }
  let t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(tokPath);
  console.log(`load: ${(Number(process.hrtime.bigint() - t0) / 1e9).toFixed(3)} s`);
  const docs = fs.readFileSync(docsPath, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  const bytes = docs.reduce((s, d) => s + Buffer.byteLength(d, 'utf8'), 0);
  console.log(`documents: ${docs.length}, ${(bytes / 1e6).toFixed(2)} MB`);
  const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
  const fmt = (t, tokens) => `${t.toFixed(3)} s (${(bytes / 1e6 / t).toFixed(2)} MB/s, ${(tokens / t).toFixed(0)} tokens/s)`;
  let best = Infinity, bestCpu = Infinity, tokens = 0;
  for (let p = 0; p < passes; p++) {
    tokens = 0;
    t0 = process.hrtime.bigint();
    const c0 = cpu();
    for (const d of docs) tokens += (await tok.encode(d, null, { addSpecialTokens: false })).getLength();
    const t = Number(process.hrtime.bigint() - t0) / 1e9, c = cpu() - c0;
    best = Math.min(best, t);
    bestCpu = Math.min(bestCpu, c);
    console.log(`pass ${p + 1}${p === 0 ? ' (cold cache)' : ''}: wall ${fmt(t, tokens)}, cpu ${fmt(c, tokens)}`);
  }
  console.log(`tokens: ${tokens}`);
  console.log(`best wall (encode per document): ${(bytes / 1e6 / best).toFixed(2)} MB/s, ${(tokens / best).toFixed(0)} tokens/s`);
  console.log(`best cpu  (encode per document): ${(bytes / 1e6 / bestCpu).toFixed(2)} MB/s, ${(tokens / bestCpu).toFixed(0)} tokens/s`);
  // The same documents in one encodeBatch call: the loop runs natively (one rayon thread), without
  // a JavaScript promise per document; the fairer figure for the library itself.
  let bestBatch = Infinity, bestBatchCpu = Infinity;
  for (let p = 0; p < passes; p++) {
    t0 = process.hrtime.bigint();
    const c0 = cpu();
    const encs = await tok.encodeBatch(docs, { addSpecialTokens: false });
    const t = Number(process.hrtime.bigint() - t0) / 1e9, c = cpu() - c0;
    tokens = encs.reduce((s, e) => s + e.getLength(), 0);
    bestBatch = Math.min(bestBatch, t);
    bestBatchCpu = Math.min(bestBatchCpu, c);
    console.log(`batch pass ${p + 1}: wall ${fmt(t, tokens)}, cpu ${fmt(c, tokens)}`);
  }
  console.log(`tokens: ${tokens}`);
  console.log(`best wall (encodeBatch, 1 thread): ${(bytes / 1e6 / bestBatch).toFixed(2)} MB/s, ${(tokens / bestBatch).toFixed(0)} tokens/s`);
  console.log(`best cpu  (encodeBatch, 1 thread): ${(bytes / 1e6 / bestBatchCpu).toFixed(2)} MB/s, ${(tokens / bestBatchCpu).toFixed(0)} tokens/s`);
}
main().catch((e) => { console.error(e); process.exit(1); });
