#!/usr/bin/env bash
# CTest wheel_installs_and_runs_quickstart: the wheel scripts/make_wheel.py packs from this build, pip-installed into a
# fresh virtualenv, gives an `axengine` command that finds LibTorch, Arrow and its bundled libraries by its own run
# paths (no LD_LIBRARY_PATH; ldd resolves nothing outside the venv but the C/C++ runtime), loads its plugins, trains
# the quickstart model for 3 steps, and whose SDK find_package(axengine) configures examples/plugin_minimal.
#   wheel_test.sh BUILD_DIR SOURCE_DIR WORK_DIR PYTHON
# The venv gets the build venv's packages (torch, its nvidia-* wheels, pyarrow) linked into its site-packages, where
# pip would have installed them, instead of a multi-GB download per run; pip then installs the wheel offline
# (--no-index), so every Requires-Dist must be satisfied by those packages.
set -euo pipefail
build=$1 src=$2 work=$3 python=$4
unset LD_LIBRARY_PATH
rm -rf "$work"
mkdir -p "$work"

whl=$("$python" "$src/scripts/make_wheel.py" --build "$build" --out "$work/dist" --compress-level 1 | tail -n 1)
"$python" -m venv "$work/venv"
site_from=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
site_to=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for e in "$site_from"/*; do
  case $(basename "$e") in
    pip|pip-*|setuptools|setuptools-*|_distutils_hack|distutils-precedence.pth|pkg_resources|__pycache__|axengine|axengine-*) ;;
    *) ln -s "$e" "$site_to/" ;;
  esac
done
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index "$whl"

pkg="$site_to/axengine"
ax="$work/venv/bin/axengine"
echo "--- the installed files resolve their libraries inside the venv"
status=0
for f in "$pkg/bin/axengine" "$pkg"/bin/plugins/*.so "$pkg"/lib/*.so*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case $name in linux-vdso*|libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libutil.so*|libgcc_s.so*|libstdc++.so*|libcuda.so*) continue ;; esac
    if [ "$path" = "not" ]; then echo "$f: $name not found"; status=1
    elif [[ $path != "$work/venv/"* ]]; then echo "$f: $name from $path, outside the venv"; status=1; fi
  done < <(ldd "$f")
done
[ $status -eq 0 ] || exit 1

echo "--- axengine version, plugins list"
"$ax" version
plugins=$("$ax" plugins list 2>&1) || { echo "$plugins"; exit 1; }
echo "$plugins"
for so in "$pkg"/bin/plugins/*.so; do
  # A here-string, not `echo | grep -q`: under pipefail grep -q's early exit can kill echo with SIGPIPE once
  # the list outgrows the pipe buffer, failing the check for a line that is there.
  grep -qF "$so" <<< "$plugins" || { echo "plugins list does not show $so"; exit 1; }
done

echo "--- the quickstart model, 3 steps"
mkdir -p "$work/q/configs"
cp "$src/configs/quickstart.toml" "$work/q/configs/"
(cd "$work/q" && "$ax" init-model --preset tiny-llama --out runs/quickstart-model &&
  "$ax" make-data --task arithmetic --out runs/quickstart-data --train 80 --eval 20 --digits 1)
AXENGINE_CACHE_DIR="$work/prepared" "$ax" run --config "$work/q/configs/quickstart.toml" --set train.max_steps=3 2>&1 | tee "$work/run.log"
grep -q "done: 3 steps" "$work/run.log"
ls "$work"/q/runs/quickstart/checkpoints/*/adapter_model.safetensors

echo "--- find_package(axengine) from the installed package"
prefix=$("$work/venv/bin/python" -c 'import axengine; print(axengine.cmake_prefix_path)')
cmake -S "$src/examples/plugin_minimal" -B "$work/sdk" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  > "$work/sdk.log" || { cat "$work/sdk.log"; exit 1; }
grep "^axengine_DIR" "$work/sdk/CMakeCache.txt" | grep -qF "$pkg/lib/cmake/axengine"
grep "^AXENGINE_PYTHON" "$work/sdk/CMakeCache.txt" | grep -qF "$work/venv/bin/python3"  # the package's own environment
echo "wheel ok: $(basename "$whl")"
