$ radixgate simulate --workers 8 --workload agentic --rate 320 --requests 6000 --policies cache_aware --seed 1 --exact-events
