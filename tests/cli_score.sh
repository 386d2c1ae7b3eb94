#!/usr/bin/env bash
# cli_score.sh SQUAD — `squad score` as a user drives it (docs/design.md section 9): one output line per
# row in order, {"error": ...} for a bad row while the rest go on, exit 0 / 1 / 2, and clear
# messages for a missing or broken model directory.
set -u
SQUAD=${1:?usage: cli_score.sh path/to/squad}
MODEL=tests/fixtures/models/tiny-causal
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { # description, command status (0 = ok)
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1" >&2; fi
}

good='{"ids": [5, 9, 12, 40], "slots": [3], "nopts": [3], "letters": [1, 2, 3]}'
printf '%s\n' "$good" "$good" > "$tmp/good.jsonl"
"$SQUAD" score --model "$MODEL" --rows "$tmp/good.jsonl" --device cpu > "$tmp/out" 2> "$tmp/err"
check "good rows exit 0" $?
check "two output lines" $([ "$(wc -l < "$tmp/out")" -eq 2 ]; echo $?)
check "probs present" $(grep -c '"probs"' "$tmp/out" | grep -qx 2; echo $?)
check "second identical row answered by the memo" $(sed -n 2p "$tmp/out" | grep -q '"computed": 0'; echo $?)
# --stats: the same 4-token row three times; the memo answers the second and third.
printf '%s\n' "$good" "$good" "$good" > "$tmp/three.jsonl"
"$SQUAD" score --model "$MODEL" --rows "$tmp/three.jsonl" --device cpu --stats > "$tmp/out" 2> "$tmp/err"
check "--stats: exit 0" $?
for k in rows hits partial cold plain memo_hits tokens_memo uncacheable tokens_reused tokens_computed \
         checkpoints_made evicted checkpoints groups bytes_held budget_bytes; do
  check "--stats: counter $k" $(grep -q "\"$k\": [0-9]" "$tmp/err"; echo $?)
