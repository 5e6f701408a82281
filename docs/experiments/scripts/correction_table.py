#!/usr/bin/env python3
"""Table of docs/correction.md: approximate tree vs approximate + correction
vs oracle, per workload and pool size, from the JSON reports that
`defaults.sh` writes with `POLICIES=cache_aware,oracle` and
`--sweep correction.enabled=false,true`.

Usage: correction_table.py REPORT.json...
"""
import json
import sys


def main():
    rows = []
    for path in sys.argv[1:]:
        with open(path) as f:
            r = json.load(f)
        name = path.rsplit("/", 1)[-1].rsplit("-", 1)[0]
        cells = {}
        for row in r["rows"]:
            key = {"correction.enabled=false": "approx", "correction.enabled=true": "corr"}.get(
                row["params"], row["policy"])
            cells[key] = row
        rows.append((name, r["workers"], cells))
    rows.sort(key=lambda x: (x[0], x[1]))
    print("| workload | workers | hit % approx / +corr / oracle | hit gap closed | mean TTFT ms approx / +corr / oracle | TTFT gap closed | TTFT change | trims |")
    print("|---|---:|---|---:|---|---:|---:|---:|")
    for name, n, c in rows:
        a, k, o = c["approx"], c["corr"], c["oracle"]
        ha, hk, ho = (x["hit_rate"] * 100 for x in (a, k, o))
        gap = ho - ha
        # A gap under 0.1 point is noise, not a gap.
        closed = f"{(hk - ha) / gap:.0%}" if gap > 0.1 else "(no gap)"
        ta, tk, to = (x["ttft_ms"]["mean"] for x in (a, k, o))
        tgap = ta - to
        tclosed = f"{(ta - tk) / tgap:.0%}" if tgap > 0.01 * ta else "(no gap)"
        print(f"| {name} | {n} | {ha:.1f} / {hk:.1f} / {ho:.1f} | {closed} | "
              f"{ta:.0f} / {tk:.0f} / {to:.0f} | {tclosed} | {(tk - ta) / ta:+.1%} | {k.get('trims', 0)} |")


if __name__ == "__main__":
    main()
