// Greedy decoding of a `brisk export onnx --kv-cache` model in ONNX Runtime
// (npm onnxruntime-node, CPU), as a peer for `brisk generate`:
//
//   node bench/onnx_decode.js NODE_MODULES MODEL_KV PROMPT_IDS NEW [--threads N] [--full MODEL]
//
// PROMPT_IDS is a comma-separated list of token ids. The prompt goes in one
// call with an empty past, then each drawn token alone on the returned keys
// and values. With --full MODEL (the plain export of the same checkpoint)
// the same tokens are also decoded by re-running the whole sequence every
// step, the only way without a cache, and the two must draw the same ids.
// Prints the ids and one JSON line: prompt and decode times, decode tokens/s.
'use strict';

const path = require('path');

function die(msg) {
  console.error(`onnx_decode: ${msg}`);
  process.exit(1);
}

const argv = process.argv.slice(2);
const flag = (name, fallback) => {
  const i = argv.indexOf(name);
  if (i < 0) return fallback;
  if (i + 1 >= argv.length) die(`${name} needs a value`);
  const v = argv[i + 1];
  argv.splice(i, 2);
  return v;
};
const threads = Number(flag('--threads', '2'));
const fullModel = flag('--full', null);
const [modules, model, promptArg, newArg] = argv;
if (!modules || !model || !promptArg || !newArg)
  die('usage: onnx_decode.js NODE_MODULES MODEL_KV PROMPT_IDS NEW [--threads N] [--full MODEL]');
const ort = require(path.resolve(modules, 'onnxruntime-node'));
const prompt = promptArg.split(',').map((s) => BigInt(s));
const steps = Number(newArg);

function argmaxLast(logits) {
  const [, seq, vocab] = logits.dims;
  const row = logits.data.subarray((seq - 1) * vocab, seq * vocab);
  let best = 0;
  for (let i = 1; i < vocab; ++i) if (row[i] > row[best]) best = i;
  return BigInt(best);
}

const ids = (list) => new ort.Tensor('int64', BigInt64Array.from(list), [1, list.length]);
const now = () => Number(process.hrtime.bigint()) / 1e6;

async function decodeCached(session) {
  const pastNames = session.inputNames.filter((n) => n.startsWith('past_key_values.'));
  if (pastNames.length === 0) die(`${model} has no past_key_values inputs: export it with --kv-cache`);
  // An empty past, (1, H, 0, D), H and D from the input's declared shape.
  const [, heads, , headDim] = session.inputMetadata.find((m) => m.name === pastNames[0]).shape;
  let past = Object.fromEntries(pastNames.map((n) =>
      [n, new ort.Tensor('float32', new Float32Array(0), [1, heads, 0, headDim])]));
  const out = [];
  let input = prompt, promptMs = 0, seen = 0;
  const t0 = now();
  for (let s = 0; s < steps; ++s) {
    const positions = input.map((_, i) => BigInt(seen + i));
    seen += input.length;
    const mask = new ort.Tensor('int64', new BigInt64Array(seen).fill(1n), [1, seen]);
    const r = await session.run({input_ids: ids(input), attention_mask: mask, position_ids: ids(positions), ...past});
    const next = argmaxLast(r.logits);
    out.push(next);
    past = Object.fromEntries(pastNames.map((n) => [n, r[n.replace('past_key_values.', 'present.')]]));
    input = [next];
    if (s === 0) promptMs = now() - t0;
  }
  return {out, promptMs, decodeMs: now() - t0 - promptMs};
}

async function decodeFull(session) {
  const seq = [...prompt], out = [];
  let promptMs = 0;
  const t0 = now();
  for (let s = 0; s < steps; ++s) {
    const r = await session.run({input_ids: ids(seq)});
    const next = argmaxLast(r.logits);
    out.push(next);
    seq.push(next);
    if (s === 0) promptMs = now() - t0;
  }
  return {out, promptMs, decodeMs: now() - t0 - promptMs};
}

async function main() {
  const options = {executionProviders: ['cpu'], intraOpNumThreads: threads, interOpNumThreads: 1};
  const session = await ort.InferenceSession.create(model, options);
  await decodeCached(session);  // warm-up
  const cached = await decodeCached(session);
  const result = {engine: 'onnxruntime-node', ort_version: ort.env.versions.common,
                  threads, prompt_tokens: prompt.length, new_tokens: steps,
                  cached: {prompt_ms: cached.promptMs, decode_ms: cached.decodeMs,
                           decode_tokens_per_s: (steps - 1) / (cached.decodeMs / 1e3)}};
  if (fullModel) {
    const full = await ort.InferenceSession.create(fullModel, options);
    await decodeFull(full);
    const f = await decodeFull(full);
    result.full = {prompt_ms: f.promptMs, decode_ms: f.decodeMs, decode_tokens_per_s: (steps - 1) / (f.decodeMs / 1e3)};
    result.same_ids = f.out.every((x, i) => x === cached.out[i]);
    if (!result.same_ids) die(`cached and full decoding drew different ids:\n${cached.out}\n${f.out}`);
  }
  console.log(`ids ${cached.out.join(',')}`);
  console.log(JSON.stringify(result));
}

main().catch((e) => die(e && e.stack ? e.stack : String(e)));
