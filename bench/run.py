#!/usr/bin/env python3
"""radixgate side by side with the routers people use (see bench/README.md).

One run: for each routing-quality workload, fresh simulated workers and each
router in turn in front of them, driven by `radixgate load --json`; then, for
router cost, `radixgate worker --instant` workers and each router in turn at
fixed request rates, a closed loop and wrk, with the CPU time of the router's
process tree read from /proc before and after. Writes
bench/results/<UTC date-time>.{json,md}. Ports: 35000-35999.
"""

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402
import report  # noqa: E402
from routers import Router, all_routers  # noqa: E402

ROUTER_PORT = 35500          # +1 for routers that want a metrics port
QUALITY_WORKER_PORT = 35100  # 4 realistic workers: 35100-35103
COST_WORKER_PORT = 35200     # 2 instant workers: 35200-35201
MODEL = "sim-llama-8b"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclass
class Workload:
    """A routing-quality workload: `radixgate load` arguments and, for a pool
    that is not uniform, extra `radixgate worker` arguments by worker index."""

    load: list[str]
    per_worker: dict[int, list[str]] = field(default_factory=dict)


def repo_relative(arg: str) -> str:
    """A path argument as the report records it: relative to the repository
    root (results carry no path of the machine they ran on)."""
    if os.path.isabs(arg) and os.path.exists(arg):
        return os.path.relpath(arg, ROOT)
    return arg


def quality_workloads(trace: str, scale: float, spread_bursts: bool = False) -> dict[str, Workload]:
    """Each routing-quality workload, in table order. With `spread_bursts`
    the trace's requests that share a timestamp arrive evenly over the time
    to the next one (`radixgate load --spread-bursts`) instead of at once."""
    n = lambda x: str(max(20, int(x * scale)))  # noqa: E731
    shared_prefix = ["--workload", "shared-prefix", "--groups", "16",
                     "--rate", "16", "--requests", n(480)]
    return {
        "shared-prefix": Workload(shared_prefix),
        "zipf-hot": Workload(["--workload", "shared-prefix", "--groups", "8", "--zipf", "2.0",
                              "--rate", "16", "--requests", n(480)]),
        "multi-turn": Workload(["--workload", "multi-turn", "--rate", "12", "--think-ms", "300",
                                "--requests", n(360)]),
        # The trace's prompts average 14k tokens: its first 300 requests
        # (105 s of trace) at 2.5x keep 4 workers busy but not saturated.
        "mooncake-trace": Workload(["--workload", "trace", "--trace", trace, "--speedup", "2.5",
                                    "--max-output-tokens", "64", "--requests", n(300)]
                                   + (["--spread-bursts"] if spread_bursts else [])),
        # Few hot prefixes every worker can hold, long questions; 128 req/s
        # keeps ~16 requests running per worker (E2E 1.7-2x that at 16 req/s)
        # with no queue, where 192 req/s is at the knee (bench/README.md).
        "hot-prefix": Workload(["--workload", "shared-prefix", "--groups", "8", "--zipf", "2.0",
                                "--question-tokens", "512", "--rate", "128",
                                "--requests", n(2560)]),
        # shared-prefix on a pool whose worker 0 runs at half speed.
        "hetero": Workload(shared_prefix, per_worker={0: ["--speed", "0.5"]}),
    }


def worker_groups(count: int, per_worker: dict[int, list[str]]) -> list[tuple[int, int, list[str]]]:
    """(first index, how many, extra arguments) for each run of consecutive
    workers that take the same extra arguments: one `radixgate worker` each."""
    groups: list[tuple[int, int, list[str]]] = []
    for i in range(count):
        args = per_worker.get(i, [])
        if groups and groups[-1][2] == args:
            first, k, _ = groups[-1]
            groups[-1] = (first, k + 1, args)
        else:
            groups.append((i, 1, args))
    return groups


