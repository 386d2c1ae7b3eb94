#!/usr/bin/env bash
# cli_score.sh SQUAD — `squad score` as a user drives it (docs/design.md section 9): one output line per
# row in order, {"error": ...} for a bad row while the rest go on, exit 0 / 1 / 2, and clear
# messages for a missing or broken model directory; each option changes what it should (the cache
# options move "reused" by the documented placement rules, docs/design.md section 7), in both
# spellings (--opt value, --opt=value).
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

# --- each option does what it says (docs/design.md section 7: placement and eligibility) ---
# row STATE_LEN TOTAL SEED CHANGE_AT: a row of TOTAL ids whose first STATE_LEN are the state; the
# state's ids are the same for every SEED before position CHANGE_AT, the rest depend on SEED; one
# slot (or two with SLOTS=2) at the end over 3 options.
row() {
  awk -v sl="$1" -v n="$2" -v seed="$3" -v ch="$4" -v slots="${SLOTS:-1}" 'BEGIN {
    printf "{\"ids\": [";
    for (i = 0; i < n; i++) {
      s = (i < sl && i < ch) ? 1 : seed;
      printf "%s%d", (i ? ", " : ""), (i * 37 + s * 101 + int(i / 3) * s) % 290 + 5;
    }
    if (slots == 2) printf "], \"slots\": [%d, %d], \"nopts\": [3, 3]", n - 2, n - 1;
    else printf "], \"slots\": [%d], \"nopts\": [3]", n - 1;
    printf ", \"letters\": [1, 2, 3], \"state_len\": %d}\n", sl;
  }'
}
# reused OPTIONS...: the second row's "reused" when the rows of $tmp/pair.jsonl run with OPTIONS
reused() {
  "$SQUAD" score --model "$MODEL" --device cpu --threads 1 --rows "$tmp/pair.jsonl" "$@" 2> "$tmp/err" |
    sed -n 2p | sed -n 's/.*"reused": \([0-9]*\).*/\1/p'
}
expect_reused() { # description, want, options...
  local what="$1" want="$2" got
  shift 2
  got="$(reused "$@")"
  check "$what: reused $want (got '$got')" $([ "$got" = "$want" ]; echo $?)
}
# the same 300-token state, another question: restored from the checkpoint at 300 rounded down to --align
{ row 300 304 2 9999; row 300 304 3 9999; } > "$tmp/pair.jsonl"
expect_reused "same state" 256
expect_reused "same state, --cache-mb 0" 0 --cache-mb 0
expect_reused "same state, --cache-mb=0" 0 --cache-mb=0
expect_reused "same state, --align 32" 288 --align 32
expect_reused "same state, --align=32" 288 --align=32
expect_reused "same state, --min-prefix 512 (too short to cache)" 0 --min-prefix 512
expect_reused "same state, --min-prefix=512" 0 --min-prefix=512
# rows of two slots: cached under the default --max-slots 4, not under --max-slots 1
{ SLOTS=2 row 300 304 2 9999; SLOTS=2 row 300 304 3 9999; } > "$tmp/pair.jsonl"
expect_reused "two slots" 256
expect_reused "two slots, --max-slots 1" 0 --max-slots 1
# a state whose end changed at 318: the checkpoint at the end (320) is lost, the one --tail before
# the end (330 - tail, aligned down to 16) is restored
{ row 330 334 2 9999; row 330 334 3 318; } > "$tmp/pair.jsonl"
expect_reused "changed end, --align 16 (tail 16)" 304 --align 16
expect_reused "changed end, --align 16 --tail 40" 288 --align 16 --tail 40
expect_reused "changed end, --align=16 --tail=40" 288 --align=16 --tail=40
# a 600-token state changed at 400: nothing to restore unless --stride put a checkpoint before 400
{ row 600 604 2 9999; row 600 604 3 400; } > "$tmp/pair.jsonl"
expect_reused "changed middle (stride 2048)" 0
expect_reused "changed middle, --stride 128" 384 --stride 128
expect_reused "changed middle, --stride=128" 384 --stride=128
for o in --stride --tail --align --min-prefix --max-slots --cache-mb; do
  "$SQUAD" score --model "$MODEL" --device cpu "$o=x" < /dev/null > "$tmp/out" 2> "$tmp/err"
  check "$o=x: exit 2" $([ $? -eq 2 ]; echo $?)
  check "$o=x: the message names the option" $(grep -q -- "$o must be an integer" "$tmp/err"; echo $?)
done

