$ radixgate simulate --workers 8 --workload long-doc --documents 64 --rate 80 --requests 6000 --policies cache_aware,prefill_aware,least_load,round_robin,oracle,oracle_ttft --sweep hot_spot.rule=relative_cap,predicted_ttft --seed 1
# default row re-run by ttft_default.py:
$ radixgate simulate --workers 8 --workload long-doc --documents 64 --rate 80 --requests 6000 --policies cache_aware --sweep hot_spot.rule=predicted_ttft --seed 1
