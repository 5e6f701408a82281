"""Tables and ratios of a bench run (markdown), plus wrk helpers.

The examples in the docstrings are checked by `python3 -m doctest bench/report.py`.
"""

import datetime as dt
import json
import os
import platform
import re
import signal
import subprocess

from routers import PEERS


def run_meta(binary: str, command: list[str], started: dt.datetime) -> dict:
    """What every results file records about its run: when, the exact command, the build, the box."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {"started_utc": started.isoformat(timespec="seconds"),
            "command": " ".join(command),
            "host": platform.node(), "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
            "radixgate": subprocess.run([binary, "version"], capture_output=True,
                                        text=True).stdout.strip(),
            "git": subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip()}


def stop_on_sigterm():
    """Makes a SIGTERM (a `timeout`'s, a supervisor's) end the run as
    Ctrl-C does, with KeyboardInterrupt, so that a script that catches it
    writes the rows it measured before it stops (`interrupted` in its
    meta), rather than nothing.

    >>> import os, time
    >>> stop_on_sigterm()
    >>> try:
    ...     os.kill(os.getpid(), signal.SIGTERM)
    ...     time.sleep(5)
    ... except KeyboardInterrupt:
    ...     print("stopped")
    stopped
    >>> _ = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    """
    def stop(_signum, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)


def result_stem(out_dir: str, started: dt.datetime, part: str) -> str:
    """`<out_dir>/<UTC start>-<part>` (the directory is created); a run
    started in the same minute as one already written gets its seconds too,
    `<UTC start>-<SS>s-<part>`, so it never overwrites that one."""
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, started.strftime("%Y-%m-%dT%H%MZ") + f"-{part}")
    if any(os.path.exists(stem + ext) for ext in (".json", ".md")):
        stem = os.path.join(out_dir, started.strftime("%Y-%m-%dT%H%MZ-%Ss") + f"-{part}")
    return stem


def write_result(out_dir: str, started: dt.datetime, part: str, result, markdown) -> str:
    """Writes `result` as `<stem>.json` and `markdown(result)` as
    `<stem>.md` (stem from `result_stem`), says so, and returns the stem."""
    stem = result_stem(out_dir, started, part)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(markdown(result))
    print(f"wrote {stem}.md and .json")
    return stem


def _f(x, fmt="{:.1f}"):
    return "–" if x is None else fmt.format(x)


def _label(row):
    return f"{row['router']} ({row['policy']})"


def quality_line(row) -> str:
    r = row["report"]
    t = r.get("ttft_ms") or {}
    return (f"[quality] {row['workload']:15} {_label(row):34} ok={r['ok']} failed={r['failed']} "
            f"hit={_f(r['hit_rate'], '{:.3f}')} ttft_mean={_f(t.get('mean'))} "
            f"spread={_f(r['spread'], '{:.2f}')}")


def _per_1k(cpu_s, ok):
    return None if cpu_s is None or not ok else cpu_s / ok * 1000


def cost_from_load(rep: dict, cpu_s: float | None) -> dict:
    """A cost row's measures from a `radixgate load --json` report."""
    e = rep.get("e2e_ms") or {}
    return {"rps": rep["requests_per_s"], "ok": rep["ok"], "errors": rep["failed"],
            "p50_ms": e.get("p50"), "p99_ms": e.get("p99"),
            "cpu_s": None if cpu_s is None else round(cpu_s, 3),
            "cpu_s_per_1k": _per_1k(cpu_s, rep["ok"]), "report": rep}


def cost_from_wrk(out: str, cpu_s: float | None, code: int = 0, err: str = "") -> dict:
    r"""A cost row's measures from wrk's output.

    wrk's Requests/sec counts every response, its non-2xx ones included;
    the row's rate counts the successful ones only, as the load tool's
    `requests_per_s` does, so a router that answers errors fast does not
    gain throughput by them:

    >>> row = cost_from_wrk("  100 requests in 2.00s, 1KB read\n"
    ...                     "  Non-2xx or 3xx responses: 75\nRequests/sec:     50.00\n", 1.0)
    >>> row["rps"], row["ok"], row["errors"]
    (12.5, 25, 75)

    A wrk that measured nothing (it could not connect: the router is
    gone) is a failed run, not a router that served 0 req/s without an
    error; its round is left out of the medians and the table says so:

    >>> gone = cost_from_wrk("", 0.0, 1, "unable to connect to 127.0.0.1:1 Connection refused\n")
    >>> gone["rps"], gone["ok"], gone["cpu_s_per_1k"], gone["failed_run"]
    (None, 0, None, 'wrk exited 1: unable to connect to 127.0.0.1:1 Connection refused')
    >>> base = {"router": "radixgate", "policy": "cache_aware", "run": "wrk c=32 4KiB"}
    >>> [m] = cost_medians([base | row, base | gone])
    >>> m["rps"], m["failed_runs"]
    (12.5, 1)
    """
    w = parse_wrk(out)
    if not re.search(r"\d+ requests in ", out):
        why = (err.strip() or out.strip() or "no output").splitlines()[-1]
        return {"rps": None, "ok": 0, "errors": 0, "p50_ms": None, "p99_ms": None,
                "cpu_s": None if cpu_s is None else round(cpu_s, 3), "cpu_s_per_1k": None,
                "wrk": out, "wrk_stderr": err, "failed_run": f"wrk exited {code}: {why}"}
    ok = w["requests"] - w["non2xx"]
    rps = w["rps"] * ok / w["requests"] if w["requests"] else 0.0
    return {"rps": rps, "ok": ok, "errors": w["non2xx"] + w["socket_errors"],
            "p50_ms": w["p50_ms"], "p99_ms": w["p99_ms"],
            "cpu_s": None if cpu_s is None else round(cpu_s, 3),
            "cpu_s_per_1k": _per_1k(cpu_s, ok), "wrk": out}


