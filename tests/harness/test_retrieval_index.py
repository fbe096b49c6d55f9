"""Corpus reading, BM25 index build/load, manifests and their checks, tokenization parity, the index CLI."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from harness.retrieval.base import CachedRetriever
from harness.retrieval.corpus import CorpusError, read_corpus
from harness.retrieval.index import IndexLoadError, build_index, load_index, read_manifest

BAD_CORPORA = [  # (the file's text, what the error says)
    ('{"id": "a", "contents": "T\\nx"}\n{"id": "a", "contents": "T\\ny"}\n', r"c.jsonl:2: duplicate id 'a'"),
    ('{"id": "a"}\n', r"c.jsonl:1: missing 'contents'"),
    ("{oops\n", r"c.jsonl:1: malformed JSON"),
    ("", "empty corpus"),
    ("[1, 2]\n", r"c.jsonl:1: expected an object"),
    ('{"id": "a", "contents": "T\\nx"}\n\n{"id": null, "contents": "T\\ny"}\n', r"c.jsonl:3: 'id' must be"),
]


@pytest.mark.parametrize(("text", "says"), BAD_CORPORA)
def test_a_bad_corpus_says_what_and_where(tmp_path, text, says):
    p = tmp_path / "c.jsonl"
    p.write_text(text)
    with pytest.raises(CorpusError, match=says):
        read_corpus(p)


def test_corpus_not_found_and_both_record_forms(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        read_corpus(tmp_path / "nope.jsonl")
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": 1, "contents": "Ünï\\nSão"}\n{"id": "b", "title": "B", "text": "split form"}\n')
    d, b = read_corpus(p)
    assert (d.id, d.title, d.text) == ("1", "Ünï", "São")
    assert (b.id, b.title, b.text) == ("b", "B", "split form")


def test_bm25_manifest_and_tokenization_parity(bm25_index, bm25_retriever, tiny_corpus):
    m = read_manifest(bm25_index)
    assert m["kind"] == "bm25" and m["num_docs"] == 5 and m["tokenizer"]["stopwords"] == "en"
    assert "PyStemmer" in m["tokenizer"]["stemmer"]
    assert len(m["corpus_sha256"]) == 64 and m["index_id"] and m["harness_version"] and m["built_at"]
    assert m["corpus_path"] == str(tiny_corpus.resolve()) and m["model"] is None and m["dim"] is None
    assert bm25_retriever.index_id == m["index_id"]
    # "running dogs" must match "Running dogs" and stemmed forms ("run" in t3) at query time too.
    (hits,) = bm25_retriever.search(["running dogs"], 3)
    assert hits[0].id == "t1" and hits[0].score > 0
    assert "t3" in [h.id for h in hits]  # 'run' (stem of running) matches 'run marathons'
    # Stopword-only and unknown-word queries return nothing instead of crashing or inventing matches.
    assert bm25_retriever.search(["the of a", "zzzqqq"], 3) == [[], []]
    assert bm25_retriever.search(["São Paulo"], 10)[0][0].id == "t5"
    # Unknown words next to known ones are ignored, not fatal; k larger than the corpus is capped.
    assert [h.id for h in bm25_retriever.search(["dogs zzzqqq"], 50)[0]] == ["t1"]
    # The index holds the title too.
    assert bm25_retriever.search(["Ünïcode"], 1)[0][0].id == "t5"  # only in t5's title


def test_bm25_tokenizer_is_stemming_both_sides():
    from harness.retrieval.bm25 import tokenize

    # Index side and query side are the same function: inflections meet at one stem.
    (a,), (b,) = tokenize(["Running dogs"]), tokenize(["the dog runs"])
    assert set(a) == set(b) == {"run", "dog"}
    assert tokenize(["the of and"]) == [[]]


def test_load_against_another_corpus_fails(bm25_index, tiny_corpus, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text('{"id": "x", "contents": "T\\nother"}\n')
    with pytest.raises(IndexLoadError, match="was built on corpus .* but is being loaded with"):
        load_index(bm25_index, corpus=other)
    with pytest.raises(IndexLoadError, match="not an index directory"):
        load_index(tmp_path)
    assert load_index(bm25_index, corpus=tiny_corpus).search(["Paris"], 1)[0][0].id == "t4"


@pytest.fixture
def index_copy(bm25_index, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(bm25_index, dst)
    return dst


def _edit_manifest(index_dir, **changes):
    m = json.loads((index_dir / "manifest.json").read_text())
    m.update(changes)
    (index_dir / "manifest.json").write_text(json.dumps(m))


def test_broken_or_foreign_index_dirs_fail_clearly(index_copy):
    _edit_manifest(index_copy, tokenizer={"lower": True, "stopwords": None, "stemmer": None})
    with pytest.raises(IndexLoadError, match="was tokenized with .* rebuild the index"):
        load_index(index_copy)
    _edit_manifest(index_copy, num_docs=6)
    with pytest.raises(IndexLoadError, match="has 5 documents, manifest says 6"):
        load_index(index_copy)
    (index_copy / "manifest.json").write_text("{not json")
    with pytest.raises(IndexLoadError, match="malformed manifest"):
        load_index(index_copy)
    (index_copy / "manifest.json").write_text('{"kind": "bm25"}')
    with pytest.raises(IndexLoadError, match="lacks corpus_sha256, num_docs, index_id"):
        load_index(index_copy)


def test_missing_index_files_fail_clearly(bm25_index, tmp_path):
    for victim, needle in [("docs.jsonl", "docs.jsonl is missing"), ("bm25", "cannot load the BM25 index")]:
        d = tmp_path / victim
        shutil.copytree(bm25_index, d)
        p = d / victim
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        with pytest.raises(IndexLoadError, match=needle):
            load_index(d)


def test_build_rejects_unknown_kind_and_leaves_nothing(tiny_corpus, tmp_path):
    with pytest.raises(IndexLoadError, match="unknown index kind 'sparse'"):
        build_index(tiny_corpus, "sparse", tmp_path / "x")
    with pytest.raises(ValueError, match="unknown faiss index kind 'ivf'"):
        build_index(tiny_corpus, "dense", tmp_path / "y", faiss_kind="ivf", encoder=object())
    assert list(tmp_path.iterdir()) == []  # no index dir, no temporary dir left behind


def test_cli_index_build_and_info(tiny_corpus, tmp_path):
    from cli.main import app

    runner = CliRunner()
    out = tmp_path / "cli-idx"
    r = runner.invoke(app, ["index", "build", "--corpus", str(tiny_corpus), "--kind", "bm25", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "built bm25 index of 5 documents" in r.output
    info = runner.invoke(app, ["index", "info", str(out)])
    assert info.exit_code == 0 and json.loads(info.stdout)["num_docs"] == 5
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\n')
    r = runner.invoke(app, ["index", "build", "--corpus", str(bad), "--out", str(tmp_path / "z")])
    assert r.exit_code == 2 and "bad.jsonl:1: missing 'contents'" in " ".join(r.output.split())  # rich wraps
    args = ["index", "build", "--corpus", str(tiny_corpus), "--out", str(tmp_path / "z"), "--model", "m"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "dense indexes only" in " ".join(r.output.split())


def test_cache_keys_on_index_query_k(bm25_retriever):
    cached = CachedRetriever(bm25_retriever)
    a = cached.search(["running dogs", "running dogs"], 2)
    b = cached.search(["running dogs"], 2)
    assert a[0] == a[1] == b[0]
    assert cached.misses == 2 and cached.hits == 1  # second query in the first batch is a miss, then one hit
    cached.search(["running dogs"], 3)
    assert cached.misses == 3


def test_byte_ranges_read_every_row_once(tmp_path):
    from harness.retrieval.corpus import byte_ranges, iter_range

    p = tmp_path / "c.jsonl"
    rows = [json.dumps({"id": str(i), "contents": f"T{i}\n" + "x" * (i % 7)}) for i in range(40)]
    p.write_text("\n".join(rows[:20]) + "\n\n" + "\n".join(rows[20:]), encoding="utf-8")  # a blank line, no final \n
    whole = [c for _, c in iter_range(p)]
    assert whole == [d.contents for d in read_corpus(p)] and len(whole) == 40
    for parts in (1, 2, 3, 7, 40, 500):
        assert [c for a, b in byte_ranges(p, parts) for _, c in iter_range(p, a, b)] == whole
    p.write_text(rows[0] + "\n{oops\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=rf"c.jsonl:byte {len(rows[0]) + 1}: malformed JSON"):
        list(iter_range(p))


def test_corpus_file_is_the_docs_copy(bm25_index):
    from harness.retrieval.index import DOCS, corpus_file

    assert corpus_file(bm25_index) == bm25_index / DOCS


def test_an_index_whose_docs_were_edited_after_the_build_is_refused(index_copy):
    """Issue 44: an index whose docs.jsonl was edited after it was built served the new text as if
    it were what matched the query."""
    docs = index_copy / "docs.jsonl"
    assert json.loads((index_copy / "manifest.json").read_text())["docs_sha256"]
    load_index(index_copy)  # as built: loads
    docs.write_text(docs.read_text().replace("Paris", "Lyon"))
    with pytest.raises(IndexLoadError, match=r"docs.jsonl was changed after the index was built .* rebuild it"):
        load_index(index_copy)
