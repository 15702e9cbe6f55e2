#!/usr/bin/env bash
# The VLM SFT step benchmark (issue 40, Speed): a Qwen3-VL-8B-shaped model (make_model.py, random init, bf16) trained
# with LoRA r=16 on the language model's attention + MLP over image conversations (make_corpus.py: 1-4 JPEGs of
# 448-1024 px per conversation, loss on the assistant turns) packed into rows of 8192 tokens, activation
# checkpointing on (qwen3-vl-8b-sft.toml); axengine and its HF transformers + peft peer (hf_peer_vlm.py: the
# processor's apply_chat_template, the same packed batches) on the same machine, model dir and conversations, in
# this one invocation. Writes $OUT/vlm-sft-step.json and .md (device, date, command, ms/step of both, the ratio,
# tokens/s, images/s, MFU, peak memory, same tokens per step) and $OUT/vlm-sft-step-logs.tgz. README.md says more.
# On the GPU machine, after scripts/gpu-test.sh has built into /tmp/axbuild (axengine and the mm_cpt plugin):
#   bash bench/vlm_sft/run.sh            (~6 min on an H200: model 1-2 min, axengine ~1 min, the peer ~2-3 min)
# Options (environment): SET="k=v ..." --set overrides for both sides (e.g. SET='train.activation_checkpointing=false');
# PEER_VARIANTS=eager,compile (default eager); PEER_TIMEOUT (s, default 420); ROWS (conversations, default 160);
# PROFILE=1 a profiled axengine run too (launches and host syncs per step);
# AXENGINE_BIN, PYTHON, OUT, AX_BENCH_WORK (default /tmp/ax-vlm-bench: the model and the corpus are reused).
# TINY=1: the whole pipeline on the CPU with the tiny-qwen3-vl preset's shape, small images and short
# conversations, a few steps: a test of the scripts, not a benchmark (tests/python/check_vlm_sft_bench.py).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
tiny=${TINY:-0}
ax=${AXENGINE_BIN:-/tmp/axbuild/bin/axengine}
py=${PYTHON:-python3}
work=${AX_BENCH_WORK:-/tmp/ax-vlm-bench}
out=${OUT:-/tmp}; mkdir -p "$out" "$work"
cfg=$here/qwen3-vl-8b-sft.toml
command="${TINY:+TINY=$TINY }${SET:+SET='$SET' }${PEER_VARIANTS:+PEER_VARIANTS=$PEER_VARIANTS }${PROFILE:+PROFILE=$PROFILE }"
command+="bash bench/vlm_sft/run.sh"
stamp() { echo "[vlm_sft run.sh $(date +%T)] $*"; }
device=cuda preset=qwen3-vl-8b warmup=5 corpus=(--rows "${ROWS:-160}")
sets=(model.path=$work/model run.output_dir=$work/run "datasets[0].path=$work/corpus/train.jsonl")
ax_extra=() peer_extra=()
if [ "$tiny" = 1 ]; then
  # Images of 64-160 px (the tiny processor bounds them to 4-64 merged tokens anyway), turns a tenth as long.
  device=cpu preset=tiny warmup=2 corpus=(--rows "${ROWS:-10}" --min-side 64 --max-side 160 --text-scale 0.1)
  sets+=(data.sequence_len=1024 train.max_steps=5)
  ax_extra=(--set train.cpu_threads=1) peer_extra=(--max-warmup 2)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
fi
for kv in ${SET:-}; do sets+=("$kv"); done
sa=(); for kv in "${sets[@]}"; do sa+=(--set "$kv"); done

[ -f "$work/tiny-vl/config.json" ] || "$ax" init-model --preset tiny-qwen3-vl --out "$work/tiny-vl" --seed 1
stamp "model ($preset)"
"$py" "$here/make_model.py" --out "$work/model" --tokenizer-from "$work/tiny-vl" --preset "$preset" --device "$device"
[ -f "$work/corpus/train.jsonl" ] || { stamp corpus; "$py" "$here/make_corpus.py" "$work/corpus" "${corpus[@]}"; }

logs=$work/logs; rm -rf "$logs"; mkdir -p "$logs"
stamp "axengine"
rm -rf "$work/run"
"$ax" run --config "$cfg" "${sa[@]}" "${ax_extra[@]}" 2>&1 | tee "$logs/axengine.log" | grep -v '^ ' | tail -n 8 \
  || echo "run.sh: axengine failed (see its log)"
cp "$work/run/metrics.jsonl" "$logs/metrics.jsonl" 2>/dev/null || true

summary=""
if [ "${PROFILE:-0}" = 1 ]; then  # separate from the timed run: the profiler's overhead stays out of it
  stamp "axengine, profiled"
  rm -rf "$work/run"
  "$ax" run --config "$cfg" "${sa[@]}" "${ax_extra[@]}" --set train.max_steps=13 --set profile.start_step=10 \
    --set profile.steps=3 > "$logs/axengine-profile.log" 2>&1 || echo "run.sh: the profiled run failed (see its log)"
  cp "$work/run/profile/summary.txt" "$logs/profile-summary.txt" 2>/dev/null && summary=$logs/profile-summary.txt
fi

variants=${PEER_VARIANTS:-eager}
stamp "HF transformers + peft: $variants"
PYTHONUNBUFFERED=1 timeout "${PEER_TIMEOUT:-420}" "$py" "$here/hf_peer_vlm.py" "$cfg" --out "$logs/peer.json" \
  --device "$device" --variants "$variants" --warmup "$warmup" "${sa[@]}" "${peer_extra[@]}" 2>&1 \
  | tee "$logs/peer.log" | grep -E '^(hf_peer|\{)' || echo "run.sh: the peer failed or was cut off (see its log)"

"$py" "$root/bench/train_step/summarize.py" --name vlm-sft --config "$cfg" --ax-log "$logs/axengine.log" \
  --ax-metrics "$logs/metrics.jsonl" --ax-profile "$summary" --peer "$logs/peer.json" --warmup "$warmup" \
  --command "$command" \
  --out "$out/vlm-sft-step.json" > "$logs/summary.log"
"$py" "$here/summarize_vlm.py" "$out/vlm-sft-step.json" "$logs/peer.json" "$work/corpus/stats.json" \
  "$logs/metrics.jsonl"
tar -czf "$out/vlm-sft-step-logs.tgz" -C "$work" logs
stamp done