def missing_worker_flags(binary: str, per_worker: dict[int, list[str]]) -> list[str]:
    """The flags in `per_worker` that this binary's `radixgate worker` does not know."""
    flags = {a.split("=", 1)[0] for args in per_worker.values() for a in args if a.startswith("--")}
    if not flags:
        return []
    helptext = subprocess.run([binary, "worker", "--help"], capture_output=True, text=True).stdout
    return sorted(f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", helptext))


def start_workers(binary: str, log: str, first_port: int, count: int, extra: list[str],
                  per_worker: dict[int, list[str]] | None = None):
    """Starts `count` workers on the first free block of ports from
    `first_port`: one process for all of them, or one per run of workers
    that share their `per_worker` arguments. Returns (processes, URLs)."""
    groups = worker_groups(count, per_worker or {})
    for attempt in range(5):
        port = procs.free_block(first_port + 10 * attempt, count)
        started = [procs.start([binary, "worker", "--port", str(port + first),
                                "--count", str(k), *extra, *args], log)
                   for first, k, args in groups]
        urls = [f"http://127.0.0.1:{port + i}" for i in range(count)]
        try:
            for (first, k, _), proc in zip(groups, started):
                for u in urls[first:first + k]:
                    procs.wait_http(u + "/health", timeout=20, alive=proc)
            return started, urls
        except RuntimeError as err:
            print(f"workers on {port}: {err}; retrying", file=sys.stderr)
            for proc in started:
                procs.stop(proc)
    raise RuntimeError("could not start workers")


COST_BODY = ["--no-stream", "--workload", "shared-prefix", "--groups", "16",
             "--system-tokens", "900", "--question-tokens", "100", "--output-tokens", "16"]


def run_load(binary: str, urls: list[str], args: list[str], seed: int) -> dict:
    """Runs `radixgate load --json` and returns its report."""
    # Failed requests are data here (the report counts them per router), not
    # a failed run: --max-error-rate 1 keeps the exit status 0.
    cmd = [binary, "load", "--json", "--no-progress", "--max-error-rate", "1",
           "--seed", str(seed), "--model", MODEL]
    for u in urls:
        cmd += ["--url", u]
    out = subprocess.run(cmd + args, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"load failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def ready_body() -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 1,
                       "messages": [{"role": "user", "content": "bench readiness probe"}]}).encode()


def start_router(router: Router, urls: list[str], scratch: str, log: str):
    """Starts `router` (one with a command) in front of `urls` on the first
    free ports from ROUTER_PORT; ready once a chat completion is answered 200
    through it (workers discovered). Returns (process, URL, its ports)."""
    os.makedirs(scratch, exist_ok=True)
    for attempt in range(5):
        port = procs.free_block(ROUTER_PORT + 10 * attempt, 2)
        proc = procs.start(router.command(urls, port, scratch), log)
        url = f"http://127.0.0.1:{port}"
        try:
            procs.wait_http(url + "/v1/chat/completions", timeout=90, body=ready_body(),
                            alive=proc)
        except RuntimeError as err:
            print(f"{router.name} on {port}: {err}; retrying", file=sys.stderr)
            procs.stop(proc)
            continue
        time.sleep(1.0)  # let a first health round settle
        return proc, url, [port, port + 1]
    raise RuntimeError(f"could not start {router.name}")


