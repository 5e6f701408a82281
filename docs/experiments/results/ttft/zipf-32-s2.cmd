$ radixgate simulate --workers 32 --workload shared-prefix --groups 128 --system-tokens 4096 --zipf 1.1 --rate 480 --requests 12000 --policies cache_aware,prefill_aware,least_load,round_robin --sweep hot_spot.rule=relative_cap,predicted_ttft --seed 2
# default row re-run by ttft_default.py:
$ radixgate simulate --workers 32 --workload shared-prefix --groups 128 --system-tokens 4096 --zipf 1.1 --rate 480 --requests 12000 --policies cache_aware --sweep hot_spot.rule=predicted_ttft --seed 2
