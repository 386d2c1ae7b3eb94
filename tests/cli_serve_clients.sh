#!/usr/bin/env bash
# cli_serve_clients.sh — third-party clients (npm: openai, @typesafe-ai/sdk, pinned in
# tests/clients/package.json and installed by tools/fetch_test_clients.sh) against the real
# `squad serve`: runs tests/server_clients.js with the squad binary CTest names.
# Run from the repository root: bash tests/cli_serve_clients.sh path/to/squad
set -uo pipefail
SQUAD="${1:?usage: cli_serve_clients.sh path/to/squad}"
if ! command -v node >/dev/null 2>&1; then
  echo "cli_serve_clients: node is needed (make deps installs it)" >&2
  exit 1
fi
bash tools/fetch_test_clients.sh || exit 1
exec node tests/server_clients.js "$SQUAD"
