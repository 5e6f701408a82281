#!/usr/bin/env python3
"""Mean TTFT per window of simulated time for one cell of the TTFT study
(ttft.py's flags and per-worker rates): how much of a run's mean is its
cold start (docs/defaults.md, "Hot matches").

Usage: cold_start.py WORKLOAD WORKERS SEED [SIMULATE ARGS...]
The extra arguments choose the policies; by default cache_aware with hot
matches off and on (`--policies cache_aware --sweep
hot_spot.hot_share=0,1`). Env: RADIXGATE (binary), WINDOW (seconds, 1).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ttft  # noqa: E402

name, n, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3]
chosen = " ".join(sys.argv[4:]) or "--policies cache_aware --sweep hot_spot.hot_share=0,1"
window = os.environ.get("WINDOW", "1")
flags = ttft.SPEC[name][0]
cmd = (f"{ttft.B} simulate --workers {n} {flags} {ttft.arrivals(name, n)} {chosen} "
       f"--seed {seed} --timeline-secs {window} --json")
print("$ " + cmd.replace(ttft.B, "radixgate", 1))
rep = json.loads(subprocess.run(cmd.split(), capture_output=True, text=True, check=True).stdout)
for row in rep["rows"]:
    cells = []
    for w in row["timeline"]["windows"]:
        done = sum(x["dispatched"] for x in w["workers"])
        ttft_sum = sum(x["dispatched"] * x["ttft_mean_ms"] for x in w["workers"] if x["dispatched"])
        cells.append(f"{ttft_sum / max(done, 1):.0f}")
    label = f"{row['policy']} {row['params']}".strip()
    print(f"{label:40s} mean {row['ttft_ms']['mean']:6.1f} ms, hit rate {row['hit_rate']:.3f}; "
          f"per window: {' '.join(cells)}")
