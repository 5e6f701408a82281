"""The routers under test: how to start each one in front of a list of workers.

A router is a name, a policy label for the tables, and a function from
(worker URLs, port, scratch dir) to a command line. `direct` has no process:
the load tool spreads requests over the workers itself (round-robin).
"""

import os
from dataclasses import dataclass
from typing import Callable

PEERS = os.environ.get("PEERS_VENV", os.path.expanduser("~/.cache/peers"))


@dataclass
class Router:
    """One router configuration of the comparison."""

    name: str
    policy: str
    command: Callable[[list[str], int, str], list[str]] | None  # None = direct


def _radixgate(binary: str, policy: str, routing_yaml: str | None = None,
               serve_args: tuple[str, ...] = ()):
    def cmd(urls, port, tmp):
        extra = []
        if routing_yaml:
            conf = os.path.join(tmp, "radixgate.yaml")
            with open(conf, "w") as f:
                f.write(routing_yaml)
            extra = ["--config", conf]
        return [binary, "serve", *extra, "--host", "127.0.0.1", "--port", str(port),
                "--policy", policy, "--log-level", "warn", *serve_args,
                "--worker-urls", *urls]
    return cmd


def _peer_module(module: str):
    def cmd(urls, port, _tmp):
        return [f"{PEERS}/bin/python", "-m", module, "--host", "127.0.0.1",
                "--port", str(port), "--policy", "cache_aware", "--log-level", "warn",
                "--prometheus-port", str(port + 1), "--worker-urls", *urls]
    return cmd


def _vllm_router(urls, port, _tmp):
    return [f"{PEERS}/bin/vllm-router", "--host", "127.0.0.1", "--port", str(port),
            "--policy", "cache_aware", "--log-level", "warning",
            "--prometheus-port", str(port + 1), "--worker-urls", *urls]


NGINX_CONF = """\
worker_processes auto;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    client_max_body_size 64m;
    client_body_buffer_size 1m;
    upstream workers {{
{servers}
        keepalive 128;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            proxy_pass http://workers;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def _nginx(urls, port, tmp):
    servers = "\n".join(f"        server {u.removeprefix('http://')};" for u in urls)
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(tmp=tmp, servers=servers, port=port))
    return ["nginx", "-p", tmp, "-c", conf, "-g", "daemon off;"]


def all_routers(binary: str, baseline: str | None = None,
                variants: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> list[Router]:
    """Every configuration, in table order; `baseline` (another radixgate
    binary, e.g. the previous commit's) runs beside this one when given, and
    each (name, `radixgate serve` arguments) of `variants` adds a cache_aware
    row of this binary with those arguments (say, `--config` with an older
    rule) right after radixgate's own."""
    before = [Router("radixgate-baseline", "cache_aware", _radixgate(baseline, "cache_aware"))
              ] if baseline else []
    return [*before,
        Router("direct", "client round-robin", None),
        Router("nginx", "round-robin", _nginx),
        Router("radixgate", "round_robin", _radixgate(binary, "round_robin")),
        Router("radixgate", "cache_aware", _radixgate(binary, "cache_aware")),
        *(Router(name, "cache_aware", _radixgate(binary, "cache_aware", serve_args=args))
          for name, args in variants),
        # The rule before the cost model (quality part only), side by side.
        Router("radixgate", "cache_aware, seed rule", _radixgate(
            binary, "cache_aware", "routing:\n  policy: cache_aware\n"
            "  hot_spot: { rule: relative_cap }\n  low_match: smallest_tree\n")),
        Router("smg", "cache_aware", _peer_module("smg.launch_router")),
        Router("sglang-router", "cache_aware", _peer_module("sglang_router.launch_router")),
        Router("vllm-router", "cache_aware", _vllm_router),
    ]
