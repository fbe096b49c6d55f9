"""The fault battery (issue 23): put ``harness`` through the faults a new user met, against the
real CLI (``python -m cli.main`` in child processes), on tiny local data (the packaged
demo, the scripted backend, the in-memory retriever or a loopback Search-R1 ``/retrieve``
server run here), and print one line per fault: pass/FAIL, seconds, fault, expected, observed.

    python -m scripts.faults [--only NAME ...] [--workers 2] [--keep DIR]

Exit status 1 when a fault is not handled as expected. ``tests/benchmarks/test_faults.py`` runs
it (slow tier). Each fault works in its own temporary folder; the faults run ``--workers`` at a
time (each is one or a few short ``harness`` processes).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from benchmarks import tiny_recipes
from benchmarks.datasets import demo_path, load_examples
from harness.ports import child_env
from harness.retrieval.corpus import read_corpus
from harness.retrieval.memory import InMemoryRetriever

REPO = Path(__file__).resolve().parents[1]
TRAIN_RECIPE = "configs/train/smollm2_cpu_sft_demo.yaml"
RUN = "search_r1-demo-test"  # the run directory of the scripted eval below
N = 12  # demo questions per eval


@dataclass
class Outcome:
    fault: str
    expected: str
    observed: str
    ok: bool
    seconds: float


@dataclass(frozen=True)
class Fault:
    name: str
    expected: str
    check: Callable[[Path], tuple[bool, str]]  # (handled as expected, what was observed)


FAULTS: list[Fault] = []


def fault(name: str, expected: str) -> Callable:
    def register(fn: Callable[[Path], tuple[bool, str]]) -> Callable:
        FAULTS.append(Fault(name, expected, fn))
        return fn

    return register


# ---- helpers ----------------------------------------------------------------------------------
def harness(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run ``harness ARGS`` in a child process (the repository on its path), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=cwd,
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def spawn(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
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


class RetrievalServer:
    """Search-R1's ``/retrieve`` over the demo corpus on loopback: ``delay_s`` per request (a run
    that takes a while), from request ``fail_after`` on HTTP 503 (a retriever that died), and
    with ``held`` every request after the first (the preflight) waits until :meth:`release` (a
    run caught in the middle, for as long as a fault needs)."""

    def __init__(self, delay_s: float = 0.0, fail_after: int | None = None, held: bool = False) -> None:
        retriever = InMemoryRetriever(read_corpus(demo_path("corpus.jsonl")))
        self.requests = 0
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
                if fail_after is not None and outer.requests > fail_after:
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

    def __enter__(self) -> RetrievalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


def http(url: str) -> list[str]:
    return ["--retriever", "http", "--index", url, "retriever.retries=0", "agent.max_concurrency=1"]


# ---- the faults -------------------------------------------------------------------------------
@fault("train --overwrite on a folder harness did not make", "refused by name, folder untouched")
def overwrite_foreign(tmp: Path) -> tuple[bool, str]:
    p = foreign_project(tmp)
    before = snapshot(p)
    r = harness("train", "-c", str(REPO / TRAIN_RECIPE), "--out", str(p), "--overwrite", "trainer.max_steps=1", cwd=tmp)
    out = flat(r.stdout + r.stderr)
    untouched = snapshot(p) == before and sorted(x.name for x in p.iterdir()) == ["config.json", "src"]
    refused = r.returncode != 0 and "not created by harness" in out and "src/" in out
    return refused and untouched, f"exit {r.returncode}; {'untouched' if untouched else 'CHANGED'}; {out[-110:]}"


@fault("index build --out a folder harness did not make", "refused before building, untouched")
def index_foreign(tmp: Path) -> tuple[bool, str]:
    p = foreign_project(tmp)
    before = snapshot(p)
    r = harness("index", "build", "--corpus", str(demo_path("corpus.jsonl")), "--out", str(p), cwd=tmp)
    out = flat(r.stdout + r.stderr)
    ok = r.returncode != 0 and "not created by harness" in out and snapshot(p) == before
    return ok, f"exit {r.returncode}; {'untouched' if snapshot(p) == before else 'CHANGED'}; {out[-90:]}"


@fault("the same eval twice at once", "second refused naming the pid; each item once; progress when piped")
def eval_twice(tmp: Path) -> tuple[bool, str]:
    with RetrievalServer(held=True) as server:  # the first run waits in its first search
        # the first waits in its search for as long as the second takes to start (timeout 300 s)
        first = spawn(*eval_args(tmp, tmp / "runs", *http(server.url), "retriever.timeout=300"), cwd=tmp)
        wait_for(lambda: server.requests >= 2, 300)
        second = harness(*eval_args(tmp, tmp / "runs", *http(server.url), "retriever.timeout=300"), cwd=tmp)
        server.release()
        _, err = first.communicate(timeout=300)
    out = flat(second.stdout + second.stderr)
    n = lines(tmp / "runs" / RUN / "trajectories.jsonl")
    refused = second.returncode != 0 and "is in use" in out and f"pid {first.pid}" in out
    progress = len(re.findall(rf"\d+/{N} items", err))
    ok = refused and first.returncode == 0 and n == N and progress >= 2
    who = "names the pid" if refused else out[-60:]
    return ok, (
        f"first: exit {first.returncode}; second: exit {second.returncode} ({who}); {n} lines for {N} items; "
        f"{progress} progress lines (piped)"
    )


@fault("the retriever dies mid-run", "exit 1 'retriever down: k items failed' at once; failed not in n")
def retriever_dies(tmp: Path) -> tuple[bool, str]:
    with RetrievalServer(fail_after=3) as server:  # the preflight and two items, then 503 for good
        t0 = time.monotonic()
        r = harness(*eval_args(tmp, tmp / "runs", *http(server.url), "stop_after_failures=3"), cwd=tmp)
        took = time.monotonic() - t0
    out = flat(r.stdout + r.stderr)
    res = (
        json.loads((tmp / "runs" / RUN / "results.json").read_text())
        if (tmp / "runs" / RUN / "results.json").exists()
        else {}
    )
    m = re.search(r"retriever down: (\d+) items failed", out)
    ok = r.returncode == 1 and m is not None and res.get("n") == 2 and res.get("errors") == 3
    said = m.group(0) if m else out[-80:]
    return ok, f"exit {r.returncode}; {said}; n={res.get('n')} errors={res.get('errors')}; {took:.0f} s"


@fault("kill -9 during eval, then rerun", "resumes: every item once, none twice, results complete")
def eval_killed(tmp: Path) -> tuple[bool, str]:
    with RetrievalServer(delay_s=0.5) as server:
        p = spawn(*eval_args(tmp, tmp / "runs", *http(server.url)), cwd=tmp)
        scores = tmp / "runs" / RUN / "scores.jsonl"
        wait_for(lambda: lines(scores) >= 3, 300)
        p.send_signal(signal.SIGKILL)
        p.wait()
        before = lines(scores)
        r = harness(*eval_args(tmp, tmp / "runs", *http(server.url)), cwd=tmp)
    ids = [json.loads(x)["id"] for x in (tmp / "runs" / RUN / "scores.jsonl").read_text().splitlines()]
    res = json.loads((tmp / "runs" / RUN / "results.json").read_text())
    ok = r.returncode == 0 and 3 <= before < N and len(ids) == len(set(ids)) == N and res["complete"]
    return ok, f"killed after {before} items; rerun exit {r.returncode}; {len(ids)} scores, {len(set(ids))} items"


@fault("results table on an 80-column terminal", "no number cut ('…'); lines within 80 columns")
def table_80(tmp: Path) -> tuple[bool, str]:
    r = harness(*eval_args(tmp, tmp / "runs", "--retriever", "memory", "--limit", "3"), cwd=tmp,
                env={"COLUMNS": "80", "FORCE_COLOR": "1"})  # fmt: skip
    text = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)
    width = max((len(x) for x in text.splitlines()), default=0)
    ok = r.returncode == 0 and "…" not in text and width <= 80 and "3/3" in text and "100.0" in text
    cut = "cut" if "…" in text else "nothing cut"
    return ok, f"exit {r.returncode}; widest line {width}; {cut}; {text.count('harness eval')} table(s)"


CHAIN = """
name: faults
workdir: {workdir}
stages:
  - name: sample
    command: eval
    args: {args}
    output: "{{workdir}}/samples"
