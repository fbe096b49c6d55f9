"""Dense retrieval on FAISS: inner product over L2-normalised embeddings (= cosine).

``flat`` (exact, the default) or ``hnsw`` (approximate: M=32, efConstruction=200, efSearch=128
or k if larger). On CPU, FAISS runs single-threaded by default: two OpenMP threads are 10-60x
slower for single queries on these 2-core VMs (REFERENCE §6); ``HARNESS_FAISS_THREADS=N`` changes it
(a CPU search of the 21M-vector flat wiki-18 index needs many cores, or the GPU path below).
Documents are encoded as ``"title\\ntext"``.

Builds stream: the corpus is read, encoded and added to the index ``chunk`` documents at a time,
so memory holds the index vectors and one chunk of texts, never all texts plus all embeddings.

GPU search (device code, untested on the CPU machines this was written on): when the installed
faiss has GPU support (``faiss.get_num_gpus() > 0``) and ``gpu`` is not off, a flat index is
copied to the GPU(s) with fp16 storage, as FlashRAG's and Search-R1's ``--faiss_gpu`` do; with
several GPUs ``shard=True`` splits the vectors across them (``index_cpu_to_all_gpus``), else each
GPU holds a full replica. HNSW indexes have no GPU form and stay on the CPU.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.retrieval.base import RetrievalError
from harness.retrieval.encoders import Encoder
from harness.types import Doc

logger = logging.getLogger(__name__)

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 200
HNSW_EF_SEARCH = 128
BUILD_CHUNK = 10_000


def _faiss():
    # deferred: faiss costs ~0.2 s at import
    import faiss

    # One thread by default (the 2-core VMs above); a flat wiki-18 index searched on a big CPU box
    # wants many: HARNESS_FAISS_THREADS=N.
    faiss.omp_set_num_threads(int(os.environ.get("HARNESS_FAISS_THREADS", "1") or 1))
    return faiss


def build_dense(
    docs: Iterable[Doc],
    out_dir: Path,
    encoder: Encoder,
    faiss_kind: str = "flat",
    chunk: int = BUILD_CHUNK,
    on_chunk: Any = None,
) -> int:
    """Encode ``docs`` chunk by chunk into ``out_dir/faiss.index``; returns the vector dimension.

    ``docs`` may be a lazy iterator (:func:`~harness.retrieval.corpus.iter_corpus`): only ``chunk``
    texts are held at a time. ``on_chunk(list[Doc])`` is called after each chunk is added (the index
    builder writes its document copy there).
    """
    if faiss_kind not in ("flat", "hnsw"):  # checked before the (slow) encoding
        raise ValueError(f"unknown faiss index kind {faiss_kind!r}; use flat or hnsw")
    faiss = _faiss()
    if faiss_kind == "flat":
        index = faiss.IndexFlatIP(encoder.dim)
    else:
        index = faiss.IndexHNSWFlat(encoder.dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    batch: list[Doc] = []

    def flush() -> None:
        vecs = encoder.encode([f"{d.title}\n{d.text}" for d in batch], kind="passage")  # [B, dim]
        index.add(vecs)
        if on_chunk is not None:
            on_chunk(batch)
        logger.info("indexed %d documents", index.ntotal)
        batch.clear()

    for d in docs:
        batch.append(d)
        if len(batch) >= chunk:
            flush()
    if batch:
        flush()
    faiss.write_index(index, str(out_dir / "faiss.index"))
    return encoder.dim


def _want_gpu(gpu: bool | None) -> bool:
    """GPU search when asked, or by default when faiss sees a GPU (``HARNESS_FAISS_GPU=0`` turns it off)."""
    if gpu is None:
        env = os.environ.get("HARNESS_FAISS_GPU", "").lower()
        gpu = None if env in ("", "auto") else env in ("1", "true", "yes", "on")
    faiss = _faiss()
    n = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if gpu and n == 0:
        raise RetrievalError("GPU search was asked for, but this faiss has no GPU support or sees no GPU")
    return n > 0 if gpu is None else gpu


def to_gpu(index: Any, shard: bool = True) -> Any:
    """``index`` copied to all visible GPUs with fp16 vectors; sharded across them when ``shard``.

    Device code: not run on the CPU machines where it was written (no faiss-gpu there).
    """
    faiss = _faiss()
    co = faiss.GpuMultipleClonerOptions()
    co.useFloat16 = True  # halves GPU memory (wiki-18 e5: 65 GB of fp32 vectors -> 32 GB)
    co.shard = shard
    return faiss.index_cpu_to_all_gpus(index, co=co)


class DenseRetriever:
    """Searches a FAISS index with ``encoder``; row ``i`` of ``docs`` is the document of vector ``i``.

    ``index_path`` is an index directory (its ``faiss.index``) or a FAISS file (an imported
    FlashRAG/Search-R1 ``e5_Flat.index``). ``docs`` is any sequence of :class:`Doc`: a list, or a
    :class:`~harness.retrieval.corpus.MmapCorpus` for corpora too big for memory. ``gpu``:
    ``None`` = use GPUs when faiss has them, ``True``/``False`` = force; ``shard`` splits a flat
    index across GPUs instead of replicating it.
    """

    def __init__(
        self,
        index_path: str | Path,
        docs: Sequence[Doc],
        encoder: Encoder,
        index_id: str,
        gpu: bool | None = None,
        shard: bool = True,
    ) -> None:
        faiss = _faiss()
        path = Path(index_path)
        if path.is_dir():
            path = path / "faiss.index"
        try:
            self.index = faiss.read_index(str(path))
        except RuntimeError as e:  # FAISS reports a missing or corrupt file as RuntimeError
            raise RetrievalError(f"cannot read the FAISS index {path}: {e}") from e
        if self.index.d != encoder.dim:
            raise RetrievalError(
                f"index {path} has dimension {self.index.d} but encoder {encoder.spec.name!r} gives {encoder.dim}"
            )
        if self.index.ntotal != len(docs):
            raise RetrievalError(f"FAISS index {path} holds {self.index.ntotal} vectors but the corpus has {len(docs)}")
        self.on_gpu = False
        if hasattr(self.index, "hnsw"):
            self.index.hnsw.efSearch = HNSW_EF_SEARCH
        elif _want_gpu(gpu):
            self.index = to_gpu(self.index, shard=shard)
            self.on_gpu = True
            logger.info("FAISS index %s on %d GPU(s)%s", path, faiss.get_num_gpus(), " (sharded)" if shard else "")
        self.docs, self.encoder, self.index_id = docs, encoder, index_id
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """Top-``k`` documents per query by cosine similarity, best first."""
        k = min(k, len(self.docs))
        if not queries or k <= 0:
            return [[] for _ in queries]
        with self._lock:
            if hasattr(self.index, "hnsw") and self.index.hnsw.efSearch < k:
                self.index.hnsw.efSearch = k  # HNSW returns at most efSearch candidates
            vecs = self.encoder.encode(list(queries), kind="query")  # [Q, dim]
            scores, idx = self.index.search(vecs, k)  # [Q, k] each
        out: list[list[Doc]] = []
        for ri, rs in zip(idx.tolist(), scores.tolist(), strict=True):
            row = []
            for j, s in zip(ri, rs, strict=True):
                if j >= 0:
                    d = self.docs[j]  # parsed once (an MmapCorpus parses on every access)
                    row.append(Doc(d.id, d.title, d.text, float(s)))
            out.append(row)
        return out
