#!/usr/bin/env python3
"""Turns `radixgate simulate --json` files into markdown tables.

Usage: simulate_tables.py FILE.json...   (one table row per policy row;
files are grouped by their workload and pool size, in the order given).
"""
import json
import sys


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main(paths):
    print("| workload | workers | policy | hit % | / oracle | TTFT mean ms | TTFT p99 ms"
          " | E2E mean ms | req/s | spread | work spread |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path in paths:
        with open(path) as f:
            rep = json.load(f)
        label = path.rsplit("/", 1)[-1].rsplit(".", 1)[0].rsplit("-", 1)[0]
        for r in rep["rows"]:
            name = r["policy"] + (f" {r['params']}" if r["params"] else "")
            ttft = r.get("ttft_ms") or {}
            e2e = r.get("e2e_ms") or {}
            print(f"| {label} | {rep['workers']} | {name} | {r['hit_rate'] * 100:.1f}"
                  f" | {fmt(r.get('oracle_fraction'), '.3f')}"
                  f" | {fmt(ttft.get('mean'), '.0f')} | {fmt(ttft.get('p99'), '.0f')}"
                  f" | {fmt(e2e.get('mean'), '.0f')} | {r['throughput_rps']:.1f}"
                  f" | {r['spread']:.2f} | {fmt(r.get('work_spread'), '.2f')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
