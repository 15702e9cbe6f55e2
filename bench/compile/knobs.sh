#!/usr/bin/env bash
# The [compile] knob table (issue 22): for each model, eager vs each allow-listed knob alone vs the useful knobs
# together, a fresh process per condition and seed, STEPS steps each; the median step time of the steps after the
# first WARM (eager warm-up, graph capture, tuning) and the peak memory. Writes $OUT/compile-knobs-<model>.json
# and prints a markdown table; every row names its exact --set arguments.
#   bash bench/compile/knobs.sh [moe] [dense]     (after a build into /tmp/axbuild; the dense model is the one
#                                                   bench/train_step/run.sh dense makes: run that first)
# SEEDS (default "1 2"), STEPS (default 60), WARM (default 10), CONDS (default: all below) select the work.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ax=${AXENGINE_BIN:-/tmp/axbuild/bin/axengine}
work=${AX_BENCH_WORK:-/tmp/ax-train-bench}
out=${OUT:-/tmp}; mkdir -p "$out"
seeds=(${SEEDS:-1 2}); steps=${STEPS:-60}; warm=${WARM:-10}
models=("$@"); [ ${#models[@]} -gt 0 ] || models=(moe)
declare -A cond=(
  [eager]=""
  [cuda_graphs]="compile.enabled=true compile.cuda_graphs=true compile.static_shapes=true"
  [autotune_gemm]="compile.enabled=true compile.autotune_gemm=true"
  [autotune_kernels]="compile.enabled=true compile.autotune_kernels=true"
  [tf32]="compile.enabled=true compile.tf32=true"
  [cudnn_benchmark]="compile.enabled=true compile.cudnn_benchmark=true compile.static_shapes=true"
  [deterministic]="compile.enabled=true compile.deterministic=true"
  [graphs+autotune]="compile.enabled=true compile.cuda_graphs=true compile.static_shapes=true compile.autotune_gemm=true compile.autotune_kernels=true"
)
order=(${CONDS:-eager cuda_graphs autotune_gemm autotune_kernels tf32 cudnn_benchmark deterministic graphs+autotune})
[ -f "$work/model/config.json" ] || "$ax" init-model --preset bench-qwen3-moe-0.9b --out "$work/model" --seed 1
[ -f "$work/data/train.jsonl" ] || "$ax" make-data --task arithmetic --digits 3 --train 12000 --eval 16 --out "$work/data"
for m in "${models[@]}"; do
  case $m in
    moe) cfg=$here/../train_step/qwen3-moe-0.9b.toml ;;
    dense) cfg=$here/../train_step/qwen3-8b-dense.toml
           [ -f "$work/dense-model/config.json" ] || { echo "knobs.sh: no $work/dense-model (run bench/train_step/run.sh dense first)" >&2; exit 2; } ;;
    *) echo "knobs.sh: unknown model '$m' (moe, dense)" >&2; exit 2 ;;
  esac
  rows=$out/compile-knobs-$m.rows; : > "$rows"
  # The tuning caches start empty, so autotune rows include their tuning in the warm-up (as a first run would).
  export XDG_CACHE_HOME=$work/knob-cache-$m; rm -rf "$XDG_CACHE_HOME"
  for c in "${order[@]}"; do
    for s in "${seeds[@]}"; do
      dir=$work/knob-$m-$c-$s; rm -rf "$dir"
      sets=(--set "train.max_steps=$steps" --set train.log_every=1 --set eval.every_steps=0 --set "run.seed=$s"
            --set "run.output_dir=$dir")
      for kv in ${cond[$c]}; do sets+=(--set "$kv"); done
      echo "[knobs.sh $(date +%T)] $m $c seed $s"
      rc=0; timeout ${RUN_TIMEOUT:-240} "$ax" run --config "$cfg" "${sets[@]}" > "$dir.log" 2>&1 || rc=$?
      reason=$(grep -m1 -o "compile: .*" "$dir.log" | head -c 160 || true)
      python3 - "$dir/metrics.jsonl" "$m" "$c" "$s" "$rc" "$warm" "${cond[$c]}" "$reason" >> "$rows" <<'PY'
import json, statistics as st, sys
path, m, c, s, rc, warm, sets, note = sys.argv[1:]
row = {"model": m, "condition": c, "seed": int(s), "rc": int(rc), "set": sets, "note": note}
try:
    r = [json.loads(l) for l in open(path) if l.strip()]
    r = [x for x in r if "step" in x and "loss" in x]
    t = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(r[int(warm):], r[int(warm) + 1:])]
    row.update(steps=len(r), timed=len(t), median_ms=round(1000 * st.median(t), 3),
               peak_gb=round(max(x.get("peak_memory_bytes", 0) for x in r) / 1e9, 3), final_loss=r[-1]["loss"])
except Exception as e:  # a failed run is a row too: the table says it failed
    row["error"] = repr(e)[:200]
print(json.dumps(row))
PY
    done
  done
  python3 - "$rows" "$out/compile-knobs-$m.json" "$m" "bash bench/compile/knobs.sh ${models[*]} (SEEDS='${seeds[*]}' STEPS=$steps WARM=$warm)" <<'PY'
import json, sys, datetime, statistics as st, subprocess
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
try: dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().splitlines()[0]
except Exception: dev = "unknown"
base = [r["median_ms"] for r in rows if r["condition"] == "eager" and "median_ms" in r]
b = st.median(base) if base else None
print(f"\n{sys.argv[3]}: median ms/step over seeds (ratio to eager), peak GB")
print("| condition | seeds ms | median ms | vs eager | peak GB | note |\n|---|---|---|---|---|---|")
table = []
for c in dict.fromkeys(r["condition"] for r in rows):
    rs = [r for r in rows if r["condition"] == c]; ok = [r["median_ms"] for r in rs if "median_ms" in r]
    med = st.median(ok) if ok else None
    ratio = round(med / b, 4) if (med and b) else None
    peak = max((r.get("peak_gb", 0) for r in rs), default=0)
    note = "; ".join(sorted({r.get("note", "") or r.get("error", "") for r in rs if r.get("note") or r.get("error")}))[:120]
    table.append(dict(condition=c, seed_ms=ok, median_ms=med, ratio_vs_eager=ratio, peak_gb=peak, note=note))
    print(f"| {c} | {', '.join(f'{x:.2f}' for x in ok)} | {med if med is None else f'{med:.2f}'} | {ratio} | {peak} | {note} |")
json.dump(dict(bench="compile knobs", model=sys.argv[3], device=dev, date=datetime.date.today().isoformat(),
               command=sys.argv[4], table=table, runs=rows), open(sys.argv[2], "w"), indent=1)
PY
done
