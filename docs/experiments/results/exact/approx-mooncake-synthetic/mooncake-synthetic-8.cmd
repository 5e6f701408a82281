$ radixgate simulate --workers 8 --workload trace --trace traces/mooncake_synthetic.jsonl --speedup 1.6 --requests 4000 --policies cache_aware,oracle --seed 1 --sweep correction.enabled=false,true
