#!/usr/bin/env python3
"""ncu_summary.py — sums an ncu --csv log (--metrics gpu__time_duration.sum) per kernel.

    python3 tools/ncu_summary.py NCU.log TITLE

Prints a markdown table: kernel, launches, total microseconds, share (kernels run serialized
under ncu, outside any graph, so the total is kernel time without launch gaps).
"""
import csv
import re
import sys

rows = [line for line in open(sys.argv[1]) if line.startswith('"')]
r = list(csv.reader(rows))
if not r:
    print(f"\n## {sys.argv[2]}: no kernels in {sys.argv[1]}")
    sys.exit(0)
h = r[0]
ki, ui, vi = h.index("Kernel Name"), h.index("Metric Unit"), h.index("Metric Value")
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}
tot, cnt = {}, {}
for x in r[1:]:
    name = re.sub(r"\((?:[^()]|\([^()]*\))*\)\s*$", "", x[ki]).strip()  # drop the argument list
    us = float(x[vi].replace(",", "")) * scale.get(x[ui], 1.0)
    tot[name] = tot.get(name, 0.0) + us
    cnt[name] = cnt.get(name, 0) + 1
all_us = sum(tot.values())
print(f"\n## {sys.argv[2]}: {sum(cnt.values())} kernels, {all_us / 1e3:.3f} ms of kernel time (serialized, no graph)")
print("| kernel | launches | total us | share |")
print("| --- | ---: | ---: | ---: |")
for k in sorted(tot, key=tot.get, reverse=True):
    print(f"| {k[:100]} | {cnt[k]} | {tot[k]:.1f} | {100 * tot[k] / all_us:.1f}% |")
