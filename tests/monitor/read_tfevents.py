#!/usr/bin/env python3
"""An independent reader of brisk's TensorBoard event files, and the ctest
`tfevents_check` built on it (docs/monitoring.md).

Independent of brisk's writer: the TFRecord framing and CRC-32C are
implemented here, and the Event / Summary / SessionLog message classes are
built at run time from TensorFlow's field numbers (not from brisk's
src/monitor/tfevent.proto), then decoded with python3's google.protobuf.

The check drives the built `brisk` CLI:
  1. a tiny GPT run (8 steps, evaluation at 4 and 8, loss scaling on so that
     loss_scale and skipped are logged), then its step-8 checkpoint removed
     and the run resumed from step 4: two event files, the second starting
     with a SessionLog START at step 5;
  2. the same config with train.tensorboard = false: no event file;
  3. a tiny encoder classifier run (per-step rows and per-epoch val figures).
For each run directory every record's two CRCs are verified, the events are
decoded, TensorBoard's restart rule is applied (a START at step s drops what
earlier files hold for steps >= s), and every number of every metrics.jsonl
row must be a scalar of the event at that row's step, tagged with its key
(nested val figures as val/<key>), and no event may hold a tag metrics.jsonl
does not: for the GPT run exactly, as float32; for the classifier within the
rounding of the JSON text it prints with fixed digits.

Without python3-protobuf (Debian: python3-protobuf) the check fails; it
never skips.

  read_tfevents.py --brisk build/release/brisk --workdir /tmp/tfcheck   # the check
  read_tfevents.py --dump runs/demo                                     # print a run's events
"""
import argparse
import decimal
import glob
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError as e:  # a missing dependency fails the test, never skips it
    print(f"FAIL: python3 cannot import google.protobuf ({e}); install Debian's python3-protobuf "
          "(scripts/install_deps.sh) and run with /usr/bin/python3", file=sys.stderr)
    sys.exit(1)


class CheckError(Exception):
    pass


# ---- CRC-32C (Castagnoli), as TFRecord frames use it ---------------------------------------

def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---- TensorFlow's messages, from their field numbers ---------------------------------------

def _message_classes():
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="tfevents_check.proto", package="tfcheck", syntax="proto3")

    summary = fdp.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.oneof_decl.add(name="value")
    value.field.add(name="node_name", number=7, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL, oneof_index=0)
    value.field.add(name="obsolete_old_style_histogram", number=3, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL,
                    oneof_index=0)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tfcheck.Summary.Value")

    session_log = fdp.message_type.add(name="SessionLog")
    status = session_log.enum_type.add(name="SessionStatus")
    for name, number in (("STATUS_UNSPECIFIED", 0), ("START", 1), ("STOP", 2), ("CHECKPOINT", 3)):
        status.value.add(name=name, number=number)
    session_log.field.add(name="status", number=1, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL,
                          type_name=".tfcheck.SessionLog.SessionStatus")
    session_log.field.add(name="checkpoint_path", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    session_log.field.add(name="msg", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)

    event = fdp.message_type.add(name="Event")
    event.oneof_decl.add(name="what")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    event.field.add(name="graph_def", number=4, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL, oneof_index=0)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, oneof_index=0,
                    type_name=".tfcheck.Summary")
    # TensorFlow's event.proto: 6 is the deprecated LogMessage, 7 SessionLog
    # (a START written as field 6 reads as a log_message, and TensorBoard
    # never purges on it). Both are declared so either shows as what it is.
    event.field.add(name="log_message", number=6, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL, oneof_index=0)
    event.field.add(name="session_log", number=7, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, oneof_index=0,
                    type_name=".tfcheck.SessionLog")

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("tfcheck.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


Event = _message_classes()
START = 1


# ---- reading ------------------------------------------------------------------------------

def read_records(path):
    """The data of every TFRecord in `path`, both CRCs checked."""
    data = open(path, "rb").read()
    records, pos = [], 0
    while pos < len(data):
        if len(data) - pos < 12:
            raise CheckError(f"{path}: {len(data) - pos} bytes at offset {pos}: a truncated record header")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if header_crc != masked_crc32c(header):
            raise CheckError(f"{path}: record at offset {pos}: length CRC {header_crc:#010x}, "
                             f"expected {masked_crc32c(header):#010x}")
        if len(data) - pos - 12 < length + 4:
            raise CheckError(f"{path}: record at offset {pos}: {length} bytes of data announced, "
                             f"{len(data) - pos - 12} left")
        body = data[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if data_crc != masked_crc32c(body):
            raise CheckError(f"{path}: record at offset {pos}: data CRC {data_crc:#010x}, "
                             f"expected {masked_crc32c(body):#010x}")
        records.append(body)
        pos += 16 + length
    return records


def read_events(path):
    """The decoded events of one file; the first must be the file version."""
    events = []
    for i, body in enumerate(read_records(path)):
        e = Event()
        e.ParseFromString(body)
        events.append(e)
    if not events or events[0].WhichOneof("what") != "file_version" or events[0].file_version != "brain.Event:2":
        raise CheckError(f"{path}: the first record is not file_version 'brain.Event:2': "
                         f"{events[0] if events else 'no records'}")
    for e in events:
        if not (1.5e9 < e.wall_time < 4e9):
            raise CheckError(f"{path}: event at step {e.step} has wall_time {e.wall_time}, not Unix seconds")
    return events


def event_files(run_dir):
    return sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))


