"""Replication cards: every card is complete and builds eval configs; ``harness replicate`` runs
each card locally (scripted backend, one question) and says how the setting differs from the
paper's; one slow run with the embedded model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from benchmarks.profiles import get_profile
from benchmarks.replication_cards import card_configs, card_names, card_reference_entries, load_card
from cli.main import app
from pipelines.dialects import SYSTEMS

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
DEMO_CORPUS = ROOT / "benchmarks" / "demo_data" / "corpus.jsonl"
CARDS = SYSTEMS.names()  # one card per seed system (pipelines/dialects/<name>.py)
runner = CliRunner()
needs_data = pytest.mark.skipif(not (DATA / "hotpotqa").is_dir(), reason="needs ../shared/data (hotpotqa)")


def test_every_seed_system_has_a_complete_card():
    assert card_names() == CARDS
    for name in CARDS:
        card = load_card(name)
        assert (ROOT / card.template).is_file() and (ROOT / card.method_config).is_file()
        assert card.topk and card.max_turns and card.datasets
        assert get_profile(card.metric_profile).name == SYSTEMS.get(name).profile  # its own paper's profile
        for p in card.paper:
            assert p.source and p.values
            assert p.metric in get_profile(card.metric_profile).metrics  # numbers are in the profile's metrics
            assert set(p.values) <= {d.key for d in card.datasets}
    assert load_card("search_r1").checkpoint == "PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-7b-em-ppo"
    assert load_card("r1_searcher").checkpoint == "XXsongLALA/Qwen-2.5-7B-base-RAG-RL"
    assert {d.split for d in load_card("r1_searcher").datasets} == {
        "hotpotqa_500",
        "2wiki_500",
        "musique_500",
        "bamboogle",
    }


def test_card_configs_carry_the_setting_and_let_flags_win():
    card = load_card("search_r1")
    cfgs = card_configs(card, {"backend": {"model": "mine"}}, limit=3)
    assert [c.dataset.name for c in cfgs][:3] == ["nq", "triviaqa", "popqa"]
    c = cfgs[0]
    assert (c.method, c.retriever.topk, c.agent["max_turns"], c.dataset.limit) == ("search_r1", 3, 4, 3)
    assert c.backend.model == "mine" and c.metric_profile == "search_r1" and c.metrics == ["em_last_answer", "f1"]
    assert card_configs(card, {})[0].backend.model == card.checkpoint
    only = card_configs(load_card("r1_searcher"), {}, only=["hotpotqa"])
    assert [(c.dataset.name, c.dataset.split) for c in only] == [("r1searcher_subsets", "hotpotqa_500")]


def test_bad_card_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"system": "X", "method": "research"}))
    with pytest.raises(ValueError, match="lacks checkpoint"):
        load_card(str(bad))
    with pytest.raises(ValueError, match="no replication card 'searchr1'"):
        load_card("searchr1")


def test_cards_feed_the_reports_published_rows():
    entries = card_reference_entries()
    r1 = next(e for e in entries if e["system"] == "R1-Searcher" and e["metric"] == "Cover-EM")
    assert r1["values"]["hotpotqa"] == 65.4 and r1["k"] == 5 and "XXsongLALA" in r1["model"]


@needs_data
@pytest.mark.parametrize("card", CARDS)
def test_replicate_runs_every_card_locally_and_says_it_is_not_the_paper(card, tmp_path):
    args = ["replicate", card, "--backend", "scripted", "--limit", "1", "--datasets", "hotpotqa"]
    args += ["--data-dir", str(DATA), "--corpus", str(DEMO_CORPUS), "--out", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert f"harness replicate {card}" in out and "hotpotqa" in out
    assert "NOT the paper's setting: model scripted" in out and "1 of " in out
    assert "Local run (no --index)" in out
    if load_card(card).metric_profile in ("r1_searcher", "research"):
        assert "LLM judge: not configured" in out
    c = load_card(card)
    for p in c.paper:
        if "hotpotqa" in p.values:
            assert f"{p.values['hotpotqa']:g}" in out  # the paper's number beside ours
    # Beside the search agent, its closed-book run (same model and prompt, no search turn), and
    # under the paper's numbers how many of these questions the searched corpus could answer.
    runs = sorted(tmp_path.iterdir(), key=lambda r: "-closed-book-" in r.name)
    assert ["-closed-book-" in r.name for r in runs] == [False, True]
    assert all((r / "results.json").is_file() for r in runs)
    assert "closed-book" in out and "have their answer somewhere in the corpus" in out
    closed = json.loads((runs[1] / "manifest.json").read_text())
    assert closed["retriever"] is None and closed["config"]["agent"]["max_turns"] == 0
    assert json.loads((runs[0] / "manifest.json").read_text())["answerability"]["n"] == 1
    # harness report --reference shows the same paper-vs-ours rows.
    rep = runner.invoke(app, ["report", str(runs[0]), "--out", str(tmp_path / "rep"), "--reference", "--format", "md"])
    assert rep.exit_code == 0, rep.output
    md = (tmp_path / "rep" / "leaderboard.md").read_text()
    assert f"Metric profile: `{c.metric_profile}`" in md
    for p in c.paper[:1]:
        if "hotpotqa" in p.values:
            assert f"| {c.system} | hotpotqa |" in md and f"| {p.values['hotpotqa']:g} |" in md


@needs_data
@pytest.mark.slow
def test_replicate_with_the_embedded_model(tmp_path):
    args = ["replicate", "search_r1", "--model-path", "smollm2-135m-instruct", "--limit", "2", "--datasets", "hotpotqa"]
    args += ["--data-dir", str(DATA), "--corpus", str(DEMO_CORPUS), "--out", str(tmp_path)]
    args += ["-c", str(ROOT / "configs" / "methods" / "demo_cpu.yaml")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "model smollm2-135m-instruct (paper: PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-7b-em-ppo)" in out
    assert "dialect variant 'small'" in out and "max_turns 2 (paper: 4)" in out
    assert "EM (last answer)" in out and "43.3" in out


def test_answerability_notes_say_when_a_score_beats_the_corpus():
    from benchmarks.replicate import CLOSED_BOOK, ComparisonRow, Replication, answerability_notes

    def row(run, ours):
        return ComparisonRow("hotpotqa", "em", 43.3, "", ours, ours, ours, 10, 0, [], "r", run=run)

    a = {"n": 10, "in_corpus": 0.4, "retrievable": 0.2, "topk": 3, "yes_no": 0, "unlocatable": 0}
    rep = Replication(load_card("search_r1"), [row("search agent", 0.5), row(CLOSED_BOOK, 0.3)], [], True, "x")
    rep.answerability = {"hotpotqa": a}
    notes = " ".join(answerability_notes(rep))
    assert "of these 10 questions, 40.0% have their answer somewhere in the corpus, 20.0% in the top-3" in notes
    assert "search agent EM 50.0 is above the in-corpus share 40.0" in notes and "from memory" in notes
    assert "closed-book EM 30.0 is above" not in notes
    rep.answerability = {"hotpotqa": None}
    assert "answerability on this corpus unknown" in " ".join(answerability_notes(rep))


def test_cards_show_the_fields_spread_and_where_ours_lands():
    """Issue 49: beside the paper's number, the published rows of the same system (the paper's other
    rows, independent reproductions) with their sources, and where a harness row lands in their span."""
    from rich.console import Console

    from benchmarks.replicate import (
        PUBLISHED,
        ComparisonRow,
        Replication,
        field_rows,
        field_span,
        lands,
        metric_family,
        replication_notes,
        replication_table,
    )
    from benchmarks.report import load_reference

    assert [metric_family(m) for m in ("em_last_answer", "EM", "EM (R1-Searcher)", "F1", "f1_prorag", "cover_em")] == [
        "em", "em", "em", "f1", "f1", "cover_em"
    ]  # fmt: skip
    card = load_card("search_r1")
    published = field_rows(card, "bamboogle", "em_last_answer", load_reference(PUBLISHED))
    by = {(f.system, f.kind): f.value for f in published}
    assert by[("Search-R1 (SkyRL, 2 turns)", "independent reproduction")] == 24.2
    assert by[("Search-R1 (SkyRL, 3 turns)", "independent reproduction")] == 44.8
    assert by[("Search-R1", "paper")] == 23.2  # the paper's 3B-Instruct row, as SkyRL quotes it
    f1_rows = field_rows(card, "bamboogle", "f1", load_reference(PUBLISHED))  # FlashRAG printed F1 there
    assert {(f.system, f.value) for f in f1_rows} == {("Search-R1 checkpoint (FlashRAG)", 59.9)}
    paper, _ = card.paper_value("em_last_answer", "bamboogle")
    span = field_span(paper, published)
    assert span[0] == 23.2 and span[1] == 48.8 and span[2] == len(published) + 1
    assert lands(0.10, span).startswith("below") and lands(0.30, span).startswith("within")
    assert lands(0.60, span).startswith("above")
    row = ComparisonRow("bamboogle", "em_last_answer", paper, "", 0.3, 0.2, 0.4, 10, 0, [], "r", published=published)
    rep = Replication(card, [row], [], True, "search_r1")
    console = Console(width=250, record=True, color_system=None)
    console.print(replication_table(rep))
    table = console.export_text()
    assert "23.2–48.8" in table and "within" in table
    notes = " ".join(replication_notes(rep))
    skyrl = "Search-R1 (SkyRL, 3 turns), Qwen2.5-3B-Instruct: bamboogle EM (last answer) 44.8; independent reproduction"
    assert skyrl + ", GRPO" in notes
    assert "NovaSky-AI/SkyRL docs/content/docs/recipes/overview.mdx @ a83edc9 (read 2026-12-06)" in notes
