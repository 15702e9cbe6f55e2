#!/usr/bin/env bash
# CTest bench_time-first-run_times_a_fresh_clone: bench/build/time-first-run.sh on a made-up repository whose
# scripts/setup.sh, quickstart.sh and test.sh stand in for the real ones (seconds, not the 40 minutes of a build):
# it clones REF (not the working tree), runs the quickstart with an empty ccache, a fresh venv in its scratch dir and
# pip told to install offline from the given wheels, stops the clock of (a) at the "step 1/" line, runs test.sh in the
# same clone, and writes the result file with the command, commit, machine, times, goals and CTest's summary.
#   time_first_run_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
rm -rf "$work"
mkdir -p "$work/repo/scripts" "$work/wheels" "$work/out"
cd "$work/repo"
git init -q .
cat > scripts/setup.sh <<'SH'
#!/usr/bin/env bash
echo "setup: torch 2.11.0 (made up) at ${AXENGINE_VENV:-default}" >&2
echo "${AXENGINE_VENV:-/nonexistent}/bin/python"
SH
# The quickstart checks the environment a fresh machine's run gets, then builds and trains in a second's time.
cat > scripts/quickstart.sh <<'SH'
#!/usr/bin/env bash
set -eu
scripts/setup.sh > /dev/null
case $AXENGINE_VENV in "$SCRATCH_PREFIX"*/venv) ;; *) echo "venv $AXENGINE_VENV is not fresh"; exit 3 ;; esac
[ "${PIP_NO_INDEX:-}" = 1 ] && [ "$PIP_FIND_LINKS" = "$WHEELS" ] || { echo "pip is not offline on $WHEELS"; exit 3; }
case $CCACHE_DIR in "$SCRATCH_PREFIX"*) ;; *) echo "ccache $CCACHE_DIR is the machine's"; exit 3 ;; esac
[ -z "$(ls -A "$CCACHE_DIR")" ] || { echo "ccache $CCACHE_DIR is not empty"; exit 3; }
case $AXENGINE_CACHE_DIR in "$SCRATCH_PREFIX"*) ;; *) echo "prepared-data cache $AXENGINE_CACHE_DIR"; exit 3 ;; esac
[ -z "${AXENGINE_TARGETS:-}${AXENGINE_PROGRESS:-}" ] || { echo "build settings leaked in"; exit 3; }
mkdir -p build
printf '# ninja log v5\n0\t1500\t0\tbin/axengine\t0\n1500\t2000\t0\tbin/plugins/a.so\t0\n' > build/.ninja_log
echo "-- axengine: CUDA architectures 90a-real;80-virtual (no GPU found)"
echo "[1/2] Building CXX object a.o"
echo "[2/2] Linking CXX executable bin/axengine"
sleep 1
echo "[info] step 1/3  epoch 0.10  loss 7.3200"
echo "[info] step 3/3  epoch 0.30  loss 5.1000"
SH
cat > scripts/test.sh <<'SH'
#!/usr/bin/env bash
printf '2000\t2600\t0\tbin/axengine_tests\t0\n' >> build/.ninja_log
echo "1/2 Test #2: slow_one .........................   Passed    2.50 sec"
echo "2/2 Test #1: quick_one ........................   Passed    0.25 sec"
echo
echo "100% tests passed, 0 tests failed out of 2"
echo
echo "Total Test time (real) =   2.80 sec"
SH
touch scripts/requirements.txt
chmod +x scripts/*.sh
git add -A && git -c user.name=t -c user.email=t@t commit -q -m fake
commit=$(git rev-parse HEAD)
echo 'echo "the working tree, not the commit"; exit 9' >> scripts/quickstart.sh  # uncommitted: not what is timed

export TMPDIR="$work/tmp" SCRATCH_PREFIX="$work/tmp/axengine-first-run." WHEELS="$work/wheels"
mkdir -p "$TMPDIR"
tool="$src/bench/build/time-first-run.sh"
echo "--- usage errors: exit 2"
for bad in "--bogus" "--reuse-venv --wheels $work/wheels" "--out"; do
  rc=0; "$tool" $bad > /dev/null 2>&1 || rc=$?
  [ $rc -eq 2 ] || { echo "time-first-run.sh $bad: exit $rc, not 2"; exit 1; }
done

echo "--- a timed run of the made-up repository"
"$tool" --wheels "$work/wheels" --out "$work/out" "$work/repo" "$commit"
result=$(ls "$work"/out/first-run-*-*.md)
[ "$(echo "$result" | wc -l)" -eq 1 ] || { echo "expected one result file: $result"; exit 1; }
fail=0
expect() { grep -qE -- "$1" "$result" || { echo "the result file lacks: $1"; fail=1; }; }
expect "^\| date \| [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2} UTC \|"
expect "^\| command \| \`bench/build/time-first-run.sh --wheels $work/wheels --out $work/out $work/repo $commit\`"
expect "^\| commit \| $commit \|"
expect "^\| device \| .*nproc [0-9]+ "
expect "^\| virtualenv \| fresh"
expect "^\| Python wheels \| given \(--wheels $work/wheels\)"
expect "^\| \(a\) quickstart to the end of its first training step \| .* \| [12] \| \*\*0 min 0[12] s\*\* \| ≤ 12 min: met \|"
expect "^\| quickstart to its end \| .* \| 0 \|$"
expect "^\| \(b\) the test suite after it \| .* \| ≤ 25 min: met \| 0 \|$"
expect "its build done [0-9]+ s \(0 min 0[0-9] s\) \(2 build steps\)"
expect "^CTest: 100% tests passed, 0 tests failed out of 2; Total Test time \(real\) = +2.80 sec .*: 1 more build steps\)"
expect "^CUDA: CUDA architectures 90a-real;80-virtual \(no GPU found\)$"
expect "^2.50  slow_one$"
expect "^ +1.5  bin/axengine$"
grep -q "step 1/3" "${result%.md}-quickstart.log" || { echo "no quickstart log beside the result"; fail=1; }
[ -z "$(ls -A "$TMPDIR")" ] || { echo "the scratch dir was left: $(ls "$TMPDIR")"; fail=1; }
[ $fail -eq 0 ] || { cat "$result"; exit 1; }
echo "time-first-run ok"
