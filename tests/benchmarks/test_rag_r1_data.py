"""RAG-R1's filtered training set converted from a small local file we write ourselves."""

from __future__ import annotations

import json

import pytest

from benchmarks.datasets import read_examples
from benchmarks.rag_r1_data import URL, fetch, rag_r1_train


def test_a_local_copy_converts_to_a_question_file(tmp_path):
    src = tmp_path / "train_data.json"
    src.write_text(
        json.dumps(
            [{"question": "Who wrote X?", "golden_answers": "Ann"}, {"question": "Y?", "golden_answers": ["no"]}]
        )
    )
    n = rag_r1_train(tmp_path / "out.jsonl", str(src))
    examples = read_examples(tmp_path / "out.jsonl")
    assert n == 2 and [(e.question, list(e.answers)) for e in examples] == [("Who wrote X?", ["Ann"]), ("Y?", ["no"])]
    src.write_text(json.dumps([{"question": "Q", "golden_answers": []}]))
    with pytest.raises(ValueError, match="record 0 has no golden_answers"):
        rag_r1_train(tmp_path / "bad.jsonl", str(src))


def test_the_download_fails_clearly_offline():
    assert "cfd875062d9f777fc9d193d99878f151bebfb1ae" in URL and URL.endswith("train_data.json")
    with pytest.raises(RuntimeError, match="--source FILE"):
        fetch("http://127.0.0.1:9/train_data.json", timeout=2)
