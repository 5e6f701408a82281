#!/usr/bin/env python3
"""Per-second mean TTFT of cache_aware with hot matches on and off
(`--sweep hot_spot.hot_share=0,1`), for one cell of the TTFT study
(ttft.py's flags and per-worker rates): docs/defaults.md, "Hot matches".

Usage: hot_timeline.py WORKLOAD WORKERS SEED   Env: RADIXGATE (binary).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ttft  # noqa: E402

name, n, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3]
flags, per = ttft.SPEC[name]
rate = round(per * n, 3)
cmd = (f"{ttft.B} simulate --workers {n} {flags} --rate {rate} "
       f"--requests {12000 if n >= 32 else 6000} --policies cache_aware "
       f"--sweep hot_spot.hot_share=0,1 --seed {seed} --timeline-secs 1 --json")
print("$ " + cmd.replace(ttft.B, "radixgate", 1))
rep = json.loads(subprocess.run(cmd.split(), capture_output=True, text=True, check=True).stdout)
for row in rep["rows"]:
    cells = []
    for w in row["timeline"]["windows"]:
        done = sum(x["dispatched"] for x in w["workers"])
        ttft_sum = sum(x["dispatched"] * x["ttft_mean_ms"] for x in w["workers"] if x["dispatched"])
        cells.append(f"{ttft_sum / max(done, 1):.0f}")
    print(f"{row['params']:22s} mean {row['ttft_ms']['mean']:6.1f} ms, hit rate {row['hit_rate']:.3f}; "
          f"per second: {' '.join(cells)}")
