#!/usr/bin/env python3
"""What replica sync costs: bytes on the wire and router CPU per request.

    python3 bench/sync_cost.py bytes --workload multi-turn --requests 400
    python3 bench/sync_cost.py cpu --requests 20000
    python3 bench/sync_cost.py compare --quality hot-prefix --scale 0.5 \
        --binary OLD --binary-b NEW --rounds 3

`bytes`: one nats-server (JetStream, a store of its own, a free loopback
port), two simulated workers, two `serve` replicas with `--sync-url`, once
with prefix references on (the default window) and once off
(`reference_window_bytes: 0`). A raw NATS subscriber started here records
every sync payload; the report gives the payload bytes per routed request,
and what compressing each insert batch on its own would leave, with the
`zstd` and `lz4` command-line tools (frame overhead included, checksums off)
and zlib, as a stand-in for a batch compressor in the publisher.

`cpu`: two instant workers, and four `serve` replicas: two with
`--sync-url` (one NATS), two without; the same load (`radixgate load`, same
workload, seed and count) goes to each pair at the same time, and each
router's CPU (utime + stime from /proc/PID/stat) is read before and after.
With `--core-only` the nats-server has no JetStream: the replicas send
inserts over core NATS, as they do when a server refuses the stream.
`--sync-arg=ARG` (repeatable) passes a flag to the replicas with sync
(`--sync-arg=--sync-stream-storage --sync-arg=memory`).

`receive`: what one sync message costs the replica that reads it. One
nats-server, two instant workers and one `serve` replica with `--sync-url`;
a raw NATS connection started here plays a peer and publishes well-formed
load reports (another instance of the same cluster, naming the replica's
workers) at each `--rate` in turn, `--bunch` at a time (so 100/s in bunches
of 4 is 25 bunches a second), `--spacing-us` apart within a bunch. Per
step: the replica's CPU (utime + stime) and thread wake-ups per message and
per second, against the same time idle just before; the replica's /metrics
confirm it read them.

`compare`: router CPU per request of N replicas with sync against the same
N without, at a routing-quality workload's own rate (bench/run.py's
workloads, realistic simulated workers), and of two builds side by side:
each group (N replicas without sync; N with sync from `--binary`; N with
sync from `--binary-b`, if given) has its own workers and its own
nats-server, and the same `radixgate load` runs against every group at the
same time, so the groups share whatever else the machine does. Before the
load, every group idles `--idle-s` seconds: what sync costs when nothing is
routed. Per group: CPU and thread wake-ups (context switches of every
thread, from /proc/PID/task/*/status) per request, the CPU, the wake-ups
and the minor page faults per request split by thread (the serving
runtime's workers, the load lane's thread, and the rest: the main thread,
whose runtime runs the publisher and the insert receiver), and sync
messages per request from the replicas' /metrics. `--rounds` repeats it;
the summary is the median of each round's ratios. With `--b-core-only`,
group b's nats-server runs without JetStream (`--binary-b` defaults to `--binary`):
its replicas fall back to core NATS for inserts, which measures what the
stream's delivery costs (a replica's own batches read back, the pull
consumer's requests) against live sync without it. With `--awake both`,
each round runs twice, as is and then with every CPU kept out of its idle
state by a busy loop at `SCHED_IDLE` priority (`AwakeCpus`; `--awake on`
runs only that): on a virtual machine, waking an idle virtual CPU costs
more than waking a busy one, and this tells how much of sync's share that
is (docs/sync.md, "Waking a thread on this machine, and with no idle
CPUs"). The loops' own CPU is not counted; any thread of the groups
preempts them at once.

Only processes started here are stopped, by their ids (bench/procs.py).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Capture(threading.Thread):
    """Subscribes to every sync subject and keeps the payloads, by kind."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\n'
                          b"SUB radixgate.sync.*.inserts 1\r\n"
                          b"SUB radixgate.sync.*.load 2\r\nPING\r\n")
        self.payloads: dict[str, list[bytes]] = {"inserts": [], "load": []}
        self.stopped = False

    def run(self) -> None:
        buf = b""
        while not self.stopped:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while True:
                line_end = buf.find(b"\r\n")
                if line_end < 0:
                    break
                line = buf[:line_end]
                if line.startswith(b"MSG "):
                    parts = line.split()
                    size = int(parts[-1])
                    end = line_end + 2 + size + 2
                    if len(buf) < end:
                        break
                    kind = parts[1].rsplit(b".", 1)[1].decode()
                    self.payloads[kind].append(buf[line_end + 2:line_end + 2 + size])
                    buf = buf[end:]
                    continue
                if line == b"PING":
                    self.sock.sendall(b"PONG\r\n")
                buf = buf[line_end + 2:]

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()


