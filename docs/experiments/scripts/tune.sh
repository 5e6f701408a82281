#!/usr/bin/env bash
# The one-setting-at-a-time sweeps of cache_aware in docs/defaults.md:
# each setting varied around the defaults, on the six synthetic workloads
# at 4 and 8 workers (same rates as defaults.sh).
# Usage: tune.sh OUTDIR
set -eu
D=$(dirname "$0")
OUT=$1
export POLICIES=cache_aware SIZES=${SIZES:-"4 8"}
export WORKLOADS=${WORKLOADS:-"shared-prefix zipf multi-turn long-doc agentic mixed"}
"$D/defaults.sh" "$OUT/cache_threshold" --sweep cache_threshold=0.1,0.3,0.5,0.7
"$D/defaults.sh" "$OUT/balance_abs_threshold" --sweep balance_abs_threshold=4,16,64
"$D/defaults.sh" "$OUT/hot_spot" --sweep hot_spot.slack=1,2,4,8
"$D/defaults.sh" "$OUT/hot_spot_off" --sweep hot_spot.rule=off
"$D/defaults.sh" "$OUT/low_match" --sweep low_match=min_load,smallest_tree
