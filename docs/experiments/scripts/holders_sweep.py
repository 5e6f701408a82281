#!/usr/bin/env python3
"""cache_aware's default against "a prefix with k holders is hot" on chosen
cells of the TTFT study (ttft.py's flags and per-worker rates), seed 1, with
prefill_aware's mean TTFT for reference (docs/defaults.md, "Hot by the
number of holders").

Needs a temporary build whose `predicted_ttft` rule reads RG_EXP_HOLDERS=k:
when at least k workers hold the deepest match (within the granularity),
the hit is honoured only while the holder's prediction is within
best * (1 + margin), with no slack_ms and no repeated-prefill term.

Usage: holders_sweep.py 2,3 zipf:32,long-doc:8,...   Env: RADIXGATE (binary),
SEED (default 1).
"""
import json, os, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ttft
B = os.environ.get("RADIXGATE", "target/release/radixgate")
ks = sys.argv[1].split(",")
SEED = os.environ.get("SEED", "1")
cells = [c.split(":") for c in sys.argv[2].split(",")]
for name, n in cells:
    n = int(n)
    flags, per = ttft.SPEC[name]
    speeds = ",".join(["0.5"] + ["1"] * (n - 1))
    wf = flags.replace("--worker-speeds 0.5", f"--worker-speeds {speeds}")
    rate = round(per * n, 3)
    req = 12000 if n >= 32 else 6000
    cmd = (f"{B} simulate --workers {n} {wf} --rate {rate} --requests {req} "
           f"--policies cache_aware,prefill_aware --seed {SEED} --json")
    out = {}
    for k in ["off"] + ks:
        env = dict(os.environ)
        if k != "off":
            env["RG_EXP_HOLDERS"] = k
        rep = json.loads(subprocess.run(cmd.split(), capture_output=True, text=True, check=True, env=env).stdout)
        rows = {r["policy"] + (r.get("params") or ""): (r["hit_rate"], r["ttft_ms"]["mean"]) for r in rep["rows"]}
        out[k] = rows
    d = out["off"]["cache_aware"]; pa = out["off"]["prefill_aware"]
    line = f"{name:14s} {n:2d} default {d[0]:.4f}/{d[1]:7.1f} prefill_aware {pa[1]:7.1f}"
    for k in ks:
        v = out[k]["cache_aware"]
        line += f" | k={k}: {v[0]/d[0]:.3f}/{v[1]/d[1]:.3f}"
    print(line, flush=True)
