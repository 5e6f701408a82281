#!/usr/bin/env python3
"""Prefill/decode disaggregation for real: `radixgate serve` over simulated
prefill and decode workers against a co-located pool of the same size, with
smg and vllm-router in their PD modes as references (bench/README.md).

For each workload and each row in turn, fresh workers (empty caches, idle
queues) and `radixgate load --json` with the same seed. The rows:

- colocated: `serve --policy cache_aware` over P+D regular workers;
- pd-sglang: `serve --pd-disaggregation` over P prefill workers (each with a
  bootstrap port) and D decode workers, SGLang's bootstrap protocol,
  defaults otherwise (prefill cache_aware, decode power_of_two);
- pd-vllm: the same with `--pd-protocol vllm` (two steps, kv_transfer_params);
- pd-skip: pd-sglang with `--decode-policy cache_aware
  --pd-skip-prefill-tokens N`: a request whose decode worker is predicted to
  hold all but N of its prompt goes to decode alone;
- pd-prefill-rr: pd-sglang with `--prefill-policy round_robin`;
- smg-pd: `smg` (python -m smg.launch_router) `--pd-disaggregation`,
  prefill cache_aware, decode power_of_two (needs the peers' venv);
- vllm-router-pd: `vllm-router --vllm-pd-disaggregation`, prefill
  cache_aware, decode power_of_two (needs the peers' venv).

A peer that does not start, or does not answer a chat completion through the
simulated workers, gets a row saying exactly what it answered and what it
logged; nothing is measured for it.

Besides the client's report, each row reads every worker's own /metrics
after the load (the prefill pool's hit rate, the decode pool's local
prefills and KV transfers, each pool's busy share) and the router's
radixgate_pd_requests_total / radixgate_pd_failures_total.

The default rates load the pool without saturating it: long-doc at 4 req/s
keeps the two prefill workers about half busy, multi-turn at 24 req/s keeps
the two decode workers stepping all the time with a flat TTFT (bench/README.md
has the scan that picked them).

Writes bench/results/<UTC date-time>-pd.{json,md}. Ports: 35000-35999.
"""

import argparse
import datetime as dt
import json
import os
import re
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procs  # noqa: E402
import report  # noqa: E402
from routers import PEERS, Router  # noqa: E402
from run import (HERE, MODEL, ROOT, ready_body, repo_relative, run_load,  # noqa: E402
                 start_router, start_workers)

PREFILL_PORT = 35100    # prefill workers' HTTP ports
DECODE_PORT = 35200     # decode (and co-located) workers
BOOTSTRAP_PORT = 35300  # prefill workers' KV pull listeners
ROUTER_PORT = 35500     # (run.py's) +1 for a peer's metrics port

ROWS = ["colocated", "pd-sglang", "pd-vllm", "pd-skip", "pd-prefill-rr", "smg-pd",
        "vllm-router-pd"]


def workloads(opts) -> dict[str, list[str]]:
    """name -> `radixgate load` arguments (streamed chat, the default)."""
    n = lambda x: str(max(20, int(x * opts.scale)))  # noqa: E731
    return {
        # Mostly new 8k-token documents: every request is a long prefill
        # followed by 256 output tokens (docs/pd.md's long-prompt load).
        "long-doc": ["--workload", "long-doc", "--documents", "1000", "--output-tokens", "256",
                     "--rate", str(opts.long_doc_rate),
                     "--requests", n(opts.long_doc_rate * opts.secs)],
        # Conversations whose every turn resends the history: the prompt a
        # decode worker just served comes back with one more exchange.
        "multi-turn": ["--workload", "multi-turn", "--think-ms", "300",
                       "--rate", str(opts.multi_turn_rate),
                       "--requests", n(opts.multi_turn_rate * opts.secs)],
    }


# ---- routers ---------------------------------------------------------------

def radixgate_colocated(binary: str, urls: list[str]):
    def cmd(_urls, port, _tmp):
        return [binary, "serve", "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warn", "--policy", "cache_aware", "--worker-urls", *urls]
    return cmd


def radixgate_pd(binary: str, prefill: list[tuple[str, int]], decode: list[str],
                 extra: list[str]):
    def cmd(_urls, port, _tmp):
        c = [binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warn",
             "--pd-disaggregation"]
        for url, bport in prefill:
            c += ["--prefill", url, str(bport)]
        for url in decode:
            c += ["--decode", url]
        return c + extra
    return cmd


