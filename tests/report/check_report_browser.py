#!/usr/bin/env python3
"""Opens `brisk report`'s HTML page in headless Chromium and checks what a
person would see.

Two tiny real training runs (the sizes of tests/integration/integration_util.h)
go through the built `brisk`: `brisk report A B` and `brisk report --compare A
B` write pages, and Chromium (Debian package `chromium`, installed by
scripts/install_deps.sh) then

  - renders each page to a PNG, which must exist and not be blank: the PNG is
    decoded here (zlib, scanline filters) and its pixels must vary, unlike
    the render of an empty page, which is checked to be blank so the check
    can tell the two apart;
  - dumps the DOM after the page's script ran: it must hold as many
    <svg class="plot"> as the file, the script's data-brisk-plots attribute
    must say the same (the script ran to its end), the plots the runs
    recorded must be there, each with one <path class="series"> of several
    points per run;
  - logs the console: no uncaught script error.

A missing Chromium fails the check (exit 1) with what to install; it never
skips.

Usage: check_report_browser.py --brisk build/release/brisk --workdir /tmp/report_check
"""

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

TIMEOUT_S = 120
# The plots every GPT run of brisk records (metrics.jsonl + run_summary.json).
EXPECTED_PLOTS = ["plot-loss", "plot-tokens_per_s", "plot-mfu", "plot-memory-steps", "plot-data_wait_ms",
                  "plot-lr", "plot-grad_norm", "plot-ms_per_step"]


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S, **kw)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def tiny_corpus():
    """integration_util.h's tiny_corpus(): the same LCG, the same words."""
    words = ["the", "king", "spake", "unto", "his", "servants", "and", "said", "behold", "a", "light", "came",
             "over", "water", "land", "of", "river", "stone", "bread", "they", "went", "forth"]
    s, out = 12345, []
    for _ in range(400):
        for w in range(10):
            s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
            out.append(words[(s >> 16) % len(words)])
            out.append(".\n" if w == 9 else " ")
    return "".join(out)


def tiny_config(data, out, workers, batch):
    return (f"[model]\nvocab_size = 256\nn_layer = 2\nn_embd = 32\nn_head = 2\nblock_size = 32\n\n"
            f"[data]\ndir = \"{data}\"\n\n"
            f"[train]\nbatch = {batch}\nseq = 32\nsteps = 30\nlr = 3e-3\nwarmup = 2\nschedule = \"cosine\"\n"
            f"min_lr_ratio = 0.1\nseed = 7\nthreads = 2\neval_every = 10\neval_batches = 2\nlog_every = 10\n"
            f"loader_workers = {workers}\n\n"
            f"[checkpoint]\ndir = \"{out}\"\nevery = 30\nkeep = 1\n")


# ---- PNG --------------------------------------------------------------------------------

def png_pixels(path):
    """(width, height, channels, rows of bytes) of an 8-bit non-interlaced PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: not a PNG")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    if not ihdr:
        fail(f"{path}: no IHDR chunk")
    width, height, depth, ctype, _, _, interlace = ihdr
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(ctype)
    if depth != 8 or channels is None or interlace != 0:
        fail(f"{path}: PNG of bit depth {depth}, colour type {ctype}, interlace {interlace}: not decoded here")
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(line)
        prev = line
    return width, height, channels, rows


def pixel_stats(path):
    """(variance of the grey level, share of pixels that are not the page's background)"""
    width, height, channels, rows = png_pixels(path)
    grey = []
    for line in rows[::2]:  # every other row and column: plenty for a variance
        for x in range(0, width, 2):
            px = line[x * channels:(x + 1) * channels]
            grey.append(sum(px[:3]) / 3 if channels >= 3 else px[0])
    mean = sum(grey) / len(grey)
    var = sum((g - mean) ** 2 for g in grey) / len(grey)
    background = max(set(grey), key=grey.count)
    inked = sum(1 for g in grey if abs(g - background) > 8) / len(grey)
    return var, inked


# ---- Chromium ---------------------------------------------------------------------------

def chromium_binary():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    fail("Chromium is not installed: scripts/install_deps.sh installs it (apt-get install -y chromium)")


def chromium(binary, profile, args):
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"] + args
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)


