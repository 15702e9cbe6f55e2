#!/usr/bin/env bash
# Times a new user's first run (issue 43) from a fresh clone with an empty ccache, and writes the result:
#   (a) scripts/quickstart.sh: seconds to the end of its first training step (its "step 1/" line), and to its end;
#   (b) then scripts/test.sh in the same clone: seconds to the end of the whole suite.
# Goals: (a) <= 12 min to the first step, (b) <= 25 min, on a 2-core machine. Run it on an otherwise idle machine;
# on a larger one, `taskset -c 0,1 bench/build/time-first-run.sh` gives the goal's 2 cores (scripts/build.sh and
# scripts/test.sh take their -j from nproc, which follows the affinity; memory is not limited).
#
#   bench/build/time-first-run.sh [--reuse-venv] [--wheels DIR] [--keep] [--out DIR] [REPO [REF]]
#     REPO, REF     what to clone (default: this checkout's repository, at its HEAD; uncommitted edits are not timed)
#     --wheels DIR  the Python wheels of scripts/requirements.txt, already downloaded (default: `pip download`ed
#                   into the scratch dir before the clock starts: from pip's cache, else PyPI)
#     --reuse-venv  time with the machine's existing virtualenv instead of a fresh one (no network needed; NOT a
#                   fresh machine's time: the venv's creation and the install of torch into it are then not counted,
#                   and the result file says so)
#     --keep        keep the scratch dir (clone, build, venv, wheels, logs) and print where it is
#     --out DIR     where the result goes (default: bench/results/ of this checkout)
#
# What a fresh machine is given and what is timed (the clock starts after the first two):
#   - not timed: the Debian packages. scripts/setup.sh of the clone runs first, with the machine's virtualenv
#     ($AXENGINE_VENV, default ~/.cache/axengine/venv; created there if missing), so that apt-get installs any
#     package missing (an image step on CI), and its pip is the one that downloads the wheels;
#   - not timed: downloading the wheels of scripts/requirements.txt (torch and its nvidia-* wheels, a few GB: a
#     network's time, not ours);
#   - timed, as scripts/quickstart.sh does it on a fresh machine: its set-up creates a new virtualenv (in the
#     scratch dir) and pip installs those wheels into it, offline (PIP_NO_INDEX, PIP_FIND_LINKS); then the build
#     (cmake configure, the target axengine_app) with an empty ccache (CCACHE_DIR in the scratch dir), the tiny
#     model and data, the run. The prepared-data cache is empty too (AXENGINE_CACHE_DIR in the scratch dir).
#     Then scripts/test.sh: the rest of the build into the same build/ and ccache, and CTest.
# Writes DIR/first-run-<date>-<host>.md: the command, date, commit, machine, what was reused, the times against the
# goals, the milestones of the quickstart (its set-up, the end of its build, the first step), CTest's summary, ccache's
# counts, the CUDA architectures the build picked, the longest tests and build steps; beside it the quickstart's
# output and the last 300 lines of the test suite's, each line prefixed by its second since that script's start.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
invocation="bench/build/time-first-run.sh${*:+ $*}"
reuse_venv=0 wheels="" keep=0 out="$here/bench/results"
while [ $# -gt 0 ]; do
  case $1 in
    --reuse-venv) reuse_venv=1; shift ;;
    --wheels) [ $# -ge 2 ] || { echo "time-first-run: --wheels needs a directory" >&2; exit 2; }
              wheels=$(cd "$2" && pwd); shift 2 ;;
    --keep) keep=1; shift ;;
    --out) [ $# -ge 2 ] || { echo "time-first-run: --out needs a directory" >&2; exit 2; }
           out=$2; shift 2 ;;
    -*) echo "time-first-run: unknown option $1 (see the comment at the top of $0)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -le 2 ] || { echo "time-first-run: at most REPO and REF, got: $*" >&2; exit 2; }
if [ $reuse_venv -eq 1 ] && [ -n "$wheels" ]; then
  echo "time-first-run: --wheels is for a fresh venv; --reuse-venv installs nothing" >&2; exit 2
fi
repo=${1:-$here}
ref=${2:-$(git -C "$here" rev-parse HEAD)}
mkdir -p "$out"
out=$(cd "$out" && pwd)

