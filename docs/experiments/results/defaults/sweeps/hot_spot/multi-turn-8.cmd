$ radixgate simulate --workers 8 --workload multi-turn --rate 160 --requests 6000 --policies cache_aware --seed 1 --sweep hot_spot.slack=1,2,4,8
