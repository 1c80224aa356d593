#!/usr/bin/env python3
"""Checks a model written by `brisk export onnx` with ONNX's own tools.

    check_onnx.py MODEL --vocab V --embd C --layers L --block N [--kv-cache --heads H]
    check_onnx.py MODEL --classifier --vocab V --embd C --layers L --max-len N --classes K
    check_onnx.py MODEL --autoencoder --vocab V --embd C --layers L --max-len N --latent Z

onnx.checker.check_model(full_check=True) (the IR and every node against
its opset-17 schema, then strict shape and type inference), then what
docs/export.md promises about the interface: opset 17 of the default domain
only, one input `input_ids` int64 (batch, seq) and one output `logits`
float32 (batch, seq, V) with symbolic batch and seq, the weights as float32
initializers under their model.safetensors names. With --kv-cache also the
inputs attention_mask int64 (batch, total), position_ids int64 (batch, seq)
and past_key_values.<l>.key/.value, and the outputs present.<l>.key/.value,
float32 (batch, H, length, C / H): the same batch symbol throughout, one
length symbol for every past, another (total) for every present and the mask. With --classifier
(an encoder classifier's export): inputs input_ids and attention_mask, int64 (batch, seq) with the
same two symbols, output logits float32 (batch, K), the head's initializers head.weight (K, C) and
head.bias (K), wpe of max_len rows, and metadata_props kind "encoder-classifier", n_classes K and
label_names a JSON array of K strings, strip_headers, tokenizer and step. With --autoencoder (a sequence autoencoder's encoder): the
same inputs, output latent float32 (batch, Z), every body initializer under "enc.", the
to_latent Linear's, and metadata_props kind "seq-autoencoder", part "encoder", latent Z. Exits 1 with the reason on any failure, including a missing
python3-onnx.
"""
import json
import argparse
import sys


