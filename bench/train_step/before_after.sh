#!/usr/bin/env bash
# The MoE bench model's train step at this checkout (A) against an earlier commit (B), alternating A and B on one
# GPU in one call: the "does not regress" check of a refactor (bench/results/families-step-*.md).
#   here:          bash bench/train_step/before_after.sh prepare REF   # writes .axdev/pre.tar + pre-deleted.txt
#   GPU machine:   bash bench/train_step/before_after.sh run [REPS]     # (the device tool, carry [".axdev"])
# `prepare` packs the files of core/, plugins/, cmake/ and CMakeLists.txt that differ at REF (the GPU machine gets
# no git history); `run` builds A, keeps its bin/ and lib/, applies REF's files, rebuilds incrementally as B, then
# times REPS pairs (default 4; the order alternates) of bench/train_step/qwen3-moe-0.9b.toml, 40 steps each.
# ms/step = the median step-to-step elapsed_s of metrics.jsonl after the first 5 steps (README.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in
  prepare)
    ref=${2:?prepare needs a commit}
    paths=(core plugins cmake CMakeLists.txt)
    git diff --name-status HEAD "$ref" -- "${paths[@]}" | awk '$1=="D"{print $2}' > .axdev/pre-deleted.txt
    mod=$(git diff --name-status HEAD "$ref" -- "${paths[@]}" | awk '$1!="D"{print $NF}')
    rm -f .axdev/pre.tar
    [ -z "$mod" ] || git archive --format=tar -o .axdev/pre.tar "$ref" $mod
    git rev-parse "$ref" > .axdev/pre-commit.txt
    echo "before_after: B = $(cat .axdev/pre-commit.txt): $(echo "$mod" | wc -w) files differ, $(wc -l < .axdev/pre-deleted.txt) absent" ;;
  run)
    reps=${2:-4}
    source .axdev/env.sh
    b=${AXENGINE_GPU_BUILD:-/tmp/axbuild}; out=${OUT:-/tmp}
    cmake -S . -B "$b" $AX_CMAKE_ARGS -DCMAKE_BUILD_TYPE=Release -DAXENGINE_PYTHON=python3 > "$out/cfgA.log" 2>&1 || exit 1
    cmake --build "$b" -j "$(nproc)" --target axengine_app > "$out/buildA.log" 2>&1 || { tail "$out/buildA.log"; exit 1; }
    rm -rf /tmp/ax-A && mkdir -p /tmp/ax-A && cp -a "$b/bin" "$b/lib" /tmp/ax-A/
    [ ! -f .axdev/pre.tar ] || tar -xf .axdev/pre.tar -C .
    xargs -r rm -f < .axdev/pre-deleted.txt
    cmake -S . -B "$b" > "$out/cfgB.log" 2>&1 && cmake --build "$b" -j "$(nproc)" --target axengine_app > "$out/buildB.log" 2>&1 \
      || { tail "$out/buildB.log"; exit 1; }
    w=/tmp/ax-train-bench cfg=bench/train_step/qwen3-moe-0.9b.toml
    "$b/bin/axengine" init-model --preset bench-qwen3-moe-0.9b --out $w/model --seed 1 > /dev/null
    "$b/bin/axengine" make-data --task arithmetic --digits 3 --train 12000 --eval 16 --out $w/data > /dev/null
    echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); date: $(date -u +%F); B = $(cat .axdev/pre-commit.txt)"
    for ((r = 1; r <= reps; r++)); do
      order="A B"; [ $((r % 2)) -eq 0 ] && order="B A"
      for side in $order; do
        if [ $side = A ]; then ax=(env LD_LIBRARY_PATH=/tmp/ax-A/lib:${LD_LIBRARY_PATH:-} /tmp/ax-A/bin/axengine); else ax=("$b/bin/axengine"); fi
        "${ax[@]}" run --config $cfg --set run.output_dir=/tmp/r$side$r --set train.max_steps=40 > "$out/run-$side$r.log" 2>&1
        python3 - "$side" "$r" /tmp/r$side$r/metrics.jsonl <<'PY'
import json, statistics, sys
t = [json.loads(l)["elapsed_s"] for l in open(sys.argv[3]) if '"loss"' in l and "elapsed_s" in l]
d = [b - a for a, b in zip(t, t[1:])][5:]
print(f"run {sys.argv[2]} {sys.argv[1]} ms/step {statistics.median(d) * 1000:.2f} ({len(d)} steps)")
PY
      done
    done ;;
  *) echo "before_after.sh prepare REF | run [REPS]" >&2; exit 2 ;;
esac
