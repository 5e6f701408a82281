$ radixgate simulate --workers 8 --workload shared-prefix --groups 128 --system-tokens 4096 --zipf 1.1 --rate 120 --requests 6000 --policies cache_aware --seed 1 --exact-events
