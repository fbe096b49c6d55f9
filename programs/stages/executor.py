"""Run a chain's stage as a child ``harness`` process: the executor :func:`training.stages.run_chain`
is handed by ``harness stages run`` (and ``harness train --stages``).

Each stage runs as its own ``python -m cli.main`` process, so one stage's memory (a model, an
engine) is gone before the next starts. The child runs in its own process group and dies with the
runner: SIGTERM / Ctrl-C to the runner stops the group (SIGTERM, then SIGKILL after
:data:`STOP_GRACE_S`), and Linux SIGKILLs the child if the runner itself is killed outright
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.engines import _die_with_parent

STOP_GRACE_S = 5.0  # SIGTERM to SIGKILL, when the runner stops a stage's process group


def subprocess_executor(argv: list[str], log_path: Path) -> int:
    """Run ``harness ARGV`` in a child Python (see :func:`run_child`)."""
    return run_child([sys.executable, "-m", "cli.main", *argv], log_path)


def run_child(cmd: list[str], log_path: Path) -> int:
    """Run ``cmd`` streaming its output to stderr and ``log_path``; returns its exit status.

    The child leads its own process group (its own children, an engine's workers, are in it) and
    dies with the runner: when the runner is interrupted (Ctrl-C, or SIGTERM under
    ``harness.engines.sigterm_as_exit``) the whole group gets SIGTERM, then SIGKILL after
    :data:`STOP_GRACE_S`; when the runner dies outright (kill -9), Linux SIGKILLs the child."""

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # own process group: stopping it stops the child's children too
            # only a prctl before exec: the child is SIGKILLed if the runner dies first
            preexec_fn=functools.partial(_die_with_parent, signal.SIGKILL, os.getpid()),
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stderr.write(line)
                log.write(line)
            return proc.wait()
        except BaseException:  # Ctrl-C / SIGTERM: the child's group goes with us
            _stop_group(proc)
            raise


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, SIGKILL it after :data:`STOP_GRACE_S`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=STOP_GRACE_S)
            if sig == signal.SIGTERM:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the group's other members, if any lingered
            return
        except subprocess.TimeoutExpired:
            continue
