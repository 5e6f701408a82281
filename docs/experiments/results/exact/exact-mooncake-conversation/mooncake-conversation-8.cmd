$ radixgate simulate --workers 8 --workload trace --trace traces/mooncake_conversation.jsonl --speedup 2.0 --requests 4000 --policies cache_aware --seed 1 --exact-events
