"""One writer per run directory: an exclusive ``flock`` on ``DIR/.harness.lock``.

``harness eval``, ``harness train`` and ``harness stages run`` hold the lock of the folder they
write for as long as they write it; a second process that wants the same folder fails at once
with :class:`RunLockedError`, naming the holder's pid and command (written into the lock file by
the holder; the command is the one the CLI recorded with :func:`set_command`). The kernel drops
the lock when the holder exits, however it exits (kill -9 included), so a stale lock file never
blocks anyone: only a live holder does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from harness.safe_delete import LOCK

_HELD: dict[str, int] = {}  # folders this process holds, and how deep (the lock is re-entrant per process)
_COMMAND: str | None = None  # this process's command line, as the CLI recorded it (None: not recorded)


def set_command(command: str | None) -> None:
    """Record the command line this process runs (the CLI passes ``harness ARGS...``): a lock file
    names it, so that a refused second writer learns what holds the folder. The library never
    reads the process's arguments itself."""
    global _COMMAND
    _COMMAND = command[:300] if command else None


class RunLockedError(RuntimeError):
    """Another live process writes this folder; the message names its pid."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another process"
    cmd = f", running: {info['command']}" if info.get("command") else ""
    return f"pid {info['pid']} (since {info.get('since', '?')}{cmd})"


@contextlib.contextmanager
def run_lock(folder: str | Path, what: str = "run") -> Iterator[Path]:
    """Hold the exclusive lock of ``folder`` (created if needed) within the block; raises
    :class:`RunLockedError` at once when another process holds it. Re-entrant within a process
    (``simple_evaluate`` holds the run from its preflight on; ``evaluate`` inside takes it again)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    key = str(path.resolve())
    if _HELD.get(key):
        _HELD[key] += 1
        try:
            yield path
        finally:
            _HELD[key] -= 1
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLockedError(
                f"{folder} is in use: another harness {what} writes it ({_holder(path)}). Wait for it to finish, "
                "stop it, or pick another output folder"
            ) from None
        info = {"pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if _COMMAND:
            info["command"] = _COMMAND
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        _HELD[key] = 1
        try:
            yield path
        finally:
            del _HELD[key]
    finally:
        os.close(fd)  # releases the lock