def check_page(binary, work, html_path, runs, label):
    url = "file://" + os.path.abspath(html_path)
    source = open(html_path, encoding="utf-8").read()
    for bad in ("http://", "https://", "<link", " src="):
        if bad in source:
            fail(f"{html_path}: '{bad}' in a page that must be self-contained")

    png = os.path.join(work, f"{label}.png")
    r = chromium(binary, os.path.join(work, f"profile-{label}-shot"),
                 [f"--screenshot={png}", "--window-size=1200,2000", "--hide-scrollbars", url])
    if not os.path.exists(png) or os.path.getsize(png) == 0:
        fail(f"{label}: no screenshot (chromium exit {r.returncode})\n{r.stderr[-3000:]}")
    var, inked = pixel_stats(png)
    print(f"{label}: screenshot {png}: grey variance {var:.1f}, {100 * inked:.1f}% of pixels inked")
    if var < 50 or inked < 0.02:
        fail(f"{label}: the screenshot is (nearly) blank: variance {var:.1f}, {100 * inked:.2f}% inked")

    r = chromium(binary, os.path.join(work, f"profile-{label}-dom"), ["--dump-dom", url])
    dom = r.stdout
    errors = [l for l in r.stderr.splitlines() if "CONSOLE" in l and ("Uncaught" in l or "Error" in l)]
    if errors:
        fail(f"{label}: script errors in the console:\n" + "\n".join(errors))
    n_source = len(re.findall(r'<svg class="plot"', source))
    n_dom = len(re.findall(r'<svg class="plot"', dom))
    if n_dom == 0 or n_dom != n_source:
        fail(f"{label}: {n_dom} <svg class=\"plot\"> in the rendered DOM, {n_source} in the file")
    m = re.search(r'data-brisk-plots="(\d+)"', dom)
    if not m or int(m.group(1)) != n_source:
        fail(f"{label}: the page's script did not run to its end (data-brisk-plots = {m and m.group(1)}, "
             f"expected {n_source})")
    svgs = {mm.group(1): mm.group(0) for mm in re.finditer(r'<svg class="plot" id="([^"]+)".*?</svg>', dom, re.S)}
    for pid in EXPECTED_PLOTS:
        if pid not in svgs:
            fail(f"{label}: no plot {pid} in the DOM (plots: {sorted(svgs)})")
        paths = re.findall(r'<path class="series" d="([^"]*)"', svgs[pid])
        with_data = [d for d in paths if d.count("L") >= 1]
        if len(with_data) < runs:
            fail(f"{label}: {pid} has {len(with_data)} series paths with data, expected one per run ({runs})")
    print(f"{label}: {n_dom} plots rendered, script ran, no console errors")
    return dom


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--brisk", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    binary = chromium_binary()
    work = os.path.abspath(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    # Blank check of the blank check: an empty page must measure as blank.
    empty = os.path.join(work, "empty.html")
    with open(empty, "w") as f:
        f.write("<!DOCTYPE html><html><body></body></html>")
    png = os.path.join(work, "empty.png")
    chromium(binary, os.path.join(work, "profile-empty"),
             [f"--screenshot={png}", "--window-size=1200,2000", "file://" + empty])
    if not os.path.exists(png):
        fail("chromium wrote no screenshot of an empty page")
    var, inked = pixel_stats(png)
    if var >= 50 or inked >= 0.02:
        fail(f"an empty page measured as not blank (variance {var:.1f}, {100 * inked:.2f}% inked)")

    with open(os.path.join(work, "corpus.txt"), "w") as f:
        f.write(tiny_corpus())
    data = os.path.join(work, "data")
    run([a.brisk, "data", "prepare", "--input", os.path.join(work, "corpus.txt"), "--tokenizer", "bytes",
         "--out", data, "--val-fraction", "0.1", "--threads", "1"])
    dirs = []
    for name, workers, batch in (("default", 2, 4), ("starved", 0, 1)):
        out = os.path.join(work, name)
        cfg = os.path.join(work, f"{name}.toml")
        with open(cfg, "w") as f:
            f.write(tiny_config(data, out, workers, batch))
        r = run([a.brisk, "train", "--config", cfg, "--no-progress"])
        if "== recommendations" not in r.stdout:
            fail(f"brisk train printed no recommendations:\n{r.stdout}")
        for must in ("run_summary.json", "recommendations.json", "metrics.jsonl"):
            if not os.path.exists(os.path.join(out, must)):
                fail(f"{out}: no {must} after brisk train")
        rec = json.load(open(os.path.join(out, "recommendations.json")))
        if not (0 <= rec["score"] <= 100):
            fail(f"{out}/recommendations.json: score {rec['score']} outside 0-100")
        dirs.append(out)

    html = os.path.join(work, "report.html")
    run([a.brisk, "report", dirs[0], dirs[1], "--out", html])
    check_page(binary, work, html, 2, "report")
    cmp_html = os.path.join(work, "compare.html")
    r = run([a.brisk, "report", "--compare", dirs[0], dirs[1], "--out", cmp_html])
    if "== B against A ==" not in r.stdout:
        fail(f"brisk report --compare printed no comparison table:\n{r.stdout}")
    dom = check_page(binary, work, cmp_html, 2, "compare")
    if 'id="comparison"' not in dom:
        fail("compare: no comparison section in the DOM")
    print("ok")


if __name__ == "__main__":
    main()
