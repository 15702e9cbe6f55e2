#!/usr/bin/env bash
# The README's main job, end to end and offline: make a tiny model and a generated arithmetic dataset
# (each only when missing), then train a LoRA adapter on it with configs/quickstart.toml.
#   scripts/quickstart.sh                 # build must exist (scripts/setup.sh)
#   scripts/quickstart.sh --set train.max_steps=50   # extra arguments go to `axengine run`
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
AX="${AXENGINE_BIN:-$AXENGINE_BUILD/bin/axengine}"
[ -x "$AX" ] || { echo "quickstart: $AX not found; build first (scripts/setup.sh)" >&2; exit 2; }

MODEL=runs/quickstart-model
DATA=runs/quickstart-data
if [ ! -f "$MODEL/config.json" ]; then
  "$AX" init-model --preset tiny-llama --out "$MODEL"
fi
if [ ! -f "$DATA/train.jsonl" ] || [ ! -f "$DATA/eval.jsonl" ]; then
  "$AX" make-data --task arithmetic --out "$DATA" --train 4000 --eval 200 --digits 2
fi
exec "$AX" run --config configs/quickstart.toml "$@"
