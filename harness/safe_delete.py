"""The one guard every delete goes through: harness removes only what harness wrote.

A folder harness creates for its output (a training run, an eval run, an index, an RFT filter
output, a model export, a checkpoint) carries a marker file, :data:`MARKER`, written when the
folder is created (:func:`claim`) or committed (:func:`mark`, which also lists every file and
folder, at every depth, the folder was committed with). Before anything is removed,
:func:`check_removable` proves it, down the whole tree:

- the folder holds the marker (else harness did not create it: refused);
- the marker's kind is the one the caller expects, when it says one (an index is never cleared
  as a training run);
- every entry, at every depth, is harness's: a path the marker of its folder (or of a folder above
  it) recorded, or a name the caller's layout (a :data:`Layout`: glob pattern -> :data:`FILE`,
  :data:`OPAQUE`, an :data:`Owned` test or a :class:`Folder`) allows there: a file where a file
  is written (an :data:`Owned` one where its test says this output writes it), a folder
  whose own entries are checked the same way (a folder of a kind, such as a checkpoint or a
  model export, needs its own marker of that kind), a temporary of a name the layout allows
  there (``.NAME.tmp`` or ``.NAME.tmp-PID``, :func:`harness.fsutil.tmp_sibling`'s names), and
  the marker and lock files themselves. Anything else (``src/``, a user's notes, a user's
  ``console.log``, a user's file inside ``checkpoints/`` or inside the final model, a user's model
  folder named like harness's but unmarked) is named by its path in the refusal and NOTHING is
  removed. Layouts name only what harness writes: a pattern as wide as ``*.log`` would take a
  user's log for harness's.

Replacing a file is deleting it: a writer that replaces files by name in a folder it shares
with the user (``harness report --out``) proves each with :func:`check_replaceable` against the
files its marker recorded (:func:`record_written`).

:class:`NotOursError` (a ``ValueError``) carries a message that names the folder, what was found
and what to do. Folders written before markers existed are refused too: remove them by hand.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

MARKER = ".harness-owned.json"
LOCK = ".harness.lock"  # harness.runlock's lock file: never removed (another process may hold it)
_ALWAYS = (MARKER, LOCK)

FILE = "file"  # a regular file harness writes (a folder or a link of that name is not harness's)
# What a library harness calls writes, with names harness does not choose (W&B's run folders),
# and harness's own temporaries (a write cut short): removed whole, unlisted.
OPAQUE = "opaque"
# harness.fsutil.tmp_sibling's names (``.NAME.tmp``, ``.NAME.tmp-PID``): a temporary is harness's
# only when NAME is an entry the layout allows in that folder (``.notes.tmp`` is not).
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp(?:-\d+)?$")


# A file harness writes only in some outputs of a kind (an RL run's rollouts.jsonl): the function
# says from the file's path whether this output is one (what the run's recorded config says).
Owned = Callable[[Path], bool]


@dataclass(frozen=True)
class Folder:
    """A folder harness writes: ``entries`` maps glob patterns of the names it may hold to what
    each is (:data:`FILE`, :data:`OPAQUE` or another :class:`Folder`). ``kind``: the kind of the
    marker it carries when harness committed it whole (a checkpoint, a model export); what that
    marker recorded is allowed in it beside ``entries``, and a marker of another kind is not."""

    entries: Mapping[str, Spec] = field(default_factory=dict)
    kind: str | None = None


Spec = str | Folder | Owned
Layout = Mapping[str, Spec]  # the entries of a folder: glob pattern -> what is there


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


def _tree(folder: Path, names: Iterable[str]) -> list[str]:
    """``names`` (entries of ``folder``) and, under each that is a folder, every path below it,
    relative to ``folder`` with ``/`` separators; bookkeeping files are left out."""
    out = []
    for name in names:
        if bookkeeping(name):
            continue
        out.append(name)
        p = folder / name
        if p.is_dir() and not p.is_symlink():
            for root, dirs, files in os.walk(p):
                rel = Path(root).relative_to(folder).as_posix()
                out += [f"{rel}/{n}" for n in (*dirs, *files) if not bookkeeping(n)]
    return out


def mark(folder: str | Path, kind: str, entries: Iterable[str] | None = None) -> None:
    """Write ``folder``'s marker: harness made it, as a ``kind`` output; ``entries``: the names
    it holds now (a folder committed whole, such as an index), which may all be replaced later.
    The marker records every path below those names too, so a file added later, at any depth,
    is not taken for harness's."""
    folder = Path(folder)
    _write_marker(folder, kind, sorted(_tree(folder, entries)) if entries is not None else None)


