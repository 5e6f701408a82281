"""The soak's sampler: the router's RSS and open files from /proc, and the
resilience series of its Prometheus `/metrics`, every few seconds.

Series kept (the rest of /metrics is ignored): circuit-breaker state and
transitions, retries, upstream errors, worker health, tree size, admission,
and every metric whose name starts with `radixgate_outlier` (whatever
outlier ejection ends up exporting is picked up by that prefix). An event
is a change of a kept series between two samples.
"""

import os
import re
import threading
import time
import urllib.request

KEPT = ("radixgate_circuit_breaker_state", "radixgate_circuit_breaker_transitions_total",
        "radixgate_retries_total", "radixgate_upstream_errors_total",
        "radixgate_worker_healthy", "radixgate_tree_characters",
        "radixgate_admission_", "radixgate_outlier")
_LINE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """`name{labels}` -> value for the kept series of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("radixgate_"):
            continue
        m = _LINE.match(line)
        if not m or not m.group(1).startswith(KEPT):
            continue
        try:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        except ValueError:
            pass
    return out


def proc_sample(pid: int) -> dict:
    """RSS (KiB), threads and open file descriptors of `pid`."""
    rss = threads = None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return {"rss_kib": rss, "threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


_TCP_STATES = {"01": "established", "06": "time_wait", "07": "close", "08": "close_wait",
               "0A": "listen", "04": "fin_wait1", "05": "fin_wait2", "09": "last_ack"}


def fd_breakdown(pid: int, router_ports: set[int], worker_ports: set[int]) -> dict[str, int]:
    """The router's open fds by kind: TCP sockets by side (client / worker) and state."""
    tcp = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    local, remote = int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16)
                    tcp[cols[9]] = (local, remote, _TCP_STATES.get(cols[3], cols[3]))
        except OSError:
            pass
    out: dict[str, int] = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError as err:
        return {f"unreadable: {err}": 0}
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            entry = tcp.get(target[8:-1])
            if entry is None:
                kind = "socket (not TCP)"
            else:
                local, remote, state = entry
                side = ("listener" if state == "listen" else
                        "from clients" if local in router_ports else
                        "to workers" if remote in worker_ports else "other tcp")
                kind = f"{side} {state}" if side != "listener" else side
        else:
            kind = target.split(":", 1)[0] if ":" in target else "file"
        out[kind] = out.get(kind, 0) + 1
    return dict(sorted(out.items()))


class Watcher:
    """Samples the router every `every` seconds on a thread; `samples` grows."""

    def __init__(self, pid: int, metrics_url: str, every: float, t0: float, status=None):
        self.pid, self.url, self.every, self.t0 = pid, metrics_url, every, t0
        self.status = status or (lambda: {})
        self.samples: list[dict] = []
        self.label: str | None = None  # set when the load stops: later samples are not "during"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="watcher", daemon=True)

    def sample(self, label: str | None = None) -> dict:
        s = {"t": round(time.monotonic() - self.t0, 1), "loadavg": os.getloadavg()[0]}
        if label or self.label:
            s["label"] = label or self.label
        try:
            s |= proc_sample(self.pid)
        except OSError as err:
            s["proc_error"] = str(err)
        try:
            with urllib.request.urlopen(self.url, timeout=5) as resp:
                s["metrics"] = parse_metrics(resp.read().decode())
        except Exception as err:  # noqa: BLE001 - a failed scrape is itself recorded
            s["metrics_error"] = f"{type(err).__name__}: {err}"
        s |= self.status()
        self.samples.append(s)
        return s

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self.sample()

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()


def events(samples: list[dict]) -> list[dict]:
    """Changes of kept series between consecutive samples (counters: their deltas)."""
    out, last = [], {}
    for s in samples:
        for key, value in (s.get("metrics") or {}).items():
            before = last.get(key)
            if before is not None and value != before:
                out.append({"t": s["t"], "series": key, "from": before, "to": value})
            last[key] = value
    return out


def totals(samples: list[dict], prefix: str) -> dict[str, float]:
    """Growth over the run of each series starting with `prefix` (first to last sample)."""
    first, last = {}, {}
    for s in samples:
        for key, value in (s.get("metrics") or {}).items():
            if key.startswith(prefix):
                first.setdefault(key, value)
                last[key] = value
    # A series born mid-run started from zero.
    born_late = {k for k in last if k not in (samples[0].get("metrics") or {})} if samples else set()
    return {k: last[k] - (0 if k in born_late else first[k]) for k in sorted(last)}
