$ radixgate simulate --workers 4 --workload long-doc --documents 64 --rate 40 --requests 6000 --policies cache_aware --seed 1 --exact-events
