"""Building a (cached) retriever from a :class:`~harness.eval_config.RetrieverConfig`.

BM25 and dense indexes over a corpus are built once and cached under
``$HARNESS_CACHE/indexes/<kind>-<model>-<corpus sha>``; ``index`` points at a built index;
``http`` talks to a running server; ``memory`` is the toy in-memory retriever.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from harness.eval_config import RetrieverConfig
from harness.retrieval.base import CachedRetriever

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "harness"))


def ensure_index(corpus: str, kind: str, model: str | None) -> Any:
    from harness.retrieval.index import build_index, load_index
    from harness.runlog import file_hash

    tag = f"{kind}-{(model or 'default').replace('/', '_')}-{file_hash(corpus)[:16]}"
    out = cache_dir() / "indexes" / tag
    if not (out / "manifest.json").exists():
        logger.info("building a %s index over %s into %s (once; cached)", kind, corpus, out)
        build_index(corpus, kind, out, model=model)
    return load_index(out)


def make_retriever(cfg: RetrieverConfig, corpus: str | None = None) -> CachedRetriever:
    """A cached retriever; ``corpus`` is the default corpus when the config names none."""
    if cfg.kind == "http":
        from harness.retrieval.http_client import HTTPRetriever

        if not cfg.url:
            raise ValueError("retriever 'http' needs a URL (--index URL or retriever.url=URL)")
        return CachedRetriever(HTTPRetriever(cfg.url, api=cfg.api))
    if cfg.index:
        from harness.retrieval.index import load_index, read_manifest

        encoder = None
        if cfg.model and read_manifest(cfg.index)["kind"] == "dense":
            # A (re)trained query encoder over the index's fixed document vectors (HARR).
            from harness.retrieval.encoders import Encoder

            encoder = Encoder(cfg.model)
        return CachedRetriever(load_index(cfg.index, encoder=encoder))
    corpus = cfg.corpus or corpus
    if corpus is None:
        raise ValueError("no corpus to search: pass --index DIR (a built index) or retriever.corpus=FILE")
    if cfg.kind == "memory":
        from harness.retrieval.corpus import read_corpus
        from harness.retrieval.memory import InMemoryRetriever

        return CachedRetriever(InMemoryRetriever(read_corpus(corpus), index_id=f"memory:{corpus}"))
    return CachedRetriever(ensure_index(str(corpus), cfg.kind, cfg.model))
