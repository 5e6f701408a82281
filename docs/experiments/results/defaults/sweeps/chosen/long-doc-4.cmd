$ radixgate simulate --workers 4 --workload long-doc --documents 64 --rate 40 --requests 6000 --policies cache_aware --seed 1 --sweep low_match=smallest_tree --sweep hot_spot.slack=2,4,8