def scalars_by_step(run_dir):
    """{step: {tag: float}} over the run directory's files in name order, as
    TensorBoard reads them: a SessionLog START at step s drops the scalars of
    steps >= s read so far (a restarted job computes them again)."""
    steps = {}
    for path in event_files(run_dir):
        for e in read_events(path)[1:]:
            what = e.WhichOneof("what")
            if what == "session_log":
                if e.session_log.status != START:
                    raise CheckError(f"{path}: unexpected session_log status {e.session_log.status}")
                steps = {s: v for s, v in steps.items() if s < e.step}
            elif what == "summary":
                into = steps.setdefault(e.step, {})
                for v in e.summary.value:
                    if v.WhichOneof("value") != "simple_value":
                        raise CheckError(f"{path}: step {e.step}: tag '{v.tag}' holds no simple_value")
                    if v.tag in into:
                        raise CheckError(f"{path}: step {e.step}: tag '{v.tag}' logged twice")
                    into[v.tag] = v.simple_value
            else:
                raise CheckError(f"{path}: unexpected event kind '{what}' at step {e.step}")
    return steps


# ---- comparing with metrics.jsonl ---------------------------------------------------------------

class Printed(float):
    """A JSON number that remembers the decimal quantum it was printed with."""

    def __new__(cls, text):
        x = super().__new__(cls, float(text))
        x.quantum = 10.0 ** decimal.Decimal(text).as_tuple().exponent
        return x


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def metric_rows(run_dir):
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line, parse_float=Printed))
    return rows


def row_scalars(row):
    """The numbers of a metrics row, keyed as the events tag them. A row with a
    nested "val" object (the classifier's per-epoch figures) contributes only
    val/<key>; its "epoch" counts from 1 where the step rows count from 0."""
    out = {}
    if isinstance(row.get("val"), dict):
        items = [("val/" + k, v) for k, v in row["val"].items()]
    else:
        items = [(k, v) for k, v in row.items() if k != "step"]
    for k, v in items:
        if isinstance(v, bool):
            out[k] = float(v)
        elif v is None:  # metrics.jsonl writes NaN and infinities as null
            out[k] = math.nan
        elif isinstance(v, (int, float)):
            out[k] = v
    return out


def same(expected, got, exact):
    if math.isnan(expected):
        return math.isnan(got)
    if f32(expected) == got:
        return True
    if exact:
        return False
    # Printed with fixed digits: within half the last printed digit, plus float32 rounding.
    quantum = getattr(expected, "quantum", 1.0)
    return abs(got - expected) <= 0.5 * quantum + 2.0 ** -23 * abs(expected)


