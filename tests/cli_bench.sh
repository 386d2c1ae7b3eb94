#!/usr/bin/env bash
# cli_bench.sh — `squad bench` as a user drives it, on a tiny synthesized model: one JSON line per
# case; each option changes what it should (--lengths the cold rows, --state / --suffix the hit
# cases, the cache options what a hit restores, --reps / --threads / --precision / --device what
# the line reports, --specialists / --specialist the route, --max-tokens the longest row), in both
# spellings (--opt value, --opt=value); bad values, contradictions and unknown options exit 2 with
# a message. Figures (milliseconds) are not checked: they vary by machine.
# Run from the repository root: bash tests/cli_bench.sh path/to/squad
set -uo pipefail
SQUAD="${1:?usage: cli_bench.sh path/to/squad}"
. "$(dirname "$0")/shell_checks.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
M="$tmp/model"
"$SQUAD" synth --preset tiny --out "$M" --specialists "$tmp/sp" 2> /dev/null
check "synth" "$?" 0

# bench OPTIONS...: the lines of a quick run (one repetition, one thread unless OPTIONS say more)
bench() { "$SQUAD" bench --model "$M" --device cpu --reps 1 --threads 1 "$@" 2> "$tmp/err"; }
field() { sed -n "s/.*\"$1\": \"\{0,1\}\([^,\"]*\)\"\{0,1\}[,}].*/\1/p" <<< "$2"; } # one value per line

out="$(bench --lengths 64,96)"
check "--lengths 64,96: exit status" "$?" 0
check "--lengths 64,96: two cold lines" "$(field case "$out" | tr '\n' ' ')" "cold cold "
check "--lengths 64,96: their tokens" "$(field tokens "$out" | tr '\n' ' ')" "64 96 "
check "--lengths 64,96: all computed" "$(field computed "$out" | tr '\n' ' ')" "64 96 "
out="$(bench --lengths=80)"
check "--lengths=80" "$(field tokens "$out")" 80
# --reps, --threads, --precision, --device: what the line says ran
check "--reps 1" "$(field reps "$out")" 1
check "--reps=3" "$(field reps "$(bench --lengths 64 --reps=3)")" 3
check "--threads 1" "$(field threads "$out")" 1
check "--threads=2" "$(field threads "$(bench --lengths 64 --threads=2)")" 2
check "precision bf16 by default" "$(field precision "$out")" bf16
check "--precision=exact" "$(field precision "$(bench --lengths 64 --precision=exact)")" exact
check "--device cpu" "$(field device "$out")" cpu

# --state / --suffix: a state cached once, then questions of each length restore it
out="$(bench --lengths 64 --state 300 --suffix 8,16)"
check "--state 300 --suffix 8,16: exit status" "$?" 0
check "--state 300 --suffix 8,16: the cases" "$(field case "$out" | tr '\n' '|')" \
  "cold|hit state 300 + question 8|hit state 300 + question 16|"
check "--state 300: restored at 300 rounded down to --align 64" "$(field reused "$out" | tr '\n' ' ')" "0 256 256 "
check "--state 300 --suffix 8,16: computed" "$(field computed "$out" | tr '\n' ' ')" "64 52 60 "
out="$(bench --lengths=64 --state=300 --suffix=8 --align=32)"
check "--align=32: restored at 288" "$(field reused "$out" | tr '\n' ' ')" "0 288 "
out="$(bench --lengths 64 --state 300 --suffix 8 --min-prefix 512)"
check "--min-prefix 512: the state is not cached" "$(field reused "$out" | tr '\n' ' ')" "0 0 "
bench --lengths 64 --state 300 --suffix 8 --cache-mb 0 > /dev/null
check "--state with --cache-mb 0: exit status" "$?" 2
has "--state with --cache-mb 0: message" "$(cat "$tmp/err")" "--state times cache hits, which --cache-mb 0 turns off"

# --specialists / --specialist: the route each line ran
out="$(bench --lengths 64 --specialists "$tmp/sp" --specialist nav)"
check "--specialist nav: exit status" "$?" 0
check "--specialist nav: the route" "$(field route "$out")" nav
out="$(bench --lengths 64 --specialists="$tmp/sp" --specialist=e2e)"
check "--specialist=e2e: the route" "$(field route "$out")" e2e
bench --lengths 64 --specialist nav > /dev/null
check "--specialist without --specialists: exit status" "$?" 2
has "--specialist without --specialists: message" "$(cat "$tmp/err")" "--specialist needs --specialists DIR"

# --max-tokens: a longer cold row is refused, naming the option's limit
bench --lengths 128 --max-tokens 100 > /dev/null
check "--max-tokens 100 with a 128-token row: exit status" "$?" 1
has "--max-tokens 100: the message names the option's limit" "$(cat "$tmp/err")" "the longest supported is 100 (the max_tokens option)"

# bad values, unknown options, flags given values, missing values: exit 2 with a message
bench --lengths 64 --reps=0 > /dev/null
check "--reps=0: exit status" "$?" 2
has "--reps=0: message" "$(cat "$tmp/err")" "--reps must be an integer in 1..1000 (got '0')"
bench --lengths=64,x > /dev/null
check "--lengths=64,x: exit status" "$?" 2
has "--lengths=64,x: message" "$(cat "$tmp/err")" "--lengths must be an integer"
bench --lengths 64 --threads=many > /dev/null
check "--threads=many: exit status" "$?" 2
has "--threads=many: message" "$(cat "$tmp/err")" "--threads must be an integer"
bench --lengths 64 --bogus=1 > /dev/null
check "--bogus=1: exit status" "$?" 2
has "--bogus=1: message" "$(cat "$tmp/err")" "unknown option '--bogus=1'"
bench --lengths 64 --wrong-guess=1 > /dev/null
check "--wrong-guess=1: exit status" "$?" 2
has "--wrong-guess=1: message" "$(cat "$tmp/err")" "--wrong-guess takes no value"
bench --lengths > /dev/null
check "--lengths without a value: exit status" "$?" 2
has "--lengths without a value: message" "$(cat "$tmp/err")" "--lengths needs a value"
"$SQUAD" bench --lengths 64 > /dev/null 2> "$tmp/err"
check "no --model: exit status" "$?" 2
has "no --model: message" "$(cat "$tmp/err")" "--model DIR is required"
"$SQUAD" bench --help > "$tmp/out"
check "--help: exit status" "$?" 0
has "--help lists the engine options" "$(cat "$tmp/out")" "--cache-mb"

echo "cli_bench: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
