"""Reading FlashRAG-format corpora: one ``{"id", "contents"}`` object a line, with
``contents`` = ``"Title\\ntext"``. Errors name the file and line.

Small corpora are read whole (:func:`read_corpus`, a list of :class:`Doc`). Large ones (wiki-18:
21M passages, 14 GB) are read in place through :class:`MmapCorpus`: a memory map of the JSONL and
an int64 table of row offsets, so row ``i`` (the document of FAISS vector ``i``) is parsed on
demand and the texts are never all in memory.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from harness.textfiles import parse_json_line, read_jsonl
from harness.types import Doc

_NEEDS_CONTENTS = "missing 'contents' string: a corpus line needs 'contents' (or 'title' and 'text')"


class CorpusError(ValueError):
    """A corpus file is malformed; the message names the file and line."""


def iter_corpus(path: str | Path) -> Iterator[Doc]:
    """The documents of a corpus file one at a time, in file order (for streaming index builds).

    Rows may also carry ``title`` and ``text`` instead of ``contents`` (some corpora split them
    already). Blank lines are skipped. Raises :class:`CorpusError` naming ``file:line`` for
    malformed JSON, a missing id or contents, or a duplicate id (ids key results and caches,
    so two documents under one id would silently shadow each other). Holds only the set of ids
    seen so far, never the texts.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: corpus file not found")
    seen: dict[str, int] = {}
    for lineno, d in read_jsonl(path, CorpusError, objects=False):
        if not isinstance(d, dict) or "id" not in d:
            raise CorpusError(f"{path}:{lineno}: expected an object with 'id' and 'contents'")
        contents = d.get("contents")
        if contents is None and "text" in d:  # some corpora split title/text already
            contents = f"{d.get('title', '')}\n{d['text']}"
        if not isinstance(contents, str):
            raise CorpusError(f"{path}:{lineno}: {_NEEDS_CONTENTS}")
        if not isinstance(d["id"], str | int) or isinstance(d["id"], bool) or str(d["id"]) == "":
            raise CorpusError(f"{path}:{lineno}: 'id' must be a non-empty string or integer, got {d['id']!r}")
        doc_id = str(d["id"])
        if doc_id in seen:
            raise CorpusError(f"{path}:{lineno}: duplicate id {doc_id!r} (first on line {seen[doc_id]})")
        seen[doc_id] = lineno
        yield Doc.from_contents(doc_id, contents)


def read_corpus(path: str | Path) -> list[Doc]:
    """All documents of a corpus file, in file order (:func:`iter_corpus`'s rules and errors)."""
    docs = list(iter_corpus(path))
    if not docs:
        raise CorpusError(f"{path}: empty corpus")
    return docs


def _parse_row(path: Path, where: str, line: bytes) -> Doc:
    """One corpus row as a :class:`Doc`, with the same rules (and messages) as :func:`read_corpus`."""
    d = parse_json_line(line, f"{path}:{where}", CorpusError, objects=False)
    if not isinstance(d, dict) or "id" not in d:
        raise CorpusError(f"{path}:{where}: expected an object with 'id' and 'contents'")
    contents = d.get("contents")
    if contents is None and "text" in d:
        contents = f"{d.get('title', '')}\n{d['text']}"
    if not isinstance(contents, str):
        raise CorpusError(f"{path}:{where}: {_NEEDS_CONTENTS}")
    return Doc.from_contents(str(d["id"]), contents)


def scan_offsets(path: str | Path, chunk_bytes: int = 64 << 20) -> tuple[Any, str, int]:
    """Byte offsets of the non-blank lines of a JSONL file, its sha256 and its size, in one pass.

    Returns ``(starts, sha256, size)``: ``starts`` is an int64 array ``[N]`` with the offset of
    each row (blank lines are not rows, as in :func:`read_corpus`). Memory is the array (8 bytes a
    row: 170 MB for wiki-18's 21M passages) plus one chunk; the text is never held.
    """
    path = Path(path)
    h = hashlib.sha256()
    parts: list[Any] = []
    line_start = 0  # offset where the current (unfinished) line began
    pos = 0
    with open(path, "rb") as f, open(path, "rb") as peek:
        while block := f.read(chunk_bytes):
            h.update(block)
            arr = np.frombuffer(block, dtype=np.uint8)
            nl = np.flatnonzero(arr == 10) + pos  # [n] offsets of "\n" in the file
            if len(nl):
                starts = np.concatenate(([line_start], nl[:-1] + 1))  # [n] start of each ended line
                lengths = nl - starts
                # A JSON row is at least ~20 bytes ({"id":1,"contents":""}); only short lines can be
                # blank (empty, "\r", spaces), and only those are looked at one by one.
                keep = lengths >= 16
                for i in np.flatnonzero(~keep):
                    a, b = int(starts[i]), int(nl[i])
                    if a >= pos:
                        line = block[a - pos : b - pos]
                    else:  # begun in the previous chunk
                        peek.seek(a)
                        line = peek.read(b - a)
                    keep[i] = bool(line.strip())
                parts.append(starts[keep])
                line_start = int(nl[-1]) + 1
            pos += len(block)
    if pos > line_start:  # a last line without "\n"
        with open(path, "rb") as f:
            f.seek(line_start)
            if f.read().strip():
                parts.append(np.array([line_start], dtype=np.int64))
    starts = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    return starts, h.hexdigest(), pos


