"""Reading text and JSONL files line by line with errors that name ``path:line``.

Every loader of user-supplied files (question sets, corpora, prediction files) reads through
:func:`text_lines`, so a file that is not UTF-8 fails with the path, the line and the offending
byte instead of a ``UnicodeDecodeError`` traceback. Every JSONL file (user input and the
harness's own logs alike) is read by :func:`read_jsonl`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def text_lines(path: str | Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line of a UTF-8 file (1-based, line ends kept).

    A line that is not valid UTF-8 raises ``error`` naming ``path:line``, the column and the
    byte. A UTF-8 byte-order mark at the start of the file is dropped. Lines are split on
    ``\\n`` only, so line numbers are those an editor or ``sed -n Np`` shows.
    """
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            yield lineno, _decode(raw, lineno, path, error)


def _decode(raw: bytes, lineno: int, path: str | Path, error: type[Exception]) -> str:
    """One line as text (a UTF-8 byte-order mark opening the file dropped); ``error`` naming
    ``path:line``, the column and the byte when it is not UTF-8."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(
            f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
            "re-encode the file as UTF-8"
        ) from None
    return line[1:] if lineno == 1 and line.startswith("\ufeff") else line


def parse_json_line(line: str | bytes, where: str, error: type[Exception] = ValueError, objects: bool = True) -> Any:
    """One JSONL record; ``error`` naming ``where`` (``path:line``) when the line is not JSON or,
    with ``objects``, not a JSON object. The one parse behind :func:`read_jsonl`, for callers that
    read single rows themselves (by byte offset) or rewrite files line by line."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{where}: malformed JSON ({getattr(e, 'msg', None) or e})") from None
    if objects and not isinstance(record, dict):
        raise error(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


def read_jsonl(
    path: str | Path, error: type[Exception] = ValueError, tolerant: bool = False, objects: bool = True
) -> Iterator[tuple[int, Any]]:
    """``(line number, record)`` of each non-blank line of a JSONL file: the project's one reader.

    Lines are read as :func:`text_lines` reads them (UTF-8, errors name ``path:line``) and parsed
    by :func:`parse_json_line` (``objects``: each record must be a JSON object). Strict by
    default: any bad line raises ``error``. ``tolerant``: a bad LAST line (a write torn by a kill,
    in a file the harness appends to) is skipped with a warning; a bad line before it still raises.
    A missing file raises ``error``.
    """
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: no such file")
    pending: Exception | None = None  # a bad line, raised only if another record follows it
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            bad: Exception | None = None
            try:
                line = _decode(raw, lineno, path, error)
            except error as e:
                line, bad = "?", e
            if not line.strip():
                continue
            if pending is not None:
                raise pending
            if bad is None:
                try:
                    record = parse_json_line(line, f"{path}:{lineno}", error, objects)
                except error as e:
                    bad = e
            if bad is not None:
                if not tolerant:
                    raise bad
                pending = bad
                continue
            yield lineno, record
    if pending is not None:
        logger.warning("%s: dropping a torn last line (interrupted write)", path)
