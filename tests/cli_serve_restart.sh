#!/usr/bin/env bash
# cli_serve_restart.sh — the disk tier across a server restart (docs/server.md, --cache-dir): serve a
# tiny synthesized model with the real tokenizer, ask a question about a long page, stop the server
# with SIGTERM (it saves the state cache after the drain), serve again with the same --cache-dir and
# ask the same question: the answer is the same and its state comes from the cache (the server's
# /v1/stats shows tokens reused and a hit; the log shows the save and the load). Then a server on
# another model (another synth seed) with the same directory refuses the file (a log line) and
# reuses nothing.
# Run from the repository root: bash tests/cli_serve_restart.sh path/to/squad
set -uo pipefail
SQUAD="${1:?usage: cli_serve_restart.sh path/to/squad}"
TOK=third_party/qwen3/tokenizer.json
. "$(dirname "$0")/shell_checks.sh"
has() { case "$2" in *"$3"*) ok ;; *) bad "$1: [${2:0:400}] lacks [$3]" ;; esac; }
tmp="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
if [ ! -f "$TOK" ]; then
  bad "$TOK is missing (run tools/fetch_test_data.sh)"
  echo "cli_serve_restart: $pass passed, $fail failed"
  exit 1
fi
"$SQUAD" synth --preset tiny --out "$tmp/a" --tokenizer "$TOK" --seed 1 2> /dev/null
check "synth a" "$?" 0
"$SQUAD" synth --preset tiny --out "$tmp/b" --tokenizer "$TOK" --seed 2 2> /dev/null
check "synth b" "$?" 0
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start MODEL LOG: a server on a free port with --cache-dir, until /ready answers 200
start() {
  port="$(free_port)"
  "$SQUAD" serve --model "$1" --port "$port" --threads 1 --cache-dir "$tmp/cache" 2> "$2" &
  pid=$!
  for _ in $(seq 1 600); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/ready")" = 200 ]; then return 0; fi
    sleep 0.1
  done
  bad "the server on $1 did not become ready: $(tail -5 "$2")"
  return 1
}
stop() {
  kill -TERM "$pid"
  wait "$pid"
  check "exit status after SIGTERM" "$?" 0
  pid=""
}
ask() { curl -s -X POST -H 'Content-Type: application/json' --data-binary @examples/login.json "http://127.0.0.1:$port/v1/ask"; }
# the answers alone (probabilities and choices)
answers() { python3 -c 'import json, sys; print(json.dumps(json.loads(sys.argv[1])["answers"]))' "$1"; }
stats() { curl -s "http://127.0.0.1:$port/v1/stats"; }
field() { python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["cache"][sys.argv[1]])' "$1"; }
# the background load is over once the log says so (the server answers meanwhile)
wait_loaded() {
  for _ in $(seq 1 300); do
    if grep -q -e "checkpoints loaded from" -e "nothing loaded" -e "refused" "$1"; then return 0; fi
    sleep 0.1
  done
  bad "no load line in $1"
}

start "$tmp/a" "$tmp/log1" || exit 1
first="$(ask)"
has "first answer" "$first" '"answers": [{"probs"'
# the request's three questions share one state: the first computes it, the others restore it
reused0="$(stats | field tokens_reused)"
hits0="$(stats | field hits)"
check "the first time: the first question computes the state" "$(stats | field cold)" 1
stop
has "saved at SIGTERM" "$(cat "$tmp/log1")" "saved to $tmp/cache"
[ -s "$tmp/cache/squad-cache.bin" ] && ok || bad "no cache file"

start "$tmp/a" "$tmp/log2" || exit 1
wait_loaded "$tmp/log2"
has "loaded at start" "$(cat "$tmp/log2")" "checkpoints loaded from $tmp/cache"
second="$(ask)"
check "the same answer after the restart" "$(answers "$second")" "$(answers "$first")"
reused="$(stats | field tokens_reused)"
[ "$reused" -gt "$reused0" ] && ok || bad "after the restart: tokens_reused $reused, the first server's $reused0"
check "after the restart: every question a hit" "$(stats | field hits)" 3
check "after the restart: nothing cold" "$(stats | field cold)" 0
has "disk_loaded in /v1/stats" "$(stats)" '"disk_loaded": '
has "tier metrics" "$(curl -s "http://127.0.0.1:$port/metrics")" 'squad_cache_disk_records_total{kind="loaded"}'
stop

start "$tmp/b" "$tmp/log3" || exit 1
wait_loaded "$tmp/log3"
has "another model: refused" "$(cat "$tmp/log3")" "identity differs"
ask > /dev/null
check "another model: reused as a fresh start" "$(stats | field tokens_reused)" "$reused0"
check "another model: hits as a fresh start" "$(stats | field hits)" "$hits0"
stop

echo "cli_serve_restart: $pass passed, $fail failed"
[ "$fail" = 0 ]
