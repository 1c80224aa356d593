// Runs a model written by `brisk export onnx` in ONNX Runtime (npm
// onnxruntime-node, CPU execution provider), once per case, in one session,
// so the symbolic axes are exercised with several shapes:
//
//   node run_onnx.js NODE_MODULES MODEL  B T IDS_FILE OUT_FILE  [B T IDS_FILE OUT_FILE ...]
//   node run_onnx.js NODE_MODULES MODEL --kv LAYERS HEADS HEAD_DIM  B T PROMPT PADS IDS_FILE OUT_FILE  [...]
//   node run_onnx.js NODE_MODULES MODEL --pooled OUTPUT  B T LENGTHS IDS_FILE OUT_FILE  [...]
//
// IDS_FILE holds B*T little-endian int64 token ids; OUT_FILE receives the
// logits as little-endian float32, (B, T, V) row-major. With --kv the model is
// the KV-cache export: the first PROMPT columns go in one call with an empty
// past (past_seq 0), then every later column alone, with the previous call's
// present keys and values as its past, as a generation loop runs it; the
// logits of all calls are written in position order, so OUT_FILE has the same
// layout either way. PADS (comma-separated, one per row) is how many of a
// row's first ids are left padding: attention_mask is 0 there and 1 after,
// and position_ids count the row's real tokens (0 on the padding). The
// present outputs' shapes are checked at every call. With --pooled the
// model is an encoder's export (a classifier's, OUTPUT logits, or an
// autoencoder's encoder, OUTPUT latent): LENGTHS (comma-separated, one per
// row) is how many of a row's first ids are real, attention_mask is 1 there
// and 0 on the padding after them, and OUT_FILE receives OUTPUT, (B, width). One JSON line per case
// on stdout. Exit 3 when onnxruntime-node cannot be loaded, 1 on any other
// failure, with the reason on stderr.
'use strict';

const fs = require('fs');
const path = require('path');

function die(msg, code = 1) {
  console.error(`run_onnx: ${msg}`);
  process.exit(code);
}

const [modules, model, ...args] = process.argv.slice(2);
let kv = null;  // {layers, heads, headDim}
let pooled = null;  // the output's name
let rest = args;
if (args[0] === '--kv') {
  kv = {layers: Number(args[1]), heads: Number(args[2]), headDim: Number(args[3])};
  rest = args.slice(4);
} else if (args[0] === '--pooled') {
  pooled = args[1];
  rest = args.slice(2);
}
const perCase = kv ? 6 : pooled ? 5 : 4;
if (!modules || !model || rest.length === 0 || rest.length % perCase !== 0)
  die('usage: run_onnx.js NODE_MODULES MODEL [--kv LAYERS HEADS HEAD_DIM | --pooled OUTPUT] B T [PROMPT PADS | LENGTHS] ' +
      'IDS_FILE OUT_FILE ...', 2);

let ort;
try {
  ort = require(path.join(modules, 'onnxruntime-node'));
} catch (e) {
  die(`cannot load onnxruntime-node from ${modules} (${e.message}); install it with ` +
      '`bash scripts/fetch_data.sh` (npm install onnxruntime-node --onnxruntime-node-install-cuda=skip ' +
      'into third_party/npm)', 3);
}

