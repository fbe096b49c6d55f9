"""Two CPU ranks on this machine: the environment and the launch the multi-rank tests share.

A test starts ``python -m torch.distributed.run`` (or another launcher) with two processes on a
free loopback port; DeepSpeed runs on its CPU accelerator and each rank on one thread, and none of
the pytest process's own rank variables leak into the children.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.ports import child_env, free_port

REPO = Path(__file__).resolve().parents[2]


def two_rank_env() -> dict[str, str]:
    """This process's environment without its rank variables, for CPU ranks that import the repo."""
    env = child_env()
    env.update(DS_ACCELERATOR="cpu", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return env


def launch(launcher: list[str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python LAUNCHER --master_addr 127.0.0.1 --master_port PORT ARGS`` (a free ``PORT``)
    from the repository with :func:`two_rank_env`, output captured."""
    cmd = [sys.executable, *launcher, "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]
    return subprocess.run(cmd, env=two_rank_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)


def torchrun(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``torch.distributed.run`` with two processes on this machine: ``args`` are the script (or
    ``-m module``) and its arguments."""
    return launch(["-m", "torch.distributed.run", "--nproc_per_node", "2"], *args, timeout=timeout)