"""


def stage_args(tmp: Path, *extra: str) -> str:
    """:func:`eval_args` as a chain stage's ``args`` (JSON): the runner adds the command and ``--out``."""
    argv = eval_args(tmp, Path("OUT"), *extra)
    i = argv.index("--out")
    return json.dumps(argv[1:i] + argv[i + 2 :])


@fault("a stage's marker is lost (stale output)", "output moved aside to .stale-<time>/, not deleted; said so")
def stage_stale(tmp: Path) -> tuple[bool, str]:
    chain = tmp / "chain.yaml"
    chain.write_text(CHAIN.format(workdir=tmp / "work", args=stage_args(tmp, "--retriever", "memory", "--limit", "1")))
    first = harness("stages", "run", str(chain), cwd=tmp)
    (tmp / "work" / ".stages" / "sample.json").unlink()  # the marker is lost
    second = harness("stages", "run", str(chain), cwd=tmp)
    moved = list((tmp / "work").glob(".stale-*/samples/*/trajectories.jsonl"))
    said = "moved aside" in flat(second.stdout + second.stderr)
    ok = first.returncode == 0 and second.returncode == 0 and len(moved) == 1 and said
    told = "said so" if said else "silent"
    return ok, f"exits {first.returncode}, {second.returncode}; {len(moved)} run moved aside; {told}"


