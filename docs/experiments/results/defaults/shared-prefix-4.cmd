$ radixgate simulate --workers 4 --workload shared-prefix --groups 128 --system-tokens 4096 --rate 60 --requests 6000 --policies cache_aware,prefill_aware,least_load,round_robin,oracle --seed 1 
