#!/usr/bin/env python3
"""Re-runs only the default policy of the TTFT study (ttft.py) and writes
each report with the other policies' rows taken from an earlier study.

For a change that moves the default's decisions and no other policy's
(the seed rule, prefill_aware, least_load, round_robin and the oracles
decide as before): one run per cell instead of five to seven. Each new
report is the earlier one with the default's row replaced, its oracle
ratios recomputed against the earlier oracle rows. ttft.py --summary then
reads the new directory as it would a full study.

Check the premise on one cell first: the earlier build's default-only run
must reproduce the earlier default row (the simulator is deterministic for
a seed).

Usage: ttft_default.py EARLIER_DIR OUTDIR
Env: RADIXGATE, TRACES, SIZES, SEEDS, WORKLOADS, JOBS as for ttft.py.
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ttft  # noqa: E402


def default_command(name: str, n: int, seed: int) -> str:
    flags = ttft.SPEC[name][0]
    return (
        f"{ttft.B} simulate --workers {n} {flags} {ttft.arrivals(name, n)} --policies cache_aware "
        f"--sweep hot_spot.rule=predicted_ttft --seed {seed}"
    )


def run(earlier: str, out: str, name: str, n: int, seed: int) -> str:
    base = f"{name}-{n}-s{seed}"
    with open(f"{earlier}/{base}.json") as f:
        report = json.load(f)
    cmd = default_command(name, n, seed)
    done = subprocess.run(cmd.split() + ["--json"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"FAILED {base}: {done.stderr.strip()[-300:]}"
    new = json.loads(done.stdout)["rows"][0]
    rows = report["rows"]
    oracle = next((r for r in rows if r["policy"] == "oracle"), None)
    reference = next((r for r in rows if r["policy"] == "oracle_ttft"), None)
    if oracle and oracle["hit_rate"] > 0:
        new["oracle_fraction"] = new["hit_rate"] / oracle["hit_rate"]
    if reference:
        new["ttft_mean_ratio"] = new["ttft_ms"]["mean"] / reference["ttft_ms"]["mean"]
        new["ttft_p90_ratio"] = new["ttft_ms"]["p90"] / reference["ttft_ms"]["p90"]
    k = next(i for i, r in enumerate(rows) if ttft.label(r) == "default")
    rows[k] = new
    with open(f"{out}/{base}.json", "w") as f:
        json.dump(report, f, indent=2)
    with open(f"{earlier}/{base}.cmd") as f:
        earlier_cmd = f.read()
    with open(f"{out}/{base}.cmd", "w") as f:
        f.write(earlier_cmd)
        f.write("# default row re-run by ttft_default.py:\n")
        f.write("$ " + cmd.replace(ttft.B, "radixgate", 1).replace(ttft.T, "traces") + "\n")
    return f"done {base}"


def main() -> None:
    earlier, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    workloads = os.environ.get("WORKLOADS", " ".join(ttft.SPEC)).split()
    sizes = [int(s) for s in os.environ.get("SIZES", "4 8 32").split()]
    seeds = [int(s) for s in os.environ.get("SEEDS", "1 2 3").split()]
    jobs = int(os.environ.get("JOBS", "2"))
    cells = [(w, n, s) for w in workloads for n in sizes for s in seeds]
    with ThreadPoolExecutor(jobs) as pool:
        for line in pool.map(lambda c: run(earlier, out, *c), cells):
            print(line, flush=True)


if __name__ == "__main__":
    main()
