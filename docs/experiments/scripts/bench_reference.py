#!/usr/bin/env python3
"""How far below the cache-aware routers can any router get on the bench's
own quality workloads? Runs `radixgate simulate` with each workload's
`bench/run.py` arguments on 4 workers of the default engine model, with the
TTFT oracle (`oracle_ttft`: forecasts every engine's queue step by step and
weighs what its choice adds to the requests already queued), the greedy
hit-rate oracle, round_robin, the seed rule and the default, seeds 1-3,
and prints mean TTFT per policy and as a ratio to the seed rule (which
the live bench puts within a few percent of smg).

Usage: bench_reference.py OUTDIR
Env: RADIXGATE (binary, default target/release/radixgate), TRACES (the
Mooncake traces folder, default ../shared/traces), SEEDS (default "1 2 3").
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../bench"))
from replicas_sim import simulate_args  # noqa: E402
from run import quality_workloads  # noqa: E402

B = os.environ.get("RADIXGATE", "target/release/radixgate")
TRACES = os.environ.get("TRACES", "../shared/traces")
SEEDS = [int(s) for s in os.environ.get("SEEDS", "1 2 3").split()]

# bench/run.py's own workloads, as `simulate` takes them.
WORKLOADS = {
    name: " ".join(simulate_args(name, wl))
    for name, wl in quality_workloads(f"{TRACES}/mooncake_conversation.jsonl", 1.0).items()
}
POLICIES = "cache_aware,round_robin,oracle,oracle_ttft"
SWEEP = "hot_spot.rule=relative_cap,predicted_ttft"
COLUMNS = [
    ("default", "cache_aware", "hot_spot.rule=predicted_ttft"),
    ("seed rule", "cache_aware", "hot_spot.rule=relative_cap"),
    ("round_robin", "round_robin", ""),
    ("oracle (hits)", "oracle", ""),
    ("oracle_ttft", "oracle_ttft", ""),
]


def run(out: str, name: str, seed: int) -> dict:
    path = f"{out}/{name}-s{seed}.json"
    cmd = (
        f"{B} simulate --workers 4 {WORKLOADS[name]} --policies {POLICIES} "
        f"--sweep {SWEEP} --seed {seed} --json"
    )
    if not os.path.exists(path):
        with open(path, "w") as f:
            subprocess.run(cmd.split(), stdout=f, check=True)
        with open(f"{out}/{name}-s{seed}.cmd", "w") as f:
            f.write(f"$ radixgate{cmd[len(B):]}\n")
    with open(path) as f:
        return json.load(f)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    heads = " | ".join(f"{c[0]} ms (/ seed rule)" for c in COLUMNS)
    print(f"| workload | {heads} | hit rate default / oracle_ttft |")
    print("|---|" + "---:|" * (len(COLUMNS) + 1))
    for name in WORKLOADS:
        means: dict[str, list[float]] = {c[0]: [] for c in COLUMNS}
        hits: dict[str, list[float]] = {c[0]: [] for c in COLUMNS}
        for seed in SEEDS:
            for row in run(out, name, seed)["rows"]:
                for label, policy, params in COLUMNS:
                    if row["policy"] == policy and row["params"] == params:
                        means[label].append(row["ttft_ms"]["mean"])
                        hits[label].append(row["hit_rate"])
        avg = {k: sum(v) / len(v) for k, v in means.items()}
        hit = {k: sum(v) / len(v) for k, v in hits.items()}
        seed_rule = avg["seed rule"]
        cells = " | ".join(f"{avg[c[0]]:.1f} ({avg[c[0]] / seed_rule:.2f})" for c in COLUMNS)
        print(f"| {name} | {cells} | {hit['default']:.3f} / {hit['oracle_ttft']:.3f} |")


if __name__ == "__main__":
    main()
