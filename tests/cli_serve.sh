#!/usr/bin/env bash
# cli_serve.sh — `squad serve` end to end: runs tests/server_e2e.js (Node.js) against the squad binary
# CTest names. The Node script starts and stops the real server on free loopback ports with a tiny
# synthesized model carrying the real Qwen3 tokenizer; its header lists what it checks.
# Run from the repository root: bash tests/cli_serve.sh path/to/squad
set -uo pipefail
SQUAD="${1:?usage: cli_serve.sh path/to/squad}"
if ! command -v node >/dev/null 2>&1; then
  echo "cli_serve: node is needed (make deps installs it)" >&2
  exit 1
fi
if [ ! -f third_party/qwen3/tokenizer.json ]; then
  echo "cli_serve: third_party/qwen3/tokenizer.json is missing (run tools/fetch_test_data.sh)" >&2
  exit 1
fi
exec node tests/server_e2e.js "$SQUAD"
