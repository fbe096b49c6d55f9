"""The one guard every delete goes through: harness removes only what harness wrote.

A folder harness creates for its output (a training run, an eval run, an index, an RFT filter
output, a model export, a checkpoint) carries a marker file, :data:`MARKER`, written when the
folder is created (:func:`claim`) or committed (:func:`mark`, which also lists the entries the
folder was committed with). Before anything is removed, :func:`check_removable` proves it:

- the folder holds the marker (else harness did not create it: refused);
- the marker's kind is the one the caller expects, when it says one (an index is never cleared
  as a training run);
- every entry is a name harness writes there: the caller's ``known`` names (glob patterns), the
  names the marker lists, and the marker and lock files themselves. Anything else (``src/``,
  a user's notes) is named in the refusal and NOTHING is removed.

:class:`NotOursError` (a ``ValueError``) carries a message that names the folder, what was found
and what to do. Folders written before markers existed are refused too: remove them by hand.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

MARKER = ".harness-owned.json"
LOCK = ".harness.lock"  # harness.runlock's lock file: never removed (another process may hold it)
_ALWAYS = (MARKER, LOCK)


def bookkeeping(name: str) -> bool:
    """Whether an entry of a folder is harness's own bookkeeping, not output: the marker, a marker
    being written (:func:`mark`'s temporary) or the run lock. Another process may be writing it
    right now (rank 0 claims a run folder while the other ranks check that it is empty)."""
    return name in _ALWAYS or name.startswith(f".{MARKER}.tmp-")


class NotOursError(ValueError):
    """Harness refuses to delete something it cannot prove it wrote; the message says what."""


def read_marker(folder: str | Path) -> dict | None:
    """The marker of ``folder`` (None when there is none or it is unreadable)."""
    try:
        data = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def mark(folder: str | Path, kind: str, entries: Iterable[str] | None = None) -> None:
    """Write ``folder``'s marker: harness made it, as a ``kind`` output; ``entries``: the names
    it holds now (a folder committed whole, such as an index), which may all be replaced later."""
    folder = Path(folder)
    record = {
        "kind": kind,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "pid": os.getpid(),
        "entries": sorted(entries) if entries is not None else None,
    }
    tmp = folder / f".{MARKER}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MARKER)


def claim(folder: str | Path, kind: str) -> bool:
    """Create ``folder`` (or take an empty one) as a ``kind`` output and mark it; returns whether
    it is marked now. A non-empty unmarked folder is left unmarked (a run written before markers,
    being resumed): it can be continued but never cleared."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if read_marker(folder) is not None:
        return True
    if any(p.name not in _ALWAYS for p in folder.iterdir()):
        return False
    mark(folder, kind)
    return True


def _describe(names: list[str], folder: Path, limit: int = 8) -> str:
    shown = [n + ("/" if (folder / n).is_dir() else "") for n in names[:limit]]
    return ", ".join(shown) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def check_removable(
    folder: str | Path, known: Iterable[str] = (), kind: str | None = None, why: str = ""
) -> list[Path]:
    """The entries of ``folder`` that may be removed (every one but the marker and lock files),
    after proving harness wrote them all; raises :class:`NotOursError` naming what is not.

    ``known``: glob patterns of the names a ``kind`` output holds; ``why``: the command that
    wants to delete (for the message). A missing folder yields nothing.
    """
    folder = Path(folder)
    what = f"{why}: " if why else ""
    if not folder.exists() and not folder.is_symlink():
        return []
    if folder.is_symlink() or not folder.is_dir():
        raise NotOursError(f"{what}{folder} is not a folder harness made (a file or a link); not deleting it")
    names = sorted(p.name for p in folder.iterdir())
    if not [n for n in names if n not in _ALWAYS]:
        return []
    marker = read_marker(folder)
    if marker is None:
        raise NotOursError(
            f"{what}{folder} was not created by harness (no {MARKER} in it) and holds {_describe(names, folder)}; "
            "nothing was deleted. Pick another output folder, or move or delete it yourself"
        )
    if kind is not None and marker.get("kind") != kind:
        raise NotOursError(
            f"{what}{folder} is a harness {marker.get('kind')!r} output, not a {kind!r} one; nothing was deleted"
        )
    allowed = [*known, *(marker.get("entries") or []), *_ALWAYS]
    foreign = [n for n in names if not any(fnmatch.fnmatchcase(n, pat) for pat in allowed)]
    if foreign:
        raise NotOursError(
            f"{what}{folder} holds {_describe(foreign, folder)}, which harness did not write there; nothing was "
            "deleted. Move those elsewhere (or pick another output folder) and run again"
        )
    return [folder / n for n in names if n not in _ALWAYS]


def clear(folder: str | Path, known: Iterable[str] = (), kind: str | None = None, why: str = "") -> list[str]:
    """Empty ``folder`` of what harness wrote (see :func:`check_removable`; the marker and the lock
    stay); returns the names removed. Everything is checked before the first removal."""
    doomed = check_removable(folder, known, kind, why)
    for p in doomed:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    if doomed:
        logger.warning("%s: removed %s (written by harness)", folder, ", ".join(p.name for p in doomed))
    return [p.name for p in doomed]


def remove(folder: str | Path, known: Iterable[str] = (), kind: str | None = None, why: str = "") -> bool:
    """Remove ``folder`` itself once every entry is proven ours (see :func:`check_removable`); an
    empty folder goes without a marker. Returns whether there was something to remove."""
    folder = Path(folder)
    if not folder.exists():
        return False
    check_removable(folder, known, kind, why)
    shutil.rmtree(folder)
    return True


def move_aside(path: str | Path, dest: str | Path) -> Path:
    """Move ``path`` (a file or folder) to ``dest`` instead of deleting it; returns ``dest``.
    Nothing is removed, so nothing needs proving; an existing ``dest`` is never replaced."""
    path, dest = Path(path), Path(dest)
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(f"cannot move {path} aside: {dest} exists")
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, dest)
    return dest
