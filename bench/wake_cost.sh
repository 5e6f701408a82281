#!/usr/bin/env bash
# What a thread wake-up costs on this machine, with no radixgate code
# (crates/radixgate/examples/wake_cost.rs): a sleeping thread, two threads
# of one process, and two processes pinned to different CPUs, each as is and
# then with every CPU kept out of idle by a busy loop at SCHED_IDLE priority.
# JSON lines on stdout, each with "awake" added. Needs taskset and chrt
# (util-linux). The loops and the echo processes are started here and
# stopped by PID.
#
#   bench/wake_cost.sh [BIN]   (default target/release/examples/wake_cost)
set -euo pipefail
bin=${1:-target/release/examples/wake_cost}
[ -x "$bin" ] || { echo "no $bin: cargo build --release -p radixgate --example wake_cost" >&2; exit 1; }
cpus=$(nproc)
[ "$cpus" -ge 2 ] || { echo "needs 2 CPUs or more" >&2; exit 1; }
sock=$(mktemp -u /tmp/wake_cost.XXXXXX.sock)
loops=()
stop_loops() { for pid in "${loops[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; loops=(); }
trap stop_loops EXIT

measure() {
  local awake=$1 line
  for args in "sleep 100 30" "sleep 10 300" "sleep 1 1000" "pingpong 20000"; do
    # shellcheck disable=SC2086
    line=$("$bin" $args)
    echo "${line%\}},\"awake\":$awake}"
  done
  taskset -c 1 "$bin" echo "$sock" > "$sock.out" &
  local echo_pid=$!
  for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
  line=$(taskset -c 0 "$bin" pingpong 20000 "$sock")
  wait "$echo_pid"
  echo "${line%\}},\"pinned\":\"0 and 1\",\"awake\":$awake}"
  line=$(cat "$sock.out")
  echo "${line%\}},\"pinned\":\"1\",\"awake\":$awake}"
  rm -f "$sock.out"
}

measure false
for c in $(seq 0 $((cpus - 1))); do
  taskset -c "$c" chrt -i 0 sh -c 'while :; do :; done' &
  loops+=($!)
done
sleep 0.5
measure true
