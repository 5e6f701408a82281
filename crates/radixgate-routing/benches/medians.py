#!/usr/bin/env python3
"""Prints the decision benchmark's medians (criterion's estimates.json) as the
markdown table kept in BENCHMARKS.md. Run from the workspace root after
`cargo bench -p radixgate-routing --bench decision`."""
import glob
import json

rows = {}
for path in glob.glob("target/criterion/decision/*/*/new/estimates.json"):
    parts = path.split("/")
    policy, case = parts[-4], parts[-3]
    rows.setdefault(case, {})[policy] = json.load(open(path))["median"]["point_estimate"]


def order(case):
    workers, size = case.split("_")
    return int(workers[1:]), int(size[:-3])


print("| workers | prompt | cache_aware | round_robin | tree_only | cache_aware / round_robin |")
print("|---:|---:|---:|---:|---:|---:|")
for case in sorted(rows, key=order):
    r = rows[case]
    workers, size = case.split("_")
    cells = [f"{r[p] / 1000:.2f} µs" if p in r else "-" for p in ("cache_aware", "round_robin", "tree_only")]
    ratio = r["cache_aware"] / r["round_robin"] if "round_robin" in r and "cache_aware" in r else float("nan")
    print(f"| {workers[1:]} | {size} | {' | '.join(cells)} | {ratio:.1f}x |")
