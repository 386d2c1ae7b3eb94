#!/usr/bin/env bash
# tier_bench.sh — the state cache's tier figures (issue 29; docs/design.md section 7, "Tiers")
# through `squad serve` and bench/bench_server.c on the agent trace (bench/agent_trace.py):
#   1. host tier: the trace with every session live at once (HOST_LIVE: each session's next state
#      comes back after all the others') through a device budget (--cache-mb) a quarter of the trace's working
#      set (the bytes a server with room for everything holds after it: the first run, also printed
#      as the unbounded reference), without a host tier and with one (--cache-host-mb) that holds the
#      rest: requests/s and cache hit rate of each, in one run, and the tier's demotions and
#      promotions. On the CPU the host tier is off (its checkpoints are host memory already): both
#      rows then agree, which the script says.
#   2. restart: the trace's first RESTART_AT rows through a server, SIGTERM, a new server, then the
#      next FIRST_N rows (the same sessions going on: their states were cached before the restart):
#      the time from the new server's start to /ready (and, with --cache-dir, to the end of the
#      background load, which the rows then wait for), and the hit rate of those rows, without and
#      with --cache-dir (the disk tier: saved at SIGTERM, read back in the background at start);
#      the servers' "cache dir" log lines (the save, the load) follow the table.
# Every row of the tables is bench_server's (requests/s, p50 / p99, memo and cache hit rates).
#
# Usage: bash tools/tier_bench.sh BUILD_DIR
# Environment (optional): PRESET (tiny), SERVE_ARGS ("--device cpu"; "--device cuda" on the GPU
# machine), THREADS (1), SESSIONS (24), LIVE (8), STEPS (6), SEED (1), CONCURRENCY (8),
# HOST_LIVE (SESSIONS), HOST_MB (the host tier: 1.25x the working set), RESTART_AT (half the trace), FIRST_N (the rows after
# the restart: the rest of the trace), PARTS ("host restart": which of the two to run).
set -euo pipefail
BUILD=${1:?usage: bash tools/tier_bench.sh BUILD_DIR}
PRESET=${PRESET:-tiny}
SERVE_ARGS=${SERVE_ARGS:---device cpu}
THREADS=${THREADS:-1}
SESSIONS=${SESSIONS:-24}
LIVE=${LIVE:-8}
STEPS=${STEPS:-6}
SEED=${SEED:-1}
CONCURRENCY=${CONCURRENCY:-8}
cd "$(dirname "$0")/.."
. tools/bench_data.sh
TRACE=$(bench_trace "$SEED" "$SESSIONS" "$LIVE" "$STEPS")
# The host tier's trace: every session live at once (HOST_LIVE), so a session's next state comes
# back after all the others' and finds its prefix evicted from a device budget a quarter of the
# working set: what a host tier is for.
HOST_LIVE=${HOST_LIVE:-$SESSIONS}
HOST_TRACE=$(bench_trace "$SEED" "$SESSIONS" "$HOST_LIVE" "$STEPS")
ROWS=$(wc -l < "$TRACE")
RESTART_AT=${RESTART_AT:-$((ROWS / 2))}
FIRST_N=${FIRST_N:-$((ROWS - RESTART_AT))}
PARTS=${PARTS:-host restart}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

WORK=$(mktemp -d)
LOG=""
N_SERVERS=0
SERVER=""
stop_server() {
    if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then kill -TERM "$SERVER"; wait "$SERVER" || true; fi
    SERVER=""
}
trap 'stop_server; rm -rf "$WORK"' EXIT
# Starts a server (more `squad serve` options in "$@"); sets SERVER, PORT and READY_S (seconds from
# the start to /ready answering 200).
start_server() {
    local t0
    t0=$(date +%s.%N)
    N_SERVERS=$((N_SERVERS + 1))
    LOG="$WORK/server-$N_SERVERS.log"
    # shellcheck disable=SC2086
    "$SQUAD" serve --model "$MODEL" --port 0 --threads "$THREADS" $SERVE_ARGS "$@" 2> "$LOG" &
    SERVER=$!
    PORT=""
    for _ in $(seq 1 3000); do
        PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$LOG" | head -1)
        if [ -n "$PORT" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/ready")" = 200 ]; then
            READY_S=$(python3 -c "import sys; print('%.3f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$(date +%s.%N)")
            return 0
        fi
        kill -0 "$SERVER" 2>/dev/null || { cat "$LOG" >&2; exit 1; }
        sleep 0.02
    done
    echo "tier_bench.sh: the server did not become ready" >&2; cat "$LOG" >&2; exit 1
}
# One figure of the server's cache statistics (GET /v1/stats "cache"): cache_stat KEY
cache_stat() {
    curl -s "http://127.0.0.1:$PORT/v1/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cache"][sys.argv[1]])' "$1"
}
tiers_line() {
    curl -s "http://127.0.0.1:$PORT/v1/stats" | python3 -c '
import json, sys
c = json.load(sys.stdin)["cache"]
print("  %s: device %.1f of %.1f MB, host tier %.1f of %.1f MB; demotions %d (%.3f s queued), promotions %d (%.3f s "
      "queued), recomputed instead %d, host evicted %d, device evicted %d; host slabs pinned at start %d (in %.2f s), on the "
      "scheduling thread %d; disk loaded %d, refused %d" % (sys.argv[1], c["bytes_held"] / 1e6,
      c["budget_bytes"] / 1e6, c["host_bytes_held"] / 1e6, c["host_budget_bytes"] / 1e6, c["demotions"],
      c["demote_seconds"], c["promotions"], c["promote_seconds"], c["host_recomputed"], c["host_evicted"], c["evicted"],
      c["host_slabs_reserved"], c["host_reserve_seconds"], c["host_slabs_sync"], c["disk_loaded"], c["disk_refused"]))
print("    rows %d: hits %d, partial %d, cold %d, uncacheable %d; tokens reused %d, computed %d" % (c["rows"], c["hits"],
      c["partial"], c["cold"], c["uncacheable"], c["tokens_reused"], c["tokens_computed"]))' "$1"
}
run_trace() { # run_trace TRACE LABEL HEADER(1: the table's head)
    if [ "$3" = 1 ]; then "$BENCH" --port "$PORT" --pid "$SERVER" --trace "$1" --concurrency "$CONCURRENCY" --label "$2"
    else "$BENCH" --port "$PORT" --pid "$SERVER" --trace "$1" --concurrency "$CONCURRENCY" --label "$2" | tail -n +3; fi
}

