#!/usr/bin/env bash
# bench_server.sh — the server's load benchmark (issue 13): bench/bench_server.c drives `squad serve`
# on the CPU with
#   1. the agent-trace workload (bench/agent_trace.py: interleaved agent sessions whose states grow
#      and change; each row one POST /v1/score) at each concurrency level, a fresh server per level
#      (so no level answers another's repeats from the memo);
#   2. batching (issue 14): the same trace at concurrency BATCH_LEVEL through a server with the
#      default --max-rows (batched) and through one with --max-rows 1 (one row at a time), back to
#      back: questions/s and p50 / p99 latency of each, and the ratio of their questions/s;
#   3. memo-answered requests: one /v1/decisions body repeated (after a warm-up every request is an
#      exact repeat: the server's own overhead, the target is >= 20,000 requests/s on 2 cores).
# Prints bench_server's markdown tables; bench/RESULTS.md records the figures.
#
# Usage: bash tools/bench_server.sh BUILD_DIR
# Environment (optional): PRESET (tiny), LEVELS (1,8,32,128), SESSIONS (24), LIVE (8), STEPS (6),
# SEED (1), THREADS (engine CPU threads, 1), MEMO_REQUESTS (200000), MEMO_LEVELS (1,8,32,128),
# BATCH_LEVEL (32), BATCH_ROWS (the batched server's --max-rows; default: the engine's default),
# BATCH_ROUNDS (1; more: pairs of runs in alternating order, the ratio of the means), BATCH_ONLY (1:
# only part 2), WARMUP_SEED (part 2: before the measured trace, each server first answers the trace of
# this seed, unmeasured: a server past its first requests, its lazily captured CUDA graphs made and
# its GEMMs tuned, with nothing in its cache or memo that the measured trace repeats), SERVE_ARGS (more `squad serve` options, e.g. "--device cuda" on the
# GPU machine).
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
BATCH_LEVEL=${BATCH_LEVEL:-32}
BATCH_ROWS=${BATCH_ROWS:-}
BATCH_ONLY=${BATCH_ONLY:-0}
BATCH_ROUNDS=${BATCH_ROUNDS:-1}
WARMUP_SEED=${WARMUP_SEED:-}
cd "$(dirname "$0")/.."
. tools/bench_data.sh
TRACE=$(bench_trace "$SEED" "$SESSIONS" "$LIVE" "$STEPS")

