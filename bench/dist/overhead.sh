#!/usr/bin/env bash
# The cost of the process group itself, on ONE GPU: the same training run (bench/train_step's MoE config by
# default) once alone and once as a 1-rank NCCL group (`axengine launch --nproc 1`: the bucketed gradient
# all-reduce, the loss all-reduce and the checkpoint barriers all run, over one rank). Goal: <= 2 % per step.
# Prints both medians and the overhead; writes $OUT/dist-overhead.json.
#   bash bench/dist/overhead.sh [CONFIG.toml]      (after scripts/gpu-test.sh built /tmp/axbuild)
# AX_SET="k=v ..." adds --set overrides to both runs; STEPS (default 40) steps each, the first 10 not timed.
# ROUNDS (default 3) alternates the two runs that many times: one pair of processes differs by several percent
# from the next on the same host (measured: -11 % and +4.5 % in two back-to-back pairs), more than the 2 % goal,
# so the overhead is the ratio of the medians over rounds, with each round's ratio printed beside it.
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

rounds=${ROUNDS:-3}
for ((i = 1; i <= rounds; i++)); do
  echo "[overhead.sh] round $i: alone"
  rm -rf "$work/dist-alone"
  "$ax" run --config "$cfg" "${extra[@]}" --set "run.output_dir=$work/dist-alone" > "$out/dist-overhead-alone.log" 2>&1
  cp "$work/dist-alone/metrics.jsonl" "$work/alone-$i.jsonl"
  echo "[overhead.sh] round $i: 1-rank NCCL group"
  rm -rf "$work/dist-group1"
  "$ax" launch --nproc 1 -- run --config "$cfg" "${extra[@]}" --set "run.output_dir=$work/dist-group1" \
    --set distributed.backend=nccl > "$out/dist-overhead-group1.log" 2>&1
  grep -q "distributed: rank 0 of 1 (local rank 0), nccl" "$out/dist-overhead-group1.log" \
    || { echo "overhead.sh: the group run did not join an NCCL group (see $out/dist-overhead-group1.log)" >&2; exit 1; }
  cp "$work/dist-group1/metrics.jsonl" "$work/group1-$i.jsonl"
done

python3 - "$work" "$rounds" "$out/dist-overhead.json" <<'PY'
import json, statistics, sys
work, rounds, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def step_ms(path):
    t = [r["elapsed_s"] for r in map(json.loads, open(path)) if "loss" in r]
    d = [1000 * (b - a) for a, b in zip(t, t[1:])][9:]  # steps 11.. : after allocator and kernel warm-up
    return statistics.median(d), len(d)
alone = [step_ms(f"{work}/alone-{i}.jsonl")[0] for i in range(1, rounds + 1)]
group = [step_ms(f"{work}/group1-{i}.jsonl")[0] for i in range(1, rounds + 1)]
n = step_ms(f"{work}/alone-1.jsonl")[1]
a, g = statistics.median(alone), statistics.median(group)
res = {"alone_ms": a, "group1_nccl_ms": g, "overhead_pct": 100 * (g / a - 1), "timed_steps": n, "rounds": rounds,
       "alone_ms_per_round": alone, "group1_ms_per_round": group,
       "overhead_pct_per_round": [100 * (y / x - 1) for x, y in zip(alone, group)]}
json.dump(res, open(dst, "w"), indent=1)
print(f"median step over {rounds} rounds: alone {a:.2f} ms, 1-rank NCCL group {g:.2f} ms: overhead "
      f"{res['overhead_pct']:+.2f} % (goal <= 2 %); per round: "
      + ", ".join(f"{x:.2f}/{y:.2f}" for x, y in zip(alone, group)) + f" ms over {n} steps each")
PY
