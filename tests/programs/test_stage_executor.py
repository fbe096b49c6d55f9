"""The stage executor (:mod:`programs.stages.executor`): SIGTERM to ``harness stages run`` stops
the running stage, and the stage's child process dies with the runner however the runner ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.slow
def test_sigterm_to_the_runner_stops_the_running_stage(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"match": "", "turns": ["<answer>x</answer>"], "delay": 120}) + "\n")
    chain = tmp_path / "chain.yaml"
    chain.write_text(
        f"""
workdir: {tmp_path / "work"}
stages:
  - name: slow
    command: eval
    args: [--method, research, --dataset, demo, --limit, "1", --backend, scripted, --script, "{script}",
           --retriever, memory]
    output: "{{workdir}}/slow"
"""
    )
    runner_proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "stages", "run", str(chain)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    manifest = tmp_path / "work" / "slow" / "research-demo-test" / "manifest.json"
    deadline = time.monotonic() + 120
    while not manifest.exists() and time.monotonic() < deadline:  # the stage is mid-item
        time.sleep(0.5)
    assert manifest.exists(), "the stage never started"
    marker = json.loads((tmp_path / "work" / ".stages" / "slow.json").read_text())
    assert marker["state"] == "running"
    child = [
        int(p)
        for p in subprocess.run(["pgrep", "-P", str(runner_proc.pid)], capture_output=True, text=True).stdout.split()
    ]
    assert child, "no stage process under the runner"
    runner_proc.send_signal(signal.SIGTERM)
    assert runner_proc.wait(timeout=60) != 0
    for pid in child:
        for _ in range(60):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"stage process {pid} outlived the runner")


RUNNER = """
import sys, time
from pathlib import Path
from harness.engines import sigterm_as_exit
import programs.stages.executor as stages
stages.STOP_GRACE_S = 1.0
child = [sys.executable, "-c", (
    "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "  # a child slow to stop
    "open(%r, 'w').write(str(os.getpid())); time.sleep(120)"
) % sys.argv[1]]
with sigterm_as_exit():
    stages.run_child(child, Path(sys.argv[2]))
"""


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_the_stage_child_dies_with_the_runner(tmp_path, how):
    """SIGTERM to the runner stops the child's group (even a child that ignores SIGTERM, after the
    grace period); kill -9 of the runner takes the child with it (parent-death signal)."""
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    runner_proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(pid_file), str(tmp_path / "log")])
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        runner_proc.send_signal(getattr(signal, how))
        runner_proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"the stage child outlived the runner ({how})"
    finally:
        runner_proc.kill()
