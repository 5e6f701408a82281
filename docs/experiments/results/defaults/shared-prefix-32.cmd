$ radixgate simulate --workers 32 --workload shared-prefix --groups 128 --system-tokens 4096 --rate 480 --requests 12000 --policies cache_aware,prefill_aware,least_load,round_robin,oracle --seed 1 