class MmapCorpus:
    """A FlashRAG corpus JSONL read in place: row ``i`` is parsed from a memory map on access.

    Holds only the row offsets (an int64 array, itself memory-mapped when loaded from ``.npy``),
    never the texts: resident memory grows with the rows actually read, not with the corpus. This
    plays the part of FlashRAG's Arrow-backed ``datasets`` corpus, whose row ``i`` is the document
    of FAISS vector ``i``. Supports ``len()``, ``corpus[i]`` (a :class:`Doc`) and iteration.
    """

    def __init__(self, path: str | Path, starts: Any) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CorpusError(f"{self.path}: corpus file not found")
        self.starts = starts  # [N] int64 byte offsets
        self._file = open(self.path, "rb")  # noqa: SIM115 - kept open for the map's lifetime
        size = self.path.stat().st_size
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        if len(starts) and int(starts[-1]) >= size:
            raise CorpusError(f"{self.path}: row offsets point past the end of the file (was it edited?)")

    @classmethod
    def open(cls, path: str | Path, offsets: str | Path | None = None) -> MmapCorpus:
        """Map ``path``; ``offsets`` is a ``.npy`` from :func:`scan_offsets` (scanned now when ``None``)."""
        if offsets is not None and Path(offsets).is_file():
            starts = np.load(offsets, mmap_mode="r", allow_pickle=False)
        else:
            starts, _, _ = scan_offsets(path)
        return cls(path, starts)

    def __len__(self) -> int:
        return len(self.starts)

    def raw(self, i: int) -> bytes:
        """The JSON bytes of row ``i`` (without the newline)."""
        if not 0 <= i < len(self.starts):
            raise IndexError(f"row {i} out of range for a corpus of {len(self.starts)} rows")
        start = int(self.starts[i])
        end = self._mm.find(b"\n", start)
        return self._mm[start : end if end >= 0 else len(self._mm)]

    def __getitem__(self, i: int) -> Doc:
        return _parse_row(self.path, f"row {i}", self.raw(int(i)))

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def check_sample(self, n: int = 1000) -> None:
        """Parse the first, last and ``n`` evenly spaced rows; :class:`CorpusError` names a bad one."""
        if not len(self):
            raise CorpusError(f"{self.path}: empty corpus")
        step = max(len(self) // n, 1)
        for i in sorted({0, len(self) - 1, *range(0, len(self), step)}):
            self[i]

    def close(self) -> None:
        if not isinstance(self._mm, bytes):
            self._mm.close()
        self._file.close()


def byte_ranges(path: str | Path, parts: int) -> list[tuple[int, int]]:
    """``parts`` consecutive ``[start, end)`` byte ranges covering ``path``, for parallel scans.

    A row belongs to the range its first byte falls in (:func:`iter_range`), so the ranges need
    not fall on line boundaries and every row is read exactly once across them.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    size = Path(path).stat().st_size
    cuts = [size * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a] or [(0, size)]


def iter_range(path: str | Path, start: int = 0, end: int | None = None) -> Iterator[tuple[int, str]]:
    """``(byte offset, contents)`` of every row whose line starts in ``[start, end)``, streamed.

    Memory is one line at a time, whatever the size of the corpus (wiki-18: 21M rows, 14 GB).
    Rows follow :func:`iter_corpus`'s format rules; a malformed row raises :class:`CorpusError`
    naming the file and the row's byte offset (line numbers are unknown inside a range). Ids are
    not checked for duplicates here: that would hold every id (the index build checks them).
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: corpus file not found")
    end = path.stat().st_size if end is None else end
    with open(path, "rb") as f:
        pos = start
        if start > 0:  # the row under `start` began in the previous range: skip to the next line
            f.seek(start - 1)
            pos = start - 1 + len(f.readline())
        while pos < end:
            line = f.readline()
            if not line:
                break
            if line.strip():
                yield pos, _parse_row(path, f"byte {pos}", line).contents
            pos += len(line)
