#!/usr/bin/env bash
# Sets the machine up (scripts/setup.sh) and builds axengine into $AXENGINE_BUILD (default: build/).
# Extra arguments go to CMake's configure step, e.g. -DAXENGINE_WITH_CUDA=OFF.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"
python=$("$root/scripts/setup.sh" | tail -n 1)
export CCACHE_BASEDIR="$root"
cmake -S "$root" -B "$root/$AXENGINE_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAXENGINE_PYTHON="$python" "$@"
cmake --build "$root/$AXENGINE_BUILD" -j "$(nproc)"
