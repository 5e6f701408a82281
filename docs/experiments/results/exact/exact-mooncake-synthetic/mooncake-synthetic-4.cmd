$ radixgate simulate --workers 4 --workload trace --trace traces/mooncake_synthetic.jsonl --speedup 0.8 --requests 4000 --policies cache_aware --seed 1 --exact-events
