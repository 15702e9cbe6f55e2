#!/usr/bin/env python3
"""One bench JSON for one model: axengine's row from its run (metrics.jsonl + log), the HF peer's rows
(hf_peer.py's JSON), axengine's step time as a ratio of each peer's, and the launches/syncs line of axengine's
profiled run.

QLoRA (a model named <model>-nf4; --ax-bf16-log/--ax-bf16-metrics given): the timed axengine run has its base
in nf4 (row `axengine+nf4`), the bf16 LoRA run of the same model is the row `axengine`, the peer's rows are
HF + peft + bitsandbytes (`hf+peft+bnb`). The nf4 row carries the ratios to both (ax QLoRA / ax bf16 LoRA,
ax QLoRA / HF QLoRA) and every row the frozen base's bytes and bytes/param (axengine: the run log's
`base weights` line; the peer: its own count, hf_peer.py base_stats).

The workloads of issue 41 (sft-*, long-*) have several peers (--peer once per hf_peer.py process: eager and
compile, then the liger ones): every row gets `mfu` (the step's matrix FLOPs from flops.py over its median step
time and the GEMM rate the peer measured in this run), and axengine's row its ratios to the strongest peer (the
fastest peer row that ran). Besides the JSON, a Markdown table of the same figures goes next to it (OUT.md).

usage: summarize.py --name moe --config X.toml --ax-log L --ax-metrics M [--ax-profile SUMMARY] --peer P.json
                    [--peer P2.json] [--ax-bf16-log L --ax-bf16-metrics M] [--warmup 5] --command CMD --out OUT.json
"""
import argparse
import datetime
import json
import re
import statistics
import subprocess
import tomllib

# The goals ("fused_attn plugin and a fast dense path"), as ratios of axengine to the peer.
GOALS = {
    "moe": {"ratio_vs_hf_eager_max": 0.6, "ratio_vs_hf_compile_max": 1.0, "peak_memory_vs_hf_eager_max": 1.0,
            "kernel_launches_per_step_max": 1500, "host_syncs_per_step_max": 0},
    "dense": {"ratio_vs_hf_eager_max": 0.5},
    # Issue 41 (H200, same-run ratios): against the strongest HF-stack peer and HF+peft eager.
    "sft-moe": {"ratio_vs_strongest_max": 0.6, "ratio_vs_hf_eager_max": 0.5},
    "sft-dense": {"ratio_vs_strongest_max": 0.7, "ratio_vs_hf_eager_max": 0.5, "mfu_min": 0.65},
    "long-dense-32k": {"peak_memory_vs_strongest_max": 0.6, "tokens_per_s_vs_strongest_min": 1.3,
                       "note": "or the strongest peer runs out of memory"},
}
# QLoRA (issue 18): the frozen base at most 0.6 bytes per packed parameter, the step within 1.25x of bf16 LoRA.
QLORA_GOALS = {"base_packed_bytes_per_param_max": 0.6, "ratio_vs_axengine_bf16_max": 1.25}
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
# Skip steps 1..5 (allocator and kernel warm-up): the same 5 the peer's eager run skips (--warmup: the long runs
# skip 3 of their 8 steps on both sides).
WARMUP = 5


def base_weights(text):
    """The run log's summary line (core/src/train/run.cpp), e.g.
    '  base weights    nf4: 119.4 KiB resident (122296 bytes), peak 151.2 KiB (154808 bytes) while loading;
    73728 of 94528 parameters packed at 0.530 bytes/param'. Bytes per parameter over the whole base too: the
    embeddings and lm_head stay in the compute dtype, so it is above the packed figure."""
    m = re.search(r"base weights +(\w+): [^(]*\((\d+) bytes\), peak [^(]*\((\d+) bytes\) while loading"
                  r"(?:; (\d+) of (\d+) parameters packed at ([\d.]+) bytes/param)?", text)
    if not m:
        return None
    fmt, resident, peak, packed, params, per = m.groups()
    out = {"format": fmt, "bytes": int(resident), "peak_bytes": int(peak)}
    if params:
        out.update(params=int(params), packed_params=int(packed), packed_bytes_per_param=float(per),
                   bytes_per_param=round(int(resident) / int(params), 4),
                   peak_bytes_per_param=round(int(peak) / int(params), 4))
    return out


