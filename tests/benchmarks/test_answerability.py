"""``harness index check``: whole-token answer matching under the metric's normalisation, the
streaming corpus scan (one process or several, same answers), the shares and their store beside
the index, lookups for subsets of the checked questions, the CLI, and real HotpotQA data."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from benchmarks.answerability import (
    EMPTY,
    SPAN,
    STORE,
    YES_NO,
    AnswerScanner,
    answer_keys,
    answerability_line,
    beats_corpus,
    check_index,
    contains,
    known_answerability,
    question_kind,
    scan_corpus,
)
from benchmarks.datasets import examples_hash, read_examples
from cli.main import app
from harness.types import Example

CORPUS = [
    ("p1", "The Beatles", "The Beatles were an English rock band formed in Liverpool in 1960."),
    ("p2", "Paris", "Paris is the capital of France; about 2,100,000 people live there."),
    ("p3", "Marathon", "People who run marathons train for months (e.g. the U.S. Olympic team)."),
    ("p4", "Cats", "A cat sleeps for most of the day, near Mount Fuji."),
]
# id, question, answers; what the corpus holds for each (in corpus, retrievable with BM25 top-1)
QUESTIONS = [
    ("q1", "Which English rock band formed in Liverpool?", ["The Beatles"]),  # found, retrieved
    ("q2", "What is the capital of France?", ["paris!"]),  # found (normalised), retrieved
    ("q3", "How many people live in Paris?", ["2100000"]),  # punctuation dropped on both sides
    ("q4", "Who sleeps near the volcano?", ["Mount Kilimanjaro", "Kili"]),  # nowhere
    ("q5", "Was Paris the capital of France?", ["yes"]),  # yes/no: counted as found
    ("q6", "What band had 196 members?", ["196"]),  # '196' is not a whole token of '1960'
    ("q7", "Which team trains for months?", ["US Olympic team"]),  # 'U.S.' normalises to 'us'
    ("q8", "What is the the?", ["The The"]),  # nothing left after normalisation
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A FlashRAG-layout data folder: bamboogle/test.jsonl holds our questions."""
    d = tmp_path_factory.mktemp("data")
    (d / "bamboogle").mkdir()
    rows = [{"id": i, "question": q, "golden_answers": a} for i, q, a in QUESTIONS]
    write_jsonl(d / "bamboogle" / "test.jsonl", rows)
    return d


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_jsonl(
        tmp_path_factory.mktemp("corpus") / "c.jsonl", [{"id": i, "contents": f"{t}\n{x}"} for i, t, x in CORPUS]
    )


@pytest.fixture(scope="module")
def words(corpus):
    """Word-overlap retrieval over the corpus (no numba compile, unlike BM25's first search)."""
    from harness.retrieval.corpus import read_corpus
    from harness.retrieval.memory import InMemoryRetriever

    return InMemoryRetriever(read_corpus(corpus))


@pytest.fixture(scope="module")
def index(corpus, tmp_path_factory):
    from harness.retrieval.index import build_index

    out = tmp_path_factory.mktemp("idx") / "bm25"
    build_index(corpus, "bm25", out)
    return out


def test_whole_tokens_under_the_metrics_normalisation():
    assert answer_keys(["The Beatles", "beatles", "!!!", "U.S."]) == ("beatles", "us")
    assert contains("beatles were english rock band", "beatles")
    assert contains("formed in 1960", "1960") and not contains("formed in 1960", "196")
    assert not contains("rock band", "rock ban") and contains("rock band", "rock band")
    assert question_kind(("yes",)) == YES_NO and question_kind(()) == EMPTY and question_kind(("x",)) == SPAN


def test_scanner_finds_single_and_multi_token_answers_once():
    s = AnswerScanner(["beatles", "english rock band", "liverpool 1960", "rock", "new york"])
    s.feed("The Beatles were an English rock band formed in Liverpool in 1960.")
    # 'liverpool in 1960' normalises to 'liverpool in 1960', not 'liverpool 1960'; 'new york' is absent.
    assert s.found == {"beatles", "english rock band", "rock"}
    assert s.active == {"liverpool 1960", "new york"}
    s.feed("New York, New York!")
    assert "new york" in s.found and s.rows == 2


def test_scan_in_parallel_byte_ranges_finds_the_same(tmp_path):
    rows = [{"id": str(i), "contents": f"T{i}\nword{i} filler text {i * 7}"} for i in range(300)]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    keys = ["word5", "word299", "filler text 700", "filler text 701", "word300", "t0"]
    one = scan_corpus(path, keys, workers=1)
    two = scan_corpus(path, keys, workers=3)
    assert one.found == two.found == {"word5", "word299", "filler text 700", "t0"}
    assert one.rows == two.rows == 300