@fault("the stage runner is killed (kill -9)", "the running stage dies with it (within 2 s)")
def stage_runner_killed(tmp: Path) -> tuple[bool, str]:
    with RetrievalServer(delay_s=1.0) as server:
        chain = tmp / "chain.yaml"
        chain.write_text(CHAIN.format(workdir=tmp / "work", args=stage_args(tmp, *http(server.url))))
        runner = spawn("stages", "run", str(chain), cwd=tmp)
        lock = tmp / "work" / "samples" / RUN / ".harness.lock"  # the stage's eval writes its pid there
        if not wait_for(lambda: lock.exists() and lock.stat().st_size > 0, 300):
            runner.kill()
            return False, "the stage never started"
        child = json.loads(lock.read_text())["pid"]
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        t0 = time.monotonic()
        gone = wait_for(lambda: not alive(child), 10)
    return (
        gone and time.monotonic() - t0 < 2,
        f"stage pid {child} {'gone' if gone else 'ALIVE'} {time.monotonic() - t0:.1f} s after the runner",
    )


@fault("retriever.timeout=0 / -5", "refused with the key named, no run folder")
def bad_timeout(tmp: Path) -> tuple[bool, str]:
    outs = [harness(*eval_args(tmp, tmp / "runs", f"retriever.timeout={v}"), cwd=tmp) for v in ("0", "-5")]
    texts = [flat(r.stdout + r.stderr) for r in outs]
    ok = all(r.returncode != 0 for r in outs) and all("retriever.timeout must be greater than 0" in t for t in texts)
    return ok and not (tmp / "runs").exists(), texts[0][-70:]


@fault("harness datasets without --data-dir", "says where to point --data-dir (no 'not found')")
def datasets_no_dir(tmp: Path) -> tuple[bool, str]:
    r = harness("datasets", cwd=tmp, env={"HARNESS_DATA_DIR": ""})
    out = flat(r.stdout)
    ok = r.returncode == 0 and "not found" not in out and "--data-dir DIR" in out
    return ok, f"exit {r.returncode}; {'points to --data-dir' if '--data-dir DIR' in out else out[-60:]}"


def sft_recipe(tmp: Path) -> Path:
    """The tiny SFT recipe (4 steps, a checkpoint every step, 2 kept) on four chat records, under ``tmp``."""
    return tiny_recipes.sft_recipe(tmp, name="sft-fault")


@fault("SFT: keep_checkpoints=2, newest checkpoint damaged, --resume", "2 kept; falls back; metrics 1,2,3,4 once")
def sft_checkpoints(tmp: Path) -> tuple[bool, str]:
    sft_recipe(tmp)
    run = tmp / "run"
    first = harness("train", "-c", str(tmp / "sft.yaml"), "--out", str(run), cwd=tmp)
    kept = sorted(p.name for p in (run / "checkpoints").iterdir()) if (run / "checkpoints").is_dir() else []
    if first.returncode != 0:
        return False, f"train exit {first.returncode}: {flat(first.stderr)[-90:]}"
    w = run / "checkpoints" / "step-4" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    again = harness("train", "--resume", str(run), cwd=tmp)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    ok = kept == ["step-3", "step-4"] and again.returncode == 0 and steps == [1, 2, 3, 4]
    return ok, f"kept {kept}; resume exit {again.returncode}; logged steps {steps}"


@fault(
    "train --overwrite: user files in checkpoints/ and final/ of a harness run (issue 31)",
    "refused naming both paths, nothing deleted",
)
def overwrite_nested(tmp: Path) -> tuple[bool, str]:
    recipe, run = sft_recipe(tmp), tmp / "run"
    first = harness("train", "-c", str(recipe), "--out", str(run), "trainer.max_steps=2", cwd=tmp)
    if first.returncode != 0:
        return False, f"train exit {first.returncode}: {flat(first.stderr)[-90:]}"
    (run / "checkpoints" / "my_analysis.md").write_text("notes\n")
    (run / "final" / "exported_by_me").mkdir()
    (run / "final" / "exported_by_me" / "model.gguf").write_bytes(b"GGUF")
    before = snapshot(run)
    r = harness("train", "-c", str(recipe), "--out", str(run), "--overwrite", "trainer.max_steps=2", cwd=tmp)
    out = flat(r.stdout + r.stderr)
    named = "checkpoints/my_analysis.md" in out and "final/exported_by_me/model.gguf" in out
    untouched = snapshot(run) == before
    ok = r.returncode != 0 and named and untouched
    return ok, f"exit {r.returncode}; {'both named' if named else out[-90:]}; {'untouched' if untouched else 'CHANGED'}"


@fault("report --out over a hand-written leaderboard.md (issue 31)", "refused by name, nothing written")
def report_foreign_file(tmp: Path) -> tuple[bool, str]:
    ev = harness(*eval_args(tmp, tmp / "runs", "--retriever", "memory", "--limit", "2"), cwd=tmp)
    out = tmp / "report"
    out.mkdir()
    (out / "leaderboard.md").write_text("my own\n")
    r = harness("report", str(tmp / "runs" / RUN), "--out", str(out), cwd=tmp)
    said = flat(r.stdout + r.stderr)
    kept = (out / "leaderboard.md").read_text() == "my own\n" and sorted(p.name for p in out.iterdir()) == [
        "leaderboard.md"
    ]
    ok = ev.returncode == 0 and r.returncode == 2 and "leaderboard.md, which harness did not write" in said and kept
    return (
        ok,
        f"eval exit {ev.returncode}; report exit {r.returncode}; {'kept, nothing written' if kept else 'CHANGED'}",
    )


