$ radixgate simulate --workers 2 --workload shared-prefix --groups 128 --system-tokens 4096 --rate 30 --requests 6000 --policies cache_aware,prefill_aware,least_load,round_robin,oracle --seed 1 
