#!/usr/bin/env bash
# The sweeps of cache_aware in docs/defaults.md. Each varies settings around
# the defaults the sweeps started from (low_match min_load, hot-spot slack 2,
# factor 1.5), pinned here with single-value sweeps because the defaults
# have since changed; the committed results were run when those were the
# defaults, so their labels lack the pinned keys. Same rates as defaults.sh.
# Usage: tune.sh OUTDIR
set -eu
D=$(dirname "$0")
OUT=$1
OLD="--sweep low_match=min_load --sweep hot_spot.slack=2"
export POLICIES=cache_aware
export WORKLOADS=${WORKLOADS:-"shared-prefix zipf multi-turn long-doc agentic mixed"}
SIZES="4 8" "$D/defaults.sh" "$OUT/cache_threshold" --sweep cache_threshold=0.1,0.3,0.5,0.7 $OLD
SIZES="4 8" "$D/defaults.sh" "$OUT/balance_abs_threshold" --sweep balance_abs_threshold=4,16,64 $OLD
SIZES="4 8" "$D/defaults.sh" "$OUT/hot_spot" --sweep hot_spot.slack=1,2,4,8 --sweep low_match=min_load
SIZES="4 8" "$D/defaults.sh" "$OUT/hot_spot_off" --sweep hot_spot.rule=off --sweep low_match=min_load
SIZES="4 8" "$D/defaults.sh" "$OUT/low_match" --sweep low_match=min_load,smallest_tree --sweep hot_spot.slack=2
SIZES="2 4 8 32" "$D/defaults.sh" "$OUT/hot_spot_factor" --sweep hot_spot.factor=1.25,1.5 $OLD
SIZES="2 4 8 32" "$D/defaults.sh" "$OUT/chosen" --sweep low_match=smallest_tree --sweep hot_spot.slack=2,4,8
