#!/usr/bin/env python3
"""Router instructions per request, counted by callgrind: a CPU figure that
does not move with the machine's noise.

On a shared 2-vCPU machine one wrk run of the same build moves by 10-25%
(bench/wrk_cpu.sh), so a change of a few percent needs many alternating
rounds to show. Instructions executed are deterministic to about 0.5%: this
runs `BIN serve` under `valgrind --tool=callgrind` in front of two
`radixgate worker --instant` workers, sends `--warmup` requests, zeroes the
counters, sends `--requests` more over one keep-alive connection (the 4 KiB
chat body of `bench/run.py --part cost`, as wrk_cpu.sh sends), dumps, and
prints the instructions of all the router's threads in that window divided
by the requests. It counts user-space instructions only: not the kernel's
work (syscalls, wake-ups), not cache misses, not contention between
threads, so it complements wrk_cpu.sh rather than replacing it. About a
minute per binary.

    python3 bench/instr_cost.py --bin A --bin B [--requests 1000] [--stream]
        [--top 20] [--prompt-kib 64] [--serve-arg=--config --serve-arg=FILE]

`--sync-reports N [--rate R]` measures sync instead: the router with
`--sync-url` to a nats-server of its own, callgrind zeroed, then the same
time idle and with a fake peer publishing N well-formed load reports at R
a second (bench/sync_cost.py's `receive` does the same for CPU time), and
prints the difference per report.

`--bin TAG=PATH` names a binary in the output. `--top N` lists the N
functions with the most instructions of their own, per request; `--keep`
keeps the dumps for `callgrind_annotate`. Needs
valgrind (`apt-get install valgrind`) and a release build of `radixgate`
for the workers (target/release).
"""

import argparse
import glob
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402
import report  # noqa: E402
import run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def chat_body(stream: bool, prompt_kib: int = 0) -> bytes:
    """The body wrk_cpu.sh sends (bench/report.py), its user message
    `prompt_kib` KiB long if given."""
    return report.wrk_body(run.MODEL, stream, prompt_kib).encode()


def send(port: int, body: bytes, count: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for _ in range(count):
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            sys.exit(f"the router answered {resp.status}")
    conn.close()


def totals(dump: str, top: int) -> tuple[int, list[tuple[int, str]]]:
    """The dump's total instructions, and its `top` functions by their own."""
    out = subprocess.run(["callgrind_annotate", "--threshold=100", "--inclusive=no", dump],
                         capture_output=True, text=True, check=True).stdout
    total = re.search(r"^\s*([\d,]+) \([\d.]+%\)\s+PROGRAM TOTALS", out, re.M)
    if not total:
        sys.exit(f"no totals in {dump}")
    rows = []
    for m in re.finditer(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*)$", out, re.M):
        name = m.group(2)
        if "PROGRAM TOTALS" in name:
            continue
        # Drop the object file in brackets and the source path before ':'.
        name = re.sub(r"\s+\[[^\]]*\]$", "", name).split(":", 1)[-1]
        rows.append((int(m.group(1).replace(",", "")), name))
    # --inclusive=no still lists the thread entry points with everything
    # below them; keep functions, not whole threads.
    rows = [r for r in rows if r[0] < int(total.group(1).replace(",", "")) * 0.9]
    return int(total.group(1).replace(",", "")), rows[:top]


def start_under_callgrind(binary: str, tmp: str, serve_args: list[str]):
    """`binary serve SERVE_ARGS` under callgrind; its process and dump prefix."""
    out = os.path.join(tmp, "callgrind.out")
    proc = procs.start(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary,
                        "serve", "--host", "127.0.0.1", "--log-level", "warn", *serve_args],
                       os.path.join(tmp, "router.log"))
    return proc, out


def control(proc, flag: str) -> None:
    """`callgrind_control -z` (zero the counters) or `-d` (dump them)."""
    subprocess.run(["callgrind_control", flag, str(proc.pid)], check=True, capture_output=True)


def dumps_of(out: str, tmp: str, need: int) -> list[str]:
    """The dumps `-d` wrote (`out.1`, `out.2`, ...), oldest first."""
    dumps = sorted((d for d in glob.glob(out + ".*") if re.search(r"\.\d+$", d)),
                   key=lambda d: int(d.rsplit(".", 1)[1]))
    if len(dumps) < need:
        sys.exit(f"callgrind wrote {len(dumps)} dumps, not {need}; see {tmp}/router.log")
    return dumps