def start_nats(tmp: str, jetstream: bool = True) -> tuple[subprocess.Popen, int]:
    port = free_port()
    js = ["-js", "-sd", os.path.join(tmp, f"store-{port}")] if jetstream else []
    proc = procs.start(["nats-server", "-a", "127.0.0.1", "-p", str(port), *js],
                       os.path.join(tmp, "nats.log"))
    deadline = time.monotonic() + 20
    while not procs.port_open(port):
        if time.monotonic() > deadline:
            raise RuntimeError("nats-server did not start")
        time.sleep(0.05)
    return proc, port


def start_workers(binary: str, tmp: str, count: int, extra: list[str]) -> list[str]:
    port = procs.free_block(31000, count)
    proc = procs.start([binary, "worker", "--port", str(port), "--count", str(count), *extra],
                       os.path.join(tmp, "workers.log"))
    urls = [f"http://127.0.0.1:{port + i}" for i in range(count)]
    for u in urls:
        procs.wait_http(u + "/health", alive=proc)
    return urls


def start_router(binary: str, tmp: str, name: str, workers: list[str],
                 sync: str | None, window: int | None,
                 sync_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [binary, "serve", "--port", str(port), "--worker-urls", *workers]
    if sync:
        cmd += ["--sync-url", sync, "--sync-replica-id", name, *sync_args]
    if window is not None:
        cfg = os.path.join(tmp, f"{name}.yaml")
        with open(cfg, "w") as f:
            f.write(f"sync:\n  reference_window_bytes: {window}\n")
        cmd += ["--config", cfg]
    proc = procs.start(cmd, os.path.join(tmp, f"{name}.log"))
    url = f"http://127.0.0.1:{port}"
    procs.wait_http(url + "/readiness", alive=proc)
    return proc, url


def load_cmd(binary: str, urls: list[str], args: argparse.Namespace) -> list[str]:
    # A trace is paced by its own timestamps (--speedup), not a concurrency.
    pace = [] if args.workload == "trace" else ["--concurrency", str(args.concurrency)]
    cmd = [binary, "load", "--workload", args.workload, "--requests", str(args.requests),
           *pace, "--seed", str(args.seed),
           "--assign", "round-robin", "--json", "--no-progress", *args.load_arg]
    for u in urls:
        cmd += ["--url", u]
    return cmd


def compressed(payload: bytes, tool: list[str]) -> int:
    return len(subprocess.run(tool, input=payload, capture_output=True, check=True).stdout)


def bytes_run(args: argparse.Namespace, window: int | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="radixgate-sync-bytes-") as tmp:
        nats, nport = start_nats(tmp)
        workers = start_workers(args.binary, tmp, 2, [])
        cap = Capture(nport)
        cap.start()
        sync = f"nats://127.0.0.1:{nport}"
        routers = [start_router(args.binary, tmp, f"r{i}", workers, sync, window)
                   for i in range(2)]
        out = subprocess.run(load_cmd(args.binary, [u for _, u in routers], args),
                             capture_output=True, text=True, check=True)
        report = json.loads(out.stdout)
        time.sleep(0.5)  # the last batch and load report
        for proc, _ in routers:
            procs.stop(proc)
        cap.stop()
        procs.stop(nats)
        inserts, loads = cap.payloads["inserts"], cap.payloads["load"]
        if args.save_inserts:
            # One file per batch, for `zstd -b` (see docs/sync.md).
            out = os.path.join(args.save_inserts, "off" if window == 0 else "default")
            os.makedirs(out, exist_ok=True)
            for i, payload in enumerate(inserts):
                with open(os.path.join(out, f"batch-{i:05}.bin"), "wb") as f:
                    f.write(payload)
        n = report["ok"]
        raw_i = sum(map(len, inserts))
        raw_l = sum(map(len, loads))
        row = {
            "window": "default (8 MiB)" if window is None else str(window),
            "requests_ok": n,
            "requests_failed": report["failed"],
            "hit_rate": report.get("hit_rate"),
            "insert_batches": len(inserts),
            "load_reports": len(loads),
            "insert_bytes_per_req": raw_i / n,
            "load_bytes_per_req": raw_l / n,
        }
        tools = {
            "zstd-1": ["zstd", "-1", "-c", "-q", "--no-check"],
            "zstd-3": ["zstd", "-3", "-c", "-q", "--no-check"],
            "lz4": ["lz4", "-1", "-c", "-q", "--no-frame-crc", "-BD"],
        }
        for name, tool in tools.items():
            row[f"insert_bytes_per_req_{name}"] = sum(
                min(len(p), compressed(p, tool)) for p in inserts) / n
        row["insert_bytes_per_req_deflate-1"] = sum(
            min(len(p), len(zlib.compress(p, 1))) for p in inserts) / n
        procs.stop_all()
        return row


def cpu_run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="radixgate-sync-cpu-") as tmp:
        nats, nport = start_nats(tmp, jetstream=not args.core_only)
        workers = start_workers(args.binary, tmp, 2, ["--instant"])
        sync = f"nats://127.0.0.1:{nport}"
        on = [start_router(args.binary, tmp, f"on{i}", workers, sync, None, tuple(args.sync_arg))
              for i in range(2)]
        off = [start_router(args.binary, tmp, f"off{i}", workers, None, None) for i in range(2)]
        before = {p.pid: procs.cpu_seconds(p.pid) for p, _ in on + off}
        nats_before = procs.cpu_seconds(nats.pid)
        started = time.monotonic()
        loads = [subprocess.Popen(load_cmd(args.binary, [u for _, u in pair], args),
                                  stdout=subprocess.PIPE, text=True)
                 for pair in (on, off)]
        reports = [json.loads(p.communicate()[0]) for p in loads]
        wall = time.monotonic() - started
        after = {p.pid: procs.cpu_seconds(p.pid) for p, _ in on + off}
        nats_cpu = procs.cpu_seconds(nats.pid) - nats_before
        procs.stop_all()

        def per_req(pair, report):
            cpu = sum(after[p.pid] - before[p.pid] for p, _ in pair)
            return cpu, report["ok"], report["failed"], cpu / report["ok"] * 1e6

        cpu_on, ok_on, failed_on, us_on = per_req(on, reports[0])
        cpu_off, ok_off, failed_off, us_off = per_req(off, reports[1])
        return {
            "wall_s": wall,
            "sync_on": {"cpu_s": cpu_on, "ok": ok_on, "failed": failed_on,
                        "cpu_us_per_req": us_on},
            "sync_off": {"cpu_s": cpu_off, "ok": ok_off, "failed": failed_off,
                         "cpu_us_per_req": us_off},
            "core_only": args.core_only,
            "sync_args": args.sync_arg,
            "extra_cpu": us_on / us_off - 1,
            "nats_server_cpu_us_per_req": nats_cpu / ok_on * 1e6,
        }


