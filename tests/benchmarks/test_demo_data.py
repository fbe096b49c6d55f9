"""The shipped demo benchmark is well formed: sizes, supporting passages, answers in them."""

from __future__ import annotations

import json

from benchmarks.datasets import corpus_path, load_examples


def test_demo_benchmark_is_consistent():
    questions = load_examples("demo")
    corpus = [json.loads(line) for line in corpus_path("demo").read_text(encoding="utf-8").splitlines()]
    docs = {d["id"]: d["contents"] for d in corpus}
    assert len(questions) >= 30 and len(docs) >= 150
    assert len(docs) == len(corpus)  # ids unique
    assert all("\n" in c for c in docs.values())  # FlashRAG corpus form: title line, text
    for q in questions:
        support = q.metadata["supporting_doc_ids"]
        assert len(support) == 2 and all(s in docs for s in support), q.id
        answer = q.answers[0].lower()
        if answer not in ("yes", "no"):
            assert any(answer in docs[s].lower() for s in support), q.id


def test_demo_is_regenerated_identically(tmp_path, monkeypatch):
    from benchmarks.demo_data import build_demo

    questions, train, docs = build_demo.build()
    assert [q["id"] for q in questions] == [e.id for e in load_examples("demo")]
    assert [q["id"] for q in train] == [e.id for e in load_examples("demo", "train")]
    assert len(docs) == len(corpus_path("demo").read_text().splitlines())
