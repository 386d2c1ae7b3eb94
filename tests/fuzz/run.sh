#!/bin/bash
# run.sh — runs every libFuzzer binary fuzz_* found in BUILD_DIR for SECONDS each.
#
#   bash tests/fuzz/run.sh BUILD_DIR SECONDS
#
# Seeds come from tests/fuzz/corpus/<name>/ when that folder exists; new inputs the fuzzer finds go
# to a scratch corpus under BUILD_DIR/fuzz-corpus/<name>/ (the committed seeds are never modified).
# Crash reproducers are written to BUILD_DIR/fuzz-artifacts/<name>/. Exits non-zero when any target
# fails.
set -u
if [ $# -ne 2 ]; then
    echo "usage: bash tests/fuzz/run.sh BUILD_DIR SECONDS" >&2
    exit 2
fi
build=$1
seconds=$2
here=$(cd "$(dirname "$0")" && pwd)
status=0
found=0
for bin in "$build"/fuzz_*; do
    [ -x "$bin" ] && [ -f "$bin" ] || continue
    found=1
    name=$(basename "$bin")
    work="$build/fuzz-corpus/$name"
    artifacts="$build/fuzz-artifacts/$name"
    mkdir -p "$work" "$artifacts"
    seeds=()
    [ -d "$here/corpus/$name" ] && seeds+=("$here/corpus/$name")
    echo "== $name: ${seconds}s"
    if ! "$bin" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$artifacts/" \
        "$work" "${seeds[@]}"; then
        echo "== $name: FAILED (reproducers in $artifacts)" >&2
        status=1
    fi
done
if [ $found = 0 ]; then
    echo "run.sh: no fuzz_* binaries in $build (configure with CC=clang -DSQUAD_FUZZ=ON)" >&2
    exit 2
fi
exit $status
