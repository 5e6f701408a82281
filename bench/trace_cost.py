#!/usr/bin/env python3
"""What request ids and tracing cost: router CPU time per request.

    python3 bench/trace_cost.py --requests 6000 --rate 1000 --repeats 5 \\
        --base-binary PATH/TO/radixgate-of-main [--stream]

Two instant simulated workers; one `serve` at a time in front of them, each
variant started fresh and given the same load (`radixgate load`, open loop
at a fixed rate, same seed and count, bench/run.py's cost workload: ~4 KiB
chat prompts in 16 groups, 16 output tokens, whole answers or with
`--stream` streamed):

- `off`: this build, no `--otlp-endpoint` (request ids and the log span
  only);
- `otlp`: this build, exporting every request's spans to a loopback OTLP
  sink started here (a minimal HTTP server that answers every POST with
  200 and counts what it got: it does not decode);
- `base`: another build (`--base-binary`, e.g. main's), no tracing.

The router's CPU (utime + stime from /proc/PID/stat, as bench/sync_cost.py
reads it) is read before and after the load; the report gives each run's
CPU microseconds per answered request, then per variant the median of the
repeats, its ratio to `off`, and the median over repeats of each repeat's
own ratio to `off` (the variants of a repeat run back to back, in a
rotating order, so a drift in the machine's load hits them alike).

Only processes started here are stopped, by their ids (bench/procs.py).
"""

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402
from run import start_workers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Sink(http.server.ThreadingHTTPServer):
    """Accepts OTLP/HTTP posts and discards them, counting posts and bytes."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        # A router stopped between runs resets its pooled connections.
        pass

    def __init__(self):
        self.posts = 0
        self.bytes = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), SinkHandler)


class SinkHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 - the http.server name
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        with self.server.lock:
            self.server.posts += 1
            self.server.bytes += len(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_args):
        pass


def run_once(args, tmp, name, binary, extra, workers) -> dict:
    port = procs.free_block(32100, 1)
    cmd = [binary, "serve", "--port", str(port), "--worker-urls", *workers, *extra]
    proc = procs.start(cmd, os.path.join(tmp, f"router-{name}.log"))
    url = f"http://127.0.0.1:{port}"
    procs.wait_http(url + "/readiness", alive=proc)
    # bench/run.py's cost workload: ~4 KiB chat prompts, 16 output tokens.
    load = [args.binary, "load", "--url", url, "--workload", "shared-prefix",
            "--groups", "16", "--system-tokens", "900", "--question-tokens", "100",
            "--output-tokens", "16", "--requests", str(args.requests),
            "--rate", str(args.rate), "--seed", str(args.seed), "--json", "--no-progress"]
    if not args.stream:
        load.append("--no-stream")
    before = procs.cpu_seconds(proc.pid)
    out = subprocess.run(load, capture_output=True, text=True, check=True)
    after = procs.cpu_seconds(proc.pid)
    procs.stop(proc)
    procs.wait_port_free([port])
    report = json.loads(out.stdout)
    cpu = after - before
    return {"variant": name, "cpu_s": round(cpu, 3), "ok": report["ok"],
            "failed": report["failed"],
            "cpu_us_per_req": round(cpu / report["ok"] * 1e6, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/radixgate"))
    ap.add_argument("--base-binary", help="a build to compare with, run without tracing")
    ap.add_argument("--stream", action="store_true",
                    help="streamed answers (16 events each) instead of whole ones")
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="off,otlp,base",
                    help="which of off, otlp, base to run (comma-separated)")
    args = ap.parse_args()
    print(f"# {' '.join(sys.argv)}", flush=True)

    sink = Sink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    collector = f"http://127.0.0.1:{sink.server_address[1]}"
    variants = [("off", args.binary, []),
                ("otlp", args.binary, ["--otlp-endpoint", collector])]
    if args.base_binary:
        variants.append(("base", args.base_binary, []))
    variants = [v for v in variants if v[0] in args.variants.split(",")]

    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="radixgate-trace-cost-") as tmp:
        started, workers = start_workers(args.binary, os.path.join(tmp, "workers.log"),
                                         31000, 2, ["--instant"])
        for rep in range(args.repeats):
            turn = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for name, binary, extra in turn:
                row = run_once(args, tmp, name, binary, extra, workers)
                row["repeat"] = rep
                runs.append(row)
                print(json.dumps(row), flush=True)
        for proc in started:
            procs.stop(proc)
    sink.shutdown()

    medians = {name: statistics.median(r["cpu_us_per_req"] for r in runs if r["variant"] == name)
               for name, _, _ in variants}
    # Each repeat's variants ran back to back: their ratio within the
    # repeat is less exposed to the machine's drift than the medians are.
    paired = {}
    for name, _, _ in variants:
        ratios = []
        for rep in range(args.repeats):
            row = {r["variant"]: r["cpu_us_per_req"] for r in runs if r["repeat"] == rep}
            if "off" in row and name in row:
                ratios.append(row[name] / row["off"])
        if ratios:
            paired[name] = round(statistics.median(ratios), 3)
    summary = {
        "cpu_us_per_req_median": medians,
        "median_of_paired_ratios_to_off": paired,
        "ratio_to_off": {name: round(m / medians["off"], 3) for name, m in medians.items()
                         if "off" in medians},
        "failed": sum(r["failed"] for r in runs),
        "otlp_posts": sink.posts,
        "otlp_bytes": sink.bytes,
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
