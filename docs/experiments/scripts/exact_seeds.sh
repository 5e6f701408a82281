#!/usr/bin/env bash
# Seed-to-seed check of one cell of docs/kv-events.md: cache_aware on its
# tree (correction on, the default) against cache_aware with exact events,
# over several seeds of the same workload, with the mean over seeds.
#
# Usage: exact_seeds.sh WORKERS SEEDS WORKLOAD-FLAGS...
#   e.g. exact_seeds.sh 4 "1 2 3 4 5 6 7 8" --workload long-doc --documents 64 --rate 40 --requests 6000
# Env: RADIXGATE (binary, default target/release/radixgate).
set -eu
B=${RADIXGATE:-target/release/radixgate}
n=$1; seeds=$2; shift 2
out=$(mktemp -d)
for s in $seeds; do
  "$B" simulate --workers "$n" "$@" --policies cache_aware --seed "$s" --json > "$out/tree-$s.json"
  "$B" simulate --workers "$n" "$@" --policies cache_aware --seed "$s" --exact-events --json > "$out/exact-$s.json"
done
python3 - "$out" $seeds <<'PY'
import json, sys
out, seeds = sys.argv[1], sys.argv[2:]
def cell(kind, s):
    row = json.load(open(f"{out}/{kind}-{s}.json"))["rows"][0]
    return row["hit_rate"], row["ttft_ms"]["mean"]
print("| seed | hit tree / exact | mean TTFT ms tree / exact | TTFT change |")
print("|---:|---|---|---:|")
sums = [0.0] * 4
for s in seeds:
    (ht, tt), (he, te) = cell("tree", s), cell("exact", s)
    for i, v in enumerate((ht, tt, he, te)):
        sums[i] += v
    print(f"| {s} | {ht:.4f} / {he:.4f} | {tt:.1f} / {te:.1f} | {(te / tt - 1) * 100:+.1f}% |")
k = len(seeds)
ht, tt, he, te = (v / k for v in sums)
print(f"| mean | {ht:.4f} / {he:.4f} | {tt:.1f} / {te:.1f} | {(te / tt - 1) * 100:+.1f}% |")
PY
rm -r "$out"
