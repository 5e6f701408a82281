#!/usr/bin/env bash
# The trace recording's CPU cost (docs/record-and-tune.md): radixgate serve
# CPU seconds (user + system, all threads, the writer's included) per 1,000
# requests, recording off and on, two rounds, in front of 2 instant simulated
# workers, shared-prefix prompts (~2.2k tokens) at 400 requests/s. Release
# build; ports 29810-29811 and 29820.
# Usage: record_overhead.sh
set -eu
B=${RADIXGATE:-target/release/radixgate}
D=$(mktemp -d)
for round in 1 2; do
for mode in off on; do
  $B worker --port 29810 --count 2 --instant >/dev/null 2>&1 &
  wp=$!
  extra=""
  [ $mode = on ] && extra="--record-trace $D/rec-$round.jsonl"
  $B serve --port 29820 --worker-urls http://127.0.0.1:29810 http://127.0.0.1:29811 $extra >/dev/null 2>&1 &
  sp=$!
  for _ in $(seq 300); do curl -s localhost:29820/readiness | grep -q '"healthy_workers":2' && break; sleep 0.1; done
  t0=$(awk '{print $14+$15}' /proc/$sp/stat)
  $B load --url http://127.0.0.1:29820 --workload shared-prefix --rate 400 --requests 8000 --seed 1 --no-progress --json > $D/$mode-$round.json
  t1=$(awk '{print $14+$15}' /proc/$sp/stat)
  tck=$(getconf CLK_TCK)
  ok=$(python3 -c "import json;print(json.load(open('$D/$mode-$round.json'))['ok'])")
  python3 -c "print('round $round recording $mode: serve CPU', round(($t1-$t0)/$tck,2), 's for', $ok, 'requests =', round(($t1-$t0)/$tck/$ok*1000,3), 's per 1k')"
  kill $sp; wait $sp 2>/dev/null || true
  kill $wp; wait $wp 2>/dev/null || true
done
done
wc -l $D/rec-*.jsonl
rm -rf $D
