$ radixgate simulate --workers 32 --workload agentic --rate 1280 --requests 12000 --policies cache_aware,prefill_aware,least_load,round_robin,oracle --seed 1 
