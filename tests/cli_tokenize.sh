#!/usr/bin/env bash
# cli_tokenize.sh — `squad tokenize` / `squad detokenize` as a user drives them: the whole tokenizer
# corpus through --jsonl must give the reference ids line for line; plain mode; bad lines get
# {"error": ...} on their own line while the rest go on (exit 1); usage errors exit 2; ids decode
# back to the text; options in both spellings (--opt value, --opt=value); flags given a value and
# unknown options exit 2 with a message. Run from the repository root: bash tests/cli_tokenize.sh path/to/squad
set -uo pipefail
SQUAD="${1:?usage: cli_tokenize.sh path/to/squad}"
TOK=third_party/qwen3/tokenizer.json
FIX=tests/fixtures/tokenizer
. "$(dirname "$0")/shell_checks.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$TOK" ]; then
  bad "$TOK is missing (run tools/fetch_test_data.sh)"
  echo "cli_tokenize: $pass passed, $fail failed"
  exit 1
fi

# the corpus, token for token
"$SQUAD" tokenize --tokenizer "$TOK" --jsonl < "$FIX/corpus.jsonl" > "$tmp/out.jsonl"
check "corpus exit status" "$?" 0
tr -d ' ' < "$tmp/out.jsonl" > "$tmp/got.txt"
sed -E 's/^\{"ids":(\[[^]]*\]),.*$/\1/' "$FIX/expected.jsonl" > "$tmp/want.txt"
check "corpus line count" "$(wc -l < "$tmp/got.txt")" "$(wc -l < "$FIX/corpus.jsonl")"
if cmp -s "$tmp/got.txt" "$tmp/want.txt"; then ok; else bad "corpus ids differ: $(diff "$tmp/got.txt" "$tmp/want.txt" | head -5)"; fi

# plain mode: stdin exactly as given
check "plain" "$(printf 'Hello world' | "$SQUAD" tokenize --tokenizer "$TOK")" "[9707, 1879]"
check "plain with newline" "$(printf 'Hello world\n' | "$SQUAD" tokenize --tokenizer "$TOK")" "[9707, 1879, 198]"
check "plain empty" "$(printf '' | "$SQUAD" tokenize --tokenizer "$TOK")" "[]"
check "--model DIR" "$(printf 'Hello' | "$SQUAD" tokenize --model third_party/qwen3)" "[9707]"
check "special token" "$(printf '<|im_start|>' | "$SQUAD" tokenize --tokenizer "$TOK")" "[151644]"
out="$(printf '<|im_start|>' | "$SQUAD" tokenize --tokenizer "$TOK" --plain-special)"
case "$out" in *151644*) bad "--plain-special still gives the special id: $out" ;; "["*) ok ;; *) bad "--plain-special: $out" ;; esac
out="$(printf 'abc\xff' | "$SQUAD" tokenize --tokenizer "$TOK")"
check "invalid UTF-8 exit status" "$?" 1
case "$out" in *'"error"'*"byte offset 3"*) ok ;; *) bad "invalid UTF-8: $out" ;; esac

# bad lines: an error on that line, the others still answered, exit 1
printf '"one"\n42\n\n{"a": 1}\n"two"\nnot json\n"\\u00e9t\\u00e9"\n' > "$tmp/mixed.jsonl"
"$SQUAD" tokenize --tokenizer "$TOK" --jsonl < "$tmp/mixed.jsonl" > "$tmp/mixed.out"
check "bad lines exit status" "$?" 1
check "bad lines count" "$(wc -l < "$tmp/mixed.out")" 7
check "line 1" "$(sed -n 1p "$tmp/mixed.out")" "[603]"
case "$(sed -n 2p "$tmp/mixed.out")" in '{"error":"line 2:'*) ok ;; *) bad "line 2: $(sed -n 2p "$tmp/mixed.out")" ;; esac
case "$(sed -n 3p "$tmp/mixed.out")" in '{"error":"line 3:'*empty*) ok ;; *) bad "line 3: $(sed -n 3p "$tmp/mixed.out")" ;; esac
case "$(sed -n 4p "$tmp/mixed.out")" in '{"error":"line 4:'*string*) ok ;; *) bad "line 4: $(sed -n 4p "$tmp/mixed.out")" ;; esac
check "line 5" "$(sed -n 5p "$tmp/mixed.out")" "[19789]"
case "$(sed -n 6p "$tmp/mixed.out")" in '{"error":"line 6: not valid JSON'*) ok ;; *) bad "line 6: $(sed -n 6p "$tmp/mixed.out")" ;; esac
check "line 7" "$(sed -n 7p "$tmp/mixed.out")" "$(printf 'été' | "$SQUAD" tokenize --tokenizer "$TOK")"
# CRLF line endings are accepted
check "CRLF" "$(printf '"one"\r\n' | "$SQUAD" tokenize --tokenizer "$TOK" --jsonl)" "[603]"

