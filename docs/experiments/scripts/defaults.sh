#!/usr/bin/env bash
# Runs the defaults study of docs/defaults.md: every workload x pool size,
# open loop at a per-worker rate (traces: speedup per pool size), every
# policy at its defaults plus the oracle, one JSON report per cell.
#
# Usage: defaults.sh OUTDIR [extra `radixgate simulate` flags, e.g. --sweep ...]
# Env: RADIXGATE (binary, default target/release/radixgate),
#      TRACES (default traces), SIZES (default "2 4 8 32"),
#      WORKLOADS (default: all of the names below).
set -eu
B=${RADIXGATE:-target/release/radixgate}
T=${TRACES:-traces}
OUT=$1; shift
mkdir -p "$OUT"
POLICIES=${POLICIES:-cache_aware,prefill_aware,least_load,round_robin,oracle}

# name | workload flags | requests per second per worker (traces: speedup per worker)
spec() {
  case $1 in
    shared-prefix) echo "--workload shared-prefix --groups 128 --system-tokens 4096|15";;
    zipf)          echo "--workload shared-prefix --groups 128 --system-tokens 4096 --zipf 1.1|15";;
    multi-turn)    echo "--workload multi-turn|20";;
    long-doc)      echo "--workload long-doc --documents 64|10";;
    agentic)       echo "--workload agentic|40";;
    mixed)         echo "--workload mixed|20";;
    mooncake-conversation) echo "--workload trace --trace $T/mooncake_conversation.jsonl|0.25";;
    mooncake-synthetic)    echo "--workload trace --trace $T/mooncake_synthetic.jsonl|0.2";;
  esac
}

for name in ${WORKLOADS:-shared-prefix zipf multi-turn long-doc agentic mixed mooncake-conversation mooncake-synthetic}; do
  s=$(spec "$name"); flags=${s%|*}; per=${s#*|}
  for n in ${SIZES:-2 4 8 32}; do
    rate=$(python3 -c "print(round($per * $n, 3))")
    case $name in
      mooncake-*) arr="--speedup $rate --requests 4000";;
      *) if [ "$n" -ge 32 ]; then req=12000; else req=6000; fi
         arr="--rate $rate --requests $req";;
    esac
    cmd="$B simulate --workers $n $flags $arr --policies $POLICIES --seed 1 $*"
    echo "\$ ${cmd/#$B/radixgate}" | sed "s#$T#traces#g" > "$OUT/$name-$n.cmd"
    $cmd --json > "$OUT/$name-$n.json"
    echo "done $name $n" >&2
  done
done
