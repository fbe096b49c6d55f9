"""The retriever registry: every ``retriever.kind`` and how it builds itself from its config.

Each registered target is called as ``target(cfg, corpus)`` with a
:class:`~harness.eval_config.RetrieverConfig` and the dataset's default corpus (used when the
config names neither an index nor a corpus), and returns a retriever. :func:`build_retriever`
wraps it in the query cache.

BM25 and dense indexes over a corpus are built once and cached under
``$HARNESS_CACHE/indexes/<kind>-<model>-<corpus sha>``; ``index`` points at a built index;
``http`` talks to a running server; ``memory`` is the toy in-memory retriever.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from harness.registry import Registry
from harness.retrieval.base import CachedRetriever

logger = logging.getLogger(__name__)

RETRIEVERS: Registry = Registry("retriever")


def cache_dir() -> Path:
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "harness"))


def ensure_index(corpus: str, kind: str, model: str | None, **load: Any) -> Any:
    """The cached index of ``kind`` over ``corpus``, built on first use."""
    from harness.retrieval.index import build_index, load_index
    from harness.runlog import file_hash

    tag = f"{kind}-{(model or 'default').replace('/', '_')}-{file_hash(corpus)[:16]}"
    out = cache_dir() / "indexes" / tag
    if not (out / "manifest.json").exists():
        logger.info("building a %s index over %s into %s (once; cached)", kind, corpus, out)
        build_index(corpus, kind, out, model=model)
    return load_index(out, **load)


def index_from_config(cfg: Any, corpus: str | None = None) -> Any:
    """``bm25`` / ``dense``: a built index (``cfg.index``), or one built (once) over the corpus."""
    from harness.retrieval.index import load_index

    placement = {"gpu": cfg.faiss_gpu, "shard": cfg.faiss_shard}
    if cfg.index:
        from harness.retrieval.index import read_manifest

        encoder = None
        if cfg.model and read_manifest(cfg.index)["kind"] == "dense":
            # A (re)trained query encoder over the index's fixed document vectors (HARR).
            from harness.retrieval.encoders import Encoder

            encoder = Encoder(cfg.model)
        return load_index(cfg.index, encoder=encoder, **placement)
    corpus = cfg.corpus or corpus
    if corpus is None:
        raise ValueError("no corpus to search: pass --index DIR (a built index) or retriever.corpus=FILE")
    return ensure_index(str(corpus), cfg.kind, cfg.model, **placement)


RETRIEVERS.register("bm25", index_from_config, needs_corpus=True)
RETRIEVERS.register("dense", index_from_config, needs_corpus=True)
RETRIEVERS.register("memory", "harness.retrieval.memory:InMemoryRetriever.from_config", needs_corpus=True)
RETRIEVERS.register("http", "harness.retrieval.http_client:HTTPRetriever.from_config", needs_corpus=False)


def needs_corpus(cfg: Any) -> bool:
    """Whether ``cfg`` searches a corpus it must be given (no index, no corpus of its own)."""
    return bool(RETRIEVERS.info(cfg.kind).get("needs_corpus")) and not cfg.index and not cfg.corpus


def build_retriever(cfg: Any, corpus: str | None = None) -> CachedRetriever:
    """A cached retriever from a ``RetrieverConfig``; ``corpus`` is the default corpus."""
    return CachedRetriever(RETRIEVERS.get(cfg.kind)(cfg, corpus))
