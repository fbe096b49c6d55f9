"""`harness serve retriever` (dense) against Search-R1's own ``retrieval_server.py``, side by side.

The peer is the file ``search_r1/search/retrieval_server.py`` of a Search-R1 checkout that *you*
supply (``--peer PATH``); nothing of it is copied into this project. Both servers get:

- the corpus ``hotpotqa/corpus_distractor1352.jsonl`` (13,283 paragraphs) from ``../shared/data``;
- the encoder: the shipped all-MiniLM-L6-v2 (mean pooling, max length 256, L2-normalised);
- a flat inner-product FAISS index over the same vectors: harness's ``faiss.index`` (built with
  ``harness index build`` unless ``--index`` names one) is the file the peer reads with
  ``faiss.read_index``, the format Search-R1's index builder writes (``*_Flat.index``);
- the same load: ``wrk`` with ``--clients`` (32) connections, first one query per request, then
  ``--batch-size`` (16) queries per request, bodies rotating through the 1,352 HotpotQA questions.

Rounds alternate the two sides (A B A B) and the script prints medians of queries/s and of wrk's
p50/p95 latency, the harness/peer ratios, and top-k agreement over all 1,352 questions.

The peer runs on CPU through a small launcher written to the temp dir: its ``.cuda()`` and
``.half()`` calls are made no-ops (fp32 on CPU, like harness), and ``uvicorn.run`` gets
``127.0.0.1``, the chosen port and log level ``warning`` (no access log; harness has none by
default either). Everything else is the peer's own code and its command-line arguments.

    PYTHONPATH=. .venv/bin/python scripts/perf/vs_search_r1_server.py \\
        --peer /path/to/Search-R1/search_r1/search/retrieval_server.py [--index DIR] [--seconds 15]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

from harness.ports import free_port
from harness.retrieval.encoders import default_encoder_path
from harness.retrieval.index import read_manifest
from scripts.perf.loadgen import (
    CORPUS,
    cpu_seconds,
    harness_index,
    harness_server_cmd,
    post_retrieve,
    questions,
    run_wrk,
    server,
    write_lua,
)

SHIM = """\
import runpy, sys
import torch, uvicorn
peer, port = sys.argv[1], int(sys.argv[2])
torch.nn.Module.cuda = lambda self, *a, **k: self  # CPU: the peer moves its model and inputs to CUDA
torch.Tensor.cuda = lambda self, *a, **k: self
torch.nn.Module.half = lambda self: self  # fp32 on CPU, as harness runs its encoder
_run = uvicorn.run
def run(app, *args, **kw):
    kw.update(host="127.0.0.1", port=port, log_level="warning")
    return _run(app, **kw)
