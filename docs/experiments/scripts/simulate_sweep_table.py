#!/usr/bin/env python3
"""One markdown table from several sweep directories written by
defaults.sh/tune.sh: a row per (setting value), a column per workload and
pool size, each cell `mean TTFT ms / hit %`.

Usage: simulate_sweep_table.py SIZE DIR...
"""
import glob
import json
import sys

WORKLOADS = ["shared-prefix", "zipf", "multi-turn", "long-doc", "agentic", "mixed"]


def main(size, dirs):
    cells = {}
    for d in dirs:
        for wl in WORKLOADS:
            for path in glob.glob(f"{d}/{wl}-{size}.json"):
                rep = json.load(open(path))
                for r in rep["rows"]:
                    key = r["params"] or "(defaults)"
                    cells.setdefault(key, {})[wl] = (
                        f"{r['ttft_ms']['mean']:.0f} / {r['hit_rate'] * 100:.1f}"
                        f" ({r['spread']:.2f})")
    print(f"| cache_aware setting ({size} workers) | " + " | ".join(WORKLOADS) + " |")
    print("|---|" + "---:|" * len(WORKLOADS))
    for key, row in cells.items():
        print(f"| {key} | " + " | ".join(row.get(w, "") for w in WORKLOADS) + " |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
