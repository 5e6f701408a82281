"""The soak's well-behaved load: open-loop requests at a fixed mean rate.

Each request runs in its own thread on its own loopback connection (so a
hung request holds only itself), and ends in exactly one class:

- `answered`: a 2xx whose body is a completion (JSON with `choices`), or,
  streamed, an SSE stream that ended with `data: [DONE]`;
- `error`: an explicit refusal the client can act on: a non-2xx status
  (with an OpenAI-style JSON error body, or flagged as without one), or an
  SSE `data: {"error": ...}` event (or an `event: error`) before the end;
- `lost`: anything else: no response (reset, closed), a body cut short, a
  stream that ended with neither `[DONE]` nor an error event, or the
  client's own timeout (the request hung).

Nothing is retried by the client: a lost request is a finding about the
router. A request that finds `max_in_flight` requests already running is
not sent and is counted apart (`skipped`), so a hang cannot make the load
generator itself grow without bound.
"""

import http.client
import json
import random
import socket
import threading
import time

MODEL = "sim-llama-8b"
ANSWERED, ERROR, LOST = "answered", "error", "lost"

# (kind, path, streamed, weight): the mix of request shapes.
KINDS = [("chat-stream", "/v1/chat/completions", True, 40),
         ("chat", "/v1/chat/completions", False, 25),
         ("completion-stream", "/v1/completions", True, 20),
         ("completion", "/v1/completions", False, 15)]

_WORDS = ("cache prefix router worker token stream latency batch queue memory "
          "request answer model prompt tree eviction breaker health retry "
          "timeout backoff outlier load balance shard replica page block").split()


def system_prompts(groups: int, chars: int) -> list[str]:
    """One long shared system prompt per prefix group."""
    out = []
    for g in range(groups):
        rng = random.Random(1000 + g)
        words = [f"You are soak assistant {g}."]
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(_WORDS))
        out.append(" ".join(words))
    return out


def make_request(rng: random.Random, systems: list[str]) -> tuple[str, str, bytes, bool]:
    """(kind, path, body, streamed) of one request: a shared prefix and a fresh question."""
    kind, path, stream, _ = rng.choices(KINDS, weights=[k[3] for k in KINDS])[0]
    system = systems[rng.randrange(len(systems))]
    question = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(30, 70))) + "?"
    body = {"model": MODEL, "max_tokens": rng.randint(8, 48), "stream": stream}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "system", "content": system},
                            {"role": "user", "content": question}]
    else:
        body["prompt"] = f"{system}\n\nQ: {question}\nA:"
    return kind, path, json.dumps(body).encode(), stream


def _result(cls: str, status: int | None = None, reason: str = "", **extra) -> dict:
    return {"class": cls, "status": status, "reason": reason, **extra}


def _error_body(status: int, raw: bytes) -> dict:
    """An explicit error; notes whether the body was an OpenAI-style JSON error."""
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        err = None
    if isinstance(err, dict):
        return _result(ERROR, status, f"{status} {err.get('code') or err.get('type')}",
                       json_error=True)
    return _result(ERROR, status, f"{status} (no JSON error body)", json_error=False)


def _read_sse(resp, sock, deadline: float) -> dict:
    """Reads an SSE stream to its end: [DONE], an error event, or something lost."""
    events, error_event = 0, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return _result(LOST, resp.status, f"client timeout mid-stream after {events} events (hung)")
        try:
            sock.settimeout(left)
            line = resp.readline()
        except (TimeoutError, socket.timeout):
            return _result(LOST, resp.status, f"client timeout mid-stream after {events} events (hung)")
        except (OSError, http.client.HTTPException) as err:
            return _result(LOST, resp.status,
                           f"stream cut after {events} events: {type(err).__name__}")
        if not line:
            return _result(LOST, resp.status,
                           f"stream closed without [DONE] or an error event after {events} events")
        line = line.strip()
        if line.startswith(b"event:") and line[6:].strip() == b"error":
            error_event = True
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        events += 1
        if data == b"[DONE]":
            return _result(ANSWERED, resp.status, events=events)
        try:
            obj = json.loads(data)
        except ValueError:
            obj = None
        if error_event or (isinstance(obj, dict) and "error" in obj):
            err = obj.get("error") if isinstance(obj, dict) else None
            code = err.get("code") or err.get("type") if isinstance(err, dict) else "?"
            return _result(ERROR, resp.status, f"SSE error event ({code}) after {events} events",
                           json_error=isinstance(err, dict))


