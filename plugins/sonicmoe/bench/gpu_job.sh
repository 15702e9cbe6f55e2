#!/usr/bin/env bash
# The sonicmoe job for the H200 (the `device` tool; set up as scripts/gpu-test.sh says: carry [".axdev"]):
#   command: bash plugins/sonicmoe/bench/gpu_job.sh
# Builds the plugin, scattermoe (the fallback and the comparison), their tests and the benches; runs the
# CPU selection/decline cases and the CUDA moe.mlp conformance of sonicmoe (full grid, every case logged),
# scattermoe's moe.mlp conformance, sonicmoe_bench (fwd, fwd+bwd, saved bytes vs scattermoe and a dense
# cuBLAS GEMM of the forward's FLOPs) and `axengine bench moe` on the issue's shapes. Logs go to $OUT.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
source "$root/.axdev/env.sh"
build=${AXENGINE_GPU_BUILD:-/tmp/axbuild}
out=${OUT:-/tmp}
cfe=()
[ -f "$root/.axdev/cudnn_frontend/include/cudnn_frontend.h" ] && cfe=(-DAX_CUDNN_FRONTEND_INCLUDE="$root/.axdev/cudnn_frontend/include")
cmake -S "$root" -B "$build" $AX_CMAKE_ARGS -DCMAKE_BUILD_TYPE=Release -DAXENGINE_PYTHON=python3 "${cfe[@]}" 2>&1 | tail -n 4
if ! cmake --build "$build" -j "$(nproc)" --target axengine sonicmoe scattermoe sonicmoe_tests scattermoe_tests \
    sonicmoe_bench 2>&1 | tail -n 30; then
  echo "BUILD FAILED"; exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
rc=0
echo "== sonicmoe CTest cases (selection and declines by AXENGINE_ARCH; CUDA conformance, quick grid)"
ctest --test-dir "$build" -R 'sonicmoe' --output-on-failure --timeout 900 2>&1 | tee "$out/sonicmoe-ctest.log" | tail -n 30 || rc=1
echo "== sonicmoe moe.mlp conformance, full grid (every case: $out/sonicmoe-conformance-full.log)"
AXENGINE_SONICMOE_FULL=1 "$build/bin/sonicmoe_tests" -s \
  --test-case='sonicmoe passes the moe.mlp conformance problems (CUDA sm_90)' > "$out/sonicmoe-conformance-full.log" 2>&1 || rc=1
grep -c "MESSAGE: pass" "$out/sonicmoe-conformance-full.log" | sed 's/^/passed cases: /'
grep -E "MESSAGE: (fail|skip)|ERROR|failing cases" "$out/sonicmoe-conformance-full.log" | head -n 60
tail -n 4 "$out/sonicmoe-conformance-full.log"
echo "== scattermoe moe.mlp conformance (the fallback)"
ctest --test-dir "$build" -R 'scattermoe provides moe.mlp' --output-on-failure --timeout 900 2>&1 | tail -n 8 || rc=1
echo "== sonicmoe_bench (T=4096, r=16, bf16)"
"$build/bin/sonicmoe_bench" --json "$out/sonicmoe-bench.json" 2>&1 | tee "$out/sonicmoe-bench.log" || rc=1
echo "== axengine bench moe (fwd+bwd, rested and sustained, peak memory)"
"$build/bin/axengine" bench moe --backend grouped_mm --backend mlp:scattermoe --backend mlp:sonicmoe \
  --shape qwen3-30b-a3b --shape olmoe --shape mixtral --shape gpt-oss-20b --shape qwen3.5-35b-a3b \
  --out "$out/bench-moe.json" 2>&1 | tee "$out/bench-moe.log" || rc=1
exit $rc