def task_dirs(root: int):
    """/proc/PID/task/TID of every thread of `root`'s tree."""
    for pid in procs.descendants(root):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            yield f"/proc/{pid}/task/{tid}"


def task_files(root: int, name: str):
    """The text of /proc/PID/task/TID/`name` for every thread of `root`'s
    tree (a thread or process that ends meanwhile is skipped)."""
    for task in task_dirs(root):
        try:
            with open(f"{task}/{name}") as f:
                yield f.read()
        except OSError:
            continue


def switches(status: str) -> int:
    """Context switches (voluntary and not) in a thread's
    /proc/PID/task/TID/status text: its wake-ups."""
    return sum(int(line.split()[1]) for line in status.splitlines()
               if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")))


def wakeups(root: int) -> int:
    """Context switches (voluntary and not) of every thread of `root`'s tree."""
    return sum(switches(status) for status in task_files(root, "status"))


# A router's threads by name: the serving runtime's workers, the load
# lane's thread (its 15-character comm), and the rest (the main thread's
# runtime, which runs the publisher and the insert receiver, and tokio's
# blocking threads).
THREAD_KINDS = (("radixgate-serve", "serving"), ("radixgate-sync-", "load lane"))


def by_thread(roots) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """CPU seconds (utime + stime), wake-ups (`switches`) and minor page
    faults of the live threads of every tree in `roots`, summed by kind
    (THREAD_KINDS, else "main and other"). A thread that ended is missing
    here but counted in the process's own CPU total (cpu_seconds)."""
    kinds = [k for _, k in THREAD_KINDS] + ["main and other"]
    cpu = {kind: 0.0 for kind in kinds}
    wake = {kind: 0 for kind in kinds}
    faults = {kind: 0 for kind in kinds}
    for task in (t for root in roots for t in task_dirs(root)):
        try:
            with open(f"{task}/stat") as f:
                stat = f.read()
            with open(f"{task}/status") as f:
                status = f.read()
        except OSError:
            continue
        head, rest = stat.rsplit(")", 1)
        comm = head.split("(", 1)[1]
        fields = rest.split()
        kind = next((k for prefix, k in THREAD_KINDS if comm.startswith(prefix)),
                    "main and other")
        # After ")": state=0, ..., minflt=7, ..., utime=11, stime=12.
        cpu[kind] += (int(fields[11]) + int(fields[12])) / procs.CLK_TCK
        faults[kind] += int(fields[7])
        wake[kind] += switches(status)
    return cpu, wake, faults


def load_report(cluster: str, seq: int, urls: list[str]) -> bytes:
    """A peer's load report in wire format 1 (docs/sync.md), kind 2."""
    def var(v: int) -> bytes:
        out = bytearray()
        while True:
            byte = v & 0x7F
            v >>= 7
            if v == 0:
                out.append(byte)
                return bytes(out)
            out.append(byte | 0x80)

    def text(b: bytes) -> bytes:
        return var(len(b)) + b

    out = b"RG" + bytes([1, 2, 0]) + text(cluster.encode()) + text(b"bench-peer")
    out += (0x5EED_0000_0000_0001).to_bytes(8, "little") + var(seq) + var(int(time.time() * 1000))
    out += var(len(urls))
    for u in urls:
        out += text(u.encode()) + var(2) + var(4096)
    return out


def receive_run(args: argparse.Namespace) -> None:
    from replicas import metric_sum
    with tempfile.TemporaryDirectory() as tmp:
        try:
            _, nport = start_nats(tmp)
            workers = start_workers(args.binary, tmp, 2, [])
            router, url = start_router(args.binary, tmp, "r1", workers,
                                       f"nats://127.0.0.1:{nport}", None)
            sock = socket.create_connection(("127.0.0.1", nport))
            sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
            sock.recv(4096)
            subject = b"radixgate.sync.radixgate.load"
            seq = 0

            def usage() -> tuple[float, int, float]:
                got = metric_sum(url, ("radixgate_sync_messages_received_total",))
                return procs.cpu_seconds(router.pid), wakeups(router.pid), got

            time.sleep(args.idle_s)
            for rate in args.rate:
                before = usage()
                time.sleep(args.idle_s)
                idle = usage()
                bunches = rate / args.bunch
                start = time.monotonic()
                n = 0
                while time.monotonic() - start < args.idle_s:
                    out = b""
                    for i in range(args.bunch):
                        seq += 1
                        payload = load_report("radixgate", seq, workers)
                        out += b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload)
                        if args.spacing_us > 0:
                            sock.sendall(out)
                            out = b""
                            if i + 1 < args.bunch:
                                time.sleep(args.spacing_us / 1e6)
                    if out:
                        sock.sendall(out)
                    n += args.bunch
                    due = start + (n / args.bunch) / bunches
                    time.sleep(max(0.0, due - time.monotonic()))
                time.sleep(0.2)
                after = usage()
                secs = args.idle_s
                idle_cpu = (idle[0] - before[0]) / secs
                idle_wake = (idle[1] - before[1]) / secs
                busy_cpu = (after[0] - idle[0]) / (secs + 0.2)
                busy_wake = (after[1] - idle[1]) / (secs + 0.2)
                read = after[2] - idle[2]
                print(json.dumps({
                    "rate_per_s": rate, "bunch": args.bunch, "published": n, "read": read,
                    "idle_cpu_ms_per_s": round(idle_cpu * 1e3, 3),
                    "busy_cpu_ms_per_s": round(busy_cpu * 1e3, 3),
                    "extra_cpu_us_per_msg": round((busy_cpu - idle_cpu) * 1e6 / (n / secs), 2),
                    "idle_wakeups_per_s": round(idle_wake, 1),
                    "extra_wakeups_per_msg": round((busy_wake - idle_wake) / (n / secs), 3),
                }), flush=True)
            sock.close()
        finally:
            procs.stop_all()