def smg_pd(prefill: list[tuple[str, int]], decode: list[str]):
    def cmd(_urls, port, _tmp):
        c = [f"{PEERS}/bin/python", "-m", "smg.launch_router", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warn", "--prometheus-port", str(port + 1),
             "--pd-disaggregation", "--prefill-policy", "cache_aware",
             "--decode-policy", "power_of_two"]
        for url, bport in prefill:
            c += ["--prefill", url, str(bport)]
        for url in decode:
            c += ["--decode", url]
        return c
    return cmd


def vllm_router_pd(prefill: list[tuple[str, int]], decode: list[str]):
    def cmd(_urls, port, _tmp):
        c = [f"{PEERS}/bin/vllm-router", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "warning", "--prometheus-port", str(port + 1),
             "--vllm-pd-disaggregation", "--prefill-policy", "cache_aware",
             "--decode-policy", "power_of_two"]
        for url, _bport in prefill:
            c += ["--prefill", url]
        for url in decode:
            c += ["--decode", url]
        return c
    return cmd


def row_router(name: str, binary: str, prefill, decode, skip_tokens: int) -> Router:
    """The router of row `name` in front of these workers."""
    if name == "colocated":
        return Router("radixgate", "cache_aware, co-located", radixgate_colocated(binary, decode))
    if name == "pd-sglang":
        return Router("radixgate", "pd sglang", radixgate_pd(binary, prefill, decode, []))
    if name == "pd-vllm":
        return Router("radixgate", "pd vllm", radixgate_pd(
            binary, prefill, decode, ["--pd-protocol", "vllm"]))
    if name == "pd-skip":
        return Router("radixgate", f"pd sglang, skip <= {skip_tokens}", radixgate_pd(
            binary, prefill, decode, ["--decode-policy", "cache_aware",
                                      "--pd-skip-prefill-tokens", str(skip_tokens)]))
    if name == "pd-prefill-rr":
        return Router("radixgate", "pd sglang, prefill round_robin", radixgate_pd(
            binary, prefill, decode, ["--prefill-policy", "round_robin"]))
    if name == "smg-pd":
        return Router("smg", "pd (sglang)", smg_pd(prefill, decode))
    if name == "vllm-router-pd":
        return Router("vllm-router", "pd (vllm)", vllm_router_pd(prefill, decode))
    raise ValueError(name)


