#!/usr/bin/env python3
"""precision_diff.py — how far the bf16 path is from the exact path and from the references.

For each model under tests/fixtures/models, runs `squad score` on its rows.jsonl twice (--precision
exact and --precision bf16, the cache off) and prints, per fixture, the largest and the mean absolute
difference of a letter probability: exact against the transformers references (expected.jsonl), bf16
against them, and bf16 against exact; also how many slots' argmax differ between bf16 and exact.

usage: tools/precision_diff.py SQUAD_BINARY [--device cpu|cuda] [--fixtures tests/fixtures/models]
"""
import argparse
import json
import os
import subprocess
import sys


def score(squad, model, rows, device, precision):
    out = subprocess.run([squad, "score", "--model", model, "--rows", rows, "--device", device,
                          "--precision", precision, "--cache-mb", "0"],
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(line)["probs"] for line in out.splitlines() if line.strip()]


def diffs(a, b):
    """Absolute differences of every letter probability, and the slots whose argmax differ."""
    d, flips = [], 0
    for ra, rb in zip(a, b):
        for sa, sb in zip(ra, rb):
            d.extend(abs(x - y) for x, y in zip(sa, sb))
            if len(sa) > 1 and max(range(len(sa)), key=sa.__getitem__) != max(range(len(sb)), key=sb.__getitem__):
                flips += 1
    return d, flips


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("squad")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fixtures", default="tests/fixtures/models")
    a = ap.parse_args()
    print(f"device {a.device}; absolute differences of letter probabilities: max / mean; argmax flips")
    for name in sorted(os.listdir(a.fixtures)):
        d = os.path.join(a.fixtures, name)
        rows, ref_path = os.path.join(d, "rows.jsonl"), os.path.join(d, "expected.jsonl")
        if not (os.path.exists(rows) and os.path.exists(ref_path)):
            continue
        with open(ref_path) as f:
            ref = [json.loads(line)["probs"] for line in f if line.strip()]
        ex = score(a.squad, d, rows, a.device, "exact")
        bf = score(a.squad, d, rows, a.device, "bf16")
        if not (len(ref) == len(ex) == len(bf)):
            sys.exit(f"{name}: row counts differ ({len(ref)} references, {len(ex)} exact, {len(bf)} bf16)")
        cells = []
        for what, x, y in (("exact-ref", ex, ref), ("bf16-ref", bf, ref), ("bf16-exact", bf, ex)):
            dd, flips = diffs(x, y)
            cells.append(f"{what} {max(dd):.2e} / {sum(dd) / len(dd):.2e}, flips {flips}")
        print(f"{name:16s} {len(ref):3d} rows: " + "; ".join(cells))


if __name__ == "__main__":
    main()
