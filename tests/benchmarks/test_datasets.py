"""Dataset registry and loaders: sources, selection, strict errors, offline hub failure."""

from __future__ import annotations

import json
import time

import pytest

from benchmarks.datasets import (
    DATASETS,
    DatasetError,
    corpus_path,
    dataset_file,
    describe_sources,
    load_examples,
    read_examples,
    select,
)
from harness.registry import RegistryError


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))
    return path


def test_registry_names():
    for name in ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "nq", "triviaqa", "popqa", "demo"):
        assert name in DATASETS
    with pytest.raises(RegistryError, match="did you mean 'hotpotqa'"):
        load_examples("hotpotq")


def test_local_layout_and_env_var(tmp_path, monkeypatch):
    write(tmp_path / "bamboogle" / "test.jsonl", [{"id": "a", "question": "Q?", "golden_answers": ["x"]}])
    assert [e.id for e in load_examples("bamboogle", data_dir=tmp_path)] == ["a"]
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path))
    assert dataset_file("bamboogle") == tmp_path / "bamboogle" / "test.jsonl"
    with pytest.raises(DatasetError, match="no split 'dve'"):
        load_examples("bamboogle", split="dve")


def test_parsing_rules_and_unicode(tmp_path):
    p = write(
        tmp_path / "q.jsonl",
        [
            {"question": "Où est São Paulo?", "golden_answers": "Brésil"},
            "",
            {"id": 7, "question": "Q2", "golden_answers": ["a", "b"], "metadata": {"k": 1}},
        ],
    )
    exs = read_examples(p)
    assert exs[0].id == "0" and exs[0].answers == ("Brésil",) and exs[0].question == "Où est São Paulo?"
    assert exs[1].id == "7" and exs[1].metadata == {"k": 1}


@pytest.mark.parametrize(
    "rows, message",
    [
        (['{"id": "a", "question": '], r"q.jsonl:1: malformed JSON"),
        ([{"id": "a", "golden_answers": ["x"]}], r"q.jsonl:1: missing or empty 'question'"),
        ([{"id": "a", "question": "Q"}, {"id": "b", "question": "Q"}], r"q.jsonl:1: 'golden_answers'"),
        (
            [
                {"id": "a", "question": "Q", "golden_answers": ["x"]},
                {"id": "a", "question": "Q", "golden_answers": ["y"]},
            ],
            r"q.jsonl:2: duplicate id 'a' \(first on line 1\)",
        ),
        ([], r"q.jsonl: no questions \(empty file\)"),
        (["[1, 2]"], r"q.jsonl:1: expected a JSON object"),
        ([{"id": "a", "question": "Q", "golden_answers": []}], r"q.jsonl:1: 'golden_answers' .*got an empty list"),
        (
            [
                {"id": "a", "question": "Q", "golden_answers": ["x"]},
                {"id": "b", "question": "Q", "golden_answers": [None]},
            ],
            r"q.jsonl:2: 'golden_answers'\[0\] must be a string, got null",
        ),
        ([{"id": "a", "question": "Q", "golden_answers": [["x"]]}], r"q.jsonl:1: 'golden_answers'\[0\]"),
    ],
)
def test_bad_input_names_file_and_line(tmp_path, rows, message):
    with pytest.raises(DatasetError, match=message):
        read_examples(write(tmp_path / "q.jsonl", rows))


def test_limit_and_sample_are_deterministic():
    exs = load_examples("demo")
    assert [e.id for e in select(exs, limit=3)] == [e.id for e in exs[:3]]
    a = select(exs, sample=5, seed=1)
    assert [e.id for e in a] == [e.id for e in select(exs, sample=5, seed=1)]
    assert [e.id for e in a] != [e.id for e in select(exs, sample=5, seed=2)]
    order = [e.id for e in exs]
    assert [order.index(e.id) for e in a] == sorted(order.index(e.id) for e in a)  # file order kept
    assert len(select(exs, sample=5, limit=2, seed=1)) == 2
    with pytest.raises(DatasetError, match="--limit must be >= 0"):
        select(exs, limit=-1)


def test_offline_hub_fails_fast_with_one_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HARNESS_DATA_DIR", raising=False)
    t0 = time.time()
    with pytest.raises(DatasetError, match=r"could not download popqa/test.jsonl.*--data-dir DIR"):
        load_examples("popqa")
    assert time.time() - t0 < 15


