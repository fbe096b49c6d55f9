"""Index directories: build, manifest, load.

An index directory holds the index files (``bm25/`` or ``faiss.index``), a copy of the corpus
as ``docs.jsonl`` (so results come back as documents without the original file), and
``manifest.json``: kind, corpus path and sha256, document count, encoder and dimension,
tokenizer settings, build time, harness version and ``index_id`` (a hash of all that).

Why a copy of the corpus: an index is then self-contained (it can be moved or served from
another machine), and results cannot silently come from an edited corpus file; the original
path and sha256 stay in the manifest as provenance.

Loading checks the manifest: a corpus given at load time must have the recorded hash, a BM25
index must have been built with this tokenizer, and a dense encoder must have the recorded
dimension; otherwise the error names both sides.

Imported indexes (:func:`import_index`, ``harness index import``) are the exception to the copy:
a FlashRAG/Search-R1 FAISS file and its corpus (wiki-18: 60+ GB and 14 GB) stay where they are.
The directory then holds the manifest (``imported``, ``faiss_path``, ``corpus_path``, encoder,
pooling and prefixes) and ``corpus.offsets.npy``, the byte offset of each corpus row. The corpus
is read through a memory map (:class:`~harness.retrieval.corpus.MmapCorpus`), as FlashRAG reads
it through an Arrow memory map, so resident memory is the FAISS index, not the corpus text.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness import __version__, safe_delete
from harness.fsutil import atomic_dir
from harness.retrieval.base import RetrievalError
from harness.retrieval.bm25 import TOKENIZER_SETTINGS, BM25Retriever, build_bm25
from harness.retrieval.corpus import CorpusError, MmapCorpus, iter_corpus, read_corpus, scan_offsets
from harness.retrieval.dense import DenseRetriever, build_dense
from harness.retrieval.encoders import Encoder, resolve_encoder
from harness.types import Doc

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
DOCS = "docs.jsonl"
OFFSETS = "corpus.offsets.npy"
KINDS = ("bm25", "dense")


class IndexLoadError(ValueError):
    """An index directory is missing, incomplete, or does not match what it is loaded with."""


REQUIRED = ("kind", "corpus_sha256", "num_docs", "index_id")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def read_manifest(index_dir: str | Path) -> dict[str, Any]:
    """The manifest of an index directory; :class:`IndexLoadError` if it is missing or malformed."""
    p = Path(index_dir) / MANIFEST
    if not p.is_file():
        raise IndexLoadError(
            f"{index_dir} is not an index directory (no {MANIFEST}); build one with `harness index build`"
        )
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IndexLoadError(f"{p}: malformed manifest ({e})") from None
    missing = [k for k in REQUIRED if not isinstance(m, dict) or k not in m]
    if missing:
        raise IndexLoadError(f"{p}: manifest lacks {', '.join(missing)}; rebuild the index")
    return m


def build_index(
    corpus: str | Path,
    kind: str,
    out_dir: str | Path,
    model: str | None = None,
    faiss_kind: str = "flat",
    encoder: Any = None,
) -> dict[str, Any]:
    """Build an index over a FlashRAG-format corpus into ``out_dir`` and return its manifest.

    ``kind`` is ``bm25`` or ``dense``; for dense, ``model`` names the encoder (default
    all-MiniLM-L6-v2, see :mod:`harness.retrieval.encoders`) or ``encoder`` passes a loaded one,
    and ``faiss_kind`` is ``flat`` (exact) or ``hnsw``. The directory is written under a temporary
    name and renamed at the end, so a crash never leaves a half-built index behind.
    """
    if kind not in KINDS:
        raise IndexLoadError(f"unknown index kind {kind!r}; use one of {', '.join(KINDS)}")
    corpus, out_dir = Path(corpus), Path(out_dir)
    if kind == "dense" and faiss_kind not in ("flat", "hnsw"):  # before any work
        raise ValueError(f"unknown faiss index kind {faiss_kind!r}; use flat or hnsw")
    safe_delete.check_removable(out_dir, why="index build --out")  # a folder not ours: refused before any work
    t0 = time.perf_counter()
    manifest: dict[str, Any] = {
        "kind": kind,
        "corpus_path": str(corpus.resolve()),
        "corpus_sha256": _sha256(corpus),
        "harness_version": __version__,
    }
    with atomic_dir(out_dir, unique=True, kind="index") as tmp:
        with open(tmp / DOCS, "w", encoding="utf-8") as out:

            def write_docs(docs: list[Doc]) -> None:
                for d in docs:
                    out.write(json.dumps({"id": d.id, "contents": d.contents}, ensure_ascii=False) + "\n")

            if kind == "bm25":
                docs = read_corpus(corpus)
                build_bm25(docs, tmp)
                write_docs(docs)
                manifest.update(num_docs=len(docs), model=None, dim=None, tokenizer=TOKENIZER_SETTINGS)
            else:
                # Streamed: the corpus is read, encoded and written chunk by chunk (bounded memory).
                count = [0]

                def on_chunk(docs: list[Doc]) -> None:
                    write_docs(docs)
                    count[0] += len(docs)

                encoder = encoder or Encoder(model)
                manifest["dim"] = build_dense(iter_corpus(corpus), tmp, encoder, faiss_kind, on_chunk=on_chunk)
                if not count[0]:
                    raise CorpusError(f"{corpus}: empty corpus")
                manifest.update(num_docs=count[0], model=encoder.spec.name, faiss=faiss_kind)
                manifest.update(_encoder_fields(encoder.spec))
        manifest["docs_sha256"] = _sha256(tmp / DOCS)  # checked at load: an edited docs.jsonl is refused
        manifest["build_seconds"] = round(time.perf_counter() - t0, 3)
        manifest["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        identity = {k: manifest[k] for k in ("kind", "corpus_sha256", "num_docs") if k in manifest}
        identity.update({k: manifest.get(k) for k in ("model", "faiss", "tokenizer")})
        manifest["index_id"] = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    n, secs = manifest["num_docs"], manifest["build_seconds"]
    logger.info("built %s index over %d docs in %.1f s: %s", kind, n, secs, out_dir)
    return manifest


def _encoder_fields(spec: Any) -> dict[str, Any]:
    """How queries must be encoded to match the index's vectors (recorded so loading reproduces it)."""
    return {"pooling": spec.pooling, "query_prefix": spec.query_prefix, "passage_prefix": spec.passage_prefix}


