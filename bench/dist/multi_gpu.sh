#!/usr/bin/env bash
# Multi-GPU runs on one host (issue 24; docs/distributed.md, "On several GPUs"): the bench MoE model of
# bench/train_step (qwen3-moe-0.9b.toml, bf16, LoRA r=16, 2 x 2048 tokens per micro-batch) trained the same steps
#   one    1 GPU, grad_accum = NPROC          the reference run, and the 1-GPU speed
#   dp     NPROC GPUs over NCCL, grad_accum 1  data parallel: the same global batch, split over the GPUs
#   ep     NPROC GPUs, expert_parallel = NPROC  each GPU holds 1/NPROC of the experts, tokens by all-to-all
#   shard  NPROC GPUs, shard_base = true       each GPU holds 1/NPROC of every layer's frozen weights
# then compares them (compare_runs.py: losses and the final adapter against `one` within bf16 tolerance, `shard`
# against `dp` bit for bit) and writes $OUT/multi-gpu.json (per-GPU tokens/s, scaling efficiency, peak memory per
# GPU, differences, device, date, command). Each run writes its result as it ends, so a call cut short keeps them.
#   bash bench/dist/multi_gpu.sh          (after a build into /tmp/axbuild; NPROC defaults to the GPU count)
# STEPS (default 20) steps each; the step time is the median over steps 6.. . RUNS="one dp ep shard" picks runs.
# DEVICE=cpu runs the same code over Gloo on the CPU (tiny-qwen3-moe, a few steps): a check of the script itself.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ax=${AXENGINE_BIN:-/tmp/axbuild/bin/axengine}
py=${PYTHON:-python3}
out=${OUT:-/tmp}; mkdir -p "$out"
device=${DEVICE:-cuda}
work=${AX_BENCH_WORK:-/tmp/ax-multi-gpu}
steps=${STEPS:-20}
runs=(${RUNS:-one dp ep shard})
if [ "$device" = cuda ]; then
  nproc=${NPROC:-$(nvidia-smi -L | wc -l)}
  preset=bench-qwen3-moe-0.9b
  sets=(--set "kernels.moe_mlp=[\"scattermoe\", \"reference\"]")
else
  nproc=${NPROC:-2}
  preset=tiny-qwen3-moe
  sets=(--set device.type=cpu --set train.cpu_threads=1 --set data.sequence_len=128 --set model.dtype=fp32
        --set 'kernels.moe_mlp=["reference"]')
fi
[ "$nproc" -ge 2 ] || { echo "multi_gpu.sh: needs 2 or more GPUs (NPROC=$nproc)" >&2; exit 2; }
sets+=(--set "train.max_steps=$steps" --set train.log_every=1 --set eval.every_steps=0 --set "checkpoint.every_steps=$steps"
       --set distributed.timeout_s=120 --set "model.path=$work/model")
stamp() { echo "[multi_gpu.sh $(date +%T)] $*"; }

[ -f "$work/model/config.json" ] || "$ax" init-model --preset "$preset" --out "$work/model" --seed 1 > /dev/null
[ -f "$work/data/train.jsonl" ] || "$ax" make-data --task arithmetic --digits 3 --train 12000 --eval 16 --out "$work/data" > /dev/null
sed "s#/tmp/ax-train-bench/data#$work/data#" "$here/../train_step/qwen3-moe-0.9b.toml" > "$work/run.toml"

for r in "${runs[@]}"; do
  case $r in
    one) cmd=("$ax" run) extra=(--set "train.grad_accum=$nproc") ;;
    dp) cmd=("$ax" launch --nproc "$nproc" --grace-s 10 -- run) extra=() ;;
    ep) cmd=("$ax" launch --nproc "$nproc" --grace-s 10 -- run) extra=(--set "distributed.expert_parallel=$nproc") ;;
    shard) cmd=("$ax" launch --nproc "$nproc" --grace-s 10 -- run) extra=(--set distributed.shard_base=true) ;;
    *) echo "multi_gpu.sh: unknown run '$r' (one, dp, ep, shard)" >&2; exit 2 ;;
  esac
  stamp "$r"
  rm -rf "$work/$r"
  if timeout 300 "${cmd[@]}" --config "$work/run.toml" "${sets[@]}" "${extra[@]}" --set "run.output_dir=$work/$r" \
      > "$out/multi-gpu-$r.log" 2>&1; then
    "$py" "$here/compare_runs.py" --work "$work" --nproc "$nproc" --device "$device" --steps "$steps" \
      --command "${DEVICE:+DEVICE=$DEVICE }STEPS=$steps RUNS=\"${runs[*]}\" bash bench/dist/multi_gpu.sh" --out "$out/multi-gpu.json" --logs "$out" --show "$r"
  else
    echo "multi_gpu.sh: run '$r' failed; the end of its log:"; tail -n 25 "$out/multi-gpu-$r.log"
  fi
done
