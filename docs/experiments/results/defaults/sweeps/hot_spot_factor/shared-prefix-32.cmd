$ radixgate simulate --workers 32 --workload shared-prefix --groups 128 --system-tokens 4096 --rate 480 --requests 12000 --policies cache_aware --seed 1 --sweep hot_spot.factor=1.25,1.5