# FAISS file type codes (the first 4 bytes, faiss/impl/index_write.cpp) of the indexes we load.
FAISS_TYPES = {b"IxFI": "flat", b"IxF2": "flat-l2", b"IHNf": "hnsw", b"IwFl": "ivf-flat", b"IwPQ": "ivf-pq"}
METRIC_INNER_PRODUCT = 0


def faiss_header(path: str | Path) -> dict[str, Any]:
    """Type, dimension, vector count and metric of a FAISS index file, read from its header only.

    A 60 GB flat index need not be loaded to check it against its corpus. Raises
    :class:`IndexLoadError` when the file is not a FAISS index of a known type.
    """
    path = Path(path)
    if not path.is_file():
        raise IndexLoadError(f"{path}: FAISS index file not found")
    with open(path, "rb") as f:
        head = f.read(4 + 33)
    fourcc = head[:4]
    if fourcc not in FAISS_TYPES or len(head) < 37:
        raise IndexLoadError(
            f"{path}: not a FAISS index of a known type (starts with {fourcc!r}; "
            f"known: {', '.join(k.decode() for k in FAISS_TYPES)})"
        )
    d, ntotal, _, _, _, metric = struct.unpack("<iqqq?i", head[4:37])  # faiss write_index_header
    return {"type": FAISS_TYPES[fourcc], "dim": d, "ntotal": ntotal, "metric": metric}


def _fingerprint(path: Path, size: int) -> str:
    """sha256 of the size, first and last MiB: cheap identity of a file too big to hash on every import."""
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(size - (1 << 20), 0))
        h.update(f.read(1 << 20))
    return h.hexdigest()


