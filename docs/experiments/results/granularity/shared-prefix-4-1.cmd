radixgate simulate --workers 4 --workload shared-prefix --groups 128 --system-tokens 4096 --rate 60 --requests 6000 --policies cache_aware --sweep match_granularity_chars=1,64,128 --seed 1
