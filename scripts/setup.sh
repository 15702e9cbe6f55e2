#!/usr/bin/env bash
# Installs everything axengine needs on a fresh Debian 12 machine. Idempotent: a second run only checks.
#   - Debian packages: compilers' helpers (cmake, ninja, ccache) and our C++ dependencies.
#   - LibTorch: the torch==2.11.0 wheel from PyPI, in a virtualenv outside the checkout (shared by every
#     clone on this machine), plus the Python peers used for goldens and parity tests (transformers, peft...).
# Prints the virtualenv's python on the last line of stdout, for scripts that capture it.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"

debs=(build-essential cmake ninja-build ccache pkg-config python3-venv
      libboost1.74-dev libboost-program-options1.74-dev libboost-filesystem1.74-dev libboost-system1.74-dev
      libtomlplusplus-dev libspdlog-dev libfmt-dev doctest-dev libtbb-dev
      nlohmann-json3-dev libpcre2-dev libutf8proc-dev libxxhash-dev
      libjpeg62-turbo-dev libpng-dev libwebp-dev  # the mm_cpt plugin's image codecs
      libedit-dev                                 # axengine chat's line editing on a terminal
      patchelf)                                   # scripts/make_wheel.py: the wheel's run paths
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

if [ ! -x "$AXENGINE_VENV/bin/python" ]; then
  echo "setup: creating virtualenv $AXENGINE_VENV" >&2
  python3 -m venv "$AXENGINE_VENV" >&2
fi
# Pinned peers: LibTorch itself, and the references our goldens and parity tests are measured against.
# Checked offline first (importlib.metadata), so a set-up machine does not ask PyPI again.
pinned_ok() {
  "$AXENGINE_VENV/bin/python" - "$1" <<'PY'
import sys, importlib.metadata as md
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line: continue
    name, want = line.split("==")
    try:
        if md.version(name) != want: sys.exit(1)
    except md.PackageNotFoundError:
        sys.exit(1)
PY
}
if ! pinned_ok "$here/requirements.txt"; then
  echo "setup: installing Python requirements into $AXENGINE_VENV (the first run downloads LibTorch, a few GB)" >&2
  "$AXENGINE_VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt" >&2
fi
# Wheels used only for the C++ headers they ship (CUTLASS / CuTe): without their Python dependencies.
# Optional: where PyPI cannot be reached the build goes on without the targets that need them.
if ! pinned_ok "$here/requirements-headers.txt"; then
  "$AXENGINE_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$here/requirements-headers.txt" >&2 ||
    echo "setup: could not install scripts/requirements-headers.txt (CUTLASS headers): those targets are skipped" >&2
fi
"$AXENGINE_VENV/bin/python" - >&2 <<'PY'
import torch
assert torch.__version__.split("+")[0] == "2.11.0", f"axengine needs torch 2.11.0, found {torch.__version__}"
print(f"setup: torch {torch.__version__} (cuda {torch.version.cuda}) at {torch.utils.cmake_prefix_path}")
PY
echo "$AXENGINE_VENV/bin/python"
