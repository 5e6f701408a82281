#!/usr/bin/env bash
# Cross-check of docs/defaults.md: one workload through the offline
# simulator and through a real run (radixgate serve + radixgate worker +
# radixgate load), for cache_aware and round_robin. Fresh workers (cold
# caches) for each real run. Ports 34000-34010 and 34100.
# Usage: cross-check.sh OUTDIR
set -u
B=${RADIXGATE:-target/release/radixgate}
OUT=$1; mkdir -p "$OUT"
WL="--workload shared-prefix --groups 32 --system-tokens 2048 --question-tokens 64 --output-tokens 32 --zipf 0.8"
ARR="--rate 40 --requests 1600 --seed 3"
echo "\$ radixgate simulate --workers 4 $WL $ARR --policies cache_aware,round_robin,oracle" > "$OUT/simulate.cmd"
$B simulate --workers 4 $WL $ARR --policies cache_aware,round_robin,oracle --json > "$OUT/simulate.json"
$B simulate --workers 4 $WL $ARR --policies cache_aware,round_robin,oracle > "$OUT/simulate.txt"
for policy in cache_aware round_robin; do
  $B worker --port 34000 --count 4 >/dev/null 2>&1 &
  WP=$!
  $B serve --port 34100 --policy "$policy" --worker-urls http://127.0.0.1:34000 http://127.0.0.1:34001 http://127.0.0.1:34002 http://127.0.0.1:34003 >/dev/null 2>&1 &
  SP=$!
  sleep 2
  {
    echo "\$ radixgate worker --port 34000 --count 4"
    echo "\$ radixgate serve --port 34100 --policy $policy --worker-urls http://127.0.0.1:34000 http://127.0.0.1:34001 http://127.0.0.1:34002 http://127.0.0.1:34003"
    echo "\$ radixgate load --url http://127.0.0.1:34100 $WL $ARR"
  } > "$OUT/real-$policy.cmd"
  $B load --url http://127.0.0.1:34100 $WL $ARR --no-progress --json > "$OUT/real-$policy.json"
  kill "$SP" "$WP"; wait "$SP" "$WP" 2>/dev/null
done
