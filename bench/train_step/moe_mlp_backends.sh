#!/usr/bin/env bash
# The MoE training step (qwen3-moe-0.9b.toml, the bench model run.sh uses) with each moe.mlp backend first in
# [kernels] moe_mlp, in alternating rounds in this one invocation, so the ratio is taken on the same machine
# at the same time: writes $OUT/moe-mlp-backends.json (median ms/step over steps >= 5 of each run, the median
# over rounds, tokens/s, peak memory, final loss, device, date, command).
# On the GPU machine, after a build into /tmp/axbuild:  ROUNDS=2 bash bench/train_step/moe_mlp_backends.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ax=${AXENGINE_BIN:-/tmp/axbuild/bin/axengine}
work=${AX_BENCH_WORK:-/tmp/ax-train-bench}
out=${OUT:-/tmp}; mkdir -p "$out"
rounds=${ROUNDS:-2}
lists=('["sonicmoe", "scattermoe", "reference"]' '["scattermoe", "reference"]')
[ -f "$work/model/config.json" ] || "$ax" init-model --preset "${MOE_PRESET:-bench-qwen3-moe-0.9b}" --out "$work/model" --seed 1
[ -f "$work/data/train.jsonl" ] || "$ax" make-data --task arithmetic --digits 3 --train 12000 --eval 16 --out "$work/data"
logs=$work/logs/moe-mlp; rm -rf "$logs"; mkdir -p "$logs"
for ((r = 0; r < rounds; ++r)); do
  for i in "${!lists[@]}"; do
    run=$work/run-mlp-$i
    rm -rf "$run"
    "$ax" run --config "$here/qwen3-moe-0.9b.toml" --set "run.output_dir=$run" --set "kernels.moe_mlp=${lists[$i]}" \
      > "$logs/run-$i-$r.log" 2>&1 || { echo "moe_mlp_backends.sh: run $i round $r failed:"; tail -n 20 "$logs/run-$i-$r.log"; exit 1; }
    cp "$run/metrics.jsonl" "$logs/metrics-$i-$r.jsonl"
  done
done
python3 - "$out/moe-mlp-backends.json" "$logs" "$rounds" "${lists[@]}" <<'PY'
import datetime, json, re, statistics, subprocess, sys
path, logs, rounds, lists = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
rows = []
for i, lst in enumerate(lists):
    per_round, peak, loss, chosen = [], None, None, None
    for r in range(rounds):
        recs = [json.loads(l) for l in open(f"{logs}/metrics-{i}-{r}.jsonl") if '"loss"' in l and '"elapsed_s"' in l]
        dts = [(b["elapsed_s"] - a["elapsed_s"]) * 1e3 for a, b in zip(recs, recs[1:]) if a["step"] >= 5]
        per_round.append(statistics.median(dts))
        text = open(f"{logs}/run-{i}-{r}.log").read()
        m = re.search(r"peak memory\s+([\d.]+)\s*(GiB|MiB)", text)
        peak = round(float(m.group(1)) * (2**30 if m.group(2) == "GiB" else 2**20) / 1e9, 2) if m else None
        loss = recs[-1]["loss"]
    rows.append({"moe_mlp": json.loads(lst), "ms_per_step_rounds": [round(x, 2) for x in per_round],
                 "ms_per_step": round(statistics.median(per_round), 2), "peak_memory_gb": peak, "final_loss": loss})
base = rows[-1]["ms_per_step"]
for r in rows: r["ratio_vs_scattermoe"] = round(r["ms_per_step"] / base, 3)
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
res = {"bench": "MoE training step (bench/train_step/qwen3-moe-0.9b.toml) by moe.mlp backend", "device": gpu,
       "date": datetime.date.today().isoformat(), "command": f"ROUNDS={rounds} bash bench/train_step/moe_mlp_backends.sh",
       "rows": rows}
json.dump(res, open(path, "w"), indent=1)
print(json.dumps(res, indent=1))
PY