def import_index(
    faiss_path: str | Path,
    corpus: str | Path,
    out_dir: str | Path,
    model: str,
    pooling: str | None = None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    model_path: str | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """Wrap a FlashRAG/Search-R1 FAISS index and its corpus JSONL in an index directory, in place.

    Nothing large is copied: ``out_dir`` gets the manifest and the corpus row offsets. ``model``
    is the encoder the index was built with (``intfloat/e5-base-v2`` for wiki-18); its pooling and
    prefixes come from :data:`~harness.retrieval.encoders.KNOWN_ENCODERS` unless given. Checks,
    without loading the index: it is an inner-product FAISS index, its vector count equals the
    corpus's row count (row ``i`` is vector ``i``, as in FlashRAG), its dimension matches the
    encoder when the table knows it, and a sample of rows parses. The corpus is read once (row
    offsets and sha256 together); ``source`` records where the files came from.
    """
    faiss_path, corpus, out_dir = Path(faiss_path).resolve(), Path(corpus).resolve(), Path(out_dir)
    safe_delete.check_removable(out_dir, why="index import --out")  # a folder not ours: refused before any work
    head = faiss_header(faiss_path)
    if head["metric"] != METRIC_INNER_PRODUCT:
        raise IndexLoadError(f"{faiss_path}: an L2-distance index; only inner-product indexes (as FlashRAG builds)")
    spec = resolve_encoder(model, pooling, query_prefix, passage_prefix, path=model_path)
    if spec.dim is not None and spec.dim != head["dim"]:
        raise IndexLoadError(f"{faiss_path} holds {head['dim']}-d vectors but {spec.name!r} gives {spec.dim}-d vectors")
    if not corpus.is_file():
        raise IndexLoadError(f"{corpus}: corpus file not found")
    t0 = time.perf_counter()
    logger.info("scanning %s for row offsets (one pass over the file)", corpus)
    starts, sha, size = scan_offsets(corpus)
    if len(starts) != head["ntotal"]:
        raise IndexLoadError(
            f"{faiss_path} holds {head['ntotal']} vectors but {corpus} has {len(starts)} rows; "
            "vector i must be row i of the corpus the index was built on"
        )
    try:
        MmapCorpus(corpus, starts).check_sample()
    except CorpusError as e:
        raise IndexLoadError(str(e)) from e
    with atomic_dir(out_dir, unique=True, kind="index") as tmp:
        np.save(tmp / OFFSETS, starts, allow_pickle=False)
        fsize = faiss_path.stat().st_size
        manifest: dict[str, Any] = {
            "kind": "dense",
            "imported": True,
            "source": source,
            "faiss_path": str(faiss_path),
            "faiss": head["type"],
            "faiss_size": fsize,
            "faiss_fingerprint": _fingerprint(faiss_path, fsize),
            "corpus_path": str(corpus),
            "corpus_sha256": sha,
            "corpus_size": size,
            "num_docs": len(starts),
            "dim": head["dim"],
            "model": spec.name,
            "model_path": model_path,
            **_encoder_fields(spec),
            "harness_version": __version__,
            "build_seconds": round(time.perf_counter() - t0, 3),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        identity = {k: manifest[k] for k in ("kind", "faiss", "faiss_fingerprint", "corpus_sha256", "num_docs")}
        identity.update({k: manifest[k] for k in ("model", "pooling", "query_prefix")})
        manifest["index_id"] = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    logger.info("imported %s (%d vectors) over %s into %s", faiss_path, len(starts), corpus, out_dir)
    return manifest


def load_index(
    index_dir: str | Path,
    corpus: str | Path | None = None,
    encoder: Any = None,
    gpu: bool | None = None,
    shard: bool = True,
) -> Any:
    """A retriever over a built or imported index, checked against ``corpus`` and ``encoder`` when given.

    ``gpu``/``shard`` place a dense flat index on the GPU(s) (see
    :class:`~harness.retrieval.dense.DenseRetriever`; default: when faiss sees a GPU). The
    retriever carries the manifest as ``.manifest`` and its ``index_id``. Raises
    :class:`IndexLoadError` for a missing, incomplete or mismatched index.
    """
    index_dir = Path(index_dir)
    m = read_manifest(index_dir)
    try:
        if m.get("imported"):
            retriever = _load_imported(index_dir, m, corpus, encoder, gpu, shard)
        else:
            retriever = _load(index_dir, m, corpus, encoder, gpu, shard)
    except (RetrievalError, CorpusError) as e:  # the index files themselves are bad
        raise IndexLoadError(str(e)) from e
    retriever.manifest = m
    retriever.index_dir = index_dir  # where results recorded beside the index live (answerability.json)
    return retriever


def corpus_file(index_dir: str | Path) -> Path:
    """The corpus file whose rows an index returns: its ``docs.jsonl`` copy, or the corpus an
    imported index points at (checked against the recorded size). For streaming scans of the
    corpus an index searches (:func:`~harness.retrieval.corpus.iter_range`)."""
    index_dir = Path(index_dir)
    m = read_manifest(index_dir)
    if not m.get("imported"):
        path = index_dir / DOCS
        if not path.is_file():
            raise IndexLoadError(f"index {index_dir} is incomplete: {DOCS} is missing")
        return path
    path = _imported_file(index_dir, m["corpus_path"], "corpus")
    _check_size(index_dir, path, m.get("corpus_size"))
    return path


def _check_size(index_dir: Path, path: Path, recorded: Any) -> None:
    """A cheap check that an imported file is still the one imported: its size."""
    if path.stat().st_size != recorded:
        raise IndexLoadError(f"index {index_dir}: {path} has {path.stat().st_size} bytes, {recorded} when imported")


def _check_corpus(index_dir: Path, m: dict[str, Any], corpus: str | Path | None) -> None:
    if corpus is not None:
        got = _sha256(Path(corpus))
        if got != m["corpus_sha256"]:
            raise IndexLoadError(
                f"index {index_dir} was built on corpus {m['corpus_path']} (sha256 {m['corpus_sha256'][:12]}…) "
                f"but is being loaded with {corpus} (sha256 {got[:12]}…)"
            )


def _dense_encoder(index_dir: Path, m: dict[str, Any], encoder: Any) -> Any:
    """The manifest's encoder (with its recorded pooling and prefixes), or ``encoder`` checked against it."""
    if encoder is None:
        spec = resolve_encoder(
            m.get("model"), m.get("pooling"), m.get("query_prefix"), m.get("passage_prefix"), path=m.get("model_path")
        )
        encoder = Encoder(spec)
    if encoder.dim != m["dim"]:
        raise IndexLoadError(
            f"index {index_dir} holds {m['dim']}-d vectors from {m.get('model')!r}, "
            f"but encoder {encoder.spec.name!r} gives {encoder.dim}-d vectors"
        )
    if encoder.spec.name != m.get("model"):  # same size, maybe another vector space: allowed, but say so
        built, using = m.get("model"), encoder.spec.name
        logger.warning("index %s was built with encoder %r; searching it with %r", index_dir, built, using)
    return encoder


def _imported_file(index_dir: Path, recorded: str, what: str) -> Path:
    """A recorded absolute path, or a file of that name in the index directory (a moved download)."""
    p = Path(recorded)
    if p.is_file():
        return p
    if (index_dir / p.name).is_file():
        return index_dir / p.name
    raise IndexLoadError(f"index {index_dir}: the imported {what} {p} is missing (moved or deleted?); import it again")


def _load_imported(
    index_dir: Path, m: dict[str, Any], corpus: str | Path | None, encoder: Any, gpu: bool | None, shard: bool
) -> Any:
    _check_corpus(index_dir, m, corpus)
    faiss_path = _imported_file(index_dir, m["faiss_path"], "FAISS index")
    corpus_path = _imported_file(index_dir, m["corpus_path"], "corpus")
    for p, key in ((faiss_path, "faiss_size"), (corpus_path, "corpus_size")):
        _check_size(index_dir, p, m.get(key))
    offsets = index_dir / OFFSETS
    if not offsets.is_file():
        raise IndexLoadError(f"index {index_dir} is incomplete: {OFFSETS} is missing")
    docs = MmapCorpus.open(corpus_path, offsets)
    if len(docs) != m["num_docs"]:
        raise IndexLoadError(f"index {index_dir}: {OFFSETS} has {len(docs)} rows, manifest says {m['num_docs']}")
    encoder = _dense_encoder(index_dir, m, encoder)
    return DenseRetriever(faiss_path, docs, encoder, index_id=m["index_id"], gpu=gpu, shard=shard)


def _load(
    index_dir: Path, m: dict[str, Any], corpus: str | Path | None, encoder: Any, gpu: bool | None, shard: bool
) -> Any:
    _check_corpus(index_dir, m, corpus)
    docs_path = index_dir / DOCS
    if not docs_path.is_file():
        raise IndexLoadError(f"index {index_dir} is incomplete: {DOCS} is missing")
    if m.get("docs_sha256") is not None and (got := _sha256(docs_path)) != m["docs_sha256"]:
        # The index's postings or vectors are of the documents it was built on: another text
        # there would be served as if it were what matched (indexes built before this record: unchecked).
        raise IndexLoadError(
            f"index {index_dir}: {DOCS} was changed after the index was built (sha256 {got[:12]}…, "
            f"{m['docs_sha256'][:12]}… when built); rebuild it: harness index build --corpus CORPUS --out {index_dir}"
        )
    docs: list[Doc] = read_corpus(docs_path)
    if len(docs) != m["num_docs"]:
        raise IndexLoadError(f"index {index_dir}: {DOCS} has {len(docs)} documents, manifest says {m['num_docs']}")
    if m["kind"] == "bm25":
        if m.get("tokenizer") != TOKENIZER_SETTINGS:  # query tokens must be made like the index's
            raise IndexLoadError(
                f"index {index_dir} was tokenized with {m.get('tokenizer')}, this harness tokenizes queries "
                f"with {TOKENIZER_SETTINGS}; rebuild the index"
            )
        return BM25Retriever(index_dir, docs, index_id=m["index_id"])
    if m["kind"] == "dense":
        encoder = _dense_encoder(index_dir, m, encoder)
        return DenseRetriever(index_dir, docs, encoder, index_id=m["index_id"], gpu=gpu, shard=shard)
    raise IndexLoadError(f"index {index_dir}: unknown kind {m['kind']!r}")
