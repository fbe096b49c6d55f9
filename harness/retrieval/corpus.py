"""Reading FlashRAG-format corpora: one ``{"id", "contents"}`` object a line, with
``contents`` = ``"Title\\ntext"``. Errors name the file and line."""

from __future__ import annotations

import json
from pathlib import Path

from harness.textfiles import text_lines
from harness.types import Doc


class CorpusError(ValueError):
    """A corpus file is malformed; the message names the file and line."""


def read_corpus(path: str | Path) -> list[Doc]:
    """All documents of a corpus file, in file order.

    Rows may also carry ``title`` and ``text`` instead of ``contents`` (some corpora split them
    already). Blank lines are skipped. Raises :class:`CorpusError` naming ``file:line`` for
    malformed JSON, a missing id or contents, or a duplicate id (ids key results and caches,
    so two documents under one id would silently shadow each other).
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: corpus file not found")
    docs: list[Doc] = []
    seen: dict[str, int] = {}
    for lineno, line in text_lines(path, CorpusError):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{path}:{lineno}: malformed JSON ({e.msg})") from None
        if not isinstance(d, dict) or "id" not in d:
            raise CorpusError(f"{path}:{lineno}: expected an object with 'id' and 'contents'")
        contents = d.get("contents")
        if contents is None and "text" in d:  # some corpora split title/text already
            contents = f"{d.get('title', '')}\n{d['text']}"
        if not isinstance(contents, str):
            raise CorpusError(f"{path}:{lineno}: missing 'contents' string")
        if not isinstance(d["id"], str | int) or isinstance(d["id"], bool) or str(d["id"]) == "":
            raise CorpusError(f"{path}:{lineno}: 'id' must be a non-empty string or integer, got {d['id']!r}")
        doc_id = str(d["id"])
        if doc_id in seen:
            raise CorpusError(f"{path}:{lineno}: duplicate id {doc_id!r} (first on line {seen[doc_id]})")
        seen[doc_id] = lineno
        docs.append(Doc.from_contents(doc_id, contents))
    if not docs:
        raise CorpusError(f"{path}: empty corpus")
    return docs
