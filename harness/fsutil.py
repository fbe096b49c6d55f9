"""Atomic writes: a reader (or a resumed run) never sees a half-written file or directory.

Every writer of a model directory, an index, a checkpoint or a JSON record goes through these
helpers: write into a temporary sibling, then rename it into place (``os.replace`` is atomic
within one file system). A committed directory carries harness's marker listing what it was
committed with, and an existing ``out`` is replaced only when :mod:`harness.safe_delete` proves
harness wrote all of it: a folder of the user's that happens to sit at ``out`` is refused.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import safe_delete


def write_error(e: OSError, folder: str | Path, flag: str = "--out") -> str:
    """What went wrong writing under ``folder``, for a person: the path at fault and what to do
    (a file where a folder belongs, a read-only file system, a full disk, no permission)."""
    where = e.filename or folder
    if isinstance(e, NotADirectoryError | FileExistsError):
        path = Path(folder)
        blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), Path(where))
        return f"cannot write to {folder}: {blocking} is a file, not a folder; pick another {flag}"
    if e.errno == errno.EROFS:
        return f"cannot write to {folder}: {where} is on a read-only file system; pick another {flag}"
    if e.errno == errno.ENOSPC:
        return (
            f"the disk is full (writing {where}); what finished is saved: free some space and run the same "
            "command again to resume"
        )
    if e.errno == errno.EACCES:
        return f"cannot write to {folder}: permission denied on {where}; pick another {flag}"
    return f"cannot write to {folder}: {e.strerror or e} ({where})"


def tmp_sibling(out: Path, unique: bool = False) -> Path:
    """The temporary sibling ``out`` is written to. ``unique`` adds the pid (for concurrent
    writers of the same target); leave it off when several processes (ranks) share the folder."""
    suffix = f".tmp-{os.getpid()}" if unique else ".tmp"
    return out.parent / f".{out.name}{suffix}"


def commit_dir(tmp: Path, out: Path, kind: str = "output") -> None:
    """Move a finished temporary directory into place, marked as a harness ``kind`` output with
    the entries it holds; an existing ``out`` is replaced only when it is such an output
    (:class:`~harness.safe_delete.NotOursError` otherwise, before anything is removed)."""
    safe_delete.mark(tmp, kind, entries=[p.name for p in tmp.iterdir()])
    if out.exists() or out.is_symlink():
        safe_delete.remove(out, why=f"replacing {out}")
    os.replace(tmp, out)


@contextlib.contextmanager
def atomic_dir(out: str | Path, unique: bool = False, kind: str = "output") -> Iterator[Path]:
    """Yield an empty temporary directory; when the block succeeds it becomes ``out`` (see
    :func:`commit_dir`: an existing ``out`` harness did not write is refused, not replaced).

    On an exception the temporary directory is removed and ``out`` is left as it was.
    """
    out = Path(out)
    tmp = tmp_sibling(out, unique=unique)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        commit_dir(tmp, out, kind)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a text file through a temporary sibling and a rename."""
    path = Path(path)
    tmp = tmp_sibling(path, unique=True)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON through a temporary sibling and a rename."""
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