def missing_requirements(routers: list[Router], part: str, workloads: list[str],
                         trace: str) -> list[str]:
    """What the run would fail on part-way, said before anything runs: a
    router whose program (or Python module) is not installed, and the trace
    file when the trace workload is to run. Without this a run stopped at
    the first such router or at the trace's turn, and every row measured
    until then was lost.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     gone = os.path.join(d, "gone")
    ...     missing_requirements([Router("nothing", "p", lambda u, p, t: [gone, "serve"]),
    ...                           Router("direct", "client round-robin", None)],
    ...                          "all", ["shared-prefix", "mooncake-trace"],
    ...                          gone + ".jsonl") == [
    ...         f"nothing: {gone} is not installed",
    ...         f"mooncake-trace: no trace file at {gone}.jsonl (--trace FILE, or "
    ...         "--only-workload to leave it out)"]
    True
    >>> missing_requirements([Router("py", "p", lambda u, p, t: [sys.executable, "-m",
    ...                                                         "no_such_module_here"])],
    ...                      "cost", ["mooncake-trace"], "/nonexistent") == [
    ...     f"py: no Python module no_such_module_here in {sys.executable}"]
    True
    """
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for router in routers:
            if router.command is None:
                continue
            cmd = router.command(["http://127.0.0.1:1"], 1, tmp)
            exe = cmd[0] if os.sep in cmd[0] else shutil.which(cmd[0])
            if not exe or not os.access(exe, os.X_OK):
                if (why := f"{router.name}: {cmd[0]} is not installed") not in problems:
                    problems.append(why)
            elif len(cmd) > 2 and cmd[1] == "-m":
                found = subprocess.run(
                    [exe, "-c", "import importlib.util, sys; "
                     "sys.exit(importlib.util.find_spec(sys.argv[1]) is None)", cmd[2]],
                    capture_output=True, check=False)
                if found.returncode != 0:
                    problems.append(f"{router.name}: no Python module {cmd[2]} in {exe}")
    if part in ("all", "quality") and "mooncake-trace" in workloads and not os.path.isfile(trace):
        problems.append(f"mooncake-trace: no trace file at {trace} (--trace FILE, or "
                        "--only-workload to leave it out)")
    return problems


