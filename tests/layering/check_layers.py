#!/usr/bin/env python3
"""Fails when a layer includes a header of a layer above it.

The layers (docs/architecture.md) link only downwards:
    core <- ops <- backends (cpu, cuda) <- data, monitor, models, optim <- dist <- train <- infer, export <- bench, serve <- CLI
Each source or header directory may include brisk headers only from the
layers listed for it below. Prints every offending line and exits 1.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BELOW_TRAIN = {"core", "ops", "cpu", "data", "models", "monitor", "optim", "dist"}
ALLOWED = {
    "core": {"core"},
    "ops": {"core", "ops"},
    "cpu": {"core", "ops", "cpu"},
    "cuda": {"core", "ops"},
    "data": {"core", "data"},
    "monitor": {"core", "monitor"},
    "models": {"core", "ops", "models"},
    "optim": {"core", "ops", "optim"},
    "dist": {"core", "ops", "optim", "dist"},
    "train": BELOW_TRAIN | {"train"},
    "bench": BELOW_TRAIN | {"train", "infer", "bench"},
    "infer": BELOW_TRAIN | {"train", "infer"},
    "export": BELOW_TRAIN | {"train", "export"},
    "serve": BELOW_TRAIN | {"train", "infer", "serve"},
}
# Where each layer's files live.
DIRS = {
    "core": ["include/brisk/core", "src/core"],
    "ops": ["include/brisk/ops", "src/ops"],
    "cpu": ["include/brisk/cpu", "src/backends/cpu"],
    "cuda": ["src/backends/cuda"],
    "data": ["include/brisk/data", "src/data"],
    "monitor": ["include/brisk/monitor", "src/monitor"],
    "models": ["include/brisk/models", "src/models"],
    "optim": ["include/brisk/optim", "src/optim"],
    "dist": ["include/brisk/dist", "src/dist"],
    "train": ["include/brisk/train", "src/train"],
    "bench": ["include/brisk/bench", "src/bench"],
    "infer": ["include/brisk/infer", "src/infer"],
    "export": ["include/brisk/export", "src/export"],
    "serve": ["include/brisk/serve", "src/serve"],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"brisk/([a-z_]+)/([^"]+)"')
SUFFIXES = {".h", ".hpp", ".cpp", ".cu", ".cuh", ".inc"}


def main() -> int:
    bad, files = [], 0
    for layer, dirs in DIRS.items():
        for d in dirs:
            for path in sorted((ROOT / d).rglob("*")):
                if path.suffix not in SUFFIXES:
                    continue
                files += 1
                for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    m = INCLUDE.match(line)
                    if m and m.group(1) not in ALLOWED[layer]:
                        bad.append(f"{path.relative_to(ROOT)}:{n}: layer '{layer}' includes brisk/{m.group(1)}/{m.group(2)}")
    if files == 0:
        print("check_layers: no source files found under", ROOT)
        return 1
    for b in bad:
        print(b)
    print(f"check_layers: {files} files, {len(bad)} upward includes")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
