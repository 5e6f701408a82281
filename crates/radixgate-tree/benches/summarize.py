#!/usr/bin/env python3
"""Print the medians of the last `cargo bench -p radixgate-tree --bench tree`
run as Markdown tables, with ratios to the baselines measured in the same run.

Usage (from the workspace root): python3 crates/radixgate-tree/benches/summarize.py
"""
import json
import pathlib

ROOT = pathlib.Path("target/criterion")
SIZES = ["100", "1024", "4096", "16384"]


def median_ns(*parts):
    path = ROOT.joinpath(*parts, "new", "estimates.json")
    if not path.exists():
        return None
    return json.loads(path.read_text())["median"]["point_estimate"]


def fmt(ns):
    if ns is None:
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.0f} ns"


def ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.1f}x"


def match_insert_table(prefix, clock):
    """Criterion groups; the CPU-time figures are the `cpu p=` lines the
    benchmark prints itself."""
    print(f"Medians, {clock}:")
    print()
    print("| group | prompt | tree | memcmp | tree/memcmp | naive | naive/tree |")
    print("|---|---|---|---|---|---|---|")
    for group, variants, naive in [
        (prefix + "match", ["tree", "tree_for_tenant"], "naive_scan"),
        (prefix + "match_16M", ["tree"], "naive_scan"),
        (prefix + "insert", ["tree_existing", "tree_new_suffix"], "naive_push"),
    ]:
        for size in SIZES:
            floor = median_ns(group, "memcmp", size)
            base = median_ns(group, naive, size)
            for v in variants:
                t = median_ns(group, v, size)
                if t is None:
                    continue
                print(f"| {group}/{v} | {size} B | {fmt(t)} | {fmt(floor)} | {ratio(t, floor)} "
                      f"| {naive} {fmt(base)} | {ratio(base, t)} |")
    print()


match_insert_table("", "wall time")

print("| evict (wall time) | median |")
print("|---|---|")
for name in ["10pct_of_4M", "10pct_of_16M", "1pct_of_16M", "stats_walk_16M"]:
    print(f"| {name} | {fmt(median_ns('evict', name))} |")
print()
print("| threads (4 KiB match, wall time) | median per match per thread |")
print("|---|---|")
for kind in ["rwlock_tree", "behind_one_mutex"]:
    for n in ["1", "2"]:
        print(f"| {kind} x{n} | {fmt(median_ns('threads', kind, n))} |")