class AwakeCpus:
    """While entered, one busy loop per CPU this process may use, each pinned
    to its CPU at `SCHED_IDLE` priority: the CPUs never go idle, and any
    other thread that wakes preempts the loop at once. Stopped by PID."""

    CODE = ("import os\n"
            "os.sched_setaffinity(0, {%d})\n"
            "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
            "while True:\n"
            "    pass\n")

    def __init__(self, log_dir: str):
        self.log = os.path.join(log_dir, "awake.log")
        self.loops: list[subprocess.Popen] = []

    def __enter__(self):
        for cpu in sorted(os.sched_getaffinity(0)):
            self.loops.append(procs.start([sys.executable, "-c", self.CODE % cpu], self.log))
        return self

    def __exit__(self, *exc):
        for p in self.loops:
            procs.stop(p)
        self.loops = []
        return False


SYNC_COUNTERS = ("radixgate_sync_messages_sent_total", "radixgate_sync_messages_received_total")


def compare_group_usage(group) -> tuple[float, int, dict[str, float], dict[str, float],
                                        dict[str, int], dict[str, int]]:
    """(CPU seconds, wake-ups, sync counters, CPU seconds by thread kind,
    wake-ups by thread kind, minor page faults by thread kind) of a
    group's replicas, summed. The wake-ups are the threads' (those alive)."""
    from replicas import metric_sum
    cpu = sum(procs.cpu_seconds(p.pid) for p in group["procs"])
    counters = {name: sum(metric_sum(t, (name,)) for t in group["targets"])
                for name in SYNC_COUNTERS}
    threads, thread_wakes, thread_faults = by_thread(p.pid for p in group["procs"])
    return cpu, sum(thread_wakes.values()), counters, threads, thread_wakes, thread_faults


