// Classifies messages with an encoder classifier that `brisk export onnx`
// wrote, in ONNX Runtime (npm onnxruntime-node), with no brisk at run time:
//
//   node deploy/onnx_classify.js MODEL.onnx [FILE|DIR...] [--files-from LIST] [--node-modules DIR] [--threads N]
//
// It prepares each message as `brisk classify` does, from what the export
// put in the model's metadata: the body only when the classifier was trained
// on bodies (`strip_headers`: everything after the first empty line, `\n`
// or `\r\n`), tokens from the checkpoint's tokenizer (`bytes`: the file's
// bytes as they are; `gpt2`: npm gpt-3-encoder, whose ids brisk's GPT-2 tokenizer
// matches, on the text read as UTF-8 with ill-formed bytes as U+FFFD, as
// brisk reads it), the first `max_len` tokens. A directory stands for every
// regular file under it (links to files included), in path order. Messages of similar lengths go
// through the model together, 64 at a time, right-padded with attention_mask
// 0 on the padding. One line per message, as brisk classify prints it: the
// label, its probability (softmax of the logits), the path.
//
// --files-from LIST reads more paths, one per line ("-": stdin), after the
// ones given as arguments. Use it for long lists: onnxruntime-node 1.30
// crashes (SIGSEGV) creating a session in a process with a few hundred long
// command-line arguments (250 of 119 characters did; 200 did not).
//
// Modules come from --node-modules, else third_party/npm/node_modules of
// this checkout (scripts/fetch_data.sh installs both packages there). Exit
// 2 on what the caller can fix (usage, a model that cannot be read or is no
// classifier's export, missing packages, a message file that cannot be read,
// is empty or has no body), 1 on anything else; the reason goes to stderr.
'use strict';

const fs = require('fs');
const path = require('path');

const kBatch = 64;  // rows per ONNX Runtime call, as brisk classify batches

function die(msg, code = 1) {
  console.error(`onnx_classify: ${msg}`);
  process.exit(code);
}

function parseArgs(argv) {
  const a = {model: null, inputs: [], modules: path.join(__dirname, '..', 'third_party', 'npm', 'node_modules'),
             threads: 0};
  const lists = [];
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === '--node-modules') a.modules = argv[++i];
    else if (argv[i] === '--files-from') lists.push(argv[++i]);
    else if (argv[i] === '--threads') a.threads = Number(argv[++i]);
    else if (argv[i].startsWith('--')) die(`unknown option ${argv[i]}`, 2);
    else if (!a.model) a.model = argv[i];
    else a.inputs.push(argv[i]);
  }
  for (const list of lists) {
    if (!list) break;  // reported below
    let text;
    try {
      text = fs.readFileSync(list === '-' ? 0 : list, 'utf8');
    } catch (e) {
      die(`--files-from ${list}: cannot read (${e.message})`, 2);
    }
    a.inputs.push(...text.split('\n').map((line) => line.replace(/\r$/, '')).filter((line) => line !== ''));
  }
  if (!a.model || a.inputs.length === 0 || !a.modules || lists.some((l) => !l) ||
      !(Number.isInteger(a.threads) && a.threads >= 0))
    die('usage: onnx_classify.js MODEL.onnx [FILE|DIR...] [--files-from LIST] [--node-modules DIR] [--threads N]', 2);
  return a;
}

