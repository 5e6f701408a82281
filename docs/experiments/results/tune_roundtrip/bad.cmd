$ radixgate worker --port 29710 --count 4 --kv-capacity-tokens 24000
$ radixgate serve --port 29720 --config docs/experiments/results/tune_roundtrip/bad.yaml --worker-urls http://127.0.0.1:29710 http://127.0.0.1:29711 http://127.0.0.1:29712 http://127.0.0.1:29713 --record-trace docs/experiments/results/tune_roundtrip/recording.jsonl
$ radixgate load --url http://127.0.0.1:29720 --workload shared-prefix --groups 32 --zipf 0.8 --system-tokens 2048 --question-tokens 128 --output-tokens 32 --rate 40 --requests 2000 --seed 7
