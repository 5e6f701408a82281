#!/usr/bin/env python3
"""The TTFT study of docs/defaults.md ("The cost model"): every workload x
pool size x seed, the default policy against the seed rule, prefill_aware,
least_load and round_robin (plus both oracles on seed 1), one JSON report per
run, then the issue-12 targets per cell on the mean over seeds.

Usage: ttft.py OUTDIR            run and summarise
       ttft.py OUTDIR --summary  only summarise existing reports
Env: RADIXGATE (binary, default target/release/radixgate), TRACES (default
traces), SIZES ("4 8 32"), SEEDS ("1 2 3"), WORKLOADS (all below),
JOBS (parallel runs, default 2).
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

B = os.environ.get("RADIXGATE", "target/release/radixgate")
T = os.environ.get("TRACES", "traces")
# name: (workload flags, requests per second per worker or trace speedup per worker)
SPEC = {
    "shared-prefix": ("--workload shared-prefix --groups 128 --system-tokens 4096", 15),
    "zipf": ("--workload shared-prefix --groups 128 --system-tokens 4096 --zipf 1.1", 15),
    "multi-turn": ("--workload multi-turn", 20),
    "long-doc": ("--workload long-doc --documents 64", 10),
    "agentic": ("--workload agentic", 40),
    "mixed": ("--workload mixed", 20),
    "hot-prefix": ("--workload shared-prefix --groups 8 --zipf 2.0 --question-tokens 512", 40),
    "hetero": ("--workload shared-prefix --groups 8 --zipf 2.0 --question-tokens 512 --worker-speeds 0.5", 30),
    "mooncake-conversation": (f"--workload trace --trace {T}/mooncake_conversation.jsonl", 0.25),
    "mooncake-synthetic": (f"--workload trace --trace {T}/mooncake_synthetic.jsonl", 0.2),
}
POLICIES = "cache_aware,prefill_aware,least_load,round_robin"
SWEEP = "--sweep hot_spot.rule=relative_cap,predicted_ttft"


def arrivals(name: str, n: int) -> str:
    """A cell's arrival flags: the rate (or a trace's speedup) for `n`
    workers and the number of requests."""
    rate = round(SPEC[name][1] * n, 3)
    if name.startswith("mooncake"):
        return f"--speedup {rate} --requests 4000"
    return f"--rate {rate} --requests {12000 if n >= 32 else 6000}"


def command(name: str, n: int, seed: int) -> str:
    flags = SPEC[name][0]
    policies = POLICIES + (",oracle,oracle_ttft" if seed == 1 else "")
    return f"{B} simulate --workers {n} {flags} {arrivals(name, n)} --policies {policies} {SWEEP} --seed {seed}"


def run(out: str, name: str, n: int, seed: int) -> str:
    return run_to(f"{out}/{name}-{n}-s{seed}", command(name, n, seed))


def run_to(path: str, cmd: str) -> str:
    """Runs `cmd` with `--json` into PATH.json, the command (paths made
    relative) into PATH.cmd."""
    with open(path + ".cmd", "w") as f:
        f.write("$ " + cmd.replace(B, "radixgate", 1).replace(T, "traces") + "\n")
    done = subprocess.run(cmd.split() + ["--json"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"FAILED {path}: {done.stderr.strip()[-300:]}"
    with open(path + ".json", "w") as f:
        f.write(done.stdout)
    return f"done {path}"


def label(row: dict) -> str:
    if row["policy"] == "cache_aware":
        return "default" if "predicted_ttft" in row["params"] else "seed_rule"
    return row["policy"]


def summarise(out: str, workloads, sizes, seeds) -> int:
    print("| workload | workers | default mean TTFT ms | best other (which) | ratio | hit / seed rule's | p90 default / round_robin | seed rule | prefill_aware | least_load | round_robin | misses |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    misses = 0
    for name in workloads:
        for n in sizes:
            sums: dict = {}
            got = 0
            for seed in seeds:
                path = f"{out}/{name}-{n}-s{seed}.json"
                if not os.path.exists(path):
                    continue
                got += 1
                for row in json.load(open(path))["rows"]:
                    k = label(row)
                    if k.startswith("oracle"):
                        continue
                    s = sums.setdefault(k, {"mean": 0.0, "p90": 0.0, "hit": 0.0})
                    s["mean"] += row["ttft_ms"]["mean"]
                    s["p90"] += row["ttft_ms"]["p90"]
                    s["hit"] += row["hit_rate"]
            if got == 0 or "default" not in sums:
                continue
            avg = {k: {m: v / got for m, v in s.items()} for k, s in sums.items()}
            others = {k: v for k, v in avg.items() if k != "default"}
            best_k = min(others, key=lambda k: others[k]["mean"])
            d = avg["default"]
            ratio = d["mean"] / others[best_k]["mean"]
            hit = d["hit"] / avg["seed_rule"]["hit"]
            p90 = d["p90"] / avg["round_robin"]["p90"]
            miss = []
            if ratio > 1.02:
                miss.append("TTFT")
            if hit < 0.98:
                miss.append("hit rate")
            if name == "hot-prefix" and p90 > 1.0:
                miss.append("p90")
            misses += bool(miss)
            print(f"| {name} | {n} | {d['mean']:.1f} | {others[best_k]['mean']:.1f} ({best_k}) | {ratio:.3f} | {hit:.3f} | {p90:.2f} | "
                  + " | ".join(f"{avg[k]['mean']:.1f}" for k in ("seed_rule", "prefill_aware", "least_load", "round_robin"))
                  + f" | {', '.join(miss) or '-'} |")
    print(f"\n{misses} cells miss a target (means over seeds {' '.join(map(str, seeds))}).")
    return misses


def reference_table(out: str, workloads, sizes) -> None:
    """Seed 1: each policy's mean and p90 TTFT as a ratio to the TTFT
    reference (the better of the two oracles in that run)."""
    names = ["default", "seed_rule", "prefill_aware", "least_load", "round_robin"]
    print("| workload | workers | reference | ref. mean / p90 ms | " + " | ".join(names) + " |")
    print("|---|---:|---|---:|" + "---:|" * len(names))
    for name in workloads:
        for n in sizes:
            path = f"{out}/{name}-{n}-s1.json"
            if not os.path.exists(path):
                continue
            rows = json.load(open(path))["rows"]
            by = {label(r): r for r in rows}
            ref = min((r for r in rows if r["policy"].startswith("oracle")),
                      key=lambda r: r["ttft_ms"]["mean"], default=None)
            if ref is None:
                continue
            cells = []
            for k in names:
                r = by.get(k)
                if r is None:
                    cells.append("-")
                    continue
                cells.append(f"{r['ttft_ms']['mean'] / ref['ttft_ms']['mean']:.2f} / "
                             f"{r['ttft_ms']['p90'] / ref['ttft_ms']['p90']:.2f}")
            print(f"| {name} | {n} | {ref['policy']} | {ref['ttft_ms']['mean']:.1f} / {ref['ttft_ms']['p90']:.1f} | "
                  + " | ".join(cells) + " |")


def main() -> int:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    workloads = os.environ.get("WORKLOADS", " ".join(SPEC)).split()
    sizes = [int(x) for x in os.environ.get("SIZES", "4 8 32").split()]
    seeds = [int(x) for x in os.environ.get("SEEDS", "1 2 3").split()]
    if "--summary" not in sys.argv:
        jobs = [(name, n, seed) for name in workloads for n in sizes for seed in seeds]
        # Largest first, so the two cores stay busy to the end.
        jobs.sort(key=lambda j: (-j[1], j[0].startswith("mooncake")), reverse=False)
        with ThreadPoolExecutor(int(os.environ.get("JOBS", "2"))) as ex:
            for line in ex.map(lambda j: run(out, *j), jobs):
                print(line, file=sys.stderr, flush=True)
    summarise(out, workloads, sizes, seeds)
    print()
    reference_table(out, workloads, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
