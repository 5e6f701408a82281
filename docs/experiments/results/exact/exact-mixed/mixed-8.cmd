$ radixgate simulate --workers 8 --workload mixed --rate 160 --requests 6000 --policies cache_aware --seed 1 --exact-events
