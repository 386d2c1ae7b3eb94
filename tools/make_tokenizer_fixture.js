#!/usr/bin/env node
// make_tokenizer_fixture.js — writes the expected token ids of the tokenizer corpus with Hugging Face
// `tokenizers` (the npm package @anush008/tokenizers@0.6.0, a native build of tokenizers 0.22), the
// reference squad's tokenizer must match token for token.
//
// Input:  tests/fixtures/tokenizer/corpus.jsonl   one JSON string per line
// Output: tests/fixtures/tokenizer/expected.jsonl one line per corpus line:
//         {"ids": [...], "nfc": "..."}  ids from encode(text, add_special_tokens=false);
//         nfc is the text in Unicode NFC (what decoding the ids must give back).
//         tests/fixtures/tokenizer/variants.jsonl: small synthetic tokenizer.json files built here
//         (Split behaviours, invert, ByteLevel options, merges in both forms, ignore_merges,
//         byte_fallback / unk, added-token flags, normalisers), each with cases
//         {"text", "ids", "decoded"} from the reference.
//
// This script installs nothing. Put the package in a temporary folder and point NODE_PATH at it:
//   tmp=$(mktemp -d) && (cd "$tmp" && npm install @anush008/tokenizers@0.6.0)
//   bash tools/fetch_test_data.sh
//   NODE_PATH="$tmp/node_modules" node tools/make_tokenizer_fixture.js [tokenizer.json]
// The tokenizer defaults to third_party/qwen3/tokenizer.json.
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const tokPath = process.argv[2] || path.join(root, 'third_party/qwen3/tokenizer.json');
const corpusPath = path.join(root, 'tests/fixtures/tokenizer/corpus.jsonl');
const outPath = path.join(root, 'tests/fixtures/tokenizer/expected.jsonl');
const variantsPath = path.join(root, 'tests/fixtures/tokenizer/variants.jsonl');

let Tokenizer;
try {
  ({ Tokenizer } = require('@anush008/tokenizers'));
} catch (e) {
  console.error('make_tokenizer_fixture: cannot load @anush008/tokenizers; install it into a temporary ' +
                'folder and set NODE_PATH (see the comment at the top of this file)');
  process.exit(2);
}

// GPT-2's byte <-> printable character map.
function byteChars() {
  const printable = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  const out = [];
  let n = 0;
  for (let b = 0; b < 256; b++) out.push(String.fromCodePoint(printable(b) ? b : 256 + n++));
  return out;
}

// A small byte-level BPE model: the 256 byte symbols, then merges learned from a few words.
function byteLevelModel(opts = {}) {
  const chars = byteChars();
  const vocab = {};
  chars.forEach((c, i) => { vocab[c] = i; });
  const mapWord = (w) => Array.from(Buffer.from(w, 'utf8')).map((b) => chars[b]).join('');
  const words = ['Ġthe', 'Ġhello', 'Ġworld', 'hello', 'ing', 'Ġsing', 'ĠĠ', 'ĠĠĠĠ', 'ĊĊ', 'Ġ12', 'er', 'Ġwater',
                 mapWord(' café'), mapWord('日本'), 'aaaa', 'Ġa', 'ab', 'abab'];
  const merges = [];
  let next = 256;
  for (const w of words) {
    // merge left to right: each prefix + next char
    let cur = Array.from(w)[0];
    for (const ch of Array.from(w).slice(1)) {
      const joined = cur + ch;
      if (!(joined in vocab)) { vocab[joined] = next++; merges.push([cur, ch]); }
      cur = joined;
    }
  }
  return {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: !!opts.ignoreMerges, vocab,
    merges: opts.stringMerges ? merges.map(([a, b]) => `${a} ${b}`) : merges,
  };
}

function addedTokens(base) {
  const t = (id, content, o = {}) => ({ id, content, single_word: !!o.single, lstrip: !!o.lstrip, rstrip: !!o.rstrip,
                                        normalized: !!o.normalized, special: !!o.special });
  return [t(base, '<|s|>', { special: true }), t(base + 1, '<|long|>', { special: true }),
          t(base + 2, '<|lo', { special: true }), t(base + 3, '[L]', { lstrip: true }), t(base + 4, '[R]', { rstrip: true }),
          t(base + 5, '[W]', { single: true }), t(base + 6, 'café', { normalized: true }), t(base + 7, '<think>')];
}

const QWEN_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function tokenizerJson({ model, normalizer = null, pre, decoder = { type: 'ByteLevel', add_prefix_space: true,
                          trim_offsets: true, use_regex: true }, added = true }) {
  const size = Math.max(...Object.values(model.vocab)) + 1;
  return { version: '1.0', truncation: null, padding: null, added_tokens: added ? addedTokens(size) : [],
           normalizer, pre_tokenizer: pre, post_processor: null, decoder, model };
}

const BL = (prefix, regex) => ({ type: 'ByteLevel', add_prefix_space: prefix, trim_offsets: false, use_regex: regex });
const split = (pattern, behavior, invert = false) => ({ type: 'Split', pattern, behavior, invert });

const COMMON_CASES = ['', 'hello world', ' hello  world', 'the water singing', 'café 日本', 'Cafe\u0301 cafe\u0301',
  'a <|s|> b', 'x<|long|>y<|lo z', 'a   [L]b', 'a[R]   b', 'x [W] y', 'x[W]y', 'a café b', '<think>hi</think>',
  '12 345 6789', 'abababab aaaaaaaa', "it's I'LL", 'line\n\n\nnext\r\n', '  \t  x', '🙂👍🏽', 'a-b--c---d'];

