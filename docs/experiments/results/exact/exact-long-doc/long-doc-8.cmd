$ radixgate simulate --workers 8 --workload long-doc --documents 64 --rate 80 --requests 6000 --policies cache_aware --seed 1 --exact-events