def _write_marker(folder: Path, kind: str, entries: list[str] | None) -> None:
    record = {"kind": kind, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid(), "entries": entries}
    tmp = folder / f".{MARKER}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / MARKER)


def claim(folder: str | Path, kind: str) -> bool:
    """Create ``folder`` (or take an empty one) as a ``kind`` output and mark it; returns whether
    it is marked as a ``kind`` output now. A non-empty unmarked folder is left unmarked (a run
    written before markers, being resumed): it can be continued but never cleared."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    marker = read_marker(folder)
    if marker is not None:
        return marker.get("kind") == kind
    if not all(bookkeeping(p.name) for p in folder.iterdir()):
        return False
    mark(folder, kind)
    return True


def _describe(names: list[str], folder: Path, limit: int = 8) -> str:
    shown = [n + ("/" if (folder / n).is_dir() and not n.endswith("/") else "") for n in names[:limit]]
    return ", ".join(shown) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _everything(path: Path, rel: str) -> list[str]:
    """Every file below ``path`` (named ``rel``), or ``rel`` itself for a file, a link or an empty
    folder: what a refusal names when a whole entry is not harness's."""
    if path.is_symlink() or not path.is_dir():
        return [rel]
    found = [
        f"{Path(root).relative_to(path).as_posix()}/{n}".removeprefix("./")
        for root, dirs, files in os.walk(path)
        for n in (*files, *(d for d in dirs if os.path.islink(os.path.join(root, d))))
    ]
    return [f"{rel}/{x}" for x in sorted(found)] or [f"{rel}/"]


def _spec_of(name: str, layout: Layout) -> Spec | None:
    """What ``name`` is in a folder of ``layout``: the spec of its first matching pattern, else
    :data:`OPAQUE` for a temporary of a name that matches one, else None (not harness's)."""
    spec = next((spec for pat, spec in layout.items() if fnmatch.fnmatchcase(name, pat)), None)
    if spec is None and (temp := _TEMPORARY.match(name)) is not None and _spec_of(temp["name"], layout) is not None:
        return OPAQUE
    return spec


def _foreign(folder: Path, layout: Layout, recorded: set[str], at: str = "", shown: str = "") -> list[str]:
    """The paths below ``folder`` that neither ``recorded`` (the paths the marker of the marked
    folder ``folder`` is in recorded; ``at``: ``folder``'s path relative to that one) nor
    ``layout`` prove harness's, each named as ``shown`` + its path below ``folder``."""
    found: list[str] = []
    for p in sorted(folder.iterdir()):
        if bookkeeping(p.name):
            continue
        name = f"{shown}{p.name}"
        real_dir = p.is_dir() and not p.is_symlink()
        if f"{at}{p.name}" in recorded:
            if real_dir:
                found += _foreign(p, {}, recorded, f"{at}{p.name}/", f"{name}/")
            continue
        spec = _spec_of(p.name, layout)
        is_file = p.is_file() and not p.is_symlink()
        if spec == OPAQUE or (spec == FILE and is_file) or (callable(spec) and is_file and spec(p)):
            continue
        if isinstance(spec, Folder) and real_dir:
            marker = read_marker(p)
            if spec.kind is not None and marker is None:  # harness commits such a folder with its marker
                found += [f"{x} (no harness marker in {name}/)" for x in _everything(p, name)]
            elif marker is not None and spec.kind is not None and marker.get("kind") != spec.kind:
                found.append(f"{name}/ (a harness {marker.get('kind')!r} output where a {spec.kind!r} one belongs)")
            else:  # a folder committed whole (a checkpoint) is proven by what its own marker recorded
                inner = set(marker.get("entries") or []) if marker is not None else set()
                found += _foreign(p, spec.entries, inner, "", f"{name}/")
            continue
        found += _everything(p, name)
    return found


