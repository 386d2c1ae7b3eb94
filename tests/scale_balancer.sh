#!/usr/bin/env bash
# scale_balancer.sh — squad replicas behind real HAProxy and nginx processes (deploy/), end to end.
#
# Three `squad serve` replicas of a tiny synthesized model (the real Qwen3 tokenizer, --precision
# exact) and the balancers deploy/run-local.sh renders; tests/scale_client.py sends a seeded agent
# trace (sessions of growing states, one question a request) and checks:
#   - one replica alone (the reference): its answers and its reused (cache hit) tokens;
#   - HAProxy hashing X-Squad-Session, HAProxy hashing the body's key (prompt_cache_key, read with
#     req.body + json_query), nginx hashing the header: each session on one replica (each
#     replica's own /metrics rows agree with the X-Squad-Replica / balancer header of the answers),
#     answers equal to the reference's, and the replicas' reused tokens together >= 90% of the
#     single replica's;
#   - round robin (HAProxy, nginx) on the same trace: fewer reused tokens than affinity (reported);
#   - run-local.sh starting its own 3 replicas, one of them killed with SIGKILL mid-trace (HAProxy,
#     then nginx): no request fails and no connection error reaches the client (clean 5xx the
#     client retried are counted), the killed replica's sessions move once, answers still equal;
#     SIGTERM to run-local.sh stops every replica and the balancer;
#   - the balancer's added latency per request (a memo-answered request, direct against through).
# The figures are printed (scale: {...} lines) for bench/RESULTS.md.
# Run from the repository root: bash tests/scale_balancer.sh path/to/squad
set -uo pipefail
SQUAD="$(realpath "${1:?usage: scale_balancer.sh path/to/squad}")"
for tool in haproxy nginx curl python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "scale_balancer: $tool is needed (make deps installs it)" >&2; exit 1; }
done
[ -f third_party/qwen3/tokenizer.json ] || { echo "scale_balancer: third_party/qwen3/tokenizer.json is missing" >&2; exit 1; }

work="$(mktemp -d "${TMPDIR:-/tmp}/squad-scale.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fails=0
fail() { echo "scale_balancer: FAIL: $*"; fails=$((fails + 1)); }
client() { python3 tests/scale_client.py "$@" || fails=$((fails + 1)); }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# SCALE_PHASES="balancers haproxy-kill nginx-kill" (a subset) runs only those, for debugging
want() { [ -z "${SCALE_PHASES:-}" ] || [[ " $SCALE_PHASES " == *" $1 "* ]]; }
SERVE_OPTS=(--precision exact --threads 1 --http-threads 2 --log-requests)

"$SQUAD" synth --preset tiny --out "$work/tiny" --tokenizer third_party/qwen3/tokenizer.json >/dev/null 2>&1 ||
  { echo "scale_balancer: squad synth failed" >&2; exit 1; }

# --device cuda:N (one process per GPU): a bad index is a usage error; on a machine or build without
# that GPU, the usual clear error and no answer
row='{"ids": [1, 2, 3], "slots": [2], "nopts": [2], "letters": [5, 6]}'
for d in cuda:x cuda:-1 cuda:256 cuda:; do
  out="$(echo "$row" | "$SQUAD" score --model "$work/tiny" --device "$d" 2>&1)"; rc=$?
  [ "$rc" = 2 ] && grep -q 'cuda:N' <<<"$out" || fail "--device $d: exit $rc, '$out' (want 2 and a message naming cuda:N)"
done
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  out="$(echo "$row" | "$SQUAD" score --model "$work/tiny" --device cuda:1 2>&1)"; rc=$?
  [ "$rc" != 0 ] && grep -q -- '--device cuda' <<<"$out" || fail "--device cuda:1 without a GPU: exit $rc, '$out'"
fi

# the replicas the balancer phases share (their caches are cleared before each phase)
addrs=()
for i in 0 1 2; do
  "$SQUAD" serve --model "$work/tiny" --port 0 "${SERVE_OPTS[@]}" >"$work/replica$i.log" 2>&1 &
  pids+=($!)
