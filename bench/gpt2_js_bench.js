// The peer for brisk's GPT-2 tokenizer benchmark (bench_data.cpp): times the
// npm package gpt-3-encoder's own JavaScript encoder on a text file. Its
// pre-tokenizer regex is slow (quadratic) on one long string, so the text is
// fed line by line (each line keeps its '\n'), which is how it is usually
// called; only encode() is timed, not node's start-up or reading the file.
// The first pass fills the encoder's word cache; later passes run warm, like
// brisk's measured repeats. Prints one JSON object.
// Usage: node gpt2_js_bench.js <gpt-3-encoder dir> <file> [passes] [max_bytes]
'use strict';
const fs = require('fs');
const path = require('path');

const [dir, file, passesArg, maxArg] = process.argv.slice(2);
if (!dir || !file) {
  process.stderr.write('usage: node gpt2_js_bench.js <gpt-3-encoder dir> <file> [passes] [max_bytes]\n');
  process.exit(2);
}
const { encode } = require(path.resolve(dir, 'index.js'));
let buf = fs.readFileSync(file);
const max = maxArg ? Number(maxArg) : 0;
if (max > 0 && buf.length > max) {
  let cut = buf.lastIndexOf(10, max);  // whole lines only
  buf = buf.subarray(0, cut < 0 ? max : cut + 1);
}
const text = buf.toString('utf8');
const parts = text.split('\n');
const lines = parts.map((l, i) => (i + 1 < parts.length ? l + '\n' : l)).filter((l) => l.length > 0);
const passes = Math.max(1, Number(passesArg || 2));
const seconds = [];
let tokens = 0;
for (let p = 0; p < passes; ++p) {
  let n = 0;
  const t0 = process.hrtime.bigint();
  for (const l of lines) n += encode(l).length;
  seconds.push(Number(process.hrtime.bigint() - t0) / 1e9);
  tokens = n;
}
process.stdout.write(JSON.stringify({ bytes: buf.length, lines: lines.length, tokens, seconds, node: process.version }) + '\n');
