#!/usr/bin/env bash
# Installs the third-party HTTP clients that the server tests drive against `squad serve`: the npm
# packages pinned in tests/clients/package.json (openai, @typesafe-ai/sdk), with the exact tarballs
# and integrity hashes of tests/clients/package-lock.json, into tests/clients/node_modules/ (git-
# ignored). Nothing is fetched when the pinned versions are already installed. `make deps` runs it
# beside tools/fetch_test_data.sh; the client test also calls it when the packages are missing.
# SQUAD_OFFLINE=1 skips the download with a warning (the client test then fails).
set -euo pipefail
cd "$(dirname "$0")/../tests/clients"

installed_version() {
  node -e 'try { console.log(require(process.argv[1]).version) } catch (e) { console.log("") }' \
    "./node_modules/$1/package.json" 2>/dev/null || true
}
wanted_version() {
  node -e 'console.log(require("./package.json").dependencies[process.argv[1]])' "$1"
}
up_to_date() {
  command -v node >/dev/null 2>&1 || return 1
  for pkg in openai @typesafe-ai/sdk; do
    [ "$(installed_version "$pkg")" = "$(wanted_version "$pkg")" ] || return 1
  done
}

if up_to_date; then
  exit 0
fi
if [ "${SQUAD_OFFLINE:-0}" = 1 ]; then
  echo "fetch_test_clients: SQUAD_OFFLINE=1, not installing tests/clients; the client test will fail" >&2
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_test_clients: npm is needed (apt-get install nodejs npm)" >&2
  exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A private npm cache: works without a writable HOME (CI) and leaves the user's cache alone. The
# packages declare newer Node engines than some machines have; they run on Node 20, so engine
# mismatches are not fatal (npm only warns by default; engine-strict stays off).
export npm_config_cache="$tmp/npm-cache" npm_config_update_notifier=false npm_config_fund=false \
  npm_config_audit=false npm_config_engine_strict=false npm_config_loglevel=error
echo "fetch_test_clients: npm ci in tests/clients ($(node -e 'const d=require("./package.json").dependencies; console.log(Object.entries(d).map(([k,v])=>k+"@"+v).join(" "))'))"
npm ci --ignore-scripts
up_to_date || { echo "fetch_test_clients: the installed versions do not match package.json" >&2; exit 1; }
