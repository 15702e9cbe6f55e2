#!/usr/bin/env bash
# Random-kill soak of training crash safety (a benchmark-style script, not a CTest: it depends on timing, which
# the deterministic crash-point test in tests/unit/crash_cli_test.cpp does not). A tiny Llama trains a LoRA with a
# checkpoint every step; `run --resume` is started again and again and SIGKILLed after a random delay until
# --kills kills have landed. After every kill the next resume must skip no checkpoint (none is ever bad); each
# time a run completes, its losses and final adapter must be bitwise those of an uninterrupted reference run,
# and the output directory is wiped for the next round.
#
#   bash bench/crash_soak.sh [--kills 20] [--steps 60] [--min-ms 300] [--max-ms 1500] [--seed 1]
#                            [--bin build/bin/axengine] [--work /tmp/ax-crash-soak]
# Prints a Markdown summary (paste it into bench/results/crash-soak-<date>.md). Exit 1 on any failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kills=20 steps=60 min_ms=300 max_ms=1500 seed=1 bin="$root/build/bin/axengine" work=/tmp/ax-crash-soak
while [ $# -gt 0 ]; do
  case "$1" in
    --kills) kills=$2 ;; --steps) steps=$2 ;; --min-ms) min_ms=$2 ;; --max-ms) max_ms=$2 ;;
    --seed) seed=$2 ;; --bin) bin=$2 ;; --work) work=$2 ;;
    *) echo "crash_soak.sh: unknown option '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
for v in kills steps min_ms max_ms seed; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "crash_soak.sh: --${v/_/-} must be a non-negative integer, got '${!v}'" >&2; exit 2; }
done
[ "$max_ms" -ge "$min_ms" ] || { echo "crash_soak.sh: --max-ms must be >= --min-ms" >&2; exit 2; }
[ -x "$bin" ] || { echo "crash_soak.sh: $bin is not an executable (build first, or pass --bin)" >&2; exit 2; }
export OMP_NUM_THREADS=1  # the same threads in every process: bitwise comparisons
RANDOM=$seed

rm -rf "$work" && mkdir -p "$work"
"$bin" init-model --preset tiny-llama --out "$work/model" --seed 1 >/dev/null
"$bin" make-data --task arithmetic --out "$work/data" --train 80 --eval 20 --digits 1 >/dev/null
cat >"$work/run.toml" <<EOF
[run]
output_dir = "ref"
seed = 11
[model]
path = "model"
[data]
sequence_len = 64
cache_dir = "cache"
[[datasets]]
type = "completion"
path = "data/train.jsonl"
eval_path = "data/eval.jsonl"
prompt_field = "prompt"
text_field = "answer"
[lora]
r = 8
alpha = 16
[train]
lr = 3e-3
warmup_steps = 2
micro_batch_size = 2
max_steps = $steps
[eval]
every_steps = 10
[checkpoint]
every_steps = 1
keep_last = 2
EOF

losses() { python3 -c 'import json,sys; [print(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "\"loss\"" in l]' "$1"; }
last=$(printf 'step-%08d' "$steps")
started=$(date -u +%Y-%m-%dT%H:%MZ)
t0=$(date +%s)
"$bin" run --config "$work/run.toml" >"$work/ref.log" 2>&1 || { echo "reference run failed: see $work/ref.log" >&2; exit 1; }
ref_s=$(( $(date +%s) - t0 ))
losses "$work/ref/metrics.jsonl" >"$work/ref.losses"

landed=0 completed=0 attempts=0 saving=0 failures=0
declare -A at_step=()
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
check_completed() {
  losses "$work/out/metrics.jsonl" >"$work/out.losses"
  cmp -s "$work/ref.losses" "$work/out.losses" || fail "round $completed: losses differ from the reference"
  cmp -s "$work/ref/checkpoints/$last/adapter_model.safetensors" "$work/out/checkpoints/$last/adapter_model.safetensors" \
    || fail "round $completed: the final adapter differs from the reference"
  completed=$((completed + 1))
  rm -rf "$work/out"
}
while [ "$landed" -lt "$kills" ]; do
  attempts=$((attempts + 1))
  delay=$((min_ms + RANDOM % (max_ms - min_ms + 1)))
  tmp_before=$(ls -d "$work/out/checkpoints/.tmp-"* 2>/dev/null || true)
  "$bin" run --config "$work/run.toml" --set run.output_dir=out --resume >>"$work/out.log" 2>&1 &
  pid=$!
  sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
  kill -KILL "$pid" 2>/dev/null || true
  rc=0
  wait "$pid" || rc=$?
  if [ "$rc" -eq 137 ]; then  # 128 + SIGKILL: the kill landed (a run that had exited reports its own status)
    landed=$((landed + 1))
    # Killed while saving: a temp checkpoint this process started (the next save removes an older one).
    tmp_after=$(ls -d "$work/out/checkpoints/.tmp-"* 2>/dev/null || true)
    if [ -n "$tmp_after" ] && [ "$tmp_after" != "$tmp_before" ]; then saving=$((saving + 1)); fi
    newest=$(ls "$work/out/checkpoints" 2>/dev/null | grep '^step-' | sort | tail -n 1 || true)
    at_step[${newest:-none}]=1
  elif [ "$rc" -eq 0 ]; then
    check_completed
  else
    fail "attempt $attempts: the run failed with exit $rc (see $work/out.log)"
  fi
done
# Finish the last round and check it.
"$bin" run --config "$work/run.toml" --set run.output_dir=out --resume >>"$work/out.log" 2>&1 || fail "final resume failed"
[ -f "$work/out/metrics.jsonl" ] && check_completed
skips=$(grep -c 'resume: skipping checkpoint' "$work/out.log" || true)
[ "$skips" -eq 0 ] || fail "$skips checkpoints were skipped on resume (a bad checkpoint was left by a kill)"

cat <<EOF
| | |
|---|---|
| command | \`bash bench/crash_soak.sh --kills $kills --steps $steps --min-ms $min_ms --max-ms $max_ms --seed $seed\` |
| date | $started to $(date -u +%Y-%m-%dT%H:%MZ) |
| machine | $(getconf _NPROCESSORS_ONLN) cores, $(uname -sr), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average at the end $(cut -d' ' -f1-3 /proc/loadavg) |
| reference run | $steps steps, a checkpoint every step, ${ref_s} s |
| kills landed | $landed of $attempts starts (the others finished first) |
| killed while a checkpoint was being written | $saving |
| distinct newest checkpoints at a kill | ${#at_step[@]} |
| runs completed and compared | $completed (losses and final adapter bitwise equal to the reference) |
| checkpoints skipped on resume | $skips |
| failures | $failures |
EOF
[ "$failures" -eq 0 ]
