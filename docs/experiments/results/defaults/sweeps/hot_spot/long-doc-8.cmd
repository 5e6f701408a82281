$ radixgate simulate --workers 8 --workload long-doc --documents 64 --rate 80 --requests 6000 --policies cache_aware --seed 1 --sweep hot_spot.slack=1,2,4,8
