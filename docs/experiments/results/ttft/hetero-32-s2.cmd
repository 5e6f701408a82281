$ radixgate simulate --workers 32 --workload shared-prefix --groups 8 --zipf 2.0 --question-tokens 512 --worker-speeds 0.5 --rate 960 --requests 12000 --policies cache_aware,prefill_aware,least_load,round_robin --sweep hot_spot.rule=relative_cap,predicted_ttft --seed 2
# default row re-run by ttft_default.py:
$ radixgate simulate --workers 32 --workload shared-prefix --groups 8 --zipf 2.0 --question-tokens 512 --worker-speeds 0.5 --rate 960 --requests 12000 --policies cache_aware --sweep hot_spot.rule=predicted_ttft --seed 2
