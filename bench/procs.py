"""Process and port helpers for the bench harness.

Every process is started in its own session (so it leads its own process
group) and recorded; `stop_all()` kills each recorded group by its id with
SIGKILL (the public routers wait out a long grace period on SIGTERM) and is
registered with atexit and the signal handlers, so an interrupted run leaves
nothing behind. Only processes started here are ever signalled.
"""

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

_STARTED: list[subprocess.Popen] = []
CLK_TCK = os.sysconf("SC_CLK_TCK")


def start(cmd: list[str], log_path: str) -> subprocess.Popen:
    """Starts `cmd` in a new session, output to `log_path`, and records it."""
    log = open(log_path, "ab")
    log.write(("\n$ " + " ".join(cmd) + "\n").encode())
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    _STARTED.append(proc)
    return proc


def stop(proc: subprocess.Popen) -> None:
    """Kills the process group led by `proc` (by its id) and reaps it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        print(f"warning: pid {proc.pid} did not exit", file=sys.stderr)
    # Children that left the group (none expected) would still be found by
    # the port check in wait_port_free.
    if proc in _STARTED:
        _STARTED.remove(proc)


def stop_all() -> None:
    """Stops every process still recorded."""
    for proc in list(_STARTED):
        stop(proc)


def _on_signal(signum, _frame):
    stop_all()
    sys.exit(128 + signum)


atexit.register(stop_all)
signal.signal(signal.SIGINT, _on_signal)
signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGHUP, _on_signal)


def port_open(port: int) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_block(first: int, count: int, last: int = 35999) -> int:
    """The lowest base >= `first` (in steps of 10) whose `count` ports can all be bound.

    Other programs' outgoing connections borrow ephemeral ports from this
    range, so a fixed port is sometimes taken for a moment.
    """
    for attempt in range(5):
        for base in range(first, last - count + 2, 10):
            if all(_bindable(base + i) for i in range(count)):
                return base
        # Every block busy at once is a passing burst of other programs'
        # connections more often than a real shortage: wait and scan again.
        time.sleep(1.0 + attempt)
    raise RuntimeError(f"no {count} free ports from {first} to {last}")


def wait_port_free(ports: list[int], timeout: float = 15.0) -> None:
    """Waits until no port in `ports` accepts connections; raises if one still does."""
    deadline = time.monotonic() + timeout
    while any(port_open(p) for p in ports):
        if time.monotonic() > deadline:
            busy = [p for p in ports if port_open(p)]
            raise RuntimeError(f"ports still bound: {busy}")
        time.sleep(0.2)


def wait_http(url: str, timeout: float = 30.0, body: bytes | None = None,
              alive: subprocess.Popen | None = None) -> None:
    """Waits until `url` answers 200 (a POST of `body` when given).

    Gives up early when `alive` (the server's process) has exited.
    """
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if alive is not None and alive.poll() is not None:
            raise RuntimeError(f"process exited with {alive.returncode} before {url} answered")
        try:
            req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=5) as resp:
                if resp.status == 200:
                    resp.read()
                    return
        except Exception as err:  # noqa: BLE001 - any failure means not ready yet
            last = err
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s: {last}")


def descendants(root: int) -> list[int]:
    """`root` and every live process below it (from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def cpu_seconds(root: int) -> float:
    """utime + stime (+ reaped children's) of `root`'s process tree, in seconds."""
    total = 0
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After ")": state=0, ppid=1, ... utime=11, stime=12, cutime=13, cstime=14.
        total += sum(int(x) for x in fields[11:15])
    return total / CLK_TCK