if part host; then
echo "== host tier: agent trace, $(wc -l < "$HOST_TRACE") rows ($SESSIONS sessions, $HOST_LIVE live, $STEPS steps), preset $PRESET," \
    "concurrency $CONCURRENCY, serve $SERVE_ARGS"
start_server --cache-mb 65536 --cache-host-mb 0
run_trace "$HOST_TRACE" "room for all" 1
WORKING=$(cache_stat bytes_held)
TIERS=()
stop_server
CACHE_MB=$(( (WORKING / 4 + (1 << 20) - 1) >> 20 ))
[ "$CACHE_MB" -ge 1 ] || CACHE_MB=1
HOST_MB=${HOST_MB:-$(( (5 * WORKING / 4 + (1 << 20) - 1) >> 20 ))}
for host in 0 "$HOST_MB"; do
    start_server --cache-mb "$CACHE_MB" --cache-host-mb "$host"
    label="device $CACHE_MB MB, host $host MB"
    run_trace "$HOST_TRACE" "$label" 0
    TIERS+=("$(tiers_line "$label")")
    stop_server
done
echo "working set $(python3 -c "print('%.1f' % ($WORKING / 1e6))") MB (what the first server held);" \
    "device budget $CACHE_MB MB ($(python3 -c "print('%.1fx' % ($WORKING / ($CACHE_MB * 1048576.0)))") smaller)"
printf '%s\n' "${TIERS[@]}"
fi

part restart || exit 0
echo
echo "== restart: rows 1-$RESTART_AT, SIGTERM, a new server, then the next $FIRST_N rows (time to /ready, hit rate)"
head -n "$RESTART_AT" "$TRACE" > "$WORK/before.jsonl"
tail -n +"$((RESTART_AT + 1))" "$TRACE" | head -n "$FIRST_N" > "$WORK/after.jsonl"
READY=()
header=1
for dir in none "$WORK/cache-dir"; do
    args=()
    [ "$dir" != none ] && args=(--cache-dir "$dir")
    start_server --cache-mb 65536 "${args[@]}"
    "$BENCH" --port "$PORT" --pid "$SERVER" --trace "$WORK/before.jsonl" --concurrency "$CONCURRENCY" >/dev/null
    stop_server
    label=$([ "$dir" = none ] && echo "restart, no --cache-dir" || echo "restart, --cache-dir")
    first_log=$LOG
    start_server --cache-mb 65536 "${args[@]}"
    loaded=""
    if [ "$dir" != none ]; then # the background load's end (its log line), before the trace goes on
        t0=$(date +%s.%N)
        for _ in $(seq 1 3000); do
            grep -q "cache dir: .*loaded from\|cache dir: .*nothing loaded\|cache dir: .*cannot" "$LOG" && break
            sleep 0.02
        done
        loaded=", the cache dir loaded $(python3 -c "import sys; print('%.3f' % (float(sys.argv[2]) - float(sys.argv[1]) + float(sys.argv[3])))" \
            "$t0" "$(date +%s.%N)" "$READY_S") s after the start"
    fi
    READY+=("  $label: /ready after $READY_S s$loaded")
    run_trace "$WORK/after.jsonl" "$label" "$header"
    header=0
    TIERS=("$(tiers_line "$label")")
    printf '%s\n' "${TIERS[@]}" >> "$WORK/restart-tiers.txt"
    cat "$first_log" "$LOG" | grep -i "cache dir" | head -6 | sed 's/^/  log: /' >> "$WORK/restart-tiers.txt" || true
    stop_server
done
printf '%s\n' "${READY[@]}"
cat "$WORK/restart-tiers.txt"
