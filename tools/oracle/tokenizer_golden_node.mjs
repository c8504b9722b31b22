#!/usr/bin/env node
// Golden files for microLLM's tokenizer tests from Hugging Face `tokenizers` itself: the Rust library through
// its Node.js bindings (the npm package `tokenizers`, the same code and version as Python's), for machines
// that reach the npm registry but not Python's. tools/oracle/tokenizer_golden.py writes the same files and
// adds transformers' results (hf_* fields); this script leaves those out (meta.hf_class is null, and the C++
// test then compares only the `tokenizers` results).
//
// Setup, once (data/ is git-ignored):
//   scripts/fetch-tokenizers.sh
//   npm install --prefix data/oracle-node tokenizers@0.23.2 @huggingface/tokenizers@0.2.0
// Usage:
//   node tools/oracle/tokenizer_golden_node.mjs [--names llama2,gemma3,o200k] [--check qwen3,llama3,deepseek_v3]
//                                              [--modules data/oracle-node] [--out DIR]
//
// --names:  writes tests/fixtures/tokenizer/golden_<name>.jsonl for each (default: llama2, gemma3, o200k and
//   the variants of variants.json, which are a fetched tokenizer.json with some parts replaced):
//   line 1 {"meta": {...}}, then one line per text of texts.jsonl and texts_byte_fallback.jsonl (a variant
//   may take only the first lines of a file: meta.texts_lines)
//   {"i", "ids", "ids_special", "decoded": decode(ids), "decoded_skip": decode(ids_special, skip_special_tokens)},
//   then one line per case of decode_cases.json found in the vocabulary {"case", "decode_ids", "decoded",
//   "decoded_skip"}.
// --check:  first compares the bindings with the existing (Python-made) goldens of these names and stops
//   on any difference, so that the bindings are known to agree with Python before they write anything.
// When @huggingface/tokenizers (the JavaScript port used by transformers.js) is installed too, its results
// are compared with the Rust library's and the differences are reported (they are not written).
import { createRequire } from 'node:module';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, arg, i, all) => (arg.startsWith('--') ? [...pairs, [arg.slice(2), all[i + 1]]] : pairs), []),
);
const names = (args.names ?? 'llama2,gemma3,o200k,llama2_metaspace,llama2_metaspace_split,llama2_metaspace_never,llama2_unigram')
  .split(',')
  .filter(Boolean);
const checkNames = (args.check ?? 'qwen3,llama3,deepseek_v3').split(',').filter(Boolean);
const modules = path.resolve(root, args.modules ?? 'data/oracle-node');
const data = path.join(root, 'data', 'tokenizers');
const fixtures = path.join(root, 'tests', 'fixtures', 'tokenizer');
const outDir = path.resolve(root, args.out ?? fixtures);
const TEXT_FILES = ['texts.jsonl', 'texts_byte_fallback.jsonl'];

const requireFrom = createRequire(path.join(modules, 'package.json'));
const { Tokenizer } = requireFrom('tokenizers');
const tokenizersVersion = requireFrom('tokenizers/package.json').version;
let jsPort = null;
try {
  const loaded = await import(requireFrom.resolve('@huggingface/tokenizers'));
  jsPort = loaded.Tokenizer ? loaded : loaded.default;
} catch {
  console.error('@huggingface/tokenizers is not installed: no comparison with the JavaScript port');
}

const readLines = (file) =>
  fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
