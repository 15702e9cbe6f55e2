#!/usr/bin/env bash
# The main job on the embedded default, from a fresh machine: set up, build, then
#   axengine run --config configs/quickstart.toml
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"
"$root/scripts/build.sh"
exec "$root/$AXENGINE_BUILD/bin/axengine" run --config "$root/configs/quickstart.toml" "$@"
