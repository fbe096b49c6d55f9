"""The scripted backend (turn selection, stop cut, length, EOS) and ``BackendBase.generate``,
FlashRAG's generator interface, which every backend inherits."""

from __future__ import annotations

import asyncio
import json

import pytest

from harness.backends.base import BackendBase, Completion, SamplingParams, find_stop, run_sync
from harness.backends.scripted import ScriptedBackend, load_script
from harness.tokenization import byte_tokenizer

TOK = byte_tokenizer()
SCRIPT = [
    {"match": "capital of France", "turns": ["<search>France capital</search>", "<answer>Paris</answer>"]},
    {"match": "France", "turns": ["never used: the entry above matches first"]},
]


def ask(backend, context: str, params: SamplingParams):
    return asyncio.run(backend.agenerate(TOK.encode(context, add_special_tokens=False), params))


def test_turns_follow_what_is_already_in_the_context():
    b = ScriptedBackend(SCRIPT)
    p = SamplingParams(max_new_tokens=100)
    q = "Q: what is the capital of France?\n"
    assert ask(b, q, p).text == "<search>France capital</search>"
    after_search = q + "<search>France capital</search><information>Paris is...</information>"
    assert ask(b, after_search, p).text == "<answer>Paris</answer>"
    assert ask(b, after_search + "<answer>Paris</answer>", p).text == b.default  # script exhausted
    assert ask(b, "something else", p).text == b.default  # no entry matches
    assert b.calls == 4


def test_no_stop_ends_with_eos_kept_in_ids_not_text():
    c = ask(ScriptedBackend(SCRIPT), "capital of France", SamplingParams(max_new_tokens=100, logprobs=True))
    want = TOK.encode("<search>France capital</search>", add_special_tokens=False) + [TOK.eos_token_id]
    assert c.finish_reason == "stop" and c.matched_stop == TOK.eos_token_id and c.stopped_on_eos
    assert c.token_ids == want and c.logprobs == [0.0] * len(want)
    assert c.prompt_tokens == len("capital of France")


def test_stop_string_cuts_and_is_kept():
    b = ScriptedBackend([{"match": "", "turns": ["<think>hm</think><search>q</search> trailing"]}])
    c = ask(b, "x", SamplingParams(max_new_tokens=100, stop=("</answer>", "</search>")))
    assert c.text == "<think>hm</think><search>q</search>" and c.matched_stop == "</search>"
    assert c.stopped_on_string and TOK.decode(c.token_ids) == c.text and c.logprobs is None


def test_max_new_tokens_gives_length():
    c = ask(ScriptedBackend(SCRIPT), "capital of France", SamplingParams(max_new_tokens=5, stop=("</search>",)))
    assert c.finish_reason == "length" and c.matched_stop is None
    assert c.token_ids == TOK.encode("<sear", add_special_tokens=False) and c.text == "<sear"


def test_find_stop_picks_the_earliest_end():
    assert find_stop("ab</s>cd</t>", ["</t>", "</s>"]) == (6, "</s>")
    assert find_stop("abc", ["", "x"]) is None
    assert find_stop("a</s>b</s>", ["</s>"], start=3) == (10, "</s>")


def test_load_script_reads_jsonl_and_names_bad_lines(tmp_path):
    good = tmp_path / "s.jsonl"
    good.write_text(json.dumps(SCRIPT[0]) + "\n\n" + json.dumps({"match": "a", "turns": ["b"], "delay": 0.5}) + "\n")
    entries = load_script(good)
    assert [e.match for e in entries] == ["capital of France", "a"] and entries[1].delay == 0.5
    assert ScriptedBackend(str(good)).script == entries
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(SCRIPT[0]) + "\n" + '{"turns": []}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: bad script entry"):
        load_script(bad)


async def _raise_inside_run_sync():
    async def boom():
        return 1 / 0

    return run_sync(boom())


def test_run_sync_inside_a_running_loop_returns_and_reraises():
    async def main():
        async def one():
            return 1

        return run_sync(one())  # a helper thread runs it: this loop is busy

    assert asyncio.run(main()) == 1
    with pytest.raises(ZeroDivisionError):
        asyncio.run(_raise_inside_run_sync())


def test_update_weights_moves_the_version_and_unknown_backends_refuse():
    from harness.backends.base import WeightUpdate

    b = ScriptedBackend([])
    b.update_weights(WeightUpdate({}, version=3))
    assert b.weight_version == "3"
    with pytest.raises(NotImplementedError, match="weight sync into a 'base' backend"):
        BackendBase().update_weights(WeightUpdate({}, version=1))


def test_base_backend_needs_agenerate():
    with pytest.raises(NotImplementedError):
        asyncio.run(BackendBase().agenerate([1], SamplingParams()))


def test_default_n_samples_are_separate_requests_with_distinct_seeds():
    seen: list[SamplingParams] = []

    class Echo(BackendBase):
        async def agenerate(self, input_ids, params):
            seen.append(params)
            return Completion(token_ids=[1], text="x", finish_reason="length")

    outs = asyncio.run(Echo().agenerate_n([1], SamplingParams(seed=7, temperature=1.0), 3))
    assert len(outs) == 3 and sorted(p.seed for p in seen) == [7, 8, 9]
    with pytest.raises(ValueError, match="n must be at least 1"):
        asyncio.run(Echo().agenerate_n([1], SamplingParams(), 0))


def test_no_logprobs_unless_asked():
    c = ask(ScriptedBackend(SCRIPT), "capital of France", SamplingParams(max_new_tokens=100))
    assert c.logprobs is None and c.token_ids
