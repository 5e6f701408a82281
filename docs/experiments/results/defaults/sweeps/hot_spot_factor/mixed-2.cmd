$ radixgate simulate --workers 2 --workload mixed --rate 40 --requests 6000 --policies cache_aware --seed 1 --sweep hot_spot.factor=1.25,1.5
