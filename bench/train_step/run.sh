#!/usr/bin/env bash
# The training-step benchmark: for each model named (default: moe dense), axengine and its HF transformers + peft
# peer (eager, and torch.compile per decoder layer) on the same machine, same model dir, same tokens, in this one
# invocation; writes $OUT/train-step-<model>.json (rows, ratios, device, date, command) and
# $OUT/train-step-<model>-logs.tgz. README.md says what is measured and how long it takes.
# On the GPU machine, after scripts/gpu-test.sh has built into /tmp/axbuild:  bash bench/train_step/run.sh [moe] [dense]
# AX_SET="k=v ..." adds --set overrides to the axengine runs (e.g. AX_SET='kernels.moe_mlp=["reference"]');
# PROFILE_DENSE=1 also profiles the dense model (the launch/sync goal is the MoE model's).
# QLoRA: the models moe-nf4 and dense-nf4 are the same configs with the base in nf4 (--set model.weight_format=nf4
# model.double_quant=true; DOUBLE_QUANT=0 for plain absmax): axengine QLoRA, axengine bf16 LoRA of the same model
# (reused when that model already ran in this invocation) and the HF + peft + bitsandbytes peer (hf_peer.py --qlora).
# For a small run of the same code on a CPU: DEVICE=cpu MOE_PRESET=tiny-qwen3-moe DENSE_PRESET=tiny,
# with AX_SET and PEER_ARGS (hf_peer.py options) shrinking both sides alike (README.md).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ax=${AXENGINE_BIN:-/tmp/axbuild/bin/axengine}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
peer_args=(--device "$device" ${PEER_ARGS:-})
work=${AX_BENCH_WORK:-/tmp/ax-train-bench}
out=${OUT:-/tmp}; mkdir -p "$out"
models=("$@"); [ ${#models[@]} -gt 0 ] || models=(moe dense)
extra=(); for kv in ${AX_SET:-}; do extra+=(--set "$kv"); done
dq=${DOUBLE_QUANT:-1}
command="${AX_SET:+AX_SET='$AX_SET' }${PROFILE_DENSE:+PROFILE_DENSE=$PROFILE_DENSE }${DOUBLE_QUANT:+DOUBLE_QUANT=$DOUBLE_QUANT }"
command+="bash bench/train_step/run.sh ${models[*]}"
stamp() { echo "[run.sh $(date +%T)] $*"; }
declare -A ran=()  # model -> its log dir, for the models whose bf16 axengine run is done in this invocation

[ -f "$work/model/config.json" ] || "$ax" init-model --preset "${MOE_PRESET:-bench-qwen3-moe-0.9b}" --out "$work/model" --seed 1
[ -f "$work/data/train.jsonl" ] || "$ax" make-data --task arithmetic --digits 3 --train 12000 --eval 16 --out "$work/data"

for m in "${models[@]}"; do
  base=${m%-nf4}; qset=(); qpeer=(); bf16_args=()
  case $base in
    moe) cfg=$here/qwen3-moe-0.9b.toml run=$work/run profile=1 ;;
    dense) cfg=$here/qwen3-8b-dense.toml run=$work/dense-run profile=${PROFILE_DENSE:-0}
           stamp "dense model"
           "$py" "$here/make_dense_model.py" --out "$work/dense-model" --tokenizer-from "$work/model" \
             --preset "${DENSE_PRESET:-qwen3-8b}" --device "$device" ;;
    *) echo "run.sh: unknown model '$m' (moe, dense, moe-nf4, dense-nf4)" >&2; exit 2 ;;
  esac
  logs=$work/logs/$m; rm -rf "$logs"; mkdir -p "$logs"
  if [ "$m" != "$base" ]; then
    # The bf16 LoRA run of the same model to compare with: this invocation's, else one made here (unprofiled).
    if [ -n "${ran[$base]:-}" ]; then
      bf16_log=${ran[$base]}/axengine.log bf16_metrics=${ran[$base]}/metrics.jsonl
    else
      stamp "$m: axengine, bf16 base"
      rm -rf "$run"
      "$ax" run --config "$cfg" "${extra[@]}" 2>&1 | tee "$logs/axengine-bf16.log" | tail -n 12 \
        || echo "run.sh: axengine (bf16) failed (see its log)"
      cp "$run/metrics.jsonl" "$logs/metrics-bf16.jsonl" 2>/dev/null || true
      bf16_log=$logs/axengine-bf16.log bf16_metrics=$logs/metrics-bf16.jsonl
    fi
    bf16_args=(--ax-bf16-log "$bf16_log" --ax-bf16-metrics "$bf16_metrics")
    run=$run-nf4
    qset=(--set model.weight_format=nf4 --set "model.double_quant=$([ "$dq" = 1 ] && echo true || echo false)"
          --set "run.output_dir=$run")
    qpeer=(--qlora --double-quant "$dq")
  fi
  stamp "$m: axengine"
  rm -rf "$run"
  "$ax" run --config "$cfg" "${extra[@]}" "${qset[@]}" 2>&1 | tee "$logs/axengine.log" | tail -n 12 \
    || echo "run.sh: axengine failed (see its log)"
  cp "$run/metrics.jsonl" "$logs/metrics.jsonl" 2>/dev/null || true
  [ "$m" != "$base" ] || ran[$m]=$logs
  summary=""
  if [ "$profile" = 1 ]; then
    summary=$logs/profile-summary.txt
    # A separate run, so the profiler's overhead stays out of the timed one: steps 11..13 after 10 of warm-up.
    stamp "$m: axengine, profiled"
    rm -rf "$run"
    "$ax" run --config "$cfg" "${extra[@]}" "${qset[@]}" --set train.max_steps=13 --set profile.start_step=10 \
      --set profile.steps=3 > "$logs/axengine-profile.log" 2>&1 || echo "run.sh: the profiled run failed (see its log)"
    cp "$run/profile/summary.txt" "$summary" 2>/dev/null || true
  fi
  stamp "$m: HF transformers + peft${qpeer[*]:+ + bitsandbytes}"
  # The time limit keeps a runaway compile from eating the whole call; the peer writes its JSON after each variant.
  PYTHONUNBUFFERED=1 timeout 360 "$py" "$here/hf_peer.py" "$cfg" --out "$logs/peer.json" "${peer_args[@]}" "${qpeer[@]}" \
    2>&1 | tee "$logs/peer.log" | grep -E '^(hf_peer|\{)' || echo "run.sh: the peer failed or was cut off (see its log)"
  "$py" "$here/summarize.py" --name "$m" --config "$cfg" --ax-log "$logs/axengine.log" --ax-metrics "$logs/metrics.jsonl" \
    --ax-profile "$summary" --peer "$logs/peer.json" "${bf16_args[@]}" --command "$command" \
    --out "$out/train-step-$m.json"
  tar -czf "$out/train-step-$m-logs.tgz" -C "$work/logs" "$m"
  stamp "$m: done"
done
