$ radixgate simulate --workers 32 --workload multi-turn --rate 640 --requests 12000 --policies cache_aware,prefill_aware,least_load,round_robin --sweep hot_spot.rule=relative_cap,predicted_ttft --seed 3
# default row re-run by ttft_default.py:
$ radixgate simulate --workers 32 --workload multi-turn --rate 640 --requests 12000 --policies cache_aware --sweep hot_spot.rule=predicted_ttft --seed 3
