$ radixgate simulate --workers 8 --workload mixed --rate 160 --requests 6000 --policies cache_aware,prefill_aware,least_load,round_robin,oracle --seed 1 
