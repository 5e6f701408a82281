#!/usr/bin/env python3
"""The default policy against `hot_spot.overflow_margin` on the Mooncake
cells of the TTFT study (ttft.py's flags and speedups, 4, 8 and 32
workers, seeds 1-3), and each value's mean over the seeds against the other
policies of an earlier study (docs/correction.md, "When the caches
overflow"). Only the default's row is run: overflow_margin changes no
other policy's decisions.

Usage: overflow_sweep.py STUDY_DIR OUTDIR [VALUES]
  STUDY_DIR  a ttft.py output (docs/experiments/results/ttft): the seed
             rule, prefill_aware, least_load and round_robin rows
  VALUES     comma-separated margins (default 0.1,0.15,0.2,0.3)
Env: RADIXGATE, TRACES, JOBS as for ttft.py. Writes OUTDIR/CELL-sSEED.json
and .cmd, then prints one table per cell.
"""
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ttft  # noqa: E402

WORKLOADS = ("mooncake-conversation", "mooncake-synthetic")
SIZES = (4, 8, 32)
SEEDS = (1, 2, 3)
OTHERS = ("seed_rule", "prefill_aware", "least_load", "round_robin")


def command(name: str, n: int, seed: int, values: str) -> str:
    return (f"{ttft.B} simulate --workers {n} {ttft.SPEC[name][0]} {ttft.arrivals(name, n)} "
            f"--policies cache_aware --sweep hot_spot.rule=predicted_ttft "
            f"--sweep hot_spot.overflow_margin={values} --seed {seed}")


def run(out: str, values: str, cell: tuple[str, int, int]) -> str:
    name, n, seed = cell
    return ttft.run_to(f"{out}/{name}-{n}-s{seed}", command(name, n, seed, values))


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def summarise(study: str, out: str) -> None:
    print("| cell | best other, ms (which) | overflow_margin | default mean TTFT ms | ratio | hit / seed rule's |")
    print("|---|---|---:|---:|---:|---:|")
    for name in WORKLOADS:
        for n in SIZES:
            others: dict[str, list] = {}
            swept: dict[str, list] = {}
            for seed in SEEDS:
                with open(f"{study}/{name}-{n}-s{seed}.json") as f:
                    for row in json.load(f)["rows"]:
                        others.setdefault(ttft.label(row), []).append(row)
                with open(f"{out}/{name}-{n}-s{seed}.json") as f:
                    for row in json.load(f)["rows"]:
                        swept.setdefault(row["params"], []).append(row)
            best, which = min((mean([r["ttft_ms"]["mean"] for r in others[p]]), p)
                              for p in OTHERS)
            seed_hit = mean([r["hit_rate"] for r in others["seed_rule"]])
            for params, rows in swept.items():
                value = params.rsplit("=", 1)[-1]
                t = mean([r["ttft_ms"]["mean"] for r in rows])
                h = mean([r["hit_rate"] for r in rows])
                print(f"| {name} {n} | {best:.1f} ({which}) | {value} | {t:.1f} | "
                      f"{t / best:.3f} | {h / seed_hit:.3f} |")


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    study, out = sys.argv[1], sys.argv[2]
    values = sys.argv[3] if len(sys.argv) > 3 else "0.1,0.15,0.2,0.3"
    os.makedirs(out, exist_ok=True)
    cells = [(w, n, s) for w in WORKLOADS for n in SIZES for s in SEEDS]
    with ThreadPoolExecutor(int(os.environ.get("JOBS", "2"))) as pool:
        for line in pool.map(lambda c: run(out, values, c), cells):
            print(line, file=sys.stderr)
    summarise(study, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
