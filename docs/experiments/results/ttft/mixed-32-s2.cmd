$ radixgate simulate --workers 32 --workload mixed --rate 640 --requests 12000 --policies cache_aware,prefill_aware,least_load,round_robin --sweep hot_spot.rule=relative_cap,predicted_ttft --seed 2
