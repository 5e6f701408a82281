$ radixgate simulate --workers 32 --workload long-doc --documents 64 --rate 320 --requests 12000 --policies cache_aware --seed 1 --sweep hot_spot.factor=1.25,1.5
