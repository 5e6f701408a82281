radixgate simulate --workers 8 --workload multi-turn --rate 160 --requests 6000 --policies cache_aware --sweep match_granularity_chars=1,64,128 --seed 2
