$ radixgate simulate --workers 32 --workload mixed --rate 640 --requests 12000 --policies cache_aware --seed 1 --sweep hot_spot.factor=1.25,1.5
