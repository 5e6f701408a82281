$ radixgate simulate --workers 4 --workload long-doc --documents 64 --rate 40 --requests 6000 --policies cache_aware,prefill_aware,least_load,round_robin,oracle --seed 1 