def finite_safetensors(folder: Path) -> bool:
    """Whether every tensor of every ``*.safetensors`` in ``folder`` is finite (and there is one)."""
    # deferred: torch costs ~1.4 s at import
    import torch
    from safetensors.torch import load_file

    files = list(folder.glob("*.safetensors"))
    return bool(files) and all(bool(torch.isfinite(t).all()) for f in files for t in load_file(str(f)).values())


@fault("train diverges: SFT at optim.lr=1e30, save_every=5, keep 2 (issue 31)", "exit 1 naming the step; no NaN saved")
def train_diverges(tmp: Path) -> tuple[bool, str]:
    run = tmp / "run"
    over = ["optim.lr=1e30", "trainer.max_steps=20", "trainer.save_every=5", "trainer.keep_checkpoints=2"]
    r = harness("train", "-c", str(sft_recipe(tmp)), "--out", str(run), *over, cwd=tmp)
    said = flat(r.stderr)
    named = re.search(r"diverged at step (\d+)", said)
    ckpts = sorted(p for p in (run / "checkpoints").glob("step-*")) if (run / "checkpoints").is_dir() else []
    finite = all(finite_safetensors(p) for p in ckpts)
    ok = r.returncode == 1 and named is not None and finite and not (run / "final").exists()
    where = f"'diverged at step {named.group(1)}'" if named else said[-90:]
    return ok, f"exit {r.returncode}; {where}; checkpoints {[p.name for p in ckpts]} {'finite' if finite else 'NaN'}"


@fault("train --resume with every checkpoint damaged, new lr and steps (issue 31)", "exit 2; no run record changed")
def resume_fails(tmp: Path) -> tuple[bool, str]:
    run = tmp / "run"
    first = harness("train", "-c", str(sft_recipe(tmp)), "--out", str(run), "trainer.max_steps=2", cwd=tmp)
    if first.returncode != 0:
        return False, f"train exit {first.returncode}: {flat(first.stderr)[-90:]}"
    for w in (run / "checkpoints").glob("step-*/model.safetensors"):
        w.write_bytes(w.read_bytes()[:1000])
    before = {k: v for k, v in snapshot(run).items() if not k.endswith(".harness.lock")}
    r = harness("train", "--resume", str(run), "trainer.max_steps=50", "optim.lr=0.5", cwd=tmp)
    after = {k: v for k, v in snapshot(run).items() if not k.endswith(".harness.lock")}
    said = flat(r.stderr)
    ok = r.returncode == 2 and "no intact checkpoint" in said and "Error:" not in said and after == before
    return ok, f"exit {r.returncode}; records {'unchanged' if after == before else 'CHANGED'}"


# One turn, 2 samples of 2 prompts a step, 2 steps, a checkpoint every step, rollouts overlapping training.
RL_RECIPE = tiny_recipes.grpo_recipe(
    "rl-fault",
    "rollout.sampling.max_new_tokens=16",
    "rollout.agent.max_total_tokens=400",
    "rollout.agent.max_doc_tokens=32",
    "optim.micro_batch_size=2",
    "optim.threads=1",
    "trainer.save_every=1",
    "trainer.async.enabled=true",
)


@fault("async train, then --resume (trainer.async; issue 31)", "both exit 0 (no abort at exit), final written")
def async_resume_exit(tmp: Path) -> tuple[bool, str]:
    (tmp / "rl.yaml").write_text(RL_RECIPE)
    run = tmp / "run"
    codes = []
    for args in (["-c", str(tmp / "rl.yaml"), "--out", str(run)], ["--resume", str(run), "trainer.max_steps=3"]):
        r = harness("train", *args, cwd=tmp)
        codes.append(r.returncode)
        if "terminate called" in r.stderr:
            codes[-1] = f"{r.returncode} (terminate called)"
    ok = codes == [0, 0] and (run / "final").is_dir()
    return ok, f"train exit {codes[0]}, resume exit {codes[1] if len(codes) > 1 else '-'}"


