#!/usr/bin/env bash
# cli_ask_image.sh — `squad ask` with images (docs/images.md) on a tiny model with a vision tower
# (`squad synth --preset tiny-vl`, the real Qwen3 tokenizer): an image file and the same image as a
# data: URL give the same answers, an image changes the answers of the same text, two images in one
# request, the images counted in the state's tokens; and every refusal exits 1 with the message
# naming the image: a corrupt and a truncated PNG, a missing file, a remote URL, bad base64,
# --max-image-pixels below the image, a model without a vision tower.
# Run from the repository root: bash tests/cli_ask_image.sh path/to/squad
set -uo pipefail
SQUAD="${1:?usage: cli_ask_image.sh path/to/squad}"
TOK=third_party/qwen3/tokenizer.json
IMG=tests/fixtures/images
. "$(dirname "$0")/shell_checks.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ ! -f "$TOK" ]; then
  bad "$TOK is missing (run tools/fetch_test_data.sh)"
  echo "cli_ask_image: $pass passed, $fail failed"
  exit 1
fi
VL="$tmp/vl"
TEXT="$tmp/text"
"$SQUAD" synth --preset tiny-vl --out "$VL" --tokenizer "$TOK" 2> /dev/null
check "synth tiny-vl" "$?" 0
"$SQUAD" synth --preset tiny --out "$TEXT" --tokenizer "$TOK" 2> /dev/null
check "synth tiny" "$?" 0

# the answers without the timing
answers() { sed -E 's/, "ms": [0-9.]+\}$/}/' <<< "$1"; }
request() { # state, images (a JSON array), question
  printf '{"state": "%s", "images": %s, "questions": [{"text": "%s", "options": ["Sign in", "Register", "Help"]}]}' \
    "$1" "$2" "$3"
}
ask() { "$SQUAD" ask --model "$VL" --threads 1 "$@"; }

png="$IMG/small_64x48.png"
out="$(request "Page: Login" "[\"$png\"]" "Which button submits?" | ask)"
check "an image file: exit 0" "$?" 0
has "an image file: answers" "$out" '{"answers": [{"probs": ['
state_of() { local n; n="$(sed -nE 's/.*"tokens": \{"state": ([0-9]+).*/\1/p' <<< "$1")"; echo "${n:--1000}"; }
state_img="$(state_of "$out")"
out_text="$(request "Page: Login" "[]" "Which button submits?" | ask)"
check "no image: exit 0" "$?" 0
state_text="$(state_of "$out_text")"
# 64x48 -> the processor's 64x64 (tiny-vl: 1024..16384 pixels) -> a 4x4 grid -> 4 tokens, + start / end
check "the image's tokens in the state" "$((state_img - state_text))" 6
differ "an image changes the answers" "$(answers "$out")" "$(answers "$out_text")"
url="data:image/png;base64,$(base64 -w0 "$png")"
out_url="$(request "Page: Login" "[\"$url\"]" "Which button submits?" | ask)"
check "a data: URL: exit 0" "$?" 0
check "a data: URL answers as the file" "$(answers "$out_url")" "$(answers "$out")"
other="$IMG/alpha_200x150.png"
out_other="$(request "Page: Login" "[\"$other\"]" "Which button submits?" | ask)"
check "another image: exit 0" "$?" 0
differ "another image, other answers" "$(answers "$out_other")" "$(answers "$out")"
out_two="$(request "Page: Login" "[\"$png\", \"$other\"]" "Which button submits?" | ask)"
check "two images: exit 0" "$?" 0
has "two images: answers" "$out_two" '"choice"'
# --max-image-pixels, in both spellings: at the image's size it passes, below it refuses
out_lim="$(request "Page: Login" "[\"$png\"]" "Which button submits?" | ask --max-image-pixels=3072)"
check "--max-image-pixels at the size" "$(answers "$out_lim")" "$(answers "$out")"

refused() { # what, request, want, extra args...
  local what="$1" req="$2" want="$3" got rc
  shift 3
  got="$(printf '%s' "$req" | "$SQUAD" ask --threads 1 "$@")"
  rc=$?
  check "$what: exit 1" "$rc" 1
  has "$what: the error" "$got" '{"error":'
  has "$what: the message" "$got" "$want"
}
head -c 300 "$png" > "$tmp/truncated.png"
{ head -c 100 "$png"; head -c 2000 /dev/zero; } > "$tmp/corrupt.png"
refused "a truncated PNG" "$(request s "[\"$tmp/truncated.png\"]" q)" 'request.images[0]: PNG' --model "$VL"
refused "a corrupt PNG" "$(request s "[\"$png\", \"$tmp/corrupt.png\"]" q)" 'request.images[1]: PNG' --model "$VL"
refused "a missing file" "$(request s "[\"$tmp/none.png\"]" q)" "request.images[0]: cannot open $tmp/none.png" --model "$VL"
refused "a remote URL" "$(request s '["https://example.com/shot.png"]' q)" 'remote URLs are not fetched' --model "$VL"
refused "bad base64" "$(request s '["data:image/png;base64,iVBOR*w0KGgo="]' q)" 'request.images[0]: ' --model "$VL"
refused "not an image" "$(request s "[\"$TOK\"]" q)" 'request.images[0]: ' --model "$VL"
refused "--max-image-pixels" "$(request s "[\"$png\"]" q)" 'over the limit of 3071' --model "$VL" --max-image-pixels 3071
refused "a model without a tower" "$(request s "[\"$png\"]" q)" 'request.images[0]: ' --model "$TEXT"
refused "images not an array" "$(request s '"a.png"' q)" 'request.images must be an array' --model "$VL"
# a usage error is still exit 2
got="$(request s "[\"$png\"]" q | "$SQUAD" ask --model "$VL" --max-image-pixels 0 2> /dev/null)"
check "--max-image-pixels 0: exit 2" "$?" 2

echo "cli_ask_image: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
