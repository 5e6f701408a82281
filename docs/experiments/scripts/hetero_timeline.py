#!/usr/bin/env python3
"""Prints, per policy, the slow worker's share of requests and its mean TTFT
against the others' in each window of a `radixgate simulate --timeline-secs`
JSON report (worker 0 is the slow one, as `--worker-speeds 0.5` makes it).

Usage: hetero_timeline.py REPORT.json [WINDOWS]
"""
import json
import sys

report = json.load(open(sys.argv[1]))
shown = int(sys.argv[2]) if len(sys.argv) > 2 else 10
for row in report["rows"]:
    tl = row.get("timeline")
    if not tl:
        continue
    name = row["policy"] + (f" {row['params']}" if row["params"] else "")
    print(f"\n{name}: mean TTFT {row['ttft_ms']['mean']:.1f} ms, p90 {row['ttft_ms']['p90']:.1f} ms")
    print("| window (s) | slow worker's share | its mean TTFT ms | the others' mean TTFT ms |")
    print("|---|---:|---:|---:|")
    for w in tl["windows"][:shown]:
        ws = w["workers"]
        total = sum(x["dispatched"] for x in ws) or 1
        others = [x for x in ws[1:] if x["dispatched"]]
        o_mean = (sum(x["ttft_mean_ms"] * x["dispatched"] for x in others)
                  / max(1, sum(x["dispatched"] for x in others)))
        slow = ws[0]
        slow_ttft = f"{slow['ttft_mean_ms']:.1f}" if slow["dispatched"] and slow["ttft_mean_ms"] is not None else "-"
        start = w["start_secs"]
        print(f"| {start:g}–{start + tl['window_secs']:g} | {slow['dispatched'] / total:.3f} | {slow_ttft} | {o_mean:.1f} |")
