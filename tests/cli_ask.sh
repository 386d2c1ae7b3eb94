#!/usr/bin/env bash
# cli_ask.sh — `squad ask` end to end on a small synthesized model that carries the real Qwen3
# tokenizer: the answer JSON for the example requests, the model directory's tokenizer and template
# found automatically, bad requests (exit 1, {"error": ...} on stdout), unusable models, templates and
# usage (exit 2); each option changes what it should (--tokenizer the tokens, --template the rows,
# --cache-mb / --min-prefix the reuse, --max-tokens the longest row, --precision the digits), in both
# spellings (--opt value, --opt=value). Run from the repository root: bash tests/cli_ask.sh path/to/squad
set -uo pipefail
SQUAD="${1:?usage: cli_ask.sh path/to/squad}"
TOK=third_party/qwen3/tokenizer.json
. "$(dirname "$0")/shell_checks.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$TOK" ]; then
  bad "$TOK is missing (run tools/fetch_test_data.sh)"
  echo "cli_ask: $pass passed, $fail failed"
  exit 1
fi
M="$tmp/model"
"$SQUAD" synth --preset tiny --out "$M" --tokenizer "$TOK" 2> /dev/null
check "synth" "$?" 0

out="$("$SQUAD" ask --model "$M" --request examples/login.json --threads 1)"
check "ask exit status" "$?" 0
has "answers" "$out" '{"answers": [{"probs": ['
check "three answers" "$(grep -o '"choice"' <<< "$out" | wc -l)" 3
has "tokens" "$out" '"tokens": {"state": '
has "ms" "$out" '"ms": '
# the probabilities of the first question: four numbers
check "four options" "$(sed -E 's/^\{"answers": \[\{"probs": \[([^]]*)\].*/\1/' <<< "$out" | tr ',' '\n' | wc -l)" 4
# the same request on stdin gives the same answers (timing aside)
out2="$("$SQUAD" ask --model "$M" --request - --threads 1 < examples/login.json)"
check "stdin request" "${out2%%\"ms\"*}" "${out%%\"ms\"*}"
out3="$("$SQUAD" ask --model "$M" --threads 1 < examples/cart.json)"
check "default is stdin" "$?" 0
check "four answers" "$(grep -o '"choice"' <<< "$out3" | wc -l)" 4

# bad requests: exit 1, the error as JSON on stdout
bad_request() {
  local req="$1" want="$2" got rc
  got="$(printf '%s' "$req" | "$SQUAD" ask --model "$M" --threads 1)"
  rc=$?
  check "bad request exit status ($want)" "$rc" 1
  has "bad request message" "$got" "{\"error\":"
  has "bad request message" "$got" "$want"
}
bad_request '{"state": "", "questions": [{"text": "q", "options": ["a"]}]}' "request.state is empty"
bad_request '{"state": "s"}' "request.questions is missing"
bad_request '{"state": "s", "questions": []}' "request.questions is empty"
bad_request '{"state": "s", "questions": [{"text": "q", "options": []}]}' "options is empty"
bad_request '{"state": "s", "questions": [{"text": "q", "options": ["a", 7]}]}' "options[1] must be a string"
bad_request "{\"state\": \"s\", \"questions\": [{\"text\": \"q\", \"options\": [$(printf '"o",%.0s' $(seq 26))\"o\"]}]}" "27 options"
bad_request 'not json' "not valid JSON"

# a state longer than the model supports
cp -r "$M" "$tmp/short"
sed -i -E 's/"max_position_embeddings": [0-9]+/"max_position_embeddings": 64/' "$tmp/short/config.json"
got="$("$SQUAD" ask --model "$tmp/short" --request examples/login.json)"
check "long state exit status" "$?" 1
has "long state message" "$got" "rows are at most 64 tokens (the model's positions)"

