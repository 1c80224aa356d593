#!/usr/bin/env python3
"""Texts generated under a JSON schema are instances of it, by the jsonschema
package (Debian's python3-jsonschema), not by brisk's own reading of it.

Trains a one-step byte-level GPT (its draws are close to uniform, so the
texts wander wherever a schema lets them), generates a batch under each
schema with `brisk generate --json-schema-file`, and validates every text
that closed (finish "stop"); its keys must also come in the schema's order.
A schema brisk cannot enforce must be refused with exit code 2.
"""
import json
import os

import jsonschema

from tiny_generate import die, generated, run, setup

SCHEMAS = {
    # Pydantic's shape: $defs, $ref, allOf around a $ref, anyOf with null.
    "order": {
        "$defs": {
            "Color": {"enum": ["red", "green", "blue"], "title": "Color", "type": "string"},
            "Item": {
                "properties": {
                    "name": {"title": "Name", "type": "string", "minLength": 1, "maxLength": 4},
                    "qty": {"title": "Qty", "type": "integer"},
                    "color": {"allOf": [{"$ref": "#/$defs/Color"}], "default": "red"},
                },
                "required": ["name", "qty"],
                "title": "Item",
                "type": "object",
            },
        },
        "properties": {
            "items": {"items": {"$ref": "#/$defs/Item"}, "type": "array", "maxItems": 2},
            "note": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}], "default": None},
            "ok": {"type": "boolean"},
        },
        "required": ["items", "ok"],
        "title": "Order",
        "type": "object",
    },
    # Recursion through $ref.
    "tree": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
                },
                "required": ["id", "kids"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
    # An array at the root; alternatives picked by their first byte.
    "mixed": {
        "type": "array",
        "minItems": 1,
        "maxItems": 4,
        "items": {"anyOf": [{"type": "number"}, {"const": "x"}, {"type": "boolean"},
                            {"type": "array", "items": {"type": "null"}, "maxItems": 2}]},
    },
    # Enums of every kind, a const, type lists and string lengths.
    "fields": {
        "type": "object",
        "properties": {
            "z": {"type": "string", "minLength": 2, "maxLength": 3},
            "e": {"enum": [1, 12, "12", None, [1, {"k": True}], {"a": "b"}]},
            "c": {"const": {"v": [1.5, -2]}},
            "t": {"type": ["integer", "null"]},
        },
        "required": ["z", "e", "t"],
    },
}

REFUSED = {
    '{"type":"object","properties":{"n":{"type":"integer","minimum":0}}}': "'minimum' is not supported",
    '{"type":"string"}': "the root must allow an object or an array",
}


def key_order_ok(value, schema):
    """Listed keys appear in the schema's order (checked where the value is an
    object under a schema with properties; nested values by their property)."""
    props = schema.get("properties")
    if not isinstance(value, dict) or not props:
        return True
    order = list(props)
    seen = [order.index(k) for k in value]
    return seen == sorted(seen)


def main():
    a, run_dir = setup()

    prompt = "JSON:"
    for name, schema in SCHEMAS.items():
        path = os.path.join(a.workdir, name + ".json")
        with open(path, "w") as f:
            json.dump(schema, f)
        r = run([a.brisk, "generate", "--checkpoint", run_dir, "--prompt", prompt, "--batch", str(a.batch),
                 "--no-stream", "--max-new", "240", "--temperature", "1", "--seed", "7", "--threads", "1",
                 "--json-schema-file", path])
        closed = 0
        validator = jsonschema.Draft202012Validator(schema)
        for i, (reason, text) in enumerate(generated(r, a.batch, prompt, name)):
            if reason != "stop":
                continue
            closed += 1
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                die(f"{name}: text {i} is not JSON ({e}): {text!r}")
            errors = list(validator.iter_errors(value))
            if errors:
                die(f"{name}: text {i} is no instance of the schema: {errors[0].message}\n  {text!r}")
            if not key_order_ok(value, schema):
                die(f"{name}: text {i} has its keys out of the schema's order: {text!r}")
        print(f"{name}: {closed} of {a.batch} texts closed, every one an instance of the schema")
        if closed == 0:
            die(f"{name}: no text closed within 240 tokens; nothing was validated")

    for schema, words in REFUSED.items():
        r = run([a.brisk, "generate", "--checkpoint", run_dir, "--prompt", prompt, "--json-schema", schema])
        if r.returncode != 2 or words not in r.stderr:
            die(f"schema {schema}: expected exit 2 naming {words!r}, got {r.returncode}: {r.stderr.strip()}")
    print("check_json_schema: ok")


if __name__ == "__main__":
    main()