def check_run(run_dir, exact):
    events = scalars_by_step(run_dir)
    want = {}
    for row in metric_rows(run_dir):
        want.setdefault(row["step"], {}).update(row_scalars(row))
    if sorted(events) != sorted(want):
        raise CheckError(f"{run_dir}: events hold steps {sorted(events)}, metrics.jsonl {sorted(want)}")
    compared = 0
    for step, expected in want.items():
        got = events[step]
        if set(got) != set(expected):
            raise CheckError(f"{run_dir}: step {step}: event tags {sorted(got)} but metrics.jsonl keys {sorted(expected)}")
        for tag, value in expected.items():
            if not same(value, got[tag], exact):
                raise CheckError(f"{run_dir}: step {step}: '{tag}' is {got[tag]!r} in the events, "
                                 f"{value!r} in metrics.jsonl")
            compared += 1
    return compared


# ---- the runs -------------------------------------------------------------------------------

def run(args, what):
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise CheckError(f"{what} failed (exit {r.returncode}): {' '.join(args)}\n{r.stdout}\n{r.stderr}")
    return r


def tiny_corpus():
    words = ["the", "king", "spake", "unto", "his", "servants", "and", "said", "behold", "a", "light", "came",
             "over", "water", "land", "of", "river", "stone", "bread", "they", "went", "forth"]
    rng = random.Random(12345)
    return "".join(" ".join(rng.choice(words) for _ in range(10)) + ".\n" for _ in range(400))


def gpt_config(data, out):
    return (f'[model]\nvocab_size = 256\nn_layer = 2\nn_embd = 32\nn_head = 2\nblock_size = 32\n\n'
            f'[data]\ndir = "{data}"\n\n'
            f'[train]\nbatch = 4\nseq = 32\nsteps = 8\nlr = 3e-3\nwarmup = 2\nschedule = "cosine"\n'
            f'min_lr_ratio = 0.1\nseed = 7\nthreads = 2\neval_every = 4\neval_batches = 2\nlog_every = 1\n'
            f'loss_scaling = true\nloss_scale_init = 1\nloss_scale_growth_interval = 3\n\n'
            f'[checkpoint]\ndir = "{out}"\nevery = 4\nkeep = 0\n')


def check_gpt(brisk, work):
    with open(os.path.join(work, "corpus.txt"), "w") as f:
        f.write(tiny_corpus())
    data = os.path.join(work, "data")
    run([brisk, "data", "prepare", "--input", os.path.join(work, "corpus.txt"), "--tokenizer", "bytes",
         "--out", data, "--val-fraction", "0.1", "--threads", "1"], "brisk data prepare")
    out = os.path.join(work, "gpt")
    cfg = os.path.join(work, "gpt.toml")
    with open(cfg, "w") as f:
        f.write(gpt_config(data, out))

    run([brisk, "train", "--config", cfg, "--no-progress"], "brisk train (8 steps)")
    if len(event_files(out)) != 1:
        raise CheckError(f"{out}: expected one event file after the first run, found {event_files(out)}")
    # Back to the step-4 checkpoint: the resumed run computes steps 5..8 again.
    shutil.rmtree(os.path.join(out, "step_0000008"))
    run([brisk, "train", "--config", cfg, "--no-progress", "--resume"], "brisk train --resume")
    files = event_files(out)
    if len(files) != 2:
        raise CheckError(f"{out}: a resumed run must add a second event file, found {files}")
    second = read_events(files[1])
    if second[1].WhichOneof("what") != "session_log" or second[1].session_log.status != START or second[1].step != 5:
        raise CheckError(f"{files[1]}: the resumed run's first event is not a SessionLog START at step 5: {second[1]}")
    compared = check_run(out, exact=True)
    steps = scalars_by_step(out)
    for tag in ("loss", "lr", "grad_norm", "tokens_per_s", "ms_per_step", "mfu", "data_wait_ms", "loss_scale",
                "skipped"):
        if tag not in steps[1]:
            raise CheckError(f"{out}: step 1 has no '{tag}' scalar: {sorted(steps[1])}")
    if "val_loss" not in steps[4] or "val_loss" not in steps[8] or "val_loss" in steps[5]:
        raise CheckError(f"{out}: val_loss must be logged at the evaluation steps 4 and 8 only")
    print(f"gpt: {len(files)} event files, {sum(len(read_records(p)) for p in files)} records with valid CRCs, "
          f"{compared} scalars equal to metrics.jsonl over steps {min(steps)}..{max(steps)}")

    off = os.path.join(work, "gpt_off")
    run([brisk, "train", "--config", cfg, "--no-progress", "--set", f'checkpoint.dir="{off}"', "--set",
         "train.steps=2", "--set", "train.tensorboard=false"], "brisk train (tensorboard off)")
    if event_files(off):
        raise CheckError(f"{off}: train.tensorboard = false but event files were written: {event_files(off)}")
    print("gpt: train.tensorboard = false writes no event file")


