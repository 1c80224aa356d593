#!/usr/bin/env python3
"""Messages through `brisk serve`'s POST /classify against `brisk classify`.

Starts `brisk serve` on an encoder classifier checkpoint, sends every
message of a list as its own request from --clients threads at once (one
message per request, as a mail filter calls it), then runs `brisk classify`
on the same files in one process. Prints and writes (--json) each side's
wall time and messages/s, the server's request latency (p50, p90, p99 as
the client sees it), its forwards and tokens from /metrics, and how many
labels and printed probabilities (4 decimals) agree. Exits 1 when a request
fails or a label differs. Each message goes as JSON text, decoded as UTF-8
with U+FFFD for ill-formed bytes: what a gpt2 classifier (E1) reads of the
file too; a bytes classifier reads the raw bytes, so its answers may differ
on messages that are not UTF-8.

  ls $DATA/*/*.txt > msgs.txt
  python3 bench/classify_serve.py --brisk build/release/brisk --checkpoint runs/spam \\
      --files-from msgs.txt [--clients 16] [--threads 2] [--precision fp32|bf16] [--json out.json]
"""
import argparse
import json
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brisk", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--files-from", required=True, help="message files, one path per line")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="both sides'")
    ap.add_argument("--json")
    a = ap.parse_args()
    files = [line.rstrip("\r\n") for line in open(a.files_from) if line.strip()]
    texts = [open(f, "rb").read().decode("utf-8", errors="replace") for f in files]

    port = free_port()
    server = subprocess.Popen([a.brisk, "serve", "--model", a.checkpoint, "--port", str(port), "--threads",
                               str(a.threads), "--precision", a.precision],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        listening = server.stdout.readline().strip()  # once the model is loaded
        print(listening)
        # What ran: bf16 falls back to fp32 (with a warning) on a CPU without bf16 dot products.
        serve_precision = "bf16" if ", bf16," in listening else "fp32"
        base = f"http://127.0.0.1:{port}"
        todo = queue.Queue()
        for i in range(len(files)):
            todo.put(i)
        served, latency, errors = [None] * len(files), [], []
        lock = threading.Lock()

        def client():
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                body = json.dumps({"input": texts[i]}).encode()
                request = urllib.request.Request(base + "/classify", data=body,
                                                 headers={"Content-Type": "application/json"})
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen(request, timeout=120) as r:
                        d = json.load(r)["data"][0]
                except Exception as e:  # noqa: BLE001 (reported and counted)
                    with lock:
                        errors.append(f"{files[i]}: {e}")
                    continue
                with lock:
                    latency.append(time.perf_counter() - t0)
                served[i] = (d["label"], max(d["probs"]))

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        serve_wall = time.perf_counter() - t0
        with urllib.request.urlopen(base + "/metrics") as r:
            metrics = r.read().decode()
    finally:
        server.terminate()
        server.wait(timeout=60)

    t0 = time.perf_counter()
    done = subprocess.run([a.brisk, "classify", "--checkpoint", a.checkpoint, "--threads", str(a.threads),
                           "--precision", a.precision] + files, capture_output=True, text=True, check=True)
    out = done.stdout
    classify_precision = "bf16" if "precision bf16 (" in done.stderr else "fp32"
    classify_wall = time.perf_counter() - t0
    offline = [line.split("\t") for line in out.splitlines()]

    same_label = sum(1 for s, o in zip(served, offline) if s and s[0] == o[0])
    same_prob = sum(1 for s, o in zip(served, offline) if s and f"{s[1]:.4f}" == o[1])
    latency.sort()
    report = {
        "messages": len(files), "clients": a.clients, "threads": a.threads, "precision": a.precision,
        "precision_ran": {"serve": serve_precision, "classify": classify_precision}, "errors": len(errors),
        "serve": {"wall_s": serve_wall, "messages_per_s": len(files) / serve_wall,
                  "latency_ms": {q: 1000 * percentile(latency, p) for q, p in
                                 (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))} if latency else None,
                  "forwards": metric(metrics, "brisk_engine_steps_total"),
                  "tokens": metric(metrics, "brisk_prompt_tokens_total")},
        "classify": {"wall_s": classify_wall, "messages_per_s": len(files) / classify_wall},
        "same_label": same_label, "same_printed_probability": same_prob,
    }
    s = report["serve"]
    print(f"serve:    {len(files)} messages, {a.clients} clients, {s['wall_s']:.1f} s, "
          f"{s['messages_per_s']:.1f} messages/s, latency p50/p90/p99 "
          + ("/".join(f"{v:.0f}" for v in s["latency_ms"].values()) + " ms" if latency else "-")
          + f", {s['forwards']:.0f} forwards")
    print(f"classify: {classify_wall:.1f} s, {report['classify']['messages_per_s']:.1f} messages/s; "
          f"serve / classify {s['messages_per_s'] / report['classify']['messages_per_s']:.2f}x")
    print(f"agreement: {same_label}/{len(files)} labels, {same_prob}/{len(files)} printed probabilities")
    for e in errors[:5]:
        print("error:", e, file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    return 1 if errors or same_label != len(files) else 0


if __name__ == "__main__":
    sys.exit(main())