@fault(
    "train: --out a file / through a file, an invalid recipe (issue 31)",
    "messages naming the path, exit 2; no folder left",
)
def train_messages(tmp: Path) -> tuple[bool, str]:
    recipe = sft_recipe(tmp)
    (tmp / "a_file").write_text("x")
    cases = {
        "out is a file": (["--out", str(tmp / "a_file")], f"run folder {tmp / 'a_file'} is a file"),
        "out through a file": (["--out", str(tmp / "a_file" / "run")], f"{tmp / 'a_file' / 'run'}: Not a directory"),
        "invalid recipe": (["--out", str(tmp / "new" / "run"), "algo.kind=prm"], "needs prm.data"),
    }
    bad = []
    for name, (args, says) in cases.items():
        r = harness("train", "-c", str(recipe), *args, cwd=tmp)
        said = flat(r.stderr)
        if r.returncode != 2 or says not in said or "Traceback" in said or "Error:" in said:
            bad.append(f"{name}: exit {r.returncode} {said[-60:]}")
    if (tmp / "new").exists():
        bad.append("the invalid recipe left a folder")
    return not bad, "; ".join(bad) or "3 messages, exit 2, no folder left"


@fault("train on a read-only --out, --resume of a read-only run, a full disk (issue 31)", "messages naming the path")
def train_disks(tmp: Path) -> tuple[bool, str]:
    if not namespaces_work():
        return True, "skipped: no unprivileged mount namespaces here (unshare -rm)"
    recipe, run = sft_recipe(tmp), tmp / "run"
    first = harness("train", "-c", str(recipe), "--out", str(run), "trainer.max_steps=2", cwd=tmp)
    if first.returncode != 0:
        return False, f"train exit {first.returncode}: {flat(first.stderr)[-90:]}"
    ro, full = tmp / "ro", tmp / "full"
    ro.mkdir(), full.mkdir()
    cli = f"{sys.executable} -m cli.main train"
    script = (
        f"mount -t tmpfs -o ro tmpfs {ro} && mount --bind {run} {run} && mount -o remount,bind,ro {run} && "
        f"mount -t tmpfs -o size=64k tmpfs {full} && "
        f"{cli} -c {recipe} --out {ro}/run; echo EXIT $?; {cli} --resume {run} trainer.max_steps=3; echo EXIT $?; "
        f"{cli} -c {recipe} --out {full}/run trainer.max_steps=2; echo EXIT $?"
    )
    expect = [
        f"cannot write {ro}/run: Read-only file system",
        f"cannot write {run}/.harness.lock: Read-only file system",
        "model.safetensors: cannot be written",
    ]
    _, codes, wrong = in_mount_namespace(script, 900, expect)
    ok = codes == ["2", "2", "2"] and not wrong
    return ok, f"exits {codes}; " + ("all three name the path" if not wrong else wrong[0][-70:])


@fault(
    "the retriever dies at the default concurrency (64) (issue 31)",
    "stops within 10 s of the breaker tripping, one pause, the count of failed items named",
)
def retriever_stop_time(tmp: Path) -> tuple[bool, str]:
    with RetrievalServer(fail_after=20) as server:  # HTTP 503 for good after 20 requests (each retried 3 times)
        args = eval_args(tmp, tmp / "runs", "--retriever", "http", "--index", server.url)
        args[args.index("--limit") + 1] = "154"  # every demo test question, 64 at a time (the default)
        r = harness(*args, cwd=tmp)
        ended = datetime.datetime.now()
    out = flat(r.stdout + r.stderr)
    trip = re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING \S+: \d+ items in a row failed", r.stderr)
    pauses = len(re.findall(r"pausing \d+ s", r.stderr))
    named = re.search(r"retriever down: (\d+) items failed", out)
    if trip is None or named is None:
        return False, f"exit {r.returncode}; no trip or no count named: {out[-120:]}"
    took = (ended - datetime.datetime.strptime(trip.group(1), "%Y-%m-%d %H:%M:%S,%f")).total_seconds()
    ok = r.returncode == 1 and took < 10 and pauses == 1
    return ok, f"exit {r.returncode}; stopped {took:.1f} s after the trip; {pauses} pause(s); {named.group(0)}"


@fault("report vs eval on a run with failed items (issue 31)", "the same EM and n; an all-failed run shows no score")
def report_vs_eval(tmp: Path) -> tuple[bool, str]:
    shown = {}
    for fail_after, label in ((3, "some"), (1, "all")):  # the preflight (and two items) pass, then 503s
        with RetrievalServer(fail_after=fail_after) as server:
            harness(
                *eval_args(tmp, tmp / "runs", *http(server.url), "stop_after_failures=0", "--label", label), cwd=tmp
            )
    some = json.loads((tmp / "runs" / "some-demo-test" / "results.json").read_text())
    every = json.loads((tmp / "runs" / "all-demo-test" / "results.json").read_text())
    r = harness("report", str(tmp / "runs"), "--out", str(tmp / "report"), "--format", "md", cwd=tmp)
    md = (tmp / "report" / "leaderboard.md").read_text() if (tmp / "report" / "leaderboard.md").exists() else ""
    for label in ("some", "all"):
        row = next((x for x in md.splitlines() if x.startswith(f"| {label} |")), "")
        shown[label] = row.split("|")[2].strip() if row else "?"
    em = "–" if some["metrics"]["em"] is None else f"{100 * some['metrics']['em']:.1f}"
    want = f"({some['n']}/{some['n_total']}, {some['errors']} err)"
    ok = (
        r.returncode == 0
        and shown["some"].startswith(em + " ")
        and shown["some"].endswith(want)
        and every["metrics"]["em"] is None
        and shown["all"].startswith("– (")
    )
    return ok, f"results.json EM {em} n={some['n']}; report '{shown['some']}'; all failed: report '{shown['all']}'"


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