# detokenize: ids back to text, bad lines reported
check "detokenize" "$(printf '[9707, 1879]\n' | "$SQUAD" detokenize --tokenizer "$TOK")" '"Hello world"'
check "detokenize special" "$(printf '[151644, 872]\n' | "$SQUAD" detokenize --tokenizer "$TOK")" '"<|im_start|>user"'
check "detokenize --skip-special" "$(printf '[151644, 872]\n' | "$SQUAD" detokenize --tokenizer "$TOK" --skip-special)" '"user"'
printf '[9707]\n[-1]\n[99999999]\n"text"\n[]\n' | "$SQUAD" detokenize --tokenizer "$TOK" > "$tmp/detok.out"
check "detokenize bad lines exit status" "$?" 1
check "detokenize line 1" "$(sed -n 1p "$tmp/detok.out")" '"Hello"'
case "$(sed -n 2p "$tmp/detok.out")" in '{"error":"line 2:'*) ok ;; *) bad "detok line 2: $(sed -n 2p "$tmp/detok.out")" ;; esac
case "$(sed -n 3p "$tmp/detok.out")" in *99999999*) ok ;; *) bad "detok line 3: $(sed -n 3p "$tmp/detok.out")" ;; esac
case "$(sed -n 4p "$tmp/detok.out")" in '{"error":"line 4:'*) ok ;; *) bad "detok line 4: $(sed -n 4p "$tmp/detok.out")" ;; esac
check "detokenize line 5" "$(sed -n 5p "$tmp/detok.out")" '""'
# round trip of the first 200 corpus lines: the decoded JSON strings equal the NFC text
head -200 "$FIX/corpus.jsonl" | "$SQUAD" tokenize --tokenizer "$TOK" --jsonl | "$SQUAD" detokenize --tokenizer "$TOK" > "$tmp/round.txt"
check "round trip exit status" "$?" 0
check "round trip count" "$(wc -l < "$tmp/round.txt")" 200
lower_u() { sed -E 's/\\u([0-9A-Fa-f]{4})/\\u\L\1/g' "$1"; } # \u000B and \u000b are the same escape
head -200 "$FIX/expected.jsonl" | sed -E 's/^\{"ids":\[[^]]*\],"nfc":(.*)\}$/\1/' > "$tmp/nfc.txt"
if [ "$(lower_u "$tmp/round.txt")" = "$(lower_u "$tmp/nfc.txt")" ]; then ok; else bad "round trip differs from NFC text: $(diff <(lower_u "$tmp/round.txt") <(lower_u "$tmp/nfc.txt") | head -4)"; fi

# usage
"$SQUAD" tokenize --help > /dev/null; check "tokenize --help" "$?" 0
"$SQUAD" detokenize --help > /dev/null; check "detokenize --help" "$?" 0
"$SQUAD" tokenize --jsonl < /dev/null 2> /dev/null; check "no tokenizer" "$?" 2
"$SQUAD" tokenize --tokenizer /nonexistent.json < /dev/null 2> /dev/null; check "missing tokenizer" "$?" 2
"$SQUAD" tokenize --tokenizer "$TOK" --bogus < /dev/null 2> /dev/null; check "unknown option" "$?" 2
echo '{"model": {"type": "Unigram"}}' > "$tmp/bad.json"
err="$("$SQUAD" tokenize --tokenizer "$tmp/bad.json" < /dev/null 2>&1)"
check "unsupported tokenizer exit status" "$?" 2
case "$err" in *Unigram*"not supported"*) ok ;; *) bad "unsupported tokenizer message: $err" ;; esac

# --opt=value spellings; flags take no value; unknown options and missing values are named
check "--tokenizer=FILE" "$(printf 'Hello world' | "$SQUAD" tokenize --tokenizer="$TOK")" "[9707, 1879]"
check "--model=DIR" "$(printf 'Hello' | "$SQUAD" tokenize --model=third_party/qwen3)" "[9707]"
check "detokenize --tokenizer=FILE" "$(printf '[9707, 1879]\n' | "$SQUAD" detokenize --tokenizer="$TOK")" '"Hello world"'
err="$(printf 'x' | "$SQUAD" tokenize --tokenizer "$TOK" --jsonl=1 2>&1)"
check "--jsonl=1 exit status" "$?" 2
case "$err" in *"--jsonl takes no value"*) ok ;; *) bad "--jsonl=1 message: $err" ;; esac
err="$(printf 'x' | "$SQUAD" tokenize --tokenizer "$TOK" --bogus=1 2>&1)"
check "--bogus=1 exit status" "$?" 2
case "$err" in *"unknown option '--bogus=1'"*) ok ;; *) bad "--bogus=1 message: $err" ;; esac
err="$("$SQUAD" tokenize --tokenizer < /dev/null 2>&1)"
check "--tokenizer without a value exit status" "$?" 2
case "$err" in *"--tokenizer needs a value"*) ok ;; *) bad "--tokenizer without a value message: $err" ;; esac
err="$("$SQUAD" tokenize --model "$tmp/nonexistent" < /dev/null 2>&1)"
check "--model missing directory exit status" "$?" 2
check "--model missing directory message" "$err" "squad tokenize: model directory $tmp/nonexistent: No such file or directory"

echo "cli_tokenize: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
