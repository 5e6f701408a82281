#!/usr/bin/env python3
"""cache_aware's default against `hot_spot.reuse_ms` and `hot_spot.slack_ms`
at 0 (alone and together), on the synthetic workloads of the TTFT study
(ttft.py's flags and per-worker rates) at 4, 8 and 32 workers, seed 1.
Prints, per cell, the default's hit rate and mean TTFT and each other
setting's ratios to them (docs/defaults.md, "No slack and no
repeated-prefill term").

Usage: slack_sweep.py    Env: RADIXGATE (binary, default target/release/radixgate).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ttft  # noqa: E402

B = os.environ.get("RADIXGATE", "target/release/radixgate")
DEFAULT = "hot_spot.reuse_ms=50 hot_spot.slack_ms=10"

for name in ["shared-prefix", "zipf", "multi-turn", "long-doc", "agentic", "mixed",
             "hot-prefix", "hetero"]:
    flags, per = ttft.SPEC[name]
    for n in (4, 8, 32):
        speeds = ",".join(["0.5"] + ["1"] * (n - 1))
        wf = flags.replace("--worker-speeds 0.5", f"--worker-speeds {speeds}")
        rate = round(per * n, 3)
        req = 12000 if n >= 32 else 6000
        cmd = (f"{B} simulate --workers {n} {wf} --rate {rate} --requests {req} "
               "--policies cache_aware --seed 1 --sweep hot_spot.reuse_ms=0,50 "
               "--sweep hot_spot.slack_ms=0,10 --json")
        rep = json.loads(subprocess.run(cmd.split(), capture_output=True, text=True,
                                        check=True).stdout)
        rows = {r["params"]: (r["hit_rate"], r["ttft_ms"]["mean"]) for r in rep["rows"]}
        d = rows[DEFAULT]
        line = f"{name:14s} {n:2d} default {d[0]:.4f}/{d[1]:7.1f}"
        for k, v in rows.items():
            if k != DEFAULT:
                line += f" | {k.replace('hot_spot.', '')}: {v[0] / d[0]:.3f}/{v[1] / d[1]:.3f}"
        print(line, flush=True)