def published(group) -> dict[str, int]:
    """Messages published so far in a group, by subject kind (inserts, load)."""
    cap = group.get("capture")
    return {k: len(v) for k, v in cap.payloads.items()} if cap else {"inserts": 0, "load": 0}


def compare_round(args: argparse.Namespace, wname: str, wl) -> dict:
    from replicas import Replicas
    from run import run_load
    specs = [("no sync", args.binary, False), ("sync", args.binary, True)]
    if args.binary_b:
        specs.append(("sync, b", args.binary_b, True))
    groups = []
    try:
        for name, binary, sync in specs:
            opts = argparse.Namespace(bin=binary, no_sync_only=False, policy="cache_aware",
                                      serve_arg=[], drive=0)
            bench = Replicas(opts)
            workers, urls = bench.start_workers(4, wl.per_worker)
            group = {"name": name, "binary": binary, "workers": workers, "nats": None,
                     "procs": []}
            groups.append(group)
            nats_port = None
            if sync:
                core_only = args.b_core_only and name == "sync, b"
                group["nats"], nats_port = bench.start_nats(jetstream=not core_only)
                group["capture"] = Capture(nats_port)
                group["capture"].start()
            group["procs"], group["targets"] = bench.start_replicas(
                args.replicas, urls, nats_port, f"cost-{len(groups)}")
            group["load"] = [binary, wl.load + ["--assign", "round-robin",
                                                "--pool-size", str(len(urls))]]
        before = [compare_group_usage(g) for g in groups]
        published0 = [published(g) for g in groups]
        time.sleep(args.idle_s)
        idle = [compare_group_usage(g) for g in groups]
        published1 = [published(g) for g in groups]
        results: list[dict | None] = [None] * len(groups)

        def drive(i: int) -> None:
            g = groups[i]
            results[i] = run_load(g["load"][0], g["targets"], g["load"][1], args.seed)

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(groups))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = [compare_group_usage(g) for g in groups]
        published2 = [published(g) for g in groups]
    finally:
        for g in groups:
            if "capture" in g:
                g["capture"].stop()
            for p in g["procs"] + g["workers"] + ([g["nats"]] if g["nats"] else []):
                procs.stop(p)
    out = {"workload": wname, "replicas": args.replicas, "idle_s": args.idle_s, "groups": []}
    for g, b, i, a, rep, p0, p1, p2 in zip(groups, before, idle, after, results,
                                           published0, published1, published2):
        ok = rep["ok"]
        ttft = rep.get("ttft_ms") or {}
        out["groups"].append({
            "group": g["name"], "binary": g["binary"], "ok": ok, "failed": rep["failed"],
            "hit_rate": rep["hit_rate"], "ttft_mean_ms": ttft.get("mean"),
            "idle_cpu_ms_per_s": (i[0] - b[0]) / args.idle_s * 1000,
            "idle_wakeups_per_s": (i[1] - b[1]) / args.idle_s,
            "cpu_ms_per_req": (a[0] - i[0]) / ok * 1000,
            "wakeups_per_req": (a[1] - i[1]) / ok,
            "cpu_ms_per_req_by_thread": {k: (a[3][k] - i[3][k]) / ok * 1000 for k in a[3]},
            "wakeups_per_req_by_thread": {k: (a[4][k] - i[4][k]) / ok for k in a[4]},
            "page_faults_per_req_by_thread": {k: (a[5][k] - i[5][k]) / ok for k in a[5]},
            "sent_per_req": (a[2][SYNC_COUNTERS[0]] - i[2][SYNC_COUNTERS[0]]) / ok,
            "received_per_req": (a[2][SYNC_COUNTERS[1]] - i[2][SYNC_COUNTERS[1]]) / ok,
            "idle_published_per_s": {k: (p1[k] - p0[k]) / args.idle_s for k in p0},
            "published_per_req": {k: (p2[k] - p1[k]) / ok for k in p0},
        })
    base = out["groups"][0]["cpu_ms_per_req"]
    for g in out["groups"]:
        g["cpu_vs_no_sync"] = g["cpu_ms_per_req"] / base if base else None
    return out