LOG="$(mktemp)"
SERVER=""
stop_server() {
  if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then kill -TERM "$SERVER"; wait "$SERVER" || true; fi
  SERVER=""
}
trap 'stop_server; rm -f "$LOG"' EXIT
# Starts a server on a free port (more `squad serve` options in "$@"); sets SERVER (pid) and PORT.
start_server() {
  # shellcheck disable=SC2086
  "$SQUAD" serve --model "$MODEL" --port 0 --threads "$THREADS" ${SERVE_ARGS:-} "$@" 2> "$LOG" &
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

WARMUP_TRACE=""
if [ -n "$WARMUP_SEED" ]; then
  WARMUP_TRACE="$DATA/server-trace-s$WARMUP_SEED-$SESSIONS-$LIVE-$STEPS-v$VOCAB.jsonl"
  [ -f "$WARMUP_TRACE" ] || python3 bench/agent_trace.py --seed "$WARMUP_SEED" --sessions "$SESSIONS" --live "$LIVE" \
    --steps "$STEPS" --vocab "$VOCAB" --out "$WARMUP_TRACE"
fi
TRACE_ABOUT="$(wc -l < "$TRACE") rows ($SESSIONS sessions, $LIVE live, $STEPS steps), preset $PRESET, engine threads $THREADS"
if [ "$BATCH_ONLY" != 1 ]; then
echo "== agent trace: $TRACE_ABOUT"
first=1
for c in ${LEVELS//,/ }; do
  start_server
  if [ $first = 1 ]; then "$BENCH" --port "$PORT" --pid "$SERVER" --trace "$TRACE" --concurrency "$c"
  else "$BENCH" --port "$PORT" --pid "$SERVER" --trace "$TRACE" --concurrency "$c" | tail -n +3; fi
  first=0
  stop_server
done
echo
fi

# The server's batching limits as it reports them (GET /v1/stats "batching"); $1: graphs_now's
# figures before the measured trace, so the CUDA graphs its steps waited for and its steps of more
# than 50 ms are told apart from the warm-up's.
batching_of() {
  curl -s "http://127.0.0.1:$PORT/v1/stats" | python3 -c '
import json, sys
b = json.load(sys.stdin)["batching"]
g0, slow0 = (int(x) for x in sys.argv[1].split())
rows = b["rows_per_step"]
sec = b.get("seconds_per_step", {"count": 0, "buckets": {}})
slow = sec["count"] - sec["buckets"].get("0.05", sec["count"])
print("max_rows %d, batch_tokens %d; %d steps, %.2f rows a step, %d of the measured trace over 50 ms; CUDA graphs %d "
      "(%d captured during the measured trace), %.2f s capturing" % (b["max_rows"], b["batch_tokens"], b["steps"],
      rows["sum"] / rows["count"] if rows["count"] else 0, slow - slow0, b.get("graphs", 0), b.get("graphs", 0) - g0,
      b.get("graph_capture_s", 0)))' "$1"
}
# "GRAPHS SLOW": the CUDA graphs captured so far and the steps so far that took more than 50 ms.
graphs_now() {
  curl -s "http://127.0.0.1:$PORT/v1/stats" | python3 -c '
import json, sys
b = json.load(sys.stdin)["batching"]
sec = b.get("seconds_per_step", {"count": 0, "buckets": {}})
print(b.get("graphs", 0), sec["count"] - sec["buckets"].get("0.05", sec["count"]))'
}
echo "== batching: agent trace ($TRACE_ABOUT) at concurrency $BATCH_LEVEL, batched against one row at a time," \
  "$BATCH_ROUNDS round(s), the order alternating${WARMUP_SEED:+, each server warmed up by the trace of seed $WARMUP_SEED first}"
BATCHED_ARGS=()
[ -n "$BATCH_ROWS" ] && BATCHED_ARGS=(--max-rows "$BATCH_ROWS")
RESULT="$(mktemp)"
trap 'stop_server; rm -f "$LOG" "$RESULT"' EXIT
# One run: a fresh server with the mode's options, the trace, its batching figures.
batch_run() { # batch_run batched|one HEADER(1: print the table's head)
  if [ "$1" = batched ]; then start_server --log-requests "${BATCHED_ARGS[@]}"; label=batched
  else start_server --log-requests --max-rows 1; label="one at a time"; fi
  if [ -n "$WARMUP_TRACE" ]; then
    "$BENCH" --port "$PORT" --pid "$SERVER" --trace "$WARMUP_TRACE" --concurrency "$BATCH_LEVEL" >/dev/null
  fi
  G0=$(graphs_now)
  L0=$(wc -l < "$LOG")
  if [ "$2" = 1 ]; then "$BENCH" --port "$PORT" --pid "$SERVER" --trace "$TRACE" --concurrency "$BATCH_LEVEL" --label "$label"
  else "$BENCH" --port "$PORT" --pid "$SERVER" --trace "$TRACE" --concurrency "$BATCH_LEVEL" --label "$label" | tail -n +3; fi |
    tee -a "$RESULT"
  if [ "$1" = batched ]; then ABOUT_BATCHED=$(batching_of "$G0"); else ABOUT_ONE=$(batching_of "$G0"); fi
  # the measured trace's slowest requests as the server logged them (where their time went) and the
  # CUDA graphs captured during it (each with its step's time), to stderr
  tail -n +"$((L0 + 1))" "$LOG" | python3 -c '
import re, sys
lines = [l.strip() for l in sys.stdin]
rows = [(float(m.group(1)), l) for l in lines for m in [re.search(r"/v1/score \d+ ([0-9.]+) ms", l)] if m]
rows.sort(reverse=True)
print("slowest requests (%s, of %d):" % (sys.argv[1], len(rows)), file=sys.stderr)
for _, l in rows[:5]: print("  " + l, file=sys.stderr)
for l in [l for l in lines if "CUDA graph" in l]: print("  " + l, file=sys.stderr)' "$label"
  stop_server
}
for round in $(seq 1 "$BATCH_ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then batch_run batched $((round == 1)); batch_run one 0
  else batch_run one 0; batch_run batched 0; fi
done
echo "batched: $ABOUT_BATCHED; one at a time: $ABOUT_ONE"
# questions/s is the table's 6th column; the ratio of the means over the rounds
awk -F'|' '$2 ~ /batched/ {b += $7; nb++} $2 ~ /one at a time/ {o += $7; no++}
  END { if (nb && no && o > 0) printf "batched / one at a time: %.2fx the questions/s (%.0f against %.0f)\n", (b / nb) / (o / no), b / nb, o / no }' "$RESULT"
[ "$BATCH_ONLY" = 1 ] && exit 0

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
