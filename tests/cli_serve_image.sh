#!/usr/bin/env bash
# cli_serve_image.sh — images through `squad serve`: runs tests/server_image.js (Node.js) with the
# squad binary CTest names; its header lists what it checks.
# Run from the repository root: bash tests/cli_serve_image.sh path/to/squad
set -uo pipefail
SQUAD="${1:?usage: cli_serve_image.sh path/to/squad}"
if ! command -v node >/dev/null 2>&1; then
  echo "cli_serve_image: node is needed (make deps installs it)" >&2
  exit 1
fi
exec node tests/server_image.js "$SQUAD"
