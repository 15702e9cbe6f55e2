#!/usr/bin/env bash
# The streamed MM-CPT step benchmark (issue 21): does the GPU wait on image decoding? run.sh measures the
# map-style step, whose images are all decoded before step 1; here (qwen2_5-vl-3b-mm-cpt-streaming.toml) the
# rows come from JSON Lines shards as training reaches them and their images are decoded then, on a background
# thread data.prefetch_steps ahead (core/src/train/stream_prefetch.hpp). Two runs of STEPS steps, the same rows:
# prefetch on (PREFETCH, default 2) and off (0: decoding on the training thread, the GPU waiting for it), each
# profiled over 3 steps from step 10. Writes $OUT/mm-cpt-stream-step.json: per run, ms/step, tokens/s, images/s,
# the host's wait for each step's rows (metrics.jsonl data_wait_s: median and max), and the GPU's idle time per
# profiled step (the profiler's idle between kernels, over the 3 steps, divided by 3) and its share of the wall.
#   bash bench/mm_cpt/run-streaming.sh            (after a build into /tmp/axbuild; ROWS=1024, STEPS=40)
#   TINY=1 bash bench/mm_cpt/run-streaming.sh     (CPU check of the script: tiny-qwen2_5-vl, small rows)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ax=${AXENGINE_BIN:-/tmp/axbuild/bin/axengine}
py=${PYTHON:-python3}
work=${WORK:-/tmp/ax-mm-bench}
out=${OUT:-/tmp}; mkdir -p "$out" "$work"
prefetch=${PREFETCH:-2}
cfg=$here/qwen2_5-vl-3b-mm-cpt-streaming.toml
stamp() { echo "[mm run-streaming.sh $(date +%T)] $*"; }
[ -f "$work/tiny-vl/config.json" ] || "$ax" init-model --preset tiny-qwen2_5-vl --out "$work/tiny-vl" --seed 1
sets=(--set "run.output_dir=$work/run-stream")
if [ "${TINY:-0}" = 1 ]; then
  # The script's own check, on a CPU: the tiny model, small images, short rows; the same code paths.
  rows=${ROWS:-96}; steps=${STEPS:-16}; corpus=$work/corpus-stream-tiny; size=96x64
  sets+=(--set "model.path=$work/tiny-vl" --set model.dtype=fp32 --set data.sequence_len=256 --set train.cpu_threads=2)
else
  rows=${ROWS:-1024}; steps=${STEPS:-40}; corpus=$work/corpus-stream; size=640x480
  stamp model; "$py" "$here/make_vl_model.py" --out "$work/vl-3b" --tokenizer-from "$work/tiny-vl"
fi
(( steps >= 14 )) || { echo "STEPS must be >= 14 (profiled steps 11..13, timing from step 6)"; exit 1; }
[ -f "$corpus/train-00000-of-00004.jsonl" ] || { stamp corpus; "$py" "$here/../../scripts/make-mm-corpus.py" "$corpus" \
  --rows "$rows" --shards 4 --size "$size" --one-image --jpeg; }
# The config reads corpus-stream/train*.jsonl: point it at this corpus (a [[datasets]] key, which --set cannot reach).
run_cfg=$work/stream-bench.toml
sed "s|/tmp/ax-mm-bench/corpus-stream/|$corpus/|" "$cfg" > "$run_cfg"
for depth in "$prefetch" 0; do
  stamp "axengine, streamed, prefetch_steps = $depth"
  rm -rf "$work/run-stream"
  "$ax" run --config "$run_cfg" "${sets[@]}" --set "data.prefetch_steps=$depth" --set "train.max_steps=$steps" \
    --set profile.start_step=10 --set profile.steps=3 --set profile.top=30 > "$work/stream-$depth.log" 2>&1 \
    || { tail -20 "$work/stream-$depth.log"; exit 1; }
  cp "$work/run-stream/metrics.jsonl" "$work/stream-$depth-metrics.jsonl"
  cp "$(ls -d "$work"/run-stream/checkpoints/step-* | tail -1)/trainer_state.json" "$work/stream-$depth-state.json"
  cp "$work/run-stream/profile/summary.txt" "$out/mm-cpt-stream-$depth-profile-summary.txt"
