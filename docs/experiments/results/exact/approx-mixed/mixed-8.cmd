$ radixgate simulate --workers 8 --workload mixed --rate 160 --requests 6000 --policies cache_aware,oracle --seed 1 --sweep correction.enabled=false,true --sweep correction.capacity_bound=false,true
