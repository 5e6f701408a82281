$ radixgate simulate --workers 4 --workload agentic --rate 160 --requests 6000 --policies cache_aware --seed 1 --exact-events