def _eval_with(tmp: Path, text: bytes, expect: str) -> tuple[bool, str]:
    (tmp / "c.yaml").write_bytes(text)
    args = [*eval_args(tmp, tmp / "runs", "--retriever", "memory"), "-c", str(tmp / "c.yaml")]
    return refused_cleanly(tmp, args, expect, lambda: not (tmp / "runs").exists())


@fault("an alias bomb under judge: in an eval config (issue 31)", "refused at once naming the file, no run folder")
def alias_bomb_eval(tmp: Path) -> tuple[bool, str]:
    text = "judge:\n" + "".join(f"  {x}\n" for x in ALIAS_BOMB.splitlines())
    return _eval_with(tmp, text.encode(), "c.yaml: its aliases (*name) expand to more than 100,000 values")


@fault("an alias bomb under a recipe's source values (issue 31)", "refused at once naming the file, no run folder")
def alias_bomb_recipe(tmp: Path) -> tuple[bool, str]:
    values = "".join(f"          {x}\n" for x in ALIAS_BOMB.splitlines())
    (tmp / "r.yaml").write_text(
        f"name: x\nalgo: {{kind: sft}}\nsft:\n  sources:\n    - kind: chat\n      values:\n{values}"
    )
    args = ["train", "-c", str(tmp / "r.yaml"), "--out", str(tmp / "run")]
    return refused_cleanly(tmp, args, "r.yaml: its aliases", lambda: not (tmp / "run").exists())


@fault("5,000 nested [ in an eval config (issue 31)", "a message naming the file, no RecursionError")
def yaml_nested(tmp: Path) -> tuple[bool, str]:
    return _eval_with(tmp, b"judge: " + b"[" * 5000, "c.yaml nests deeper than 100 levels")


@fault("judge: 5 in an eval config (issue 31)", "a message naming the key, no AttributeError")
def judge_not_a_mapping(tmp: Path) -> tuple[bool, str]:
    return _eval_with(tmp, b"judge: 5\n", "judge must be a mapping")


@fault("a Latin-1 eval config (issue 31)", "a message naming the file and the byte")
def yaml_not_utf8(tmp: Path) -> tuple[bool, str]:
    return _eval_with(tmp, "label: caf\xe9\n".encode("latin-1"), "c.yaml is not UTF-8 text (byte 10")


@fault("eval --out a file; a run folder path that is a file (issue 31)", "a message naming the file, both")
def out_is_a_file(tmp: Path) -> tuple[bool, str]:
    (tmp / "f").write_text("x")
    first = refused_cleanly(
        tmp, eval_args(tmp, tmp / "f", "--retriever", "memory"), f"{tmp / 'f'} is a file", lambda: True
    )
    (tmp / "runs").mkdir()
    (tmp / "runs" / RUN).write_text("x")
    second = refused_cleanly(
        tmp, eval_args(tmp, tmp / "runs", "--retriever", "memory"), f"{tmp / 'runs' / RUN} is a file", lambda: True
    )
    return first[0] and second[0], f"--out a file: {first[1][:60]}; run folder a file: {second[1][:60]}"


@fault("eval --split ../../x (issue 31)", "refused like a bad label; nothing outside --out")
def split_escapes(tmp: Path) -> tuple[bool, str]:
    (tmp / "data" / "hotpotqa").mkdir(parents=True)
    (tmp / "x.jsonl").write_text(json.dumps({"id": "q", "question": "Q?", "golden_answers": ["a"]}) + "\n")
    args = eval_args(
        tmp, tmp / "a" / "runs", "--retriever", "memory", "--split", "../../x", "--data-dir", str(tmp / "data")
    )
    args[args.index("demo")] = "hotpotqa"
    before = sorted(p.name for p in tmp.iterdir())
    return refused_cleanly(
        tmp, args, "dataset.split '../../x'", lambda: sorted(p.name for p in tmp.iterdir()) == before
    )


