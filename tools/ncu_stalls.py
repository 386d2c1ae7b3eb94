#!/usr/bin/env python3
"""ncu_stalls.py — where one kernel's warps wait, phase by phase, from ncu's SASS source page.

    python3 tools/ncu_stalls.py SASS.csv [TITLE]

SASS.csv is `ncu --import REP --page source --csv --print-source sass` of a report profiled with
`--section SourceCounters` (tools/gpu_run.sh's kprofile step makes them). The kernel's instructions
are cut into segments at each block barrier, warp sync and exit, in program order, which for the
GDN and attention kernels are their phases (loads, gates, products, the inverse's levels...). Each
segment prints its share of the warp-stall samples, its most frequent opcodes (to recognise the
phase) and its largest stall reasons. Samples are per warp: a phase where most warps wait at a
barrier while a few compute shows as `barrier`; `long_sb` is a wait on global memory, `mio` the
shared-memory pipe, `imc` the constant cache (kernel parameters). Segments under 1 % are left out.
"""
import collections
import csv
import sys

ENDS = ("BAR", "EXIT", "WARPSYNC", "SYNCS")  # opcodes that end a segment


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):  # a predicate guard
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def main():
    rows = list(csv.reader(open(sys.argv[1], errors="replace")))
    title = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    hi = next((i for i, r in enumerate(rows) if "Source" in r and "Warp Stall Sampling (All Samples)" in r), None)
    if hi is None:  # no source page: the kernel did not run in this case (ncu profiled nothing)
        print(f"\n## {title}: no source counters (the kernel was not launched in this case)")
        return
    hdr, data = rows[hi], rows[hi + 1:]
    col = {h: i for i, h in enumerate(hdr)}
    si, ci = col["Warp Stall Sampling (All Samples)"], col["Source"]
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    segs, cur = [], None
    for i, r in enumerate(data):
        if len(r) <= max(si, ci):
            continue
        if cur is None:
            cur = {"first": i, "samples": 0.0, "ops": collections.Counter(), "why": collections.Counter()}
        op = opcode(r[ci].strip())
        cur["samples"] += float(r[si] or 0)
        cur["ops"][op] += 1
        for h in reasons:
            cur["why"][h[len("stall_"):]] += float(r[col[h]] or 0)
        if op in ENDS:
            cur["last"], cur["end"] = i, r[ci].strip()
            segs.append(cur)
            cur = None
    if cur is not None:
        cur["last"], cur["end"] = len(data) - 1, ""
        segs.append(cur)
    total = sum(s["samples"] for s in segs) or 1.0
    print(f"\n## {title}: {total:.0f} warp-stall samples")
    print("| SASS lines | share | ends at | opcodes | stalls |")
    print("| --- | ---: | --- | --- | --- |")
    for s in segs:
        if s["samples"] < 0.01 * total:
            continue
        ops = " ".join(f"{k}:{v}" for k, v in s["ops"].most_common(6))
        why = " ".join(f"{k} {100 * v / max(s['samples'], 1):.0f}%" for k, v in s["why"].most_common(3))
        print(f"| {s['first']}-{s['last']} | {100 * s['samples'] / total:.1f}% | {s['end'][:32]} | {ops} | {why} |")


if __name__ == "__main__":
    main()
