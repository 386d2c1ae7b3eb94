#!/usr/bin/env bash
# check_layers_test.sh — tests tools/check_layers.sh on small trees built in a temporary directory:
# a clean tree passes; a cycle between two units, an upward include, a file no layer places, an
# include of a missing file and a cycle of headers each make it fail and are named in its output;
# a private header that includes its module's public one is not a cycle.
set -euo pipefail

checker="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/check_layers.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# new_tree NAME: a clean tree of two layers: include/squad.h and src/util (0), src/parse (1), where
# parse.c includes its private header, which includes parse.h.
new_tree() {
  local t="$work/$1"
  mkdir -p "$t/include" "$t/src" "$t/tools"
  printf '0 include/squad.h\n0 src/util.*\n\n# parsers\n1 src/parse*\n' > "$t/tools/layers.txt"
  printf '#pragma once\n' > "$t/include/squad.h"
  printf '#pragma once\n#include "squad.h"\n' > "$t/src/util.h"
  printf '#include "util.h"\n#include <stdio.h>\n' > "$t/src/util.c"
  printf '#pragma once\n#include "util.h"\n' > "$t/src/parse.h"
  printf '#pragma once\n#include "parse.h"\n' > "$t/src/parse_internal.h"
  printf '#include "parse_internal.h"\n#include "util.h"\n' > "$t/src/parse.c"
  echo "$t"
}

# expect NAME STATUS TEXT: the checker run on tree NAME exits STATUS and its output holds TEXT;
# on a failing tree, it finds exactly one problem (the one the case made).
expect() {
  local name=$1 want_status=$2 want_text=$3 out status=0
  out=$(bash "$checker" "$work/$name" 2>&1) || status=$?
  if [[ $status -ne $want_status ]]; then
    echo "FAIL $name: exit $status, want $want_status; output:"; echo "$out"; failures=$((failures + 1))
  elif [[ $want_status -ne 0 ]] && ! grep -qF "check_layers: 1 problem(s)" <<< "$out"; then
    echo "FAIL $name: not exactly one problem found; output:"; echo "$out"; failures=$((failures + 1))
  elif ! grep -qF -- "$want_text" <<< "$out"; then
    echo "FAIL $name: output lacks \"$want_text\"; output:"; echo "$out"; failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

t=$(new_tree clean)
expect clean 0 "6 files, 6 includes: every file placed, no upward include, no include cycle"

t=$(new_tree cycle)
printf '#pragma once\n' > "$t/src/parse_more.h"
printf '#include "parse_more.h"\n#include "parse.h"\n' > "$t/src/parse_more.c"
printf '#include "parse_more.h"\n' >> "$t/src/parse.c"
printf '#include "parse.h"\n' >> "$t/src/parse_more.h"
expect cycle 1 "include cycle: src/parse <-> src/parse_more"
expect cycle 1 "src/parse.c includes src/parse_more.h"

t=$(new_tree cycle_through_private_header)
printf '#pragma once\n#include "parse.h"\n' > "$t/src/parse_more.h"
printf '#include "parse_more.h"\n' > "$t/src/parse_more.c"
printf '#include "parse_more.h"\n' >> "$t/src/parse_internal.h"
expect cycle_through_private_header 1 "src/parse.c includes src/parse_internal.h, which includes src/parse_more.h"

t=$(new_tree upward)
printf '0 src/low.*\n' >> "$t/tools/layers.txt"
printf '#include "parse.h"\n' > "$t/src/low.c"
expect upward 1 "upward include: src/low.c (layer 0) includes src/parse.h (layer 1)"

t=$(new_tree upward_from_subdirectory)
mkdir -p "$t/src/low"
printf '0 src/low/*\n' >> "$t/tools/layers.txt"
printf '#include "../parse.h"\n' > "$t/src/low/x.c"
expect upward_from_subdirectory 1 "upward include: src/low/x.c (layer 0) includes src/parse.h (layer 1)"

t=$(new_tree unplaced)
printf '#include "util.h"\n' > "$t/src/newfile.c"
expect unplaced 1 "unplaced file: src/newfile.c"

t=$(new_tree unresolved)
printf '#include "missing.h"\n' >> "$t/src/parse.c"
expect unresolved 1 "unresolved include: src/parse.c includes \"missing.h\""

t=$(new_tree header_cycle)
printf '0 src/util_*\n' >> "$t/tools/layers.txt"
printf '#pragma once\n#include "util_b.h"\n' > "$t/src/util_a.h"
printf '#pragma once\n#include "util_a.h"\n' > "$t/src/util_b.h"
printf '#include "util_a.h"\n' >> "$t/src/util.c"
expect header_cycle 1 "include cycle: src/util_a.h includes itself"

if [[ $failures -gt 0 ]]; then echo "check_layers_test: $failures failure(s)"; exit 1; fi
echo "check_layers_test: all cases pass"