def cost_line(row) -> str:
    failed = f" FAILED: {row['failed_run']}" if row.get("failed_run") else ""
    return (f"[cost r{row['round']}] {_label(row):34} {row['run']:14} {_f(row['rps'], '{:.0f}')} "
            f"req/s p50={_f(row['p50_ms'], '{:.2f}')}ms p99={_f(row['p99_ms'], '{:.2f}')}ms "
            f"errors={row['errors']} cpu={row['cpu_s']} s per1k={_f(row['cpu_s_per_1k'], '{:.3f}')}"
            f"{failed}")


def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def cost_medians(rows) -> list[dict]:
    """One row per (router, policy, run): the median of each measure over rounds."""
    keys, groups = [], {}
    for r in rows:
        k = (r["router"], r["policy"], r["run"])
        if k not in groups:
            keys.append(k)
            groups[k] = []
        groups[k].append(r)
    out = []
    for k in keys:
        g = groups[k]
        m = {"router": k[0], "policy": k[1], "run": k[2], "rounds": len(g),
             "errors": sum(r["errors"] for r in g), "ok": sum(r["ok"] for r in g),
             "failed_runs": sum(1 for r in g if r.get("failed_run"))}
        for f in ("rps", "p50_ms", "p99_ms", "cpu_s_per_1k"):
            m[f] = _median([r[f] for r in g])
        m["cpu_s_per_1k_all"] = [r["cpu_s_per_1k"] for r in g]
        out.append(m)
    return out