def send(port: int, path: str, body: bytes, timeout: float) -> dict:
    """Sends one request to the router and classifies how it ended."""
    deadline = time.monotonic() + timeout
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        try:
            conn.connect()
            sock = conn.sock
            conn.request("POST", path, body=body, headers={"content-type": "application/json"})
            resp = conn.getresponse()
        except (TimeoutError, socket.timeout):
            return _result(LOST, None, "client timeout before the response head (hung)")
        except (OSError, http.client.HTTPException) as err:
            return _result(LOST, None, f"no response: {type(err).__name__}: {err}")
        if 200 <= resp.status < 300 and "text/event-stream" in (resp.getheader("content-type") or ""):
            return _read_sse(resp, sock, deadline)
        try:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            raw = resp.read()
        except (TimeoutError, socket.timeout):
            return _result(LOST, resp.status, "client timeout reading the body (hung)")
        except (OSError, http.client.HTTPException) as err:
            return _result(LOST, resp.status, f"body cut: {type(err).__name__}")
        if not 200 <= resp.status < 300:
            return _error_body(resp.status, raw)
        try:
            ok = "choices" in json.loads(raw)
        except (ValueError, TypeError):
            ok = False
        return (_result(ANSWERED, resp.status) if ok
                else _result(LOST, resp.status, "2xx body is not a completion"))
    finally:
        conn.close()


class Load:
    """Open-loop load against the router; `records` holds one dict per request."""

    def __init__(self, port: int, rate: float, seed: int, timeout: float, max_in_flight: int,
                 groups: int, system_chars: int, t0: float, phase):
        self.port, self.rate, self.timeout = port, rate, timeout
        self.max_in_flight, self.t0, self.phase = max_in_flight, t0, phase
        self.rng = random.Random(seed)
        self.systems = system_prompts(groups, system_chars)
        self.records: list[dict] = []
        self.skipped = 0
        self.in_flight = 0
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def _one(self, rec: dict, path: str, body: bytes) -> None:
        start = time.monotonic()
        try:
            res = send(self.port, path, body, self.timeout)
        except Exception as err:  # noqa: BLE001 - a bug here must still account the request
            res = _result(LOST, None, f"client exception: {type(err).__name__}: {err}")
        res["ms"] = round((time.monotonic() - start) * 1000, 1)
        with self.lock:
            rec.update(res)
            self.in_flight -= 1

    def run(self, stop: threading.Event) -> None:
        """Sends requests (Poisson arrivals at `rate`) until `stop` is set."""
        next_at = time.monotonic()
        while not stop.is_set():
            next_at += self.rng.expovariate(self.rate)
            delay = next_at - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
            kind, path, body, _ = make_request(self.rng, self.systems)
            with self.lock:
                if self.in_flight >= self.max_in_flight:
                    self.skipped += 1
                    continue
                self.in_flight += 1
                rec = {"id": len(self.records), "t": round(time.monotonic() - self.t0, 2),
                       "kind": kind, "phase": self.phase(), "class": None}
                self.records.append(rec)
            th = threading.Thread(target=self._one, args=(rec, path, body), daemon=True)
            th.start()
            self.threads.append(th)
            if len(self.threads) > 4096:
                self.threads = [t for t in self.threads if t.is_alive()]

    def join(self) -> int:
        """Waits for every request to end (each is bounded by the client timeout).

        Returns how many are still running (0 unless the client itself is stuck).
        """
        deadline = time.monotonic() + self.timeout + 10
        for th in self.threads:
            th.join(max(0.0, deadline - time.monotonic()))
        return sum(th.is_alive() for th in self.threads)

    def counts(self) -> dict:
        with self.lock:
            c = {ANSWERED: 0, ERROR: 0, LOST: 0, "running": 0}
            for r in self.records:
                c[r["class"] or "running"] += 1
            c["sent"] = len(self.records)
            c["skipped"] = self.skipped
            return c
