"""The retriever registry: every ``retriever.kind`` and how it builds itself from its config.

Each registered target is called as ``target(cfg, corpus)`` with a
:class:`~harness.eval_config.RetrieverConfig` and the dataset's default corpus (used when the
config names neither an index nor a corpus), and returns a retriever. :func:`build_retriever`
wraps it in the query cache.

BM25 and dense indexes over a corpus are built once and cached under
``$HARNESS_CACHE/indexes/<kind>-<model>-<corpus sha>``; ``index`` points at a built index;
``http`` talks to a running server; ``memory`` is the toy in-memory retriever; ``harr`` is a
trained HARR query tower searching greedily with the history-aware state (``retriever.encoder``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.registry import Registry
from harness.retrieval.base import CachedRetriever
from harness.retrieval.encoders import Encoder, read_sidecar
from harness.retrieval.index import build_index, load_index, read_manifest
from harness.retrieval.state import accepts_state
from harness.runlog import file_hash

logger = logging.getLogger(__name__)

RETRIEVERS: Registry = Registry("retriever")


def cache_dir() -> Path:
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "harness"))


def ensure_index(corpus: str, kind: str, model: str | None, **load: Any) -> Any:
    """The cached index of ``kind`` over ``corpus``, built on first use."""
    tag = f"{kind}-{(model or 'default').replace('/', '_')}-{file_hash(corpus)[:16]}"
    out = cache_dir() / "indexes" / tag
    if not (out / "manifest.json").exists():
        logger.info("building a %s index over %s into %s (once; cached)", kind, corpus, out)
        build_index(corpus, kind, out, model=model)
    return load_index(out, **load)


def index_from_config(cfg: Any, corpus: str | None = None, encoder: Any = None) -> Any:
    """``bm25`` / ``dense``: a built index (``cfg.index``), or one built (once) over the corpus.

    ``cfg.encoder`` (dense): a trained query encoder (a model dir or LoRA adapter dir, with its
    sidecar) searching the index's fixed document vectors (HARR); ``encoder`` passes a loaded one.
    """
    placement = {"gpu": cfg.faiss_gpu, "shard": cfg.faiss_shard}
    query_encoder = getattr(cfg, "encoder", None)
    if query_encoder and cfg.kind == "bm25":
        raise ValueError("retriever.encoder (--encoder) is a dense query encoder; bm25 has none")
    if encoder is None and query_encoder:
        encoder = Encoder(query_encoder)
    if cfg.index:
        if encoder is None and cfg.model and read_manifest(cfg.index)["kind"] == "dense":
            # A (re)trained query encoder over the index's fixed document vectors (HARR).
            encoder = Encoder(cfg.model)
        r = load_index(cfg.index, encoder=encoder, **placement)
    else:
        corpus = cfg.corpus or corpus
        if corpus is None:
            raise ValueError("no corpus to search: pass --index DIR (a built index) or retriever.corpus=FILE")
        # cfg.model encodes the documents; a trained query encoder only replaces the query side.
        r = ensure_index(str(corpus), cfg.kind, cfg.model, **placement, **({"encoder": encoder} if encoder else {}))
    if query_encoder:
        r.index_id = f"{r.index_id}+q:{query_encoder}"  # results (and caches) differ per query encoder
    return r


def harr_from_config(cfg: Any, corpus: str | None = None) -> Any:
    """``harr``: the trained query tower (``cfg.encoder``, else ``cfg.model``) as a greedy (top-k)
    :class:`~harness.retrieval.stochastic.StochasticDenseRetriever`, rendering the history-aware
    state in the format its sidecar records (the one it was trained with). The agent loop passes
    that state; FlashRAG baselines call ``search(queries, k)`` and so search with the bare query."""
    # deferred: harness.retrieval.stochastic imports torch (~1.4 s)
    from harness.retrieval.stochastic import QueryTower, StochasticDenseRetriever, state_format_of

    if cfg.faiss_gpu:
        raise ValueError("retriever 'harr' searches on the CPU (faiss_gpu is not supported for it)")
    path = getattr(cfg, "encoder", None) or cfg.model
    tower = QueryTower(path)
    index = index_from_config(replace(cfg, kind="dense", encoder=None), corpus, encoder=tower)
    side = (read_sidecar(path) if path and Path(path).is_dir() else None) or {}
    r = StochasticDenseRetriever(
        index,
        tower,
        n_candidates=cfg.topk,
        tau=float(side.get("tau", 0.05)),
        greedy=True,
        state_format=state_format_of(path),
    )
    r.index_id = f"{r.index_id}+q:{path}"
    return r


RETRIEVERS.register("bm25", index_from_config, needs_corpus=True)
RETRIEVERS.register("dense", index_from_config, needs_corpus=True)
RETRIEVERS.register("memory", "harness.retrieval.memory:InMemoryRetriever.from_config", needs_corpus=True)
RETRIEVERS.register("harr", harr_from_config, needs_corpus=True)
RETRIEVERS.register("http", "harness.retrieval.http_client:HTTPRetriever.from_config", needs_corpus=False)


def needs_corpus(cfg: Any) -> bool:
    """Whether ``cfg`` searches a corpus it must be given (no index, no corpus of its own)."""
    return bool(RETRIEVERS.info(cfg.kind).get("needs_corpus")) and not cfg.index and not cfg.corpus


def build_retriever(cfg: Any, corpus: str | None = None) -> Any:
    """A cached retriever from a ``RetrieverConfig``; ``corpus`` is the default corpus.

    A history-aware retriever (``search`` takes ``state``, e.g. ``harr``) comes back uncached: its
    results depend on the trajectory, which a (query, k) cache key cannot see.
    """
    inner = RETRIEVERS.get(cfg.kind)(cfg, corpus)
    return inner if accepts_state(inner) else CachedRetriever(inner)
