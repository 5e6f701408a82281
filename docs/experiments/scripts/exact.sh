#!/usr/bin/env bash
# The exact-events study of docs/kv-events.md: every workload of
# docs/defaults.md plus shared-prefix-small (a quarter of the default KV
# cache), at 4 and 8 workers. Per cell, two runs of the same workload and
# seed: cache_aware's tree alone (no correction from the answers, no bound
# by the workers' caches) and with the default correction (both), plus the
# oracle; then cache_aware with --exact-events.
#
# Usage: exact.sh OUTDIR    Env: RADIXGATE, TRACES, SIZES (default "4 8"),
#        WORKLOADS (default: all).
set -eu
here=$(dirname "$0")
OUT=$1
export SIZES=${SIZES:-4 8}
all="shared-prefix zipf multi-turn long-doc agentic mixed mooncake-conversation mooncake-synthetic"
for w in ${WORKLOADS:-$all shared-prefix-small}; do
  case $w in
    shared-prefix-small) name=shared-prefix; extra="--kv-capacity-tokens 100000";;
    *) name=$w; extra="";;
  esac
  POLICIES=cache_aware,oracle WORKLOADS=$name "$here/defaults.sh" "$OUT/approx-$w" \
    --sweep correction.enabled=false,true --sweep correction.capacity_bound=false,true $extra
  POLICIES=cache_aware WORKLOADS=$name "$here/defaults.sh" "$OUT/exact-$w" --exact-events $extra
done
