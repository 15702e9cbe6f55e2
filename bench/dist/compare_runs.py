"""Summarises the runs of bench/dist/multi_gpu.sh that have finished: speed per GPU, scaling against the 1-GPU
run, peak memory, and how far each multi-GPU run's losses and final adapter are from the 1-GPU run's (shard_base
against plain data parallel: bit for bit). Rewrites the JSON each time, so it holds whatever has run so far."""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess

import torch
from safetensors.torch import load_file

p = argparse.ArgumentParser()
p.add_argument("--work", required=True)
p.add_argument("--nproc", type=int, required=True)
p.add_argument("--device", required=True)
p.add_argument("--steps", type=int, required=True)
p.add_argument("--command", required=True)
p.add_argument("--out", required=True)
p.add_argument("--logs", required=True, help="where multi-gpu-<run>.log are (rank 0 speaks for the group)")
p.add_argument("--show", help="print this run's row")
a = p.parse_args()

RANKS = {"one": 1, "dp": a.nproc, "ep": a.nproc, "shard": a.nproc}  # one rank per GPU (or CPU process)
WHAT = {"one": f"1 rank, grad_accum {a.nproc}", "dp": f"{a.nproc} ranks, data parallel",
        "ep": f"{a.nproc} ranks, expert_parallel = {a.nproc}", "shard": f"{a.nproc} ranks, data parallel, shard_base"}


def records(run):
    path = os.path.join(a.work, run, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    recs = [json.loads(l) for l in open(path)]
    recs = [r for r in recs if "loss" in r and "elapsed_s" in r]
    return recs if len(recs) == a.steps else None


def adapter(run):
    path = os.path.join(a.work, run, "checkpoints", f"step-{a.steps:08d}", "adapter_model.safetensors")
    return load_file(path) if os.path.exists(path) else None


def rel_adapter_diff(x, y):
    """max over tensors of max|x - y| / max|y| (relative to each tensor's scale, as tests/unit/dist_test.cpp)."""
    if x is None or y is None or x.keys() != y.keys():
        return None
    worst = 0.0
    for k in y:
        u, v = x[k].float(), y[k].float()
        worst = max(worst, (u - v).abs().max().item() / max(v.abs().max().item(), 1e-6))
    return worst


runs = {}
base = records("one")
base_adapter = adapter("one")
for run in RANKS:
    log = os.path.join(a.logs, f"multi-gpu-{run}.log")
    recs = records(run) if os.path.exists(log) else None  # this invocation's runs only
    if recs is None:
        continue
    dts = [1e3 * (b["elapsed_s"] - a_["elapsed_s"]) for a_, b in zip(recs, recs[1:]) if a_["step"] >= 5]
    ms = statistics.median(dts)
    tokens = statistics.median(r["tokens"] for r in recs)  # every rank's tokens of the step
    row = {"what": WHAT[run], "ranks": RANKS[run], "ms_per_step": round(ms, 2), "tokens_per_step": tokens,
           "tokens_per_s_per_rank": round(tokens / ms * 1e3 / RANKS[run], 1),
           "peak_memory_gb_rank0": round(max(r["peak_memory_bytes"] for r in recs) / 1e9, 3),
           "losses": [round(r["loss"], 6) for r in recs]}
    # The summary's "base weights ... resident (N bytes)": rank 0's share under expert_parallel / shard_base.
    m = re.search(r" resident \((\d+) bytes\)", open(log).read())
    if m:
        row["base_resident_bytes_rank0"] = int(m.group(1))
    if base is not None and run != "one":
        row["max_rel_loss_diff_vs_one"] = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(recs, base))
        row["max_rel_adapter_diff_vs_one"] = rel_adapter_diff(adapter(run), base_adapter)
    runs[run] = row
if "one" in runs:
    for run in ("dp", "ep", "shard"):
        if run in runs:
            runs[run]["per_rank_efficiency_vs_one"] = round(runs[run]["tokens_per_s_per_rank"] / runs["one"]["tokens_per_s_per_rank"], 4)
if "dp" in runs and "shard" in runs:
    d, s = records("dp"), records("shard")
    runs["shard"]["max_abs_loss_diff_vs_dp"] = max(abs(x["loss"] - y["loss"]) for x, y in zip(s, d))
    x, y = adapter("shard"), adapter("dp")
    runs["shard"]["adapter_bitwise_equal_to_dp"] = x is not None and y is not None and x.keys() == y.keys() and all(
        torch.equal(x[k], y[k]) for k in y)

try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.split("\n")[0]
except OSError:
    gpu = "cpu"
res = {"device": gpu if a.device == "cuda" else "cpu (Gloo)", "ranks": a.nproc, "date": datetime.date.today().isoformat(),
       "command": a.command, "steps": a.steps, "timed": "median step over steps 6..", "runs": runs}
json.dump(res, open(a.out, "w"), indent=1)
if a.show in runs:
    row = runs[a.show]
    print(f"{a.show:>5}: {row['what']}: {row['ms_per_step']} ms/step, {row['tokens_per_s_per_rank']} tokens/s per rank, "
          f"peak {row['peak_memory_gb_rank0']} GB (rank 0)"
          + "".join(f", {k} {row[k]}" for k in row if k.startswith(("max_", "per_rank", "adapter_bitwise", "base_"))))
