"""The fault battery's tools: ``harness`` in a child process, the scripted eval's arguments on the
demo, a loopback Search-R1 ``/retrieve`` server, a private mount namespace, the tiny SFT recipe,
and checks that a command was refused cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from benchmarks import tiny_recipes
from benchmarks.datasets import demo_path, load_examples
from harness.ports import child_env
from harness.retrieval.corpus import read_corpus
from harness.retrieval.memory import InMemoryRetriever

REPO = Path(__file__).resolve().parents[2]
TRAIN_RECIPE = "configs/train/smollm2_cpu_sft_demo.yaml"
RUN = "search_r1-demo-test"  # the run directory of the scripted eval below
N = 12  # demo questions per eval
HARNESS = (sys.executable, "-m", "cli.main")  # the harness command, in a child Python


def harness(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run ``harness ARGS`` in a child process (the repository on its path), output captured."""
    return subprocess.run(
        [*HARNESS, *args],
        cwd=cwd,
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def spawn(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [*HARNESS, *args],
        cwd=cwd,
        env=_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    # no rendezvous variables: a run of ours in this process (a test) may hold its MASTER_PORT
    return {**child_env(), "PYTHONPATH": path, "COLUMNS": "200", **(extra or {})}


def flat(text: str) -> str:
    """One line, no ANSI codes: messages are wrapped to the terminal width."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def foreign_project(root: Path) -> Path:
    """The issue's folder that is not harness's: ``P/config.json`` and ``P/src/main.py``."""
    p = root / "P"
    (p / "src").mkdir(parents=True)
    (p / "config.json").write_text("{}")
    (p / "src" / "main.py").write_text("x\n")
    return p


def namespaces_work() -> bool:
    """Whether this machine lets an unprivileged process mount in a user namespace of its own."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False).returncode == 0


def in_mount_namespace(
    script: str, timeout: float, expect: list[str]
) -> tuple[subprocess.CompletedProcess, list[str], list[str]]:
    """Run the shell ``script`` in a private user and mount namespace (``unshare -rm``: its mounts
    are seen by nothing outside it), from the repository, output captured. Returns the process,
    the exit codes the script echoed (``echo EXIT $?``), and what went unsaid: each ``expect``
    text missing from the output, and ``a traceback`` when one was printed."""
    argv = ["unshare", "-rm", "sh", "-c", script]
    r = subprocess.run(argv, cwd=REPO, env=_env(None), capture_output=True, text=True, timeout=timeout)
    said = flat(r.stdout + r.stderr)
    wrong = [f"missing {e}" for e in expect if e not in said] + (["a traceback"] if "Traceback" in said else [])
    return r, re.findall(r"EXIT (\d+)", r.stdout), wrong


def eval_script(tmp: Path) -> Path:
    """The scripted model: every demo question, one search, then its gold answer."""
    path = tmp / "script.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for ex in load_examples("demo"):
            turns = [f"<search>{ex.question}</search>", f"<answer>{ex.answers[0]}</answer>"]
            f.write(json.dumps({"match": ex.question, "turns": turns}) + "\n")
    return path


def eval_args(tmp: Path, out: Path, *extra: str) -> list[str]:
    return [
        "eval", "--method", "search_r1", "--dataset", "demo", "--backend", "scripted",
        "--script", str(eval_script(tmp)), "--out", str(out), "--limit", str(N), "agent.max_total_tokens=100000",
        *extra,
    ]  # fmt: skip


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


def wait_for(cond: Callable[[], bool], timeout: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"  # a zombie is dead
    except (OSError, IndexError):
        return False


class RetrievalServer(contextlib.AbstractContextManager):
    """Search-R1's ``/retrieve`` over the demo corpus on loopback: ``delay_s`` per request (a run
    that takes a while), from request ``fail_after`` on HTTP 503 (a retriever that died), and
    with ``held`` every request after the first (the preflight) waits until :meth:`release` (a
    run caught in the middle, for as long as a fault needs). ``fail_after`` and ``requests`` are
    attributes: a test may set the first between runs (the server dies, then comes back)."""

    def __init__(self, delay_s: float = 0.0, fail_after: int | None = None, held: bool = False) -> None:
        retriever = InMemoryRetriever(read_corpus(demo_path("corpus.jsonl")))
        self.requests = 0
        self.fail_after = fail_after
        self.gate = threading.Event()
        if not held:
            self.gate.set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                if outer.requests > 1:
                    outer.gate.wait(120)
                time.sleep(delay_s)
                if outer.fail_after is not None and outer.requests > outer.fail_after:
                    self.send_response(503)
                    self.end_headers()
                    return
                docs = retriever.search(body["queries"], body.get("topk", 3))
                result = [
                    [{"document": {"id": d.id, "contents": d.contents}, "score": d.score} for d in ds] for ds in docs
                ]
                raw = json.dumps({"result": result}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                try:
                    self.wfile.write(raw)
                except OSError:  # the client was killed (a fault of the battery): nothing to answer
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self.gate.set()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


def http(url: str) -> list[str]:
    return ["--retriever", "http", "--index", url, "retriever.retries=0", "agent.max_concurrency=1"]


def sft_recipe(tmp: Path) -> Path:
    """The tiny SFT recipe (4 steps, a checkpoint every step, 2 kept) on four chat records, under ``tmp``."""
    return tiny_recipes.sft_recipe(tmp, name="sft-fault")


def sft_run(tmp: Path, steps: int) -> tuple[Path, Path, str | None]:
    """The tiny SFT recipe trained ``steps`` steps into ``tmp/run``: (the recipe, the run, why the
    training failed or None)."""
    recipe, run = sft_recipe(tmp), tmp / "run"
    first = harness("train", "-c", str(recipe), "--out", str(run), f"trainer.max_steps={steps}", cwd=tmp)
    failed = f"train exit {first.returncode}: {flat(first.stderr)[-90:]}" if first.returncode != 0 else None
    return recipe, run, failed


def overwrite_with_user_files(tmp: Path, steps: int, files: dict[str, str]) -> tuple[int, str, bool] | str:
    """Train the tiny SFT run ``steps`` steps, add the user's ``files`` (path in the run → text) to
    it, then train again over it with ``--overwrite``: (its exit status, what it said, whether the
    run's files are as they were), or why the first training failed."""
    recipe, run, failed = sft_run(tmp, steps)
    if failed:
        return failed
    for rel, text in files.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    before = snapshot(run)
    r = harness("train", "-c", str(recipe), "--out", str(run), "--overwrite", f"trainer.max_steps={steps}", cwd=tmp)
    return r.returncode, flat(r.stdout + r.stderr), snapshot(run) == before


# Nine levels of nine aliases: 9**9 values once expanded, from 300 bytes of YAML.
ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def refused_cleanly(tmp: Path, args: list[str], expect: str, left: Callable[[], bool]) -> tuple[bool, str]:
    """Run ``harness ARGS``: handled when it exits 2 with ``expect`` in its message, no traceback,
    and ``left()`` (nothing written where it must not be) holds."""
    t0 = time.monotonic()
    r = harness(*args, cwd=tmp, timeout=120)
    took = time.monotonic() - t0
    out = flat(r.stdout + r.stderr)
    ok = r.returncode == 2 and expect in out and "Traceback" not in out and left()
    tail = out[out.find("error:") :][:110] if "error:" in out else out[-110:]
    return ok, f"exit {r.returncode} in {took:.1f} s; {'nothing left' if left() else 'LEFT A FOLDER'}; {tail}"


def refused_each(tmp: Path, cases: dict[str, tuple[list[str], str, Path]]) -> tuple[bool, str]:
    """:func:`refused_cleanly` for each case (name -> args, expected text, a folder that must not
    be made); handled when every one is."""
    bad = []
    for name, (args, expect, folder) in cases.items():
        ok, said = refused_cleanly(tmp, args, expect, lambda folder=folder: not folder.exists())
        if not ok:
            bad.append(f"{name}: {said[:90]}")
    return not bad, "; ".join(bad) or f"{len(cases)} refusals naming the key, exit 2, no folder left"
