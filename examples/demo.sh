#!/usr/bin/env bash
# demo.sh — the main job (`make run` builds, then calls `bash examples/demo.sh build/squad`): prepares
# a demo model once (a small synthesized Qwen3.5-architecture model with the real Qwen tokenizer, in
# demo-model/), starts `squad serve` on it, prints the address and a ready-to-paste curl for each API
# (with the answer it gives), plays an agent session against it (examples/agent.py) and keeps
# serving until Ctrl-C. DEMO_ONESHOT=1 stops the server after the agent session instead (CI, scripts).
#
# A synthesized model has random weights: its answers are arbitrary. The point is the service (HTTP,
# the decision APIs, the tokenizer, the state cache, the engine). To serve a real checkpoint, see the
# note printed at the start.
#
# Environment: PORT (default: the first free of 8080..8099), SQUAD_DEMO_MODEL (default demo-model),
# DEMO_ONESHOT=1, SQUAD_SERVE_ARGS (more `squad serve` options, e.g. "--threads 2").
set -euo pipefail
SQUAD="${1:-build/squad}"
cd "$(dirname "$0")/.."
MODEL="${SQUAD_DEMO_MODEL:-demo-model}"
TOKENIZER=third_party/qwen3/tokenizer.json
HOST=127.0.0.1

if [ ! -x "$SQUAD" ]; then
  echo "demo: $SQUAD not found; build it first (make)" >&2
  exit 2
fi
if [ "${DEMO_ONESHOT:-0}" = 1 ]; then
  echo "demo: DEMO_ONESHOT=1: the server stops after the demo"
else
  echo "demo: this serves until you press Ctrl-C (DEMO_ONESHOT=1 make run stops after the demo)"
fi
[ -f "$TOKENIZER" ] || bash tools/fetch_test_data.sh
if [ ! -f "$MODEL/config.json" ] || [ ! -f "$MODEL/model.safetensors" ] || [ ! -f "$MODEL/tokenizer.json" ]; then
  echo "demo: preparing $MODEL/ (squad synth --preset demo with the Qwen3 tokenizer; done once)"
  "$SQUAD" synth --preset demo --out "$MODEL" --tokenizer "$TOKENIZER"
fi
NAME="$(basename "$MODEL")"

port_free() { ! (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }
if [ -z "${PORT:-}" ]; then
  for p in $(seq 8080 8099); do
    if port_free "$p"; then PORT=$p; break; fi
  done
fi
: "${PORT:?no free port in 8080..8099; set PORT}"
URL="http://$HOST:$PORT"

cat <<NOTE

NOTE: $MODEL/ is a synthesized model with random weights, so every answer below is arbitrary.
      It shows the service working: HTTP -> the decision APIs -> rows (Qwen tokenizer, chat markup)
      -> the engine with its state cache -> a probability per option.
      For real answers, put a Qwen3.5 checkpoint in a directory (config.json, the *.safetensors
      files and tokenizer.json, e.g. from the Hugging Face repository Qwen/Qwen3.5-0.8B) and run
          $SQUAD serve --model /path/to/Qwen3.5-0.8B --port $PORT
      (or SQUAD_DEMO_MODEL=/path/to/Qwen3.5-0.8B make run).

NOTE

LOG="$(mktemp)"
# shellcheck disable=SC2086
"$SQUAD" serve --model "$MODEL" --host "$HOST" --port "$PORT" ${SQUAD_SERVE_ARGS:-} 2> "$LOG" &
SERVER=$!
stop() {
  if kill -0 "$SERVER" 2>/dev/null; then
    kill -TERM "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
  fi
  rm -f "$LOG"
}
trap stop EXIT
trap 'echo; echo "demo: stopping the server"; exit 0' INT TERM

printf 'demo: starting squad serve on %s ' "$URL"
for _ in $(seq 1 600); do
  if ! kill -0 "$SERVER" 2>/dev/null; then
    echo; echo "demo: squad serve exited:"; cat "$LOG"; exit 1
  fi
  if [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/ready")" = 200 ]; then break; fi
  printf '.'
  sleep 0.2
done
echo
if [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/ready")" != 200 ]; then
  echo "demo: the server did not become ready; its log:"; cat "$LOG"; exit 1
fi
echo "demo: serving $MODEL as \"$NAME\" at $URL (server log: $LOG)"

# Each API: the curl command to paste, then what it answers now.
show() {
  local path="$1" body="$2"
  echo
  echo "# POST $path"
  printf "curl -s %s%s -H 'Content-Type: application/json' -d '%s'\n" "$URL" "$path" "$body"
  curl -s "$URL$path" -H 'Content-Type: application/json' -d "$body"
  echo
}
echo
echo "=================================== the APIs ===================================="
show /v1/ask '{"state": "Page: Login\nThe password field is empty.", "questions": [{"text": "Can the user sign in?", "options": ["yes", "no"]}]}'
show /v1/score '{"rows": [{"ids": [5, 9, 12, 40], "slots": [3], "nopts": [3], "letters": [32, 33, 34]}]}'
show /v1/decisions '{"model": "'"$NAME"'", "input": "Page: Login\nThe password field is empty.", "questions": [{"type": "choice", "instructions": "Which button submits the form?", "choices": [{"value": "Sign in"}, {"value": "Forgot password?", "description": "a link"}]}, {"type": "predicate", "name": "can_submit", "instructions": "Can the form be submitted now?"}]}'
show /v1/systemone '{"state": {"page": "login", "password": ""}, "questions": {"ready": {"type": "noul", "instructions": "Can the user sign in now?", "criteria": {"true": "both fields are filled"}}, "quality": {"type": "score", "instructions": "How clear is the page?", "criteria": ["unclear", "fine"]}}}'
echo
echo "# also: curl -s $URL/v1/models   $URL/health   $URL/ready   $URL/metrics   $URL/v1/stats"

echo
echo "================================ an agent session ================================"
if command -v python3 >/dev/null 2>&1; then
  python3 examples/agent.py --url "$URL" --model "$NAME"
else
  echo "demo: python3 is needed for examples/agent.py (apt-get install python3); no agent session"
fi

if [ "${DEMO_ONESHOT:-0}" = 1 ]; then
  echo
  echo "demo: DEMO_ONESHOT=1, stopping the server"
  exit 0
fi
echo
echo "demo: still serving at $URL — paste the curl commands above, or run"
echo "      python3 examples/agent.py --url $URL      (Ctrl-C stops the server)"
wait "$SERVER"
