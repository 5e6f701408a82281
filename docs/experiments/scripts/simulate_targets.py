#!/usr/bin/env python3
"""Checks issue 6's targets for cache_aware in `radixgate simulate --json`
files: hit rate >= 0.95 of the oracle's, request spread <= 1.25, mean TTFT
below round_robin's. Prints one markdown row per file.

Usage: simulate_targets.py FILE.json...
"""
import json
import sys


def row(rep, name):
    return next((r for r in rep["rows"] if r["policy"] == name and not r["params"]), None)


def main(paths):
    print("| workload | workers | cache_aware hit % | oracle hit % | fraction | spread"
          " | work spread | TTFT mean ms: cache_aware / round_robin / oracle | targets missed |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for path in paths:
        with open(path) as f:
            rep = json.load(f)
        label = path.rsplit("/", 1)[-1].rsplit(".", 1)[0].rsplit("-", 1)[0]
        ca, rr, orc = row(rep, "cache_aware"), row(rep, "round_robin"), row(rep, "oracle")
        frac = ca["hit_rate"] / orc["hit_rate"] if orc["hit_rate"] > 0 else float("nan")
        t = lambda r: r["ttft_ms"]["mean"]
        missed = []
        if frac < 0.95:
            missed.append(f"hit {frac:.3f}")
        if ca["spread"] > 1.25:
            missed.append(f"spread {ca['spread']:.2f}")
        if t(ca) >= t(rr):
            missed.append("TTFT")
        print(f"| {label} | {rep['workers']} | {ca['hit_rate'] * 100:.1f} | {orc['hit_rate'] * 100:.1f}"
              f" | {frac:.3f} | {ca['spread']:.2f} | {ca['work_spread']:.2f}"
              f" | {t(ca):.0f} / {t(rr):.0f} / {t(orc):.0f} | {', '.join(missed) or '-'} |")


if __name__ == "__main__":
    main(sys.argv[1:])
