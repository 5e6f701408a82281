#!/usr/bin/env bash
# Puts each public router (smg, sglang-router, vllm-router; installed in a
# venv, default ~/.cache/peers) in front of two simulated workers and sends
# chat, completions and /generate, streaming and not, through it.
# Usage: crates/radixgate-sim/scripts/peers_check.sh [path/to/radixgate]
# Ports: workers 31001-31002, router 31500 (+31501 for metrics).
# Every process started here is stopped by its PID (routers with SIGKILL:
# they wait out a long grace period on SIGTERM).
set -uo pipefail
BIN=${1:-target/debug/radixgate}
VENV=${PEERS_VENV:-$HOME/.cache/peers}
HERE=$(cd "$(dirname "$0")" && pwd)
W1=http://127.0.0.1:31001
W2=http://127.0.0.1:31002
"$BIN" worker --port 31001 --count 2 >/tmp/peers-workers.log 2>&1 &
WPID=$!
trap 'kill -9 ${RPID:-} 2>/dev/null; kill $WPID 2>/dev/null; wait 2>/dev/null' EXIT
sleep 1

run_router() {
  local name=$1; shift
  "$@" >/tmp/peers-$name.log 2>&1 &
  RPID=$!
  for _ in $(seq 1 120); do
    if curl -sf -m 2 -o /dev/null http://127.0.0.1:31500/v1/models \
      || curl -sf -m 2 -o /dev/null http://127.0.0.1:31500/health; then break; fi
    sleep 0.5
  done
  sleep 3  # let the router's first health/discovery round finish
  echo "== $name"
  "$VENV/bin/python" "$HERE/peer_client.py" http://127.0.0.1:31500
  echo "exit=$?"
  kill -9 $RPID 2>/dev/null; wait $RPID 2>/dev/null; RPID=
  sleep 1
}

run_router smg "$VENV/bin/python" -m smg.launch_router --worker-urls $W1 $W2 \
  --port 31500 --policy cache_aware --prometheus-port 31501
run_router sglang-router "$VENV/bin/python" -m sglang_router.launch_router --worker-urls $W1 $W2 \
  --port 31500 --policy cache_aware --prometheus-port 31501
run_router vllm-router "$VENV/bin/vllm-router" --worker-urls $W1 $W2 \
  --port 31500 --policy cache_aware
