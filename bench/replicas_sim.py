#!/usr/bin/env python3
"""The replicas comparison in `radixgate simulate` (docs/replicas.md).

For each routing-quality workload of bench/run.py, one `radixgate simulate
--json` run of cache_aware over 4 workers with `--sweep replicas=...` and
`--sweep sync_delay_ms=...,off`, and a markdown table of hit rate and mean
TTFT with their ratios to the single router of the same run. Simulated
time: the figures do not depend on the machine. Prints the table; with
--out, also writes the raw reports as JSON.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import ROOT, quality_workloads  # noqa: E402


def simulate_args(wname: str, wl) -> list[str]:
    """The workload's `radixgate load` arguments as `simulate` takes them (a
    slow worker becomes `--worker-speeds`)."""
    args = list(wl.load)
    if wl.per_worker:
        speeds = ["1"] * 4
        for i, extra in wl.per_worker.items():
            speeds[i] = extra[extra.index("--speed") + 1]
        args += ["--worker-speeds", ",".join(speeds)]
    return args


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/radixgate"))
    p.add_argument("--replicas", default="1,2,4,8")
    p.add_argument("--delays", default="1,10,100", help="sync delays, ms")
    p.add_argument("--spread", default="round-robin")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only-workload", action="append", default=[])
    p.add_argument("--trace", default=os.path.join(ROOT, "traces/mooncake_conversation.jsonl"))
    p.add_argument("--spread-bursts", action="store_true",
                   help="mooncake-trace: requests sharing a timestamp arrive evenly over the "
                        "time to the next one (the trace's times are rounded to ~3 s)")
    p.add_argument("--out", help="write the raw reports here (JSON)")
    opts = p.parse_args()
    rel_trace = os.path.relpath(opts.trace, ROOT)
    rows, raw, commands = [], {}, []
    for wname, wl in quality_workloads(opts.trace, 1.0, opts.spread_bursts).items():
        if opts.only_workload and wname not in opts.only_workload:
            continue
        args = ["simulate", "--json", "--workers", "4", "--policies", "cache_aware",
                "--seed", str(opts.seed), "--replica-spread", opts.spread,
                "--sweep", f"replicas={opts.replicas}",
                "--sweep", f"sync_delay_ms={opts.delays},off", *simulate_args(wname, wl)]
        commands.append("radixgate " + " ".join(rel_trace if a == opts.trace else a for a in args))
        out = subprocess.run([opts.bin, *args], capture_output=True, text=True, check=True)
        rep = json.loads(out.stdout)
        raw[wname] = rep
        one = next(r for r in rep["rows"] if r["params"] == "replicas=1")
        for r in rep["rows"]:
            t, t1 = r["ttft_ms"]["mean"], one["ttft_ms"]["mean"]
            rows.append((wname, r["params"].replace("replicas=", "").replace(" sync_delay_ms=", " × "),
                         r["hit_rate"], r["hit_rate"] / one["hit_rate"] if one["hit_rate"] else None,
                         t, t / t1 if t1 else None, r["failed"]))
        print(f"{wname}: {len(rep['rows'])} rows, {sum(r['wall_secs'] for r in rep['rows']):.1f} s",
              file=sys.stderr, flush=True)
    print("| workload | replicas × sync delay (ms) | hit rate | ×1 router | TTFT mean ms | ×1 router | failed |")
    print("|---|---|---|---|---|---|---|")
    fmt = lambda x, f: "–" if x is None else f.format(x)  # noqa: E731
    for w, s, h, hr, t, tr, failed in rows:
        print(f"| {w} | {s} | {h:.3f} | {fmt(hr, '{:.3f}')} | {t:.1f} | {fmt(tr, '{:.3f}')} | {failed} |")
    print()
    for c in commands:
        print(f"    {c}")
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
