$ radixgate simulate --workers 8 --workload multi-turn --rate 160 --requests 6000 --policies cache_aware --seed 1 --sweep low_match=min_load,smallest_tree
