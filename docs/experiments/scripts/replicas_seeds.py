#!/usr/bin/env python3
"""Replicas against one router in `radixgate simulate`, over several seeds.

For each routing-quality workload of bench/run.py (as bench/replicas_sim.py
runs them: cache_aware over 4 workers, requests spread round-robin) and
each build given, one run per seed with `--sweep replicas=1,N --sweep
sync_delay_ms=D1,D2,..`; prints, per build and delay, the mean TTFT of the
N replicas over the seeds divided by the single router's (a ratio of
means), and the same for the hit rate. Single seeds swing (a replica run
is a different trajectory of the same chaotic system), hence the means.

    docs/experiments/scripts/replicas_seeds.py --bin BUILD_A --bin BUILD_B
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from replicas_sim import simulate_args  # noqa: E402
from run import quality_workloads  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", action="append", required=True)
    p.add_argument("--seeds", default="1,2,3,4,5,6")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--delays", default="10,25", help="sync delays, ms")
    p.add_argument("--only-workload", action="append", default=[])
    opts = p.parse_args()
    seeds = [int(s) for s in opts.seeds.split(",")]
    trace = os.path.join(ROOT, "traces/mooncake_conversation.jsonl")
    workloads = quality_workloads(trace, 1.0, True)
    print(f"| workload | build | one router's mean TTFT ms | "
          + " | ".join(f"{opts.replicas} × {d} ms: TTFT / hit ×1 router" for d in opts.delays.split(","))
          + " |")
    print("|---|---|---:|" + "---|" * len(opts.delays.split(",")))
    for wname, wl in workloads.items():
        if opts.only_workload and wname not in opts.only_workload:
            continue
        for binary in opts.bin:
            rows: dict[str, list[tuple[float, float]]] = {}
            for seed in seeds:
                args = ["simulate", "--json", "--workers", "4", "--policies", "cache_aware",
                        "--seed", str(seed), "--replica-spread", "round-robin",
                        "--sweep", f"replicas=1,{opts.replicas}",
                        "--sweep", f"sync_delay_ms={opts.delays}", *simulate_args(wname, wl)]
                out = subprocess.run([binary, *args], capture_output=True, text=True, check=True)
                for r in json.loads(out.stdout)["rows"]:
                    rows.setdefault(r["params"], []).append((r["ttft_ms"]["mean"], r["hit_rate"]))
            one = rows.pop("replicas=1")
            t1 = sum(t for t, _ in one) / len(one)
            h1 = sum(h for _, h in one) / len(one)
            cells = []
            for v in rows.values():
                t = sum(t for t, _ in v) / len(v)
                h = sum(h for _, h in v) / len(v)
                cells.append(f"{t / t1:.3f} / {h / h1:.3f}")
            print(f"| {wname} | {os.path.basename(binary)} | {t1:.2f} | " + " | ".join(cells) + " |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
