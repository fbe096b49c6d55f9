"""The sglang backend over real HTTP against recorded SGLang 0.5.23 responses (replayed)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fastapi import FastAPI, Request

from harness.backends.base import BackendError, SamplingParams
from harness.backends.sglang import SGLangBackend
from tests.harness.conftest import ServerThread, free_port
from tests.helpers.replay_server import Replay

REC = Path(__file__).resolve().parents[1] / "fixtures" / "sglang_recorded"


def rec(name: str) -> dict:
    return json.loads((REC / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def smol_tokenizer():
    from transformers import AutoTokenizer

    from harness.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))


def backend(replay, tok, **kw):
    kw.setdefault("retries", 2)
    kw.setdefault("backoff", 0.01)
    return SGLangBackend(replay.url, tokenizer=tok, **kw)


def run(b, params, n=1, ids=(1, 2, 3)):
    async def main():
        return await asyncio.gather(*(b.agenerate(list(ids), params) for _ in range(n)))

    return asyncio.run(main())


def test_payload_keeps_stops_untrimmed(replay, smol_tokenizer):
    replay.push(rec("stop_trim"))
    b = backend(replay, smol_tokenizer)
    run(b, SamplingParams(max_new_tokens=40, stop=("Three:",), logprobs=True))
    sent = replay.requests[0]
    assert sent["input_ids"] == [1, 2, 3] and sent["return_logprob"] is True
    assert sent["sampling_params"]["no_stop_trim"] is True and sent["sampling_params"]["stop"] == ["Three:"]


@pytest.mark.parametrize("name", ["stop_trim", "stop_notrim"])
def test_matched_stop_string_is_kept(replay, smol_tokenizer, name):
    replay.push(rec(name))
    (c,) = run(backend(replay, smol_tokenizer), SamplingParams(max_new_tokens=40, stop=("Three:",), logprobs=True))
    assert c.finish_reason == "stop" and c.matched_stop == "Three:"
    assert c.text.endswith("Three:") and c.token_ids == rec(name)["output_ids"]
    assert len(c.logprobs) == len(c.token_ids) and c.logprobs[0] == pytest.approx(-2.0689642429351807)
    assert c.weight_version == "default" and c.prompt_tokens == 39


def test_stop_ending_inside_a_token_keeps_the_whole_token(replay, smol_tokenizer):
    replay.push(rec("stop_mid"))
    (c,) = run(backend(replay, smol_tokenizer), SamplingParams(max_new_tokens=40, stop=("hre",)))
    assert c.matched_stop == "hre" and c.text.endswith("Three")  # SGLang's text says "Thre"


def test_eos_is_matched_as_token_id(replay, smol_tokenizer):
    replay.push(rec("eos"))
    (c,) = run(backend(replay, smol_tokenizer), SamplingParams(max_new_tokens=200))
    assert c.finish_reason == "stop" and c.matched_stop == 2 and c.stopped_on_eos
    assert c.token_ids[-1] == 2 and "<|im_end|>" not in c.text


def test_length_and_abort(replay, smol_tokenizer):
    replay.push(rec("length"))
    abort = rec("length")
    abort["meta_info"]["finish_reason"] = {"type": "abort", "message": "client disconnected"}
    replay.push(abort)
    b = backend(replay, smol_tokenizer)
    (c,) = run(b, SamplingParams(max_new_tokens=5))
    assert c.finish_reason == "length" and c.matched_stop is None and len(c.token_ids) == 5
    (a,) = run(b, SamplingParams(max_new_tokens=5))
    assert a.finish_reason == "abort" and a.meta["message"] == "client disconnected"


def test_stop_tokens_missing_from_output_ids_are_restored(replay, smol_tokenizer):
    body = rec("stop_trim")
    body["output_ids"] = body["output_ids"][:-2]  # a server that also trimmed the ids
    replay.push(body)
    (c,) = run(backend(replay, smol_tokenizer), SamplingParams(max_new_tokens=40, stop=("Three:",)))
    assert c.text.endswith("Three:")


def test_5xx_is_retried_then_succeeds(replay, smol_tokenizer):
    replay.push({"error": "busy"}, status=503)
    replay.push({"error": "busy"}, status=500)
    replay.push(rec("length"))
    (c,) = run(backend(replay, smol_tokenizer, retries=2), SamplingParams(max_new_tokens=5))
    assert c.finish_reason == "length" and len(replay.requests) == 3


def test_persistent_5xx_and_timeouts_raise_backend_error(replay, smol_tokenizer):
    for _ in range(3):
        replay.push({"error": "down"}, status=502)
    with pytest.raises(BackendError, match=r"failed after 3 attempts: .*HTTP 502"):
        run(backend(replay, smol_tokenizer), SamplingParams(max_new_tokens=5))
    for _ in range(2):
        replay.push(rec("length"), delay=1.0)
    with pytest.raises(BackendError, match="timed out"):
        run(backend(replay, smol_tokenizer, retries=1, timeout=0.2), SamplingParams(max_new_tokens=5))


def test_4xx_is_not_retried(replay, smol_tokenizer):
    replay.push({"detail": "bad"}, status=400)
    with pytest.raises(BackendError, match="rejected the request"):
        run(backend(replay, smol_tokenizer), SamplingParams(max_new_tokens=5))
    assert len(replay.requests) == 1


def test_concurrency_limit_is_respected(replay, smol_tokenizer):
    replay.default = {"body": rec("length"), "status": 200, "delay": 0.1}
    b = backend(replay, smol_tokenizer, max_concurrency=3, batch_window_ms=0)  # one POST per request
    run(b, SamplingParams(max_new_tokens=5), n=10)
    assert replay.peak == 3


def test_health_check_fails_fast_with_a_clear_message(smol_tokenizer):
    with pytest.raises(
        BackendError, match=r"no healthy sglang server at http://127.0.0.1:\d+: unreachable.*launch_server"
    ):
        SGLangBackend(f"http://127.0.0.1:{free_port()}", tokenizer=smol_tokenizer)


def test_round_robin_over_several_servers(smol_tokenizer):
    a, b = Replay(), Replay()
    a.default = b.default = {"body": rec("length"), "status": 200, "delay": 0}
    with ServerThread(a.app()) as sa, ServerThread(b.app()) as sb:
        be = SGLangBackend([sa.url, sb.url], tokenizer=smol_tokenizer, batch_window_ms=0)
        run(be, SamplingParams(max_new_tokens=5), n=6)
    assert len(a.requests) == 3 and len(b.requests) == 3


def test_update_weights_from_disk(replay, smol_tokenizer):
    replay.push(rec("update"))
    b = backend(replay, smol_tokenizer)
    out = asyncio.run(b.update_weights_from_disk("/ckpt/step-1", "1"))
    assert replay.requests[-1] == {"model_path": "/ckpt/step-1", "weight_version": "1", "flush_cache": True}
    assert list(out.values())[0]["success"] is True


def test_a_weight_update_waits_longer_than_a_generation_attempt(replay, smol_tokenizer):
    """A drain holds the update until the requests in flight end, which may take longer than the
    generation's per-attempt timeout: the update has its own (``sync_timeout``), and a server
    that outlasts it is a BackendError naming the route, not a bare httpx exception."""
    replay.push(rec("update"), delay=0.6)
    b = backend(replay, smol_tokenizer, timeout=0.2)
    out = asyncio.run(b.update_weights_from_disk("/ckpt/step-2", "2"))
    assert list(out.values())[0]["success"] is True
    replay.push(rec("update"), delay=0.6)
    b.sync_timeout = 0.2
    with pytest.raises(BackendError, match=r"/update_weights_from_disk: ReadTimeout \(sync_timeout 0.2 s\)"):
        asyncio.run(b.update_weights_from_disk("/ckpt/step-3", "3"))


def test_every_sync_route_waits_sync_timeout_and_fails_as_a_backend_error(replay, smol_tokenizer, tmp_path):
    """The other weight-sync routes (LoRA, the distributed update's session, pause) share the
    update's timeout, not the generation's, and a server that outlasts it is a BackendError
    naming the route."""
    b = backend(replay, smol_tokenizer, timeout=0.2)
    replay.push({"success": True}, delay=0.6)
    b._post_ok(replay.url, "/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)})
    replay.push({}, delay=0.6)
    b.begin_weight_update()
    b.sync_timeout = 0.2
    replay.push({"success": True}, delay=0.6)
    with pytest.raises(BackendError, match=r"/load_lora_adapter: ReadTimeout \(sync_timeout 0.2 s\)"):
        b.update_lora_adapter(tmp_path, 1)
    replay.push({}, delay=0.6)
    with pytest.raises(BackendError, match=r"/begin_weight_update: ReadTimeout \(sync_timeout 0.2 s\)"):
        b.begin_weight_update()


def test_unhealthy_server_fails_fast(replay, smol_tokenizer):
    replay.healthy = False
    with pytest.raises(BackendError, match=r"no healthy sglang server at .*answered 503 on /health"):
        SGLangBackend(replay.url, tokenizer=smol_tokenizer)


def test_tokenizer_comes_from_model_info(replay, tmp_path):
    from harness.tokenization import byte_tokenizer

    byte_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    replay.model_info = {"model_path": str(tmp_path)}
    b = SGLangBackend(replay.url)
    assert b.model_path == str(tmp_path) and len(b.tokenizer) == len(byte_tokenizer())
    replay.model_info = {"model_path": "/only/on/the/server/machine"}
    with pytest.raises(BackendError, match="cannot load the tokenizer .*pass model="):
        SGLangBackend(replay.url)


def test_eos_missing_from_output_ids_is_appended(replay, smol_tokenizer):
    body = rec("eos")
    body["output_ids"] = body["output_ids"][:-1]
    replay.push(body)
    (c,) = run(backend(replay, smol_tokenizer), SamplingParams(max_new_tokens=200))
    assert c.token_ids == rec("eos")["output_ids"] and c.meta["restored_tokens"] == 1


def test_logprobs_are_parsed_only_when_asked(replay, smol_tokenizer):
    body = rec("logprob")
    want = [x[0] for x in body["meta_info"]["output_token_logprobs"]]
    assert [x[1] for x in body["meta_info"]["output_token_logprobs"]] == body["output_ids"]
    replay.push(body)
    replay.push(body)
    b = backend(replay, smol_tokenizer)
    (c,) = run(b, SamplingParams(max_new_tokens=4, logprobs=True))
    assert c.finish_reason == "length" and c.logprobs == want and len(c.token_ids) == 4
    (c,) = run(b, SamplingParams(max_new_tokens=4))
    assert c.logprobs is None


def test_n_samples_are_one_request_answered_with_a_list(replay, smol_tokenizer):
    replay.push([rec("logprob"), rec("length")])
    b = backend(replay, smol_tokenizer)
    outs = asyncio.run(b.agenerate_n([1, 2, 3], SamplingParams(max_new_tokens=4, temperature=1.0, logprobs=True), 2))
    assert len(replay.requests) == 1 and replay.requests[0]["sampling_params"]["n"] == 2
    assert [c.token_ids for c in outs] == [rec("logprob")["output_ids"], rec("length")["output_ids"]]
    replay.push([rec("length")])  # fewer samples than asked: an error, never silently short
    with pytest.raises(BackendError, match="n=2"):
        asyncio.run(b.agenerate_n([1, 2, 3], SamplingParams(max_new_tokens=4), 2))


def test_context_limit_comes_from_the_server(replay, smol_tokenizer):
    replay.models = [{"id": "m", "max_model_len": 4096}]
    assert backend(replay, smol_tokenizer).max_context == 4096
    replay.models = []  # nothing served: the tokenizer's limit, here the "no limit" sentinel → 32768
    assert smol_tokenizer.model_max_length > 1 << 20 and backend(replay, smol_tokenizer).max_context == 32768


def test_weight_updates_go_to_the_workers_behind_a_router(smol_tokenizer, tmp_path):
    """Rollouts go through the router URL; sglang-router does not forward weight updates, so the
    backend posts them to every worker the router lists on /list_workers ({"urls": [...]})."""
    from fastapi import FastAPI

    from harness.backends.base import WeightUpdate
    from tests.helpers.sglang_standin import SGLangStandIn

    workers = [SGLangStandIn(), SGLangStandIn()]
    with ServerThread(workers[0].app()) as w0, ServerThread(workers[1].app()) as w1:
        router = FastAPI()
        router.get("/health")(lambda: {})
        router.get("/list_workers")(lambda: {"urls": [w0.url, w1.url + "/"]})
        with ServerThread(router) as r:
            b = SGLangBackend(r.url, tokenizer=smol_tokenizer, health_check=False, max_context=512)
            assert b.sync_urls() == [w0.url, w1.url] and b.urls == [r.url]
            (tmp_path / "m").mkdir()
            b.update_weights(WeightUpdate(str(tmp_path / "m"), 3))
    for w in workers:
        assert [c[0] for c in w.calls] == ["/update_weights_from_disk", "/flush_cache"]
        assert w.calls[0][1]["weight_version"] == "3"


def test_evaluation_asks_sglang_for_no_logprobs(replay, smol_tokenizer):
    body = rec("stop_trim")  # a server that sends logprobs anyway: they are not kept
    replay.push(body)
    (c,) = run(backend(replay, smol_tokenizer), SamplingParams(max_new_tokens=40, stop=("Three:",)))
    assert replay.requests[0]["return_logprob"] is False and c.logprobs is None


def batch_answer(request):
    """What SGLang answers a batched /generate: one recorded answer per entry, in order, each
    marked with the entry's first input id so the test can check the order."""
    out = []
    for ids, logprob in zip(request["input_ids"], request["return_logprob"], strict=True):
        one = rec("length")
        one["meta_info"]["prompt_tokens"] = ids[0]
        if logprob:  # SGLang adds logprobs only to the entries that asked
            one["meta_info"]["output_token_logprobs"] = [[-0.5, t, None] for t in one["output_ids"]]
        out.append(one)
    return out


class BatchReplay(Replay):
    """Replay that answers a batched /generate with a list (as SGLang does), else the recording."""

    def app(self):
        app = FastAPI()

        @app.get("/health")
        async def health():
            return {}

        @app.post("/generate")
        async def generate(request: Request):
            body = await request.json()
            self.requests.append(body)
            await asyncio.sleep(self.default_delay)
            if isinstance(body["input_ids"][0], list):
                return batch_answer(body)
            one = rec("length")
            one["meta_info"]["prompt_tokens"] = body["input_ids"][0]
            return one

        return app


@pytest.fixture
def batch_server():
    r = BatchReplay()
    r.default_delay = 0.0
    with ServerThread(r.app()) as server:
        r.url = server.url
        yield r


def test_requests_ready_together_go_out_as_one_batched_generate(batch_server, smol_tokenizer):
    b = SGLangBackend(batch_server.url, tokenizer=smol_tokenizer, batch_window_ms=20, max_batch=4)
    params = [SamplingParams(max_new_tokens=5, logprobs=i % 2 == 0, stop=(f"s{i}",)) for i in range(6)]

    async def main():
        return await asyncio.gather(*(b.agenerate([100 + i, 7], p) for i, p in enumerate(params)))

    out = asyncio.run(main())
    # 6 requests at once, at most 4 per POST: a batch of 4, then one of 2 (from the same flush)
    assert [len(r["input_ids"]) for r in batch_server.requests] == [4, 2]
    first = batch_server.requests[0]
    assert first["input_ids"] == [[100, 7], [101, 7], [102, 7], [103, 7]]
    assert first["return_logprob"] == [True, False, True, False]  # each request's own
    assert [sp["stop"] for sp in first["sampling_params"]] == [["s0"], ["s1"], ["s2"], ["s3"]]
    assert all(sp["no_stop_trim"] and sp["max_new_tokens"] == 5 for sp in first["sampling_params"])
    # every caller gets its own answer, in order
    assert [c.prompt_tokens for c in out] == [100 + i for i in range(6)]
    assert all(c.finish_reason == "length" and len(c.token_ids) == 5 for c in out)
    assert [c.logprobs is not None for c in out] == [True, False] * 3
    assert b.posts == 2


def test_a_lone_request_waits_at_most_the_window_and_goes_out_unbatched(batch_server, smol_tokenizer):
    b = SGLangBackend(batch_server.url, tokenizer=smol_tokenizer, batch_window_ms=5, max_batch=8)

    async def main():
        first = await b.agenerate([1, 2], SamplingParams(max_new_tokens=5))
        await asyncio.sleep(0.05)  # the next one is not ready within the window: its own POST
        second = await b.agenerate([3, 4], SamplingParams(max_new_tokens=5))
        return first, second

    first, second = asyncio.run(main())
    assert [r["input_ids"] for r in batch_server.requests] == [[1, 2], [3, 4]]  # plain, not lists of lists
    assert first.prompt_tokens == 1 and second.prompt_tokens == 3


def test_batching_off_sends_one_generate_per_request(batch_server, smol_tokenizer):
    b = SGLangBackend(batch_server.url, tokenizer=smol_tokenizer, batch_window_ms=0)
    run(b, SamplingParams(max_new_tokens=5), n=5)
    assert len(batch_server.requests) == 5 and all(r["input_ids"] == [1, 2, 3] for r in batch_server.requests)


def test_a_failed_batch_fails_each_of_its_requests(replay, smol_tokenizer):
    replay.push({"detail": "bad"}, status=400)
    b = backend(replay, smol_tokenizer, batch_window_ms=20)

    async def main():
        return await asyncio.gather(
            *(b.agenerate([i], SamplingParams(max_new_tokens=5)) for i in range(3)), return_exceptions=True
        )

    out = asyncio.run(main())
    assert len(replay.requests) == 1 and replay.requests[0]["input_ids"] == [[0], [1], [2]]
    assert all(isinstance(e, BackendError) and "rejected" in str(e) for e in out)


def test_a_batch_answered_with_the_wrong_count_is_an_error(replay, smol_tokenizer):
    replay.push([rec("length")])  # one answer for two requests
    b = backend(replay, smol_tokenizer, batch_window_ms=20)

    async def main():
        return await asyncio.gather(
            *(b.agenerate([i], SamplingParams(max_new_tokens=5)) for i in range(2)), return_exceptions=True
        )

    assert all(isinstance(e, BackendError) and "got 1 answers" in str(e) for e in asyncio.run(main()))


def test_batching_is_configured_from_the_backend_config(batch_server):
    from harness.config import from_dict
    from harness.eval_config import BackendConfig

    cfg = from_dict(BackendConfig, {"kind": "sglang", "url": [batch_server.url]})
    assert SGLangBackend.from_config(cfg).batch_window_s == 0  # off by default
    cfg = from_dict(
        BackendConfig, {"kind": "sglang", "url": [batch_server.url], "max_batch_size": 32, "batch_window_ms": 2}
    )
    b = SGLangBackend.from_config(cfg)
    assert b.batch_window_s == pytest.approx(0.002) and b.max_batch == 32
    with pytest.raises(ValueError, match="batch_window_ms"):
        from_dict(BackendConfig, {"kind": "sglang", "batch_window_ms": -1})


@pytest.mark.parametrize("in_flight", ["drain", "pause"])
def test_an_update_that_pauses_requests_in_flight_retracts_and_continues_them(smol_tokenizer, tmp_path, in_flight):
    """``in_flight=pause``: /pause_generation (retract: running requests go back to the queue
    with their tokens) → the update → /flush_cache → /continue_generation; ``drain``: the update
    alone (SGLang's model-update lock waits for the requests in flight)."""
    from harness.backends.base import WeightUpdate
    from tests.helpers.sglang_standin import SGLangStandIn

    w = SGLangStandIn()
    with ServerThread(w.app()) as srv:
        b = SGLangBackend(srv.url, tokenizer=smol_tokenizer, health_check=False, max_context=512)
        (tmp_path / "m").mkdir()
        b.update_weights(WeightUpdate(str(tmp_path / "m"), 4, in_flight=in_flight))
    names = [c[0] for c in w.calls]
    if in_flight == "pause":
        assert names == ["/pause_generation", "/update_weights_from_disk", "/flush_cache", "/continue_generation"]
        assert w.of("/pause_generation") == [{"mode": "retract"}]
        assert w.of("/continue_generation") == [{"torch_empty_cache": False}]  # no CUDA call on a CPU server
    else:
        assert names == ["/update_weights_from_disk", "/flush_cache"]
    assert b.weight_version == "4"