scratch=$(mktemp -d "${TMPDIR:-/tmp}/axengine-first-run.XXXXXX")
if [ $keep -eq 1 ]; then
  echo "time-first-run: scratch dir $scratch (kept)" >&2
else
  trap 'rm -rf "$scratch"' EXIT
fi
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
  echo "time-first-run: load average $load: the machine is not idle, the times will be too long" >&2
fi
# Microseconds now; whole seconds since $1 (microseconds); "M min SS s".
usecs() { local t=${EPOCHREALTIME/./}; echo $((10#$t)); }
since() { echo $((($(usecs) - $1 + 500000) / 1000000)); }
mmss() { printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); }
# Copies stdin to stdout, each line prefixed by the seconds since $1 (microseconds), to a tenth.
stamp() {
  local t0=$1 line t d
  while IFS= read -r line; do
    t=${EPOCHREALTIME/./}
    d=$(((10#$t - t0) / 100000))
    printf '%5d.%d %s\n' $((d / 10)) $((d % 10)) "$line"
  done
}

# --- before the clock: the clone, the Debian packages, the wheels
echo "time-first-run: cloning $repo at $ref" >&2
git clone -q "$repo" "$scratch/axengine"
git -C "$scratch/axengine" checkout -q --detach "$ref"
commit=$(git -C "$scratch/axengine" rev-parse HEAD)
cd "$scratch/axengine"
unset AXENGINE_BUILD AXENGINE_TARGETS AXENGINE_CUDA_ARCHS AXENGINE_PROGRESS PIP_NO_INDEX PIP_FIND_LINKS
echo "time-first-run: scripts/setup.sh (Debian packages; not timed)" >&2
machine_python=$(scripts/setup.sh 2> "$scratch/setup.log" | tail -n 1)
venv_note="fresh: created by the quickstart's set-up in the scratch dir, the wheels installed into it offline (timed)"
wheels_note="given (--wheels $wheels): their download is not timed"
if [ $reuse_venv -eq 1 ]; then
  wheels_note="those installed in the reused venv"
  venv_note="REUSED: the machine's ${machine_python%/bin/python} (its creation and the install of the wheels into it are NOT counted: not a fresh machine's time)"
else
  if [ -z "$wheels" ]; then
    echo "time-first-run: downloading the wheels of scripts/requirements.txt (not timed)" >&2
    wheels="$scratch/wheels"
    wheels_note="downloaded before the clock (not timed) by pip download -r scripts/requirements.txt"
    "$machine_python" -m pip download -q --disable-pip-version-check -r scripts/requirements.txt -d "$wheels" >&2
  fi
  export AXENGINE_VENV="$scratch/venv" PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels"
fi
export CCACHE_DIR="$scratch/ccache" AXENGINE_CACHE_DIR="$scratch/prepared"  # empty: every compile is a miss
mkdir -p "$CCACHE_DIR"

# --- (a) the quickstart; its output on a pipe, so the trainer logs "step 1/N" as a line (no progress bar)
echo "time-first-run: scripts/quickstart.sh (timed)" >&2
t0=$(usecs)
set +e
scripts/quickstart.sh 2>&1 | stamp "$t0" > "$scratch/quickstart.log"
rc_quick=${PIPESTATUS[0]}
s_quick=$(since "$t0")
ninja_quick=$(wc -l < build/.ninja_log 2>/dev/null || echo 1)
# --- (b) the test suite, in the same clone
echo "time-first-run: scripts/test.sh (timed)" >&2
t1=$(usecs)
scripts/test.sh 2>&1 | stamp "$t1" > "$scratch/test.log"
rc_test=${PIPESTATUS[0]}
s_test=$(since "$t1")
set -e

# The quickstart's milestones, from its stamped lines: the set-up's last line, ninja's last [n/N], the first step.
first() { awk -v re="$1" '$0 ~ re { printf "%.0f", $1; exit }' "$scratch/quickstart.log"; }
last() { awk -v re="$1" '$0 ~ re { t = $1 } END { if (t != "") printf "%.0f", t }' "$scratch/quickstart.log"; }
s_setup=$(first '^ *[0-9.]+ setup: torch ')
s_build=$(last '^ *[0-9.]+ \[[0-9]+/[0-9]+\] ')
s_first=$(first ' step 1/[0-9]+ ')
verdict() { # seconds (empty: not reached), goal in minutes
  if [ -z "$1" ]; then echo "not measured"
  elif [ "$1" -le $(($2 * 60)) ]; then echo "met"
  else echo "NOT met"; fi
}
at() { [ -n "$1" ] && echo "$1 s ($(mmss "$1"))" || echo "— (no such line: see the log)"; }

host=$(hostname -s 2>/dev/null || echo host)
result="$out/first-run-$(date -u +%Y-%m-%d)-$host.md"
gpu=$(nvidia-smi -L 2>/dev/null | sed 's/ (UUID.*//' | paste -sd ';' -) || true
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "# First run: the quickstart and the test suite from a fresh clone (bench/build/time-first-run.sh)"
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| date | $(date -u '+%Y-%m-%d %H:%M') UTC |"
  echo "| command | \`$invocation\` (clone of \`$repo\`) |"
  echo "| commit | $commit |"
  echo "| device | $cpu; nproc $(nproc) (of $(getconf _NPROCESSORS_ONLN) online); $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo); GPU: ${gpu:-none} |"
  echo "| os | $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r) |"
  echo "| load average at start | $load |"
  echo "| Debian packages | installed before the clock (scripts/setup.sh; not timed) |"
  echo "| Python wheels | $wheels_note |"
  echo "| virtualenv | $venv_note |"
  echo "| ccache | empty at the start (CCACHE_DIR in the scratch dir) |"
  echo
  echo "| what | command | seconds | time | goal | exit |"
  echo "|---|---|---|---|---|---|"
  echo "| (a) quickstart to the end of its first training step | \`scripts/quickstart.sh\` to its \"step 1/\" line | ${s_first:-—} | **$([ -n "$s_first" ] && mmss "$s_first" || echo —)** | ≤ 12 min: $(verdict "$s_first" 12) | |"
  echo "| quickstart to its end | \`scripts/quickstart.sh\` | $s_quick | $(mmss "$s_quick") | | $rc_quick |"
  echo "| (b) the test suite after it | \`scripts/test.sh\` | $s_test | **$(mmss "$s_test")** | ≤ 25 min: $([ "$rc_test" = 0 ] && verdict "$s_test" 25 || echo "not measured: it failed") | $rc_test |"
  echo
  echo "The quickstart's milestones (seconds since it started): its set-up done (venv, wheels installed)"
  echo "$(at "$s_setup"); its build done $(at "$s_build") ($((ninja_quick - 1)) build steps); the first training step"
  echo "$(at "$s_first")."
  echo
  echo "CTest: $(grep -E 'tests passed|tests failed' "$scratch/test.log" | tail -n 1 | cut -c9-); $(grep -E 'Total Test time' "$scratch/test.log" | tail -n 1 | cut -c9-) (the rest of test.sh's time is its build: $(( $(wc -l < build/.ninja_log 2>/dev/null || echo 1) - ninja_quick )) more build steps)"
  echo
  echo "CUDA: $(grep -h 'axengine: CUDA' "$scratch/quickstart.log" | sed 's/.*axengine: CUDA/CUDA/' | sort -u | paste -sd ';' -)"
  echo
  echo "ccache after both: $(ccache -s 2>/dev/null | grep -E 'Hits|Misses' | tr -s ' ' | paste -sd ';' -)"
  echo
  echo "The 25 longest tests (CTest's seconds, $(nproc) at a time):"
  echo
  echo '```'
  sed -n 's/^ *[0-9.]* *[0-9]*\/[0-9]* Test *#[0-9]*: \(.*[^ ]\) \.\.\.*[^0-9]*\([0-9.]*\) sec$/\2  \1/p' "$scratch/test.log" | sort -rn | head -n 25 || true
  echo '```'
  echo
  echo "The 15 longest build steps (.ninja_log, seconds of wall time, $(nproc) jobs at a time):"
  echo
  echo '```'
  { [ -f build/.ninja_log ] && awk 'NR > 1 { printf "%7.1f  %s\n", ($2 - $1) / 1000, $4 }' build/.ninja_log | sort -rn | head -n 15; } || true
  echo '```'
} > "$result"
cp "$scratch/quickstart.log" "${result%.md}-quickstart.log"
tail -n 300 "$scratch/test.log" > "${result%.md}-test-tail.log"
cat "$result"
echo "time-first-run: wrote $result (and its -quickstart.log, -test-tail.log)" >&2