class Bench:
    def __init__(self, opts):
        self.opts = opts
        self.binary = os.path.abspath(opts.bin)
        self.tmp = tempfile.mkdtemp(prefix="radixgate-bench-")
        self.skipped: list[str] = []  # workloads this binary cannot run, and why
        self.exited: list[str] = []  # routers that exited during a run, and when
        # Rows as they are measured, so that a run stopped part-way still
        # writes every row it has.
        self.quality_rows: list[dict] = []
        self.cost_rows: list[dict] = []
        self.routers = [r for r in all_routers(self.binary, opts.baseline_bin, tuple(opts.variant))
                        if not opts.only_router or r.name in opts.only_router]

    def log(self, name: str) -> str:
        return os.path.join(self.tmp, f"{name}.log")

    def start_workers(self, first_port: int, count: int, extra: list[str],
                      per_worker: dict[int, list[str]] | None = None):
        return start_workers(self.binary, self.log("workers"), first_port, count, extra,
                             per_worker)

    def stop_workers(self, started: list, urls: list[str]):
        for proc in started:
            procs.stop(proc)
        procs.wait_port_free([int(u.rsplit(":", 1)[1]) for u in urls])

    def start_router(self, router: Router, urls: list[str]):
        """Starts `router`; returns (process or None, URLs the load tool targets)."""
        if router.command is None:
            return None, urls
        scratch = os.path.join(self.tmp, f"{router.name}-{router.policy}")
        proc, url, self.router_ports = start_router(router, urls, scratch,
                                                    self.log(f"router-{router.name}"))
        return proc, [url]

    def note_exit(self, proc, router: Router, during: str) -> None:
        """Notes `router`'s process if it exited during `during`: its
        row's failures are that, and the results say so.

        >>> class Exited:
        ...     def poll(self):
        ...         return 137
        >>> bench = Bench.__new__(Bench)
        >>> bench.exited = []
        >>> bench.note_exit(Exited(), Router("smg", "cache_aware", None), "the zipf-hot run")
        [bench] smg (cache_aware) exited with status 137 during the zipf-hot run
        >>> bench.exited
        ['smg (cache_aware) exited with status 137 during the zipf-hot run']
        """
        if proc is not None and (status := proc.poll()) is not None:
            note = f"{router.name} ({router.policy}) exited with status {status} during {during}"
            print(f"[bench] {note}", flush=True)
            self.exited.append(note)

    def stop_router(self, proc):
        if proc is not None:
            procs.stop(proc)
            procs.wait_port_free(self.router_ports)

    # ---- routing quality -------------------------------------------------
    def quality(self) -> list[dict]:
        rows = self.quality_rows
        workloads = quality_workloads(self.opts.trace, self.opts.scale)
        for wname, wl in workloads.items():
            if self.opts.only_workload and wname not in self.opts.only_workload:
                continue
            if missing := missing_worker_flags(self.binary, wl.per_worker):
                note = f"{wname}: this `radixgate worker` has no {', '.join(missing)}"
                print(f"[quality] skipping {note}", flush=True)
                self.skipped.append(note)
                continue
            for router in self.routers:
                # Fresh workers for every router: empty caches, idle queues.
                workers, urls = self.start_workers(QUALITY_WORKER_PORT, 4, [], wl.per_worker)
                try:
                    proc, target = self.start_router(router, urls)
                    try:
                        # Behind a router the load tool sees one URL: tell it
                        # the pool, so the spread counts an idle worker.
                        extra = (["--assign", "round-robin"] if router.command is None
                                 else ["--pool-size", str(len(urls))])
                        t0 = time.time()
                        rep = run_load(self.binary, target, wl.load + extra, self.opts.seed)
                        self.note_exit(proc, router, f"the {wname} run")
                    finally:
                        self.stop_router(proc)
                finally:
                    self.stop_workers(workers, urls)
                row = {"workload": wname, "router": router.name, "policy": router.policy,
                       "wall_s": round(time.time() - t0, 1), "load_args": [repo_relative(a) for a in wl.load + extra],
                       "loadavg": os.getloadavg(), "report": rep}
                if wl.per_worker:
                    row["worker_args"] = {str(i): a for i, a in sorted(wl.per_worker.items())}
                rows.append(row)
                print(report.quality_line(row), flush=True)
        return rows

    # ---- router cost -----------------------------------------------------
    def cost(self) -> list[dict]:
        """Each router in turn, `--rounds` times over (interleaved, so that a
        busy moment of the shared machine does not land on one router only)."""
        rows = self.cost_rows
        workers, urls = self.start_workers(COST_WORKER_PORT, 2, ["--instant"])
        lua = os.path.join(self.tmp, "post.lua")
        report.write_wrk_lua(lua, MODEL)
        try:
            for rnd in range(1, self.opts.rounds + 1):
                for router in self.routers:
                    if router.name == "radixgate" and router.policy != "cache_aware":
                        continue  # cost is measured with each router's main policy
                    proc, target = self.start_router(router, urls)
                    try:
                        self.cost_one(router, proc, target, lua, rnd, rows)
                        self.note_exit(proc, router, f"the cost runs of round {rnd}")
                    finally:
                        self.stop_router(proc)
        finally:
            self.stop_workers(workers, urls)
        return rows

    def cost_one(self, router: Router, proc, target: list[str], lua: str, rnd: int,
                 rows: list[dict]) -> None:
        """Measures one router's runs of one round, each row appended to `rows`."""
        extra = ["--assign", "round-robin"] if proc is None else []
        d = str(self.opts.cost_secs)
        runs = [(f"open {r}/s", ["--rate", str(r), "--duration", d, "--requests", "1000000"])
                for r in self.opts.rates]
        runs.append(("closed c=32", ["--concurrency", "32", "--requests", str(self.opts.closed_requests)]))
        base = {"router": router.name, "policy": router.policy, "round": rnd}
        for label, args in runs:
            cpu0 = procs.cpu_seconds(proc.pid) if proc else None
            rep = run_load(self.binary, target, COST_BODY + args + extra, self.opts.seed)
            cpu1 = procs.cpu_seconds(proc.pid) if proc else None
            row = base | report.cost_from_load(rep, None if proc is None else cpu1 - cpu0)
            row |= {"run": label, "loadavg": os.getloadavg(), "args": COST_BODY + args}
            rows.append(row)
            print(report.cost_line(row), flush=True)
        if shutil.which("wrk"):
            cpu0 = procs.cpu_seconds(proc.pid) if proc else None
            url = target[0] + "/v1/chat/completions"
            out = subprocess.run(["wrk", "-t2", "-c32", f"-d{self.opts.wrk_secs}s", "--latency",
                                  "-s", lua, url], capture_output=True, text=True, check=False)
            cpu1 = procs.cpu_seconds(proc.pid) if proc else None
            row = base | report.cost_from_wrk(out.stdout, None if proc is None else cpu1 - cpu0,
                                              out.returncode, out.stderr)
            row |= {"run": "wrk c=32 4KiB", "loadavg": os.getloadavg()}
            rows.append(row)
            print(report.cost_line(row), flush=True)


