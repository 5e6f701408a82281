$ radixgate simulate --workers 32 --workload multi-turn --rate 640 --requests 12000 --policies cache_aware --seed 1 --sweep hot_spot.factor=1.25,1.5
