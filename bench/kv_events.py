#!/usr/bin/env python3
"""Exact KV events for real: `radixgate serve` over simulated workers that
publish KV-cache events, in every routing mode, with smg as the reference
(docs/kv-events.md).

Each workload's working set exceeds the workers' KV caches, where what the
router remembers and what the workers hold part ways. For each workload and
each router in turn, fresh workers (empty caches) publish their stores and
evictions over ZeroMQ in the engines' wire format, tokenizing with the same
tokenizer as the router (the test tokenizer of radixgate-tokenize, written to
a model directory first), and `radixgate load --json` drives the same seeded
load. The rows:

- radixgate, approximate: cache_aware, its tree alone (correction off);
- radixgate, + correction: the tree corrected from each answer's
  `cached_tokens` (the default);
- radixgate, exact events: subscribed to every worker's events
  (`--kv-events --tokenizer`), correction on for workers without a live
  stream;
- smg, cache_aware (needs the peers' venv, see bench/README.md; left out
  with a note when it is missing).

Writes bench/results/<UTC date-time>-kv.{json,md}. Ports: 35000-35999.
Stopped part-way (Ctrl-C, a timeout's SIGTERM), it writes the rows
measured so far, with `interrupted` in its meta.
"""

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402
import report  # noqa: E402
from routers import PEERS, Router, _peer_module, _radixgate  # noqa: E402
from run import ROOT, HERE, repo_relative, run_load, start_router, start_workers  # noqa: E402

WORKER_PORT = 35100
EVENT_PORT = 35300   # worker i publishes on EVENT_PORT + i (or the next free block)

APPROX = "routing:\n  policy: cache_aware\n  correction:\n    enabled: false\n"


