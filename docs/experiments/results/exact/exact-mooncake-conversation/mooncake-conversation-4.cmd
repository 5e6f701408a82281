$ radixgate simulate --workers 4 --workload trace --trace traces/mooncake_conversation.jsonl --speedup 1.0 --requests 4000 --policies cache_aware --seed 1 --exact-events
