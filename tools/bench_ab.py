#!/usr/bin/env python3
"""bench_ab.py — the whole-row cases of several bench_gpu runs side by side, for an A/B of two builds.

    python3 tools/bench_ab.py A=OUT/a1/bench.log B=OUT/b1/bench.log A=OUT/a2/bench.log B=OUT/b2/bench.log
    python3 tools/bench_ab.py A=a1/bench.log B=b1/bench_ab.log:2   (the 2nd run inside bench_ab.log)

Why: a kept kernel change needs a same-call A/B, and between calls the same code moves by 1-2 %
(docs/cuda.md, "Measuring"). The way that has held: two builds in one call (tools/gpu_run.sh with
GPU_CARRY=.carry-main and .carry-exp), their bench steps alternated A B A B, each a p50 of 30. This
prints each run's p50 per case, each label's median of its runs, and B / A; a change is real where
it exceeds the spread of the same label's runs, which the table shows beside it.

Each argument is LABEL=FILE[:N]: FILE a bench_gpu log (bench.log, or bench_ab.log, which holds one
run per BENCH_ENVS item: N picks the Nth, 1-based; default 1). The first label is the baseline.
"""
import re
import statistics
import sys

ROW = re.compile(r"^\| ((?:cold|hit) [0-9+]+) \| ([0-9.]+) \| ([0-9.]+) \| [0-9]+ \|")


def runs_of(path):
    """The whole-row tables of a log, in order: a list of {case: p50 ms}."""
    runs, cur = [], None
    try:
        lines = open(path, errors="replace").readlines()
    except OSError as e:
        sys.exit(f"{path}: {e.strerror}")
    for line in lines:
        m = ROW.match(line)
        if m:
            if cur is None:
                cur = {}
                runs.append(cur)
            cur[m.group(1)] = float(m.group(2))
        elif cur is not None and not line.startswith("|"):
            cur = None  # the table ended (the exact path's table has no tokens/s column: not matched)
    return runs


def main(argv):
    if len(argv) < 2 or any("=" not in a for a in argv):
        sys.exit(__doc__)
    cols = []  # (label, {case: ms})
    for arg in argv:
        label, spec = arg.split("=", 1)
        path, n = spec.rsplit(":", 1) if re.search(r":[0-9]+$", spec) else (spec, "1")
        runs = runs_of(path)
        if int(n) < 1 or int(n) > len(runs):
            sys.exit(f"{path}: {len(runs)} whole-row table(s), asked for run {n}")
        cols.append((label, runs[int(n) - 1]))
    labels = list(dict.fromkeys(label for label, _ in cols))
    cases = [c for c in cols[0][1] if all(c in run for _, run in cols)]
    head = [f"{label} #{sum(1 for l, _ in cols[:i + 1] if l == label)}" for i, (label, _) in enumerate(cols)]
    print("| case | " + " | ".join(head) + " | " + " | ".join(f"{l} median (spread)" for l in labels) +
          "".join(f" | {l} / {labels[0]}" for l in labels[1:]) + " |")
    print("| --- |" + " ---: |" * (len(cols) + len(labels) + len(labels) - 1))
    for c in cases:
        per = {l: [run[c] for lab, run in cols if lab == l] for l in labels}
        med = {l: statistics.median(v) for l, v in per.items()}
        cells = [f"{run[c]:.3f}" for _, run in cols]
        cells += [f"{med[l]:.3f} ({max(per[l]) - min(per[l]):.3f})" for l in labels]
        cells += [f"{med[l] / med[labels[0]]:.3f}" for l in labels[1:]]
        print(f"| {c} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
