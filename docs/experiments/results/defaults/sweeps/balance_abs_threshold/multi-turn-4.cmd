$ radixgate simulate --workers 4 --workload multi-turn --rate 80 --requests 6000 --policies cache_aware --seed 1 --sweep balance_abs_threshold=4,16,64
