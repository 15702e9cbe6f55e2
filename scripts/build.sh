#!/usr/bin/env bash
# Sets the machine up (scripts/setup.sh) and builds axengine into $AXENGINE_BUILD (default: build/).
# Extra arguments go to CMake's configure step, e.g. -DAXENGINE_WITH_CUDA=OFF.
# AXENGINE_TARGETS: the targets to build (default: all of them); scripts/quickstart.sh builds axengine_app, the
# executable and its plugins. AXENGINE_CUDA_ARCHS: the GPU architectures (docs/gpu.md, "CUDA architectures").
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"
python=$("$root/scripts/setup.sh" | tail -n 1)
export CCACHE_BASEDIR="$root"
cmake -S "$root" -B "$root/$AXENGINE_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAXENGINE_PYTHON="$python" "$@"
build=(cmake --build "$root/$AXENGINE_BUILD" -j "$(nproc)")
[ -z "${AXENGINE_TARGETS:-}" ] || build+=(--target $AXENGINE_TARGETS)
"${build[@]}"
