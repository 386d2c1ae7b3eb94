#!/usr/bin/env bash
# bench/run.sh BUILD_DIR — every CPU benchmark in one go (`make bench`). Figures go to stdout;
# bench/RESULTS.md keeps the recorded ones with date, machine and command.
set -euo pipefail
BUILD=${1:-build}
SQUAD=$BUILD/squad
MODEL=${SQUAD_BENCH_MODEL:-/tmp/squad-bench-qwen3.5-0.8b}
THREADS=${SQUAD_BENCH_THREADS:-2}

echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(date -u +%F)"

# The 0.8B preset: the reference shapes (1.5 GB, written once).
if [ ! -f "$MODEL/model.safetensors" ]; then
  "$SQUAD" synth --preset qwen3.5-0.8b --out "$MODEL"
fi

echo "== engine: cold rows and a 128-token question on a cached 2048-token state (qwen3.5-0.8b, $THREADS threads)"
for prec in bf16 exact; do # bf16: the default; exact: the fp32 reference path, for comparison
  echo "-- precision $prec"
  "$SQUAD" bench --model "$MODEL" --device cpu --threads "$THREADS" --precision "$prec" \
    --lengths 128,512,2048 --reps 3 --state 2048 --suffix 128
done

echo "== GEMM vs OpenBLAS sgemm"
"$BUILD"/bench_gemm

echo "== state cache: an agent trace with and without the cache (demo preset)"
bash bench/cache_bench.sh "$BUILD" # one thread, CPU time (see the script)

echo "== tokenizer"
if [ -f third_party/qwen3/tokenizer.json ]; then "$BUILD"/bench_tokenizer third_party/qwen3/tokenizer.json; fi
