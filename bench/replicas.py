#!/usr/bin/env python3
"""radixgate as 1, 2 and 4 router replicas, with and without sync over NATS
(see bench/README.md, "Replicas").

For each routing-quality workload and each setting (1 router; N replicas
without sync; N replicas with `--sync-url` to a real `nats-server`), fresh
simulated workers, a fresh `nats-server -js` where sync is on, and the
replicas (`radixgate serve --policy cache_aware`, or `--policy`) in front of the same
workers; `radixgate load --json` spreads the workload over the replicas
(`--assign`, round-robin by default). Measured per run: hit rate and TTFT
as the load tool reports them, router CPU (utime+stime of every replica's
process tree, summed, from /proc before and after the load), and the sync
traffic from the replicas' `/metrics` (`radixgate_sync_bytes_sent_total`
and `radixgate_sync_bytes_received_total`, summed, before and after).
Writes bench/results/<UTC start>-replicas.{json,md}. Ports: 35000-35999.
Stopped part-way (Ctrl-C, a timeout's SIGTERM), it writes the rows
measured so far, with `interrupted` in its meta.
"""

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402
import report  # noqa: E402
from run import (QUALITY_WORKER_PORT, ROOT, missing_worker_flags,  # noqa: E402
                 quality_workloads, ready_body, repo_relative, run_load, start_workers)

REPLICA_PORT = 35600  # replicas from here, one port each
NATS_PORT = 35400
SYNC_BYTES = ("radixgate_sync_bytes_sent_total", "radixgate_sync_bytes_received_total")


def has_sync_flags(binary: str) -> bool:
    """Whether this binary's `radixgate serve` takes --sync-url."""
    out = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True).stdout
    return re.search(r"--sync-url(?![\w-])", out) is not None


