$ radixgate simulate --workers 32 --workload long-doc --documents 64 --rate 320 --requests 12000 --policies cache_aware --seed 1 --sweep low_match=smallest_tree --sweep hot_spot.slack=2,4,8
