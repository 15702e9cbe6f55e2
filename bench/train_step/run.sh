#!/usr/bin/env bash
# The training-step benchmark: for each workload named (default: moe dense), axengine and its HF transformers + peft
# peers on the same machine, same model dir, same tokens, in this one invocation; writes $OUT/train-step-<name>.json
# and .md (rows, ratios, MFU, device, date, command) and $OUT/train-step-<name>-logs.tgz. README.md says what each
# workload and peer is, what is measured and how long it takes.
# On the GPU machine, after scripts/gpu-test.sh has built into /tmp/axbuild:  bash bench/train_step/run.sh [name ...]
# Workloads:
#   moe, dense              arithmetic samples (~20 tokens) packed into 2x2048 / 1x2048; peers eager + compile
#   moe-nf4, dense-nf4      the same with the base in nf4 (QLoRA) against HF + peft + bitsandbytes
#   sft-moe, sft-dense      SFT-like samples (log-normal lengths, mean ~500 tokens, up to 4096; make_sft_data.py)
#                           packed into 2x4096
#   long-{moe,dense}-{8k,16k,32k}  one sample of 8192/16384/32768 tokens per row, batch 1, activation checkpointing
#                           on both sides
#   sft-* and long-*: peers eager, compile, liger, liger+compile (hf_peer.py; the liger ones in a second process).
# Options (environment): AX_SET="k=v ..." adds --set overrides to the axengine runs only (e.g.
# AX_SET='kernels.moe_mlp=["reference"]'); PEER_VARIANTS=eager,compile,liger,liger+compile picks the peers;
# PEER_TIMEOUT (s, default 360) caps each peer process; PROFILE_DENSE=1 also profiles the dense model (the
# launch/sync goal is the MoE model's), PROFILE_ALL=1 every workload; DOUBLE_QUANT=0 packs the nf4 variants
# without double quantisation; AXENGINE_BIN, PYTHON, OUT, AX_BENCH_WORK (default /tmp/ax-train-bench).
# TINY=1: the whole pipeline on the CPU at toy sizes (tiny models, rows of 256, long rows of 128/256/512, a few
# steps) in a minute or two: a test of the scripts, not a benchmark (tests/python/check_train_step_bench.py).
# liger-kernel: a wheel in .whl/ (README.md says how to fetch it) is installed into /tmp/site when not importable.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
tiny=${TINY:-0}
if [ "$tiny" = 1 ]; then
  : "${DEVICE:=cpu}" "${MOE_PRESET:=tiny-qwen3-moe}" "${DENSE_PRESET:=tiny}" "${PEER_VARIANTS:=eager,liger}"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