done
stat() { sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p" "$tmp/err"; }
check "--stats: memo_hits counts the two repeats (got $(stat memo_hits))" \
    $([ "$(stat memo_hits)" = 2 ]; echo $?)
check "--stats: tokens_memo counts their 8 tokens (got $(stat tokens_memo))" \
    $([ "$(stat tokens_memo)" = 8 ]; echo $?)
check "--stats: the first row counted once, outside the memo (rows $(stat rows), plain $(stat plain))" \
    $([ $(($(stat rows) + $(stat plain))) -eq 1 ]; echo $?)

printf '%s\n' "$good" '{"ids": [1, 2], "slots": [5], "nopts": [2], "letters": [1, 2]}' 'not json' \
    '{"ids": [1, 2, 99999], "slots": [0], "nopts": [1], "letters": [1]}' '' "$good" > "$tmp/mixed.jsonl"
"$SQUAD" score --model "$MODEL" --rows "$tmp/mixed.jsonl" --device cpu --cache-mb 0 > "$tmp/out" 2> "$tmp/err"
check "some rows failed: exit 1" $([ $? -eq 1 ]; echo $?)
check "five output lines (blank line skipped)" $([ "$(wc -l < "$tmp/out")" -eq 5 ]; echo $?)
check "row 2 error names the slot" $(sed -n 2p "$tmp/out" | grep -q '"error".*slots'; echo $?)
check "row 3 error says JSON" $(sed -n 3p "$tmp/out" | grep -q '"error".*JSON'; echo $?)
check "row 4 error names the vocabulary" $(sed -n 4p "$tmp/out" | grep -q '"error".*vocabulary'; echo $?)
check "the last row still answered" $(sed -n 5p "$tmp/out" | grep -q '"probs"'; echo $?)

echo "$good" | "$SQUAD" score --model "$MODEL" --device cpu > "$tmp/out" 2>&1
check "rows from stdin" $?

"$SQUAD" score --model "$tmp/nope" < /dev/null > "$tmp/out" 2> "$tmp/err"
check "missing model dir: exit 2" $([ $? -eq 2 ]; echo $?)
check "missing model dir: one clear message" $(grep -q "model directory.*No such file" "$tmp/err"; echo $?)

mkdir -p "$tmp/broken" && cp "$MODEL/config.json" "$tmp/broken/" && head -c 1000 "$MODEL/model.safetensors" > "$tmp/broken/model.safetensors"
"$SQUAD" score --model "$tmp/broken" < /dev/null > "$tmp/out" 2> "$tmp/err"
check "truncated weights: exit 2" $([ $? -eq 2 ]; echo $?)
check "truncated weights: message" $([ -s "$tmp/err" ]; echo $?)

"$SQUAD" score > "$tmp/out" 2> "$tmp/err"
check "no --model: exit 2" $([ $? -eq 2 ]; echo $?)
"$SQUAD" score --model "$MODEL" --threads abc < /dev/null > "$tmp/out" 2> "$tmp/err"
check "bad --threads: exit 2" $([ $? -eq 2 ]; echo $?)
# --max-tokens: a row at the limit answered, one past it refused with the reason; bad values exit 2
printf '%s\n' "$good" '{"ids": [5, 9, 12, 40, 41], "slots": [4], "nopts": [3], "letters": [1, 2, 3]}' > "$tmp/limit.jsonl"
"$SQUAD" score --model "$MODEL" --rows "$tmp/limit.jsonl" --device cpu --max-tokens 4 > "$tmp/out" 2> "$tmp/err"
check "--max-tokens 4: a row past it fails (exit 1)" $([ $? -eq 1 ]; echo $?)
check "--max-tokens 4: the 4-token row answered" $(sed -n 1p "$tmp/out" | grep -q '"probs"'; echo $?)
check "--max-tokens 4: the 5-token row refused with the limit and its reason" \
    $(sed -n 2p "$tmp/out" | grep -q '"error".*5 tokens.*longest supported is 4 (the max_tokens option)'; echo $?)
"$SQUAD" score --model "$MODEL" --device cpu --max-tokens -3 < /dev/null > "$tmp/out" 2> "$tmp/err"
check "--max-tokens -3: exit 2" $([ $? -eq 2 ]; echo $?)
"$SQUAD" score --model "$MODEL" --device cpu --max-tokens 40000 < /dev/null > "$tmp/out" 2> "$tmp/err"
check "--max-tokens past the model's positions: exit 2" $([ $? -eq 2 ]; echo $?)
check "--max-tokens past the model's positions: the message says so" \
    $(grep -q "max_position_embeddings (32768)" "$tmp/err"; echo $?)
"$SQUAD" score --help > "$tmp/out"
check "help mentions --max-tokens" $(grep -q -- "--max-tokens" "$tmp/out"; echo $?)
"$SQUAD" score --help > "$tmp/out"
check "help mentions --cache-mb" $(grep -q -- "--cache-mb" "$tmp/out"; echo $?)

# specialists: a synthesized model with its specialists directory; every row names its route, a
# row may force one, an unknown label is a row error, a bad directory exit 2
"$SQUAD" synth --preset tiny --out "$tmp/sm" --specialists "$tmp/sp" 2> /dev/null
check "synth --specialists" $?
check "synth --specialists: the directory" $([ -f "$tmp/sp/squad-specialists.json" ]; echo $?)
printf '%s\n' "$good" '{"ids": [5, 9, 12, 40], "slots": [3], "nopts": [3], "letters": [1, 2, 3], "specialist": "nav"}' \
    '{"ids": [5, 9, 12, 41], "slots": [3], "nopts": [3], "letters": [1, 2, 3], "specialist": "auto"}' \
    '{"ids": [5, 9, 12, 40], "slots": [3], "nopts": [3], "letters": [1, 2, 3], "specialist": "nope"}' > "$tmp/sp.jsonl"
"$SQUAD" score --model "$tmp/sm" --specialists "$tmp/sp" --rows "$tmp/sp.jsonl" --device cpu --stats > "$tmp/out" 2> "$tmp/err"
check "specialists: a bad row gives exit 1" $([ $? -eq 1 ]; echo $?)
check "specialists: a route per answered row" $(grep -c '"route": "\(trunk\|e2e\|nav\)", "router": \[' "$tmp/out" | grep -qx 3; echo $?)
check "specialists: the forced row" $(sed -n 2p "$tmp/out" | grep -q '"route": "nav"'; echo $?)
check "specialists: unknown label" $(sed -n 4p "$tmp/out" | grep -q "unknown specialist 'nope'"; echo $?)
check "specialists: --stats counts mispredictions" $(grep -q '"mispredictions": [0-9]' "$tmp/err"; echo $?)
"$SQUAD" score --model "$tmp/sm" --rows "$tmp/sp.jsonl" --device cpu > "$tmp/out" 2> "$tmp/err"
check "no --specialists: a forced row is an error" $(sed -n 2p "$tmp/out" | grep -q 'needs --specialists'; echo $?)
check "no --specialists: no route printed" $(grep -q '"route"' "$tmp/out"; [ $? -ne 0 ]; echo $?)
"$SQUAD" score --model "$tmp/sm" --specialists "$tmp/nowhere" < /dev/null > "$tmp/out" 2> "$tmp/err"
check "missing specialists directory: exit 2" $([ $? -eq 2 ]; echo $?)
check "missing specialists directory: message" $(grep -q "specialists" "$tmp/err"; echo $?)
"$SQUAD" score --model "$tmp/sm" --specialists "$tmp/sp" --max-adapters -1 < /dev/null > "$tmp/out" 2> "$tmp/err"
check "bad --max-adapters: exit 2" $([ $? -eq 2 ]; echo $?)

echo "cli_score: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
