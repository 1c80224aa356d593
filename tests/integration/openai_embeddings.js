// `brisk serve` of a sequence autoencoder through the official OpenAI client
// for Node.js (npm `openai`): embeddings.create as a user's code calls it.
// The client asks for base64 unless told otherwise and decodes it to
// floats, so this reads both encodings. Run by serve_integration_test.cpp:
//
//   node openai_embeddings.js NODE_MODULES BASE_URL MODEL INPUTS_JSON OUT_FILE
//
// Writes {"base64": [[...], ...], "float": [[...], ...], "usage": {...}} to
// OUT_FILE; exits 1 with the reason when a call fails or a shape is wrong.
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const [modules, baseURL, model, inputsJson, outFile] = process.argv.slice(2);
const { OpenAI } = require(path.join(modules, 'openai'));
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

async function main() {
  const input = JSON.parse(inputsJson);
  const byDefault = await client.embeddings.create({ model, input });
  const asFloats = await client.embeddings.create({ model, input, encoding_format: 'float' });
  for (const r of [byDefault, asFloats]) {
    assert.equal(r.object, 'list');
    assert.equal(r.model, model);
    assert.equal(r.data.length, input.length);
    r.data.forEach((d, i) => {
      assert.equal(d.object, 'embedding');
      assert.equal(d.index, i);
      assert.ok(Array.isArray(d.embedding) && d.embedding.every((x) => typeof x === 'number'), JSON.stringify(d));
    });
  }
  fs.writeFileSync(outFile, JSON.stringify({
    base64: byDefault.data.map((d) => d.embedding),
    float: asFloats.data.map((d) => d.embedding),
    usage: asFloats.usage,
  }));
}

main().catch((e) => {
  console.error(`openai_embeddings: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
