"""BM25 over bm25s (numba backend), with one tokenizer for documents and queries.

FlashRAG's bm25s path stems and drops stopwords when indexing but not when querying, so plain
queries often match nothing (REFERENCE §5). Here :func:`tokenize` is the single function used
on both sides: lower-case, English stopwords removed, Snowball (PyStemmer) stemming.

Indexes are saved with bm25s's own numpy format (``allow_pickle=False`` on save and load).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import Stemmer

from harness.retrieval.base import RetrievalError
from harness.types import Doc

logger = logging.getLogger(__name__)

TOKENIZER_SETTINGS = {"lower": True, "stopwords": "en", "stemmer": "english (PyStemmer)"}


_local = threading.local()


def _stemmer() -> Any:
    # One Snowball stemmer per thread: PyStemmer objects keep a cache and are not documented as
    # thread-safe, and the server tokenizes queries on several worker threads at once.
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = Stemmer.Stemmer("english")
    return stemmer


def tokenize(texts: list[str]) -> list[list[str]]:
    """The one tokenization used at index and at query time (:data:`TOKENIZER_SETTINGS`)."""
    # deferred: bm25s costs ~0.4 s at import
    import bm25s

    return bm25s.tokenize(texts, lower=True, stopwords="en", stemmer=_stemmer(), return_ids=False, show_progress=False)


def build_bm25(docs: list[Doc], out_dir: Path) -> None:
    """Index title + text of ``docs`` into ``out_dir/bm25`` (bm25s' numpy files, no pickle)."""
    # deferred: bm25s costs ~0.4 s at import
    import bm25s

    retriever = bm25s.BM25(backend="numba")
    retriever.index(tokenize([f"{d.title}\n{d.text}" for d in docs]), show_progress=False)
    retriever.save(str(out_dir / "bm25"), allow_pickle=False)


class BM25Retriever:
    """Searches a saved bm25s index; returns :class:`Doc` s from the corpus it was built on."""

    def __init__(self, index_dir: str | Path, docs: list[Doc], index_id: str) -> None:
        # deferred: bm25s costs ~0.4 s at import
        import bm25s

        self.index_id = index_id
        self.docs = docs
        path = Path(index_dir) / "bm25"
        try:
            self._bm25 = bm25s.BM25.load(str(path), allow_pickle=False)
        except (OSError, ValueError) as e:
            raise RetrievalError(f"cannot load the BM25 index in {path}: {e}") from e
        n = self._bm25.scores.get("num_docs")
        if n is not None and n != len(docs):
            raise RetrievalError(f"BM25 index {path} holds {n} documents but the corpus has {len(docs)}")
        self._bm25.backend = "numba"  # saved in params.index.json already; set it whatever the file says
        self._lock = threading.Lock()  # bm25s' numba path is not documented as thread-safe

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """Top-``k`` documents per query, best first; documents sharing no term are left out."""
        k = min(k, len(self.docs))
        tokens = tokenize(list(queries))
        out: list[list[Doc]] = [[] for _ in queries]
        todo = [i for i, t in enumerate(tokens) if t]  # a stopword-only query matches nothing
        if not todo or k <= 0:
            return out
        with self._lock:
            idx, scores = self._bm25.retrieve([tokens[i] for i in todo], k=k, show_progress=False, n_threads=1)
        for row, i in enumerate(todo):
            out[i] = [
                Doc(self.docs[j].id, self.docs[j].title, self.docs[j].text, float(s))
                for j, s in zip(idx[row].tolist(), scores[row].tolist(), strict=True)
                if s > 0  # no shared term: not a match, whatever its rank
            ]
        return out
