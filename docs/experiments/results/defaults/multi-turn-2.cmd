$ radixgate simulate --workers 2 --workload multi-turn --rate 40 --requests 6000 --policies cache_aware,prefill_aware,least_load,round_robin,oracle --seed 1 
