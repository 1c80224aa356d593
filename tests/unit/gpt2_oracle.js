// The reference for brisk's GPT-2 tokenizer: encodes each file named on the
// command line with the npm package gpt-3-encoder's own JavaScript encoder
// and prints its ids as one JSON array per line, in argument order. Files are
// read as 'utf8', so invalid byte sequences reach the encoder as U+FFFD.
// Usage: node gpt2_oracle.js <dir of gpt-3-encoder> <file>...
'use strict';
const fs = require('fs');
const path = require('path');

const [dir, ...files] = process.argv.slice(2);
if (!dir) {
  process.stderr.write('usage: node gpt2_oracle.js <gpt-3-encoder dir> <file>...\n');
  process.exit(2);
}
const { encode } = require(path.resolve(dir, 'index.js'));
const out = [];
for (const f of files) out.push(JSON.stringify(encode(fs.readFileSync(f, 'utf8'))));
process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
