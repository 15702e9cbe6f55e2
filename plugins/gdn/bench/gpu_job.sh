#!/usr/bin/env bash
# The gdn job for a GPU machine (the `device` tool; set up as scripts/gpu-test.sh says: carry [".axdev"]):
#   command: bash plugins/gdn/bench/gpu_job.sh
# Builds the plugin, its tests and gdn_bench; runs gdn_tests (the CUDA kernels against the reference on the
# contract's cases) and gdn_conformance (the suite's linear_attention grid on the GPU, graph capture
# included); then gdn_bench (gdn vs core's aten backend) and, when flash-linear-attention is importable,
# fla_bench.py (fla's chunk_gated_delta_rule at the same shapes, added to the same result file). Logs and
# the result JSON go to $OUT.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
source "$root/.axdev/env.sh"
build=${AXENGINE_GPU_BUILD:-/tmp/axbuild}
out=${OUT:-/tmp}
cmake -S "$root" -B "$build" $AX_CMAKE_ARGS -DCMAKE_BUILD_TYPE=Release -DAXENGINE_PYTHON=python3 2>&1 | tail -n 4
if ! cmake --build "$build" -j "$(nproc)" --target axengine gdn gdn_tests gdn_bench 2>&1 | tail -n 30; then
  echo "BUILD FAILED"; exit 1
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr 'A-Z ' 'a-z-')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
rc=0
echo "== gdn CTest cases (gdn_tests' cases, gdn_conformance)"
ctest --test-dir "$build" -R 'gdn' --output-on-failure --timeout 1800 2>&1 | tee "$out/gdn-ctest.log" | tail -n 30 || rc=1
echo "== gdn_bench (bf16)"
json="$out/gdn-bench-$gpu-$(date -u +%F).json"
"$build/bin/gdn_bench" --json "$json" 2>&1 | tee "$out/gdn-bench.log" || rc=1
if python3 -c "import fla.ops.gated_delta_rule" 2>/dev/null; then
  echo "== fla_bench (flash-linear-attention's chunk_gated_delta_rule, same shapes)"
  python3 "$root/plugins/gdn/bench/fla_bench.py" --in "$json" --out "${json%.json}-fla.json" 2>&1 | tee -a "$out/gdn-bench.log" || rc=1
else
  echo "== fla_bench skipped: flash-linear-attention (fla-core) is not importable on this machine"
fi
exit $rc
