"""Writing a report's files all or none.

Every file is rendered in memory first, then written into a temporary sibling folder of ``out``,
then each is renamed into place (``os.replace``, atomic within one file system). A failure while
rendering or writing leaves ``out`` as it was: no report with only some of its files. Files in
``out`` that the report does not write (a ``demo.md`` beside it) are never touched, and a file it
would replace must be one harness wrote there (the ownership rule of every delete,
:mod:`harness.safe_delete`: ``out``'s marker records the report files it wrote); a hand-written
``leaderboard.md`` is refused by name before anything is written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from harness import safe_delete

REPORT = "report"  # the kind of output a report folder's marker records


def write_all_or_none(out: str | Path, files: dict[str, bytes], why: str = "report --out") -> list[Path]:
    """Write ``files`` (path relative to ``out`` -> content) under ``out``; returns their paths.

    Raises :class:`~harness.safe_delete.NotOursError` (a ``ValueError``) when a file would replace
    one harness did not write (``why``: the command, for the message), or ``OSError`` naming
    ``out`` when a file cannot be written; either way nothing was replaced.
    """
    out = Path(out)
    for rel in files:
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ValueError(f"report file {rel!r} is not a path inside the report folder")
    tmp = None
    try:
        # Checked before anything is written: a rename onto a folder would fail halfway through.
        for rel in files:
            if (out / rel).exists() and not (out / rel).is_file():
                raise IsADirectoryError(f"{out / rel} exists and is not a file")
        safe_delete.check_replaceable(out, files, REPORT, why)
        out.parent.mkdir(parents=True, exist_ok=True)
        # A fresh folder made here (mkdtemp), so the cleanup below removes only what we wrote.
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        for rel, data in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for rel in files:
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / rel, out / rel)
            written.append(out / rel)
        safe_delete.record_written(out, REPORT, files)
        return written
    except OSError as e:
        raise OSError(f"cannot write the report to {out}: {e}") from e
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