def metric_sum(url: str, names: tuple[str, ...]) -> float:
    """Sum over every series of `names` in the Prometheus text at `url`/metrics
    (0 when absent: the replica has not sent or received yet)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = re.split(r"[{\s]", line, maxsplit=1)[0]
        if name in names:
            total += float(line.rsplit(" ", 1)[1])
    return total


class Replicas:
    def __init__(self, opts):
        self.opts = opts
        self.binary = os.path.abspath(opts.bin)
        self.tmp = tempfile.mkdtemp(prefix="radixgate-replicas-")
        self.sync = has_sync_flags(self.binary) and not opts.no_sync_only
        self.nats = shutil.which("nats-server")
        self.notes: list[str] = []
        # Rows as each run ends: kept when the bench is stopped part-way.
        self.rows: list[dict] = []
        if not has_sync_flags(self.binary):
            self.notes.append("this `radixgate serve` has no --sync-url: runs with sync skipped")
        elif self.sync and not self.nats:
            self.notes.append("no `nats-server` on PATH: runs with sync skipped")
            self.sync = False

    def log(self, name: str) -> str:
        return os.path.join(self.tmp, f"{name}.log")

    def settings(self) -> list[tuple[int, bool]]:
        """(replicas, sync) in table order: 1 router first (the reference)."""
        out = []
        for n in self.opts.replicas:
            if n == 1:
                out.append((1, False))
                continue
            out.append((n, False))
            if self.sync:
                out.append((n, True))
        return out

    def start_workers(self, count: int, per_worker: dict[int, list[str]]):
        return start_workers(self.binary, self.log("workers"), QUALITY_WORKER_PORT, count, [],
                             per_worker)

    def start_nats(self, jetstream: bool = True):
        """A fresh nats-server with JetStream (or, `jetstream=False`,
        without: the replicas then sync over core NATS only, with no warm
        start) on a free loopback port."""
        for attempt in range(5):
            port = procs.free_block(NATS_PORT + 10 * attempt, 1)
            store = tempfile.mkdtemp(prefix="nats-", dir=self.tmp)
            js = ["-js", "-sd", store] if jetstream else []
            proc = procs.start([self.nats, "-a", "127.0.0.1", "-p", str(port), *js],
                               self.log("nats"))
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and proc.poll() is None:
                if procs.port_open(port):
                    return proc, port
                time.sleep(0.1)
            print(f"nats-server on {port} did not start; retrying", file=sys.stderr)
            procs.stop(proc)
        raise RuntimeError("could not start nats-server")

    def start_replicas(self, n: int, urls: list[str], nats_port: int | None, cluster: str):
        """`n` replicas on a free block of ports, each ready (a chat completion
        answered 200 and /readiness 200). Returns (processes, URLs)."""
        for attempt in range(5):
            port = procs.free_block(REPLICA_PORT + 10 * attempt, n)
            started = []
            for i in range(n):
                cmd = [self.binary, "serve", "--host", "127.0.0.1", "--port", str(port + i),
                       "--policy", self.opts.policy, "--log-level", "warn"]
                if nats_port is not None:
                    cmd += ["--sync-url", f"nats://127.0.0.1:{nats_port}",
                            "--sync-cluster", cluster]
                cmd += self.opts.serve_arg
                cmd += ["--worker-urls", *urls]
                started.append(procs.start(cmd, self.log(f"replica-{i}")))
            targets = [f"http://127.0.0.1:{port + i}" for i in range(n)]
            try:
                for t, proc in zip(targets, started):
                    procs.wait_http(t + "/readiness", timeout=90, alive=proc)
                    procs.wait_http(t + "/v1/chat/completions", timeout=90, body=ready_body(),
                                    alive=proc)
                time.sleep(1.0)  # let a first health round settle
                return started, targets
            except RuntimeError as err:
                print(f"replicas on {port}: {err}; retrying", file=sys.stderr)
                for proc in started:
                    procs.stop(proc)
        raise RuntimeError(f"could not start {n} replicas")

    def run_one(self, wname: str, wl, n: int, sync: bool) -> dict:
        workers, urls = self.start_workers(4, wl.per_worker)
        nats = None
        replicas: list = []
        try:
            nats_port = None
            if sync:
                nats, nats_port = self.start_nats()
            replicas, targets = self.start_replicas(n, urls, nats_port, f"bench-{wname}")
            extra = ["--assign", self.opts.assign, "--pool-size", str(len(urls)),
                     *self.opts.load_arg]
            cpu0 = sum(procs.cpu_seconds(p.pid) for p in replicas)
            bytes0 = sum(metric_sum(t, SYNC_BYTES) for t in targets)
            t0 = time.time()
            # --drive N: the load goes to the first N replicas only; the
            # others run, sync and route nothing.
            driven = targets[:self.opts.drive] if self.opts.drive else targets
            rep = run_load(self.binary, driven, wl.load + extra, self.opts.seed)
            wall = time.time() - t0
            cpu1 = sum(procs.cpu_seconds(p.pid) for p in replicas)
            bytes1 = sum(metric_sum(t, SYNC_BYTES) for t in targets)
        finally:
            for proc in replicas:
                procs.stop(proc)
            if nats is not None:
                procs.stop(nats)
            for proc in workers:
                procs.stop(proc)
            procs.wait_port_free([int(u.rsplit(":", 1)[1]) for u in urls])
        ok = rep["ok"]
        ttft = rep.get("ttft_ms") or {}
        return {"workload": wname, "replicas": n, "sync": sync,
                "ok": ok, "failed": rep["failed"], "hit_rate": rep["hit_rate"],
                "ttft_mean_ms": ttft.get("mean"), "ttft_p99_ms": ttft.get("p99"),
                "cpu_s": round(cpu1 - cpu0, 3),
                "cpu_ms_per_req": (cpu1 - cpu0) / ok * 1000 if ok else None,
                "sync_bytes": bytes1 - bytes0,
                "sync_bytes_per_req": (bytes1 - bytes0) / ok if ok else None,
                "per_url": rep["per_url"], "wall_s": round(wall, 1),
                "load_args": [repo_relative(a) for a in wl.load + extra],
                "loadavg": os.getloadavg(), "report": rep}

    def run(self) -> list[dict]:
        rows = self.rows
        workloads = quality_workloads(self.opts.trace, self.opts.scale, self.opts.spread_bursts)
        for wname, wl in workloads.items():
            if self.opts.only_workload and wname not in self.opts.only_workload:
                continue
            if missing := missing_worker_flags(self.binary, wl.per_worker):
                self.notes.append(f"{wname}: this `radixgate worker` has no {', '.join(missing)}")
                continue
            for n, sync in self.settings():
                row = self.run_one(wname, wl, n, sync)
                rows.append(row)
                print(line(row), flush=True)
        return rows


def _f(x, fmt="{:.1f}"):
    return "–" if x is None else fmt.format(x)


def setting(row) -> str:
    if row["replicas"] == 1:
        return "1 router"
    return f"{row['replicas']} replicas, " + ("sync" if row["sync"] else "no sync")


def line(row) -> str:
    return (f"[replicas] {row['workload']:15} {setting(row):22} ok={row['ok']} "
            f"failed={row['failed']} hit={_f(row['hit_rate'], '{:.3f}')} "
            f"ttft_mean={_f(row['ttft_mean_ms'])} cpu_ms/req={_f(row['cpu_ms_per_req'], '{:.3f}')} "
            f"sync_B/req={_f(row['sync_bytes_per_req'], '{:.0f}')}")


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row with its ratios: hit rate and mean TTFT against the mean of
    the 1-router rows of its workload (`--replicas 1,4,1` runs one router
    before and after the replicas, so that a drift over the runs weighs on
    both sides), CPU per request against the same replica count without
    sync (for sync rows)."""
    def mean_of(rows: list[dict], key: str):
        vals = [x[key] for x in rows if x[key] is not None]
        return sum(vals) / len(vals) if vals else None

    out = []
    for r in rows:
        same = [x for x in rows if x["workload"] == r["workload"]]
        ones = [x for x in same if x["replicas"] == 1]
        plain = next((x for x in same if x["replicas"] == r["replicas"] and not x["sync"]), None)
        out.append(r | {
            "hit_vs_1": ratio(r["hit_rate"], mean_of(ones, "hit_rate")),
            "ttft_vs_1": ratio(r["ttft_mean_ms"], mean_of(ones, "ttft_mean_ms")),
            "cpu_vs_no_sync": ratio(r["cpu_ms_per_req"], plain and plain["cpu_ms_per_req"])
            if r["sync"] else None,
        })
    return out


