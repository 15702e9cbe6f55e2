#!/usr/bin/env bash
# The whole test suite from a fresh machine: set up, build, run every test (CTest). .ci/run calls this.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"
"$root/scripts/build.sh" "$@"
ctest --test-dir "$root/$AXENGINE_BUILD" -j "$(nproc)" --output-on-failure --timeout 900
