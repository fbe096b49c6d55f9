"""An index built by FlashRAG's own Index_Builder, imported in place, answers as FlashRAG's DenseRetriever does."""

from __future__ import annotations

import contextlib
import io
import json
import tracemalloc

import numpy as np
import pytest

from harness.retrieval.corpus import CorpusError, MmapCorpus, read_corpus, scan_offsets
from harness.retrieval.index import IndexLoadError, faiss_header, import_index, load_index, read_manifest

N_DOCS = 150  # FlashRAG's builder encodes ~2-4 docs/s on these loaded 2-core machines
QUERIES = [
    "Who designed the collectible dice game Dragon Dice?",
    "Which river flows through the capital of France?",
    "American football quarterback drafted in the first round",
    "a film directed by an Academy Award winner",
    "What year was the band formed?",
    "village in the county of Suffolk, England",
    "professional wrestler and actor",
    "the largest city in Brazil",
]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """The first 150 passages of the HotpotQA train micro-corpus (real text, so no near-tied scores)."""
    from tests.conftest import SHARED_DATA

    src = SHARED_DATA / "hotpotqa" / "corpus_train100.jsonl"
    if not src.is_file():
        pytest.skip(f"{src} not found: real benchmark data lives beside the repo (../shared/data)")
    lines = src.read_text(encoding="utf-8").splitlines()[:N_DOCS]
    p = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def flashrag_index(small_corpus, tmp_path_factory):
    """A FlashRAG-format flat index over the corpus, built by FlashRAG's Index_Builder with the shipped MiniLM."""
    import datasets

    from harness.retrieval.encoders import default_encoder_path

    cache = tmp_path_factory.mktemp("hfds")
    old = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = cache  # FlashRAG's load_corpus writes Arrow files there
    try:
        from flashrag.retriever.index_builder import Index_Builder

        out = tmp_path_factory.mktemp("flashrag_index")
        with contextlib.redirect_stdout(io.StringIO()):  # FlashRAG prints progress
            Index_Builder(
                retrieval_method="minilm",
                model_path=default_encoder_path(),
                corpus_path=str(small_corpus),
                save_dir=str(out),
                max_length=128,  # passages only; short keeps the build fast on CPU
                batch_size=64,
                use_fp16=False,
                pooling_method=None,  # read from the model's 1_Pooling config: mean
                faiss_type="Flat",
            ).build_index()
    finally:
        datasets.config.HF_DATASETS_CACHE = old
    path = out / "minilm_Flat.index"
    assert path.is_file()
    return path


