#!/usr/bin/env python3
"""A soak of radixgate: moderate load for a long time, with rotating worker
faults and hostile clients (see bench/README.md, "Soak").

Starts `radixgate worker --count N` (N simulated workers in one process, so
that a refusing worker's faults can be cleared through a sibling's
`/admin/workers/{i}/faults`) and `radixgate serve --policy cache_aware` with
a Prometheus port in front of them; then, for `--minutes`:

- open-loop requests at `--rate`, each classified answered / explicit error
  / lost (soak_load.py);
- every `--fault-period-secs`, one worker gets the next fault of the
  rotation and the previous one is cleared (the first period is clean);
- hostile clients beside the load (soak_hostile.py);
- the router's RSS, open fds and resilience metrics sampled every
  `--sample-secs` (soak_watch.py).

Then it clears the faults, lets in-flight requests end, waits for the
router's fds to settle, and writes bench/results/<UTC start>-soak.{json,md}.
Exit status 1 when a request was lost or RSS/fds grew beyond tolerance, 2
when the soak could not run. Ports: 36000-36999.
"""

import argparse
import datetime as dt
import json
import os
import resource
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402
import report  # noqa: E402
import soak_report  # noqa: E402
from run import ready_body  # noqa: E402
from soak_hostile import Hostile  # noqa: E402
from soak_load import Load  # noqa: E402
from soak_watch import Watcher, fd_breakdown  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER_PORT, ROUTER_PORT, LAST_PORT = 36000, 36500, 36999

# The rotation, in order: name -> the worker's fault knobs (faults.rs).
FAULTS = {"errors": {"error_rate": 0.5}, "refuse": {"refuse": True}, "hang": {"hang": True},
          "die": {"die_after_chunks": 2}, "unhealthy": {"unhealthy": True},
          "slow": {"latency_ms": 2000}}


