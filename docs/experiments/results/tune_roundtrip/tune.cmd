$ radixgate tune --trace docs/experiments/results/tune_roundtrip/recording.jsonl --config docs/experiments/results/tune_roundtrip/bad.yaml --kv-capacity-tokens 24000
