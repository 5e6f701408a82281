radixgate simulate --workers 8 --workload agentic --rate 320 --requests 6000 --policies cache_aware --sweep match_granularity_chars=1,64,128 --seed 2