function variants() {
  const v = [];
  v.push({ name: 'gpt2 (ByteLevel with regex, prefix space, string merges)',
           tokenizer: tokenizerJson({ model: byteLevelModel({ stringMerges: true }), pre: BL(true, true) }) });
  v.push({ name: 'ByteLevel with regex, no prefix space, pair merges',
           tokenizer: tokenizerJson({ model: byteLevelModel(), pre: BL(false, true) }) });
  v.push({ name: 'qwen-like (NFC, Split Isolated, ByteLevel without regex)',
           tokenizer: tokenizerJson({ model: byteLevelModel(), normalizer: { type: 'NFC' },
             pre: { type: 'Sequence', pretokenizers: [split({ Regex: QWEN_REGEX }, 'Isolated'), BL(false, false)] } }) });
  for (const behavior of ['Removed', 'Isolated', 'MergedWithPrevious', 'MergedWithNext', 'Contiguous']) {
    for (const invert of [false, true]) {
      v.push({ name: `Split regex \\d+|- ${behavior}${invert ? ' inverted' : ''}`,
               tokenizer: tokenizerJson({ model: byteLevelModel(), added: false,
                 pre: { type: 'Sequence', pretokenizers: [split({ Regex: '\\d+|-' }, behavior, invert), BL(false, false)] } }) });
    }
  }
  v.push({ name: 'Split String " " Removed then ByteLevel with prefix space',
           tokenizer: tokenizerJson({ model: byteLevelModel(),
             pre: { type: 'Sequence', pretokenizers: [split({ String: ' ' }, 'Removed'), BL(true, false)] } }) });
  v.push({ name: 'ignore_merges', tokenizer: tokenizerJson({ model: byteLevelModel({ ignoreMerges: true }),
           pre: BL(false, true) }) });
  v.push({ name: 'NFKC in a Sequence', tokenizer: tokenizerJson({ model: byteLevelModel(),
           normalizer: { type: 'Sequence', normalizers: [{ type: 'NFKC' }] }, pre: BL(false, true) }) });
  v.push({ name: 'NFD', tokenizer: tokenizerJson({ model: byteLevelModel(), normalizer: { type: 'NFD' }, pre: BL(false, true) }) });
  v.push({ name: 'no pre-tokenizer, no normalizer', tokenizer: tokenizerJson({ model: byteLevelModel(), pre: null, added: false }) });
  // A character-level (not byte-level) BPE with byte fallback, and one with a fused unk token.
  const charVocab = { '<unk>': 0 };
  let id = 1;
  for (let b = 0; b < 256; b++) charVocab['<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>'] = id++;
  for (const c of 'abcdefghijklmnopqrstuvwxyz ') charVocab[c] = id++;
  const charMerges = [['h', 'e'], ['l', 'l'], ['he', 'll'], ['hell', 'o'], [' ', 'w'], ['o', 'r']];
  for (const [a, b] of charMerges) charVocab[a + b] = id++;
  const charModel = (o) => ({ type: 'BPE', dropout: null, unk_token: o.unk ? '<unk>' : null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: !!o.fuse, byte_fallback: !!o.fallback, ignore_merges: false, vocab: charVocab,
    merges: charMerges });
  const splitSpaces = { type: 'Split', pattern: { String: ' ' }, behavior: 'MergedWithNext', invert: false };
  v.push({ name: 'char BPE with byte_fallback', tokenizer: tokenizerJson({ model: charModel({ fallback: true, unk: true }),
           pre: splitSpaces, decoder: null, added: false }) });
  v.push({ name: 'char BPE with fused unk', tokenizer: tokenizerJson({ model: charModel({ unk: true, fuse: true }),
           pre: splitSpaces, decoder: null, added: false }) });
  v.push({ name: 'char BPE with unk, not fused', tokenizer: tokenizerJson({ model: charModel({ unk: true }),
           pre: splitSpaces, decoder: null, added: false }) });
  const charCases = ['hello world', 'héllo wörld', 'ab ÀÉ cd', 'xyz日本', 'hello', 'HELLO'];
  for (const x of v) x.cases = x.name.startsWith('char') ? charCases : COMMON_CASES;
  return v;
}

async function writeVariants() {
  const lines = [];
  for (const v of variants()) {
    const tok = Tokenizer.fromString(JSON.stringify(v.tokenizer));
    const cases = [];
    for (const raw of v.cases) {
      const text = raw;
      const ids = Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());
      cases.push({ text, ids, decoded: await tok.decode(ids, false) });
    }
    lines.push(JSON.stringify({ name: v.name, tokenizer: v.tokenizer, cases }));
  }
  fs.writeFileSync(variantsPath, lines.join('\n') + '\n');
  console.log(`make_tokenizer_fixture: ${lines.length} variants -> ${path.relative(root, variantsPath)}`);
}

async function main() {
  await writeVariants();
  const tok = Tokenizer.fromFile(tokPath);
  const lines = fs.readFileSync(corpusPath, 'utf8').split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  const out = [];
  for (const [i, line] of lines.entries()) {
    const text = JSON.parse(line);
    if (typeof text !== 'string') throw new Error(`corpus line ${i + 1} is not a JSON string`);
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    const ids = Array.from(enc.getIds());
    const decoded = await tok.decode(ids, false);
    const nfc = text.normalize('NFC');
    if (decoded !== nfc) console.error(`note: line ${i + 1}: the reference decode differs from NFC(text)`);
    out.push(JSON.stringify({ ids, nfc }));
  }
  fs.writeFileSync(outPath, out.join('\n') + '\n');
  console.log(`make_tokenizer_fixture: ${out.length} strings -> ${path.relative(root, outPath)}`);
}

main().catch((e) => { console.error(e); process.exit(1); });
