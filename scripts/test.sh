#!/usr/bin/env bash
# The whole test suite from a fresh machine: set up, build, run every test (CTest). .ci/run calls this.
#   scripts/test.sh [CMAKE_ARGS...]              the normal build (build/)
#   scripts/test.sh --sanitize [CMAKE_ARGS...]   the CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer,
#                                                built into build-sanitize/ (docs/testing.md)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
timeout=900
if [ "${1:-}" = "--sanitize" ]; then
  shift
  export AXENGINE_BUILD=build-sanitize
  set -- -DAXENGINE_WITH_CUDA=OFF -DAXENGINE_SANITIZE=address,undefined "$@"
  # Any report fails its test; LeakSanitizer ignores what LibTorch and the Python peers allocate for the life of
  # the process (tests/sanitize/lsan.supp says which and why).
  export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
  export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0}"
  timeout=2700  # instrumented code runs 2-3x slower
fi
source "$root/scripts/env.sh"
"$root/scripts/build.sh" "$@"
ctest --test-dir "$root/$AXENGINE_BUILD" -j "$(nproc)" --output-on-failure --timeout "$timeout"
