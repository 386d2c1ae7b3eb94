#!/usr/bin/env bash
# bench_server.sh — the server's load benchmark (issue 13): bench/bench_server.c drives `squad serve`
# on the CPU with
#   1. the agent-trace workload (bench/agent_trace.py: interleaved agent sessions whose states grow
#      and change; each row one POST /v1/score) at each concurrency level, a fresh server per level
#      (so no level answers another's repeats from the memo);
#   2. memo-answered requests: one /v1/decisions body repeated (after a warm-up every request is an
#      exact repeat: the server's own overhead, the target is >= 20,000 requests/s on 2 cores).
# Prints bench_server's markdown tables; bench/RESULTS.md records the figures.
#
# Usage: bash tools/bench_server.sh BUILD_DIR
# Environment (optional): PRESET (tiny), LEVELS (1,8,32,128), SESSIONS (24), LIVE (8), STEPS (6),
# SEED (1), THREADS (engine CPU threads, 1), MEMO_REQUESTS (200000), MEMO_LEVELS (1,8,32,128),
# SERVE_ARGS (more `squad serve` options, e.g. "--device cuda" on the GPU machine).
set -euo pipefail
BUILD=${1:?usage: bash tools/bench_server.sh BUILD_DIR}
PRESET=${PRESET:-tiny}
LEVELS=${LEVELS:-1,8,32,128}
SESSIONS=${SESSIONS:-24}
LIVE=${LIVE:-8}
STEPS=${STEPS:-6}
SEED=${SEED:-1}
THREADS=${THREADS:-1}
MEMO_REQUESTS=${MEMO_REQUESTS:-200000}
MEMO_LEVELS=${MEMO_LEVELS:-1,8,32,128}
cd "$(dirname "$0")/.."
SQUAD="$BUILD/squad"
BENCH="$BUILD/bench_server"
DATA="$BUILD/bench-data"
MODEL="$DATA/$PRESET-qwen-tokenizer"
mkdir -p "$DATA"
[ -f third_party/qwen3/tokenizer.json ] || bash tools/fetch_test_data.sh
# the server reads text with the model's tokenizer: the model carries the real Qwen3 tokenizer
[ -f "$MODEL/config.json" ] || "$SQUAD" synth --preset "$PRESET" --out "$MODEL" --tokenizer third_party/qwen3/tokenizer.json
VOCAB=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("text_config", c)["vocab_size"])' "$MODEL/config.json")
TRACE="$DATA/server-trace-s$SEED-$SESSIONS-$LIVE-$STEPS-v$VOCAB.jsonl"
[ -f "$TRACE" ] || python3 bench/agent_trace.py --seed "$SEED" --sessions "$SESSIONS" --live "$LIVE" \
  --steps "$STEPS" --vocab "$VOCAB" --out "$TRACE"

LOG="$(mktemp)"
SERVER=""
stop_server() {
  if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then kill -TERM "$SERVER"; wait "$SERVER" || true; fi
  SERVER=""
}
trap 'stop_server; rm -f "$LOG"' EXIT
# Starts a server on a free port; sets SERVER (pid) and PORT.
start_server() {
  # shellcheck disable=SC2086
  "$SQUAD" serve --model "$MODEL" --port 0 --threads "$THREADS" ${SERVE_ARGS:-} 2> "$LOG" &
  SERVER=$!
  PORT=""
  for _ in $(seq 1 600); do
    PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$LOG" | head -1)
    if [ -n "$PORT" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/ready")" = 200 ]; then return 0; fi
    kill -0 "$SERVER" 2>/dev/null || { cat "$LOG" >&2; exit 1; }
    sleep 0.1
  done
  echo "bench_server.sh: the server did not become ready" >&2; cat "$LOG" >&2; exit 1
}

echo "== agent trace: $(wc -l < "$TRACE") rows ($SESSIONS sessions, $LIVE live, $STEPS steps), preset $PRESET, engine threads $THREADS"
first=1
for c in ${LEVELS//,/ }; do
  start_server
  if [ $first = 1 ]; then "$BENCH" --port "$PORT" --pid "$SERVER" --trace "$TRACE" --concurrency "$c"
  else "$BENCH" --port "$PORT" --pid "$SERVER" --trace "$TRACE" --concurrency "$c" | tail -n +3; fi
  first=0
  stop_server
done

echo
echo "== memo: one /v1/decisions body repeated ($MEMO_REQUESTS requests a level)"
BODY="$DATA/memo-body.json"
python3 - "$BODY" <<'PY'
import json, sys
page = open("examples/login.json").read()
req = json.load(open("examples/login.json"))
body = {"model": "m", "input": [{"role": "developer", "content": req["system"]}, {"role": "user", "content": req["state"]}],
        "questions": [{"type": "choice", "instructions": q["text"], "choices": [{"value": o} for o in q["options"]]} for q in req["questions"]]}
open(sys.argv[1], "w").write(json.dumps(body) + "\n")
PY
sed -i "s|\"model\": \"m\"|\"model\": \"$(basename "$MODEL")\"|" "$BODY"
start_server
"$BENCH" --port "$PORT" --pid "$SERVER" --bodies "$BODY" --path /v1/decisions --memo --requests "$MEMO_REQUESTS" \
  --concurrency "$MEMO_LEVELS"
stop_server
