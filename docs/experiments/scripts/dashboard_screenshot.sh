#!/usr/bin/env bash
# The status page under load, as a PNG (docs/dashboard.png): simulated
# workers (`radixgate worker`), the router in front of them with an admin
# key (`radixgate serve`), a shared-prefix workload (`radixgate load`),
# and a headless Chromium taking the screenshot once the charts hold a few
# minutes.
#
# Besides healthy workers, the pool shows: one that answers 80% of its
# requests with HTTP 500 (errors; its circuit breaker opens and
# half-opens), one stopped part-way (unhealthy), and one that never comes
# up (pending). (A drained worker shows `draining` only while its last
# requests finish, here a second or two.)
#
# Usage: dashboard_screenshot.sh [OUT.png]   (default docs/dashboard.png)
# Environment: RADIXGATE (binary, default target/release/radixgate),
# WORKERS (default 64), RATE (requests/s, default 60), SECS (seconds of
# load before the screenshot, default 150). Ports 36000-36099 and 36200.
set -euo pipefail
B=${RADIXGATE:-target/release/radixgate}
OUT=${1:-docs/dashboard.png}
N=${WORKERS:-64}
RATE=${RATE:-60}
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

# N - 2 workers in one process, worker 5 of them failing; one on its own,
# stopped later; one URL where nothing listens.
"$B" worker --port 36000 --count $((N - 2)) --error-rate 0.8 --fault-workers 5 >"$TMP/workers.log" 2>&1 &
pids+=($!)
"$B" worker --port 36098 >"$TMP/lone.log" 2>&1 &
lone=$!
pids+=($lone)
urls=()
for i in $(seq 0 $((N - 3))); do urls+=("http://127.0.0.1:$((36000 + i))"); done
urls+=("http://127.0.0.1:36098" "http://127.0.0.1:36099")
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

"$B" load --url "$ROUTER" --workload shared-prefix --groups 128 --system-tokens 1024 \
  --question-tokens 64 --output-tokens 128 --rate "$RATE" --duration $((SECS + 60)) --seed 1 \
  --no-progress >"$TMP/load.log" 2>&1 &
pids+=($!)

sleep $((SECS / 2))
kill "$lone"
sleep $((SECS / 2))
mkdir -p "$(dirname "$OUT")"
flags=(--headless --disable-gpu --hide-scrollbars --no-first-run --user-data-dir="$TMP/chromium"
  --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" --virtual-time-budget=3000
  --window-size=1600,1700 --screenshot="$OUT")
[ "$(id -u)" = 0 ] && flags+=(--no-sandbox)
rm -f "$OUT"
chromium "${flags[@]}" "http://admin:$KEY@127.0.0.1:36200/dashboard" >"$TMP/chromium.log" 2>&1 &&
  [ -s "$OUT" ] || { cat "$TMP/chromium.log"; echo "no screenshot in $OUT"; exit 1; }
echo "wrote $OUT"
