$ radixgate simulate --workers 4 --workload agentic --rate 160 --requests 6000 --policies cache_aware --seed 1 --sweep hot_spot.factor=1.25,1.5