# the model directory's template: three questions in one row
echo '{"questions_per_row": 3}' > "$M/squad-template.json"
out4="$("$SQUAD" ask --model "$M" --request examples/login.json --threads 1)"
check "template exit status" "$?" 0
check "template: three answers" "$(grep -o '"choice"' <<< "$out4" | wc -l)" 3
# letters that are not single tokens: the template does not fit this tokenizer
echo '{"labels": ["1", "2", "3", "4"]}' > "$M/squad-template.json"
got="$("$SQUAD" ask --model "$M" --request examples/login.json)"
check "bad letters exit status" "$?" 2
has "bad letters message" "$got" "single token"
echo '{"prefix": "no state"}' > "$M/squad-template.json"
got="$("$SQUAD" ask --model "$M" --request examples/login.json)"
check "bad template exit status" "$?" 2
has "bad template message" "$got" "squad-template.json"
rm "$M/squad-template.json"
# --template overrides; --tokenizer overrides
echo '{"questions_per_row": 2}' > "$tmp/t.json"
"$SQUAD" ask --model "$M" --template "$tmp/t.json" --tokenizer "$TOK" --request examples/settings.json > /dev/null
check "--template / --tokenizer" "$?" 0

# usage and model errors: exit 2
got="$("$SQUAD" ask --request examples/login.json)"
check "no --model" "$?" 2
has "no --model message" "$got" "--model"
got="$("$SQUAD" ask --model "$tmp/nonexistent" --request examples/login.json)"
check "missing model" "$?" 2
has "missing model message" "$got" "{\"error\":\"model directory $tmp/nonexistent: No such file or directory\"}"
got="$("$SQUAD" ask --model "$M" --request "$tmp/nonexistent.json")"
check "missing request file" "$?" 2
mkdir "$tmp/notok" && cp "$M/config.json" "$M/model.safetensors" "$tmp/notok/"
got="$("$SQUAD" ask --model "$tmp/notok" --request examples/login.json)"
check "no tokenizer.json" "$?" 2
has "no tokenizer message" "$got" "tokenizer.json"
"$SQUAD" ask --model "$M" --bogus 1 > /dev/null
check "unknown option" "$?" 2
"$SQUAD" ask --help > /dev/null
check "--help" "$?" 0

# specialists: the route and the router's probabilities; --specialist forces a label
"$SQUAD" synth --preset tiny --out "$tmp/sm" --tokenizer "$TOK" --specialists "$tmp/sp" 2> /dev/null
check "synth --specialists" "$?" 0
got="$("$SQUAD" ask --model "$tmp/sm" --specialists "$tmp/sp" --request examples/login.json --threads 1)"
check "specialists exit status" "$?" 0
has "specialists: router" "$got" '"router": {"trunk": '
check "specialists: a route per answer and one for the request" "$(grep -o '"route": "[a-z0-9]*"' <<< "$got" | wc -l)" 4
got="$("$SQUAD" ask --model "$tmp/sm" --specialists "$tmp/sp" --specialist e2e --request examples/login.json --threads 1)"
check "forced specialist exit status" "$?" 0
check "forced specialist: every route" "$(grep -o '"route": "e2e"' <<< "$got" | wc -l)" 4
got="$("$SQUAD" ask --model "$tmp/sm" --specialists "$tmp/sp" --specialist nope --request examples/login.json)"
check "unknown specialist exit status" "$?" 2
has "unknown specialist message" "$got" "nope"
got="$("$SQUAD" ask --model "$tmp/sm" --specialist e2e --request examples/login.json)"
check "--specialist without --specialists" "$?" 2