done
for i in 0 1 2; do
  a=""
  for _ in $(seq 300); do
    a="$(grep -o -m1 'listening on http://[^ ]*' "$work/replica$i.log" | sed 's|.*http://||')"
    [ -n "$a" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$a/ready")" = 200 ] && break
    sleep 0.1
  done
  [ -n "$a" ] || { cat "$work/replica$i.log"; echo "scale_balancer: replica $i did not start" >&2; exit 1; }
  addrs+=("$a")
done
all="$(IFS=,; echo "${addrs[*]}")"

# run-local.sh in the background; sets rl_pid and rl_url, and rl_out (its stdout) once it says ready
start_local() {
  local port; port="$(free_port)"
  rl_out="$work/run-local.$RANDOM.out"
  deploy/run-local.sh --port "$port" --squad "$SQUAD" "$@" >"$rl_out" 2>"$rl_out.err" &
  rl_pid=$!
  for _ in $(seq 600); do
    grep -q '^ready$' "$rl_out" 2>/dev/null && break
    kill -0 "$rl_pid" 2>/dev/null || break
    sleep 0.1
  done
  grep -q '^ready$' "$rl_out" || { cat "$rl_out" "$rl_out.err"; fail "run-local.sh $* did not get ready"; return 1; }
  rl_url="http://127.0.0.1:$port"
}
stop_local() {
  kill -TERM "$rl_pid" 2>/dev/null
  wait "$rl_pid" 2>/dev/null
}

TRACE=(--sessions 16 --states 4)
LONG=(--sessions 16 --states 6)
if [ "${SQUAD_SANITIZED:-0}" = 1 ]; then  # a sanitized squad runs ~30x slower: a shorter trace
  TRACE=(--sessions 12 --states 3)
  LONG=(--sessions 12 --states 4)
fi

# 1. one replica alone: the reference answers and hit tokens; the direct latency
client run --label single --url "http://${addrs[0]}" --replicas "${addrs[0]}" --clear --key header "${TRACE[@]}" \
  --write-ref "$work/ref.json" --expect-no-errors --summary "$work/single.json"
want haproxy-kill || want nginx-kill &&  # the reference for the kill phases' longer trace
  client run --label single-long --url "http://${addrs[0]}" --replicas "${addrs[0]}" --clear --key header \
    "${LONG[@]}" --write-ref "$work/ref-long.json" --expect-no-errors --summary "$work/single-long.json"
client latency --label direct --url "http://${addrs[0]}" --summary "$work/lat-direct.json"

# the server's side: the replica names itself, the session fields are taken (and logged), never
# change an answer, and a wrong type is refused; the gauges a gateway reads are there
hdr="$(curl -s -D - -o /dev/null "http://${addrs[0]}/health" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-squad-replica" {print $2}')"
[ "$hdr" = "${addrs[0]}" ] || fail "X-Squad-Replica is '$hdr', want ${addrs[0]}"
ask='"state": "A form with a Save button.", "questions": [{"text": "Is there a button?", "options": ["yes", "no"]}]'
plain="$(curl -s -XPOST "http://${addrs[1]}/v1/ask" -d "{$ask}" | python3 -c 'import json, sys; print(json.load(sys.stdin)["answers"])')"
named="$(curl -s -XPOST -H 'X-Squad-Session: hdr-key' "http://${addrs[2]}/v1/ask" -d "{$ask, \"session\": \"body-key\", \"user\": \"u\"}" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["answers"])')"
[ -n "$plain" ] && [ "$plain" = "$named" ] || fail "/v1/ask with a session key answered '$named', without '$plain'"
code="$(curl -s -o /dev/null -w '%{http_code}' -XPOST "http://${addrs[1]}/v1/ask" -d "{$ask, \"session\": 7}")"
[ "$code" = 422 ] || fail "/v1/ask with \"session\": 7 answered $code, want 422"
code="$(curl -s -o /dev/null -w '%{http_code}' -XPOST "http://${addrs[1]}/v1/score" -d '{"rows": [], "user": ["x"]}')"
[ "$code" = 400 ] || fail "/v1/score with \"user\": [...] answered $code, want 400"
code="$(curl -s -o /dev/null -w '%{http_code}' -XPOST "http://${addrs[1]}/v1/score" -d '{"rows": [], "session": "s"}')"
[ "$code" = 200 ] || fail "/v1/score with a \"session\" answered $code, want 200"
grep -q '/v1/ask 200 .* session "hdr-key"$' "$work/replica2.log" || fail "replica 2's log does not name the header's session (it wins over the body's)"
grep -q 'session "agent-7-0"$' "$work/replica0.log" || fail "replica 0's log does not name the trace's sessions"
m="$(curl -s "http://${addrs[0]}/metrics")"
for g in squad_queue_depth squad_requests_running squad_cache_usage_ratio squad_cache_tokens_reused_total; do
  grep -q "^$g " <<<"$m" || fail "/metrics has no $g"
