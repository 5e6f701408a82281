#!/bin/bash
# One huge chat prompt through `serve --kv-events`: the router's CPU time
# and peak RSS for it (docs/kv-events.md, "Only the prompt's capped prefix
# is tokenized").
# Usage: kv_big_prompt.sh BIN, with TOKENIZER_DIR (the test tokenizer:
# cargo run --release -p radixgate-tokenize --example write_test_model -- DIR)
# and BIG_JSON (a chat body of about 22 MB, made as below) replaced by paths;
# ports 36300, 36350 and 36400 must be free.
#   python3 -c 'import json,random; random.seed(1); w="alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split(); print(json.dumps({"messages":[{"role":"user","content":" ".join(random.choice(w) for _ in range(4_000_000))}],"max_tokens":1}))' > BIG_JSON
B=$1
$B worker --port 36300 --tokenizer TOKENIZER_DIR --kv-events-endpoint tcp://127.0.0.1:36350 > /dev/null 2>&1 & WP=$!
sleep 1
$B serve --port 36400 --worker-urls http://127.0.0.1:36300 --kv-events --kv-events-port 36350 --tokenizer TOKENIZER_DIR > /dev/null 2>&1 & SP=$!
sleep 3
for i in 1 2 3; do curl -s -o /dev/null localhost:36400/v1/chat/completions -H 'content-type: application/json' -d '{"messages":[{"role":"user","content":"Hello world"}],"max_tokens":4}'; sleep 0.5; done
curl -s localhost:36400/v1/chat/completions -H 'content-type: application/json' -d '{"messages":[{"role":"user","content":"Hello world"}],"max_tokens":4}' -D - -o /dev/null | grep -i decision | cut -c1-120
c0=$(awk '{print $14+$15}' /proc/$SP/stat)
code=$(curl -s -o /dev/null -w "%{http_code}" localhost:36400/v1/chat/completions -H 'content-type: application/json' --data-binary @BIG_JSON)
c1=$(awk '{print $14+$15}' /proc/$SP/stat)
echo "$(basename $B): status $code, router CPU $(( (c1-c0) ))0 ms, $(grep VmHWM /proc/$SP/status)"
kill $SP $WP; wait $SP $WP 2>/dev/null
