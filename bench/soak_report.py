"""The soak's figures (`summarize`) and its markdown page (`markdown`).

Bounded means: the median RSS of the last 10% of the load's samples is at
most the first 10%'s median times (1 + `--rss-tolerance`), or at most
16 MiB above it (small processes move by allocator pages); and once the
load has stopped and in-flight requests have ended, the router's open fds
are back within `--fd-slack` of the count before the load started.
"""

import statistics
from collections import Counter, defaultdict

from soak_watch import events, totals

RSS_FLOOR_KIB = 16 * 1024


def _pct(xs: list[float], q: float):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def _window_stats(samples: list[dict], key: str) -> dict:
    xs = [s[key] for s in samples if s.get(key) is not None]
    if not xs:
        return {}
    k = max(1, len(xs) // 10)
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs),
            "first10": statistics.median(xs[:k]), "last10": statistics.median(xs[-k:]),
            "samples": len(xs)}


def _accounting(records: list[dict]) -> dict:
    c = Counter(r["class"] or "running" for r in records)
    out = {"sent": len(records), "answered": c["answered"], "error": c["error"],
           "lost": c["lost"], "running": c["running"]}
    out["balanced"] = out["sent"] == out["answered"] + out["error"] + out["lost"] + out["running"]
    return out


def _by(records: list[dict], key: str) -> dict:
    groups = defaultdict(list)
    for r in records:
        groups[r[key]].append(r)
    out = {}
    for name, rs in groups.items():
        ms = [r["ms"] for r in rs if r["class"] == "answered"]
        out[name] = _accounting(rs) | {"p50_ms": _pct(ms, 0.5), "p99_ms": _pct(ms, 0.99),
                                       "first_t": rs[0]["t"]}
    return out


def summarize(result: dict, opts) -> dict:
    records = result["records"]
    during = [s for s in result["samples"] if "label" not in s]
    rss, fds = _window_stats(during, "rss_kib"), _window_stats(during, "fds")
    base_fds = result["baseline"].get("fds") or 0
    drained_fds = result["drained"].get("fds")
    rss_ok = bool(rss) and (rss["last10"] <= rss["first10"] * (1 + opts.rss_tolerance)
                            or rss["last10"] - rss["first10"] <= RSS_FLOOR_KIB)
    fd_ok = drained_fds is not None and drained_fds <= base_fds + opts.fd_slack
    acc = _accounting(records)
    answered_ms = [r["ms"] for r in records if r["class"] == "answered"]
    evs = events(result["samples"])
    failures = []
    if acc["lost"]:
        failures.append(f"{acc['lost']} request(s) lost")
    if acc["running"] or result["client_stuck"]:
        failures.append(f"{acc['running']} request(s) never ended on the client")
    if not acc["balanced"]:
        failures.append("sent != answered + errors + lost")
    if not rss_ok:
        failures.append("RSS grew beyond tolerance")
    if not fd_ok:
        failures.append(f"fds not back near the start ({drained_fds} vs {base_fds} + {opts.fd_slack})")
    if result["meta"].get("router_exit") is not None:
        failures.append(f"router exited ({result['meta']['router_exit']})")
    return {
        "accounting": acc | {"skipped": result["skipped"]},
        "answered_ms": {"p50": _pct(answered_ms, 0.5), "p99": _pct(answered_ms, 0.99),
                        "max": max(answered_ms, default=None)},
        "by_kind": _by(records, "kind"),
        "by_phase": _by(records, "phase"),
        "errors": dict(Counter(r["reason"] for r in records if r["class"] == "error").most_common()),
        "errors_without_json_body": sum(1 for r in records
                                        if r["class"] == "error" and not r.get("json_error")),
        "lost": [{k: r.get(k) for k in ("id", "t", "kind", "phase", "status", "reason", "ms")}
                 for r in records if r["class"] != "answered" and r["class"] != "error"],
        "lost_reasons": dict(Counter(r["reason"] for r in records if r["class"] == "lost")),
        "rss_kib": rss, "fds": fds, "threads": _window_stats(during, "threads"),
        "fds_before": base_fds, "fds_drained": drained_fds,
        "drained_at_t": result["drained"].get("t"),
        "fd_kinds_drained": result["drained"].get("fd_kinds", {}),
        "breaker_transitions": totals(result["samples"], "radixgate_circuit_breaker_transitions_total"),
        "breaker_events": [e for e in evs if e["series"].startswith("radixgate_circuit_breaker_state")],
        "health_events": [e for e in evs if e["series"].startswith("radixgate_worker_healthy")],
        "outlier_totals": totals(result["samples"], "radixgate_outlier"),
        "outlier_events": [e for e in evs if e["series"].startswith("radixgate_outlier")],
        "retries": totals(result["samples"], "radixgate_retries_total"),
        "upstream_errors": totals(result["samples"], "radixgate_upstream_errors_total"),
        "admission": totals(result["samples"], "radixgate_admission_rejected"),
        "scrape_failures": sum(1 for s in result["samples"] if "metrics_error" in s),
        "loadavg": {"start": result["meta"]["loadavg_start"][0],
                    "end": result["meta"]["loadavg_end"][0],
                    "max": max((s["loadavg"] for s in result["samples"]), default=None)},
        "verdict": {"pass": not failures, "failures": failures, "rss_ok": rss_ok, "fd_ok": fd_ok,
                    "rss_rule": f"last 10% median <= first 10% median x {1 + opts.rss_tolerance:.2f}"
                                f" or + {RSS_FLOOR_KIB // 1024} MiB",
                    "fd_rule": f"after drain <= before load + {opts.fd_slack}"},
    }


