#!/usr/bin/env python3
"""Sends chat, completions and /generate requests, streaming and not, to one
URL (a router in front of simulated workers) and prints one line per request:
status, serving worker (header or body), cached_tokens, and for streams the
event count and whether [DONE] came. Each request is sent twice so that the
second shows the prefix hit. Standard library only."""
import http.client
import json
import sys
import urllib.parse

base = urllib.parse.urlparse(sys.argv[1])
PROMPT = "".join(f"shared system prompt sentence {i}. " for i in range(40))


def send(path, body):
    conn = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    raw = r.read().decode()
    conn.close()
    return r.status, r.getheader("x-radixgate-sim-worker"), raw


def summarize(path, body):
    status, header, raw = send(path, body)
    if status != 200:
        return f"status={status} body={raw[:160]!r}"
    if body.get("stream"):
        events = [e[6:] for e in raw.split("\n\n") if e.startswith("data: ")]
        done = events and events[-1] == "[DONE]"
        objs = [json.loads(e) for e in events if e != "[DONE]"]
        last = objs[-1] if objs else {}
        worker = last.get("system_fingerprint") or last.get("meta_info", {}).get("worker")
        cached = (last.get("usage") or {}).get("prompt_tokens_details", {}).get("cached_tokens")
        if cached is None:
            cached = last.get("meta_info", {}).get("cached_tokens")
        return f"status=200 header={header} body_worker={worker} events={len(objs)} done={bool(done)} cached_tokens={cached}"
    v = json.loads(raw)
    worker = v.get("system_fingerprint") or v.get("meta_info", {}).get("worker")
    cached = (v.get("usage") or {}).get("prompt_tokens_details", {}).get("cached_tokens")
    if cached is None:
        cached = v.get("meta_info", {}).get("cached_tokens")
    return f"status=200 header={header} body_worker={worker} cached_tokens={cached}"


cases = [
    ("/v1/chat/completions", {"model": "sim-llama-8b", "messages": [{"role": "user", "content": PROMPT + "chat"}], "max_tokens": 8}),
    ("/v1/chat/completions", {"model": "sim-llama-8b", "messages": [{"role": "user", "content": PROMPT + "chat stream"}], "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"model": "sim-llama-8b", "prompt": PROMPT + "completion", "max_tokens": 8}),
    ("/v1/completions", {"model": "sim-llama-8b", "prompt": PROMPT + "completion stream", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}),
    ("/generate", {"text": PROMPT + "generate", "sampling_params": {"max_new_tokens": 8}}),
    ("/generate", {"text": PROMPT + "generate stream", "sampling_params": {"max_new_tokens": 8}, "stream": True}),
]
failures = 0
for path, body in cases:
    for attempt in (1, 2):
        try:
            line = summarize(path, body)
        except Exception as e:  # report and keep going
            line = f"EXCEPTION {e!r}"
        if not line.startswith("status=200"):
            failures += 1
        kind = "stream" if body.get("stream") else "whole "
        print(f"{path:22} {kind} #{attempt}: {line}")

# Multi-turn: turn 2 carries turn 1's reply; it should hit prompt + reply.
msgs = [{"role": "user", "content": PROMPT + "multi-turn"}]
status, header, raw = send("/v1/chat/completions", {"model": "sim-llama-8b", "messages": msgs, "max_tokens": 32})
if status == 200:
    v = json.loads(raw)
    msgs += [{"role": "assistant", "content": v["choices"][0]["message"]["content"]}, {"role": "user", "content": "go on"}]
    status2, header2, raw2 = send("/v1/chat/completions", {"model": "sim-llama-8b", "messages": msgs, "max_tokens": 4})
    v2 = json.loads(raw2) if status2 == 200 else {}
    t1 = v["usage"]["prompt_tokens"] + v["usage"]["completion_tokens"]
    c2 = v2.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens")
    print(f"multi-turn: turn1 {header} prompt+reply={t1} tokens; turn2 {header2} status={status2} cached_tokens={c2}")
    failures += status2 != 200
else:
    failures += 1
sys.exit(1 if failures else 0)
