"""Load generation for the retrieval-server benchmarks: servers in subprocesses, ``wrk`` runs, RSS.

``wrk`` (Debian package ``wrk``; a C load generator) drives the servers: a Python client on these
2-core machines would measure itself. Bodies rotate through a list of real questions via a Lua
script written to a temp dir, so no two consecutive requests are the same.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from harness.retrieval.index import build_index
from harness.textfiles import read_jsonl

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"  # ../shared/data from the repo root
DEV = DATA / "hotpotqa" / "dev_distractor1352.jsonl"
CORPUS = DATA / "hotpotqa" / "corpus_distractor1352.jsonl"

_LUA_HEAD = 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nlocal bodies = {\n'
_LUA_TAIL = """}
local i = 0
request = function()
  i = i + 1
  return wrk.format(nil, nil, nil, bodies[(i % #bodies) + 1])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d non2xx=%d sockerr=%d p50_ms=%.3f p95_ms=%.3f\\n",
    summary.requests, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50) / 1000, latency:percentile(95) / 1000))
end
"""


def questions(limit: int | None = None) -> list[str]:
    if not DEV.is_file():
        raise SystemExit(f"needs the shared benchmark data: {DEV} is missing")
    rows = [r["question"] for _, r in read_jsonl(DEV)]
    return rows[:limit] if limit else rows


def harness_index(given: str | None, kind: str, tmp: Path) -> Path:
    """The index the harness server loads: ``given`` (a built index directory), else a ``kind``
    index of :data:`CORPUS` built into ``tmp`` (minutes on CPU for dense)."""
    if given:
        return Path(given)
    out = tmp / f"idx-{kind}"
    build_index(CORPUS, kind, out)
    return out


def harness_server_cmd(index: Path, port: int, *options: str) -> list[str]:
    """The command line of ``harness serve retriever`` on ``index`` and ``port``, plus ``options``."""
    return [
        sys.executable,
        "-m",
        "cli.main",
        "serve",
        "retriever",
        "--index",
        str(index),
        "--port",
        str(port),
        *options,
    ]


def write_lua(path: Path, qs: list[str], per_request: int, topk: int = 3) -> Path:
    """A wrk script whose requests are Search-R1 ``/retrieve`` bodies of ``per_request`` queries each."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(_LUA_HEAD)
        for start in range(0, len(qs) - per_request + 1, per_request):
            body = json.dumps({"queries": qs[start : start + per_request], "topk": topk, "return_scores": True})
            if "]==]" in body:
                continue
            f.write(f"[==[{body}]==],\n")
        f.write(_LUA_TAIL)
    return path


def run_wrk(url: str, lua: Path, connections: int, seconds: float, threads: int = 1) -> dict[str, float]:
    """One wrk run: requests/s, non-2xx and socket errors, p50/p95 latency (ms)."""
    if shutil.which("wrk") is None:
        raise SystemExit("needs wrk (apt-get install wrk): a Python load generator would measure itself here")
    cmd = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(int(seconds), 1)}s",
        "--timeout",
        "30s",
        "-s",
        str(lua),
        url,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    fields = dict(kv.split("=") for kv in re.search(r"RESULT (.*)", out).group(1).split())
    return {"rps": rps, **{k: float(v) for k, v in fields.items()}}


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; log {log}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
            # Search-R1's server has no /health: ready when it answers a query
            probe = {"queries": ["ready?"], "topk": 1, "return_scores": True}
            if httpx.post(url + "/retrieve", json=probe, timeout=60).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server at {url} not healthy after {timeout:.0f} s; log {log}")


def post_retrieve(url: str, qs: list[str], k: int, timeout: float = 600) -> list[list[dict[str, Any]]]:
    r = httpx.post(url + "/retrieve", json={"queries": qs, "topk": k, "return_scores": True}, timeout=timeout)
    r.raise_for_status()
    return r.json()["result"]


@contextmanager
def server(cmd: list[str], port: int, log: Path, health_timeout: float = 600, env: dict | None = None):
    """Start ``cmd`` (a server on ``port``), wait for ``/health``, yield (url, Popen); stop it after."""
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        wait_healthy(url, proc, health_timeout, log)
        yield url, proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its children, in MB (Linux /proc)."""
    total = 0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (all its threads), in seconds (Linux /proc).

    On a loaded shared machine throughput swings with what else runs; CPU time per request does
    not, so the benchmarks print both.
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