def variant(spec: str) -> tuple[str, tuple[str, ...]]:
    """`NAME=ARGS` of --variant: a row name and `radixgate serve` arguments."""
    name, sep, args = spec.partition("=")
    if not sep or not name or name in {r.name for r in all_routers("", "baseline")}:
        raise argparse.ArgumentTypeError(
            f"{spec!r}: want NAME=ARGS with a NAME no other row has, e.g. "
            "'radixgate-seed=--config seed.yaml'")
    return name, tuple(shlex.split(args))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/radixgate"))
    p.add_argument("--baseline-bin", help="another radixgate binary to run side by side "
                   "(interleaved rounds) as `radixgate-baseline`, e.g. the previous commit's")
    p.add_argument("--variant", action="append", type=variant, default=[], metavar="NAME=ARGS",
                   help="another row NAME of this binary's cache_aware with these extra "
                   "`radixgate serve` arguments (repeat), e.g. "
                   "'radixgate-seed=--config seed.yaml'; --only-router needs NAME too")
    p.add_argument("--trace", default=os.path.join(ROOT, "traces", "mooncake_conversation.jsonl"))
    p.add_argument("--part", choices=["all", "quality", "cost"], default="all")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies quality request counts")
    p.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",")], default=[500, 1000, 2000])
    p.add_argument("--cost-secs", type=int, default=6)
    p.add_argument("--closed-requests", type=int, default=8000)
    p.add_argument("--wrk-secs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="cost: interleaved repetitions (median reported)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only-router", action="append", help="restrict to these router names")
    p.add_argument("--only-workload", action="append")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    opts = p.parse_args()
    if len({name for name, _ in opts.variant}) < len(opts.variant):
        p.error("two --variant rows share a name")
    if not os.path.exists(opts.bin):
        sys.exit(f"no radixgate binary at {opts.bin}: cargo build --release -p radixgate")

    names = {r.name for r in all_routers("", opts.baseline_bin, tuple(opts.variant))}
    if unknown := sorted(set(opts.only_router or []) - names):
        p.error(f"--only-router {', '.join(unknown)}: the routers are {', '.join(sorted(names))}")
    workloads = list(quality_workloads(opts.trace, opts.scale))
    if unknown := sorted(set(opts.only_workload or []) - set(workloads)):
        p.error(f"--only-workload {', '.join(unknown)}: the workloads are {', '.join(workloads)}")
    bench = Bench(opts)
    if problems := missing_requirements(
            bench.routers, opts.part,
            [w for w in workloads if not opts.only_workload or w in opts.only_workload],
            opts.trace):
        sys.exit("cannot run:\n  " + "\n  ".join(problems)
                 + "\n(bench/README.md, Requirements; --only-router to leave a router out)")
    if opts.part in ("all", "cost") and not shutil.which("wrk"):
        print("no `wrk` on PATH: the cost part runs without its wrk rows", flush=True)
        bench.skipped.append("the cost part's wrk runs: no `wrk` on PATH")
    started = dt.datetime.now(dt.timezone.utc)
    meta = report.run_meta(bench.binary, ["bench/run.py", *sys.argv[1:]], started)
    meta["peers"] = report.peer_versions()
    print(f"logs in {bench.tmp}; load average {meta['loadavg_start']}", flush=True)
    result = {"meta": meta, "quality": bench.quality_rows, "cost": bench.cost_rows}
    try:
        if opts.part in ("all", "quality"):
            bench.quality()
        if opts.part in ("all", "cost"):
            bench.cost()
    except BaseException as err:
        # A router that never got ready, a load that failed, an interrupt:
        # the rows measured so far are written all the same, marked.
        meta["aborted"] = f"{type(err).__name__}: {err}".rstrip(": ")
        raise
    finally:
        procs.stop_all()
        meta["skipped"] = bench.skipped
        meta["router_exits"] = bench.exited
        meta["loadavg_end"] = os.getloadavg()
        meta["finished_utc"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        report.write_result(opts.out, started, opts.part, result, report.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
