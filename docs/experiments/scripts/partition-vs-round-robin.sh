#!/usr/bin/env bash
# Usage: docs/experiments/scripts/partition-vs-round-robin.sh KV ASSIGN ZIPF
# (from the repository root) — fresh workers each run (cold caches).
set -u
B=${RADIXGATE:-target/release/radixgate}
KV=$1; ASSIGN=$2; ZIPF=$3
$B worker --port 32100 --count 4 --kv-capacity-tokens "$KV" >/dev/null 2>&1 &
WP=$!
sleep 1
echo "\$ radixgate worker --port 32100 --count 4 --kv-capacity-tokens $KV"
echo "\$ radixgate load --url http://127.0.0.1:32100 --url http://127.0.0.1:32101 --url http://127.0.0.1:32102 --url http://127.0.0.1:32103 --workload shared-prefix --groups 32 --system-tokens 2048 --question-tokens 64 --output-tokens 32 --zipf $ZIPF --rate 40 --requests 800 --seed 7 --assign $ASSIGN"
$B load --url http://127.0.0.1:32100 --url http://127.0.0.1:32101 --url http://127.0.0.1:32102 --url http://127.0.0.1:32103 \
  --workload shared-prefix --groups 32 --system-tokens 2048 --question-tokens 64 --output-tokens 32 --zipf "$ZIPF" \
  --rate 40 --requests 800 --seed 7 --assign "$ASSIGN" --no-progress
kill "$WP"; wait "$WP" 2>/dev/null
