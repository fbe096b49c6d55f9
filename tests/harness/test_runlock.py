"""One writer per run directory (issue 23, defect 4): the same ``harness eval`` or ``harness train``
started twice at once ran every item twice; now the second writer is refused at once, naming
the holder's pid, and the lock goes with its holder however it exits (kill -9 included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from harness.runlock import RunLockedError, run_lock

runner = CliRunner()

HOLDER = """
import sys, time
from harness.runlock import run_lock
with run_lock(sys.argv[1], "eval"):
    print("locked", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def holder():
    """Start a second process that holds the lock of a folder; yields (start(folder) -> pid)."""
    procs: list[subprocess.Popen] = []

    def start(folder: Path) -> subprocess.Popen:
        p = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True, env={**os.environ}
        )
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "locked"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_a_second_lock_attempt_names_the_holder_and_the_lock_goes_with_it(tmp_path, holder):
    p = holder(tmp_path / "run")
    with pytest.raises(
        RunLockedError, match=rf"{tmp_path / 'run'} is in use: another harness run writes it \(pid {p.pid} "
    ):
        with run_lock(tmp_path / "run", "run"):
            pass
    p.terminate()
    p.wait()
    with run_lock(tmp_path / "run", "eval"):  # released with its holder
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path, holder):
    p = holder(tmp_path / "run")
    with pytest.raises(RunLockedError, match=f"pid {p.pid}"):
        with run_lock(tmp_path / "run"):
            pass
    p.send_signal(signal.SIGKILL)
    p.wait()
    with run_lock(tmp_path / "run"):  # the kernel dropped the lock with its holder
        pass


def test_the_lock_file_names_the_command_the_cli_recorded(tmp_path, monkeypatch):
    import harness.runlock as runlock
    from harness.safe_delete import LOCK

    monkeypatch.setattr(runlock, "_COMMAND", None)
    with run_lock(tmp_path / "a"):
        pass
    assert "command" not in json.loads((tmp_path / "a" / LOCK).read_text())  # the library reads no argv
    runlock.set_command("harness eval --limit 2")
    with run_lock(tmp_path / "b"):
        pass
    assert json.loads((tmp_path / "b" / LOCK).read_text())["command"] == "harness eval --limit 2"


@pytest.mark.slow
def test_eval_refuses_a_run_directory_another_process_writes(tmp_path, holder):
    from benchmarks.datasets import load_examples
    from tests.harness.test_eval_failures import args, write_script

    script = write_script(tmp_path / "s.jsonl", load_examples("demo"))
    out = tmp_path / "runs"
    run = out / "search_r1-demo-test"

    def eval_args(out: Path) -> list[str]:
        return args(script, out, "--retriever", "memory", "--limit", "4")

    p = holder(run)
    res = runner.invoke(app, eval_args(out))
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "is in use" in text and f"pid {p.pid}" in text
    assert not (run / "trajectories.jsonl").exists()  # nothing was run twice
    p.kill()
    p.wait()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5:  # the kernel releases the lock as the holder is reaped
        res = runner.invoke(app, eval_args(out))
        if "is in use" not in res.output:
            break
    assert res.exit_code == 0, res.output
    n = json.loads((run / "results.json").read_text())["n_total"]
    assert len((run / "trajectories.jsonl").read_text().splitlines()) == n


def test_train_refuses_a_run_folder_another_process_writes(tmp_path, holder):
    from tests.training.rl.test_trainer import recipe

    # A recipe that is valid (the run folder is claimed only then) and quick to build: the tiny model.
    run = tmp_path / "run"
    p = holder(run)
    res = runner.invoke(app, ["train", "-c", str(recipe(tmp_path)), "--out", str(run), "trainer.max_steps=1"])
    text = " ".join(res.output.split())
    assert res.exit_code != 0 and "is in use" in text and f"pid {p.pid}" in text, text
    assert sorted(x.name for x in run.iterdir()) == [".harness.lock"]  # nothing written beside the lock