function sameList(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function cacheNames(prefix) {
  const names = [];
  for (let l = 0; l < kv.layers; ++l) names.push(`${prefix}.${l}.key`, `${prefix}.${l}.value`);
  return names;
}

// Columns [from, to) of every row of (batch, seq) ids, as a (batch, to - from) tensor.
function columns(ids, batch, seq, from, to) {
  const out = new BigInt64Array(batch * (to - from));
  for (let b = 0; b < batch; ++b) out.set(ids.subarray(b * seq + from, b * seq + to), b * (to - from));
  return new ort.Tensor('int64', out, [batch, to - from]);
}

// attention_mask over columns [0, to) and position_ids of columns [from, to)
// of rows whose first pads[b] columns are padding.
function maskAndPositions(batch, pads, from, to) {
  const mask = new BigInt64Array(batch * to), positions = new BigInt64Array(batch * (to - from));
  for (let b = 0; b < batch; ++b) {
    for (let j = 0; j < to; ++j) mask[b * to + j] = j < pads[b] ? 0n : 1n;
    for (let j = from; j < to; ++j) positions[b * (to - from) + j - from] = BigInt(Math.max(0, j - pads[b]));
  }
  return {attention_mask: new ort.Tensor('int64', mask, [batch, to]),
          position_ids: new ort.Tensor('int64', positions, [batch, to - from])};
}

// Runs one case through the KV-cache model; returns (B, T, V) logits.
async function runWithCache(session, ids, batch, seq, prompt, pads) {
  const pastNames = cacheNames('past_key_values'), presentNames = cacheNames('present');
  let past = {};
  for (const n of pastNames) past[n] = new ort.Tensor('float32', new Float32Array(0), [batch, kv.heads, 0, kv.headDim]);
  let logits = null, vocab = 0;
  for (let from = 0; from < seq;) {
    const to = from === 0 ? prompt : from + 1;
    const feeds = {input_ids: columns(ids, batch, seq, from, to), ...maskAndPositions(batch, pads, from, to), ...past};
    const out = await session.run(feeds);
    const step = out.logits;
    if (step.type !== 'float32') die(`logits type ${step.type}`);
    if (step.dims.length !== 3 || step.dims[0] !== batch || step.dims[1] !== to - from)
      die(`logits dims ${JSON.stringify(step.dims)} for input (${batch}, ${to - from}) at position ${from}`);
    if (!logits) {
      vocab = step.dims[2];
      logits = new Float32Array(batch * seq * vocab);
    }
    for (let b = 0; b < batch; ++b)
      logits.set(step.data.subarray(b * (to - from) * vocab, (b + 1) * (to - from) * vocab), (b * seq + from) * vocab);
    past = {};
    presentNames.forEach((n, i) => {
      const t = out[n];
      if (!t || !sameList(t.dims, [batch, kv.heads, to, kv.headDim]))
        die(`${n} dims ${t && JSON.stringify(t.dims)} after position ${to}, expected ` +
            JSON.stringify([batch, kv.heads, to, kv.headDim]));
      past[pastNames[i]] = t;
    });
    from = to;
  }
  return logits;
}

// An encoder on one padded batch: returns its (B, width) output.
async function runPooled(session, ids, batch, seq, lengths) {
  const mask = new BigInt64Array(batch * seq);
  for (let b = 0; b < batch; ++b)
    for (let j = 0; j < seq; ++j) mask[b * seq + j] = j < lengths[b] ? 1n : 0n;
  const out = await session.run({input_ids: new ort.Tensor('int64', ids, [batch, seq]),
                                 attention_mask: new ort.Tensor('int64', mask, [batch, seq])});
  const y = out[pooled];
  if (y.type !== 'float32') die(`${pooled} type ${y.type}`);
  if (y.dims.length !== 2 || y.dims[0] !== batch) die(`${pooled} dims ${JSON.stringify(y.dims)} for input (${batch}, ${seq})`);
  return y.data;
}

async function main() {
  // One thread: the tests share a small machine, and the model is tiny.
  const session = await ort.InferenceSession.create(model, {executionProviders: ['cpu'], intraOpNumThreads: 1});
  const inputs = ['input_ids', ...(kv ? ['attention_mask', 'position_ids', ...cacheNames('past_key_values')]
                                      : pooled ? ['attention_mask'] : [])];
  const outputs = pooled ? [pooled] : ['logits', ...(kv ? cacheNames('present') : [])];
  if (!sameList(session.inputNames, inputs)) die(`inputs ${JSON.stringify(session.inputNames)}`);
  if (!sameList(session.outputNames, outputs)) die(`outputs ${JSON.stringify(session.outputNames)}`);
  for (let i = 0; i < rest.length; i += perCase) {
    const batch = Number(rest[i]), seq = Number(rest[i + 1]);
    const prompt = kv ? Number(rest[i + 2]) : seq;
    const pads = kv ? rest[i + 3].split(',').map(Number) : [];
    const lengths = pooled ? rest[i + 2].split(',').map(Number) : [];
    const [idsFile, outFile] = rest.slice(i + perCase - 2, i + perCase);
    if (!(prompt >= 1 && prompt <= seq)) die(`prompt ${prompt} outside [1, ${seq}]`);
    if (kv && (pads.length !== batch || !pads.every((p) => p >= 0 && p < prompt)))
      die(`pads ${rest[i + 3]}: expected ${batch} counts, each below the prompt's ${prompt}`);
    if (pooled && (lengths.length !== batch || !lengths.every((n) => n >= 1 && n <= seq)))
      die(`lengths ${rest[i + 2]}: expected ${batch} counts in [1, ${seq}]`);
    const bytes = fs.readFileSync(idsFile);
    if (bytes.length !== batch * seq * 8) die(`${idsFile}: ${bytes.length} bytes, expected ${batch * seq * 8}`);
    // Copy into a fresh ArrayBuffer: a Buffer's offset need not be 8-aligned.
    const ids = new BigInt64Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
    let d;
    if (kv) {
      d = await runWithCache(session, ids, batch, seq, prompt, pads);
    } else if (pooled) {
      d = await runPooled(session, ids, batch, seq, lengths);
    } else {
      const out = await session.run({input_ids: new ort.Tensor('int64', ids, [batch, seq])});
      const logits = out.logits;
      if (logits.type !== 'float32') die(`logits type ${logits.type}`);
      if (logits.dims.length !== 3 || logits.dims[0] !== batch || logits.dims[1] !== seq)
        die(`logits dims ${JSON.stringify(logits.dims)} for input (${batch}, ${seq})`);
      d = logits.data;
    }
    fs.writeFileSync(outFile, Buffer.from(d.buffer, d.byteOffset, d.byteLength));
    console.log(JSON.stringify(pooled ? {batch, seq, lengths}
                                          : {batch, seq, prompt, pads, calls: kv ? 1 + seq - prompt : 1}));
  }
}

main().catch((e) => die(e && e.stack ? e.stack : String(e)));
