#!/usr/bin/env python3
"""Table of docs/kv-events.md from the reports `exact.sh OUTDIR` writes:
per workload and pool size, hit rate and mean TTFT of the approximate tree,
approximate + correction, exact events and the oracle; how much of the
approximate tree's gap to the oracle each closes; exact against the
oracle's hit rate; and each one's change against the approximate tree.

Usage: exact_table.py OUTDIR
"""
import glob
import json
import os
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    out = sys.argv[1]
    rows = []
    for d in sorted(glob.glob(os.path.join(out, "approx-*"))):
        w = os.path.basename(d)[len("approx-"):]
        for path in sorted(glob.glob(os.path.join(d, "*.json"))):
            n = path.rsplit("-", 1)[-1][:-len(".json")]
            exact_path = os.path.join(out, f"exact-{w}", os.path.basename(path))
            if not os.path.exists(exact_path):
                continue
            cells = {}
            for row in load(path)["rows"]:
                key = {
                    # The tree alone: no trims, no bound by the caches.
                    "correction.enabled=false correction.capacity_bound=false": "approx",
                    # The default correction: both.
                    "correction.enabled=true correction.capacity_bound=true": "corr",
                    # Reports of builds before the bound (2026-12-04).
                    "correction.enabled=false": "approx",
                    "correction.enabled=true": "corr",
                }.get(row["params"], row["policy"])
                if key in ("approx", "corr", "oracle"):
                    cells[key] = row
            cells["exact"] = next(r for r in load(exact_path)["rows"] if r["policy"] == "cache_aware")
            rows.append((w, int(n), cells))
    rows.sort(key=lambda x: (x[0], x[1]))
    print("| workload | workers | hit % approx / +corr / exact / oracle | exact ÷ oracle hit | hit gap closed corr / exact "
          "| mean TTFT ms approx / +corr / exact / oracle | TTFT gap closed corr / exact | TTFT change corr / exact |")
    print("|---|---:|---|---:|---|---|---|---|")
    for w, n, c in rows:
        a, k, e, o = c["approx"], c["corr"], c["exact"], c["oracle"]
        ha, hk, he, ho = (x["hit_rate"] * 100 for x in (a, k, e, o))
        ta, tk, te, to = (x["ttft_ms"]["mean"] for x in (a, k, e, o))

        def closed(v, base, ref, noise):
            gap = ref - base
            return f"{(v - base) / gap:.0%}" if abs(gap) > noise and gap > 0 else "(no gap)"

        hit_closed = " / ".join(closed(v, ha, ho, 0.1) for v in (hk, he))
        ttft_closed = " / ".join(closed(-v, -ta, -to, 0.01 * ta) for v in (tk, te))
        change = " / ".join(f"{(v - ta) / ta:+.1%}" for v in (tk, te))
        ratio = he / ho if ho > 0 else float("nan")
        print(f"| {w} | {n} | {ha:.1f} / {hk:.1f} / {he:.1f} / {ho:.1f} | {ratio:.3f} | {hit_closed} | "
              f"{ta:.0f} / {tk:.0f} / {te:.0f} / {to:.0f} | {ttft_closed} | {change} |")


if __name__ == "__main__":
    main()