def check_removable(
    folder: str | Path, known: Layout | Folder = Folder(), kind: str | None = None, why: str = ""
) -> list[Path]:
    """The entries of ``folder`` that may be removed (every one but the marker and lock files),
    after proving harness wrote them all, at every depth; raises :class:`NotOursError` naming, by
    path, everything it cannot prove (before anything is removed).

    ``known``: the layout of a ``kind`` output (the entries it may hold, see :class:`Folder`);
    ``why``: the command that wants to delete (for the message). A missing folder yields nothing.
    """
    folder = Path(folder)
    what = f"{why}: " if why else ""
    layout = known.entries if isinstance(known, Folder) else known
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
    foreign = _foreign(folder, layout, set(marker.get("entries") or []))
    if foreign:
        raise NotOursError(
            f"{what}{folder} holds {_describe(foreign, folder)}, which harness did not write there; nothing was "
            "deleted. Move those elsewhere (or pick another output folder) and run again"
        )
    return [folder / n for n in names if n not in _ALWAYS]


def clear(folder: str | Path, known: Layout | Folder = Folder(), kind: str | None = None, why: str = "") -> list[str]:
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


def remove(folder: str | Path, known: Layout | Folder = Folder(), kind: str | None = None, why: str = "") -> bool:
    """Remove ``folder`` itself once every entry is proven ours (see :func:`check_removable`); an
    empty folder goes without a marker. Returns whether there was something to remove."""
    folder = Path(folder)
    if not folder.exists():
        return False
    check_removable(folder, known, kind, why)
    shutil.rmtree(folder)
    return True


def check_replaceable(folder: str | Path, names: Iterable[str], kind: str, why: str = "") -> None:
    """Writing the files ``names`` (paths relative to ``folder``) replaces those that exist, which
    is deleting them: each that exists must be one harness wrote there, as a ``kind`` output
    (recorded in ``folder``'s marker by :func:`record_written`). Raises :class:`NotOursError`
    naming every other one (a hand-written ``leaderboard.md``), before anything is written. Files
    of ``folder`` that ``names`` does not name are never touched, so need no proof."""
    folder = Path(folder)
    what = f"{why}: " if why else ""
    marker = read_marker(folder) if folder.is_dir() else None
    if marker is not None and marker.get("kind") != kind:
        raise NotOursError(
            f"{what}{folder} is a harness {marker.get('kind')!r} output, not a {kind!r} one; nothing was written. "
            "Pick another output folder"
        )
    recorded = set(marker.get("entries") or []) if marker is not None else set()
    taken = [n for n in names if ((folder / n).exists() or (folder / n).is_symlink()) and n not in recorded]
    if taken:
        raise NotOursError(
            f"{what}{folder} holds {_describe(taken, folder)}, which harness did not write there; nothing was "
            "written. Move those elsewhere (or pick another output folder) and run again"
        )


def record_written(folder: str | Path, kind: str, names: Iterable[str]) -> None:
    """Add the files ``names`` (paths relative to ``folder``, with the folders they are in) to the
    entries of ``folder``'s marker, as a ``kind`` output (a marker is written when there is none):
    a later :func:`check_replaceable` may replace them, and nothing else there."""
    folder = Path(folder)
    marker = read_marker(folder)
    entries = set(marker.get("entries") or []) if marker is not None else set()
    for name in names:
        parts = Path(name).parts
        entries.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    _write_marker(folder, kind, sorted(e for e in entries if (folder / e).exists()))


def move_aside(path: str | Path, dest: str | Path) -> Path:
    """Move ``path`` (a file or folder) to ``dest`` instead of deleting it; returns ``dest``.
    Nothing is removed, so nothing needs proving; an existing ``dest`` is never replaced."""
    path, dest = Path(path), Path(dest)
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(f"cannot move {path} aside: {dest} exists")
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, dest)
    return dest
