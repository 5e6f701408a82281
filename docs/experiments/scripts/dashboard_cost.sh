#!/usr/bin/env bash
# What the status page costs the router: its CPU time (user + system, from
# /proc) over SECS seconds with nobody watching, then over SECS seconds
# with the data endpoint read once a second, as the open page does; N
# simulated workers, optionally under a load of RATE requests/s
# (`--instant` workers, so the load costs the router, not the workers).
#
# Usage: dashboard_cost.sh
# Environment: RADIXGATE (binary, default target/release/radixgate),
# WORKERS (default 64), SECS (default 30), RATE (default 0: no load).
# Ports 37000-37099 and 37200.
set -euo pipefail
B=${RADIXGATE:-target/release/radixgate}
N=${WORKERS:-64}
SECS=${SECS:-30}
RATE=${RATE:-0}
ROUTER=http://127.0.0.1:37200
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

"$B" worker --port 37000 --count "$N" --instant >/dev/null 2>&1 &
pids+=($!)
urls=()
for i in $(seq 0 $((N - 1))); do urls+=("http://127.0.0.1:$((37000 + i))"); done
"$B" serve --port 37200 --worker-urls "${urls[@]}" >/dev/null 2>&1 &
router=$!
pids+=($router)
for _ in $(seq 100); do
  curl -sf "$ROUTER/readiness" >/dev/null && break
  sleep 0.2
done
sleep 3
if [ "$RATE" != 0 ]; then
  "$B" load --url "$ROUTER" --workload shared-prefix --rate "$RATE" --duration $((3 * SECS + 30)) \
    --no-progress >/dev/null 2>&1 &
  pids+=($!)
  sleep 5
fi

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$router/stat"; }
ms_per_sec() { awk -v d="$1" -v t="$ticks" -v s="$SECS" 'BEGIN {printf "%.1f", d * 1000 / t / s}'; }

a=$(cpu)
sleep "$SECS"
b=$(cpu)
for _ in $(seq "$SECS"); do
  curl -s -o /dev/null "$ROUTER/dashboard/data"
  sleep 1
done
c=$(cpu)
echo "workers $N, load $RATE req/s, $SECS s each"
echo "nobody watching: $(ms_per_sec $((b - a))) ms CPU per second"
echo "page open:       $(ms_per_sec $((c - b))) ms CPU per second"
