"""Reading text files line by line with errors that name ``path:line``.

Every loader of user-supplied files (question sets, corpora, prediction files) reads through
:func:`text_lines`, so a file that is not UTF-8 fails with the path, the line and the offending
byte instead of a ``UnicodeDecodeError`` traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def text_lines(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line of a UTF-8 file (1-based, line ends kept).

    A line that is not valid UTF-8 raises ``error`` naming ``path:line``, the column and the
    byte. A UTF-8 byte-order mark at the start of the file is dropped. Lines are split on
    ``\\n`` only, so line numbers are those an editor or ``sed -n Np`` shows.
    """
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(
                    f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                    "re-encode the file as UTF-8"
                ) from None
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            yield lineno, line
