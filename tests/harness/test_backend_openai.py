"""The openai backend over real HTTP against replayed vLLM-, SGLang- and llama.cpp-style answers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harness.backends.base import BackendError, SamplingParams
from harness.backends.openai import OpenAIBackend
from harness.tokenization import byte_tokenizer
from tests.harness.conftest import free_port

TOK = byte_tokenizer()


def choice(text, finish="stop", **extra):
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish, **extra}], "usage": {"prompt_tokens": 3}}


def gen(replay, params, **kw):
    b = OpenAIBackend(replay.url + "/v1", tokenizer=TOK, retries=1, backoff=0.01, **kw)

    async def main():
        return await b.agenerate([1, 2, 3], params)

    return asyncio.run(main())


P = SamplingParams(max_new_tokens=20, stop=("</search>", "</answer>"), logprobs=True)


def test_payload(replay):
    replay.push(choice("x", "length"))
    gen(replay, P)
    sent = replay.requests[0]
    assert sent["model"] == "served-model" and sent["prompt"] == [1, 2, 3] and sent["max_tokens"] == 20
    assert sent["stop"] == ["</search>", "</answer>"] and sent["include_stop_str_in_output"] is True
    assert sent["logprobs"] == 1


def test_vllm_style_stop_reason_and_token_ids(replay):
    ids = TOK.encode("<search>q</search>", add_special_tokens=False)
    lp = {"token_logprobs": [-0.5] * len(ids), "tokens": ["x"] * len(ids)}
    replay.push(choice("<search>q</search>", stop_reason="</search>", token_ids=ids, logprobs=lp))
    c = gen(replay, P)
    assert c.finish_reason == "stop" and c.matched_stop == "</search>" and c.token_ids == ids
    assert c.logprobs == [-0.5] * len(ids)


def test_vllm_eos_has_null_stop_reason(replay):
    replay.push(choice("done", stop_reason=None))
    c = gen(replay, P)
    assert c.stopped_on_eos and c.token_ids[-1] == TOK.eos_token_id and c.text == "done"


def test_sglang_style_matched_stop_trimmed_text_is_restored(replay):
    recorded = json.loads((Path(__file__).parents[1] / "fixtures/sglang_recorded/v1_completions.json").read_text())
    assert "matched_stop" in recorded["choices"][0]  # the real SGLang schema names the field so
    replay.push(choice("<answer>Paris", matched_stop="</answer>"))
    c = gen(replay, P)
    assert c.text == "<answer>Paris</answer>" and c.matched_stop == "</answer>"
    assert TOK.decode(c.token_ids) == c.text  # ids re-encoded from the text when not returned


def test_llama_cpp_style_without_matched_stop(replay):
    replay.push(choice("<search>q</search>"))  # stop kept in text: inferred
    replay.push(choice("no tags here"))  # nothing to infer from: EOS
    assert gen(replay, P).matched_stop == "</search>"
    assert gen(replay, P).stopped_on_eos


def test_length_and_malformed(replay):
    replay.push(choice("abc", "length"))
    assert gen(replay, P).finish_reason == "length"
    replay.push({"nope": 1})
    with pytest.raises(BackendError, match="malformed completions response"):
        gen(replay, P)


def test_unreachable_server_fails_fast():
    with pytest.raises(BackendError, match="no healthy openai server"):
        OpenAIBackend(f"http://127.0.0.1:{free_port()}", tokenizer=TOK)


def test_vllm_eos_in_returned_ids_is_the_matched_id(replay):
    ids = TOK.encode("done", add_special_tokens=False) + [TOK.eos_token_id]
    replay.push(choice("done", stop_reason=None, token_ids=ids))
    c = gen(replay, P)
    assert c.matched_stop == TOK.eos_token_id and c.token_ids == ids and c.text == "done"


def test_vllm_eos_without_ids_gets_the_eos_id_appended(replay):
    replay.push(choice("done", stop_reason=None))
    c = gen(replay, P)
    assert c.matched_stop == TOK.eos_token_id and c.token_ids[-1] == TOK.eos_token_id
    assert c.token_ids[:-1] == TOK.encode("done", add_special_tokens=False)


def test_sglang_style_stop_token_id(replay):
    replay.push(choice("x", matched_stop=7))
    c = gen(replay, P.with_(stop_token_ids=(7,)))
    assert c.matched_stop == 7 and c.token_ids[-1] == 7 and c.stopped_on_eos


def test_trimmed_stop_missing_from_returned_ids_is_restored(replay):
    # A vLLM that ignored include_stop_str_in_output: text and ids both lack the stop string.
    ids = TOK.encode("<answer>Paris", add_special_tokens=False)
    lp = {"token_logprobs": [-0.25] * len(ids)}
    replay.push(choice("<answer>Paris", stop_reason="</answer>", token_ids=ids, logprobs=lp))
    c = gen(replay, P)
    assert c.text == "<answer>Paris</answer>" and TOK.decode(c.token_ids) == c.text
    assert c.logprobs == [-0.25] * len(ids) + [0.0] * len("</answer>")  # restored tokens: no logprob


def test_5xx_is_retried_and_the_api_key_is_sent(replay):
    replay.push({"error": "busy"}, status=503)
    replay.push(choice("abc", "length"))
    c = gen(replay, P, api_key="sk-test")
    assert c.finish_reason == "length" and len(replay.requests) == 2
    assert replay.headers[-1]["authorization"] == "Bearer sk-test"


def test_unhealthy_server_fails_fast(replay):
    replay.healthy = False
    with pytest.raises(BackendError, match=r"no healthy openai server at .*answered 503 on /v1/models"):
        OpenAIBackend(replay.url, tokenizer=TOK)


def test_n_choices_in_index_order(replay):
    body = choice("b</search>", stop_reason="</search>")
    body["choices"] = [{**body["choices"][0], "index": 1}, {**choice("a", "length")["choices"][0], "index": 0}]
    replay.push(body)
    b = OpenAIBackend(replay.url, tokenizer=TOK, retries=1, backoff=0.01)
    outs = asyncio.run(b.agenerate_n([1, 2, 3], P, 2))
    assert replay.requests[0]["n"] == 2
    assert [(c.text, c.finish_reason) for c in outs] == [("a", "length"), ("b</search>", "stop")]
    replay.push(choice("only one"))
    with pytest.raises(BackendError, match="n=2"):
        asyncio.run(b.agenerate_n([1, 2, 3], P, 2))


def test_context_limit_is_what_the_server_serves(replay):
    # vLLM started with --max-model-len 2048 says so on /v1/models (seen on vLLM 0.32 and SGLang 0.5.23).
    replay.models = [{"id": "m", "max_model_len": 2048}]
    assert OpenAIBackend(replay.url, tokenizer=TOK).max_context == 2048
    assert OpenAIBackend(replay.url, tokenizer=TOK, max_context=1000).max_context == 1000  # the user's wins
    replay.models = [{"id": "m"}]  # llama.cpp-style: nothing reported → the tokenizer's limit or 32768
    limit = getattr(TOK, "model_max_length", 0)
    assert OpenAIBackend(replay.url, tokenizer=TOK).max_context == (limit if 0 < limit <= 1 << 20 else 32768)


def test_no_logprobs_asked_or_kept_unless_requested(replay):
    ids = TOK.encode("<search>q</search>", add_special_tokens=False)
    lp = {"token_logprobs": [-0.5] * len(ids)}  # a server that sends them anyway
    replay.push(choice("<search>q</search>", stop_reason="</search>", token_ids=ids, logprobs=lp))
    c = gen(replay, P.with_(logprobs=False))
    assert "logprobs" not in replay.requests[0] and c.logprobs is None and c.token_ids == ids