// The model's metadata_props, read from the file's top-level protobuf fields
// (ONNX Runtime's JavaScript API does not expose them): ModelProto field 14
// holds StringStringEntryProto {1: key, 2: value}; every other field is
// skipped by its wire type, the graph (field 7) by its length.
function onnxMetadata(file) {
  const buf = fs.readFileSync(file);
  let pos = 0;
  const varint = (b, end) => {
    let v = 0n, shift = 0n;
    for (;;) {
      if (pos >= end) throw new Error(`${file}: cut short inside a varint`);
      const byte = b[pos++];
      v |= BigInt(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
      shift += 7n;
    }
  };
  // The fields of b[start, end): calls visit(field, wire, value) with a
  // length-delimited value as a Buffer, a varint as a BigInt.
  const fields = (b, start, end, visit) => {
    pos = start;
    while (pos < end) {
      const tag = varint(b, end);
      const field = Number(tag >> 3n), wire = Number(tag & 7n);
      if (wire === 0) visit(field, wire, varint(b, end));
      else if (wire === 1) pos += 8;
      else if (wire === 5) pos += 4;
      else if (wire === 2) {
        const n = Number(varint(b, end));
        if (pos + n > end) throw new Error(`${file}: a field of ${n} bytes runs past the end`);
        const value = b.subarray(pos, pos + n);
        pos += n;
        visit(field, wire, value);
      } else {
        throw new Error(`${file}: wire type ${wire} at byte ${pos}: not an ONNX model`);
      }
    }
  };
  const entries = [];
  fields(buf, 0, buf.length, (field, wire, value) => { if (field === 14 && wire === 2) entries.push(value); });
  const meta = {};
  for (const e of entries) {
    let key = '', val = '';
    fields(e, 0, e.length, (field, wire, v) => {
      if (wire !== 2) return;
      if (field === 1) key = v.toString('utf8');
      if (field === 2) val = v.toString('utf8');
    });
    meta[key] = val;
  }
  return meta;
}

// Files of `inputs` in brisk classify's order: a directory's regular files,
// recursively (a link to a file counts; links to directories are not
// followed), sorted by path component, each path spelled as brisk spells it
// (the directory as given, then the names).
function messageFiles(inputs) {
  const byComponents = (x, y) => {
    const a = x.split(path.sep), b = y.split(path.sep);
    for (let i = 0; i < Math.min(a.length, b.length); ++i)
      if (a[i] !== b[i]) return Buffer.compare(Buffer.from(a[i]), Buffer.from(b[i]));
    return a.length - b.length;
  };
  const walk = (dir, out) => {
    for (const e of fs.readdirSync(dir, {withFileTypes: true})) {
      const p = dir.endsWith(path.sep) ? dir + e.name : dir + path.sep + e.name;
      if (e.isDirectory()) walk(p, out);
      else if (e.isFile() || (e.isSymbolicLink() && isFile(p))) out.push(p);
    }
    return out;
  };
  const files = [];
  for (const input of inputs) {
    let st;
    try {
      st = fs.statSync(input);
    } catch (e) {
      die(`${input}: ${e.code === 'ENOENT' ? 'no such file or directory' : e.message}`, 2);
    }
    if (st.isDirectory()) {
      const found = walk(input, []).sort(byComponents);
      if (found.length === 0) die(`${input}: the directory holds no files to classify`, 2);
      files.push(...found);
    } else if (st.isFile()) {
      files.push(input);
    } else {
      die(`${input}: not a regular file or a directory`, 2);
    }
  }
  return files;
}

function isFile(p) {
  try {
    return fs.statSync(p).isFile();
  } catch (e) {
    return false;  // a dangling link
  }
}

// data::email_body: everything after the first empty line; a message that
// starts with an empty line has no headers.
function emailBody(bytes) {
  if (bytes[0] === 0x0d && bytes[1] === 0x0a) return bytes.subarray(2);
  if (bytes[0] === 0x0a) return bytes.subarray(1);
  for (let i = 0; i < bytes.length; ++i) {
    if (bytes[i] !== 0x0a) continue;
    let j = i + 1;
    if (j < bytes.length && bytes[j] === 0x0d) ++j;
    if (j < bytes.length && bytes[j] === 0x0a) return bytes.subarray(j + 1);
  }
  return bytes.subarray(0, 0);
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  let ort;
  try {
    ort = require(path.join(args.modules, 'onnxruntime-node'));
  } catch (e) {
    die(`cannot load onnxruntime-node from ${args.modules} (${e.message}); run scripts/fetch_data.sh or pass ` +
        '--node-modules', 2);
  }
  let meta;
  try {
    meta = onnxMetadata(args.model);
  } catch (e) {
    die(`${args.model}: cannot read the model (${e.message})`, 2);
  }
  if (meta.kind !== 'encoder-classifier')
    die(`${args.model}: not an encoder classifier's export (metadata kind ${JSON.stringify(meta.kind)})`, 2);
  let labels;
  try {
    labels = JSON.parse(meta.label_names);
  } catch (e) {
    labels = null;
  }
  const maxLen = Number(meta.max_len), stripHeaders = meta.strip_headers === 'true';
  if (!Array.isArray(labels) || labels.length !== Number(meta.n_classes) || labels.length < 2 ||
      !labels.every((l) => typeof l === 'string') || !(Number.isInteger(maxLen) && maxLen >= 1) ||
      !['true', 'false'].includes(meta.strip_headers))
    die(`${args.model}: damaged metadata (label_names ${JSON.stringify(meta.label_names)}, n_classes ` +
        `${JSON.stringify(meta.n_classes)}, max_len ${JSON.stringify(meta.max_len)}, strip_headers ` +
        `${JSON.stringify(meta.strip_headers)})`, 2);
  let encode;
  if (meta.tokenizer === 'bytes') {
    encode = (bytes) => Array.from(bytes);
  } else if (meta.tokenizer === 'gpt2') {
    const gpt2 = require(path.join(args.modules, 'gpt-3-encoder'));
    encode = (bytes) => gpt2.encode(bytes.toString('utf8'));
  } else {
    die(`${args.model}: the classifier reads '${meta.tokenizer}' tokens; this script reads text messages ` +
        '(bytes or gpt2 tokenizers)', 2);
  }

  const options = {executionProviders: ['cpu']};
  if (args.threads > 0) options.intraOpNumThreads = args.threads;
  let session;
  try {
    session = await ort.InferenceSession.create(args.model, options);
  } catch (e) {
    die(`${args.model}: ONNX Runtime cannot load it (${e.message})`, 2);
  }
  const files = messageFiles(args.inputs);
  const tokens = files.map((f) => {
    let bytes;
    try {
      bytes = fs.readFileSync(f);
    } catch (e) {
      die(`${f}: cannot read (${e.message})`, 2);
    }
    if (bytes.length === 0) die(`${f}: empty message, nothing to classify`, 2);
    const input = stripHeaders ? emailBody(bytes) : bytes;
    if (input.length === 0) die(`${f}: the message has no body (the classifier reads bodies only)`, 2);
    return encode(input).slice(0, maxLen);
  });

  const order = files.map((_, i) => i).sort((a, b) => tokens[a].length - tokens[b].length || a - b);
  const probs = new Array(files.length);
  for (let b0 = 0; b0 < order.length; b0 += kBatch) {
    const rows = order.slice(b0, b0 + kBatch);
    const T = Math.max(...rows.map((i) => tokens[i].length));
    const ids = new BigInt64Array(rows.length * T), mask = new BigInt64Array(rows.length * T);
    rows.forEach((i, r) => tokens[i].forEach((t, j) => {
      ids[r * T + j] = BigInt(t);
      mask[r * T + j] = 1n;
    }));
    const out = await session.run({input_ids: new ort.Tensor('int64', ids, [rows.length, T]),
                                   attention_mask: new ort.Tensor('int64', mask, [rows.length, T])});
    const K = labels.length;
    if (!out.logits || out.logits.dims.length !== 2 || out.logits.dims[1] !== K)
      die(`${args.model}: logits ${JSON.stringify(out.logits && out.logits.dims)}, expected [${rows.length}, ${K}]`);
    const z = out.logits.data;
    rows.forEach((i, r) => {
      const row = Array.from(z.subarray(r * K, (r + 1) * K));
      const mx = Math.max(...row);
      const e = row.map((v) => Math.exp(v - mx));
      const sum = e.reduce((s, v) => s + v, 0);
      probs[i] = e.map((v) => v / sum);
    });
  }
  files.forEach((f, i) => {
    const p = probs[i];
    const k = p.indexOf(Math.max(...p));
    process.stdout.write(`${labels[k]}\t${p[k].toFixed(4)}\t${f}\n`);
  });
}

main().catch((e) => die(e && e.stack ? e.stack : String(e)));
