#!/usr/bin/env bash
# granularity eval, long-doc and mixed: cache_aware, match_granularity_chars=1,64
B=${B:-target/release/radixgate}; OUT=${OUT:-docs/experiments/results/granularity}; mkdir -p $OUT
for n in 4 8; do for seed in 1 2; do
 $B simulate --workers $n --workload long-doc --documents 64 --rate $((10*n)) --requests 6000 --policies cache_aware --sweep match_granularity_chars=1,64 --seed $seed --json > $OUT/long-doc-$n-$seed.json
 $B simulate --workers $n --workload mixed --rate $((20*n)) --requests 6000 --policies cache_aware --sweep match_granularity_chars=1,64 --seed $seed --json > $OUT/mixed-$n-$seed.json
 echo done $n $seed >&2
done; done; echo ALLDONE >&2