done
"$py" - "$work" "$out" "$corpus" "$prefetch" "${TINY:-0}" <<'PY'
import datetime, glob, json, re, statistics as st, subprocess, sys
work, out, corpus, prefetch, tiny = sys.argv[1:]
shards = sorted(glob.glob(corpus + "/train-*.jsonl"))
per_shard = [[len(json.loads(l)["images"]) for l in open(f) if l.strip()] for f in shards]
corpus_images = sum(map(sum, per_shard))

def images_read(cursor):
    # The images of the rows before the final cursor (the first row not trained on), over its passes.
    n = cursor["pass"] * corpus_images
    for i, f in enumerate(shards):
        if i < cursor["shard"]: n += sum(per_shard[i])
        elif i == cursor["shard"]: n += sum(per_shard[i][: cursor["line"] - 1])
    return n

def one(depth):
    r = [json.loads(l) for l in open(f"{work}/stream-{depth}-metrics.jsonl") if l.strip()]
    r = [x for x in r if "loss" in x]
    # Steps 7.. outside the profiled ones (11..13 carry the profiler's own overhead).
    timed = [(a, b) for a, b in zip(r[5:], r[6:]) if not 11 <= b["step"] <= 13]
    ms = st.median(b["elapsed_s"] - a["elapsed_s"] for a, b in timed) * 1000
    tok_step = st.median(b["tokens"] for _, b in timed)
    waits = [b["data_wait_s"] * 1000 for _, b in timed]
    cursor = json.load(open(f"{work}/stream-{depth}-state.json"))["data_stream"]["cursor"]
    images_per_step = images_read(cursor) / len(r)
    p = open(f"{out}/mm-cpt-stream-{depth}-profile-summary.txt").read()
    wall = float(re.search(r"profile: wall ([\d.]+) ms", p).group(1))
    idle = re.search(r"GPU idle between its first and last kernel: ([\d.]+) ms", p)
    line = re.search(r"axengine::step: .*", p)
    return dict(prefetch_steps=int(depth), steps=len(r), steps_timed=len(timed), ms_per_step=round(ms, 2),
                tokens_per_step=tok_step, tokens_per_s=round(tok_step / ms * 1000),
                images_per_step=round(images_per_step, 2), images_per_s=round(images_per_step / ms * 1000, 1),
                data_wait_ms_median=round(st.median(waits), 3), data_wait_ms_max=round(max(waits), 3),
                first_loss=r[0]["loss"], final_loss=r[-1]["loss"], losses=[x["loss"] for x in r],
                profile_line=line.group(0) if line else None, profiled_wall_ms=wall,
                # None on a CPU run: no GPU kernels to find gaps between.
                gpu_idle_ms_per_step=round(float(idle.group(1)) / 3, 3) if idle else None,
                gpu_idle_share=round(float(idle.group(1)) / wall, 4) if idle else None)

runs = [one(prefetch), one("0")]
same = runs[0]["losses"] == runs[1]["losses"]  # the same rows at every depth: exactly the same losses
for x in runs: del x["losses"]
try: dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().splitlines()[0]
except Exception: dev = "cpu"
what = ("tiny-qwen2_5-vl on the CPU (the script's own check)" if tiny == "1" else
        "Qwen2.5-VL-3B shape (random init, bf16), LoRA r=16 on the LM's linears, frozen vision tower, "
        "rows of one 640x480 JPEG (391 image tokens) + caption, packed 2 x 4096 tokens")
res = dict(bench="mm_cpt streamed step: " + what + "; rows streamed from 4 JSON Lines shards, images decoded as training reaches them",
           device=dev, date=datetime.date.today().isoformat(), command="bash bench/mm_cpt/run-streaming.sh",
           corpus_rows=sum(map(len, per_shard)), corpus_images=corpus_images, losses_identical_across_depths=same, runs=runs)
json.dump(res, open(f"{out}/mm-cpt-stream-step.json", "w"), indent=1)
print(json.dumps(res, indent=1))
if not same: sys.exit("the losses differ between prefetch depths: the rows are not the same")
PY
