"""The known-encoder table (e5, bge, MiniLM), config overrides, and streaming dense builds."""

from __future__ import annotations

import numpy as np
import pytest

from harness.retrieval.dense import build_dense
from harness.retrieval.encoders import BGE_QUERY, KNOWN_ENCODERS, EncoderSpec, resolve_encoder
from harness.types import Doc


@pytest.mark.parametrize(
    "name, hub_id, pooling, query_prefix, passage_prefix, dim",
    [
        ("intfloat/e5-base-v2", "intfloat/e5-base-v2", "mean", "query: ", "passage: ", 768),
        ("e5", "intfloat/e5-base-v2", "mean", "query: ", "passage: ", 768),  # FlashRAG's retrieval_method name
        ("intfloat/e5-large-v2", "intfloat/e5-large-v2", "mean", "query: ", "passage: ", 1024),
        ("BAAI/bge-large-en-v1.5", "BAAI/bge-large-en-v1.5", "cls", BGE_QUERY, "", 1024),
        ("bge", "BAAI/bge-large-en-v1.5", "cls", BGE_QUERY, "", 1024),  # RAG-R1's retriever
        ("BAAI/bge-base-en-v1.5", "BAAI/bge-base-en-v1.5", "cls", BGE_QUERY, "", 768),
        ("minilm", "all-MiniLM-L6-v2", "mean", "", "", 384),
        ("/models/my-e5-finetune", "/models/my-e5-finetune", "mean", "query: ", "passage: ", None),  # by pattern
        ("sentence-transformers/all-mpnet-base-v2", "sentence-transformers/all-mpnet-base-v2", "mean", "", "", None),
    ],
)
def test_known_encoders(name, hub_id, pooling, query_prefix, passage_prefix, dim):
    spec = resolve_encoder(name)
    assert (spec.name, spec.pooling, spec.query_prefix, spec.passage_prefix, spec.dim) == (
        hub_id,
        pooling,
        query_prefix,
        passage_prefix,
        dim,
    )


def test_overrides_win_over_the_table():
    spec = resolve_encoder("intfloat/e5-base-v2", pooling="cls", query_prefix="", path="/local/e5")
    assert (spec.name, spec.path, spec.pooling, spec.query_prefix, spec.passage_prefix) == (
        "intfloat/e5-base-v2",
        "/local/e5",
        "cls",
        "",
        "passage: ",  # not overridden: the table's
    )
    assert KNOWN_ENCODERS["intfloat/e5-base-v2"].pooling == "mean"  # the table itself is untouched
    with pytest.raises(ValueError, match="unknown pooling 'max'"):
        resolve_encoder("e5", pooling="max")


@pytest.mark.slow
def test_pooling_override_changes_vectors_and_spec_objects_load():
    from harness.retrieval.encoders import Encoder

    mean = Encoder("minilm")
    cls = Encoder(resolve_encoder("minilm", pooling="cls"))
    assert mean.device == "cpu" and not mean.fp16  # fp16 only on CUDA (not available on these machines)
    a, b = mean.encode(["a dog runs"]), cls.encode(["a dog runs"])
    assert a.shape == b.shape == (1, 384) and not np.allclose(a, b, atol=1e-3)
    assert np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)


class CountingEncoder:
    """A deterministic 16-d bag-of-characters encoder that records the batch sizes it is given."""

    dim = 16
    spec = EncoderSpec("chars-16", "/nowhere")

    def __init__(self):
        self.batches = []

    def encode(self, texts, kind="passage"):
        self.batches.append(len(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)  # [B, 16]
        for i, t in enumerate(texts):
            for ch in t:
                out[i, ord(ch) % self.dim] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def test_dense_build_streams_in_chunks(tmp_path):
    import faiss

    pulled = []

    def docs():  # a lazy corpus: records how far it has been read
        for i in range(23):
            pulled.append(i)
            yield Doc(str(i), f"title {i}", "text " * (i + 1))

    enc = CountingEncoder()
    seen_at_first_chunk = []

    def on_chunk(batch):
        seen_at_first_chunk.append(len(pulled)) if not seen_at_first_chunk else None
        assert len(batch) <= 5

    (tmp_path / "a").mkdir()
    assert build_dense(docs(), tmp_path / "a", enc, chunk=5, on_chunk=on_chunk) == 16
    assert enc.batches == [5, 5, 5, 5, 3]  # never more than a chunk of texts at once
    assert seen_at_first_chunk == [5]  # the corpus was read only as far as the first chunk
    (tmp_path / "b").mkdir()
    build_dense(list(docs()), tmp_path / "b", CountingEncoder(), chunk=1000)
    a, b = faiss.read_index(str(tmp_path / "a" / "faiss.index")), faiss.read_index(str(tmp_path / "b" / "faiss.index"))
    assert a.ntotal == b.ntotal == 23
    assert np.array_equal(a.reconstruct_n(0, 23), b.reconstruct_n(0, 23))  # same index, chunked or not


def test_gpu_search_refused_without_gpu_faiss(monkeypatch):
    from harness.retrieval.base import RetrievalError
    from harness.retrieval.dense import _want_gpu

    monkeypatch.delenv("HARNESS_FAISS_GPU", raising=False)
    assert _want_gpu(None) is False  # faiss-cpu here: no GPU, so auto means CPU
    assert _want_gpu(False) is False
    with pytest.raises(RetrievalError, match="GPU search was asked for"):
        _want_gpu(True)
    monkeypatch.setenv("HARNESS_FAISS_GPU", "1")
    with pytest.raises(RetrievalError, match="GPU search was asked for"):
        _want_gpu(None)
