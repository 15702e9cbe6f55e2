#!/usr/bin/env bash
# Builds and tests axengine on the GPU machine (the `device` tool), against that machine's own
# torch 2.11+cu130, with our Debian dependencies carried in .axdev (see docs/gpu.md):
#   once, here:  echo /.axdev/ >> .git/info/exclude; rm -rf .axdev; cp -r ../shared/device .axdev
#   device run:  carry [".axdev"], command: bash scripts/gpu-test.sh [ctest args, e.g. -R regex]
# Build outputs stay in /tmp (the tree that travels is size-limited); logs go to $OUT when set.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/.axdev/env.sh"
build=${AXENGINE_GPU_BUILD:-/tmp/axbuild}
out=${OUT:-/tmp}
# That machine's python has torch's nvidia-cudnn wheel but not the header-only nvidia-cudnn-frontend: a copy
# of its include/ travels in .axdev/cudnn_frontend/include (fused_attn's attention backend needs it).
cfe=()
[ -f "$root/.axdev/cudnn_frontend/include/cudnn_frontend.h" ] && cfe=(-DAX_CUDNN_FRONTEND_INCLUDE="$root/.axdev/cudnn_frontend/include")
cmake -S "$root" -B "$build" $AX_CMAKE_ARGS -DCMAKE_BUILD_TYPE=Release -DAXENGINE_PYTHON=python3 "${cfe[@]}" 2>&1 | tail -n 8
cmake --build "$build" -j "$(nproc)" 2>&1 | tail -n 20
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
ctest --test-dir "$build" -j 4 --output-on-failure --timeout 600 "$@" 2>&1 | tee "$out/ctest-gpu.log" | tail -n 40
