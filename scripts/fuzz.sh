#!/usr/bin/env bash
# Fuzzes every parser of untrusted input with libFuzzer (docs/testing.md).
#   scripts/fuzz.sh SECONDS [HARNESS...]    build the fuzzers, run each HARNESS (default: all) for SECONDS
#   scripts/fuzz.sh 0                       only build them
# Builds with clang-16 into build-fuzz/ (-DAXENGINE_FUZZ=ON -DAXENGINE_SANITIZE=address,undefined, CPU only);
# installs clang-16 and libclang-rt-16-dev (Debian) when missing. Runs AXENGINE_FUZZ_JOBS harnesses at a time
# (default: half the cores, at least 1), each under `nice -n 10`, growing its corpus in build-fuzz/fuzz/<h>/corpus
# from the committed seeds (tests/fuzz/corpus/<h>) and regression inputs (tests/fuzz/regressions/<h>). Each run's
# log is build-fuzz/fuzz/<h>/log.txt, a crasher lands in build-fuzz/fuzz/<h>/ as crash-*, leak-*, timeout-* or
# oom-*, and build-fuzz/fuzz/summary.md gets one row per harness (executions, coverage, findings; each harness's
# row is also kept in build-fuzz/fuzz/<h>/row.md). AXENGINE_FUZZ_NO_BUILD=1 runs the fuzzers already built.
# Exit status: 0 when no harness found anything, 1 otherwise.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"
seconds=${1:?usage: scripts/fuzz.sh SECONDS [HARNESS...]}
shift
build="$root/build-fuzz"
# The harnesses tests/fuzz/CMakeLists.txt lists: its set(...) and the plugins' list(APPEND ...) (mm_cpt's, which
# build where the image codecs are installed, as scripts/setup.sh does).
all=$(sed -n '/^set(AX_FUZZ_HARNESSES/,/)/p; /list(APPEND AX_FUZZ_HARNESSES/p' "$root/tests/fuzz/CMakeLists.txt" |
  sed 's/^ *set(AX_FUZZ_HARNESSES//; s/^ *list(APPEND AX_FUZZ_HARNESSES//; s/)//' | xargs)
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || read -r -a harnesses <<<"$all"
for h in "${harnesses[@]}"; do
  [[ " $all " == *" $h "* ]] || { echo "fuzz: no harness '$h' (harnesses: $all)" >&2; exit 2; }
done

# clang with libFuzzer and the sanitizer runtimes (Debian 12 packages).
missing=()
for p in clang-16 libclang-rt-16-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

export CCACHE_BASEDIR="$root"
if [ -n "${AXENGINE_FUZZ_NO_BUILD:-}" ]; then
  :  # run what build-fuzz/ holds (e.g. while another invocation is still building the rest)
elif [ ! -f "$build/CMakeCache.txt" ]; then
  python=$("$root/scripts/setup.sh" | tail -n 1)
  # -O1 with line tables: readable sanitizer stacks, asserts kept, and a much cheaper compile than -O2 -g.
  CC=clang-16 CXX=clang++-16 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DAXENGINE_PYTHON="$python" -DAXENGINE_FUZZ=ON -DAXENGINE_SANITIZE=address,undefined \
    -DAXENGINE_WITH_CUDA=OFF -DBUILD_TESTING=OFF
fi
[ -n "${AXENGINE_FUZZ_NO_BUILD:-}" ] || cmake --build "$build" -j "$(nproc)" --target "${harnesses[@]/#/fuzz_}"
[ "$seconds" -gt 0 ] || exit 0

jobs=${AXENGINE_FUZZ_JOBS:-$(( $(nproc) / 2 ))}
[ "$jobs" -ge 1 ] || jobs=1
# Sanitizer reports are findings: stop at the first, with symbolized stacks. LeakSanitizer stays on.
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:symbolize=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/tests/sanitize/lsan.supp}"
out="$build/fuzz"
mkdir -p "$out"

run_one() {
  local h=$1 dir="$out/$1"
  mkdir -p "$dir/corpus"
  rm -f "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-*
  local dict=()
  [ -f "$root/tests/fuzz/dict/$h.dict" ] && dict=(-dict="$root/tests/fuzz/dict/$h.dict")
  local start=$SECONDS
  set +e
  nice -n 10 "$build/bin/fuzz_$h" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
    "${dict[@]}" -artifact_prefix="$dir/" "$dir/corpus" "$root/tests/fuzz/corpus/$h" "$root/tests/fuzz/regressions/$h" \
    >"$dir/log.txt" 2>&1
  echo $? >"$dir/rc"
  echo $((SECONDS - start)) >"$dir/seconds"
}

running=0
for h in "${harnesses[@]}"; do
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
  echo "fuzz: $h for ${seconds}s" >&2
  run_one "$h" &
  running=$((running + 1))
done
wait || true

summary="$out/summary.md"
{
  echo "| harness | seconds | executions | exec/s | cov | ft | corpus | findings |"
  echo "|---|---|---|---|---|---|---|---|"
} >"$summary"
found=0
for h in "${harnesses[@]}"; do
  dir="$out/$h"
  log="$dir/log.txt"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
  findings=$(cd "$dir" && ls crash-* leak-* timeout-* oom-* 2>/dev/null | xargs || true)
  rc=$(cat "$dir/rc")
  if [ -n "$findings" ] || [ "$rc" != 0 ]; then
    found=1
    findings="${findings:-none saved} (rc $rc; see $log)"
  else
    findings=none
  fi
  echo "| $h | $(cat "$dir/seconds") | ${execs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | $findings |" | tee "$dir/row.md" >>"$summary"
done
cat "$summary"
exit $found
