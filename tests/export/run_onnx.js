// Runs a model written by `brisk export onnx` in ONNX Runtime (npm
// onnxruntime-node, CPU execution provider), once per (batch, seq) case, in
// one session, so the symbolic axes are exercised with several shapes:
//
//   node run_onnx.js NODE_MODULES MODEL  B T IDS_FILE OUT_FILE  [B T IDS_FILE OUT_FILE ...]
//
// IDS_FILE holds B*T little-endian int64 token ids; OUT_FILE receives the
// logits as little-endian float32, (B, T, V) row-major. One JSON line per case
// on stdout. Exit 3 when onnxruntime-node cannot be loaded, 1 on any other
// failure, with the reason on stderr.
'use strict';

const fs = require('fs');
const path = require('path');

function die(msg, code = 1) {
  console.error(`run_onnx: ${msg}`);
  process.exit(code);
}

const [modules, model, ...rest] = process.argv.slice(2);
if (!modules || !model || rest.length === 0 || rest.length % 4 !== 0)
  die('usage: run_onnx.js NODE_MODULES MODEL B T IDS_FILE OUT_FILE [B T IDS_FILE OUT_FILE ...]', 2);

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

async function main() {
  // One thread: the tests share a small machine, and the model is tiny.
  const session = await ort.InferenceSession.create(model, {executionProviders: ['cpu'], intraOpNumThreads: 1});
  if (!sameList(session.inputNames, ['input_ids'])) die(`inputs ${JSON.stringify(session.inputNames)}`);
  if (!sameList(session.outputNames, ['logits'])) die(`outputs ${JSON.stringify(session.outputNames)}`);
  for (let i = 0; i < rest.length; i += 4) {
    const batch = Number(rest[i]), seq = Number(rest[i + 1]);
    const bytes = fs.readFileSync(rest[i + 2]);
    if (bytes.length !== batch * seq * 8) die(`${rest[i + 2]}: ${bytes.length} bytes, expected ${batch * seq * 8}`);
    // Copy into a fresh ArrayBuffer: a Buffer's offset need not be 8-aligned.
    const ids = new BigInt64Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
    const out = await session.run({input_ids: new ort.Tensor('int64', ids, [batch, seq])});
    const logits = out.logits;
    if (logits.type !== 'float32') die(`logits type ${logits.type}`);
    if (logits.dims.length !== 3 || logits.dims[0] !== batch || logits.dims[1] !== seq)
      die(`logits dims ${JSON.stringify(logits.dims)} for input (${batch}, ${seq})`);
    const d = logits.data;
    fs.writeFileSync(rest[i + 3], Buffer.from(d.buffer, d.byteOffset, d.byteLength));
    console.log(JSON.stringify({batch, seq, dims: logits.dims}));
  }
}

main().catch((e) => die(e && e.stack ? e.stack : String(e)));