def markdown(result) -> str:
    meta = result["meta"]
    out = [f"# radixgate replicas, {meta['started_utc']}", "",
           f"`{meta['command']}` — git {meta['git']}, {meta['radixgate']}, "
           f"{meta['cpus']} CPUs, load average at start {meta['loadavg_start'][0]:.2f}; "
           f"requests spread over the replicas with `--assign {result['assign']}`, "
           f"seed {result['seed']}, scale {result['scale']}.", ""]
    for note in result["notes"]:
        out.append(f"- {note}")
    if result["notes"]:
        out.append("")
    out += ["| workload | setting | ok | failed | hit rate | ×1 router | TTFT mean ms | ×1 router "
            "| TTFT p99 ms | router CPU ms/req | ×no sync | sync bytes/req |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        out.append(
            f"| {r['workload']} | {setting(r)} | {r['ok']} | {r['failed']} "
            f"| {_f(r['hit_rate'], '{:.3f}')} | {_f(r['hit_vs_1'], '{:.3f}')} "
            f"| {_f(r['ttft_mean_ms'])} | {_f(r['ttft_vs_1'], '{:.3f}')} "
            f"| {_f(r['ttft_p99_ms'])} | {_f(r['cpu_ms_per_req'], '{:.3f}')} "
            f"| {_f(r['cpu_vs_no_sync'], '{:.3f}')} | {_f(r['sync_bytes_per_req'], '{:.0f}')} |")
    out += ["", "Targets (issue 15): with sync, hit rate ≥ 0.98× and mean TTFT ≤ 1.05× "
            "one router's; router CPU per request ≤ 1.15× the same replicas without sync. "
            "CPU is every replica's process tree, summed; the load tool, the workers and "
            "nats-server share the same cores.", ""]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/radixgate"))
    p.add_argument("--replicas", default="1,2,4",
                   type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                   help="replica counts, comma-separated, run in this order (1 = the single-router "
                        "reference; given twice, as in 1,4,1, the ratios use the mean of its runs)")
    p.add_argument("--no-sync-only", action="store_true",
                   help="run only 1 router and the replicas without sync")
    p.add_argument("--assign", default="round-robin",
                   choices=["round-robin", "by-session", "by-group", "client-hash"],
                   help="how the load tool spreads requests over the replicas")
    p.add_argument("--only-workload", action="append", default=[])
    p.add_argument("--policy", default="cache_aware",
                   help="the replicas' policy; round_robin, whose decisions nothing synced "
                        "changes, with --no-sync-only, shows what running N router processes "
                        "on these cores costs TTFT by itself")
    p.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--drive", type=int, default=0,
                   help="send the load to the first N replicas only (the rest run, sync and "
                        "route nothing): what sync and the extra processes cost, apart from "
                        "splitting the decisions")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="one more argument for every `radixgate serve` (repeatable), "
                        "e.g. --serve-arg=--config --serve-arg=FILE")
    p.add_argument("--load-arg", action="append", default=[],
                   help="one more argument for `radixgate load` (repeatable), e.g. "
                        "--load-arg=--no-stream (whole answers: no TTFT, hit rate only)")
    p.add_argument("--trace", default=os.path.join(ROOT, "traces/mooncake_conversation.jsonl"))
    p.add_argument("--spread-bursts", action="store_true",
                   help="mooncake-trace: requests sharing a timestamp arrive evenly over the "
                        "time to the next one (the trace's times are rounded to ~3 s)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    opts = p.parse_args()
    if 1 not in opts.replicas:
        p.error("--replicas must include 1 (the reference the ratios use)")
    started = dt.datetime.now(dt.timezone.utc)
    bench = Replicas(opts)
    print(f"logs in {bench.tmp}", flush=True)
    report.stop_on_sigterm()
    interrupted = False
    try:
        bench.run()
    except KeyboardInterrupt:
        # Stopped (Ctrl-C, a timeout's SIGTERM): the rows so far are kept
        # (each run stops its processes on the way out).
        interrupted = True
        print(f"interrupted: writing the {len(bench.rows)} rows measured", flush=True)
    rows = with_ratios(bench.rows)
    meta = report.run_meta(bench.binary, ["python3", "bench/replicas.py", *sys.argv[1:]], started)
    meta["interrupted"] = interrupted
    result = {"meta": meta,
              "assign": opts.assign, "seed": opts.seed, "scale": opts.scale,
              "spread_bursts": opts.spread_bursts,
              "notes": bench.notes, "rows": rows}
    report.write_result(opts.out, started, "replicas", result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
