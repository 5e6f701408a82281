$ radixgate simulate --workers 8 --workload mixed --rate 160 --requests 6000 --policies cache_aware --seed 1 --sweep low_match=smallest_tree --sweep hot_spot.slack=2,4,8
