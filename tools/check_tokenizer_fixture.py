#!/usr/bin/env python3
"""check_tokenizer_fixture.py — checks tests/fixtures/tokenizer/expected.jsonl against the Python
package of Hugging Face `tokenizers` (a second reference beside the npm build that
tools/make_tokenizer_fixture.js uses; the H200 machine has the package, version 0.23 there).

    python3 tools/check_tokenizer_fixture.py [third_party/qwen3/tokenizer.json]

Prints how many corpus strings give exactly the recorded ids (encode(text, add_special_tokens=False))
and decode back to the recorded NFC text; exits 1 on any difference. Run from the repository root.
"""
import json
import sys

from tokenizers import Tokenizer, __version__


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "third_party/qwen3/tokenizer.json"
    tok = Tokenizer.from_file(path)
    with open("tests/fixtures/tokenizer/corpus.jsonl", encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    with open("tests/fixtures/tokenizer/expected.jsonl", encoding="utf-8") as f:
        expected = [json.loads(line) for line in f]
    bad = 0
    for i, (text, exp) in enumerate(zip(corpus, expected)):
        ids = tok.encode(text, add_special_tokens=False).ids
        if ids != exp["ids"] or tok.decode(ids, skip_special_tokens=False) != exp["nfc"]:
            bad += 1
            print(f"line {i + 1}: {text[:60]!r}: {ids[:20]} vs {exp['ids'][:20]}")
    n = len(corpus)
    print(f"tokenizers {__version__}: {n - bad}/{n} corpus strings match expected.jsonl")
    return 1 if bad or len(expected) != n else 0


if __name__ == "__main__":
    sys.exit(main())
