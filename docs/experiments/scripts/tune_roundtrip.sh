#!/usr/bin/env bash
# The record -> tune -> re-run round trip of docs/record-and-tune.md, on
# simulated workers:
#   1. radixgate serve with deliberately bad routing settings
#      (cache_threshold 0.95, balance_abs_threshold 0), recording the
#      traffic (--record-trace), in front of 4 fresh simulated workers,
#      driven by radixgate load;
#   2. radixgate tune on that recording (--config the bad settings, the
#      workers' model given with the same engine flags);
#   3. radixgate serve with the config lines tune printed, fresh workers,
#      the same workload and seed;
#   4. both runs side by side (summary.md).
# Ports 29710-29713 (workers) and 29720 (router): below Linux's ephemeral
# range (32768-60999), where a client connection's local port can block a
# listener from binding.
# Usage: tune_roundtrip.sh OUTDIR
set -eu
B=${RADIXGATE:-target/release/radixgate}
OUT=$1
mkdir -p "$OUT"
ENGINE="--kv-capacity-tokens 24000"
WL="--workload shared-prefix --groups 32 --zipf 0.8 --system-tokens 2048 --question-tokens 128 --output-tokens 32"
ARR="--rate 40 --requests 2000 --seed 7"
URLS="http://127.0.0.1:29710 http://127.0.0.1:29711 http://127.0.0.1:29712 http://127.0.0.1:29713"

cat > "$OUT/bad.yaml" <<'EOF'
# Deliberately bad: a hit needs 95% of the prompt matched (a group's
# system prompt is 94% of it), and any difference in load counts as
# imbalance (every request goes to the least-loaded worker).
routing:
  cache_threshold: 0.95
  balance_abs_threshold: 0
EOF

# run NAME CONFIG [SERVE FLAGS...]: fresh workers, the router, the load.
run() {
  local name=$1 config=$2
  shift 2
  $B worker --port 29710 --count 4 $ENGINE >"$OUT/$name-workers.log" 2>&1 &
  local wp=$!
  $B serve --port 29720 --config "$config" --worker-urls $URLS "$@" >"$OUT/$name-serve.log" 2>&1 &
  local sp=$!
  # Until the router has admitted all four workers (at most 30 s).
  for _ in $(seq 300); do
    curl -s localhost:29720/readiness | grep -q '"healthy_workers":4' && break
    sleep 0.1
  done
  curl -s localhost:29720/readiness | grep -q '"healthy_workers":4' || {
    echo "$name: the router did not admit 4 workers; see $OUT/$name-*.log" >&2
    kill "$sp" "$wp" 2>/dev/null
    exit 1
  }
  {
    echo "\$ radixgate worker --port 29710 --count 4 $ENGINE"
    echo "\$ radixgate serve --port 29720 --config $config --worker-urls $URLS $*"
    echo "\$ radixgate load --url http://127.0.0.1:29720 $WL $ARR"
  } >"$OUT/$name.cmd"
  $B load --url http://127.0.0.1:29720 $WL $ARR --no-progress --json >"$OUT/$name.json"
  kill "$sp"
  wait "$sp" 2>/dev/null || true
  kill "$wp"
  wait "$wp" 2>/dev/null || true
}

rm -f "$OUT"/recording.jsonl*
run bad "$OUT/bad.yaml" --record-trace "$OUT/recording.jsonl"

echo "\$ radixgate tune --trace $OUT/recording.jsonl --config $OUT/bad.yaml $ENGINE" >"$OUT/tune.cmd"
$B tune --trace "$OUT/recording.jsonl" --config "$OUT/bad.yaml" $ENGINE >"$OUT/tune.txt"
$B tune --trace "$OUT/recording.jsonl" --config "$OUT/bad.yaml" $ENGINE --json >"$OUT/tune.json"
python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
t = json.load(open(f"{out}/tune.json"))
if not t["config"]:
    sys.exit("tune found nothing better than the bad settings")
open(f"{out}/tuned.yaml", "w").write(t["config"])
EOF

run tuned "$OUT/tuned.yaml"

python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, sys
out = sys.argv[1]
t = json.load(open(f"{out}/tune.json"))
rows = []
for name in ["bad", "tuned"]:
    r = json.load(open(f"{out}/{name}.json"))
    rows.append((name, r))
print("| run | settings | requests ok | hit rate | TTFT mean ms | TTFT p50 | TTFT p99 | E2E mean ms |")
print("|---|---|---|---|---|---|---|---|")
labels = {"bad": t["current"]["label"], "tuned": t["best"]["label"]}
for name, r in rows:
    f = r["ttft_ms"]
    print(f"| {name} | {labels[name]} | {r['ok']} | {r['hit_rate']*100:.1f}% | {f['mean']:.1f} | "
          f"{f['p50']:.1f} | {f['p99']:.1f} | {r['e2e_ms']['mean']:.1f} |")
(_, b), (_, a) = rows
print()
print(f"tune predicted (simulated): hit rate {t['current']['hit_rate']*100:.1f}% -> "
      f"{t['best']['hit_rate']*100:.1f}%, mean TTFT {t['current']['ttft_mean_ms']:.1f} -> "
      f"{t['best']['ttft_mean_ms']:.1f} ms ({t['ttft_change_pct']:+.1f}%)")
print(f"measured (real re-run): hit rate {b['hit_rate']*100:.1f}% -> {a['hit_rate']*100:.1f}%, "
      f"mean TTFT {b['ttft_ms']['mean']:.1f} -> {a['ttft_ms']['mean']:.1f} ms "
      f"({(a['ttft_ms']['mean']/b['ttft_ms']['mean']-1)*100:+.1f}%)")
p = t.get("prediction")
if p:
    worst = max(abs(w["simulated_hit_rate"] - w["recorded_hit_rate"]) for w in p["workers"])
    print(f"prediction check on the recording: recorded hit rate {p['recorded_hit_rate']*100:.1f}%, "
          f"pinned replay {p['simulated_hit_rate']*100:.1f}%, worst worker off by {worst*100:.1f} points")
beat = a["ttft_ms"]["mean"] < b["ttft_ms"]["mean"] and a["hit_rate"] >= b["hit_rate"]
print(f"tuned beats bad (lower mean TTFT, hit rate not worse): {'yes' if beat else 'NO'}")
EOF