def _mib(kib) -> str:
    return "–" if kib is None else f"{kib / 1024:.1f}"


def _table(head: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join("–" if c is None else str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def _acc_rows(groups: dict, first: bool) -> list[list]:
    return [[name] + ([g["first_t"]] if first else []) + [g["sent"], g["answered"], g["error"],
                                                          g["lost"], g["p50_ms"], g["p99_ms"]]
            for name, g in groups.items()]


def closing_lines(result: dict) -> str:
    """A few lines for the console and closing notes."""
    s, m = result["summary"], result["meta"]
    a, rss, fds = s["accounting"], s["rss_kib"], s["fds"]
    v = s["verdict"]
    return "\n".join([
        f"soak {m['started_utc']} git {m['git']}, {m.get('load_secs')} s of load: "
        f"sent {a['sent']} = answered {a['answered']} + errors {a['error']} + lost {a['lost']}"
        f" (+ running {a['running']}; skipped {a['skipped']})",
        f"RSS MiB first/last 10% {_mib(rss.get('first10'))}/{_mib(rss.get('last10'))} "
        f"max {_mib(rss.get('max'))}; fds before {s['fds_before']}, max {fds.get('max')}, "
        f"after drain {s['fds_drained']}",
        f"breaker transitions {sum(s['breaker_transitions'].values()):.0f}, outlier series "
        f"{len(s['outlier_totals'])}, retries {sum(s['retries'].values()):.0f}",
        "PASS" if v["pass"] else "FAIL: " + "; ".join(v["failures"])])


def markdown(result: dict) -> str:
    s, m, o = result["summary"], result["meta"], result["meta"]["options"]
    a, v = s["accounting"], s["verdict"]
    out = [f"# Soak {m['started_utc']}\n",
           f"`{m['command']}`\n",
           f"bench/ at git {m['git']}; `{m.get('binary')}` ({m['radixgate']}, built "
           f"{m.get('binary_mtime_utc')}); {m['cpus']} CPUs, {o['workers']} simulated "
           f"workers, {o['rate']} req/s for {m.get('load_secs')} s, fault period "
           f"{o['fault_period_secs']} s, client timeout {o['client_timeout_secs']} s, "
           f"until {m['finished_utc']}.\n",
           f"Router: `{' '.join(m['router_command'])}`\n",
           f"**{'PASS' if v['pass'] else 'FAIL: ' + '; '.join(v['failures'])}**\n",
           "## Requests\n",
           _table(["sent", "answered", "explicit errors", "lost", "never ended", "skipped (client cap)"],
                  [[a["sent"], a["answered"], a["error"], a["lost"], a["running"], a["skipped"]]]),
           f"\nsent = answered + errors + lost: **{a['balanced'] and not a['running']}**. "
           f"Answered latency p50 {s['answered_ms']['p50']} ms, p99 {s['answered_ms']['p99']} ms, "
           f"max {s['answered_ms']['max']} ms. Errors without a JSON error body: "
           f"{s['errors_without_json_body']}.\n",
           "\n### By request kind\n",
           _table(["kind", "sent", "answered", "errors", "lost", "p50 ms", "p99 ms"],
                  _acc_rows(s["by_kind"], False)),
           "\n### By fault phase (the phase when the request was sent)\n",
           _table(["phase", "from s", "sent", "answered", "errors", "lost", "p50 ms", "p99 ms"],
                  _acc_rows(s["by_phase"], True)),
           "\n### Explicit errors\n",
           _table(["reason", "count"], [[k, n] for k, n in s["errors"].items()]),
           "\n### Lost requests\n"]
    if s["lost"]:
        out.append(_table(["reason", "count"], [[k, n] for k, n in s["lost_reasons"].items()]))
        out.append("\n" + _table(["id", "sent at s", "kind", "phase", "status", "reason", "ms"],
                                 [[r["id"], r["t"], r["kind"], r["phase"], r["status"], r["reason"],
                                   r["ms"]] for r in s["lost"][:200]]))
        if len(s["lost"]) > 200:
            out.append(f"\n({len(s['lost']) - 200} more in the JSON.)\n")
    else:
        out.append("None.\n")
    rss, fds, th = s["rss_kib"], s["fds"], s["threads"]
    out += ["\n## Router resources\n",
            f"{rss.get('samples')} samples every {o['sample_secs']} s during the load; "
            f"rule for RSS: {v['rss_rule']}; for fds: {v['fd_rule']}.\n\n",
            _table(["", "min", "median", "max", "first 10%", "last 10%", "bounded"],
                   [["RSS MiB", _mib(rss.get("min")), _mib(rss.get("median")), _mib(rss.get("max")),
                     _mib(rss.get("first10")), _mib(rss.get("last10")), v["rss_ok"]],
                    ["open fds", fds.get("min"), fds.get("median"), fds.get("max"),
                     fds.get("first10"), fds.get("last10"), v["fd_ok"]],
                    ["threads", th.get("min"), th.get("median"), th.get("max"),
                     th.get("first10"), th.get("last10"), ""]]),
            f"\nOpen fds before the load {s['fds_before']}, after the drain {s['fds_drained']} "
            f"(at {s['drained_at_t']} s): "
            + ", ".join(f"{k} {n}" for k, n in s["fd_kinds_drained"].items())
            + f". Metrics scrapes failed: {s['scrape_failures']}.\n",
            "\n## Breaker, health, retries, outliers\n",
            _table(["series", "growth over the run"],
                   [[k, f"{n:.0f}"] for k, n in {**s["breaker_transitions"], **s["retries"],
                                                 **s["upstream_errors"], **s["admission"],
                                                 **s["outlier_totals"]}.items()]),
            "\n" + ("No `radixgate_outlier*` metric was exported.\n" if not s["outlier_totals"]
                    else ""),
            "\nBreaker state (0 closed, 1 open, 2 half-open) and worker health changes:\n\n",
            _table(["at s", "series", "from", "to"],
                   [[e["t"], e["series"], e["from"], e["to"]]
                    for e in sorted(s["breaker_events"] + s["health_events"] + s["outlier_events"],
                                    key=lambda e: e["t"])]),
            "\n## Fault timeline\n",
            _table(["at s", "UTC", "phase", "cleared", "knobs", "admin answer"],
                   [[e["t"], e["utc"], e["phase"], e["cleared"], f"`{e['knobs']}`", e["answer"]]
                    for e in result["timeline"]]),
            "\n## Hostile clients\n",
            _table(["client", "outcome", "count", "seconds min / median / max"],
                   [[k, oc, d["count"], f"{min(d['secs'])} / {statistics.median(d['secs'])} / "
                                         f"{max(d['secs'])}"]
                    for k, outs in sorted(result["hostile"].items()) for oc, d in outs.items()]),
            f"\nLoad average: {s['loadavg']['start']:.2f} at start, {s['loadavg']['end']:.2f} "
            f"at end, {s['loadavg']['max']:.2f} at most.\n"]
    # Each part is a paragraph, a heading or a table: a blank line between them.
    return "\n".join(part.strip("\n") + "\n" for part in out if part.strip())
