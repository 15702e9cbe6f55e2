#!/usr/bin/env bash
# The main job on the embedded default, from a fresh machine and offline: set up and build, make a tiny
# model and a generated arithmetic dataset (each only when missing), then
#   axengine run --config configs/quickstart.toml
# Extra arguments go to `axengine run` (e.g. --set train.max_steps=50, --resume).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"
# Only what the command needs: the executable and its plugins (the tests are scripts/test.sh's).
AXENGINE_TARGETS=axengine_app "$root/scripts/build.sh"
ax="$root/$AXENGINE_BUILD/bin/axengine"
model="$root/runs/quickstart-model"
data="$root/runs/quickstart-data"
[ -f "$model/config.json" ] || "$ax" init-model --preset tiny-llama --out "$model"
[ -f "$data/train.jsonl" ] && [ -f "$data/eval.jsonl" ] ||
  "$ax" make-data --task arithmetic --out "$data" --train 80 --eval 20 --digits 1
exec "$ax" run --config "$root/configs/quickstart.toml" "$@"
