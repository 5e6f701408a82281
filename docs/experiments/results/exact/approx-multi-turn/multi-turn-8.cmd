$ radixgate simulate --workers 8 --workload multi-turn --rate 160 --requests 6000 --policies cache_aware,oracle --seed 1 --sweep correction.enabled=false,true