@pytest.fixture(scope="module")
def flat_index(small_corpus, tmp_path_factory):
    """A file in FlashRAG's index format (faiss index_factory "Flat", inner product) of random unit
    vectors: for the checks that need the format, not FlashRAG's encoding (fast)."""
    import faiss

    vecs = np.random.default_rng(0).standard_normal((N_DOCS, 384)).astype(np.float32)  # [N, 384]
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = faiss.index_factory(384, "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(vecs)
    path = tmp_path_factory.mktemp("flat") / "minilm_Flat.index"
    faiss.write_index(index, str(path))
    return path


@pytest.fixture(scope="module")
def imported(flashrag_index, small_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("imported") / "idx"
    m = import_index(flashrag_index, small_corpus, out, model="minilm", source="test: FlashRAG Index_Builder")
    return out, m


def flashrag_search(index_path, corpus_path, queries, k):
    """FlashRAG's own DenseRetriever over the same files (a plain config dict: no Config side effects)."""
    import datasets

    from harness.retrieval.encoders import default_encoder_path

    config = {
        "retrieval_method": "minilm",
        "retrieval_topk": k,
        "index_path": str(index_path),
        "corpus_path": str(corpus_path),
        "save_retrieval_cache": False,
        "use_retrieval_cache": False,
        "retrieval_cache_path": None,
        "use_reranker": False,
        "save_dir": None,
        "silent_retrieval": True,
        "retrieval_query_max_length": 256,
        "retrieval_pooling_method": "mean",
        "retrieval_use_fp16": False,
        "retrieval_batch_size": 64,
        "instruction": None,
        "retrieval_model_path": default_encoder_path(),
        "use_sentence_transformer": False,
        "faiss_gpu": False,
    }
    from flashrag.retriever.retriever import DenseRetriever

    with contextlib.redirect_stdout(io.StringIO()):
        corpus = datasets.load_dataset("json", data_files=str(corpus_path), split="train", cache_dir=None)
        r = DenseRetriever(config, corpus=corpus)
        docs, scores = r.batch_search(list(queries), num=k, return_score=True)
    return docs, scores


@pytest.mark.slow
def test_imported_flashrag_index_answers_as_flashrag(imported, flashrag_index, small_corpus):
    out, m = imported
    assert m["imported"] and m["faiss"] == "flat" and m["num_docs"] == N_DOCS and m["dim"] == 384
    assert m["faiss_path"] == str(flashrag_index.resolve()) and m["corpus_path"] == str(small_corpus.resolve())
    assert (m["model"], m["pooling"], m["query_prefix"]) == ("all-MiniLM-L6-v2", "mean", "")
    names = sorted(p.name for p in out.iterdir())
    assert names == [".harness-owned.json", "corpus.offsets.npy", "manifest.json"]  # nothing copied (+ the marker)
    ours = load_index(out, gpu=False)
    k = 5
    got = ours.search(QUERIES, k)
    want_docs, want_scores = flashrag_search(flashrag_index, small_corpus, QUERIES, k)
    for q, g, wd, ws in zip(QUERIES, got, want_docs, want_scores, strict=True):
        assert [d.id for d in g] == [str(d["id"]) for d in wd], q  # same documents, same order
        assert np.allclose([d.score for d in g], ws, atol=1e-4), q
        from harness.types import Doc

        assert [d.contents for d in g] == [Doc.from_contents("x", d["contents"]).contents for d in wd]

    # The paths `harness eval --index DIR` and `harness serve retriever --index DIR` take.
    from fastapi.testclient import TestClient

    from harness.eval_config import RetrieverConfig
    from harness.retrieval.factory import build_retriever
    from harness.retrieval.server import create_app

    via_eval = build_retriever(RetrieverConfig(kind="dense", index=str(out)))
    assert [d.id for d in via_eval.search(QUERIES[:1], k)[0]] == [d.id for d in got[0]]
    r = TestClient(create_app(ours)).post("/retrieve", json={"queries": QUERIES[:2], "topk": 3, "return_scores": True})
    assert r.status_code == 200
    served = [[x["document"]["id"] for x in row] for row in r.json()["result"]]
    assert served == [[d.id for d in g[:3]] for g in got[:2]]


def test_imported_corpus_is_memory_mapped_not_a_list(flat_index, small_corpus, tmp_path):
    out = tmp_path / "idx"
    import_index(flat_index, small_corpus, out, model="minilm")
    docs = MmapCorpus.open(small_corpus, out / "corpus.offsets.npy")
    assert isinstance(docs.starts, np.memmap)  # offsets are mapped too
    full = read_corpus(small_corpus)
    assert len(docs) == len(full) == N_DOCS
    for i in (0, 1, 137, N_DOCS - 1):
        assert docs[i] == full[i]
    assert [d.id for d in docs][:3] == [d.id for d in full[:3]]
    with pytest.raises(IndexError):
        docs[N_DOCS]


def test_opening_a_large_corpus_holds_no_text(tmp_path):
    """Opening (offsets scanned, then mapped) allocates a small fraction of the corpus on the Python heap."""
    import numpy as np

    p = tmp_path / "big.jsonl"
    filler = "lorem ipsum dolor sit amet " * 80  # ~2 KB a passage
    with open(p, "w", encoding="utf-8") as f:
        for i in range(3000):
            f.write(json.dumps({"id": str(i), "contents": f"Title {i}\n{filler}{i}"}) + "\n")
    starts, _, size = scan_offsets(p)
    np.save(tmp_path / "off.npy", starts)
    tracemalloc.start()
    try:
        c = MmapCorpus.open(p, tmp_path / "off.npy")
        hits = [c[i] for i in (0, 1500, 2999)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 20, f"opening held {peak} bytes of Python objects for a {size}-byte corpus"
    assert [d.id for d in hits] == ["0", "1500", "2999"] and hits[2].text.endswith("2999")


def test_scan_offsets_skips_blank_lines_and_hashes(tmp_path):
    import hashlib

    p = tmp_path / "c.jsonl"
    rows = [{"id": "a", "contents": "T\nx"}, {"id": "b", "contents": "U\ny"}, {"id": 3, "title": "V", "text": "z"}]
    raw = json.dumps(rows[0]) + "\n\n \r\n" + json.dumps(rows[1]) + "\r\n" + json.dumps(rows[2])  # no final newline
    p.write_bytes(raw.encode())
    starts, sha, size = scan_offsets(p, chunk_bytes=7)  # tiny chunks: lines straddle chunk borders
    assert sha == hashlib.sha256(raw.encode()).hexdigest() and size == len(raw.encode())
    c = MmapCorpus(p, starts)
    assert [d.id for d in c] == ["a", "b", "3"] and c[2].title == "V" and c[1].text == "y"
    assert [d.id for d in c] == [d.id for d in read_corpus(p)]
    p.write_text('{"id": "a", "contents": "T\\nx"}\nnot json\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"c.jsonl:row 1: malformed JSON"):
        MmapCorpus.open(p).check_sample()


def test_import_checks_count_dimension_metric_and_files(flat_index, small_corpus, tmp_path):
    flashrag_index = flat_index
    head = faiss_header(flashrag_index)
    assert head == {"type": "flat", "dim": 384, "ntotal": N_DOCS, "metric": 0}
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(small_corpus.read_text(encoding="utf-8").splitlines()[:-1]) + "\n", encoding="utf-8")
    with pytest.raises(IndexLoadError, match=f"holds {N_DOCS} vectors but .*short.jsonl has {N_DOCS - 1} rows"):
        import_index(flashrag_index, short, tmp_path / "a", model="minilm")
    with pytest.raises(IndexLoadError, match="holds 384-d vectors but 'intfloat/e5-base-v2' gives 768-d"):
        import_index(flashrag_index, small_corpus, tmp_path / "b", model="intfloat/e5-base-v2")
    import faiss

    l2 = faiss.IndexFlatL2(4)
    l2.add(np.zeros((2, 4), dtype=np.float32))
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    with pytest.raises(IndexLoadError, match="L2-distance index"):
        import_index(tmp_path / "l2.index", small_corpus, tmp_path / "c", model="minilm")
    (tmp_path / "junk.index").write_bytes(b"PK\x03\x04 not an index at all, a zip" * 3)
    with pytest.raises(IndexLoadError, match="not a FAISS index of a known type"):
        import_index(tmp_path / "junk.index", small_corpus, tmp_path / "d", model="minilm")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_imported_index_load_detects_moved_or_changed_files(flat_index, small_corpus, tmp_path):
    import shutil

    faiss_copy, corpus_copy = tmp_path / "e5_Flat.index", tmp_path / "wiki.jsonl"
    shutil.copy(flat_index, faiss_copy)
    shutil.copy(small_corpus, corpus_copy)
    out = tmp_path / "idx"
    m = import_index(faiss_copy, corpus_copy, out, model="minilm")
    assert read_manifest(out)["index_id"] == m["index_id"]
    with open(corpus_copy, "a", encoding="utf-8") as f:
        f.write('{"id": "extra", "contents": "X\\ny"}\n')
    with pytest.raises(IndexLoadError, match="wiki.jsonl has .* bytes, .* when imported"):
        load_index(out, gpu=False)
    corpus_copy.unlink()
    with pytest.raises(IndexLoadError, match="the imported corpus .*wiki.jsonl is missing"):
        load_index(out, gpu=False)


def test_cli_index_import(flat_index, small_corpus, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path / "idx"
    args = ["index", "import", "--faiss", str(flat_index), "--corpus", str(small_corpus), "--model", "minilm"]
    r = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "imported flat index of 150 vectors" in r.output and read_manifest(out)["imported"]
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "x"), "--pooling", "max"])
    assert r.exit_code != 0 and "unknown pooling 'max'" in r.output
