#!/usr/bin/env python3
"""What replica sync costs: bytes on the wire and router CPU per request.

    python3 bench/sync_cost.py bytes --workload multi-turn --requests 400
    python3 bench/sync_cost.py cpu --requests 20000

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


def start_nats(tmp: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = procs.start(["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js",
                        "-sd", os.path.join(tmp, f"store-{port}")],
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
                 sync: str | None, window: int | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [binary, "serve", "--port", str(port), "--worker-urls", *workers]
    if sync:
        cmd += ["--sync-url", sync, "--sync-replica-id", name]
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
    cmd = [binary, "load", "--workload", args.workload, "--requests", str(args.requests),
           "--concurrency", str(args.concurrency), "--seed", str(args.seed),
           "--assign", "round-robin", "--json", "--no-progress"]
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
        nats, nport = start_nats(tmp)
        workers = start_workers(args.binary, tmp, 2, ["--instant"])
        sync = f"nats://127.0.0.1:{nport}"
        on = [start_router(args.binary, tmp, f"on{i}", workers, sync, None) for i in range(2)]
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
            "extra_cpu": us_on / us_off - 1,
            "nats_server_cpu_us_per_req": nats_cpu / ok_on * 1e6,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["bytes", "cpu"])
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/radixgate"))
    ap.add_argument("--workload", default="multi-turn")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"# {' '.join(sys.argv)}", flush=True)
    if args.mode == "bytes":
        for window in (None, 0):
            print(json.dumps(bytes_run(args, window)), flush=True)
    else:
        print(json.dumps(cpu_run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