def wrk_body(model: str, stream: bool = False, prompt_kib: int = 0) -> str:
    """One 4 KiB chat completion body (whole unless `stream`); with
    `prompt_kib` its user message is that many KiB of the same text
    repeated."""
    words = ("the router sends each request to the worker most likely to hold its "
             "prompt prefix in cache unless that overloads it ").split()
    text, i = [], 0
    while len(" ".join(text)) < 4000:
        text.append(words[i % len(words)])
        i += 1
    content = " ".join(text)
    if prompt_kib:
        size = prompt_kib * 1024
        content = (content * (size // len(content) + 1))[:size]
    return json.dumps({"model": model, "max_tokens": 16, "stream": stream, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": content}]})


def write_wrk_lua(path: str, model: str, stream: bool = False, prompt_kib: int = 0) -> None:
    """A wrk script POSTing one `wrk_body`."""
    body = wrk_body(model, stream, prompt_kib)
    with open(path, "w") as f:
        f.write('wrk.method = "POST"\n')
        f.write('wrk.headers["Content-Type"] = "application/json"\n')
        f.write(f"wrk.body = {json.dumps(body)}\n")


def _ms(v: str, unit: str) -> float:
    return float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def parse_wrk(out: str) -> dict:
    """Requests, req/s, p50/p99 latency (ms) and errors from wrk --latency output."""
    res = {"requests": 0, "rps": 0.0, "p50_ms": None, "p99_ms": None, "non2xx": 0, "socket_errors": 0}
    if m := re.search(r"(\d+) requests in ([\d.]+)(\w+)", out):
        res["requests"] = int(m.group(1))
    if m := re.search(r"Requests/sec:\s+([\d.]+)", out):
        res["rps"] = float(m.group(1))
    for q, key in (("50", "p50_ms"), ("99", "p99_ms")):
        if m := re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
            res[key] = round(_ms(m.group(1), m.group(2)), 3)
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        res["non2xx"] = int(m.group(1))
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        res["socket_errors"] = sum(int(x) for x in m.groups())
    return res


def peer_versions() -> dict:
    """Versions of the peers that are installed (a run restricted with
    --only-router needs none of them)."""
    try:
        out = subprocess.run([f"{PEERS}/bin/pip", "list", "--format", "json"],
                             capture_output=True, text=True)
        pkgs = {p["name"].lower(): p["version"] for p in json.loads(out.stdout)}
    except (OSError, json.JSONDecodeError, KeyError):
        pkgs = {}
    try:
        nginx = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip()
    except OSError:
        nginx = None
    return {k: pkgs.get(k) for k in ("smg", "sglang-router", "vllm-router")} | {"nginx": nginx}


def _find(rows, router, policy=None, **kw):
    for r in rows:
        if r["router"] == router and (policy is None or r["policy"] == policy) and \
                all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def markdown(result) -> str:
    """The results file's text. A run stopped part-way says so above its rows:

    >>> meta = {"started_utc": "T", "command": "c", "radixgate": "v", "git": "g", "peers": {},
    ...         "cpus": 2, "loadavg_start": [0, 0, 0], "aborted": "RuntimeError: could not start smg"}
    >>> markdown({"meta": meta, "quality": [], "cost": []}).splitlines()[6]
    '**Stopped part-way** (RuntimeError: could not start smg): only the rows below were measured.'
    """
    m = result["meta"]
    out = [f"# radixgate bench — {m['started_utc']}", "",
           f"Command: `{m['command']}` ({m['radixgate']}, git {m['git']}); "
           f"peers {m['peers']}.", "",
           f"Host: {m['cpus']} CPUs, shared; load average at start {m['loadavg_start']}, "
           f"at end {m.get('loadavg_end')}. Finished {m.get('finished_utc')}.", ""]
    if m.get("aborted"):
        out += [f"**Stopped part-way** ({m['aborted']}): only the rows below were measured.", ""]
    q = result["quality"]
    if q:
        out += ["## Routing quality (4 simulated workers, fresh for every router)", "",
                "| workload | router (policy) | ok | failed | hit rate | TTFT mean ms | TTFT p99 ms "
                "| E2E mean ms | E2E p99 ms | spread | errors |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in q:
            r = row["report"]
            t, e = r.get("ttft_ms") or {}, r.get("e2e_ms") or {}
            out.append(f"| {row['workload']} | {_label(row)} | {r['ok']} | {r['failed']} | "
                       f"{_f(r['hit_rate'], '{:.3f}')} | {_f(t.get('mean'))} | {_f(t.get('p99'))} | "
                       f"{_f(e.get('mean'))} | {_f(e.get('p99'))} | {_f(r['spread'], '{:.2f}')} | "
                       f"{json.dumps(r['errors']) if r['errors'] else ''} |")
        out += ["", "Load arguments per workload (plus `--seed`, `--model`, `--json`):", ""]
        seen = set()
        for row in q:
            if row["workload"] not in seen:
                seen.add(row["workload"])
                args = ' '.join(a for a in row['load_args'] if a not in ('--assign', 'round-robin'))
                workers = "".join(f"; worker {i} with `{' '.join(a)}`"
                                  for i, a in row.get("worker_args", {}).items())
                out.append(f"- {row['workload']}: `{args}`{workers}")
        out.append("")
    if m.get("skipped"):
        out += ["Workloads not run: " + "; ".join(m["skipped"]) + ".", ""]
    if m.get("router_exits"):
        out += ["**Routers that exited during a run** (their rows' failures are that): "
                + "; ".join(m["router_exits"]) + ".", ""]
    c = cost_medians(result["cost"])
    if c:
        out += ["## Router cost (2 `radixgate worker --instant` workers)", "",
                "Medians over the interleaved rounds (each router in turn, then again). "
                "CPU = utime+stime of the router's process tree over the run (/proc), per "
                "1,000 successful requests; the per-round values are in brackets. Added latency = "
                "this router's E2E percentile minus direct-to-worker's (same run, medians).", "",
                "| router (policy) | run | req/s | ok (all rounds) | errors | CPU s / 1k req | per round "
                "| p50 ms | p99 ms | added p50 ms | added p99 ms |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in c:
            d = _find(c, "direct", run=row["run"])
            add = lambda f: None if row["router"] == "direct" or not d or None in (row[f], d[f]) else row[f] - d[f]  # noqa: E731
            per = ", ".join(_f(x, "{:.3f}") for x in row["cpu_s_per_1k_all"])
            errors = f"{row['errors']}" + (f", {row['failed_runs']} of {row['rounds']} runs "
                                           "measured nothing" if row["failed_runs"] else "")
            out.append(f"| {_label(row)} | {row['run']} | {_f(row['rps'], '{:.0f}')} | {row['ok']} | {errors} | "
                       f"{_f(row['cpu_s_per_1k'], '{:.3f}')} | [{per}] | {_f(row['p50_ms'], '{:.2f}')} | "
                       f"{_f(row['p99_ms'], '{:.2f}')} | {_f(add('p50_ms'), '{:+.2f}')} | "
                       f"{_f(add('p99_ms'), '{:+.2f}')} |")
        out += ["", "Load-tool runs send whole (non-streamed) chat completions: "
                "`" + " ".join(result["cost"][0].get("args", [])[:12]) + " …`; wrk: "
                "`wrk -t2 -c32 --latency -s post.lua` with one 4 KiB chat body (max_tokens 16).", ""]
    out += ratios(result)
    return "\n".join(out) + "\n"


def _met(within: bool, failed: int, runs_failed: int = 0) -> str:
    """A target's verdict: met only when within it and radixgate failed no
    request, since its figures count only the requests that succeeded (a
    router that fails fast would look cheap, fast and cache-friendly), and
    no run of it measured nothing (its medians leave that round out).

    >>> _met(True, 0), _met(False, 0), _met(True, 3), _met(True, 0, 1)
    ('yes', 'no', 'no (3 failed)', 'no (1 run measured nothing)')
    """
    if failed:
        return f"no ({failed} failed)"
    if runs_failed:
        return f"no ({runs_failed} run{'s' if runs_failed > 1 else ''} measured nothing)"
    return "yes" if within else "no"


def ratios(result) -> list[str]:
    """radixgate (cache_aware) against smg, from this run, beside issue 5's
    targets. A target counts as met only when radixgate failed no request:

    >>> cost = [{"router": r, "policy": "cache_aware", "run": "closed c=32", "rps": x,
    ...          "ok": ok, "errors": err, "p50_ms": 1.0, "p99_ms": 2.0, "cpu_s_per_1k": cpu}
    ...         for r, x, ok, err, cpu in [("radixgate", 3000, 100, 900, 0.1),
    ...                                    ("smg", 500, 1000, 0, 1.0)]]
    >>> [line.rsplit("|", 2)[1].strip() for line in ratios({"cost": cost, "quality": []})[-3:-1]]
    ['no (900 failed)', 'no (900 failed)']
    >>> quality = [{"workload": "w", "router": r, "policy": "cache_aware", "report":
    ...             {"hit_rate": h, "ttft_ms": {"mean": t}, "failed": f}}
    ...            for r, h, t, f in [("radixgate", 0.9, 100.0, 90), ("smg", 0.8, 200.0, 0)]]
    >>> [line.rsplit("|", 2)[1].strip() for line in ratios({"cost": [], "quality": quality})[-3:-1]]
    ['no (90 failed)', 'no (90 failed)']
    """
    lines = ["## radixgate (cache_aware) vs smg, same run", "",
             "| measure | radixgate | smg | ratio | target | met |", "|---|---|---|---|---|---|"]
    c = cost_medians(result["cost"])
    if c:
        lines[2:2] = ["Issue 5 quotes smg's figures and sets its CPU and throughput targets for the wrk "
                      "run (32 connections, 4 KiB bodies); the other cost rows hold radixgate to the "
                      "same bounds at fixed rates and in the load tool's closed loop.", ""]
    for row in c:
        if row["router"] != "radixgate":
            continue
        s = _find(c, "smg", run=row["run"])
        if not s:
            continue
        a, b = row["cpu_s_per_1k"], s["cpu_s_per_1k"]
        if a is not None and b:
            lines.append(f"| CPU s / 1k req, {row['run']} | {a:.3f} | {b:.3f} | {a / b:.2f}× | ≤ 0.25× | "
                         f"{_met(a / b <= 0.25, row['errors'], row['failed_runs'])} |")
        if row["run"].startswith(("closed", "wrk")) and row["rps"] is not None and s["rps"]:
            ra, rb = row["rps"], s["rps"]
            lines.append(f"| throughput req/s, {row['run']} | {ra:.0f} | {rb:.0f} | {ra / rb:.2f}× | ≥ 3× | "
                         f"{_met(ra / rb >= 3, row['errors'], row['failed_runs'])} |")
    for row in result["quality"]:
        if row["router"] != "radixgate" or row["policy"] != "cache_aware":
            continue
        s = _find(result["quality"], "smg", workload=row["workload"])
        if not s:
            continue
        failed = row["report"]["failed"]
        ha, hb = row["report"]["hit_rate"], s["report"]["hit_rate"]
        if ha is not None and hb is not None:
            lines.append(f"| hit rate, {row['workload']} | {ha:.3f} | {hb:.3f} | {ha - hb:+.3f} | ≥ smg | "
                         f"{_met(ha >= hb - 0.0005, failed)} |")
        ta, tb = (row["report"].get("ttft_ms") or {}).get("mean"), (s["report"].get("ttft_ms") or {}).get("mean")
        if ta is not None and tb:
            lines.append(f"| TTFT mean ms, {row['workload']} | {ta:.1f} | {tb:.1f} | {ta / tb:.2f}× | ≤ smg | "
                         f"{_met(ta <= tb, failed)} |")
    return lines + [""]
