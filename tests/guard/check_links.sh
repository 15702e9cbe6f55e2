#!/bin/sh
# The direction of the library split, in the built binaries (docs/architecture.md, "Layers"):
#   check_links.sh LOWER UPPER...
# LOWER (a library or plugin) must not need any UPPER library (no DT_NEEDED entry naming its soname) and must
# not leave undefined any symbol an UPPER library defines (nothing it could only find when an UPPER happens to
# be loaded). The second holds even in sanitizer builds, which link without --no-undefined.
# Tools: $READELF and $NM (default readelf, nm).
set -u
readelf=${READELF:-readelf}
nm=${NM:-nm}
lower=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
"$readelf" -d "$lower" > "$tmp/dyn" || { echo "check_links: cannot read $lower"; exit 2; }
"$nm" -D --undefined-only "$lower" | awk '{print $NF}' | sort -u > "$tmp/undefined"
for upper in "$@"; do
  soname=$("$readelf" -d "$upper" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
  [ -n "$soname" ] || { echo "check_links: $upper has no soname"; exit 2; }
  if grep -q "(NEEDED).*\[$soname\]" "$tmp/dyn"; then
    echo "LINKS: $(basename "$lower") needs $soname"
    fail=1
  fi
  # Strong definitions only: weak ones (inline functions, templates) are copies every user may carry.
  "$nm" -D --defined-only "$upper" | awk '$2 ~ /^[TDBRGS]$/ {print $3}' | sort -u > "$tmp/defined"
  comm -12 "$tmp/undefined" "$tmp/defined" > "$tmp/both"
  if [ -s "$tmp/both" ]; then
    echo "LINKS: $(basename "$lower") uses $(wc -l < "$tmp/both") symbol(s) defined by $soname, e.g.:"
    head -n 5 "$tmp/both" | sed 's/^/  /'
    fail=1
  fi
done
[ $fail -eq 0 ] && echo "$(basename "$lower"): needs none of $*"
exit $fail