def workloads(trace: str, scale: float, speedup: float) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (`radixgate load` arguments, `radixgate worker` arguments)."""
    n = lambda x: str(max(20, int(x * scale)))  # noqa: E731
    return {
        # 128 groups x 4k tokens: a 512k-token working set over 4 x 100k.
        "shared-prefix-128x4k": (
            ["--workload", "shared-prefix", "--groups", "128", "--system-tokens", "4096",
             "--question-tokens", "128", "--output-tokens", "32", "--rate", "12",
             "--requests", n(600)],
            ["--kv-capacity-tokens", "100000"]),
        # The production trace as bench/run.py replays it (by default):
        # prompts average 14k tokens, the workers' caches hold a few of them.
        "mooncake-trace": (
            ["--workload", "trace", "--trace", trace, "--speedup", str(speedup),
             "--max-output-tokens", "64", "--requests", n(300)],
            []),
    }


def exact_router(binary: str, tokenizer: str, event_urls: dict[str, str]):
    """`radixgate serve` subscribed to each worker's publisher, whose
    endpoints are listed by worker URL in the config file."""
    def cmd(urls, port, tmp):
        conf = os.path.join(tmp, "radixgate.yaml")
        lines = ["routing:", "  policy: cache_aware", "kv_events:", "  endpoints:"]
        lines += [f"    {json.dumps(u)}: {json.dumps(event_urls[u])}" for u in urls]
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        return [binary, "serve", "--config", conf, "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warn", "--kv-events", "--tokenizer", tokenizer,
                "--worker-urls", *urls]
    return cmd


def kv_series(url: str) -> dict[str, float]:
    """The router's radixgate_kv_events_* series (live workers, requests
    matched on events or on the tree), to show a run really used events."""
    try:
        out = subprocess.run(["curl", "-s", url + "/metrics"], capture_output=True, text=True,
                             timeout=5).stdout
    except subprocess.SubprocessError:
        return {}
    series = {}
    for line in out.splitlines():
        if line.startswith("radixgate_kv_events_"):
            name, _, value = line.rpartition(" ")
            series[name] = float(value)
    return series


def matched(row: dict) -> str:
    """The share of requests an exact-events router matched on events."""
    kv = row.get("kv_series") or {}
    reqs = {k: v for k, v in kv.items() if k.startswith("radixgate_kv_events_requests_total")}
    total = sum(reqs.values())
    exact = sum(v for k, v in reqs.items() if '"exact"' in k)
    return f"{exact / total:.3f}" if total else ""


def cpu_per_request(row: dict) -> str:
    """The router's CPU per request answered, in ms (rows before it was
    measured have none)."""
    cpu, ok = row.get("router_cpu_s"), row["report"].get("ok")
    return f"{cpu * 1000 / ok:.3f}" if cpu is not None and ok else ""


def markdown(result: dict) -> str:
    m = result["meta"]
    out = ["# KV events for real: serve over simulated workers publishing events", "",
           f"`{m['command']}` at {m['started_utc']}, commit {m.get('git') or '?'}.",
           "Four workers per run, fresh for every row; the same seeded load.", "",
           "Router CPU: utime + stime of the router's process tree over the load (/proc), "
           "per request answered.", "",
           "| workload | router | mode | ok | failed | hit rate | mean TTFT ms | p90 TTFT ms | "
           "TTFT vs approximate | matched on events | router CPU ms/request |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for w in dict.fromkeys(r["workload"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["workload"] == w]
        base = next((r for r in rows if r["policy"] == "approximate"), None)
        b = (base or {}).get("report", {}).get("ttft_ms", {}).get("mean")
        for r in rows:
            rep = r["report"]
            t = rep.get("ttft_ms") or {}
            vs = (f"{(t['mean'] / b - 1) * 100:+.1f}%" if b and t.get("mean") is not None
                  else "")
            out.append(f"| {w} | {r['router']} | {r['policy']} | {rep['ok']} | {rep['failed']} | "
                       f"{report._f(rep.get('hit_rate'), '{:.3f}')} | {report._f(t.get('mean'))} | "
                       f"{report._f(t.get('p90'))} | {vs} | {matched(r)} | {cpu_per_request(r)} |")
    if m.get("skipped"):
        out += ["", "Left out: " + "; ".join(m["skipped"])]
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/radixgate"))
    p.add_argument("--tokenizer", help="model directory or tokenizer.json; default: write "
                   "the test tokenizer with radixgate-tokenize's write_test_model example")
    p.add_argument("--trace", default=os.path.join(ROOT, "traces", "mooncake_conversation.jsonl"))
    p.add_argument("--scale", type=float, default=1.0, help="multiplies request counts")
    p.add_argument("--speedup", type=float, default=2.5, help="the trace's time compression "
                   "(the test tokenizer makes about twice the simulated tokens of a prompt: "
                   "1.25 keeps the workers about as busy as bench/run.py's 2.5)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only-workload", action="append")
    p.add_argument("--only-mode", action="append",
                   help="approximate, + correction, exact events, cache_aware (smg)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    opts = p.parse_args()
    binary = os.path.abspath(opts.bin)
    if not os.path.exists(binary):
        sys.exit(f"no radixgate binary at {binary}: cargo build --release -p radixgate")
    tmp = tempfile.mkdtemp(prefix="radixgate-kv-bench-")
    tokenizer = opts.tokenizer
    if tokenizer is None:
        tokenizer = os.path.join(tmp, "test-model")
        subprocess.run(["cargo", "run", "--quiet", "--release", "-p", "radixgate-tokenize",
                        "--example", "write_test_model", "--", tokenizer], cwd=ROOT, check=True)
    tokenizer = os.path.abspath(tokenizer)

    skipped = []
    routers = [Router("radixgate", "approximate", _radixgate(binary, "cache_aware", APPROX)),
               Router("radixgate", "+ correction", _radixgate(binary, "cache_aware")),
               Router("radixgate", "exact events", None)]  # command set per run
    if os.path.exists(os.path.join(PEERS, "bin", "python")):
        routers.append(Router("smg", "cache_aware", _peer_module("smg.launch_router")))
    else:
        skipped.append(f"smg: no peers' venv at {PEERS}")
    if opts.only_mode:
        routers = [r for r in routers if r.policy in opts.only_mode]

    started = dt.datetime.now(dt.timezone.utc)
    # The tokenizer's directory is this machine's: recorded as DIR.
    argv = [("DIR" if a == opts.tokenizer else a) for a in sys.argv[1:]]
    meta = report.run_meta(binary, ["bench/kv_events.py", *argv], started)
    meta["peers"] = report.peer_versions()
    print(f"logs in {tmp}; load average {meta['loadavg_start']}", flush=True)
    rows = []
    interrupted = False
    report.stop_on_sigterm()
    try:
        for wname, (load_args, worker_args) in workloads(opts.trace, opts.scale, opts.speedup).items():
            if opts.only_workload and wname not in opts.only_workload:
                continue
            for router in routers:
                ev = procs.free_block(EVENT_PORT, 4)
                worker_args_now = [*worker_args, "--tokenizer", tokenizer,
                                   "--kv-events-endpoint", f"tcp://127.0.0.1:{ev}"]
                workers, urls = start_workers(binary, os.path.join(tmp, "workers.log"),
                                              WORKER_PORT, 4, worker_args_now)
                event_urls = {u: f"tcp://127.0.0.1:{ev + i}" for i, u in enumerate(urls)}
                if router.command is None:
                    router = Router(router.name, router.policy,
                                    exact_router(binary, tokenizer, event_urls))
                try:
                    scratch = os.path.join(tmp, router.policy.replace(" ", "-"))
                    proc, url, ports = start_router(router, urls, scratch,
                                                    os.path.join(tmp, f"router-{router.name}.log"))
                    try:
                        t0 = time.time()
                        cpu0 = procs.cpu_seconds(proc.pid)
                        rep = run_load(binary, [url], load_args + ["--pool-size", "4"], opts.seed)
                        cpu_s = procs.cpu_seconds(proc.pid) - cpu0
                        kv = kv_series(url) if router.policy == "exact events" else {}
                    finally:
                        procs.stop(proc)
                        procs.wait_port_free(ports)
                finally:
                    for w in workers:
                        procs.stop(w)
                    procs.wait_port_free([int(u.rsplit(":", 1)[1]) for u in urls])
                row = {"workload": wname, "router": router.name, "policy": router.policy,
                       "wall_s": round(time.time() - t0, 1),
                       "load_args": [repo_relative(a) for a in load_args],
                       "worker_args": worker_args, "kv_series": kv,
                       "router_cpu_s": round(cpu_s, 3),
                       "loadavg": os.getloadavg(), "report": rep}
                rows.append(row)
                print(report.quality_line(row), flush=True)
    except KeyboardInterrupt:
        # Stopped (Ctrl-C, a timeout's SIGTERM): the rows so far are kept.
        interrupted = True
        print(f"interrupted: writing the {len(rows)} rows measured", flush=True)
    finally:
        procs.stop_all()
    meta["interrupted"] = interrupted
    meta["skipped"] = skipped
    meta["loadavg_end"] = os.getloadavg()
    result = {"meta": meta, "rows": rows}
    report.write_result(opts.out, started, "kv", result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