const sha256 = (file) => crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex');
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
// One JSON value per line; U+2028/U+2029/U+0085 escaped as the Python oracle does.
const dump = (value) => JSON.stringify(value).replace(/[\u2028\u2029\u0085]/g, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0')) + '\n';

async function encodings(tok, text) {
  const ids = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
  const idsSpecial = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
  return { ids, ids_special: idsSpecial, decoded: await tok.decode(ids, false), decoded_skip: await tok.decode(idsSpecial, true) };
}

// The bindings against the goldens Python's tokenizers wrote for these names.
async function checkAgainstPython(name) {
  const golden = readLines(path.join(fixtures, `golden_${name}.jsonl`));
  const texts = readLines(path.join(fixtures, 'texts.jsonl'));
  const tok = Tokenizer.fromFile(path.join(data, name, 'tokenizer.json'));
  let differ = 0;
  for (let i = 0; i < texts.length; i++) {
    const got = await encodings(tok, texts[i]);
    const want = golden[i + 1];
    if (!same(got.ids, want.ids) || !same(got.ids_special, want.ids_special) || got.decoded !== want.decoded ||
        got.decoded_skip !== want.decoded_skip) {
      if (++differ <= 5) console.error(`${name} text ${i}: the bindings differ from Python: ${JSON.stringify(texts[i])}`);
    }
  }
  console.error(`check ${name}: ${texts.length} texts, ${differ} differ from golden_${name}.jsonl (Python ${golden[0].meta.tokenizers_version})`);
  return differ;
}

function configToken(config, key) {
  const value = config[key];
  return typeof value === 'string' ? value : value?.content ?? null;
}

// The ids of one decode case in this vocabulary, or null when one of its tokens is not there.
function caseIds(tok, tokens, config) {
  const byteFallback = tok.tokenToId('<0x41>') !== null;
  const byteLevelChar = (b) => {
    // GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the others move to U+0100...
    const printable = (x) => (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
    if (printable(b)) return String.fromCodePoint(b);
    let n = 0;
    for (let x = 0; x < b; x++) if (!printable(x)) n++;
    return String.fromCodePoint(0x100 + n);
  };
  const ids = [];
  for (const t of tokens) {
    let text = t;
    if (typeof t === 'object' && 'byte' in t) {
      text = byteFallback ? `<0x${t.byte.toString(16).toUpperCase().padStart(2, '0')}>` : byteLevelChar(t.byte);
    } else if (typeof t === 'object' && 'special' in t) {
      text = configToken(config, `${t.special}_token`);
    }
    const id = text === null ? null : tok.tokenToId(text);
    if (id === null || id === undefined) return null;
    ids.push(id);
  }
  return ids;
}

// variants.json's unigram_from_vocab: a Unigram model over the pieces of a BPE vocabulary, the piece of
// id i scored -(i + 1) / 1000.
function unigramFromVocab(vocab, settings) {
  const pieces = Object.entries(vocab).sort((a, b) => a[1] - b[1]);
  pieces.forEach(([, id], i) => {
    if (id !== i) throw new Error(`unigram_from_vocab needs ids 0..n-1 (id ${id} at ${i})`);
  });
  return { type: 'Unigram', unk_id: settings.unk_id, byte_fallback: settings.byte_fallback,
           vocab: pieces.map(([piece, id]) => [piece, -(id + 1) / 1000]) };
}

async function writeGolden(name) {
  const variant = JSON.parse(fs.readFileSync(path.join(fixtures, 'variants.json'), 'utf8')).variants[name] ?? null;
  const dir = path.join(data, variant ? variant.base : name);
  const json = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  if (variant) Object.assign(json, variant.overrides);
  if (variant?.unigram_from_vocab) json.model = unigramFromVocab(json.model.vocab, variant.unigram_from_vocab);
  const tok = Tokenizer.fromString(JSON.stringify(json));
  const config = fs.existsSync(path.join(dir, 'tokenizer_config.json'))
    ? JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'))
    : {};
  const textsLines = variant?.texts_lines ?? {};
  const texts = TEXT_FILES.flatMap((f) => readLines(path.join(fixtures, f)).slice(0, textsLines[f] ?? Infinity));
  const cases = JSON.parse(fs.readFileSync(path.join(fixtures, 'decode_cases.json'), 'utf8')).cases;
  const port = jsPort ? new jsPort.Tokenizer(json, config) : null;
  let portDiffers = 0;
  const lines = [];
  for (let i = 0; i < texts.length; i++) {
    const line = { i, ...(await encodings(tok, texts[i])) };
    lines.push(line);
    if (port) {
      let ids = null;
      let idsSpecial = null;
      let decoded = '';  // the port refuses to decode no ids at all
      try {
        ids = port.encode(texts[i], { add_special_tokens: false }).ids;
        idsSpecial = port.encode(texts[i], { add_special_tokens: true }).ids;
        if (line.ids.length > 0) {
          decoded = port.decode(line.ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
        }
      } catch (e) {
        ids = `error: ${e.message}`;
      }
      if (!same(ids, line.ids) || !same(idsSpecial, line.ids_special) || decoded !== line.decoded) {
        if (++portDiffers <= 5) {
          console.error(`${name} text ${i} ${JSON.stringify(texts[i]).slice(0, 60)}: the JavaScript port gives ` +
                        `${JSON.stringify(ids).slice(0, 80)} / ${JSON.stringify(decoded)?.slice(0, 60)}, Rust ` +
                        `${JSON.stringify(line.ids).slice(0, 80)} / ${JSON.stringify(line.decoded).slice(0, 60)}`);
        }
      }
    }
  }
  let caseCount = 0;
  for (const c of cases) {
    const ids = caseIds(tok, c.tokens, config);
    if (ids === null) continue;
    lines.push({ case: c.name, decode_ids: ids, decoded: await tok.decode(ids, false), decoded_skip: await tok.decode(ids, true) });
    caseCount++;
  }
  const meta = {
    name,
    source: fs.existsSync(path.join(dir, 'SOURCE')) ? fs.readFileSync(path.join(dir, 'SOURCE'), 'utf8').trim() : '',
    ...(variant ? { base: variant.base, about: variant.about, overrides: variant.overrides } : {}),
    ...(variant?.unigram_from_vocab ? { unigram_from_vocab: variant.unigram_from_vocab } : {}),
    texts_files: TEXT_FILES,
    ...(variant?.texts_lines ? { texts_lines: variant.texts_lines } : {}),
    texts_sha256: Object.fromEntries(TEXT_FILES.map((f) => [f, sha256(path.join(fixtures, f))])),
    texts: texts.length,
    decode_cases: caseCount,
    oracle: `npm tokenizers ${tokenizersVersion} (Hugging Face tokenizers' Rust library, Node.js bindings)`,
    tokenizers_version: tokenizersVersion,
    transformers_version: null,
    hf_class: null,
    vocab_size: tok.getVocabSize(true),
    bos_token: configToken(config, 'bos_token'),
    eos_token: configToken(config, 'eos_token'),
  };
  const file = path.join(outDir, `golden_${name}.jsonl`);
  fs.writeFileSync(file, dump({ meta }) + lines.map(dump).join(''));
  console.error(`${file}: ${texts.length} texts, ${caseCount} decode cases` +
                (port ? `; the JavaScript port differs from Rust on ${portDiffers} texts` : ''));
}

let differ = 0;
for (const name of checkNames) differ += await checkAgainstPython(name);
if (differ > 0) {
  console.error('the bindings disagree with the Python goldens: nothing written');
  process.exit(1);
}
fs.mkdirSync(outDir, { recursive: true });
for (const name of names) await writeGolden(name);
