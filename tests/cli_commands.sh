#!/usr/bin/env bash
# cli_commands.sh — what the squad commands share: a missing or wrong model directory reads the same
# in every command that takes --model (the model loader's message, checked before anything else is
# read from the directory); `squad synth`'s options in both spellings (--opt value, --opt=value),
# its bad values and unknown options exit 2 with a message; unknown commands exit 2.
# Run from the repository root: bash tests/cli_commands.sh path/to/squad
set -uo pipefail
SQUAD="${1:?usage: cli_commands.sh path/to/squad}"
. "$(dirname "$0")/shell_checks.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The message a command gives for --model DIR: `squad ask` answers errors as JSON on stdout, the
# others say "squad CMD: ..." on stderr; what follows is the same text.
model_message() { # command, directory
  local cmd="$1" dir="$2" out rc
  out="$(printf '{}' | "$SQUAD" "$cmd" --model "$dir" 2> "$tmp/err")"
  rc=$?
  check "$cmd --model $dir: exit status" "$rc" 2
  if [ "$cmd" = ask ]; then
    sed -n 's/^{"error":"\(.*\)"}$/\1/p' <<< "$out"
  else
    sed -n "s/^squad $cmd: //p" "$tmp/err"
  fi
}
touch "$tmp/a-file"
COMMANDS="ask score bench tokenize serve"
for dir in "$tmp/nonexistent" "$tmp/a-file"; do
  case "$dir" in
    *nonexistent) want="model directory $dir: No such file or directory" ;;
    *) want="model directory $dir: not a directory" ;;
  esac
  for cmd in $COMMANDS; do
    check "$cmd: the message for $dir" "$(model_message "$cmd" "$dir")" "$want"
  done
done

# serve: its own options take --opt=value too (the model directory's message proves --model= was read)
"$SQUAD" serve --model="$tmp/nonexistent" --port=0 --timeout=5 2> "$tmp/err"
check "serve --model=DIR --port=0 --timeout=5: exit status" "$?" 2
has "serve --model=DIR: the model directory's message" "$(cat "$tmp/err")" "model directory $tmp/nonexistent: No such file or directory"
"$SQUAD" serve --model "$tmp/nonexistent" --log-requests=yes 2> "$tmp/err"
check "serve --log-requests=yes: exit status" "$?" 2
has "serve --log-requests=yes: a flag takes no value" "$(cat "$tmp/err")" "takes no value"
"$SQUAD" serve --model "$tmp/nonexistent" --no-such-option=1 2> "$tmp/err"
check "serve --no-such-option=1: exit status" "$?" 2
has "serve --no-such-option=1: named" "$(cat "$tmp/err")" "unknown option '--no-such-option=1'"
"$SQUAD" serve --model "$tmp/nonexistent" --port=70000 2> "$tmp/err"
check "serve --port=70000: exit status" "$?" 2

# synth: --opt=value gives the same checkpoint as --opt value
"$SQUAD" synth --preset tiny --out "$tmp/a" --seed 7 2> /dev/null
check "synth --preset tiny --seed 7: exit status" "$?" 0
"$SQUAD" synth --preset=tiny --out="$tmp/b" --seed=7 2> /dev/null
check "synth --preset=tiny --seed=7: exit status" "$?" 0
if cmp -s "$tmp/a/model.safetensors" "$tmp/b/model.safetensors"; then ok; else bad "synth --opt=value: other weights"; fi
"$SQUAD" synth --preset=tiny --out="$tmp/c" --seed=8 2> /dev/null
if ! cmp -s "$tmp/a/model.safetensors" "$tmp/c/model.safetensors"; then ok; else bad "synth --seed=8: the same weights as seed 7"; fi
"$SQUAD" synth --preset=tiny --out="$tmp/d" --dtype=f32 --layout=conditional 2> /dev/null
check "synth --dtype=f32 --layout=conditional: exit status" "$?" 0
has "synth --dtype=f32: F32 tensors" "$(head -c 4000 "$tmp/d/model.safetensors" | tr -d "\\000")" '"dtype":"F32"'
has "synth --layout=conditional: the conditional architecture" "$(cat "$tmp/d/config.json")" "Qwen3_5ForConditionalGeneration"
synth_error() { # description, wanted message, arguments...
  local what="$1" want="$2" err
  shift 2
  err="$("$SQUAD" synth "$@" 2>&1 > /dev/null)"
  check "synth $what: exit status" "$?" 2
  has "synth $what: message" "$err" "$want"
}
synth_error "--seed=-1" "--seed wants a non-negative integer, got '-1'" --preset tiny --out "$tmp/e" --seed=-1
synth_error "--dtype=f8" "--dtype wants bf16, f16 or f32, got 'f8'" --preset tiny --out "$tmp/e" --dtype=f8
synth_error "--preset=nope" "nope" --preset=nope --out "$tmp/e"
synth_error "--bogus=1" "unknown option '--bogus=1'" --preset tiny --out "$tmp/e" --bogus=1
synth_error "--out without a value" "--out needs a value" --preset tiny --out

# unknown commands
err="$("$SQUAD" frobnicate 2>&1)"
check "unknown command: exit status" "$?" 2
has "unknown command: message" "$err" "unknown command 'frobnicate'"

echo "cli_commands: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
