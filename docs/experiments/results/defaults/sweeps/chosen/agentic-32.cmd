$ radixgate simulate --workers 32 --workload agentic --rate 1280 --requests 12000 --policies cache_aware --seed 1 --sweep low_match=smallest_tree --sweep hot_spot.slack=2,4,8
