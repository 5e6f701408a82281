$ radixgate simulate --workers 32 --workload trace --trace traces/mooncake_synthetic.jsonl --speedup 6.4 --requests 4000 --policies cache_aware,prefill_aware,least_load,round_robin --sweep hot_spot.rule=relative_cap,predicted_ttft --seed 2
# default row re-run by ttft_default.py:
$ radixgate simulate --workers 32 --workload trace --trace traces/mooncake_synthetic.jsonl --speedup 6.4 --requests 4000 --policies cache_aware --sweep hot_spot.rule=predicted_ttft --seed 2
