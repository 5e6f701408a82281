#!/usr/bin/env bash
# The status page under load, as a PNG (docs/dashboard.png): simulated
# workers (`radixgate worker`), the router in front of them with an admin
# key (`radixgate serve`), a shared-prefix workload (`radixgate load`),
# and a headless Chromium taking the screenshot once the charts hold a few
# minutes.
#
# The pool shows the states the table knows: one worker answers 80% of its
# requests with HTTP 500 (errors; its circuit breaker opens and half-opens),
# one takes 15 s to answer (outlier detection may eject it), one is stopped
# part-way (unhealthy), one is drained a moment before the screenshot with
# requests in flight (draining until they finish), and one never comes up
# (pending).
#
# Usage: dashboard_screenshot.sh [OUT.png]   (default docs/dashboard.png)
# Environment: RADIXGATE (binary, default target/release/radixgate),
# WORKERS (default 64), RATE (requests/s, default 40), SECS (seconds of
# load before the screenshot, default 150). Ports 36000-36099 and 36200.
set -euo pipefail
B=${RADIXGATE:-target/release/radixgate}
OUT=${1:-docs/dashboard.png}
N=${WORKERS:-64}
RATE=${RATE:-40}
SECS=${SECS:-150}
KEY=sk-dashboard-screenshot
ROUTER=http://127.0.0.1:36200
TMP=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# N - 3 workers in one process, worker 5 of them failing; one on its own,
# stopped later; a slow one; one URL where nothing listens.
"$B" worker --port 36000 --count $((N - 3)) --error-rate 0.8 --fault-workers 5 >"$TMP/workers.log" 2>&1 &
pids+=($!)
"$B" worker --port 36097 >"$TMP/lone.log" 2>&1 &
lone=$!
pids+=($lone)
"$B" worker --port 36098 --added-latency-ms 15000 >"$TMP/slow.log" 2>&1 &
pids+=($!)
urls=()
for i in $(seq 0 $((N - 4))); do urls+=("http://127.0.0.1:$((36000 + i))"); done
urls+=("http://127.0.0.1:36097" "http://127.0.0.1:36098" "http://127.0.0.1:36099")
"$B" serve --port 36200 --admin-api-key "$KEY" --worker-urls "${urls[@]}" >"$TMP/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -sf "$ROUTER/readiness" >/dev/null && break
  sleep 0.2
done
sleep 3

# Watch from the start (the sampler runs only while someone reads), and
# keep watching until the screenshot.
watch_data() {
  while :; do
    curl -s -o /dev/null -H "Authorization: Bearer $KEY" "$ROUTER/dashboard/data"
    sleep 5
  done
}
watch_data &
pids+=($!)

"$B" load --url "$ROUTER" --workload shared-prefix --groups 16 --system-tokens 1024 \
  --question-tokens 64 --output-tokens 32 --rate "$RATE" --duration $((SECS + 60)) --seed 1 \
  --no-progress >"$TMP/load.log" 2>&1 &
pids+=($!)

sleep $((SECS / 2))
kill "$lone"
sleep $((SECS / 2 - 5))
# Drained with requests in flight: `draining` until they finish (the slow
# worker when it has some: its take 15 s).
busiest=$(curl -s -H "Authorization: Bearer $KEY" "$ROUTER/dashboard/data" | python3 -c '
import json, sys
ws = json.load(sys.stdin)["workers"]
slow = [w for w in ws if w["url"].endswith(":36098") and w["in_flight"] > 0]
print((slow or [max(ws, key=lambda w: w["in_flight"])])[0]["url"])')
curl -s -o /dev/null -X DELETE -H "Authorization: Bearer $KEY" "$ROUTER/workers?url=$busiest"

mkdir -p "$(dirname "$OUT")"
flags=(--headless --disable-gpu --hide-scrollbars --no-first-run --user-data-dir="$TMP/chromium"
  --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" --virtual-time-budget=3000
  --window-size=1600,1700 --screenshot="$OUT")
[ "$(id -u)" = 0 ] && flags+=(--no-sandbox)
chromium "${flags[@]}" "http://admin:$KEY@127.0.0.1:36200/dashboard" 2>"$TMP/chromium.log" ||
  { cat "$TMP/chromium.log"; exit 1; }
echo "wrote $OUT"
