#!/usr/bin/env bash
# cache_bench.sh — the state-cache workload benchmark: an agent trace (bench/agent_trace.py)
# through bench_cache on the CPU, with and without the cache, on a synthesized model.
#
# Usage: bash bench/cache_bench.sh BUILD_DIR
# Environment (all optional): PRESET (demo), SESSIONS (16), LIVE (4), STEPS (6), SEED (1),
# CACHE_MB (64: holds the live sessions' states), TIGHT_MB (8: a budget that evicts), THREADS (1),
# CLOCK (cpu: process CPU time, exact with one thread on a shared machine; wall).
# Prints bench_cache's report for each budget; bench/RESULTS.md records the figures.
set -euo pipefail
BUILD=${1:?usage: bash bench/cache_bench.sh BUILD_DIR}
PRESET=${PRESET:-demo}
SESSIONS=${SESSIONS:-16}
LIVE=${LIVE:-4}
STEPS=${STEPS:-6}
SEED=${SEED:-1}
CACHE_MB=${CACHE_MB:-64}
TIGHT_MB=${TIGHT_MB:-8}
THREADS=${THREADS:-1}
CLOCK=${CLOCK:-cpu}

cd "$(dirname "$0")/.."
DATA="$BUILD/bench-data"
MODEL="$DATA/$PRESET"
TRACE="$DATA/agent_trace-s$SEED-$SESSIONS-$LIVE-$STEPS.jsonl"
mkdir -p "$DATA"
[ -f "$MODEL/config.json" ] || "$BUILD/squad" synth --preset "$PRESET" --out "$MODEL"
VOCAB=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("text_config", c)["vocab_size"])' "$MODEL/config.json")
[ -f "$TRACE" ] || python3 bench/agent_trace.py --seed "$SEED" --sessions "$SESSIONS" --live "$LIVE" \
    --steps "$STEPS" --vocab "$VOCAB" --out "$TRACE"

echo "== state cache: $PRESET, $(wc -l < "$TRACE") rows, budget $CACHE_MB MB (with the uncached baseline)"
"$BUILD/bench_cache" --model "$MODEL" --rows "$TRACE" --cache-mb "$CACHE_MB" --threads "$THREADS" \
    --clock "$CLOCK" --label "$PRESET budget $CACHE_MB MB"
echo "== state cache: $PRESET, budget $TIGHT_MB MB (evicting)"
"$BUILD/bench_cache" --model "$MODEL" --rows "$TRACE" --cache-mb "$TIGHT_MB" --threads "$THREADS" --no-baseline \
    --clock "$CLOCK" --label "$PRESET budget $TIGHT_MB MB"
