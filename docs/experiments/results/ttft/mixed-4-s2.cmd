$ radixgate simulate --workers 4 --workload mixed --rate 80 --requests 6000 --policies cache_aware,prefill_aware,least_load,round_robin --sweep hot_spot.rule=relative_cap,predicted_ttft --seed 2