def measure(tag: str, binary: str, args) -> float:
    tmp = tempfile.mkdtemp(prefix="instr-")
    first = procs.free_block(36200, 3, last=36999)
    wport = [first, first + 1]
    rport = first + 2
    worker = procs.start([os.path.join(ROOT, "target/release/radixgate"), "worker", "--port",
                          str(wport[0]), "--count", "2", "--instant"],
                         os.path.join(tmp, "workers.log"))
    router, out = start_under_callgrind(binary, tmp, [
        "--port", str(rport), "--policy", "cache_aware", *args.serve_arg, "--worker-urls",
        *[f"http://127.0.0.1:{p}" for p in wport]])
    try:
        procs.wait_http(f"http://127.0.0.1:{wport[0]}/health", timeout=30, alive=worker)
        # Under callgrind the router starts about 50 times slower.
        procs.wait_http(f"http://127.0.0.1:{rport}/health", timeout=300, alive=router)
        body = chat_body(args.stream, args.prompt_kib)
        send(rport, body, args.warmup)
        control(router, "-z")
        started = time.monotonic()
        send(rport, body, args.requests)
        control(router, "-d")
        took = time.monotonic() - started
    finally:
        procs.stop(router)
        procs.stop(worker)
    dump = dumps_of(out, tmp, 1)[-1]
    total, top = totals(dump, args.top)
    per = total / args.requests
    print(f"{tag}: {per:,.0f} instructions per request ({args.requests} requests, "
          f"{took:.0f} s under callgrind)")
    for ir, name in top:
        print(f"  {ir / args.requests:10,.0f}  {name}")
    if args.keep:
        print(f"  callgrind dump: {dump}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return per


def measure_sync(tag: str, binary: str, args) -> float:
    """Instructions per peer load report a replica reads, over the same time idle."""
    import sync_cost  # its NATS helpers; imported here, only this mode needs them
    tmp = tempfile.mkdtemp(prefix="instr-")
    _, nport = sync_cost.start_nats(tmp)
    workers = sync_cost.start_workers(os.path.join(ROOT, "target/release/radixgate"), tmp, 2, [])
    port = sync_cost.free_port()
    router, out = start_under_callgrind(binary, tmp, [
        "--port", str(port), *args.serve_arg, "--worker-urls", *workers, "--sync-url",
        f"nats://127.0.0.1:{nport}", "--sync-replica-id", "r1"])
    secs = args.sync_reports / args.rate
    try:
        procs.wait_http(f"http://127.0.0.1:{port}/readiness", timeout=300, alive=router)
        peer = socket.create_connection(("127.0.0.1", nport))
        peer.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
        peer.recv(4096)
        time.sleep(3)
        # Window 1: idle for as long as the reports will take.
        control(router, "-z")
        time.sleep(secs)
        control(router, "-d")
        # Window 2: a fake peer's well-formed load reports, one at a time.
        control(router, "-z")
        start = time.monotonic()
        for i in range(args.sync_reports):
            report_ = sync_cost.load_report("radixgate", i + 1, workers)
            peer.sendall(b"PUB radixgate.sync.radixgate.load %d\r\n%s\r\n"
                         % (len(report_), report_))
            time.sleep(max(0.0, start + (i + 1) / args.rate - time.monotonic()))
        time.sleep(0.3)
        control(router, "-d")
        peer.close()
    finally:
        procs.stop_all()
    dumps = dumps_of(out, tmp, 2)
    idle, _ = totals(dumps[-2], 0)
    busy, top = totals(dumps[-1], args.top)
    per = (busy - idle) / args.sync_reports
    print(f"{tag}: {per:,.0f} instructions per load report read ({args.sync_reports} at "
          f"{args.rate:g}/s; idle {idle / secs:,.0f} a second)")
    for ir, name in top:
        print(f"  {ir / args.sync_reports:10,.0f}  {name}")
    shutil.rmtree(tmp, ignore_errors=True)
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", action="append", required=True, help="PATH or TAG=PATH")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--stream", action="store_true", help="streamed answers")
    ap.add_argument("--prompt-kib", type=int, default=0,
                    help="a user message this many KiB long instead of the 4 KiB body")
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--sync-reports", type=int, default=0,
                    help="instead: instructions per peer load report read (needs nats-server)")
    ap.add_argument("--rate", type=float, default=50.0, help="--sync-reports: reports a second")
    ap.add_argument("--keep", action="store_true",
                    help="keep each callgrind dump (callgrind_annotate reads it)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an extra `serve` argument (repeat; --serve-arg=--flag)")
    args = ap.parse_args()
    if args.requests < 1 or args.warmup < 0:
        ap.error("--requests must be at least 1 and --warmup at least 0")
    if args.sync_reports < 0 or args.rate <= 0:
        ap.error("--sync-reports must be at least 0 and --rate positive")
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: apt-get install valgrind")
    if not os.access(os.path.join(ROOT, "target/release/radixgate"), os.X_OK):
        sys.exit("target/release/radixgate is missing: cargo build --release -p radixgate")
    results = []
    for spec in args.bin:
        tag, _, path = spec.rpartition("=")
        tag = tag or path
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is not an executable")
        mode = measure_sync if args.sync_reports > 0 else measure
        results.append((tag, mode(tag, path, args)))
    if len(results) > 1:
        base = results[0][1]
        for tag, per in results[1:]:
            print(f"{tag} / {results[0][0]}: {per / base:.3f}")


if __name__ == "__main__":
    main()
