"""The shipped demo benchmark: v1 kept byte for byte, the v2 splits sized, balanced, disjoint,
answerable from their passages alone, and regenerated identically by the builder."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.datasets import corpus_path, demo_path, load_examples

BUILDER = Path(__file__).resolve().parents[2] / "scripts" / "build_demo.py"
NEW, OLD = ("test", "val", "train"), ("test_v1", "train_v1")
# sha256 of the demo's files as shipped before v2 (then questions.jsonl, train_questions.jsonl and
# corpus.jsonl): earlier figures reproduce only while these hold.
V1_SHA256 = {
    "test_v1.jsonl": "496835ef5953ab285b8c10c5eb0f7e146aed5b509a6aca8449ca94b324220def",
    "train_v1.jsonl": "e2d2e68cdfdac2e503e584d4669c9448d30bbfa0db585293ace9b7a59f78b352",
    "corpus_v1.jsonl": "e77500d0b1d4320420215703e05c61a67affcb6d93eaa027599adcc10ea32203",
}
YEAR_TEMPLATES = ("inventor's birth year", "company's founding year")


def _corpus(split: str) -> dict[str, str]:
    rows = [json.loads(line) for line in corpus_path("demo", split).read_text(encoding="utf-8").splitlines()]
    docs = {d["id"]: d["contents"] for d in rows}
    assert len(docs) == len(rows), "corpus ids repeat"
    return docs


def _support(examples) -> set[str]:
    return {d for e in examples for d in e.metadata["supporting_doc_ids"]}


def _answers(examples) -> set[str]:
    return {a for e in examples for a in e.answers} - {"yes", "no"}


def test_v1_files_are_byte_identical_and_their_passages_stay_in_the_corpus():
    for name, digest in V1_SHA256.items():
        assert hashlib.sha256(demo_path(name).read_bytes()).hexdigest() == digest, name
    v1 = demo_path("corpus_v1.jsonl").read_text(encoding="utf-8").splitlines()
    assert demo_path("corpus.jsonl").read_text(encoding="utf-8").splitlines()[: len(v1)] == v1
    assert [len(load_examples("demo", s)) for s in OLD] == [39, 36]
    # The v1 splits are searched over the v1 corpus (their figures reproduce), v2 over the whole one.
    assert {corpus_path("demo", s).name for s in OLD} == {"corpus_v1.jsonl"}
    assert {corpus_path("demo", s).name for s in NEW} | {corpus_path("demo").name} == {"corpus.jsonl"}


@pytest.mark.parametrize("split", NEW + OLD)
def test_every_question_rests_on_two_passages_that_hold_its_answer(split):
    docs = _corpus(split)
    assert all("\n" in c for c in docs.values())  # FlashRAG corpus form: title line, text
    titles = Counter(c.split("\n")[0] for c in docs.values())
    assert max(titles.values()) == 1, "a title names two passages"
    for q in load_examples("demo", split):
        support = q.metadata["supporting_doc_ids"]
        assert len(support) == 2 and all(s in docs for s in support), q.id
        answer = q.answers[0]
        if q.metadata["type"] == "bridge":  # the answer is found, never read off the question
            assert answer not in q.question, q.id
        if answer not in ("yes", "no"):
            assert any(answer.lower() in docs[s].lower() for s in support), q.id


def _passage_facts(text: str) -> dict[str, str]:
    """What a v2 passage states, read back from its sentence (not from the builder's records)."""
    patterns = (
        r"(?P<name>.+) is a town in the province of (?P<province>\w+)\. It lies on the (?P<river>\w+) river .+",
        r"(?P<name>.+) \(born (?P<born>\d{4})\) was an? .+ born in the town of (?P<town>\w+)\.",
        r"The (?P<name>.+) was invented by (?P<inventor>.+) in (?P<year>\d{4})\.",
        r"(?P<name>.+) is an? .+ firm founded in (?P<town>\w+) in (?P<founded>\d{4}) by (?P<founder>.+)\.",
        r"The (?P<name>.+) is an? .+ made by (?P<company>.+)\.",
    )
    for p in patterns:
        if m := re.match(p, text.split("\n")[1]):
            return m.groupdict()
    raise AssertionError(f"unknown passage: {text!r}")


@pytest.mark.parametrize("split", NEW)
def test_v2_golds_follow_from_the_passages(split):
    """Each gold answer is what the two passages say, and a year template's year is in the second
    passage only (the first passage holds no year, or another one)."""
    docs = _corpus(split)
    for q in load_examples("demo", split):
        a, b = (_passage_facts(docs[s]) for s in q.metadata["supporting_doc_ids"])
        template, gold = q.metadata["template"], q.answers[0]
        if template == "same province":
            assert gold == ("yes" if a["province"] == b["province"] else "no"), q.id
        elif template == "born earlier":
            assert a["born"] != b["born"] and gold == min((a, b), key=lambda p: p["born"])["name"], q.id
        else:  # a bridge: the first passage names the second's entity
            assert b["name"] in docs[q.metadata["supporting_doc_ids"][0]], q.id
            fact = {
                "inventor's town": "town",
                "inventor's birth year": "born",
                "river of a town": "river",
                "company founder": "founder",
                "company's founding year": "founded",
            }[template]
            assert gold == b[fact], q.id
            if template in YEAR_TEMPLATES:
                assert gold not in docs[q.metadata["supporting_doc_ids"][0]], q.id


def test_v2_split_sizes_and_template_mix():
    counts = {s: Counter(e.metadata["template"] for e in load_examples("demo", s)) for s in NEW}
    sizes = {s: sum(c.values()) for s, c in counts.items()}
    assert sizes["train"] >= 400 and 40 <= sizes["val"] <= 60 and 140 <= sizes["test"] <= 160
    # Seven templates, each asked equally often in every split: the same mix in test, val, train.
    for split, c in counts.items():
        assert len(c) == 7 and len(set(c.values())) == 1, (split, c)
    assert all(t in counts["test"] for t in YEAR_TEMPLATES)
    from benchmarks.demo_summary import question_template

    for split in NEW:  # the demo's per-template tables know every template by its wording
        assert all(question_template(e.question) == e.metadata["template"] for e in load_examples("demo", split))


def _position(e) -> str:
    m = re.fullmatch(r"Who was born earlier, (.+) or (.+)\?", e.question)
    assert m, e.question
    return {m[1]: "first", m[2]: "second"}[e.answers[0]]


@pytest.mark.parametrize("split", NEW)
def test_v2_splits_are_balanced_in_every_prefix_of_whole_blocks(split):
    """ "yes" as often as "no", the first name as often as the second; and so in every prefix of
    14k questions (two of each template), so ``--limit 14k`` stays balanced."""
    examples = load_examples("demo", split)
    assert len(examples) % 14 == 0
    for end in range(14, len(examples) + 1, 14):
        head = examples[:end]
        yes_no = Counter(e.answers[0] for e in head if e.metadata["template"] == "same province")
        position = Counter(_position(e) for e in head if e.metadata["template"] == "born earlier")
        templates = Counter(e.metadata["template"] for e in head)
        assert yes_no["yes"] == yes_no["no"] == position["first"] == position["second"] == end // 14, (split, end)
        assert set(templates.values()) == {end // 7}


def test_v2_splits_share_no_passage_no_answer_and_no_id():
    splits = {s: load_examples("demo", s) for s in NEW}
    for i, a in enumerate(NEW):
        for b in NEW[i + 1 :]:
            assert not _support(splits[a]) & _support(splits[b]), (a, b)
            assert not _answers(splits[a]) & _answers(splits[b]), (a, b)
            assert not {e.question for e in splits[a]} & {e.question for e in splits[b]}, (a, b)
    ids = [e.id for s in NEW + OLD for e in load_examples("demo", s)]
    assert len(ids) == len(set(ids))
    # v2 passages are new ones: none of v1's supports a v2 question.
    v1_ids = set(_corpus("test_v1"))
    assert not v1_ids & set().union(*(_support(x) for x in splits.values()))


def test_the_builder_writes_the_shipped_files_again(tmp_path):
    """Two runs in fresh interpreters with different hash seeds write the shipped files byte for byte."""
    shipped = sorted(p.name for p in demo_path("corpus.jsonl").parent.glob("*.jsonl"))
    for seed in ("1", "2"):
        out = tmp_path / seed
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, str(BUILDER), "--out", str(out)], check=True, env=env, capture_output=True)
        assert sorted(p.name for p in out.iterdir()) == shipped
        for name in shipped:
            assert (out / name).read_bytes() == demo_path(name).read_bytes(), name


@pytest.mark.slow  # BM25 over the demo corpus (numba compiles on first use: ~10-40 s on a busy 2-core VM)
def test_supporting_passages_are_found_by_bm25():
    """What makes the task learnable: the question finds its first passage, and the second
    passage's title (the second search synthesized trajectories make) finds the second."""
    from benchmarks.demo_data.retrievability import retrievability

    shares = retrievability(list(NEW), ks=(3,))
    for split, table in shares.items():
        assert table["all"]["question → hop 1"][3] >= 0.95, split
        assert table["all"]["title → hop 2"][3] >= 0.95, split
        for template in ("same province", "born earlier"):  # a comparison names both passages' entities
            assert table[template]["question → both"][3] >= 0.9, (split, template)
