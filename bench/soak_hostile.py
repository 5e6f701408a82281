"""The soak's hostile clients, run beside the load against the router.

Each kind runs in its own thread, over and over until stopped, with raw
sockets (http.client would not send what they send):

- `slowloris`: connections that trickle a request head one byte a second;
- `huge_length`: a head declaring a 1 TB body, then a few bytes;
- `oversized_body`: a real body larger than the router's payload limit;
- `malformed_json` and `truncated_json` (declared length, half the body,
  then the write side closed);
- `stalled_body`: declared length, half the body, then silence;
- `idle_keepalive`: connections that make one request and then sit idle,
  checked for being closed, and reused at the end of their hold.

What each got back is counted per outcome (`HTTP 413`, `closed by server`,
`open at cap`, ...) with how long it took. They are kept modest (tens of
sockets) so that they cannot exhaust this machine's file descriptors.
"""

import json
import select
import socket
import threading
import time
from collections import defaultdict

from soak_load import MODEL

CHAT = "/v1/chat/completions"


def _head(path: str, length: int | None, extra: str = "") -> bytes:
    cl = f"content-length: {length}\r\n" if length is not None else ""
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"{cl}{extra}\r\n").encode()


def _status(data: bytes) -> str:
    """`HTTP 413` from a response's first bytes, or a short description."""
    if data.startswith(b"HTTP/"):
        parts = data.split(b" ", 2)
        return f"HTTP {parts[1].decode(errors='replace')}" if len(parts) > 1 else "HTTP ?"
    return "closed without response" if not data else "garbage response"


def _await_answer(sock: socket.socket, timeout: float) -> str:
    """Waits up to `timeout` for the server to answer or close."""
    sock.settimeout(timeout)
    try:
        return _status(sock.recv(4096))
    except (TimeoutError, socket.timeout):
        return f"no answer within {timeout:.0f} s"
    except ConnectionResetError:
        return "reset"
    except OSError as err:
        return f"socket error {type(err).__name__}"


class _Tracked(socket.socket):
    """A connected socket that its Hostile can cut short on finish."""

    def __init__(self, owner: "Hostile", addr):
        super().__init__(socket.AF_INET, socket.SOCK_STREAM)
        self.owner = owner
        self.settimeout(10)
        with owner.lock:
            owner.open.add(self)
        try:
            self.connect(addr)
        except OSError:
            self.close()
            raise

    def close(self):
        with self.owner.lock:
            self.owner.open.discard(self)
        super().close()