fi
ax=${AXENGINE_BIN:-/tmp/axbuild/bin/axengine}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
work=${AX_BENCH_WORK:-/tmp/ax-train-bench}
out=${OUT:-/tmp}; mkdir -p "$out"
models=("$@"); [ ${#models[@]} -gt 0 ] || models=(moe dense)
extra=(); for kv in ${AX_SET:-}; do extra+=(--set "$kv"); done
[ "$tiny" = 1 ] && extra+=(--set train.cpu_threads=1)
dq=${DOUBLE_QUANT:-1}
command="${TINY:+TINY=$TINY }${AX_SET:+AX_SET='$AX_SET' }${PEER_VARIANTS:+PEER_VARIANTS=$PEER_VARIANTS }"
command+="${PROFILE_DENSE:+PROFILE_DENSE=$PROFILE_DENSE }${DOUBLE_QUANT:+DOUBLE_QUANT=$DOUBLE_QUANT }"
command+="bash bench/train_step/run.sh ${models[*]}"
stamp() { echo "[run.sh $(date +%T)] $*"; }
setargs() { sa=(); for kv in "$@"; do sa+=(--set "$kv"); done; }  # sa: each KEY=VALUE as --set KEY=VALUE
declare -A ran=()  # model -> its log dir, for the models whose bf16 axengine run is done in this invocation

# liger-kernel (pure Python + Triton) travels as a wheel: the device README's offline install, into /tmp/site.
liger_whl=$(ls "$root"/.whl/liger_kernel-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$liger_whl" ] && ! "$py" -c 'import liger_kernel' 2>/dev/null; then
  [ -d /tmp/site/liger_kernel ] || "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$liger_whl"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

[ -f "$work/model/config.json" ] || "$ax" init-model --preset "${MOE_PRESET:-bench-qwen3-moe-0.9b}" --out "$work/model" --seed 1
[ -f "$work/data/train.jsonl" ] || "$ax" make-data --task arithmetic --digits 3 --train 12000 --eval 16 --out "$work/data"

dense_model() {
  stamp "dense model"
  "$py" "$here/make_dense_model.py" --out "$work/dense-model" --tokenizer-from "$work/model" \
    --preset "${DENSE_PRESET:-qwen3-8b}" --device "$device"
}

for m in "${models[@]}"; do
  base=${m%-nf4}; qset=(); qpeer=(); bf16_args=(); wset=(); warmup=5; variants=eager,compile; peer_extra=()
  profile=${PROFILE_ALL:-0}
  case $base in
    moe|sft-moe|long-moe-*) cfg=$here/qwen3-moe-0.9b.toml model_dir=$work/model ;;
    dense|sft-dense|long-dense-*) cfg=$here/qwen3-8b-dense.toml model_dir=$work/dense-model; dense_model ;;
    *) echo "run.sh: unknown workload '$m' (moe, dense, moe-nf4, dense-nf4, sft-moe, sft-dense," \
            "long-{moe,dense}-{8k,16k,32k})" >&2; exit 2 ;;
  esac
  run=$work/run-$base data=$work/data
  case $base in
    moe) run=$work/run profile=1 ;;
    dense) run=$work/dense-run profile=${PROFILE_DENSE:-$profile} ;;
    sft-*)
      S=4096 sft=(--mean 500 --max 4096 --rows 1200)
      [ "$tiny" = 1 ] && S=256 sft=(--mean 40 --max 256 --min 8 --rows 300)
      data=$work/sft-$S
      "$py" "$here/make_sft_data.py" --tokenizer-from "$work/model" --out "$data" --kind sft "${sft[@]}"
      wset=(data.sequence_len=$S train.micro_batch_size=2)
      [ "$tiny" = 1 ] && wset+=(train.max_steps=8)
      variants=eager,compile,liger,liger+compile ;;
    long-*)
      case ${base##*-} in 8k) S=8192 ;; 16k) S=16384 ;; 32k) S=32768 ;;
        *) echo "run.sh: '$m': long workloads are 8k, 16k, 32k" >&2; exit 2 ;; esac
      [ "$tiny" = 1 ] && S=$((S / 64))
      data=$work/long-$S
      "$py" "$here/make_sft_data.py" --tokenizer-from "$work/model" --out "$data" --kind long --tokens "$S" --rows 12
      # 8 steps, 3 of warm-up on both sides: a 32k step of the 8B shape takes seconds.
      wset=(data.sequence_len=$S train.micro_batch_size=1 train.activation_checkpointing=true train.max_steps=8)
      warmup=3 peer_extra=(--warmup 3 --max-warmup 8) variants=eager,compile,liger,liger+compile ;;
  esac
  # Paths under $work on both sides (the configs name /tmp/ax-train-bench), then the workload's shape.
  wset=(model.path=$model_dir run.output_dir=$run "datasets[0].path=$data/train.jsonl"
        "datasets[0].eval_path=$data/eval.jsonl" "${wset[@]}")
  variants=${PEER_VARIANTS:-$variants}
  [ "$tiny" = 1 ] && [ "$base" = moe -o "$base" = dense ] && wset+=(data.sequence_len=256 train.max_steps=8)
  logs=$work/logs/$m; rm -rf "$logs"; mkdir -p "$logs"
  if [ "$m" != "$base" ]; then
    # The bf16 LoRA run of the same model to compare with: this invocation's, else one made here (unprofiled).
    if [ -n "${ran[$base]:-}" ]; then
      bf16_log=${ran[$base]}/axengine.log bf16_metrics=${ran[$base]}/metrics.jsonl
    else
      stamp "$m: axengine, bf16 base"
      rm -rf "$run"
      setargs "${wset[@]}"
      "$ax" run --config "$cfg" "${sa[@]}" "${extra[@]}" 2>&1 | tee "$logs/axengine-bf16.log" | tail -n 12 \
        || echo "run.sh: axengine (bf16) failed (see its log)"
      cp "$run/metrics.jsonl" "$logs/metrics-bf16.jsonl" 2>/dev/null || true
      bf16_log=$logs/axengine-bf16.log bf16_metrics=$logs/metrics-bf16.jsonl
    fi
    bf16_args=(--ax-bf16-log "$bf16_log" --ax-bf16-metrics "$bf16_metrics")
    run=$run-nf4
    wset+=(run.output_dir=$run)
    qset=(--set model.weight_format=nf4 --set "model.double_quant=$([ "$dq" = 1 ] && echo true || echo false)")
    qpeer=(--qlora --double-quant "$dq") variants=eager,compile
    [ "$tiny" = 1 ] && variants=eager
  fi
  stamp "$m: axengine"
  rm -rf "$run"
  setargs "${wset[@]}"
  "$ax" run --config "$cfg" "${sa[@]}" "${extra[@]}" "${qset[@]}" 2>&1 | tee "$logs/axengine.log" | tail -n 12 \
    || echo "run.sh: axengine failed (see its log)"
  cp "$run/metrics.jsonl" "$logs/metrics.jsonl" 2>/dev/null || true
  [ "$m" != "$base" ] || ran[$m]=$logs
  summary=""
  if [ "$profile" = 1 ]; then
    summary=$logs/profile-summary.txt
    # A separate run, so the profiler's overhead stays out of the timed one: steps 11..13 after 10 of warm-up.
    stamp "$m: axengine, profiled"
    rm -rf "$run"
    "$ax" run --config "$cfg" "${sa[@]}" "${extra[@]}" "${qset[@]}" --set train.max_steps=13 \
      --set profile.start_step=10 --set profile.steps=3 > "$logs/axengine-profile.log" 2>&1 \
      || echo "run.sh: the profiled run failed (see its log)"
    cp "$run/profile/summary.txt" "$summary" 2>/dev/null || true
  fi
  # The peers: the plain ones in one process, the liger ones (a class-wide patch) in another.
  plain=$(tr , '\n' <<< "$variants" | grep -v '^liger' | paste -sd, || true)
  liger=$(tr , '\n' <<< "$variants" | grep '^liger' | paste -sd, || true)
  peers=()
  for group in plain liger; do
    vs=${!group}; [ -n "$vs" ] || continue
    stamp "$m: HF transformers + peft${qpeer[*]:+ + bitsandbytes}: $vs"
    pj=$logs/peer-$group.json; peers+=(--peer "$pj")
    # The time limit keeps a runaway compile from eating the whole call; the peer writes its JSON after each variant.
    [ "$tiny" = 1 ] && tiny_args=(--steps 3) || tiny_args=()
    PYTHONUNBUFFERED=1 timeout "${PEER_TIMEOUT:-360}" "$py" "$here/hf_peer.py" "$cfg" --out "$pj" --device "$device" \
      --variants "$vs" "${sa[@]}" "${qpeer[@]}" "${peer_extra[@]}" "${tiny_args[@]}" ${PEER_ARGS:-} 2>&1 \
      | tee "$logs/peer-$group.log" | grep -E '^(hf_peer|\{)' || echo "run.sh: the peer ($vs) failed or was cut off (see its log)"
    # Written after each peer process, so a device call cut off later still leaves the rows that finished.
    "$py" "$here/summarize.py" --name "$m" --config "$cfg" --ax-log "$logs/axengine.log" --ax-metrics "$logs/metrics.jsonl" \
      --ax-profile "$summary" "${peers[@]}" "${bf16_args[@]}" --warmup "$warmup" --command "$command" \
      --out "$out/train-step-$m.json" > "$logs/summary.log"
    tar -czf "$out/train-step-$m-logs.tgz" -C "$work/logs" "$m"
  done
  cat "$out/train-step-$m.md"
  stamp "$m: done"
done
