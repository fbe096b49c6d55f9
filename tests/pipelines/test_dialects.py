"""Dialect registry, template files, and our small-model variants (``<name>_small``): answer
extraction, action parsing, parallel-query splitting, format validation. The systems' own
protocols are tested in test_protocols.py."""

from __future__ import annotations

import json

import pytest

from harness.registry import RegistryError
from harness.types import Doc
from pipelines.dialects import (
    DIALECTS,
    TEMPLATE_DIR,
    extract_boxed,
    get_dialect,
    resolve_dialect,
    split_parallel_queries,
)
from pipelines.dialects import SYSTEMS as SYSTEM_REGISTRY

SYSTEMS = set(SYSTEM_REGISTRY.names())


def test_registry_has_every_system_and_small_variants_and_suggests_names():
    small = {n for n in DIALECTS.names() if n.endswith("_small")}
    assert {n.removesuffix("_small") for n in small} <= SYSTEMS  # a small variant keeps a system's tags
    assert set(DIALECTS.names()) == SYSTEMS | small
    assert "search_r1_small" in small and "prorag_small" not in small
    with pytest.raises(RegistryError, match="did you mean 'search_r1'"):
        get_dialect("search_r")


def test_every_system_template_file_cites_its_source():
    for name in SYSTEMS:
        d = get_dialect(name)
        assert d.source["repository"] and len(d.source["commit"]) == 40 and d.source["files"]
        assert (TEMPLATE_DIR / f"{name}.yaml").is_file()


def test_resolve_variant_and_template_file(tmp_path):
    assert resolve_dialect("search_r1", "small").name == "search_r1_small"
    assert resolve_dialect("search_r1_small", "small").name == "search_r1_small"
    with pytest.raises(ValueError, match="variant"):
        resolve_dialect("search_r1", "tiny")
    txt = tmp_path / "mine.txt"
    txt.write_text("Q: {question}\nA:")
    d = resolve_dialect("search_r1", template=str(txt))
    assert d.raw_text("who") == "Q: who?\nA:"  # Search-R1's '?' normalisation still applies
    assert d.messages("who") == [{"role": "user", "content": "Q: who?\nA:"}]
    yml = tmp_path / "mine.yaml"
    yml.write_text("placement: raw\ntemplate: |-\n  Question: {question}\n  Answer:\n")
    d = resolve_dialect("research", template=str(yml))
    assert d.messages("who") is None and d.raw_text("who") == "Question: who\nAnswer:"
    bad = tmp_path / "bad.txt"
    bad.write_text("no field here")
    with pytest.raises(ValueError, match="no {question} field"):
        resolve_dialect("search_r1", template=str(bad))
    with pytest.raises(FileNotFoundError, match="template file not found"):
        resolve_dialect("search_r1", template=str(tmp_path / "missing.yaml"))


def test_research_answer_is_inside_boxed_and_last_answer_wins():
    d = get_dialect("research_small")
    text = "<answer>\\boxed{Paris}</answer> then <answer>I think \\boxed{{Lyon} city}</answer>"
    assert d.extract_answer(text) == "{Lyon} city"
    assert extract_boxed("no box") is None
    assert extract_boxed("\\boxed{a{b}c}") == "a{b}c"


def test_search_r1_extracts_from_response_only():
    d = get_dialect("search_r1_small")
    # The prompt contains an example answer; the response is what is scored.
    assert d.extract_answer("<think>x</think><answer> Beijing </answer>") == "Beijing"
    assert d.extract_answer("no answer here") is None
    assert d.extract_answer("<answer>   </answer>") is None


@pytest.mark.parametrize(
    "text, kind, queries",
    [
        ("<think>hm</think><search> who is X </search>", "search", ("who is X",)),
        ("<think>hm</think><search>   </search>", "invalid", ()),
        ("blah </search>", "invalid", ()),
        ("<answer>Yes</answer>", "answer", ()),
        ("just thinking", "none", ()),
    ],
)
def test_parse_action_search_r1_small(text, kind, queries):
    a = get_dialect("search_r1_small").parse_action(text)
    assert a.kind == kind
    assert a.queries == queries


def test_r1_searcher_tags():
    d = get_dialect("r1_searcher_small")
    a = d.parse_action("I need it. <|begin_of_query|> capital of France <|end_of_query|>")
    assert a.kind == "search" and a.queries == ("capital of France",)
    assert d.stops() == ("<|end_of_query|>", "</answer>")
    assert d.stops(allow_search=False) == ("</answer>",)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("a | b | c", ["a", "b", "c"]),
        ("first query\nsecond query", ["first query", "second query"]),
        ('["q one", "q two"]', ["q one", "q two"]),
        ('"q one", "q two"', ["q one", "q two"]),
        ("who is x?, where is y?", ["who is x?", "where is y?"]),
        # Ambiguous commas are never split.
        ("Paris, Texas population", ["Paris, Texas population"]),
        ("who is x?, Paris, Texas", ["who is x?, Paris, Texas"]),
    ],
)
def test_rag_r1_query_splitting(raw, expected):
    assert split_parallel_queries(raw) == expected


def test_rag_r1_caps_queries_per_turn_and_uses_json_observations():
    d = get_dialect("rag_r1_small")
    assert d.parse_action("<search>a | b | c</search>").queries == ("a", "b", "c")
    too_many = d.parse_action("<search>a | b | c | d</search>")
    assert too_many.kind == "invalid" and "at most 3" in too_many.reason
    obs = d.observation_text(("a", "b"), [[Doc("1", "T1", "x")], [Doc("2", "T2", "y")]])
    body = obs.strip()[len(d.obs_open) : -len(d.obs_close)]
    payload = json.loads(body)
    assert payload["query"] == ["a", "b"]
    assert payload["documents"][0] == "Doc 1(Title: T1) x"


@pytest.mark.parametrize(
    "dialect, text, ok",
    [
        ("research", "<think>a</think><search>q</search>\n<result>\nDoc 1</result>\n<answer>\\boxed{x}</answer>", True),
        ("research", "<think>a</think><answer>x</answer>", False),  # no \boxed{}
        ("search_r1", "<think>a</think><answer>x</answer>", True),
        ("search_r1", "<think>a</think><answer>x</answer> trailing", False),
        ("search_r1", "<think>a<answer>x</answer>", False),  # unbalanced think
        ("search_r1", "<answer>x</answer><answer>y</answer>", False),
        ("r1_searcher", "<|begin_of_query|>q<|end_of_query|><answer>x</answer>", True),
    ],
)
def test_validate_format(dialect, text, ok):
    assert get_dialect(f"{dialect}_small").validate_format(text)[0] is ok


def test_observation_answers_do_not_break_format():
    # An observation may quote text with tags; only model text is checked.
    d = get_dialect("search_r1_small")
    text = "<search>q</search>\n\n<information>\n<answer>fake</answer>\n</information>\n\n<answer>x</answer>"
    assert d.validate_format(text) == (True, "ok")


def test_small_prompt_ids_chat_and_base(byte_tok):
    d = get_dialect("search_r1_small")
    base = byte_tok.decode(d.prompt_ids(byte_tok, "Who?", chat=False))
    assert base.endswith("Question: Who?\n") and "<information>" in base
    chat = byte_tok.decode(d.prompt_ids(byte_tok, "Who?", chat=True))
    assert chat.startswith("<|user|>") and chat.endswith("<|assistant|>\n")
