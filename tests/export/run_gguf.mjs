// Runs a model written by `brisk export gguf` in llama.cpp (npm
// node-llama-cpp with its prebuilt CPU binaries, no GPU), as a user of
// llama.cpp would load it, and writes the next-token distribution after
// every position of a token sequence:
//
//   node run_gguf.mjs NODE_MODULES MODEL IDS_FILE OUT_FILE
//
// IDS_FILE holds T little-endian int32 token ids, evaluated in one batch;
// OUT_FILE receives T x V little-endian float32 probabilities (llama.cpp's
// softmax of the logits at each position, no sampling options). Prints one
// JSON line: the vocabulary and context llama.cpp read from the file and
// how the text "And God said" tokenizes. Exit 3 when node-llama-cpp cannot
// be loaded, 1 on any other failure, with the reason on stderr.
import fs from 'node:fs';
import path from 'node:path';
import {pathToFileURL} from 'node:url';

function die(msg, code = 1) {
  console.error(`run_gguf: ${msg}`);
  process.exit(code);
}

const [modules, model, idsFile, outFile] = process.argv.slice(2);
if (!modules || !model || !idsFile || !outFile) die('usage: run_gguf.mjs NODE_MODULES MODEL IDS_FILE OUT_FILE', 2);

let lib;
try {
  lib = await import(pathToFileURL(path.resolve(modules, 'node-llama-cpp', 'dist', 'index.js')).href);
} catch (e) {
  die(`cannot load node-llama-cpp from ${modules} (${e.message}); install it with \`bash scripts/fetch_data.sh\``, 3);
}
const {getLlama, LlamaLogLevel} = lib;

try {
  // Prebuilt binaries only (build: "never"): nothing is compiled or downloaded.
  const llama = await getLlama({gpu: false, build: 'never', logLevel: LlamaLogLevel.error});
  const m = await llama.loadModel({modelPath: model});
  const bytes = fs.readFileSync(idsFile);
  const ids = Array.from(new Int32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length)));
  // A context with room past the sequence: one exactly full makes
  // node-llama-cpp shift it (drop the oldest tokens) before the last
  // position's distribution. Positions stay below the model's own context.
  const ctx = await m.createContext({contextSize: 2 * m.trainContextSize, batchSize: ids.length, threads: 1});
  const out = await ctx.getSequence().controlledEvaluate(ids.map((t) => [t, {generateNext: {probabilities: true}}]));
  const vocab = m.fileInfo.metadata.tokenizer.ggml.tokens.length;
  const probs = new Float32Array(ids.length * vocab);
  out.forEach((o, i) => {
    if (!o || !o.next || !o.next.probabilities) die(`no probabilities after position ${i}`);
    for (const [token, p] of o.next.probabilities) probs[i * vocab + token] = p;
  });
  fs.writeFileSync(outFile, Buffer.from(probs.buffer));
  console.log(JSON.stringify({architecture: m.fileInfo.metadata.general.architecture, vocab,
                              context: m.trainContextSize, tensors: m.fileInfo.tensorInfo.length, tokens: ids.length,
                              tokenized: m.tokenize('And God said')}));
  await ctx.dispose();
  await m.dispose();
} catch (e) {
  die(e && e.stack ? e.stack : String(e));
}
