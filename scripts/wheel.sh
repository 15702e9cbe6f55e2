#!/usr/bin/env bash
# Builds what the `axengine` command needs (scripts/build.sh, target axengine_app: the executable and its plugins)
# and packs it into a wheel in dist/ (scripts/make_wheel.py; docs/packaging.md):
#   scripts/wheel.sh [CMAKE_ARGS...]        then: pip install dist/axengine-*.whl   (into an environment with torch)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"
AXENGINE_TARGETS=axengine_app "$root/scripts/build.sh" "$@"
python3 "$root/scripts/make_wheel.py" --build "$root/$AXENGINE_BUILD" --out "$root/dist"