def axengine_row(log, metrics, B, S, system="axengine"):
    recs = [json.loads(l) for l in open(metrics) if '"loss"' in l and '"elapsed_s"' in l]
    dts = [(b["elapsed_s"] - a["elapsed_s"]) * 1e3 for a, b in zip(recs, recs[1:]) if a["step"] >= WARMUP]
    ms = statistics.median(dts)
    text = open(log).read()
    m = re.search(r"peak (?:CUDA )?memory\s+([\d.]+)\s*(TiB|GiB|MiB|KiB|B)\b", text)
    p = re.search(r"trainable tensors, (\d+) parameters", text)
    return {"system": system, "ms_per_step": round(ms, 2), "tokens_per_s": round(B * S / ms * 1e3),
            "peak_memory_gb": round(float(m.group(1)) * UNITS[m.group(2)] / 1e9, 2) if m else None,
            "steps_timed": len(dts), "warmup_steps": WARMUP, "timed_steps": [WARMUP, WARMUP + len(dts)], "first_loss": recs[0]["loss"], "final_loss": recs[-1]["loss"],
            "trainable_params": int(p.group(1)) if p else None, "base_weights": base_weights(text)}, \
        [r["tokens"] for r in recs]


def profile_line(path):
    """The profiler's per-scope counts (core/src/profile/profiler.cpp): the line
    '    axengine::step: 3x, 4692 launches (1564.0 each), 0 host syncs' gives the kernel launches and host syncs
    of one whole training step (forward, backward, clipping, optimizer). The host syncs of the loop's reading of
    the previous step's results (scope axengine::read_step, outside the step) are reported beside them."""
    if not path:
        return {"line": None, "note": "not profiled (run.sh profiles the MoE model; PROFILE_DENSE=1 the dense one)"}
    try:
        text = open(path).read()
    except OSError:
        return {"line": None, "note": f"{path} missing: the profiled run failed"}
    scope = r"    axengine::{}: (\d+)x, (\d+) launches \(([\d.]+) each\), (\d+) host syncs"
    m = re.search(scope.format("step"), text)
    if not m:
        return {"line": None, "note": "this axengine's profile summary has no 'axengine::step' scope line"}
    k, n, _, s = m.groups()
    k, n, s = int(k), int(n), int(s)
    out = {"line": m.group(0).strip(), "kernel_launches_per_step": round(n / k) if k else None,
           "host_syncs_per_step": round(s / k, 2) if k else None}
    r = re.search(scope.format("read_step"), text)
    if r:
        out["read_step_line"] = r.group(0).strip()
        out["host_syncs_per_read_step"] = round(int(r.group(4)) / int(r.group(1)), 2) if int(r.group(1)) else None
    return out


def device_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, check=True).stdout.splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "cpu"


def ratio(a, b, key):
    return round(a[key] / b[key], 3) if b and a.get(key) and b.get(key) else None


def add_mfu(row, per_step, rate):
    """MFU of a row from the step's matrix FLOPs (flops.py, per step) over its timed steps' range."""
    lo, hi = row.get("timed_steps") or (None, None)
    if row.get("ms_per_step") and per_step and rate and lo is not None and per_step[lo:hi]:
        f = statistics.fmean(per_step[lo:hi])
        row["matrix_tflop_per_step"] = round(f / 1e12, 4)
        row["mfu"] = round(f / (row["ms_per_step"] / 1e3) / rate, 4)


