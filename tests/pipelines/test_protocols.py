"""Each system's protocol against golden renderings written by hand from its own code
(tests/pipelines/golden/): `harness prompt --json` (prompt, messages, observation, stops,
corrective), the turn parser on a released checkpoint's typical turns, answer extraction and the
format check of the system's reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from harness.retrieval.corpus import read_corpus
from pipelines.dialects import SYSTEMS, get_dialect, resolve_dialect
from pipelines.dialects.inspect import describe

GOLDEN = Path(__file__).parent / "golden"
runner = CliRunner()


def golden(name: str) -> dict:
    return yaml.safe_load((GOLDEN / f"{name}.yaml").read_text(encoding="utf-8"))


def prompt_json(*args: str) -> dict:
    result = runner.invoke(app, ["prompt", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


@pytest.mark.parametrize("name", SYSTEMS.names())  # every seed system has its golden files
def test_harness_prompt_matches_the_golden_rendering(name):
    g = golden(name)
    args = ["--method", name, "--question", g["question"], "--docs", str(GOLDEN / "docs.jsonl"), "--model", "none"]
    for q in g["queries"]:
        args += ["--query", q]
    if g.get("mode"):
        args += ["--mode", g["mode"]]
    out = prompt_json(*args)
    assert out["messages"] == g["messages"]
    assert out["text"] == g["text"]
    assert out["observation"] == g["observation"]
    assert out["stops"] == g["stops"]
    assert out["corrective"] == g["corrective"]
    assert out["stop_kept_in_text"] is True and out["chat_template_applied"] is False
    assert out["source"]["commit"] and out["source"]["repository"]


@pytest.mark.parametrize("name", SYSTEMS.names())  # every seed system has its golden files
def test_a_checkpoints_typical_turns_parse_as_the_original_parses_them(name):
    d = resolve_dialect(name, mode=golden(name).get("mode"))
    for case in golden(name)["turns"]:
        action = d.parse_action(case["text"], eos=case["eos"])
        assert action.kind == case["kind"], case["text"]
        if case["kind"] == "search":
            assert list(action.queries) == case["queries"], case["text"]
        if case["kind"] == "answer":
            assert action.answer == case["answer"], case["text"]


@pytest.mark.parametrize("name", SYSTEMS.names())  # every seed system has its golden files
def test_answer_extraction_and_reward_format_check(name):
    d = resolve_dialect(name, mode=golden(name).get("mode"))
    for case in golden(name)["responses"]:
        assert d.extract_answer(case["text"]) == case["answer"], case["text"]
        ok, reason = d.validate_format(case["text"])
        assert ok is case["valid"], (case["text"], reason)


def test_chat_template_is_applied_where_the_system_applies_it(byte_tok):
    # Search-R1/RAG-R1: the prompt is the user message; ReSearch: system + user; R1-Searcher and
    # ProRAG: raw, never templated even when the tokenizer has a chat template.
    q = "who founded Eddavik"
    sr1 = describe(get_dialect("search_r1"), q, byte_tok)
    assert sr1["chat_template_applied"] and sr1["text"].startswith("<|user|>")
    assert sr1["text"].endswith("<|assistant|>\n") and "Question: who founded Eddavik?\n" in sr1["text"]
    rs = describe(get_dialect("research"), q, byte_tok)
    assert rs["text"].startswith("<|system|>\nYou are a helpful assistant")
    assert "<|user|>\nwho founded Eddavik\n" in rs["text"]
    for raw in ("r1_searcher", "prorag"):
        out = describe(get_dialect(raw), q, byte_tok)
        assert not out["chat_template_applied"] and out["messages"] is None
        assert out["text"] == get_dialect(raw).raw_text(q)
    ids = get_dialect("r1_searcher").prompt_ids(byte_tok, q, chat=True)
    assert byte_tok.decode(ids).endswith("\nAssistant: <think>")


def test_corpus_titles_are_kept_verbatim_and_bad_input_is_named(tmp_path):
    docs = read_corpus(GOLDEN / "docs.jsonl")
    assert [(d.id, d.title) for d in docs] == [("d1", '"Eddavik"'), ("d2", '"Mira Solberg"')]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    result = runner.invoke(app, ["prompt", "--method", "search_r1", "-q", "x", "--docs", str(bad), "--model", "none"])
    assert result.exit_code == 2 and "needs 'contents'" in result.output
    result = runner.invoke(app, ["prompt", "--method", "naive", "-q", "x", "--model", "none"])
    assert result.exit_code == 2 and "baseline" in result.output
    result = runner.invoke(app, ["prompt", "--method", "search_r", "-q", "x", "--model", "none"])
    assert result.exit_code == 2 and "search_r1" in result.output


def test_prompt_without_docs_has_null_observation_and_small_variant_shows_our_wording():
    out = prompt_json("--method", "search_r1", "--question", "q", "--model", "none")
    assert out["observation"] is None and out["method"] == "search_r1" and out["model"] is None
    small = prompt_json("--method", "search_r1", "--question", "q", "--model", "none", "--variant", "small")
    assert small["dialect"] == "search_r1_small" and "Work out the answer step by step" in small["text"]


class BosTokenizer:
    """Encodes characters as ids and, like Llama's tokenizer, adds BOS (id 1) when asked for
    special tokens; ``chat_template`` is switchable."""

    def __init__(self, chat_template=None):
        self.chat_template = chat_template

    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_raw_prompts_get_the_tokenizers_bos_as_the_originals_encode_them():
    # R1-Searcher/ProRAG hand vLLM a string (BOS added by the tokenizer); a chat template writes
    # its own special tokens; our small variants keep their old encoding (no special tokens).
    assert get_dialect("r1_searcher").prompt_ids(BosTokenizer("tmpl"), "q", chat=True)[0] == 1
    assert get_dialect("search_r1").prompt_ids(BosTokenizer(None), "q", chat=True)[0] == 1  # no template: raw
    templated = get_dialect("search_r1").prompt_ids(BosTokenizer("tmpl"), "q", chat=True)
    assert templated[0] == ord("<")
    assert get_dialect("search_r1_small").prompt_ids(BosTokenizer(None), "q", chat=False)[0] != 1