class Rotation:
    """Puts one worker at a time into one fault, in turn, every `period` seconds."""

    def __init__(self, urls: list[str], faults: list[str], period: float, t0: float, seed: int):
        self.urls, self.faults, self.period, self.t0, self.seed = urls, faults, period, t0, seed
        self.phase = "none"
        self.timeline: list[dict] = []

    def post(self, worker: int, knobs: dict) -> str:
        # Through a sibling: a refusing worker's own listener is closed.
        sibling = self.urls[(worker + 1) % len(self.urls)]
        req = urllib.request.Request(f"{sibling}/admin/workers/{worker}/faults",
                                     data=json.dumps(knobs).encode(),
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return f"{resp.status}"
        except Exception as err:  # noqa: BLE001 - recorded in the timeline
            return f"failed: {err}"

    def change(self, worker: int | None, fault: str | None, prev: int | None) -> None:
        if prev is not None:
            self.post(prev, {})
        knobs = {}
        if fault is not None:
            knobs = dict(FAULTS[fault], seed=self.seed + len(self.timeline))
            answer = self.post(worker, knobs)
            self.phase = f"{fault}@w{worker}"
        else:
            answer = "cleared"
            self.phase = "none"
        entry = {"t": round(time.monotonic() - self.t0, 1),
                 "utc": dt.datetime.now(dt.timezone.utc).strftime("%H:%M:%S"),
                 "phase": self.phase, "cleared": prev, "knobs": knobs, "answer": answer}
        self.timeline.append(entry)
        print(f"[fault {entry['t']:7.1f}s {entry['utc']}] {self.phase} (cleared w{prev}) {answer}",
              flush=True)

    def run(self, stop: threading.Event) -> None:
        i, prev = 0, None
        while self.faults and not stop.wait(self.period):
            worker = i % len(self.urls)
            self.change(worker, self.faults[i % len(self.faults)], prev)
            prev, i = worker, i + 1
        if prev is not None:
            self.change(None, None, prev)


def start_workers(binary: str, count: int, log: str):
    for attempt in range(5):
        port = procs.free_block(WORKER_PORT + 10 * attempt, count, last=ROUTER_PORT - 1)
        cmd = [binary, "worker", "--port", str(port), "--count", str(count)]
        proc = procs.start(cmd, log)
        urls = [f"http://127.0.0.1:{port + i}" for i in range(count)]
        try:
            for u in urls:
                procs.wait_http(u + "/health", timeout=20, alive=proc)
            return proc, urls, cmd
        except RuntimeError as err:
            print(f"workers on {port}: {err}; retrying", file=sys.stderr)
            procs.stop(proc)
    raise RuntimeError("could not start workers")


def serve_command(opts, binary: str, port: int, urls: list[str]) -> list[str]:
    return [binary, "serve", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-port", str(port + 1), "--policy", "cache_aware",
            "--log-level", "warn",
            *(["--request-timeout-secs", str(opts.request_timeout_secs)]
              if opts.request_timeout_secs is not None else []),
            "--max-payload-size", str(opts.max_payload),
            "--max-tree-size", str(opts.max_tree_size),
            "--eviction-interval-secs", str(opts.eviction_interval_secs),
            *opts.serve_arg, "--worker-urls", *urls]


def start_router(opts, binary: str, urls: list[str], log: str):
    for attempt in range(5):
        port = procs.free_block(ROUTER_PORT + 10 * attempt, 2, last=LAST_PORT)
        cmd = serve_command(opts, binary, port, urls)
        proc = procs.start(cmd, log)
        try:
            procs.wait_http(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                            body=ready_body(), alive=proc)
            return proc, port, cmd
        except RuntimeError as err:
            print(f"router on {port}: {err}; retrying", file=sys.stderr)
            procs.stop(proc)
    raise RuntimeError("could not start the router")


def settle_fds(watcher: Watcher, baseline: int, slack: int, wait: float) -> dict:
    """Samples until the router's fds are back within `slack` of `baseline`, or `wait` ends."""
    deadline = time.monotonic() + wait
    while True:
        s = watcher.sample("after drain")
        if s.get("fds") is None or s["fds"] <= baseline + slack or time.monotonic() > deadline:
            return s
        time.sleep(2.0)


def repo_relative(value):
    """`value` with this checkout's absolute path cut from every string."""
    root = os.path.dirname(HERE) + os.sep
    if isinstance(value, str):
        return value.replace(root, "")
    if isinstance(value, list):
        return [repo_relative(v) for v in value]
    if isinstance(value, dict):
        return {k: repo_relative(v) for k, v in value.items()}
    return value


def soak(opts) -> dict:
    binary = os.path.abspath(opts.bin)
    tmp = tempfile.mkdtemp(prefix="radixgate-soak-")
    started = dt.datetime.now(dt.timezone.utc)
    meta = report.run_meta(binary, ["bench/soak.py", *sys.argv[1:]], started)
    meta["nofile_limit"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    meta["binary"] = binary
    meta["binary_mtime_utc"] = dt.datetime.fromtimestamp(
        os.path.getmtime(binary), dt.timezone.utc).isoformat(timespec="seconds")
    meta["options"] = vars(opts)
    print(f"logs in {tmp}; load average {meta['loadavg_start']}", flush=True)

    workers, urls, meta["worker_command"] = start_workers(binary, opts.workers,
                                                          os.path.join(tmp, "workers.log"))
    router, port, meta["router_command"] = start_router(opts, binary, urls,
                                                        os.path.join(tmp, "router.log"))
    print("router: " + " ".join(meta["router_command"]), flush=True)
    t0 = time.monotonic()
    rotation = Rotation(urls, opts.faults, opts.fault_period_secs, t0, opts.seed)
    load = Load(port, opts.rate, opts.seed, opts.client_timeout_secs, opts.max_in_flight,
                opts.groups, opts.system_chars, t0, lambda: rotation.phase)
    hostile = Hostile(port, opts.max_payload, opts.slowloris, opts.idle_conns,
                      opts.hostile_hold_secs) if opts.hostile else None
    watcher = Watcher(router.pid, f"http://127.0.0.1:{port + 1}/metrics", opts.sample_secs, t0,
                      status=lambda: {"load": load.counts(), "phase": rotation.phase})
    baseline = watcher.sample("before load")

    stop = threading.Event()
    threads = [threading.Thread(target=load.run, args=(stop,), name="load", daemon=True),
               threading.Thread(target=rotation.run, args=(stop,), name="faults", daemon=True)]
    watcher.start()
    if hostile:
        hostile.start()
    for th in threads:
        th.start()
    end = t0 + opts.minutes * 60
    try:
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, opts.progress_secs))
            s = watcher.samples[-1]
            c = load.counts()
            print(f"[{time.monotonic() - t0:7.1f}s] sent={c['sent']} answered={c['answered']} "
                  f"errors={c['error']} lost={c['lost']} running={c['running']} "
                  f"rss={(s.get('rss_kib') or 0) / 1024:.1f}MiB fds={s.get('fds')} "
                  f"phase={rotation.phase} load={os.getloadavg()[0]:.2f}", flush=True)
            if router.poll() is not None:
                print(f"router exited with {router.returncode}", flush=True)
                break
            if workers.poll() is not None:
                print(f"workers exited with {workers.returncode}", flush=True)
                break
        meta["load_secs"] = round(time.monotonic() - t0, 1)
        stop.set()
        watcher.label = "draining"
        for th in threads:
            th.join()
        hostile_out = hostile.finish() if hostile else {}
        stuck = load.join()
        watcher.finish()
        watcher.sample("after load")
        drained = settle_fds(watcher, baseline.get("fds") or 0, opts.fd_slack, opts.drain_secs)
        drained["fd_kinds"] = fd_breakdown(router.pid, {port, port + 1},
                                           {int(u.rsplit(":", 1)[1]) for u in urls})
        meta["router_exit"] = router.poll()
    finally:
        procs.stop_all()
    meta["loadavg_end"] = os.getloadavg()
    meta["finished_utc"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    result = {"meta": meta, "records": load.records, "skipped": load.skipped,
              "client_stuck": stuck, "samples": watcher.samples, "baseline": baseline,
              "drained": drained, "timeline": rotation.timeline, "hostile": hostile_out}
    result["summary"] = soak_report.summarize(result, opts)
    return result


COLUMNS = ["id", "t", "kind", "phase", "class", "status", "ms", "reason"]


def write_json(path: str, result: dict) -> None:
    """The result, with one line per request (a row of COLUMNS) and per sample."""
    out = dict(result)
    records = out.pop("records")
    out["request_columns"] = COLUMNS
    out["requests"] = [[r.get(c) for c in COLUMNS] for r in records]
    with open(path, "w") as f:
        f.write("{\n")
        for i, (key, value) in enumerate(out.items()):
            if key in ("requests", "samples"):
                body = "[\n" + ",\n".join(json.dumps(x, separators=(",", ":")) for x in value) + "\n]"
            else:
                body = json.dumps(value, indent=1)
            f.write(f"{json.dumps(key)}: {body}{',' if i < len(out) - 1 else ''}\n")
        f.write("}\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/radixgate"))
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=20.0, help="requests per second (Poisson)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--fault-period-secs", type=float, default=60.0)
    p.add_argument("--faults", type=lambda s: [f for f in s.split(",") if f],
                   default=list(FAULTS), help=f"rotation order, from {','.join(FAULTS)}")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--groups", type=int, default=8, help="shared-prefix groups")
    p.add_argument("--system-chars", type=int, default=2000, help="shared prefix length")
    p.add_argument("--client-timeout-secs", type=float, default=90.0,
                   help="per request; past it a request counts as hung (lost)")
    p.add_argument("--max-in-flight", type=int, default=512)
    p.add_argument("--request-timeout-secs", type=int, default=None,
                   help="the router's end-to-end timeout (default: the router's own); its "
                   "first-byte and stall timeouts, breaker and outlier detection are the defaults")
    p.add_argument("--max-payload", type=int, default=8 << 20, help="the router's body limit")
    p.add_argument("--max-tree-size", type=int, default=200_000,
                   help="the router's tree characters per worker (reached within minutes)")
    p.add_argument("--eviction-interval-secs", type=int, default=30)
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra `radixgate serve` argument (repeat; use --serve-arg=--flag)")
    p.add_argument("--no-hostile", dest="hostile", action="store_false")
    p.add_argument("--slowloris", type=int, default=8, help="slowloris connections")
    p.add_argument("--idle-conns", type=int, default=32, help="idle keep-alive connections")
    p.add_argument("--hostile-hold-secs", type=float, default=120.0)
    p.add_argument("--sample-secs", type=float, default=5.0)
    p.add_argument("--progress-secs", type=float, default=30.0)
    p.add_argument("--rss-tolerance", type=float, default=0.25,
                   help="allowed RSS growth, first to last 10%% (fraction; at least 16 MiB)")
    p.add_argument("--fd-slack", type=int, default=16,
                   help="allowed fds above the pre-load count once drained")
    p.add_argument("--drain-secs", type=float, default=200.0,
                   help="after the load, how long to wait for the fds to settle (the router "
                        "keeps idle worker connections 90 s)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    opts = p.parse_args()
    unknown = [f for f in opts.faults if f not in FAULTS]
    if unknown or opts.workers < 2:
        sys.exit(f"unknown faults {unknown}" if unknown else "--workers must be at least 2")
    if not os.path.exists(opts.bin):
        sys.exit(f"no radixgate binary at {opts.bin}: cargo build --release -p radixgate")
    try:
        result = soak(opts)
    except RuntimeError as err:
        print(f"soak could not run: {err}", file=sys.stderr)
        return 2
    stem = report.result_stem(opts.out, dt.datetime.fromisoformat(result["meta"]["started_utc"]),
                              "soak")
    # Results are kept in the repo: paths in them are the repo's, not this
    # machine's.
    result = repo_relative(result)
    write_json(stem + ".json", result)
    with open(stem + ".md", "w") as f:
        f.write(soak_report.markdown(result))
    verdict = result["summary"]["verdict"]
    print(soak_report.closing_lines(result))
    print(f"wrote {stem}.md and .json")
    return 0 if verdict["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