def med_of(vals: list[float]) -> float:
    vals = sorted(vals)
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def compare(args: argparse.Namespace) -> None:
    from run import quality_workloads
    trace = os.path.join(ROOT, "traces/mooncake_conversation.jsonl")
    workloads = quality_workloads(trace, args.scale)
    conditions = {"off": [False], "on": [True], "both": [False, True]}[args.awake]
    for wname in args.quality:
        by_condition: dict[bool, list[dict]] = {c: [] for c in conditions}
        for r in range(args.rounds):
            for awake in conditions:
                if awake:
                    with tempfile.TemporaryDirectory() as tmp, AwakeCpus(tmp):
                        row = compare_round(args, wname, workloads[wname])
                else:
                    row = compare_round(args, wname, workloads[wname])
                row["awake"] = awake
                by_condition[awake].append(row)
                print(json.dumps(row), flush=True)
        for awake, rounds in by_condition.items():
            compare_summary(args, wname, awake, rounds)


def compare_summary(args: argparse.Namespace, wname: str, awake: bool, rounds: list[dict]) -> None:
    """Prints the medians over `rounds` of one workload and condition."""
    summary = {"workload": wname, "awake": awake, "rounds": args.rounds, "median": {}}
    for k, g in enumerate(rounds[0]["groups"]):
        def med(key):
            return med_of([r["groups"][k][key] for r in rounds])
        summary["median"][g["group"]] = {
            key: med(key) for key in ("cpu_ms_per_req", "cpu_vs_no_sync",
                                      "idle_cpu_ms_per_s", "idle_wakeups_per_s",
                                      "wakeups_per_req", "sent_per_req",
                                      "received_per_req", "hit_rate", "ttft_mean_ms")}
        summary["median"][g["group"]]["published_per_req"] = {
            kind: med_of([r["groups"][k]["published_per_req"][kind] for r in rounds])
            for kind in ("inserts", "load")}
        summary["median"][g["group"]]["cpu_ms_per_req_by_thread"] = {
            kind: med_of([r["groups"][k]["cpu_ms_per_req_by_thread"][kind] for r in rounds])
            for kind in g["cpu_ms_per_req_by_thread"]}
        summary["median"][g["group"]]["wakeups_per_req_by_thread"] = {
            kind: med_of([r["groups"][k]["wakeups_per_req_by_thread"][kind] for r in rounds])
            for kind in g["wakeups_per_req_by_thread"]}
        summary["median"][g["group"]]["page_faults_per_req_by_thread"] = {
            kind: med_of([r["groups"][k]["page_faults_per_req_by_thread"][kind] for r in rounds])
            for kind in g["page_faults_per_req_by_thread"]}
    if args.binary_b:
        summary["b_vs_a_cpu_per_req_median"] = med_of(
            [r["groups"][2]["cpu_ms_per_req"] / r["groups"][1]["cpu_ms_per_req"]
             for r in rounds])
    print(json.dumps(summary), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["bytes", "cpu", "compare", "receive"])
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/radixgate"))
    ap.add_argument("--workload", default="multi-turn")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load-arg", action="append", default=[],
                    help="bytes, cpu: one more argument for `radixgate load` (repeatable)")
    ap.add_argument("--save-inserts", help="bytes: write every insert batch's payload here")
    ap.add_argument("--binary-b", help="compare: a second build, run side by side")
    ap.add_argument("--b-core-only", action="store_true",
                    help="compare: group b's nats-server runs without JetStream, so its "
                         "replicas get inserts over core NATS (no echo of their own, no "
                         "warm start)")
    ap.add_argument("--sync-arg", action="append", default=[],
                    help="cpu: one more argument for the replicas with sync (repeatable)")
    ap.add_argument("--core-only", action="store_true",
                    help="cpu: the nats-server runs without JetStream, so inserts go over "
                         "core NATS (no stream, no own batches read back)")
    ap.add_argument("--quality", action="append",
                    help="compare: a routing-quality workload of bench/run.py (repeatable)")
    ap.add_argument("--scale", type=float, default=0.5, help="compare: its request counts x this")
    ap.add_argument("--replicas", type=int, default=4, help="compare: replicas per group")
    ap.add_argument("--idle-s", type=float, default=10.0, help="compare: idle time measured")
    ap.add_argument("--rounds", type=int, default=3, help="compare: rounds (medians)")
    ap.add_argument("--awake", choices=["off", "on", "both"], default="off",
                    help="compare: run each round with the CPUs kept out of idle "
                         "(on), as is (off), or both in turn")
    ap.add_argument("--rate", type=float, action="append",
                    help="receive: messages a second a fake peer sends (repeatable)")
    ap.add_argument("--bunch", type=int, default=1, help="receive: messages sent together")
    ap.add_argument("--spacing-us", type=float, default=0.0,
                    help="receive: microseconds between the messages of a bunch")
    args = ap.parse_args()
    print(f"# {' '.join(sys.argv)}", flush=True)
    if args.mode == "compare":
        if not args.quality:
            ap.error("compare needs --quality WORKLOAD")
        if args.b_core_only and not args.binary_b:
            args.binary_b = args.binary
        compare(args)
    elif args.mode == "receive":
        args.rate = args.rate or [25.0, 100.0, 400.0]
        receive_run(args)
    elif args.mode == "bytes":
        for window in (None, 0):
            print(json.dumps(bytes_run(args, window)), flush=True)
    else:
        print(json.dumps(cpu_run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