def test_unreachable_hub_endpoint_fails_fast(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    t0 = time.time()
    with pytest.raises(DatasetError, match="HARNESS_DATA_DIR"):
        load_examples("nq", split="dev", data_dir=tmp_path)  # not there locally -> hub -> refused
    assert time.time() - t0 < 30


def test_corpus_paths(tmp_path):
    assert corpus_path("demo").name == "corpus.jsonl"
    write(tmp_path / "hotpotqa" / "corpus_distractor1352.jsonl", [{"id": "1", "contents": "t\nx"}])
    write(tmp_path / "hotpotqa" / "corpus_train100.jsonl", [{"id": "1", "contents": "t\nx"}])
    assert corpus_path("hotpotqa", "dev_distractor1352", tmp_path).name == "corpus_distractor1352.jsonl"
    assert corpus_path("hotpotqa", "dev", tmp_path) is None  # two corpora, none mapped to dev
    assert corpus_path("bamboogle", "test", None) is None


def test_describe_sources(tmp_path):
    rows = describe_sources(tmp_path)
    demo = next(r for r in rows if r["dataset"] == "demo")
    assert demo["source"].startswith("packaged") and demo["corpus"].endswith("corpus.jsonl")
    nq = next(r for r in rows if r["dataset"] == "nq" and r["split"] == "test")
    assert nq["source"] == "hub: RUC-NLPIR/FlashRAG_datasets/nq/test.jsonl"


@pytest.mark.shared_data
def test_real_data_loads(shared_data):
    for name, split, n in (
        ("hotpotqa", "dev_distractor1352", 1352),
        ("bamboogle", "test", 125),
        ("musique", "train100", 100),
        ("r1searcher_subsets", "hotpotqa_500", 500),
    ):
        assert len(load_examples(name, split, data_dir=shared_data)) == n
    assert corpus_path("hotpotqa", "dev_distractor1352", shared_data).name == "corpus_distractor1352.jsonl"
    assert corpus_path("2wikimultihopqa", "dev", shared_data).name == "corpus_6119.jsonl"


def test_non_utf8_files_name_path_and_line(tmp_path):
    from harness.retrieval.corpus import CorpusError, read_corpus

    good = json.dumps({"id": "a", "question": "Q", "golden_answers": ["x"]}).encode()
    bad = json.dumps({"id": "b", "question": "Qé", "golden_answers": ["y"]}, ensure_ascii=False).encode("latin-1")
    (tmp_path / "q.jsonl").write_bytes(good + b"\n" + bad + b"\n")
    with pytest.raises(DatasetError, match=r"q.jsonl:2: not UTF-8 text \(byte 0xe9"):
        read_examples(tmp_path / "q.jsonl")
    (tmp_path / "c.jsonl").write_bytes(b'{"id": "1", "contents": "t\\nx"}\n{"id": "2", "contents": "caf\xe9"}\n')
    with pytest.raises(CorpusError, match=r"c.jsonl:2: not UTF-8"):
        read_corpus(tmp_path / "c.jsonl")
    # A byte-order mark is not an error.
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + good + b"\n")
    assert [e.id for e in read_examples(tmp_path / "bom.jsonl")] == ["a"]


def test_golds_that_normalise_to_nothing_are_flagged(tmp_path, caplog):
    from benchmarks.metrics import exact_match

    rows = [
        {"id": "ok", "question": "Q", "golden_answers": ["Paris"]},
        {"id": "the", "question": "Q", "golden_answers": ["The The"]},
        {"id": "bang", "question": "Q", "golden_answers": ["!!!"]},
    ]
    with caplog.at_level("WARNING", logger="benchmarks.datasets"):
        exs = read_examples(write(tmp_path / "q.jsonl", rows))
    assert len(exs) == 3  # kept
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "2 item(s)" in msg and "the, bang" in msg
    assert exact_match("", exs[1].answers) == 1.0  # FlashRAG's scoring, kept (documented)


def test_demo_counts_come_from_the_files():
    demo = next(r for r in describe_sources(None) if r["dataset"] == "demo")
    assert f"({len(load_examples('demo'))} questions," in demo["source"]
    assert "32" not in DATASETS.get("demo").description


@pytest.mark.shared_data
def test_hotpotqa_dev_flags_its_two_empty_golds(shared_data, caplog):
    with caplog.at_level("WARNING", logger="benchmarks.datasets"):
        load_examples("hotpotqa", "dev", data_dir=shared_data)
    assert "2 item(s)" in caplog.text and "dev_3667, dev_5470" in caplog.text


def test_without_a_data_dir_local_splits_say_where_to_point_it(monkeypatch, tmp_path):
    """Issue 23 defect 10: with no --data-dir the local-only splits read "local only (not found)",
    as if they had been looked for; now they say where --data-dir must point."""
    from benchmarks.datasets import data_dir_hint

    monkeypatch.delenv("HARNESS_DATA_DIR", raising=False)
    rows = describe_sources(None)
    hp = next(r for r in rows if r["dataset"] == "hotpotqa" and r["split"] == "dev_distractor1352")
    assert hp["source"] == "local: --data-dir DIR with DIR/hotpotqa/dev_distractor1352.jsonl"
    assert not any("not found" in r["source"] for r in rows)
    assert "--data-dir DIR" in data_dir_hint(None)
    hp = next(r for r in describe_sources(tmp_path) if r["split"] == "dev_distractor1352")
    assert hp["source"] == f"not found: {tmp_path / 'hotpotqa' / 'dev_distractor1352.jsonl'}"
    assert data_dir_hint(tmp_path) is None


def test_a_question_longer_than_any_context_is_refused_at_load_naming_its_line(tmp_path):
    """Issue 44: a 10 MB one-line question cost 40 s and 2.2 GB of tokenizing before it ended as
    context_overflow; it is now refused when the file is read, in well under a second."""
    rows = [
        {"id": "a", "question": "Q?", "golden_answers": ["x"]},
        {"id": "b", "question": "w " * 5_000_000, "golden_answers": ["x"]},
    ]
    path = write(tmp_path / "q.jsonl", rows)
    t0 = time.monotonic()
    with pytest.raises(DatasetError, match=r"q.jsonl:2: the question is 10,000,000 characters long"):
        read_examples(path)
    assert time.monotonic() - t0 < 5
