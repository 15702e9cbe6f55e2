#!/usr/bin/env bash
# Regenerates the key reference in docs/config.md from the binding code (`axengine validate --schema`).
# A test fails when the two disagree.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/env.sh"
bin="${1:-$root/$AXENGINE_BUILD/bin/axengine}"
doc="$root/docs/config.md"
python3 - "$doc" "$("$bin" validate --schema)" <<'PY'
import sys
path, generated = sys.argv[1], sys.argv[2] + "\n"
begin, end = "<!-- BEGIN GENERATED: axengine validate --schema -->\n", "<!-- END GENERATED -->"
text = open(path).read()
b, e = text.index(begin) + len(begin), text.index(end)
open(path, "w").write(text[:b] + generated + text[e:])
PY
echo "updated $doc"
