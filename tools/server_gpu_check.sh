#!/usr/bin/env bash
# server_gpu_check.sh — the server's overhead on a GPU (issue 13's H200 figure): a decision request
# with three questions about a cached state of about 4096 tokens, timed by the client, against the
# engine's own time for its rows (the scheduler's run time, which `squad serve --log-requests` logs
# as "engine X ms" beside each request's total).
#
#   bash tools/server_gpu_check.sh SQUAD_BIN TOKENIZER_JSON OUTDIR
#
# It synthesizes the 0.8B preset with the given (Qwen) tokenizer, starts `squad serve --device cuda`
# on a free loopback port, sends one request that computes and caches the state, then REQS requests
# (default 30) that each ask three new questions about that state (new texts, so the request memo
# never answers them), and prints the medians: client latency, the server's total, the engine's
# time, and their ratio. Needs curl and python3.
set -euo pipefail
SQUAD=${1:?usage: server_gpu_check.sh SQUAD_BIN TOKENIZER_JSON OUTDIR}
TOK=${2:?tokenizer.json}
OUT=${3:?outdir}
REQS=${REQS:-30}
MODEL=${MODEL:-/tmp/squad-0.8b-qwen-tokenizer}
STATE_TOKENS=${STATE_TOKENS:-4096}
mkdir -p "$OUT"
[ -f "$MODEL/config.json" ] || "$SQUAD" synth --preset "${PRESET:-qwen3.5-0.8b}" --out "$MODEL" --tokenizer "$TOK" >/dev/null

LOG="$OUT/serve_gpu.log"
"$SQUAD" serve --model "$MODEL" --device "${DEVICE:-cuda}" --port 0 --log-requests ${SERVE_ARGS:-} 2>"$LOG" &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
PORT=""
for _ in $(seq 1 600); do
    PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)
    [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null 2>&1 && break
    sleep 0.5
done
[ -n "$PORT" ] || { echo "server did not start"; cat "$LOG"; exit 1; }
URL="http://127.0.0.1:$PORT"

# a page of about STATE_TOKENS tokens (checked through the tokenizer) and request bodies
python3 - "$SQUAD" "$TOK" "$STATE_TOKENS" "$REQS" "$OUT" <<'EOF'
import json, subprocess, sys
squad, tok, want, reqs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def ntok(text):
    r = subprocess.run([squad, "tokenize", "--tokenizer", tok], input=text.encode(), capture_output=True, check=True)
    return len(json.loads(r.stdout))
lines, i = [], 0
while True:
    lines.append(f"row {i}: link 'Product {i}' price {i * 7 % 97}.99 EUR, button 'Add to cart' enabled, rating {i % 5} stars")
    i += 1
    if i % 20 == 0 and ntok("\n".join(lines)) >= want - 60:
        break
page = "Page: Shop results\n" + "\n".join(lines)
print(f"state: {ntok(page)} tokens of page text", file=sys.stderr)
def body(k):
    qs = [{"type": "choice", "name": f"q{k}_{j}", "instructions": f"Which product should the agent open for task {k}.{j}?",
           "choices": [{"value": f"Product {k + j}"}, {"value": f"Product {k + j + 1}"}, {"value": "none"}]} for j in range(3)]
    return {"model": "squad-0.8b-qwen-tokenizer", "input": page, "questions": qs}
for k in range(reqs + 1):
    with open(f"{out}/req{k}.json", "w") as f:
        json.dump(body(k), f)
EOF
MODEL_NAME=$(curl -s "$URL/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
for k in $(seq 0 "$REQS"); do
    python3 - "$OUT/req$k.json" "$MODEL_NAME" <<'EOF'
import json, sys
p, name = sys.argv[1], sys.argv[2]
b = json.load(open(p)); b["model"] = name; json.dump(b, open(p, "w"))
EOF
done
# the first request computes the state and checkpoints it; the rest are hits
curl -s -o "$OUT/resp0.json" -w "cold: %{http_code} %{time_total}s\n" -H 'Content-Type: application/json' --data-binary @"$OUT/req0.json" "$URL/v1/decisions"
: >"$OUT/client_times.txt"
for k in $(seq 1 "$REQS"); do
    curl -s -o "$OUT/resp.json" -w "%{http_code} %{time_total}\n" -H 'Content-Type: application/json' --data-binary @"$OUT/req$k.json" "$URL/v1/decisions" >>"$OUT/client_times.txt"
done
head -c 600 "$OUT/resp.json"; echo
kill -TERM $PID; wait $PID || true
trap - EXIT
python3 - "$OUT/client_times.txt" "$LOG" <<'EOF'
import re, statistics, sys
client = [float(l.split()[1]) * 1000 for l in open(sys.argv[1]) if l.startswith("200 ")]
rows = [(float(m.group(1)), float(m.group(2))) for m in re.finditer(r"/v1/decisions 200 ([0-9.]+) ms \(before the engine [0-9.]+ ms, engine ([0-9.]+) ms", open(sys.argv[2]).read())]
hits = rows[1:]
srv, eng = statistics.median(t for t, _ in hits), statistics.median(e for _, e in hits)
cl = statistics.median(client)
print(f"decision requests with 3 questions on a cached state: {len(client)} answered (200)")
print(f"p50 client {cl:.3f} ms, server total {srv:.3f} ms, engine {eng:.3f} ms; client / engine {cl / eng:.2f}x, server / engine {srv / eng:.2f}x")
EOF
