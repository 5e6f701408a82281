$ radixgate simulate --workers 4 --workload long-doc --documents 64 --rate 40 --requests 6000 --policies cache_aware --seed 1 --sweep cache_threshold=0.1,0.3,0.5,0.7