# --- each option does what it says ---
field() { sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p" <<< "$2"; } # a number in the "tokens" object
answers() { sed 's/"tokens".*//' <<< "$1"; }                  # the answers, without tokens and ms
base="$("$SQUAD" ask --model "$M" --request examples/login.json --threads 1)"
check "base: state tokens" "$(field state "$base")" 258
check "base: the questions after the first restore the state" "$(field reused "$base")" 512
# --opt=value: the same answers as --opt value
got="$("$SQUAD" ask --model="$M" --request=examples/login.json --threads=1)"
check "--model= --request= --threads=: exit status" "$?" 0
check "--model= --request= --threads=: the same answers" "$(answers "$got")" "$(answers "$base")"
# --tokenizer: the model directory's tokenizer.json replaced by one with only the first 2,000 merges
# (more, shorter tokens), then --tokenizer names the full one again
mkdir "$tmp/few" && cp "$M/config.json" "$M/model.safetensors" "$tmp/few/"
python3 -c 'import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["merges"] = t["model"]["merges"][:2000]
json.dump(t, open(sys.argv[2], "w"))' "$TOK" "$tmp/few/tokenizer.json"
check "a tokenizer with fewer merges" "$?" 0
got="$("$SQUAD" ask --model "$tmp/few" --request examples/login.json --threads 1)"
check "the directory's tokenizer: exit status" "$?" 0
check "the directory's tokenizer (fewer merges): a longer state" "$(field state "$got")" 350
got="$("$SQUAD" ask --model "$tmp/few" --tokenizer "$TOK" --request examples/login.json --threads 1)"
check "--tokenizer FILE overrides the directory's: the state's tokens" "$(field state "$got")" 258
check "--tokenizer FILE overrides the directory's: the answers" "$(answers "$got")" "$(answers "$base")"
got="$("$SQUAD" ask --model "$tmp/few" --tokenizer="$TOK" --request examples/login.json --threads 1)"
check "--tokenizer=FILE: the state's tokens" "$(field state "$got")" 258
got="$("$SQUAD" ask --model "$M" --tokenizer "$tmp/nonexistent.json" --request examples/login.json)"
check "--tokenizer missing file: exit status" "$?" 2
has "--tokenizer missing file: message" "$got" "nonexistent.json"
# --template: three questions per row make one row (one state computed, nothing restored)
echo '{"questions_per_row": 3}' > "$tmp/three.json"
got="$("$SQUAD" ask --model "$M" --template "$tmp/three.json" --request examples/login.json --threads 1)"
check "--template: exit status" "$?" 0
check "--template: one row, nothing reused" "$(field reused "$got")" 0
check "--template: one row, computed once" "$(field computed "$got")" 415
check "--template: three answers" "$(grep -o '"choice"' <<< "$got" | wc -l)" 3
got="$("$SQUAD" ask --model "$M" --template="$tmp/three.json" --request examples/login.json --threads 1)"
check "--template=FILE: one row" "$(field computed "$got")" 415
got="$("$SQUAD" ask --model "$M" --template "$tmp/nonexistent.json" --request examples/login.json)"
check "--template missing file: exit status" "$?" 2
has "--template missing file: message" "$got" "nonexistent.json"
# --cache-mb 0 / --min-prefix: nothing restored, the same answers
got="$("$SQUAD" ask --model "$M" --request examples/login.json --threads 1 --cache-mb 0)"
check "--cache-mb 0: nothing reused" "$(field reused "$got")" 0
check "--cache-mb 0: every row computes its state" "$(field computed "$got")" 921
check "--cache-mb 0: the same answers" "$(answers "$got")" "$(answers "$base")"
got="$("$SQUAD" ask --model "$M" --request examples/login.json --threads 1 --min-prefix=512)"
check "--min-prefix=512 (longer than the state): nothing reused" "$(field reused "$got")" 0
# --max-tokens: a row longer than it is refused, naming the option's limit (exit 1: the request)
got="$("$SQUAD" ask --model "$M" --request examples/login.json --max-tokens 64)"
check "--max-tokens 64: exit status" "$?" 1
has "--max-tokens 64: names the tighter limit" "$got" "the longest supported is 64 (the max_tokens option)"
# --precision exact: the same choices, other digits
got="$("$SQUAD" ask --model "$M" --request examples/login.json --threads 1 --precision exact)"
check "--precision exact: exit status" "$?" 0
check "--precision exact: the same choices" "$(grep -o '"choice": "[A-Z]"' <<< "$got")" "$(grep -o '"choice": "[A-Z]"' <<< "$base")"
if [ "$(answers "$got")" != "$(answers "$base")" ]; then ok; else bad "--precision exact: the digits equal bf16's"; fi
# bad values and unknown options: exit 2, the message as JSON on stdout
got="$("$SQUAD" ask --model "$M" --request examples/login.json --threads=x 2> "$tmp/err")"
check "--threads=x: exit status" "$?" 2
has "--threads=x: message" "$(cat "$tmp/err")" "--threads must be an integer"
has "--threads=x: JSON error" "$got" '{"error":'
got="$("$SQUAD" ask --model "$M" --bogus=1)"
check "--bogus=1: exit status" "$?" 2
has "--bogus=1: message" "$got" "unknown option '--bogus=1'"
got="$("$SQUAD" ask --model "$M" --request 2> /dev/null)"
check "--request without a value: exit status" "$?" 2
has "--request without a value: message" "$got" "--request needs a value"

echo "cli_ask: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
