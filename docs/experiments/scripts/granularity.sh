#!/usr/bin/env bash
# granularity eval: cache_aware, match_granularity_chars=1,64,128
set -u
B=${B:-target/release/radixgate}
T=traces
OUT=${OUT:-docs/experiments/results/granularity}; mkdir -p $OUT
spec() {
  case $1 in
    multi-turn)    echo "--workload multi-turn|20";;
    shared-prefix) echo "--workload shared-prefix --groups 128 --system-tokens 4096|15";;
    zipf-hot)      echo "--workload shared-prefix --groups 8 --zipf 2.0|15";;
    agentic)       echo "--workload agentic|40";;
    mooncake-conversation) echo "--workload trace --trace $T/mooncake_conversation.jsonl|0.25";;
  esac
}
for name in ${WORKLOADS:-multi-turn shared-prefix zipf-hot agentic mooncake-conversation}; do
 s=$(spec $name); flags=${s%|*}; per=${s#*|}
 for n in 4 8; do
  rate=$(python3 -c "print(round($per * $n, 3))")
  case $name in mooncake-*) arr="--speedup $rate --requests 4000";; *) arr="--rate $rate --requests 6000";; esac
  for seed in 1 2 3; do
   f=$OUT/$name-$n-$seed.json
   [ -s $f ] && continue
   cmd="$B simulate --workers $n $flags $arr --policies cache_aware --sweep match_granularity_chars=1,64,128 --seed $seed"
   echo "$cmd" > ${f%.json}.cmd
   $cmd --json > $f 2> ${f%.json}.err || echo "FAIL $name $n $seed" >&2
   echo "done $name $n $seed $(date +%T)" >&2
  done
 done
done
# live-bench mirror
for seed in 1 2 3 4 5 6 7 8; do
 f=$OUT/live-mt-4-$seed.json
 $B simulate --workers 4 --workload multi-turn --rate 12 --think-ms 300 --requests 360 --policies cache_aware --sweep match_granularity_chars=1,64,128 --seed $seed --json > $f 2>${f%.json}.err
done
echo ALLDONE >&2
