#!/usr/bin/env python3
"""TensorBoard reads the event files `axengine run` writes, and they say what metrics.jsonl says.

1. Trains a tiny Llama (init-model) on the one-digit sums task for 8 steps on the CPU, eval and a checkpoint every
   4 steps, then deletes the last checkpoint and resumes from step 4 (the resumed run rewrites the event file from
   the records it keeps and appends steps 5..8: the file holds each record once, in order).
2. Reads <output_dir> with tensorboard's own reader (every record passes its CRC checks; the first event carries
   file_version) and with its accumulators (the legacy one, and the plugin one the TensorBoard UI reads, where the
   values are scalars-plugin tensors): for every tag, the steps, values (as float32) and wall times equal
   metrics.jsonl's records; exactly one event file, holding each record once.
3. A copy with its last record cut short still reads, up to that record (what a crash leaves).
4. train.tensorboard = false writes no event file.

usage: check_tensorboard_events.py AXENGINE_BINARY
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

try:
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader, plugin_event_accumulator
    from tensorboard.util import tensor_util
except ImportError:
    # scripts/setup.sh installs it (CI, dev machines); a machine without it (the offline GPU machine) reports the
    # test as skipped (CTest SKIP_RETURN_CODE), not passed.
    print("SKIPPED: the tensorboard package is not installed (pip install -r scripts/requirements.txt)")
    sys.exit(77)

# metrics.jsonl key -> (TensorBoard tag, scale): core/src/train/tensorboard.cpp's table, as docs/training.md lists it.
TAGS = {
    "loss": ("train/loss", 1.0),
    "lr": ("train/learning_rate", 1.0),
    "grad_norm": ("train/grad_norm", 1.0),
    "epoch": ("train/epoch", 1.0),
    "tokens_per_s": ("train/tokens_per_second", 1.0),
    "peak_memory_bytes": ("train/peak_memory_gib", 1.0 / 2**30),
    "eval_loss": ("eval/loss", 1.0),
    "exact_match": ("eval/exact_match", 1.0),
}

RUN_TOML = """[run]
output_dir = "{out}"
seed = 11
[model]
path = "model"
[data]
sequence_len = 64
cache = false
[[datasets]]
type = "completion"
path = "data/train.jsonl"
eval_path = "data/eval.jsonl"
prompt_field = "prompt"
text_field = "answer"
[lora]
r = 8
alpha = 16
[train]
lr = 3e-3
warmup_steps = 2
micro_batch_size = 2
max_steps = 8
cpu_threads = 1
[eval]
every_steps = 4
max_samples = 8
[checkpoint]
every_steps = 4
"""


def event_files(out):
    return sorted(glob.glob(os.path.join(out, "events.out.tfevents.*")))


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_run(out, failures):
    files = event_files(out)
    if len(files) != 1:
        failures.append(f"{out}: {len(files)} event files, want 1: {files}")
        return
    events = list(event_file_loader.EventFileLoader(files[0]).Load())
    if not events or events[0].file_version != "brain.Event:2":
        failures.append(f"{files[0]}: the first event has no file_version 'brain.Event:2'")
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    # The raw file, not only what the accumulator keeps (it drops events whose step goes back): one event per
    # record that has scalars, in order, so the resumed run rewrote the file instead of appending to it.
    raw = [(e.step, e.wall_time) for e in events[1:]]
    want_raw = [(r["step"], r["time"]) for r in records if any(is_number(r.get(k)) for k in TAGS)]
    if raw != want_raw:
        failures.append(f"{files[0]}: events (step, wall_time) {raw}, want {want_raw}")
    acc = event_accumulator.EventAccumulator(out, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    have = set(acc.Tags()["scalars"])
    want_tags = {tag for key, (tag, _) in TAGS.items() if any(is_number(r.get(key)) for r in records)}
    if have != want_tags:
        failures.append(f"{out}: tags {sorted(have)}, want {sorted(want_tags)}")
    for key, (tag, scale) in TAGS.items():
        want = [(r["step"], np.float32(r[key] * scale), r["time"]) for r in records if is_number(r.get(key))]
        got = [(s.step, np.float32(s.value), s.wall_time) for s in acc.Scalars(tag)] if tag in have else []
        if got != want:
            failures.append(f"{out}: {tag}: got {got[:3]}... ({len(got)}), want {want[:3]}... ({len(want)})")
        else:
            print(f"{tag}: {len(got)} points match metrics.jsonl (steps {[g[0] for g in got]})")
    # The accumulator today's TensorBoard UI reads through: simple_value becomes a scalars-plugin tensor.
    pacc = plugin_event_accumulator.EventAccumulator(out, size_guidance={plugin_event_accumulator.TENSORS: 0})
    pacc.Reload()
    for key, (tag, scale) in TAGS.items():
        if tag not in have:
            continue
        want = [(r["step"], np.float32(r[key] * scale)) for r in records if is_number(r.get(key))]
        got = [(t.step, np.float32(tensor_util.make_ndarray(t.tensor_proto))) for t in pacc.Tensors(tag)]
        if got != want or pacc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            failures.append(f"{out}: {tag} in the scalars plugin: got {got[:3]}..., want {want[:3]}...")
    steps = [r["step"] for r in records if "loss" in r]
    if steps != list(range(1, 9)):
        failures.append(f"{out}: metrics.jsonl step records {steps}, want 1..8 once each")

    # A crash mid-append: the reader stops at the cut record and keeps what came before.
    cut = os.path.join(os.path.dirname(out), "cut", os.path.basename(files[0]))
    os.makedirs(os.path.dirname(cut))
    data = open(files[0], "rb").read()
    open(cut, "wb").write(data[:-5])
    got = list(event_file_loader.EventFileLoader(cut).Load())
    if len(got) != len(events) - 1:
        failures.append(f"truncated file: {len(got)} events read, want {len(events) - 1}")


def main():
    axengine = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        def ax(*args):
            subprocess.run([axengine, *args], check=True, cwd=tmp, env={**os.environ, "OMP_NUM_THREADS": "1"})

        ax("init-model", "--preset", "tiny-llama", "--out", os.path.join(tmp, "model"), "--seed", "3")
        ax("make-data", "--task", "arithmetic", "--out", os.path.join(tmp, "data"), "--train", "80", "--eval", "20",
           "--digits", "1")
        cfg = os.path.join(tmp, "run.toml")
        open(cfg, "w").write(RUN_TOML.format(out="out"))
        ax("run", "--config", cfg)
        out = os.path.join(tmp, "out")
        shutil.rmtree(os.path.join(out, "checkpoints", "step-00000008"))
        ax("run", "--config", cfg, "--resume")
        check_run(out, failures)

        ax("run", "--config", cfg, "--set", "run.output_dir=off", "--set", "train.tensorboard=false",
           "--set", "train.max_steps=2")
        if event_files(os.path.join(tmp, "off")):
            failures.append("train.tensorboard = false still wrote an event file")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
