#!/usr/bin/env bash
# bench/run.sh BUILD_DIR — every CPU benchmark in one go (`make bench`). Figures go to stdout;
# bench/RESULTS.md keeps the recorded ones with date, machine and command.
#
# The peer: when a llama.cpp build and a GGUF of the same shapes are found (SQUAD_LLAMA_BENCH,
# SQUAD_LLAMA_GGUF, else under /tmp/peer-llama as the project's peers README builds them; never
# part of this repository), squad and llama-bench run in the same script, back to back, round
# after round, and the medians are compared: cold rows of 128 and 512 tokens (llama-bench -p), and
# 128 tokens on a cached 2048-token state (llama-bench -d 2048 -p 128). Both sides use wall time
# and the same thread count; other work on the machine slows both, which running them back to back
# (and, with SQUAD_BENCH_ROUNDS > 1, alternating) spreads over the two. The printed figure is the
# median over rounds of each run's own figure.
set -euo pipefail
BUILD=${1:-build}
SQUAD=$BUILD/squad
MODEL=${SQUAD_BENCH_MODEL:-/tmp/squad-bench-qwen3.5-0.8b}
THREADS=${SQUAD_BENCH_THREADS:-2}
ROUNDS=${SQUAD_BENCH_ROUNDS:-1} # rounds of the comparison: each runs both sides once, REPS times
REPS=${SQUAD_BENCH_REPS:-3}     # repetitions inside one run (squad's median, llama-bench's mean)
PRECISIONS=${SQUAD_BENCH_PRECISIONS:-bf16 exact}
LLAMA_BENCH=${SQUAD_LLAMA_BENCH:-/tmp/peer-llama/lc/build/bin/llama-bench}
LLAMA_GGUF=${SQUAD_LLAMA_GGUF:-/tmp/peer-llama/m08.gguf}
ISA=$("$BUILD"/bench_gemm --print-isa) # the level the CPU kernels run at (SQUAD_CPU_ISA lowers it)

echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, ISA level $ISA, $(date -u +%F)"

# The 0.8B preset: the reference shapes (1.5 GB, written once).
if [ ! -f "$MODEL/model.safetensors" ]; then
  "$SQUAD" synth --preset qwen3.5-0.8b --out "$MODEL"
fi

# The field of one JSON line: json_field LINE NAME
json_field() { grep -o "\"$2\": *[0-9.]*" <<<"$1" | head -1 | sed 's/.*: *//'; }
# The median of the numbers in a file (lower middle for an even count), "-" when there is none.
median_of() {
  if [ -s "$1" ]; then sort -g "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; else echo -; fi
}

if [ -x "$LLAMA_BENCH" ] && [ -f "$LLAMA_GGUF" ]; then
  echo "== squad vs llama.cpp ($LLAMA_BENCH), $THREADS threads, $ROUNDS round(s) of $REPS repetitions, tokens/s (wall)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for r in $(seq 1 "$ROUNDS"); do
    for prec in $PRECISIONS; do
      "$SQUAD" bench --model "$MODEL" --device cpu --threads "$THREADS" --precision "$prec" \
        --lengths 128,512 --reps "$REPS" --state 2048 --suffix 128 >"$tmp/squad.out"
      while read -r line; do
        case_=$(grep -o '"case": *"[a-z]*' <<<"$line" | sed 's/.*"//') # cold, or hit (state + question)
        toks=$(json_field "$line" tokens)
        echo "$(json_field "$line" tokens_per_s)" >>"$tmp/squad-$prec-$case_-$toks"
      done < <(grep '^{' "$tmp/squad.out")
    done
    "$LLAMA_BENCH" -m "$LLAMA_GGUF" -t "$THREADS" -p 128,512 -n 0 -r "$REPS" -o jsonl >"$tmp/llama.out" 2>/dev/null
    "$LLAMA_BENCH" -m "$LLAMA_GGUF" -t "$THREADS" -d 2048 -p 128 -n 0 -r "$REPS" -o jsonl >>"$tmp/llama.out" 2>/dev/null
    while read -r line; do
      echo "$(json_field "$line" avg_ts)" >>"$tmp/llama-$(json_field "$line" n_prompt)-d$(json_field "$line" n_depth)"
    done < <(grep '^{' "$tmp/llama.out")
    echo "   round $r of $ROUNDS done"
  done
  printf '%-34s %12s %12s %12s %8s %8s\n' "case ($ISA)" "llama.cpp" "squad bf16" "squad exact" "bf16/lc" "exact/lc"
  row() { # label llama-file squad-suffix
    local lc bf ex
    lc=$(median_of "$tmp/llama-$2")
    bf=$(median_of "$tmp/squad-bf16-$3")
    ex=$(median_of "$tmp/squad-exact-$3")
    awk -v l="$1" -v lc="$lc" -v bf="$bf" -v ex="$ex" 'function r(a) { return (lc > 0 && a > 0) ? sprintf("%7.2fx", a / lc) : "      -" }
      BEGIN { printf "%-34s %12s %12s %12s %s %s\n", l, lc, bf, ex, r(bf), r(ex) }'
  }
  # every round's figures, for the record
  for f in "$tmp"/llama-* "$tmp"/squad-*; do echo "   ${f##*/}: $(tr '\n' ' ' <"$f")"; done
  row "cold 128 tokens (pp128)" "128-d0" "cold-128"
  row "cold 512 tokens (pp512)" "512-d0" "cold-512"
  row "128 on a 2048 state (pp128 @ d2048)" "128-d2048" "hit-2176"
else
  echo "== squad vs llama.cpp: skipped (no llama-bench at $LLAMA_BENCH or no GGUF at $LLAMA_GGUF;"
  echo "   set SQUAD_LLAMA_BENCH / SQUAD_LLAMA_GGUF, or build them under /tmp/peer-llama as the project's"
  echo "   peers README says)"
  echo "== engine: cold rows and a 128-token question on a cached 2048-token state (qwen3.5-0.8b, $THREADS threads, $ISA)"
  for prec in bf16 exact; do
    echo "-- precision $prec"
    "$SQUAD" bench --model "$MODEL" --device cpu --threads "$THREADS" --precision "$prec" \
      --lengths 128,512,2048 --reps 3 --state 2048 --suffix 128
  done
fi

# SQUAD_BENCH_PEER_ONLY=1: stop after the engine figures (the comparison, when there is a peer)
if [ "${SQUAD_BENCH_PEER_ONLY:-0}" = 1 ]; then exit 0; fi

echo "== GEMM vs OpenBLAS sgemm"
"$BUILD"/bench_gemm

echo "== state cache: an agent trace with and without the cache (demo preset)"
bash bench/cache_bench.sh "$BUILD" # one thread, CPU time (see the script)

echo "== tokenizer"
if [ -f third_party/qwen3/tokenizer.json ]; then "$BUILD"/bench_tokenizer third_party/qwen3/tokenizer.json; fi