def probe(url: str) -> str:
    """What one chat completion through `url` answers: status and body head."""
    req = urllib.request.Request(url + "/v1/chat/completions", data=ready_body(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return f"{resp.status} {resp.read(400).decode(errors='replace')}"
    except urllib.error.HTTPError as err:
        return f"{err.code} {err.read(400).decode(errors='replace')}"
    except Exception as err:  # noqa: BLE001 - recorded as it is
        return f"no answer: {err}"


def start_peer(router: Router, urls: list[str], scratch: str, log: str, timeout: float):
    """A peer router, one try: (process, URL, ports, command) once a chat
    completion through it answers 200, else (None, what it answered, its
    log's tail, command)."""
    os.makedirs(scratch, exist_ok=True)
    port = procs.free_block(ROUTER_PORT, 2)
    cmd = router.command(urls, port, scratch)
    proc = procs.start(cmd, log)
    url = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http(url + "/v1/chat/completions", timeout=timeout, body=ready_body(),
                        alive=proc)
    except RuntimeError as err:
        answer = probe(url) if proc.poll() is None else f"process exited ({proc.returncode})"
        procs.stop(proc)
        with open(log, errors="replace") as f:
            tail = f.read()[-3000:]
        return None, f"{err}; last answer: {answer}", tail, cmd
    time.sleep(1.0)
    return proc, url, [port, port + 1], cmd


def scrub(text: str, binary: str, tmp: str) -> str:
    """`text` without this machine's paths (results are committed)."""
    return (text.replace(binary, repo_relative(binary)).replace(PEERS, "PEERS")
            .replace(tmp, "TMP"))


# ---- metrics ---------------------------------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)')


def scrape(url: str, prefix: str) -> dict[str, float]:
    """`url`/metrics series whose names start with `prefix`, name{labels} -> value."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            text = resp.read().decode(errors="replace")
    except Exception:  # noqa: BLE001 - a missing scrape is an empty one
        return {}
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1).startswith(prefix):
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


POOL_SERIES = ["prompt_tokens_total", "cached_tokens_total", "requests_completed_total",
               "generation_tokens_total", "kv_transfers_total", "kv_transfer_tokens_total",
               "kv_transfer_errors_total", "kv_pulls_served_total", "busy_seconds_total",
               "server_errors_total", "cancelled_total"]


def pool_totals(urls: list[str]) -> dict[str, float]:
    """The radixgate_sim_* counters of `urls`, summed over the pool."""
    tot = {k: 0.0 for k in POOL_SERIES}
    for u in urls:
        for key, v in scrape(u, "radixgate_sim_").items():
            name = key.split("{", 1)[0].removeprefix("radixgate_sim_")
            if name in tot:
                tot[name] += v
    tot["workers"] = len(urls)
    return tot


def engine_view(pools: dict[str, dict], elapsed: float) -> dict:
    """What the workers themselves counted.

    computed_hit_rate: of the prompt tokens that some engine had to prefill
    (prefill pool, plus a decode worker's own prefills on the skip path),
    the share found in that engine's prefix cache. A decode worker counts a
    transferred prompt as wholly cached; those tokens (its
    kv_transfer_tokens_total) are taken out of its prompt and cached counts
    here, so they do not inflate the rate.
    """
    pre, dec = pools.get("prefill"), pools.get("decode") or pools.get("regular")
    moved = dec["kv_transfer_tokens_total"]
    prompt = dec["prompt_tokens_total"] - moved
    cached = dec["cached_tokens_total"] - moved
    out = {}
    if pre is not None:
        out["prefill_hit_rate"] = (pre["cached_tokens_total"] / pre["prompt_tokens_total"]
                                   if pre["prompt_tokens_total"] else None)
        out["decode_local_prompt_tokens"] = prompt
        out["decode_local_hit_rate"] = cached / prompt if prompt > 0 else None
        prompt += pre["prompt_tokens_total"]
        cached += pre["cached_tokens_total"]
        out["prefill_busy"] = pre["busy_seconds_total"] / (elapsed * pre["workers"])
    out["computed_prompt_tokens"] = prompt
    out["computed_hit_rate"] = cached / prompt if prompt else None
    out["decode_busy"] = dec["busy_seconds_total"] / (elapsed * dec["workers"])
    out["kv_transfers"] = dec["kv_transfers_total"]
    out["kv_transfer_errors"] = dec["kv_transfer_errors_total"]
    return out


def pd_paths(series: dict[str, float]) -> dict[str, float]:
    """radixgate_pd_requests_total / _failures_total by label, e.g. {"paired": 300}."""
    out = {}
    for k, v in series.items():
        m = re.match(r'radixgate_pd_(requests|failures)_total\{.*?(?:path|side)="([^"]+)"', k)
        if m:
            key = m.group(2) if m.group(1) == "requests" else f"failed {m.group(2)}"
            out[key] = out.get(key, 0) + v
    return out


# ---- one row ---------------------------------------------------------------

def run_row(opts, binary: str, tmp: str, wname: str, load_args: list[str], name: str) -> dict:
    log = os.path.join(tmp, "workers.log")
    p, d = opts.prefill, opts.decode
    started, pools_urls, prefill = [], {}, []
    try:
        if name == "colocated":
            ws, urls = start_workers(binary, log, DECODE_PORT, p + d, [])
            started += ws
            pools_urls["regular"] = urls
        else:
            bport = procs.free_block(BOOTSTRAP_PORT, p)
            ws, purls = start_workers(binary, log, PREFILL_PORT, p,
                                      ["--role", "prefill", "--bootstrap-port", str(bport)])
            started += ws
            ws, durls = start_workers(binary, log, DECODE_PORT, d, ["--role", "decode"])
            started += ws
            pools_urls = {"prefill": purls, "decode": durls}
            prefill = [(u, bport + i) for i, u in enumerate(purls)]
        decode = pools_urls.get("decode") or pools_urls["regular"]
        router = row_router(name, binary, prefill, decode, opts.skip_tokens)
        all_urls = [u for us in pools_urls.values() for u in us]
        scratch = os.path.join(tmp, name)
        rlog = os.path.join(tmp, f"router-{name}.log")
        row = {"workload": wname, "row": name, "router": router.name, "policy": router.policy,
               "load_args": [repo_relative(a) for a in load_args],
               "pools": {k: len(v) for k, v in pools_urls.items()}}
        t0 = time.time()
        if router.name == "radixgate":
            proc, url, ports = start_router(router, all_urls, scratch, rlog)
            row["router_command"] = scrub(" ".join(router.command(all_urls, ports[0], scratch)),
                                          binary, tmp)
        else:
            proc, url, ports, cmd = start_peer(router, all_urls, scratch, rlog,
                                               opts.peer_timeout)
            row["router_command"] = scrub(" ".join(cmd), binary, tmp)
            if proc is None:
                row |= {"not_working": scrub(url, binary, tmp),
                        "log_tail": scrub(ports, binary, tmp)}
                return row
        try:
            # Deltas over the load: the readiness probe is left out.
            before = {k: pool_totals(v) for k, v in pools_urls.items()}
            paths0 = pd_paths(scrape(url, "radixgate_pd_")) if router.name == "radixgate" else {}
            rep = run_load(binary, [url], load_args, opts.seed)
            after = {k: pool_totals(v) for k, v in pools_urls.items()}
            paths1 = pd_paths(scrape(url, "radixgate_pd_")) if router.name == "radixgate" else {}
        finally:
            procs.stop(proc)
            procs.wait_port_free(ports)
        pools = {k: {s: after[k][s] - before[k].get(s, 0.0) for s in after[k]} | {
            "workers": after[k]["workers"]} for k in after}
        row |= {"wall_s": round(time.time() - t0, 1), "loadavg": os.getloadavg(),
                "report": rep, "pools_metrics": pools,
                "engine": engine_view(pools, rep["elapsed_s"]),
                "router_pd": {k: v - paths0.get(k, 0.0) for k, v in paths1.items()}}
        return row
    finally:
        for w in started:
            procs.stop(w)
        ports = [int(u.rsplit(":", 1)[1]) for us in pools_urls.values() for u in us]
        ports += [b for _, b in prefill]
        procs.wait_port_free(ports)


# ---- report ----------------------------------------------------------------

def _pct(x):
    return report._f(None if x is None else x * 100, "{:.1f}%")


def _busy(e: dict) -> str:
    """Busy shares: prefill/decode, or the co-located pool's."""
    return (f"{e['prefill_busy']:.2f}/{e['decode_busy']:.2f}" if "prefill_busy" in e
            else f"{e['decode_busy']:.2f}")


def line(row) -> str:
    if "not_working" in row:
        return f"[pd] {row['workload']:10} {row['row']:15} NOT WORKING: {row['not_working'][:300]}"
    r, e = row["report"], row["engine"]
    t, tp = r.get("ttft_ms") or {}, r.get("tpot_ms") or {}
    return (f"[pd] {row['workload']:10} {row['row']:15} ok={r['ok']} failed={r['failed']} "
            f"hit(client)={_pct(r['hit_rate'])} hit(computed)={_pct(e.get('computed_hit_rate'))} "
            f"ttft={report._f(t.get('mean'))}/{report._f(t.get('p99'))} "
            f"tpot={report._f(tp.get('mean'), '{:.2f}')}/{report._f(tp.get('p99'), '{:.2f}')} "
            f"rps={r['requests_per_s']:.2f} busy={_busy(e)} pd={row['router_pd']}")


def markdown(result: dict) -> str:
    m = result["meta"]
    o = m["options"]
    out = ["# Prefill/decode disaggregation: serve over simulated PD workers", "",
           f"`{m['command']}` at {m['started_utc']}, commit {m.get('git') or '?'}, "
           f"{m['radixgate']}; {m['cpus']} CPUs, load average {m['loadavg_start']} at the start, "
           f"{m.get('loadavg_end')} at the end. Peers: {m.get('peers')}.", "",
           f"Pools: {o['prefill']} prefill + {o['decode']} decode workers against "
           f"{o['prefill'] + o['decode']} co-located, started fresh for every row (default "
           "timing model, KV moved at the default 50 GB/s); streamed chat completions; "
           f"seed {o['seed']}.", "",
           "Columns: **hit (client)** is Σ cached / Σ prompt tokens in the answers' usage "
           "(in PD a decode worker reports the whole prompt cached after the transfer); "
           "**hit (computed)** is the same share over the prompts an engine had to "
           "prefill, read from the workers' own /metrics (prefill pool, plus decode's own "
           "prefills on the skip path; transferred tokens left out); **prefill hit** is "
           "the prefill pool alone; **busy** is each pool's simulated compute seconds per "
           "worker per second of the run (prefill/decode, or the co-located pool); "
           "**paths** is the router's radixgate_pd_requests_total by path (and "
           "radixgate_pd_failures_total by side). TTFT/TPOT in ms (TPOT: time per output "
           "token, (E2E − TTFT) / (output tokens − 1)).", ""]
    for w in dict.fromkeys(r["workload"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["workload"] == w]
        args = next((r["load_args"] for r in rows if "load_args" in r), [])
        out += [f"## {w}", "", f"`radixgate load {' '.join(args)} --seed {o['seed']}`", "",
                "| row | router | ok | failed | hit (client) | hit (computed) | prefill hit | "
                "TTFT mean | TTFT p99 | TPOT mean | TPOT p99 | E2E mean | req/s | out tok/s | "
                "busy | paths |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                "---:|---:|---|---|"]
        for r in rows:
            if "not_working" in r:
                out.append(f"| {r['row']} | {r['router']} ({r['policy']}) | – | – | – | – | – | "
                           "– | – | – | – | – | – | – | – | did not work, see below |")
                continue
            rep, e = r["report"], r["engine"]
            t, tp, e2e = (rep.get("ttft_ms") or {}, rep.get("tpot_ms") or {},
                          rep.get("e2e_ms") or {})
            busy = _busy(e)
            paths = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["router_pd"].items()))
            out.append(
                f"| {r['row']} | {r['router']} ({r['policy']}) | {rep['ok']} | {rep['failed']} | "
                f"{_pct(rep['hit_rate'])} | {_pct(e.get('computed_hit_rate'))} | "
                f"{_pct(e.get('prefill_hit_rate'))} | {report._f(t.get('mean'))} | "
                f"{report._f(t.get('p99'))} | {report._f(tp.get('mean'), '{:.2f}')} | "
                f"{report._f(tp.get('p99'), '{:.2f}')} | {report._f(e2e.get('mean'))} | "
                f"{rep['requests_per_s']:.2f} | {rep['output_tokens_per_s']:.0f} | {busy} | "
                f"{paths or '–'} |")
        out.append("")
    broken = [r for r in result["rows"] if "not_working" in r]
    if broken:
        out += ["## Peers that did not work with the simulated workers", ""]
        for r in broken:
            out += [f"### {r['row']} on {r['workload']}", "", f"`{r['router_command']}`", "",
                    "What it answered:", "", "```", r["not_working"].strip(), "```", "",
                    "Its log's tail:", "", "```",
                    r["log_tail"].strip()[-2000:], "```", ""]
    if m.get("skipped"):
        out += ["Left out: " + "; ".join(m["skipped"]), ""]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/radixgate"))
    p.add_argument("--prefill", type=int, default=2, help="prefill workers (P)")
    p.add_argument("--decode", type=int, default=2, help="decode workers (D); co-located: P+D")
    p.add_argument("--long-doc-rate", type=float, default=4.0, help="long-doc req/s")
    p.add_argument("--multi-turn-rate", type=float, default=24.0, help="multi-turn req/s")
    p.add_argument("--secs", type=float, default=45.0,
                   help="requests per row = rate x this (before --scale)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies request counts")
    p.add_argument("--skip-tokens", type=int, default=256,
                   help="pd-skip's --pd-skip-prefill-tokens")
    p.add_argument("--peer-timeout", type=float, default=60.0,
                   help="seconds a peer gets to answer its first chat completion")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only-row", action="append", choices=ROWS)
    p.add_argument("--only-workload", action="append")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    opts = p.parse_args()
    binary = os.path.abspath(opts.bin)
    if not os.path.exists(binary):
        sys.exit(f"no radixgate binary at {binary}: cargo build --release -p radixgate")
    rows_wanted = [r for r in ROWS if not opts.only_row or r in opts.only_row]
    skipped = []
    if not os.path.exists(os.path.join(PEERS, "bin", "python")):
        skipped += [f"{r}: no peers' venv at {PEERS}" for r in ("smg-pd", "vllm-router-pd")
                    if r in rows_wanted]
        rows_wanted = [r for r in rows_wanted if r not in ("smg-pd", "vllm-router-pd")]
    elif not os.path.exists(os.path.join(PEERS, "bin", "vllm-router")) and \
            "vllm-router-pd" in rows_wanted:
        skipped.append("vllm-router-pd: vllm-router is not installed in the peers' venv")
        rows_wanted.remove("vllm-router-pd")

    tmp = tempfile.mkdtemp(prefix="radixgate-pd-bench-")
    started = dt.datetime.now(dt.timezone.utc)
    meta = report.run_meta(binary, ["bench/pd.py", *sys.argv[1:]], started)
    meta["peers"] = report.peer_versions()
    meta["options"] = {"prefill": opts.prefill, "decode": opts.decode, "seed": opts.seed,
                       "skip_tokens": opts.skip_tokens, "model": MODEL}
    print(f"logs in {tmp}; load average {meta['loadavg_start']}", flush=True)
    rows = []
    try:
        for wname, load_args in workloads(opts).items():
            if opts.only_workload and wname not in opts.only_workload:
                continue
            for name in rows_wanted:
                row = run_row(opts, binary, tmp, wname, load_args, name)
                rows.append(row)
                print(line(row), flush=True)
    finally:
        procs.stop_all()
    meta["skipped"] = skipped
    meta["loadavg_end"] = os.getloadavg()
    meta["finished_utc"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    result = {"meta": meta, "rows": rows}
    report.write_result(opts.out, started, "pd", result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