def fail(msg):
    print(f"check_onnx: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


try:
    import onnx
    from onnx import TensorProto, shape_inference
except ImportError as e:
    fail(f"cannot import onnx ({e}): install Debian's python3-onnx "
         "(apt-get install python3-onnx; scripts/install_deps.sh lists it) and run this with /usr/bin/python3")


def dims(value_info):
    out = []
    for d in value_info.type.tensor_type.shape.dim:
        out.append(d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None)
    return out


def check_weights(inits, a, positions, extra, prefix=""):
    """The float32 initializers of the embeddings, every block and ln_f, each name after `prefix`
    (plus `extra`: name -> shape) under their model.safetensors names and shapes; returns the
    weight count."""
    expect = {prefix + "wte.weight": [a.vocab, a.embd], prefix + "wpe.weight": [positions, a.embd],
              prefix + "ln_f.weight": [a.embd], prefix + "ln_f.bias": [a.embd], **extra}
    for layer in range(a.layers):
        p = f"{prefix}h.{layer}."
        expect.update({p + "ln_1.weight": [a.embd], p + "ln_1.bias": [a.embd],
                       p + "attn.c_attn.weight": [a.embd, 3 * a.embd], p + "attn.c_attn.bias": [3 * a.embd],
                       p + "attn.c_proj.weight": [a.embd, a.embd], p + "attn.c_proj.bias": [a.embd],
                       p + "ln_2.weight": [a.embd], p + "ln_2.bias": [a.embd],
                       p + "mlp.c_fc.weight": [a.embd, 4 * a.embd], p + "mlp.c_fc.bias": [4 * a.embd],
                       p + "mlp.c_proj.weight": [4 * a.embd, a.embd], p + "mlp.c_proj.bias": [a.embd]})
    extra_inits = sorted(n for n in inits if n not in expect and not n.startswith("const."))
    if extra_inits:
        fail(f"initializers the model does not have: {extra_inits[:5]}")
    for name, shape in expect.items():
        t = inits.get(name)
        if t is None:
            fail(f"initializer {name} missing")
        if list(t.dims) != shape or t.data_type != TensorProto.FLOAT:
            fail(f"initializer {name} is {list(t.dims)} type {t.data_type}, expected {shape} float32")
        n = 1
        for d in shape:
            n *= d
        if len(t.raw_data) != 4 * n:
            fail(f"initializer {name} holds {len(t.raw_data)} raw bytes, expected {4 * n}")
    return sum(len(inits[k].raw_data) // 4 for k in expect)


def check_pooled(model, a, ops):
    """An encoder classifier's export (--classifier) or a sequence autoencoder's encoder
    (--autoencoder): input_ids and attention_mask in, one (batch, width) output."""
    output, width = ("logits", a.classes) if a.classifier else ("latent", a.latent)
    g = model.graph
    if [i.name for i in g.input] != ["input_ids", "attention_mask"]:
        fail(f"graph inputs {[i.name for i in g.input]}, expected ['input_ids', 'attention_mask']")
    if [o.name for o in g.output] != [output]:
        fail(f"graph outputs {[o.name for o in g.output]}, expected ['{output}']")
    ids, mask, out = g.input[0], g.input[1], g.output[0]
    for v in (ids, mask):
        if v.type.tensor_type.elem_type != TensorProto.INT64:
            fail(f"{v.name} is not int64")
    di, dm, do = dims(ids), dims(mask), dims(out)
    if len(di) != 2 or not all(isinstance(d, str) and d for d in di) or di[0] == di[1]:
        fail(f"input_ids dims {di}, expected two distinct symbolic ones")
    if dm != di:
        fail(f"attention_mask dims {dm}, expected those of input_ids {di}")
    if out.type.tensor_type.elem_type != TensorProto.FLOAT:
        fail(f"{output} is not float32")
    if do != [di[0], width]:
        fail(f"{output} dims {do}, expected [{di[0]}, {width}]")
    props = {p.key: p.value for p in model.metadata_props}
    if not props.get("tokenizer") or not props.get("step", "").isdigit():
        fail(f"metadata tokenizer {props.get('tokenizer')!r}, step {props.get('step')!r}: expected both")
    if props.get("max_len") != str(a.max_len):
        fail(f"metadata max_len {props.get('max_len')!r}, expected '{a.max_len}'")
    inits = {t.name: t for t in g.initializer}
    if a.autoencoder:
        want = {"kind": "seq-autoencoder", "part": "encoder", "latent": str(a.latent)}
        got = {k: props.get(k) for k in want}
        if got != want:
            fail(f"metadata {got}, expected {want}")
        n_params = check_weights(inits, a, a.max_len, {"to_latent.weight": [a.latent, a.embd],
                                                        "to_latent.bias": [a.latent]}, prefix="enc.")
        about = f"latent {do}"
    else:
        if props.get("kind") != "encoder-classifier" or props.get("n_classes") != str(a.classes) or \
                props.get("strip_headers") not in ("true", "false"):
            fail(f"metadata kind {props.get('kind')!r}, n_classes {props.get('n_classes')!r}, "
                 f"strip_headers {props.get('strip_headers')!r}")
        try:
            labels = json.loads(props.get("label_names", ""))
        except ValueError:
            fail(f"metadata label_names {props.get('label_names')!r} is not JSON")
        if not isinstance(labels, list) or len(labels) != a.classes or not all(isinstance(x, str) for x in labels):
            fail(f"metadata label_names {labels!r}, expected {a.classes} strings")
        n_params = check_weights(inits, a, a.max_len, {"head.weight": [a.classes, a.embd],
                                                        "head.bias": [a.classes]})
        about = f"logits {do}, labels {labels}"
    print(f"check_onnx: OK {a.model}: ir_version {model.ir_version}, opset 17, {len(g.node)} nodes, "
          f"{len(inits)} initializers ({n_params} weights), input_ids and attention_mask {di}, {about}; "
          f"ops: {', '.join(ops)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--embd", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--block", type=int)
    ap.add_argument("--kv-cache", action="store_true")
    ap.add_argument("--heads", type=int)
    ap.add_argument("--classifier", action="store_true")
    ap.add_argument("--max-len", type=int)
    ap.add_argument("--classes", type=int)
    ap.add_argument("--autoencoder", action="store_true")
    ap.add_argument("--latent", type=int)
    a = ap.parse_args()
    if a.kv_cache and not a.heads:
        ap.error("--kv-cache needs --heads")
    if a.classifier and (a.kv_cache or not a.max_len or not a.classes):
        ap.error("--classifier needs --max-len and --classes, and takes no --kv-cache")
    if a.autoencoder and (a.kv_cache or a.classifier or not a.max_len or not a.latent):
        ap.error("--autoencoder needs --max-len and --latent, and takes neither --kv-cache nor --classifier")
    if not a.classifier and not a.autoencoder and not a.block:
        ap.error("a GPT needs --block")

    model = onnx.load(a.model)
    try:
        onnx.checker.check_model(model, full_check=True)
        # full_check runs shape inference; strict mode and type checks make any
        # conflict between declared and inferred types an error here too.
        shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as e:  # the checker raises several exception types
        fail(f"onnx.checker rejected {a.model}: {e}")

    opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    if opsets != {"ai.onnx": 17}:
        fail(f"opset_import is {opsets}, expected only ai.onnx 17")
    g = model.graph
    ops = sorted({n.op_type for n in g.node})
    if any(n.domain not in ("", "ai.onnx") for n in g.node):
        fail("a node outside the default domain")

    if a.classifier or a.autoencoder:
        check_pooled(model, a, ops)
        return

    cache = [f"{layer}.{kv}" for layer in range(a.layers) for kv in ("key", "value")] if a.kv_cache else []
    want_in = ["input_ids"] + (["attention_mask", "position_ids"] if cache else []) + \
        [f"past_key_values.{c}" for c in cache]
    want_out = ["logits"] + [f"present.{c}" for c in cache]
    if [i.name for i in g.input] != want_in:
        fail(f"graph inputs {[i.name for i in g.input]}, expected {want_in}")
    if [o.name for o in g.output] != want_out:
        fail(f"graph outputs {[o.name for o in g.output]}, expected {want_out}")
    inp, out = g.input[0], g.output[0]
    if inp.type.tensor_type.elem_type != TensorProto.INT64:
        fail("input_ids is not int64")
    if out.type.tensor_type.elem_type != TensorProto.FLOAT:
        fail("logits is not float32")
    di, do = dims(inp), dims(out)
    if len(di) != 2 or not all(isinstance(d, str) and d for d in di):
        fail(f"input_ids dims {di}, expected two symbolic ones")
    if len(do) != 3 or do[:2] != di or do[2] != a.vocab:
        fail(f"logits dims {do}, expected [{di[0] if di else '?'}, {di[1] if len(di) > 1 else '?'}, {a.vocab}]")
    past_lengths, total_lengths = set(), set()  # the symbols of the past and the past + new lengths
    if cache:
        mask, positions = g.input[1], g.input[2]
        for v in (mask, positions):
            if v.type.tensor_type.elem_type != TensorProto.INT64:
                fail(f"{v.name} is not int64")
        dm = dims(mask)
        if len(dm) != 2 or dm[0] != di[0] or not (isinstance(dm[1], str) and dm[1]):
            fail(f"attention_mask dims {dm}, expected [{di[0]}, <symbolic length>]")
        total_lengths.add(dm[1])
        if dims(positions) != di:
            fail(f"position_ids dims {dims(positions)}, expected those of input_ids {di}")
    for v in list(g.input[3 if cache else 1:]) + list(g.output[1:]):
        dv = dims(v)
        if v.type.tensor_type.elem_type != TensorProto.FLOAT:
            fail(f"{v.name} is not float32")
        if len(dv) != 4 or dv[0] != di[0] or dv[1] != a.heads or dv[3] != a.embd // a.heads or \
                not (isinstance(dv[2], str) and dv[2]):
            fail(f"{v.name} dims {dv}, expected [{di[0]}, {a.heads}, <symbolic length>, {a.embd // a.heads}]")
        (past_lengths if v.name.startswith("past") else total_lengths).add(dv[2])
    if cache and (len(past_lengths) != 1 or len(total_lengths) != 1 or past_lengths == total_lengths):
        fail(f"cache lengths: pasts {sorted(past_lengths)}, presents and attention_mask {sorted(total_lengths)}: "
             "expected one symbol for the pasts and another for the rest")

    props = {p.key: p.value for p in model.metadata_props}
    if props.get("kind") != "gpt" or props.get("kv_cache") != ("true" if cache else "false"):
        fail(f"metadata kind {props.get('kind')!r}, kv_cache {props.get('kv_cache')!r}")
    inits = {t.name: t for t in g.initializer}
    n_params = check_weights(inits, a, a.block, {})

    cache_note = f", {len(cache)} cache inputs and as many outputs" if cache else ""
    print(f"check_onnx: OK {a.model}: ir_version {model.ir_version}, opset 17, {len(g.node)} nodes, "
          f"{len(inits)} initializers ({n_params} weights), input_ids {di}, logits {do}{cache_note}; "
          f"ops: {', '.join(ops)}")


if __name__ == "__main__":
    main()
