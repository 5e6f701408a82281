$ radixgate simulate --workers 4 --workload agentic --rate 160 --requests 6000 --policies cache_aware --seed 1 --sweep cache_threshold=0.1,0.3,0.5,0.7