uvicorn.run = run
sys.argv = [peer, *sys.argv[3:]]
runpy.run_path(peer, run_name="__main__")
"""


def versions(peer: Path) -> str:
    pkgs = ["torch", "transformers", "faiss-cpu", "fastapi", "uvicorn", "datasets", "orjson", "uvloop", "httptools"]
    have = []
    for p in pkgs:
        try:
            have.append(f"{p}=={md.version(p)}")
        except md.PackageNotFoundError:
            pass
    sha = hashlib.sha256(peer.read_bytes()).hexdigest()[:12]
    commit = subprocess.run(["git", "-C", str(peer.parent), "rev-parse", "HEAD"], capture_output=True, text=True)
    where = f"commit {commit.stdout.strip()[:12]}" if commit.returncode == 0 else "not in a git checkout"
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    wrk_v = (wrk.stdout or wrk.stderr).split("\n")[0].strip()
    return f"# pinned: {' '.join(have)}; peer {peer.name} sha256 {sha}… ({where}); {wrk_v}"


def agreement(a_url: str, b_url: str, qs: list[str], k: int) -> tuple[int, int]:
    same = 0
    for start in range(0, len(qs), 64):
        chunk = qs[start : start + 64]
        a = post_retrieve(a_url, chunk, k)
        b = post_retrieve(b_url, chunk, k)
        same += sum(
            [d["document"]["id"] for d in x] == [d["document"]["id"] for d in y] for x, y in zip(a, b, strict=True)
        )
    return same, len(qs)


def load_rounds(
    urls: dict[str, str], pids: dict[str, int], args: argparse.Namespace, qs: list[str], tmp: Path, per: int
) -> dict:
    lua = write_lua(tmp / f"body{per}.lua", qs, per, args.k)
    runs: dict[str, list[dict]] = {name: [] for name in urls}
    names = list(urls)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:  # A B, then B A: a load trend hits both alike
            c0 = cpu_seconds(pids[name])
            w = run_wrk(urls[name] + "/retrieve", lua, args.clients, args.seconds)
            cpu = cpu_seconds(pids[name]) - c0
            w["qps"] = w["rps"] * per
            # Server CPU per query (all its threads): what the machine's other load does not change.
            w["cpu_ms_per_q"] = 1e3 * cpu / max(1.0, w["qps"] * max(int(args.seconds), 1))
            w["cpu_share"] = cpu / max(int(args.seconds), 1)  # cores the server got, on average
            runs[name].append(w)
            print(
                f"  round {r + 1} {name:8s} {w['qps']:8.1f} q/s  p50 {w['p50_ms']:7.1f} ms  p95 {w['p95_ms']:7.1f} ms  "
                f"server CPU {w['cpu_ms_per_q']:6.1f} ms/query ({w['cpu_share']:.2f} cores)  "
                f"non2xx {w['non2xx']:.0f} sockerr {w['sockerr']:.0f}  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    keys = ("qps", "p50_ms", "p95_ms", "cpu_ms_per_q", "cpu_share")
    return {name: {m: median([w[m] for w in ws]) for m in keys} for name, ws in runs.items()}


def report(title: str, med: dict) -> None:
    h, p = med["harness"], med["peer"]
    print(
        f"{title}: harness {h['qps']:.1f} q/s (p50 {h['p50_ms']:.0f} ms, p95 {h['p95_ms']:.0f} ms, "
        f"{h['cpu_ms_per_q']:.1f} CPU ms/query, {h['cpu_share']:.2f} cores) | "
        f"Search-R1 {p['qps']:.1f} q/s (p50 {p['p50_ms']:.0f} ms, p95 {p['p95_ms']:.0f} ms, "
        f"{p['cpu_ms_per_q']:.1f} CPU ms/query, {p['cpu_share']:.2f} cores) | "
        f"QPS ratio {h['qps'] / p['qps']:.2f}x, p95 ratio {p['p95_ms'] / h['p95_ms']:.2f}x lower, "
        f"CPU per query ratio {p['cpu_ms_per_q'] / h['cpu_ms_per_q']:.2f}x less"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", required=True, help="Search-R1's search_r1/search/retrieval_server.py (your checkout)")
    p.add_argument("--index", help="A built harness dense flat index over the corpus (default: build one)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="Queries per request in the batched runs")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--embed-cache", type=int, default=0, help="harness's query-embedding cache (0: off, fair)")
    p.add_argument("--skip-batched", action="store_true")
    p.add_argument("--agreement-limit", type=int, default=0, help="check top-k on the first N questions (0: all)")
    p.add_argument("--threads", type=int, default=0, help="OMP/MKL threads for both servers (0: torch's default)")
    args = p.parse_args()
    peer = Path(args.peer).resolve()
    if not peer.is_file():
        raise SystemExit(f"--peer {peer} is not a file (Search-R1's search_r1/search/retrieval_server.py)")
    qs = questions()
    print(
        "# not like-for-like: the peer runs on CPU via a launcher that no-ops .cuda()/.half() (fp32) and sets "
        "host/port/log level; it reads harness's faiss.index (same vectors, not re-encoded by its own builder); "
        f"harness micro-batches concurrent requests; harness embed cache {'off' if not args.embed_cache else 'ON'}; "
        "one 2-core machine shared by server, wrk and other jobs"
    )
    print(versions(peer))

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not args.index:
            print("building the harness dense index (minutes on CPU) ...", flush=True)
        index = harness_index(args.index, "dense", tmp)
        m = read_manifest(index)
        if m.get("kind") != "dense" or m.get("faiss", "flat") != "flat" or m.get("model") != "all-MiniLM-L6-v2":
            raise SystemExit(f"--index {index} must be a flat dense all-MiniLM-L6-v2 index, manifest says {m}")
        shutil.copy(index / "faiss.index", tmp / "MiniLM_Flat.index")
        (tmp / "peer_launcher.py").write_text(SHIM)
        hp, pp = free_port(), free_port()
        ours = harness_server_cmd(index, hp, "--default-k", str(args.k), "--embed-cache", str(args.embed_cache))
        theirs = [sys.executable, str(tmp / "peer_launcher.py"), str(peer), str(pp), "--index_path"]
        theirs += [str(tmp / "MiniLM_Flat.index"), "--corpus_path", str(CORPUS), "--topk", str(args.k)]
        theirs += ["--retriever_name", "minilm", "--retriever_model", default_encoder_path()]
        print(f"# harness: {' '.join(ours[1:])}\n# peer:    {' '.join(theirs[1:])}")
        env = {"HF_DATASETS_CACHE": str(tmp / "hf-datasets"), "TOKENIZERS_PARALLELISM": "false"}
        if args.threads:  # torch's intra-op threads (OpenMP), the same for both servers
            env |= {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
        print(f"# load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        with (
            server(ours, hp, tmp / "harness.log", env=env) as (h_url, h_proc),
            server(theirs, pp, tmp / "peer.log", env=env) as (p_url, p_proc),
        ):
            pids = {"harness": h_proc.pid, "peer": p_proc.pid}
            same, n = agreement(h_url, p_url, qs[: args.agreement_limit or None], args.k)
            print(f"top-{args.k} agreement: {same}/{n} questions return the same ids in the same order")
            urls = {"harness": h_url, "peer": p_url}
            print(f"{args.clients} clients, 1 query per request, {args.seconds:.0f} s per run:")
            report("single-query", load_rounds(urls, pids, args, qs, tmp, 1))
            if not args.skip_batched:
                print(f"{args.clients} clients, {args.batch_size} queries per request:")
                report(f"batched ({args.batch_size}/request)", load_rounds(urls, pids, args, qs, tmp, args.batch_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
