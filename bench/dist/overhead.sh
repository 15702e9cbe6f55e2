#!/usr/bin/env bash
# The cost of the process group itself, on ONE GPU: the same training run (bench/train_step's MoE config by
# default) once alone and once as a 1-rank NCCL group (`axengine launch --nproc 1`: the bucketed gradient
# all-reduce, the loss all-reduce and the checkpoint barriers all run, over one rank). Goal: <= 2 % per step.
# Prints both medians and the overhead; writes $OUT/dist-overhead.json.
#   bash bench/dist/overhead.sh [CONFIG.toml]      (after scripts/gpu-test.sh built /tmp/axbuild)
# AX_SET="k=v ..." adds --set overrides to both runs; STEPS (default 40) steps each, the first 10 not timed.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ax=${AXENGINE_BIN:-/tmp/axbuild/bin/axengine}
cfg=${1:-$here/../train_step/qwen3-moe-0.9b.toml}
work=${AX_BENCH_WORK:-/tmp/ax-train-bench}
out=${OUT:-/tmp}; mkdir -p "$out"
steps=${STEPS:-40}
extra=(--set "train.max_steps=$steps" --set train.log_every=1 --set eval.every_steps=0); for kv in ${AX_SET:-}; do extra+=(--set "$kv"); done
# The model and data the train_step bench uses (the default config points there).
[ -f "$work/model/config.json" ] || "$ax" init-model --preset "${MOE_PRESET:-bench-qwen3-moe-0.9b}" --out "$work/model" --seed 1
[ -f "$work/data/train.jsonl" ] || "$ax" make-data --task arithmetic --digits 3 --train 12000 --eval 16 --out "$work/data"

echo "[overhead.sh] alone"
rm -rf "$work/dist-alone"
"$ax" run --config "$cfg" "${extra[@]}" --set "run.output_dir=$work/dist-alone" > "$out/dist-overhead-alone.log" 2>&1
echo "[overhead.sh] 1-rank NCCL group"
rm -rf "$work/dist-group1"
"$ax" launch --nproc 1 -- run --config "$cfg" "${extra[@]}" --set "run.output_dir=$work/dist-group1" \
  --set distributed.backend=nccl > "$out/dist-overhead-group1.log" 2>&1
grep -q "distributed: rank 0 of 1 (local rank 0), nccl" "$out/dist-overhead-group1.log" \
  || { echo "overhead.sh: the group run did not join an NCCL group (see $out/dist-overhead-group1.log)" >&2; exit 1; }

python3 - "$work/dist-alone/metrics.jsonl" "$work/dist-group1/metrics.jsonl" "$out/dist-overhead.json" <<'PY'
import json, statistics, sys
def step_ms(path):
    t = [r["elapsed_s"] for r in map(json.loads, open(path)) if "loss" in r]
    d = [1000 * (b - a) for a, b in zip(t, t[1:])][9:]  # steps 11.. : after allocator and kernel warm-up
    return statistics.median(d), len(d)
alone, n = step_ms(sys.argv[1]); group, _ = step_ms(sys.argv[2])
res = {"alone_ms": alone, "group1_nccl_ms": group, "overhead_pct": 100 * (group / alone - 1), "timed_steps": n}
json.dump(res, open(sys.argv[3], "w"), indent=1)
print(f"median step: alone {alone:.2f} ms, 1-rank NCCL group {group:.2f} ms: overhead {res['overhead_pct']:+.2f} % "
      f"over {n} steps (goal <= 2 %)")
PY