def markdown(res):
    """The result as a Markdown table, with where, when and how it was measured."""
    fmt = lambda v: "" if v is None else (f"{v:.3f}" if isinstance(v, float) and v < 10 else str(v))  # noqa: E731
    lines = [f"# {res['bench']}", "", f"- device: {res['device']}", f"- date: {res['date']}",
             f"- command: `{res['command']}`", f"- versions: {json.dumps(res['peer'].get('versions', {}))}", "",
             "| system | ms/step | tokens/s | peak GB | MFU | first loss | note |", "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        note = r.get("error") or r.get("skipped") or r.get("note") or r.get("attention") or ""
        lines.append("| " + " | ".join([r["system"]] + [fmt(r.get(k)) for k in
                     ("ms_per_step", "tokens_per_s", "peak_memory_gb", "mfu", "first_loss")] + [note[:120]]) + " |")
    ax = next((r for r in res["rows"] if "ratio_vs_hf_eager" in r), res["rows"][0])
    keys = [k for k in ax if k.startswith(("ratio_vs", "peak_memory_vs", "tokens_per_s_vs"))]
    lines += ["", "axengine: " + ", ".join(f"{k} {ax[k]}" for k in keys if ax[k] is not None)
              + (f" (strongest peer: {res['strongest_peer']})" if res.get("strongest_peer") else ""),
              f"same_tokens_per_step: {json.dumps(res['same_tokens_per_step'])}",
              f"goals: {json.dumps(res['goals'])}" if res.get("goals") else "", "", res["method"], ""]
    return "\n".join(lines)


def main():
    global WARMUP
    ap = argparse.ArgumentParser()
    for a in ("name", "config", "ax-log", "ax-metrics", "command", "out"):
        ap.add_argument("--" + a, required=True)
    ap.add_argument("--peer", action="append", required=True, help="an hf_peer.py JSON (several: their rows in order)")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="axengine's steps left out of the timing")
    ap.add_argument("--ax-profile", default="", help="profile/summary.txt of the profiled run; none: not profiled")
    ap.add_argument("--ax-bf16-log", default="", help="QLoRA: the log of the bf16 LoRA run of the same model")
    ap.add_argument("--ax-bf16-metrics", default="", help="QLoRA: its metrics.jsonl")
    args = ap.parse_args()
    WARMUP = args.warmup
    qlora = bool(args.ax_bf16_log)
    cfg = tomllib.load(open(args.config, "rb"))
    peers = []
    for path in args.peer:
        try:
            peers.append(json.load(open(path)))
        except (OSError, ValueError):
            peers.append({"rows": [], "note": f"{path}: the peer wrote no result (see its log)"})
    peer = dict(peers[0], rows=[r for p in peers for r in p["rows"]])
    flops = next((p["step_matrix_flops"] for p in peers if p.get("step_matrix_flops")), None)
    rate = max((p["gemm"]["flops_per_s"] for p in peers if p.get("gemm")), default=None)
    # The batch shape the peer ran (it reads the config; a test may override both sides), else the config's.
    B, S = peer.get("batch") or (cfg["train"]["micro_batch_size"], cfg["data"]["sequence_len"])

    def ax_row(log, metrics, system):
        try:
            return axengine_row(log, metrics, B, S, system)
        except (OSError, ValueError, statistics.StatisticsError, IndexError):
            return {"system": system, "ms_per_step": None, "note": f"no timed steps (see {log})"}, []

    ax, ax_tokens = ax_row(args.ax_log, args.ax_metrics, "axengine+nf4" if qlora else "axengine")
    rows = [ax] + peer["rows"]
    by = {r["system"]: r for r in peer["rows"]}
    hf = "hf+peft+bnb" if qlora else "hf+peft"
    ax["ratio_vs_hf_eager"] = ratio(ax, by.get(hf), "ms_per_step")
    ax["ratio_vs_hf_compile"] = ratio(ax, by.get(hf + "+compile"), "ms_per_step")
    ax["peak_memory_vs_hf_eager"] = ratio(ax, by.get(hf), "peak_memory_gb")
    add_mfu(ax, flops, rate)
    for r in peer["rows"]:  # each process measured the rate; all rows use the same (the highest)
        if r.get("matrix_tflop_per_step") and r.get("ms_per_step") and rate:
            r["mfu"] = round(r["matrix_tflop_per_step"] * 1e12 / (r["ms_per_step"] / 1e3) / rate, 4)
    ran = [r for r in peer["rows"] if r.get("ms_per_step")]
    strongest = min(ran, key=lambda r: r["ms_per_step"]) if ran else None
    if any("liger" in r["system"] for r in peer["rows"]):  # issue 41's workloads: the strongest peer's ratios
        ax["ratio_vs_strongest"] = ratio(ax, strongest, "ms_per_step")
        ax["peak_memory_vs_strongest"] = ratio(ax, strongest, "peak_memory_gb")
        ax["tokens_per_s_vs_strongest"] = ratio(ax, strongest, "tokens_per_s")
    if qlora:
        bf16, _ = ax_row(args.ax_bf16_log, args.ax_bf16_metrics, "axengine")
        rows.insert(0, bf16)
        ax["ratio_vs_axengine_bf16"] = ratio(ax, bf16, "ms_per_step")
        ax["peak_memory_vs_axengine_bf16"] = ratio(ax, bf16, "peak_memory_gb")
        bw, nw = bf16.get("base_weights"), ax.get("base_weights")
        if bw and nw and "params" in nw and "params" not in bw:  # a dense base logs no count: the same model's
            bw.update(params=nw["params"], bytes_per_param=round(bw["bytes"] / nw["params"], 4),
                      peak_bytes_per_param=round(bw["peak_bytes"] / nw["params"], 4))
        for r in peer["rows"]:  # the peer's base, beside axengine's on each row
            r["base_weights"] = peer.get("base")
    # The same tokens: every step both ran trained on the same number of real (non-padding) tokens.
    same = {r["system"]: r["step_real_tokens"][:len(ax_tokens)] == ax_tokens[:len(r["step_real_tokens"])]
            for r in peer["rows"] if "step_real_tokens" in r}
    for r in peer["rows"]:
        r.pop("step_real_tokens", None)
    dev = device_name()
    goals = GOALS.get(args.name, {})
    if qlora:
        goals = dict(QLORA_GOALS, note="base_packed_bytes_per_param: the axengine+nf4 row's base_weights."
                     "packed_bytes_per_param (the packed projections, scales included); its bytes_per_param counts "
                     "the bf16 embeddings and lm_head too")
    res = {
        "bench": f"train_step {args.name}: {args.config.rsplit('/', 1)[-1]}, batch {B}x{S} packed tokens, "
                 + ("base nf4 (QLoRA), compute bf16" if qlora else "bf16") +
                 f", LoRA r={cfg['lora'].get('r', 16)} on {', '.join(cfg['lora'].get('targets', []))}",
        "device": dev, "device_kind": dev.lower().replace(" ", "-"),
        "date": datetime.date.today().isoformat(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "command": args.command,
        "rows": rows,
        "axengine_profile": profile_line(args.ax_profile),
        "peer": {k: v for k, v in peer.items() if k not in ("rows", "step_matrix_flops")},
        "same_tokens_per_step": same,
        "goals": goals,
        "method": "ms_per_step: median wall time of the steps after warm-up, each ending with its GPU work done "
                  "(the peer synchronises; axengine's metrics.jsonl elapsed_s); tokens_per_s counts the B x S "
                  "slots of a step, padding included; peak_memory_gb: the CUDA caching allocator's peak allocated "
                  "bytes (axengine: whole run; peer eager: whole process, compile: from its first step); ratios "
                  "are axengine / peer, lower is better."
                  + (" QLoRA: ratio_vs_axengine_bf16 is the nf4 run over the bf16 LoRA run of the same model; "
                     "base_weights.bytes counts every tensor of the frozen base, bytes_per_param over all its "
                     "parameters, packed_bytes_per_param over the 4-bit ones." if qlora else ""),
    }
    if len(peers) > 1:
        res["peers"] = [{k: v for k, v in p.items() if k not in ("rows", "step_matrix_flops")} for p in peers]
    if strongest and "ratio_vs_strongest" in ax:
        res["strongest_peer"] = strongest["system"]
    if flops:
        res["matrix_flops"] = {"per_step": flops, "gemm_flops_per_s": rate,
                               "formula": "bench/train_step/flops.py (docstring); README.md, 'MFU'",
                               "mfu": "a row's timed steps' mean matrix FLOPs / its median step time / gemm_flops_per_s"}
    json.dump(res, open(args.out, "w"), indent=1)
    open(args.out.rsplit(".json", 1)[0] + ".md", "w").write(markdown(res))
    print(json.dumps({k: v for k, v in res.items() if k != "matrix_flops"}, indent=1))


if __name__ == "__main__":
    main()
