#!/usr/bin/env bash
# bench_ab_test.sh — tests tools/bench_ab.py on bench_gpu logs written here: two builds' runs
# alternated A B A B give each label's median, its spread and B / A; the Nth table of a log with
# several (bench_ab.log) is picked by FILE:N; the exact path's table (no tokens/s column) is not
# read as a run; a missing file, a table that is not there and a bad argument fail with a message.
set -euo pipefail

tool="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/bench_ab.py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# log FILE COLD HIT ...: one whole-row table per (cold, hit) pair, then an exact-path table
log() {
  local f=$1; shift
  : > "$f"
  while [ $# -ge 2 ]; do
    printf 'ceilings: 800 TFLOP/s bf16\n| case | p50 ms | min ms | tokens/s (p50) | GFLOP |\n| --- | ---: | ---: | ---: | ---: |\n' >> "$f"
    printf '| cold 4096 | %s | 1.0 | 300000 | 4701.5 |\n| hit 4096+128 | %s | 1.0 | 80000 | 160.2 |\n\n' "$1" "$2" >> "$f"
    shift 2
  done
  printf '| case | exact ms | max |\n| --- | ---: | ---: |\n| cold 4096 | 2112.9 | 2.16e-02 |\n' >> "$f"
}
log "$work/a1" 13.20 1.600
log "$work/b1" 13.00 1.650
log "$work/a2" 13.10 1.620
log "$work/b2" 13.04 1.630 12.50 1.500

out=$(python3 "$tool" A="$work/a1" B="$work/b1" A="$work/a2" B="$work/b2")
echo "$out"
grep -q '^| cold 4096 | 13.200 | 13.000 | 13.100 | 13.040 | 13.150 (0.100) | 13.020 (0.040) | 0.990 |$' <<<"$out" ||
  fail "cold 4096: medians, spreads and B / A"
grep -q '^| hit 4096+128 | 1.600 | 1.650 | 1.620 | 1.630 | 1.610 (0.020) | 1.640 (0.020) | 1.019 |$' <<<"$out" ||
  fail "hit 4096+128: medians, spreads and B / A"
[ "$(grep -c '^| cold 4096 |' <<<"$out")" = 1 ] || fail "the exact path's table read as a run"

out=$(python3 "$tool" base="$work/a1" second="$work/b2:2")
grep -q '^| cold 4096 | 13.200 | 12.500 | .* | 0.947 |$' <<<"$out" || fail "FILE:2 picks the second table"

if msg=$(python3 "$tool" A="$work/a1" B="$work/b2:3" 2>&1); then fail "a third table that is not there"; fi
grep -q '2 whole-row table(s), asked for run 3' <<<"$msg" || fail "no message for a missing table: $msg"
if msg=$(python3 "$tool" A="$work/a1" B="$work/nothing" 2>&1); then fail "a missing file"; fi
grep -q 'nothing: No such file' <<<"$msg" || fail "no message for a missing file: $msg"
if python3 "$tool" "$work/a1" >/dev/null 2>&1; then fail "an argument without LABEL="; fi

[ "$failures" = 0 ] && echo "bench_ab_test: all passed"
exit $((failures > 0))