class Hostile:
    """Runs the hostile clients; `outcomes[kind][outcome]` lists seconds taken."""

    def __init__(self, port: int, max_payload: int, slowloris: int = 8, idle: int = 32,
                 hold_secs: float = 120.0, period: float = 5.0):
        self.port, self.max_payload = port, max_payload
        self.n_slowloris, self.n_idle = slowloris, idle
        self.hold, self.period = hold_secs, period
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.threads: list[threading.Thread] = []
        self.open: set[socket.socket] = set()

    def record(self, kind: str, outcome: str, secs: float) -> None:
        if self.stop.is_set():
            outcome = "still waiting at the end of the soak"
        with self.lock:
            self.outcomes[kind][outcome].append(round(secs, 1))

    def connect(self) -> socket.socket:
        return _Tracked(self, ("127.0.0.1", self.port))

    def start(self) -> None:
        bodies = {"huge_length": self.huge_length, "oversized_body": self.oversized_body,
                  "malformed_json": self.malformed_json, "truncated_json": self.truncated_json,
                  "stalled_body": self.stalled_body}
        targets = [("slowloris", self.slowloris), ("idle_keepalive", self.idle_keepalive)]
        targets += [(k, self._repeat(k, f)) for k, f in bodies.items()]
        for name, fn in targets:
            th = threading.Thread(target=self._guard(name, fn), name=name, daemon=True)
            th.start()
            self.threads.append(th)

    def finish(self) -> dict:
        """Stops every client (cutting its sockets short) and returns the outcome table."""
        self.stop.set()
        with self.lock:
            for s in list(self.open):
                try:
                    s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
                except OSError:
                    pass
        for th in self.threads:
            th.join(30)
        with self.lock:
            return {k: {o: {"count": len(v), "secs": v} for o, v in d.items()}
                    for k, d in self.outcomes.items()}

    def _guard(self, name, fn):
        def run():
            try:
                fn()
            except Exception as err:  # noqa: BLE001 - a client bug is recorded, not fatal
                self.record(name, f"client crashed: {type(err).__name__}: {err}", 0)
        return run

    def _repeat(self, kind: str, once):
        def loop():
            while not self.stop.wait(self.period):
                t0 = time.monotonic()
                try:
                    outcome = once()
                except OSError as err:
                    outcome = f"socket error {type(err).__name__}"
                self.record(kind, outcome, time.monotonic() - t0)
        return loop

    # ---- bodies ----------------------------------------------------------
    def huge_length(self) -> str:
        with self.connect() as s:
            s.sendall(_head(CHAT, 10**12) + b'{"model": "' + MODEL.encode() + b'", "messages": [')
            return _await_answer(s, 30)

    def oversized_body(self) -> str:
        size = self.max_payload + (1 << 20)
        chunk = b" " * (1 << 16)
        with self.connect() as s:
            s.sendall(_head(CHAT, size))
            sent = 0
            try:
                while sent < size:
                    s.sendall(chunk[:min(len(chunk), size - sent)])
                    sent += min(len(chunk), size - sent)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server may answer and close before the whole body
            return _await_answer(s, 30)

    def malformed_json(self) -> str:
        body = b'{"model": "' + MODEL.encode() + b'", "messages": [}, "max_tokens": 4'
        with self.connect() as s:
            s.sendall(_head(CHAT, len(body)) + body)
            return _await_answer(s, 30)

    def _half_body(self) -> tuple[bytes, bytes]:
        body = json.dumps({"model": MODEL, "max_tokens": 4, "messages": [
            {"role": "user", "content": "a truncated request " * 20}]}).encode()
        return _head(CHAT, len(body)), body[:len(body) // 2]

    def truncated_json(self) -> str:
        head, half = self._half_body()
        with self.connect() as s:
            s.sendall(head + half)
            s.shutdown(socket.SHUT_WR)
            return _await_answer(s, 30)

    def stalled_body(self) -> str:
        head, half = self._half_body()
        with self.connect() as s:
            s.sendall(head + half)
            return _await_answer(s, self.hold)

    # ---- connection holders ----------------------------------------------
    def slowloris(self) -> None:
        """Keeps `n_slowloris` connections trickling a request head, one byte each second."""
        trickle = _head(CHAT, 10)[:-2] + b"".join(f"x-pad-{i}: {'a' * 20}\r\n".encode() for i in range(10_000))
        conns: dict[socket.socket, list] = {}  # sock -> [opened, bytes sent]
        while not self.stop.is_set():
            while len(conns) < self.n_slowloris:
                s = self.connect()
                s.setblocking(False)
                conns[s] = [time.monotonic(), 0]
            for s, st in list(conns.items()):
                age = time.monotonic() - st[0]
                outcome = None
                readable, _, _ = select.select([s], [], [], 0)
                if readable:
                    try:
                        outcome = _status(s.recv(4096))
                        outcome = "closed by server" if outcome == "closed without response" else outcome
                    except OSError:
                        outcome = "reset"
                elif age >= self.hold:
                    outcome = f"open at cap ({self.hold:.0f} s)"
                else:
                    try:
                        s.send(trickle[st[1]:st[1] + 1])
                        st[1] += 1
                    except BlockingIOError:
                        pass
                    except OSError:
                        outcome = "reset on send"
                if outcome:
                    self.record("slowloris", outcome, age)
                    s.close()
                    del conns[s]
            self.stop.wait(1.0)
        for s in conns:
            s.close()

    def idle_keepalive(self) -> None:
        """Holds `n_idle` keep-alive connections idle after one request each."""
        while not self.stop.is_set():
            conns = {}
            for _ in range(self.n_idle):
                s = self.connect()
                s.sendall(b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                first = _await_answer(s, 10)
                if first != "HTTP 200":
                    self.record("idle_keepalive", f"first request: {first}", 0)
                    s.close()
                    continue
                conns[s] = time.monotonic()
            while conns and not self.stop.wait(2.0):
                readable, _, _ = select.select(list(conns), [], [], 0)
                for s in readable:
                    try:
                        data = s.recv(4096)
                    except OSError:
                        data = b""
                    if data:
                        continue  # the rest of the first answer
                    self.record("idle_keepalive", "closed by server while idle",
                                time.monotonic() - conns.pop(s))
                    s.close()
                if conns and time.monotonic() - min(conns.values()) >= self.hold:
                    break
            for s, t in conns.items():
                if not self.stop.is_set():
                    # At the end of its hold, is the connection still usable?
                    try:
                        s.sendall(b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                        again = _await_answer(s, 10)
                    except OSError as err:
                        again = f"socket error {type(err).__name__}"
                    self.record("idle_keepalive", f"open at cap, reused: {again}",
                                time.monotonic() - t)
                s.close()
