$ radixgate simulate --workers 4 --workload shared-prefix --groups 128 --system-tokens 4096 --rate 60 --requests 6000 --policies cache_aware --seed 1 --exact-events