@fault("eval on a read-only --out, and a disk that fills mid-run (issue 31)", "messages naming the path; data kept")
def eval_disks(tmp: Path) -> tuple[bool, str]:
    if not namespaces_work():
        return True, "skipped: no unprivileged mount namespaces here (unshare -rm)"
    ro, full = tmp / "ro", tmp / "full"
    ro.mkdir(), full.mkdir()
    cli = f"{sys.executable} -m cli.main " + " ".join(
        f"'{a}'" for a in eval_args(tmp, Path("OUT"), "--retriever", "memory")
    )
    script = (
        f"mount -t tmpfs -o ro tmpfs {ro} && mount -t tmpfs -o size=48k tmpfs {full} && "
        f"{cli.replace('OUT', str(ro))}; echo EXIT $?; {cli.replace('OUT', str(full))}; echo EXIT $?; "
        f"wc -l < {full}/{RUN}/scores.jsonl; echo LINES"
    )
    expect = [f"{ro}/{RUN} is on a read-only file system; pick another --out", "the disk is full (writing"]
    r, codes, wrong = in_mount_namespace(script, 600, expect)
    kept = re.search(r"(\d+)\s+LINES", r.stdout)
    ok = codes == ["2", "2"] and not wrong and kept is not None and int(kept.group(1)) > 0
    lines = kept.group(1) if kept else "?"
    return ok, f"exits {codes}; " + (f"both name the path; {lines} items kept" if not wrong else wrong[0][-60:])


# ---- issue 44 ---------------------------------------------------------------------------------
# What a user keeps in a run folder under names that match harness's: --overwrite must refuse.
USER_FILES = {
    "console.log": "my console log",
    "checkpoints/.backup.tmp/model.safetensors": "my weights",
    "best-step-7/model.safetensors": "my model",
    "wandb/run-mine/notes.md": "my notes",
}


@fault(
    "train --overwrite on a run holding a console.log, checkpoints/.backup.tmp/, an unmarked best-step-7/, "
    "wandb/run-mine/ (issue 44)",
    "refused naming each, nothing deleted",
)
def overwrite_user_files(tmp: Path) -> tuple[bool, str]:
    recipe, run = sft_recipe(tmp), tmp / "run"
    first = harness("train", "-c", str(recipe), "--out", str(run), "trainer.max_steps=1", cwd=tmp)
    if first.returncode != 0:
        return False, f"train exit {first.returncode}: {flat(first.stderr)[-90:]}"
    for rel, text in USER_FILES.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    before = snapshot(run)
    r = harness("train", "-c", str(recipe), "--out", str(run), "--overwrite", "trainer.max_steps=1", cwd=tmp)
    said = flat(r.stdout + r.stderr)
    unnamed = [rel for rel in USER_FILES if rel not in said]
    kept = snapshot(run) == before
    ok = r.returncode != 0 and not unnamed and kept and "nothing was deleted" in said
    return ok, f"exit {r.returncode}; {'kept' if kept else 'DELETED'}; " + (
        f"unnamed: {unnamed}" if unnamed else "all four named"
    )