def check_classifier(brisk, work):
    rng = random.Random(7)
    ham = ["meeting", "agenda", "notes", "schedule", "project", "review", "lunch", "team"]
    junk = ["money", "winner", "free", "offer", "cash", "prize", "click", "credit"]
    for group, words in (("easy-ham-1", ham), ("spam-1", junk)):
        os.makedirs(os.path.join(work, "mail", group), exist_ok=True)
        for i in range(40):
            body = " ".join(rng.choice(words) for _ in range(4 + rng.randrange(8)))
            with open(os.path.join(work, "mail", group, f"{i}.txt"), "w") as f:
                f.write(f"From: someone@example.org\nSubject: hello\n\n{body}\n")
    store = os.path.join(work, "mail.lmdb")
    run([brisk, "data", "emails", "--input", os.path.join(work, "mail"), "--out", store, "--tokenizer", "bytes",
         "--strip-headers"], "brisk data emails")
    out = os.path.join(work, "enc")
    cfg = os.path.join(work, "enc.toml")
    with open(cfg, "w") as f:
        f.write(f'[model]\nkind = "encoder"\nvocab_size = 256\nn_layer = 1\nn_embd = 32\nn_head = 2\nmax_len = 64\n'
                f'n_classes = 2\n[data]\nstore = "{store}"\nstrip_headers = true\nlabel_names = ["ham", "spam"]\n'
                f'[train]\nbatch = 8\nepochs = 2\nlr = 3e-3\nwarmup = 2\nlog_every = 5\n'
                f'[checkpoint]\ndir = "{out}"\n')
    run([brisk, "train", "--config", cfg], "brisk train (encoder classifier)")
    compared = check_run(out, exact=False)
    steps = scalars_by_step(out)
    if not any("val/loss" in v for v in steps.values()):
        raise CheckError(f"{out}: no val/loss scalar in the events")
    print(f"classifier: {compared} scalars agree with metrics.jsonl over {len(steps)} steps")


def dump(run_dir):
    for path in event_files(run_dir):
        print(f"== {path}")
        for e in read_events(path):
            what = e.WhichOneof("what")
            if what == "summary":
                print(f"step {e.step}: " + ", ".join(f"{v.tag}={v.simple_value:.6g}" for v in e.summary.value))
            elif what == "session_log":
                print(f"step {e.step}: session_log status {e.session_log.status}")
            else:
                print(f"{what}: {getattr(e, what)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brisk", help="the built brisk CLI (runs the check)")
    ap.add_argument("--workdir", help="scratch directory for the check (emptied first)")
    ap.add_argument("--dump", metavar="RUN_DIR", help="print the events of a run directory instead")
    a = ap.parse_args()
    try:
        if a.dump:
            dump(a.dump)
            return 0
        if not a.brisk or not a.workdir:
            ap.error("--brisk and --workdir are needed for the check (or --dump RUN_DIR)")
        shutil.rmtree(a.workdir, ignore_errors=True)
        os.makedirs(a.workdir)
        check_gpt(os.path.abspath(a.brisk), os.path.abspath(a.workdir))
        check_classifier(os.path.abspath(a.brisk), os.path.abspath(a.workdir))
    except CheckError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    print("OK: TensorBoard event files decode with valid CRCs and match metrics.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
