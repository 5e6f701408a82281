#!/bin/bash
# One router binary's CPU per request under wrk, for comparing builds
# quickly (bench/run.py --part cost is the full, recorded comparison).
#
# Usage: bench/wrk_cpu.sh BIN TAG [radixgate serve arguments...]
# Starts 2 `radixgate worker --instant` workers (from target/release) and
# `BIN serve --policy cache_aware` on loopback ports 36200-36201 and 36300,
# warms up with 3 s of wrk, then runs `wrk -t2 -c32 -d8s` with the 4 KiB
# chat body of `bench/run.py --part cost` (streamed with STREAM=1; its
# user message PROMPT_KIB KiB long if set) and
# prints the router's utime+stime (/proc) per request and wrk's requests
# per second. Run several binaries in alternating rounds:
# single runs on a shared machine move by 10-20%.
set -euo pipefail
BIN=$1; TAG=$2; shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
"$ROOT/target/release/radixgate" worker --port 36200 --count 2 --instant > "$TMP/workers.log" 2>&1 &
WP=$!
"$BIN" serve --host 127.0.0.1 --port 36300 --policy cache_aware --log-level warn "$@" \
  --worker-urls http://127.0.0.1:36200 http://127.0.0.1:36201 > "$TMP/serve.log" 2>&1 &
SP=$!
trap 'kill $SP $WP 2>/dev/null; wait $SP $WP 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do
  curl -sf http://127.0.0.1:36300/health > /dev/null && curl -sf http://127.0.0.1:36200/health > /dev/null && break
  sleep 0.1
done
# The cost part's own wrk body (bench/report.py); with PROMPT_KIB=N its
# user message made N KiB long (as bench/instr_cost.py's --prompt-kib).
python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import report, run; report.write_wrk_lua(sys.argv[2], run.MODEL, sys.argv[3] == "1", int(sys.argv[4]))' \
  "$ROOT/bench" "$TMP/post.lua" "${STREAM:-0}" "${PROMPT_KIB:-0}"
URL=http://127.0.0.1:36300/v1/chat/completions
wrk -t2 -c32 -d3s -s "$TMP/post.lua" "$URL" > /dev/null
c0=$(awk '{print $14 + $15}' /proc/$SP/stat)
wrk -t2 -c32 -d8s -s "$TMP/post.lua" "$URL" > "$TMP/wrk.txt"
c1=$(awk '{print $14 + $15}' /proc/$SP/stat)
reqs=$(grep -o '[0-9]* requests in' "$TMP/wrk.txt" | cut -d' ' -f1)
tick=$(getconf CLK_TCK)
echo "$TAG us_per_req=$(python3 -c "print(round(($c1 - $c0) * 1e6 / $tick / $reqs, 2))") $(grep Requests/sec "$TMP/wrk.txt" | tr -s ' ')"