@fault("train --resume RUN optim.lr=0.5 after 2 steps at 1e-3 (issue 44)", "step 3 trains at 0.5, as recorded")
def resume_new_lr(tmp: Path) -> tuple[bool, str]:
    run = tmp / "run"
    first = harness("train", "-c", str(sft_recipe(tmp)), "--out", str(run), "trainer.max_steps=2", cwd=tmp)
    if first.returncode != 0:
        return False, f"train exit {first.returncode}: {flat(first.stderr)[-90:]}"
    r = harness("train", "--resume", str(run), "trainer.max_steps=3", "optim.lr=0.5", cwd=tmp)
    lrs = {x["step"]: x.get("lr") for x in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    recorded = json.loads((run / "config.json").read_text())["optim"]["lr"]
    ok = r.returncode == 0 and lrs.get(3) == recorded == 0.5
    return ok, f"resume exit {r.returncode}; config.json lr {recorded}; step 3 trained at {lrs.get(3)}"


@fault(
    "a chain file with a key given twice, an alias bomb, a top-level list (issue 44)",
    "stages run / stages status / train --stages: exit 2 naming the file, no traceback",
)
def chain_yaml(tmp: Path) -> tuple[bool, str]:
    cases = {"twice": "name: x\nname: y\nstages: []\n", "bomb": ALIAS_BOMB, "list": "- a\n- b\n"}
    bad = []
    for name, text in cases.items():
        chain = tmp / f"{name}.yaml"
        chain.write_text(text)
        for command in (["stages", "run"], ["stages", "status"], ["train", "--stages"]):
            r = harness(*command, str(chain), cwd=tmp, timeout=120)
            said = flat(r.stdout + r.stderr)
            if r.returncode != 2 or str(chain) not in said or "Traceback" in said:
                bad.append(f"{name} {' '.join(command)}: exit {r.returncode} {said[-60:]}")
    return not bad, "; ".join(bad) or "9 refusals naming the file, no traceback"


def refused_each(tmp: Path, cases: dict[str, tuple[list[str], str, Path]]) -> tuple[bool, str]:
    """:func:`refused_cleanly` for each case (name -> args, expected text, a folder that must not
    be made); handled when every one is."""
    bad = []
    for name, (args, expect, folder) in cases.items():
        ok, said = refused_cleanly(tmp, args, expect, lambda folder=folder: not folder.exists())
        if not ok:
            bad.append(f"{name}: {said[:90]}")
    return not bad, "; ".join(bad) or f"{len(cases)} refusals naming the key, exit 2, no folder left"


@fault("keys YAML reads as no string (on:, 1:, ~:) in an eval config and a recipe (issue 44)", "named, exit 2")
def yaml_odd_keys(tmp: Path) -> tuple[bool, str]:
    cases = {}
    for i, text in enumerate(("on: 1\n", "judge:\n  1: x\n", "retriever:\n  ~: 1\n")):
        (tmp / f"e{i}.yaml").write_text(text)
        args = [*eval_args(tmp, tmp / "runs", "--retriever", "memory"), "-c", str(tmp / f"e{i}.yaml")]
        cases[f"eval {text.strip()}"] = (args, "YAML reads this key as", tmp / "runs")
    (tmp / "r.yaml").write_text("optim:\n  yes: 1\n")
    args = ["train", "-c", str(sft_recipe(tmp)), "-c", str(tmp / "r.yaml"), "--out", str(tmp / "run")]
    cases["recipe optim.yes"] = (args, "unknown config key true in 'optim'", tmp / "run")
    return refused_each(tmp, cases)


@fault(
    "judge.url: 5, judge.timeout: abc; optim.micro_batch_size=0, retriever.timeout=.inf / .nan (issue 44)",
    "refused naming the key, exit 2, no run folder",
)
def values_checked(tmp: Path) -> tuple[bool, str]:
    def ev(option: str) -> list[str]:
        return [*eval_args(tmp, tmp / "runs", "--retriever", "memory"), "metrics=[em,judge]", option]

    def tr(option: str) -> list[str]:
        return ["train", "-c", str(sft_recipe(tmp)), "--out", str(tmp / "run"), option]

    runs, run = tmp / "runs", tmp / "run"
    finite = "retriever.timeout: expected a finite"
    cases = {
        "judge.url": (ev("judge.url=5"), "judge.url must be an http(s):// endpoint", runs),
        "judge.timeout": (ev("judge.timeout=abc"), "judge.timeout: expected a number", runs),
        "retriever.timeout inf": (ev("retriever.timeout=.inf"), finite, runs),
        "micro_batch_size": (tr("optim.micro_batch_size=0"), "optim.micro_batch_size must be at least 1", run),
        "retriever.timeout nan": (tr("retriever.timeout=.nan"), finite, run),
    }
    return refused_each(tmp, cases)


@fault(
    "train on a disk that fills at 4 more points (the run's records, a checkpoint's files, its state, its "
    "tokenizer; issue 44)",
    "each message names a path, exit 2, no traceback",
)
def train_disk_points(tmp: Path) -> tuple[bool, str]:
    if not namespaces_work():
        return True, "skipped: no unprivileged mount namespaces here (unshare -rm)"
    recipe = sft_recipe(tmp)
    cli = f"{sys.executable} -m cli.main train -c {recipe} trainer.max_steps=2 trainer.save_every=1"
    # tmpfs sizes where the tiny SFT run's disk fills: config.json, a checkpoint's config/tokenizer
    # files, trainer_state.json, the second checkpoint's tokenizer (measured on this recipe)
    sizes = ("8k", "128k", "360k", "520k")
    script = " ; ".join(
        f"mkdir -p {tmp}/d{s} && mount -t tmpfs -o size={s} tmpfs {tmp}/d{s} && {cli} --out {tmp}/d{s}/run; "
        f"echo EXIT $?"
        for s in sizes
    )
    r, codes, wrong = in_mount_namespace(script, 600, [])
    said = [ln for ln in flat(r.stderr).split("error: ")[1:]]
    unnamed = [m[:80] for m in said if str(tmp) not in m.split(";")[0]]
    ok = codes == ["2"] * len(sizes) and not wrong and len(said) == len(sizes) and not unnamed
    return ok, f"exits {codes}; {len(said)} messages" + (f"; unnamed: {unnamed}" if unnamed else ", each naming a path")


# ---- running ----------------------------------------------------------------------------------
def run_one(f: Fault, root: Path) -> Outcome:
    tmp = root / f.check.__name__
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        ok, observed = f.check(tmp)
    except Exception as e:  # a fault that breaks the battery itself is a failure, reported as such
        ok, observed = False, f"battery error: {type(e).__name__}: {e}"
    return Outcome(f.name, f.expected, observed, ok, time.monotonic() - t0)


def run_battery(only: list[str] | None = None, workers: int = 2, keep: Path | None = None) -> list[Outcome]:
    """Run the faults (``only``: names of their check functions) and return their outcomes."""
    chosen = [f for f in FAULTS if not only or f.check.__name__ in only]
    with tempfile.TemporaryDirectory(prefix="harness-faults-") as scratch:
        root = keep or Path(scratch)
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return list(pool.map(lambda f: run_one(f, root), chosen))


def print_table(outcomes: list[Outcome]) -> None:
    """One line per fault: pass/FAIL, seconds, the fault, what was expected and what was observed."""
    for o in outcomes:
        print(
            f"{'pass' if o.ok else 'FAIL'} {o.seconds:4.0f} s  {o.fault}: expected {o.expected}; observed {o.observed}"
        )
