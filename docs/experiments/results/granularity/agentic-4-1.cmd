radixgate simulate --workers 4 --workload agentic --rate 160 --requests 6000 --policies cache_aware --sweep match_granularity_chars=1,64,128 --seed 1