def test_check_index_shares_store_and_lines(index, data_dir, words):
    rep = check_index(index, ["bamboogle"], topk=1, data_dir=data_dir, retriever=words)
    (a,) = rep.results
    # in corpus: q1 q2 q3 q5(yes) q7 = 5 of 8; q4 absent, q6 only a piece of a token, q8 empty.
    assert (a.n, a.yes_no, a.unlocatable) == (8, 1, 1)
    assert a.in_corpus == pytest.approx(5 / 8)
    assert a.unanswerable == ["q4", "q6", "q8"]  # what abstention on unanswerable questions is over
    assert a.retrievable is not None and a.retrievable <= a.in_corpus
    store = json.loads((index / STORE).read_text())
    examples = read_examples(data_dir / "bamboogle" / "test.jsonl")
    entry = store["datasets"][examples_hash(examples)]
    assert entry["topk"] == 1 and entry["items"]["q4"][1:] == [0, 0, SPAN] and entry["items"]["q5"][3] == YES_NO
    assert entry["items"]["q1"][1:] == [1, 1, SPAN]  # the top passage for q1 holds 'beatles'
    assert store["index_id"] == a.index_id and store["scan"]["rows"] == len(CORPUS)
    line = answerability_line(a)
    assert line.startswith("of these 8 questions, 62.5% have their answer somewhere in the corpus")
    assert "in the top-1 for the question" in line and "1 yes/no" in line
    assert beats_corpus(0.7, a) and not beats_corpus(0.6, a)


def test_known_answerability_for_subsets_only_when_every_question_matches(index, data_dir, words):
    check_index(index, ["bamboogle"], topk=2, data_dir=data_dir, retriever=words)
    examples = read_examples(data_dir / "bamboogle" / "test.jsonl")
    index_id = json.loads((index / "manifest.json").read_text())["index_id"]
    sub = known_answerability(index, index_id, examples[:2], topk=2)
    assert sub is not None and sub.n == 2 and sub.in_corpus == 1.0
    assert known_answerability(index, index_id, examples, topk=5).retrievable is None  # checked at k=2 only
    edited = [replace(examples[0], answers=("Ringo",)), *examples[1:]]
    assert known_answerability(index, index_id, edited, topk=2) is None  # not the questions checked
    assert known_answerability(index, "another-index", examples, topk=2) is None
    assert known_answerability(index, index_id, [Example("zz", "q?", ("a",))], topk=2) is None


@pytest.mark.slow  # BM25's first search compiles its numba kernels
def test_cli_index_check_prints_both_shares(index, data_dir):
    result = CliRunner().invoke(
        app, ["index", "check", "--index", str(index), "--dataset", "bamboogle", "--data-dir", str(data_dir)]
    )
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "bamboogle test (8 questions)" in out and "in corpus 62.5%" in out and "retrievable top-5" in out
    bad = CliRunner().invoke(app, ["index", "check", "--index", str(index), "--dataset", "nosuchset"])
    assert bad.exit_code != 0 and "nosuchset" in bad.output


@pytest.mark.shared_data
@pytest.mark.slow
def test_hotpotqa_distractor_questions_are_in_their_corpus(shared_data, tmp_path):
    """The distractor corpus holds the paragraphs of these very questions: nearly every answer is in it."""
    from harness.retrieval.index import build_index

    build_index(shared_data / "hotpotqa" / "corpus_distractor1352.jsonl", "bm25", tmp_path / "idx")
    rep = check_index(tmp_path / "idx", ["hotpotqa"], "dev_distractor1352", 5, shared_data, limit=200)
    (a,) = rep.results
    assert a.n == 200 and a.in_corpus > 0.95 and 0.3 < a.retrievable < a.in_corpus


def test_eval_manifest_records_the_shares_and_a_closed_book_run_searches_nothing(index, data_dir, words, tmp_path):
    from benchmarks.build import build_eval
    from benchmarks.replicate import closed_book_config
    from harness.config import from_dict
    from harness.eval_config import EvalConfig

    check_index(index, ["bamboogle"], topk=3, data_dir=data_dir, retriever=words)
    cfg = from_dict(
        EvalConfig,
        {
            "method": "search_r1",
            "backend": {"kind": "scripted"},
            "retriever": {"kind": "bm25", "index": str(index), "topk": 3},
            "dataset": {"name": "bamboogle", "data_dir": str(data_dir), "limit": 4},
            "out": str(tmp_path),
        },
    )
    run = build_eval(cfg)
    a = run.manifest.answerability
    assert a is not None and a["n"] == 4 and a["topk"] == 3 and a["in_corpus"] == 0.75  # q4 is absent
    assert a["unanswerable"] == ["q4"]  # the run's own questions only
    assert a["data_hash"] == run.manifest.data_hash
    closed = closed_book_config(cfg)
    assert closed.name == "search_r1-closed-book" and closed.agent == {"max_turns": 0, "final_turn": True}
    run = build_eval(closed)
    assert run.retriever is None and run.manifest.retriever is None and run.manifest.answerability is None
    # Not the questions checked (another limit is fine; another index is not): unknown.
    other = replace(cfg, retriever=replace(cfg.retriever, topk=9))
    assert build_eval(other).manifest.answerability["retrievable"] is None  # checked at k=3 only