done
awk '/^squad_cache_usage_ratio / {exit !($2 > 0 && $2 <= 1)}' <<<"$m" || fail "squad_cache_usage_ratio is not in (0, 1] after the trace"

# 2. the balancer phases over the shared replicas
phase() {  # phase LABEL BALANCER MODE KEY [client checks]
  local label="$1" bal="$2" mode="$3" key="$4"; shift 4
  start_local --upstreams "$all" --balancer "$bal" --mode "$mode" --key "$key" || return
  client run --label "$label" --url "$rl_url" --replicas "$all" --clear --key "$key" "${TRACE[@]}" \
    --ref "$work/ref.json" --expect-no-errors --summary "$work/$label.json" "$@"
  if [ "$mode" = affinity ] && [ "$key" = header ]; then
    client latency --label "$label" --url "$rl_url" --summary "$work/lat-$label.json"
  fi
  stop_local
}
if want balancers; then
phase haproxy-header haproxy affinity header --expect-affinity
phase haproxy-body haproxy affinity body --expect-affinity
phase haproxy-roundrobin haproxy roundrobin header
phase nginx-header nginx affinity header --expect-affinity
phase nginx-roundrobin nginx roundrobin header
for label in haproxy-header haproxy-body nginx-header; do
  client compare "$work/single.json" "$work/$label.json" --at-least 0.9
done
for bal in haproxy nginx; do  # round robin loses hits: below what affinity kept on the same trace
  client compare "$work/$bal-header.json" "$work/$bal-roundrobin.json" --below 1.0
done
fi

# 3. kill -9 of one replica mid-trace, with run-local.sh's own replicas (fresh caches)
kill_phase() {  # kill_phase BALANCER
  local bal="$1"
  start_local --replicas 3 --balancer "$bal" --model "$work/tiny" -- "${SERVE_OPTS[@]}" || return
  local own kill_pids replica_pids
  own="$(awk '/^replica / {sub("http://", "", $5); print $5}' "$rl_out" | paste -sd, -)"
  kill_pids="$(awk '/^replica / {sub("http://", "", $5); print $5 "=" $4}' "$rl_out" | paste -sd, -)"
  replica_pids="$(awk '/^replica / {print $4}' "$rl_out")"
  client run --label "$bal-kill" --url "$rl_url" --replicas "$own" --key header "${LONG[@]}" \
    --kill-pids "$kill_pids" --kill-after 30 --think-ms 150 \
    --ref "$work/ref-long.json" --expect-affinity --expect-no-errors --summary "$work/$bal-kill.json"
  stop_local
  for p in $replica_pids; do
    kill -0 "$p" 2>/dev/null && fail "run-local.sh ($bal) left replica pid $p running after SIGTERM"
  done
  grep -q 'balancer' "$rl_out" && ! kill -0 "$(awk '/^balancer/ {print $4}' "$rl_out")" 2>/dev/null ||
    fail "run-local.sh ($bal) left its balancer running after SIGTERM"
}
want haproxy-kill && kill_phase haproxy
want nginx-kill && kill_phase nginx

# the shared replicas stop cleanly on SIGTERM (exit 0: under the sanitizers, no error and no leak)
for i in 0 1 2; do
  kill -TERM "${pids[$i]}" 2>/dev/null
  wait "${pids[$i]}"; rc=$?
  [ "$rc" = 0 ] || { tail -5 "$work/replica$i.log"; fail "replica $i exited $rc after SIGTERM"; }
done
pids=()

if [ "$fails" -gt 0 ]; then
  echo "scale_balancer: $fails check(s) failed"
  for f in "$work"/run-local.*.err; do [ -s "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
  exit 1
fi
echo "scale_balancer: all checks passed"
