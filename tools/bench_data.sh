# bench_data.sh — what tools/bench_server.sh and tools/tier_bench.sh both need before their servers
# start: the binaries, a synthesized model that carries the real Qwen3 tokenizer (the server reads
# text with the model's tokenizer), and agent traces (bench/agent_trace.py) for it. Sourced, not run.
#
# Reads BUILD and PRESET; sets SQUAD, BENCH, DATA, MODEL and VOCAB. `bench_trace SEED SESSIONS LIVE
# STEPS` prints the path of that trace, writing it the first time.
SQUAD="$BUILD/squad"
BENCH="$BUILD/bench_server"
# plain `make` builds the product only: build the load generator (and squad) here when missing
if [ ! -x "$BENCH" ] || [ ! -x "$SQUAD" ]; then
    [ -f "$BUILD/CMakeCache.txt" ] && cmake --build "$BUILD" -j2 --target squad bench_server >/dev/null
fi
DATA="$BUILD/bench-data"
MODEL="$DATA/$PRESET-qwen-tokenizer"
mkdir -p "$DATA"
[ -f third_party/qwen3/tokenizer.json ] || bash tools/fetch_test_data.sh
[ -f "$MODEL/config.json" ] || "$SQUAD" synth --preset "$PRESET" --out "$MODEL" --tokenizer third_party/qwen3/tokenizer.json
VOCAB=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("text_config", c)["vocab_size"])' "$MODEL/config.json")

bench_trace() { # bench_trace SEED SESSIONS LIVE STEPS
    local trace="$DATA/server-trace-s$1-$2-$3-$4-v$VOCAB.jsonl"
    [ -f "$trace" ] || python3 bench/agent_trace.py --seed "$1" --sessions "$2" --live "$3" --steps "$4" \
        --vocab "$VOCAB" --out "$trace" >&2
    echo "$trace"
}
