#!/usr/bin/env bash
# The MM-CPT step benchmark (issue 21): a Qwen2.5-VL-3B-shaped model (make_vl_model.py) trained with LoRA on a
# generated corpus of one 640x480 JPEG + caption per row (scripts/make-mm-corpus.py), one epoch, on the GPU;
# then a profiled run of 3 steps. Writes $OUT/mm-cpt-step.json: ms/step, tokens/s, images/s (tokens/s times the
# corpus' images per token: every row is trained once in the epoch), the start-up time (model load, and the
# decode + processing of every image: map-style rows are prepared before the first step), peak memory,
# launches and host syncs per step, and the GPU's idle time within the profiled steps.
#   bash bench/mm_cpt/run.sh        (after a build into /tmp/axbuild; ROWS=1024 rows by default)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ax=${AXENGINE_BIN:-/tmp/axbuild/bin/axengine}
py=${PYTHON:-python3}
work=/tmp/ax-mm-bench
out=${OUT:-/tmp}; mkdir -p "$out" "$work"
rows=${ROWS:-1024}
cfg=$here/qwen2_5-vl-3b-mm-cpt.toml
stamp() { echo "[mm run.sh $(date +%T)] $*"; }
[ -f "$work/tiny-vl/config.json" ] || "$ax" init-model --preset tiny-qwen2_5-vl --out "$work/tiny-vl" --seed 1
stamp model; "$py" "$here/make_vl_model.py" --out "$work/vl-3b" --tokenizer-from "$work/tiny-vl"
[ -f "$work/corpus/train.jsonl" ] || { stamp corpus; "$py" "$here/../../scripts/make-mm-corpus.py" "$work/corpus" \
  --rows "$rows" --size 640x480 --one-image --jpeg; }
stamp "axengine, one epoch"
rm -rf "$work/run"
t0=$(date +%s.%N)
"$ax" run --config "$cfg" --set data.cache=false > "$work/train.log" 2>&1 || { tail -20 "$work/train.log"; exit 1; }
t1=$(date +%s.%N)
cp "$work/run/metrics.jsonl" "$work/epoch-metrics.jsonl"
stamp "axengine, profiled"
rm -rf "$work/run"
"$ax" run --config "$cfg" --set data.cache=false --set train.max_steps=13 --set profile.start_step=10 --set profile.steps=3 \
  --set profile.top=30 > "$work/profile.log" 2>&1 || { tail -20 "$work/profile.log"; exit 1; }
cp "$work/run/profile/summary.txt" "$out/mm-cpt-profile-summary.txt"
"$py" - "$work/epoch-metrics.jsonl" "$out/mm-cpt-profile-summary.txt" "$work/corpus/train.jsonl" "$t0" "$t1" \
  "$out/mm-cpt-step.json" <<'PY'
import datetime, json, re, statistics as st, subprocess, sys
metrics, prof, corpus, t0, t1, dst = sys.argv[1:]
r = [json.loads(l) for l in open(metrics) if l.strip()]
r = [x for x in r if "step" in x and "loss" in x]
dt = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(r[5:], r[6:])]
images = sum(len(json.loads(l)["images"]) for l in open(corpus) if l.strip())
tokens = sum(x["tokens"] for x in r)
ms = st.median(dt) * 1000
tok_step = st.median(x["tokens"] for x in r[6:])
p = open(prof).read()
wall = float(re.search(r"profile: wall ([\d.]+) ms", p).group(1))
idle = re.search(r"GPU idle between its first and last kernel: ([\d.]+) ms", p)
line = re.search(r"axengine::step: .*", p)
try: dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().splitlines()[0]
except Exception: dev = "unknown"
res = dict(bench="mm_cpt step: Qwen2.5-VL-3B shape (random init, bf16), LoRA r=16 on the LM's linears, frozen vision tower, "
                 "rows of one 640x480 JPEG (391 image tokens) + caption, packed 2 x 4096 tokens",
           device=dev, date=datetime.date.today().isoformat(), command="bash bench/mm_cpt/run.sh",
           steps=len(r), steps_timed=len(dt), ms_per_step=round(ms, 2), tokens_per_step=tok_step,
           tokens_per_s=round(tok_step / ms * 1000), images_per_s=round(tok_step / ms * 1000 * images / tokens, 1),
           corpus_images=images, epoch_tokens=tokens, final_loss=r[-1]["loss"], first_loss=r[0]["loss"],
           startup_s=round(float(t1) - float(t0) - r[-1]["elapsed_s"], 1),
           peak_memory_gb=round(max(x.get("peak_memory_bytes", 0) for x in r) / 1e9, 2),
           profile_line=line.group(0) if line else None, profiled_wall_ms=wall,
           gpu_idle_ms=float(idle.group(1)) if idle else None,
           gpu_idle_share=round(float(idle.group(1)) / wall, 4) if idle else None)
json.dump(res, open(dst, "w"), indent=1)
print(json.dumps(res, indent=1))
PY
