"""The faults a new user met (issue 23): runs over folders harness did not make, two runs at
once, a retriever that dies, kill -9 mid-run, an 80-column table, a stage chain's lost marker and
killed runner, bad values, a missing --data-dir, damaged checkpoints."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

from benchmarks.datasets import demo_path
from programs.faults.battery import fault
from programs.faults.kit import (
    REPO,
    RUN,
    TRAIN_RECIPE,
    N,
    RetrievalServer,
    alive,
    eval_args,
    flat,
    foreign_project,
    harness,
    http,
    lines,
    sft_recipe,
    snapshot,
    spawn,
    wait_for,
)


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
