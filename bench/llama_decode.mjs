// Greedy decoding of a `brisk export gguf` file in llama.cpp (npm
// node-llama-cpp, prebuilt CPU binaries), as a peer for `brisk generate`:
//
//   node bench/llama_decode.mjs NODE_MODULES MODEL.gguf PROMPT_IDS NEW [--threads 2]
//
// PROMPT_IDS is a comma-separated list of token ids. The prompt is evaluated
// in one batch, then NEW tokens are drawn greedily one at a time (llama.cpp's
// KV cache, default context options but a context twice the model's, so no
// context shift happens). A warm-up run goes first, in the same context
// after clearing it. Prints the drawn ids and one JSON line: prompt and
// decode times and decode tokens/s (the first drawn token comes with the
// prompt and is not counted as decoding, as `brisk generate` counts it).
import path from 'node:path';
import {pathToFileURL} from 'node:url';

function die(msg) {
  console.error(`llama_decode: ${msg}`);
  process.exit(1);
}

const argv = process.argv.slice(2);
let threads = 2;
const t = argv.indexOf('--threads');
if (t >= 0) {
  threads = Number(argv[t + 1]);
  argv.splice(t, 2);
}
const [modules, model, promptArg, newArg] = argv;
if (!modules || !model || !promptArg || !newArg)
  die('usage: llama_decode.mjs NODE_MODULES MODEL.gguf PROMPT_IDS NEW [--threads N]');
const {getLlama, LlamaLogLevel} = await import(
    pathToFileURL(path.resolve(modules, 'node-llama-cpp', 'dist', 'index.js')).href);
const prompt = promptArg.split(',').map(Number);
const steps = Number(newArg);
const now = () => Number(process.hrtime.bigint()) / 1e6;

const llama = await getLlama({gpu: false, build: 'never', logLevel: LlamaLogLevel.error});
const m = await llama.loadModel({modelPath: model});
const ctx = await m.createContext({contextSize: 2 * m.trainContextSize, batchSize: prompt.length, threads});
const seq = ctx.getSequence();

async function decode() {
  await seq.clearHistory();
  const out = [];
  const t0 = now();
  let tFirst = 0;
  for await (const token of seq.evaluate(prompt, {temperature: 0, yieldEogToken: true})) {
    out.push(token);
    if (out.length === 1) tFirst = now();
    if (out.length === steps) break;
  }
  return {out, promptMs: tFirst - t0, decodeMs: now() - tFirst};
}

await decode();  // warm-up
const r = await decode();
console.log(`ids ${r.out.join(',')}`);
console.log(JSON.stringify({engine: 'llama.cpp (node-llama-cpp)', model: path.basename(model), threads,
                            prompt_tokens: prompt.length, new_tokens: r.out.length, prompt_ms: r.promptMs,
                            decode_ms: r.decodeMs, decode_tokens_per_s: (r.out.length - 1) / (r.decodeMs / 1e3)}));
await ctx.dispose();
await m.dispose();