# --precision: exact (fp32) and bf16 answer alike to round-off, not to the digit
row 300 304 2 9999 > "$tmp/one.jsonl"
"$SQUAD" score --model "$MODEL" --device cpu --threads 1 --cache-mb 0 --rows "$tmp/one.jsonl" > "$tmp/bf16" 2> "$tmp/err"
check "--precision bf16 (default): exit 0" $?
"$SQUAD" score --model "$MODEL" --device cpu --threads 1 --cache-mb 0 --precision=exact --rows "$tmp/one.jsonl" > "$tmp/exact" 2> "$tmp/err"
check "--precision=exact: exit 0" $?
check "--precision exact differs from bf16 in the digits" $(! cmp -s "$tmp/bf16" "$tmp/exact"; echo $?)
probs() { sed 's/.*"probs": \[\[\([^]]*\)\]\].*/\1/' "$1" | tr -d ' ' | tr ',' '\n'; } # every row's, one a line
check "--precision exact agrees with bf16 to 0.05" \
    $(paste <(probs "$tmp/bf16") <(probs "$tmp/exact") | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 0.05) bad = 1 } END { exit bad }'; echo $?)
"$SQUAD" score --model "$MODEL" --device cpu --precision fp8 < /dev/null > "$tmp/out" 2> "$tmp/err"
check "--precision fp8: exit 2" $([ $? -eq 2 ]; echo $?)
check "--precision fp8: the message" $(grep -q -- "--precision must be exact or bf16 (got 'fp8')" "$tmp/err"; echo $?)
# --threads and --max-rows change how the work is spread, not the answers: on the CPU a row batched
# or alone, on any number of threads, gives the same bits; --batch-tokens cuts rows into other
# chunks, which changes only round-off (docs/batching.md)
{ row 300 304 2 9999; row 200 210 4 9999; row 90 96 5 9999; } > "$tmp/three.jsonl"
"$SQUAD" score --model "$MODEL" --device cpu --threads 1 --cache-mb 0 --rows "$tmp/three.jsonl" > "$tmp/base" 2> "$tmp/err"
for o in "--threads=2" "--threads 2" "--max-rows 1" "--max-rows=2" "--batch-tokens 64" "--batch-tokens 16"; do
  # shellcheck disable=SC2086
  "$SQUAD" score --model "$MODEL" --device cpu --threads 1 --cache-mb 0 $o --rows "$tmp/three.jsonl" > "$tmp/out" 2> "$tmp/err"
  check "$o: exit 0" $?
  case "$o" in
    --batch-tokens*)
      check "$o: the same answers up to round-off (1e-4)" \
          $(paste <(probs "$tmp/base") <(probs "$tmp/out") | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) bad = 1 } END { exit bad }'; echo $?)
      ;;
    *) check "$o: the same answers, bit for bit" $(cmp -s "$tmp/base" "$tmp/out"; echo $?) ;;
  esac
done
"$SQUAD" score --model "$MODEL" --device cpu --max-rows=-1 < /dev/null > "$tmp/out" 2> "$tmp/err"
check "--max-rows=-1: exit 2" $([ $? -eq 2 ]; echo $?)
# --device: cpu runs on the CPU; an unknown device is exit 2
"$SQUAD" score --model "$MODEL" --device=tpu < /dev/null > "$tmp/out" 2> "$tmp/err"
check "--device=tpu: exit 2" $([ $? -eq 2 ]; echo $?)
check "--device=tpu: the message" $(grep -q -- "--device must be cpu, cuda or auto (got 'tpu')" "$tmp/err"; echo $?)
# --max-tokens with '=': the tighter limit named
"$SQUAD" score --model "$MODEL" --rows "$tmp/limit.jsonl" --device cpu --max-tokens=4 > "$tmp/out" 2> "$tmp/err"
check "--max-tokens=4: the 5-token row refused naming the option's limit" \
    $(sed -n 2p "$tmp/out" | grep -q '"error".*5 tokens.*longest supported is 4 (the max_tokens option)'; echo $?)

# --- spelling: --opt=value for the command's own options; unknown options and flags given values ---
"$SQUAD" score --model="$MODEL" --rows="$tmp/good.jsonl" --device=cpu > "$tmp/out" 2> "$tmp/err"
check "--model= --rows= --device=: exit 0" $?
check "--model= --rows=: two answers" $([ "$(grep -c '"probs"' "$tmp/out")" -eq 2 ]; echo $?)
"$SQUAD" score --model "$MODEL" --rows "$tmp/good.jsonl" --stats=yes > "$tmp/out" 2> "$tmp/err"
check "--stats=yes: exit 2" $([ $? -eq 2 ]; echo $?)
check "--stats=yes: takes no value" $(grep -q -- "--stats takes no value" "$tmp/err"; echo $?)
"$SQUAD" score --model "$MODEL" --bogus=1 < /dev/null > "$tmp/out" 2> "$tmp/err"
check "--bogus=1: exit 2" $([ $? -eq 2 ]; echo $?)
check "--bogus=1: unknown option" $(grep -q -- "unknown option '--bogus=1'" "$tmp/err"; echo $?)
"$SQUAD" score --model "$MODEL" --rows < /dev/null > "$tmp/out" 2> "$tmp/err"
check "--rows without a value: exit 2" $([ $? -eq 2 ]; echo $?)
check "--rows without a value: the message" $(grep -q -- "--rows needs a value" "$tmp/err"; echo $?)

echo "cli_score: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
