#!/usr/bin/env bash
# cli_vision_score.sh SQUAD — `squad score` rows with images (docs/images.md): "images" as file
# paths or data: URLs, ids holding one <|image_pad|> per image (squad expands it to the image's
# run and moves slots and state_len), the letters' probabilities equal to transformers' on the
# fixture row (tests/fixtures/vision/fixture.json), the image counters of --stats, and a clear
# error line for a bad image, a model without a tower, or a pad count that does not match.
set -u
SQUAD=${1:?usage: cli_vision_score.sh path/to/squad}
FIXTURE=tests/fixtures/vision/fixture.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { # description, command status (0 = ok)
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1" >&2; fi
}

"$SQUAD" synth --preset tiny-vl --out "$tmp/vl" --tokenizer third_party/qwen3/tokenizer.json > /dev/null 2>&1
check "synth tiny-vl" $?

# The fixture's first row in the compact form: its run of 4 pads down to one (slots after it - 3).
python3 - "$FIXTURE" "$tmp" <<'PY'
import base64, json, sys
fx = json.load(open(sys.argv[1]))
row = fx["rows"][0]
ids, pad = row["ids"], 151655
first = ids.index(pad)
n = sum(1 for x in ids if x == pad)
compact = ids[:first + 1] + ids[first + n:]
slots = [s if s < first else s - (n - 1) for s in row["slots"]]
out = {"ids": compact, "slots": slots, "nopts": row["nopts"], "letters": row["letters"],
       "images": ["tests/fixtures/images/" + row["images"][0]]}
data = base64.b64encode(open("tests/fixtures/images/" + row["images"][0], "rb").read()).decode()
url = dict(out, images=["data:image/png;base64," + data])
bad = dict(out, images=["tests/fixtures/images/README.md"])
two_pads = dict(out, ids=compact[:first] + [pad] + compact[first:])
with open(sys.argv[2] + "/rows.jsonl", "w") as f:
    for r in (out, url, bad, two_pads):
        f.write(json.dumps(r) + "\n")
json.dump(row["probs"], open(sys.argv[2] + "/expected.json", "w"))
PY
check "rows written" $?

"$SQUAD" score --model "$tmp/vl" --rows "$tmp/rows.jsonl" --device cpu --precision exact --stats > "$tmp/out" 2> "$tmp/err"
rc=$?
check "a bad row among good ones: exit 1 (got $rc)" $([ $rc -eq 1 ]; echo $?)
check "four lines" $([ "$(wc -l < "$tmp/out")" -eq 4 ]; echo $?)
python3 - "$tmp/out" "$tmp/expected.json" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
want = json.load(open(sys.argv[2]))
for i in (0, 1):
    got = lines[i]["probs"]
    worst = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w))
    assert worst <= 1e-4, (i, worst)
assert lines[1]["computed"] == 0, "the data: URL row is the same request: the memo answers it"
assert "images[0]" in lines[2]["error"], lines[2]
assert "one per image" in lines[3]["error"], lines[3]
PY
check "paths and data: URLs give transformers' probabilities; bad rows name their error" $?
stat() { sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p" "$tmp/err"; }
check "--stats: image_rows 2 (got $(stat image_rows))" $([ "$(stat image_rows)" = 2 ]; echo $?)
check "--stats: image_tokens 8 (got $(stat image_tokens))" $([ "$(stat image_tokens)" = 8 ]; echo $?)
check "--stats: one tower run (got $(stat encoder_misses))" $([ "$(stat encoder_misses)" = 1 ]; echo $?)

# A model without a vision tower refuses images with a clear message.
"$SQUAD" score --model tests/fixtures/models/tiny-causal --rows "$tmp/rows.jsonl" --device cpu > "$tmp/out" 2> "$tmp/err"
rc=$?
check "no tower: exit 1 (got $rc)" $([ $rc -eq 1 ]; echo $?)
check "no tower: the message says so" $(head -1 "$tmp/out" | grep -q "no vision tower"; echo $?)

echo "cli_vision_score: $pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
