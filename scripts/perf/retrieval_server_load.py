"""`harness serve retriever` under load: single-query clients against one batched request, and a soak.

Default mode (issue 15's goal): the same server answers, in alternating rounds (A B, then B A),

- A: ``wrk`` with ``--connections`` (32) connections each sending one-query ``/retrieve`` requests;
- B: ``wrk`` with one connection sending ``/retrieve`` requests of ``--batch`` (1,000) queries back
  to back for ``--seconds`` (so, like A, without a Python client's encode/parse cost);

and the script prints the medians and single-query q/s as a share of batched q/s (goal ≥ 25%).

``--soak``: ``--soak-clients`` (200) connections for ``--soak-seconds`` (30) of one-query
requests; prints requests/s, errors, server RSS before/peak/after, ``/metrics`` and whether
``/health`` answers at the end.

    PYTHONPATH=. .venv/bin/python scripts/perf/retrieval_server_load.py [--index DIR] [--kind bm25|dense]
    PYTHONPATH=. .venv/bin/python scripts/perf/retrieval_server_load.py --soak
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

import httpx

from harness.ports import free_port
from scripts.perf.loadgen import (
    cpu_seconds,
    harness_index,
    harness_server_cmd,
    post_retrieve,
    questions,
    rss_mb,
    run_wrk,
    server,
    write_lua,
)


def single_vs_batched(url: str, pid: int, args: argparse.Namespace, qs: list[str], tmp: Path) -> None:
    """Alternating rounds (A B, then B A, ...) of the single-query and the batched side, both
    driven by ``wrk``: neither side's figure includes a Python client's JSON encoding or parsing."""
    single_lua = write_lua(tmp / "single.lua", qs, 1)
    batch_lua = write_lua(tmp / "batch.lua", qs, args.batch)
    post_retrieve(url, qs[: args.batch], 3)  # warm: first batch of this size
    singles, batched, cpu_single, cpu_batched = [], [], [], []

    def run_batched() -> str:
        c0 = cpu_seconds(pid)
        w = run_wrk(url + "/retrieve", batch_lua, 1, args.seconds)  # one client, back-to-back requests
        if not w["requests"]:
            raise SystemExit(f"no batched request of {args.batch} queries completed in {args.seconds} s")
        cpu_batched.append((cpu_seconds(pid) - c0) / (w["requests"] * args.batch) * 1e3)
        batched.append(w["rps"] * args.batch)
        return (
            f"batched {batched[-1]:8.0f} q/s ({cpu_batched[-1]:.3f} server CPU ms/q, {w['requests']:.0f} requests "
            f"of {args.batch}, p50 {w['p50_ms']:.0f} ms)"
        )

    def run_single() -> str:
        c0 = cpu_seconds(pid)
        w = run_wrk(url + "/retrieve", single_lua, args.connections, args.seconds)
        cpu_single.append((cpu_seconds(pid) - c0) / w["requests"] * 1e3)
        singles.append(w["rps"])
        return (
            f"{args.connections} single-query clients {w['rps']:8.0f} req/s ({cpu_single[-1]:.3f} server CPU "
            f"ms/req) p50 {w['p50_ms']:.1f} ms p95 {w['p95_ms']:.1f} ms non2xx {w['non2xx']:.0f} "
            f"sockerr {w['sockerr']:.0f}"
        )

    for r in range(args.rounds):
        order = (run_single, run_batched) if r % 2 == 0 else (run_batched, run_single)
        print(f"round {r + 1}: " + " | ".join(fn() for fn in order), flush=True)
    s, b = median(singles), median(batched)
    print(f"median: single-query {s:.0f} q/s, batched {b:.0f} q/s -> {100 * s / b:.1f}% of batched (goal >= 25%)")
    cs, cb = median(cpu_single), median(cpu_batched)
    print(
        f"server CPU per query: single-query {cs:.3f} ms, batched {cb:.3f} ms -> single-query costs "
        f"{cs / cb:.1f}x a batched query (load-independent; 1/{cs / cb:.1f} = {100 * cb / cs:.0f}%)"
    )


def soak(url: str, pid: int, args: argparse.Namespace, qs: list[str], tmp: Path) -> int:
    lua = write_lua(tmp / "single.lua", qs, 1)
    before, peak, stop = rss_mb(pid), [0.0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.5)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    w = run_wrk(url + "/retrieve", lua, args.soak_clients, args.soak_seconds)
    stop.set()
    t.join()
    after = rss_mb(pid)
    health = httpx.get(url + "/health", timeout=5)
    metrics = httpx.get(url + "/metrics", timeout=5).json()
    print(
        f"soak: {args.soak_clients} clients x {args.soak_seconds} s: {w['rps']:.0f} req/s, "
        f"{w['requests']:.0f} requests, non2xx {w['non2xx']:.0f}, socket errors {w['sockerr']:.0f}, "
        f"p50 {w['p50_ms']:.1f} ms p95 {w['p95_ms']:.1f} ms"
    )
    print(f"server RSS: before {before:.0f} MB, peak {peak[0]:.0f} MB, after {after:.0f} MB")
    print(f"/health at the end: HTTP {health.status_code} {health.json().get('status')}")
    print("/metrics:", json.dumps(metrics))
    ok = health.status_code == 200 and w["non2xx"] == 0 and w["sockerr"] == 0 and metrics["errors"] == 0
    print("soak", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--index", help="A built index directory (default: build one in a temp dir)")
    p.add_argument("--kind", default="bm25", choices=("bm25", "dense"), help="Index kind to build without --index")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--soak", action="store_true")
    p.add_argument("--soak-clients", type=int, default=200)
    p.add_argument("--soak-seconds", type=float, default=30)
    p.add_argument("--server-args", default="", help="Extra `serve retriever` options, e.g. '--max-batch 64'")
    args = p.parse_args()
    qs = questions()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        index = harness_index(args.index, args.kind, tmp)
        port = free_port()
        cmd = harness_server_cmd(index, port, *args.server_args.split())
        print(f"# server: {' '.join(cmd[1:])}; load: wrk -t1, Lua-rotated bodies of {len(qs)} HotpotQA questions")
        with server(cmd, port, tmp / "server.log") as (url, proc):
            if args.soak:
                return soak(url, proc.pid, args, qs, tmp)
            single_vs_batched(url, proc.pid, args, qs, tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
