$ radixgate worker --port 34000 --count 4
$ radixgate serve --port 34100 --policy round_robin --worker-urls http://127.0.0.1:34000 http://127.0.0.1:34001 http://127.0.0.1:34002 http://127.0.0.1:34003
$ radixgate load --url http://127.0.0.1:34100 --workload shared-prefix --groups 32 --system-tokens 2048 --question-tokens 64 --output-tokens 32 --zipf 0.8 --rate 40 --requests 1600 --seed 3
