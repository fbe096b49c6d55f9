"""The in-process hf backend: parity with transformers' generate, dynamic batching, stops,
EOS, length, logprobs, sampling seeds, weight updates; and the real embedded SmolLM2 (slow)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from harness.backends.base import SamplingParams, WeightUpdate
from harness.backends.hf import HFBackend
from harness.tokenization import byte_tokenizer
from tests.helpers.models import random_llama


def _tiny_llama(tok, seed, max_positions):
    """A random 2-layer Llama over the byte tokenizer."""
    special = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id}
    return random_llama(len(tok), seed, max_position_embeddings=max_positions, **special)


@pytest.fixture(scope="module")
def tiny():
    tok = byte_tokenizer()
    model = _tiny_llama(tok, seed=0, max_positions=256)
    backend = HFBackend(model_obj=model, tokenizer=tok, max_batch_size=8)
    yield backend, model, tok
    backend.close()


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def gather(backend, prompts, params):
    async def main():
        return await asyncio.gather(*(backend.agenerate(p, params) for p in prompts))

    return asyncio.run(main())


def test_greedy_equals_transformers_generate_and_batching_equals_singles(tiny):
    backend, model, tok = tiny
    prompts = [ids(tok, t) for t in ("hello world", "a", "the quick brown fox", "xyz", "1 2 3 4 5 6 7 8")]
    params = SamplingParams(max_new_tokens=12)
    singles = [gather(backend, [p], params)[0] for p in prompts]
    batched = gather(backend, prompts, params)
    for p, s, b in zip(prompts, singles, batched, strict=True):
        ref = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[0, len(p) :].tolist()
        assert s.token_ids == ref
        assert b.token_ids == s.token_ids
        assert s.finish_reason == "length" and s.matched_stop is None and s.prompt_tokens == len(p)


def test_stop_strings_eos_and_logprobs(tiny):
    backend, _, tok = tiny
    p = ids(tok, "hello world")
    free = gather(backend, [p], SamplingParams(max_new_tokens=12, logprobs=True))[0]
    assert len(free.logprobs) == 12 and all(lp <= 0 for lp in free.logprobs)
    # Use a piece of what greedy decoding produces as a stop string: it must stop right there.
    stop = free.text[3:5]
    hit = gather(backend, [p], SamplingParams(max_new_tokens=12, stop=(stop,)))[0]
    assert hit.finish_reason == "stop" and hit.matched_stop == stop
    assert hit.text.endswith(stop) and hit.token_ids == free.token_ids[: len(hit.token_ids)]
    # A stop token id (as EOS would be) ends the row and is kept in token_ids.
    eos_like = free.token_ids[2]
    tok_stop = gather(backend, [p], SamplingParams(max_new_tokens=12, stop_token_ids=(eos_like,)))[0]
    assert tok_stop.finish_reason == "stop" and tok_stop.matched_stop == eos_like
    assert tok_stop.token_ids == free.token_ids[:3]


def test_mixed_batch_rows_finish_apart_and_match_singles(tiny):
    # Rows with different budgets and stops leave the batch (and its KV cache) at different steps;
    # the rows left must decode exactly as they would alone.
    backend, _, tok = tiny
    prompts = [ids(tok, t) for t in ("hello world", "a", "the quick brown fox", "xyz", "1 2 3")]
    free = gather(backend, [prompts[0]], SamplingParams(max_new_tokens=12))[0]
    params = [
        SamplingParams(max_new_tokens=12, stop=(free.text[2:4],)),
        SamplingParams(max_new_tokens=2),
        SamplingParams(max_new_tokens=16, logprobs=True),
        SamplingParams(max_new_tokens=5),
        SamplingParams(max_new_tokens=9, logprobs=True),
    ]

    async def batched():
        return await asyncio.gather(*(backend.agenerate(p, sp) for p, sp in zip(prompts, params, strict=True)))

    before = backend.batches_run
    together = asyncio.run(batched())
    assert backend.batches_run == before + 1  # all five shared one batch
    for p, sp, b in zip(prompts, params, together, strict=True):
        alone = gather(backend, [p], sp)[0]
        assert b.token_ids == alone.token_ids and b.finish_reason == alone.finish_reason
        if sp.logprobs:
            assert b.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    assert together[0].finish_reason == "stop" and len(together[1].token_ids) == 2
    assert [len(c.token_ids) for c in together[2:]] == [16, 5, 9]


def test_config_eos_ends_a_row_with_that_id(tiny):
    import copy

    backend, model, tok = tiny
    p = ids(tok, "hello world")
    free = gather(backend, [p], SamplingParams(max_new_tokens=12))[0]
    eos = free.token_ids[3]
    assert eos not in free.token_ids[:3]  # the random model's 4th token is new (else pick another)
    other = copy.deepcopy(model)
    other.config.eos_token_id = eos
    other.generation_config.eos_token_id = [eos]
    b2 = HFBackend(model_obj=other, tokenizer=tok)
    try:
        c = gather(b2, [p], SamplingParams(max_new_tokens=12))[0]
    finally:
        b2.close()
    assert c.finish_reason == "stop" and c.matched_stop == eos and c.stopped_on_eos
    assert c.token_ids == free.token_ids[:4]


def test_a_cancelled_request_does_not_break_its_batch(tiny):
    from concurrent.futures import Future

    from harness.backends.hf import _Request

    backend, _, tok = tiny
    p = ids(tok, "hello world")
    # Deterministically: a row whose caller has gone is dropped, and the others are still answered.
    gone, kept = _Request(p, SamplingParams(max_new_tokens=4), Future()), _Request(p, SamplingParams(6), Future())
    gone.future.cancel()
    with backend._lock:
        backend._decode([gone, kept])
    assert len(kept.future.result(timeout=0).token_ids) == 6 and gone.out == []

    # Through asyncio: cancelling an awaiting task leaves the backend serving.
    async def main():
        slow = asyncio.ensure_future(backend.agenerate(p, SamplingParams(max_new_tokens=200)))
        ok = asyncio.ensure_future(backend.agenerate(p, SamplingParams(max_new_tokens=30)))
        await asyncio.sleep(0.05)
        slow.cancel()
        return await ok

    assert len(asyncio.run(main()).token_ids) == 30
    assert gather(backend, [p], SamplingParams(max_new_tokens=3))[0].finish_reason == "length"


def test_loads_a_saved_safetensors_directory(tiny, tmp_path):
    backend, model, tok = tiny
    model.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    p = ids(tok, "hello world")
    loaded = HFBackend(model=str(tmp_path), max_batch_size=2)
    try:
        assert loaded.max_context == 256 and loaded.model_path == str(tmp_path)
        got = gather(loaded, [p], SamplingParams(max_new_tokens=6))[0]
    finally:
        loaded.close()
    assert got.token_ids == gather(backend, [p], SamplingParams(max_new_tokens=6))[0].token_ids


def test_sampling_is_seeded_per_request(tiny):
    backend, _, tok = tiny
    p = ids(tok, "seed")
    a = gather(backend, [p, ids(tok, "other")], SamplingParams(max_new_tokens=10, temperature=1.0, seed=5))[0]
    b = gather(backend, [p], SamplingParams(max_new_tokens=10, temperature=1.0, seed=5))[0]
    c = gather(backend, [p], SamplingParams(max_new_tokens=10, temperature=1.0, seed=6))[0]
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_flashrag_interface_keeps_the_stop(tiny):
    from pipelines.flashrag_compat import FlashRAGGenerator

    backend, _, tok = tiny
    gen = FlashRAGGenerator(backend)
    free = gen.generate(["hello world"], max_tokens=12)[0]
    out = gen.generate(["hello world", "a"], stop=[free[3:5]], max_tokens=12)
    assert out[0].endswith(free[3:5])
    texts, scores = gen.generate(["a"], return_scores=True, max_tokens=4)
    assert len(scores[0]) == 4 and all(0 < s <= 1 for s in scores[0])


def test_update_weights_changes_outputs_and_version(tiny, tmp_path):
    from safetensors.torch import save_file

    backend, model, tok = tiny
    p = ids(tok, "hello world")
    before = gather(backend, [p], SamplingParams(max_new_tokens=8))[0]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    changed = {k: (v + 0.5 * torch.randn_like(v) if v.dim() == 2 else v) for k, v in state.items()}
    save_file({k: v.contiguous() for k, v in changed.items() if k != "lm_head.weight"}, str(tmp_path / "m.safetensors"))
    backend.update_weights(WeightUpdate(tmp_path, version=7))
    after = gather(backend, [p], SamplingParams(max_new_tokens=8))[0]
    assert after.weight_version == "7" and after.token_ids != before.token_ids
    backend.update_weights(WeightUpdate(state, version=8))
    assert gather(backend, [p], SamplingParams(max_new_tokens=8))[0].token_ids == before.token_ids


def test_errors_reach_the_caller(tiny):
    from harness.backends.base import BackendError

    backend, _, tok = tiny
    with pytest.raises(BackendError, match="does not fit"):
        gather(backend, [[1] * 300], SamplingParams(max_new_tokens=2))


@pytest.mark.slow
def test_embedded_smollm2_end_to_end():
    backend = HFBackend()  # converts the GGUF once, then loads from the cache
    try:
        tok = backend.tokenizer
        assert tok.chat_template and "smollm2-135m-instruct" in backend.model_path
        chat = tok.apply_chat_template([{"role": "user", "content": "Name a colour."}], add_generation_prompt=True)
        chat = chat["input_ids"] if hasattr(chat, "keys") else chat
        singles = [gather(backend, [list(chat)], SamplingParams(max_new_tokens=16))[0] for _ in range(2)]
        batch = gather(backend, [list(chat)] * 4, SamplingParams(max_new_tokens=16))
        assert singles[0].text.strip()
        assert all(b.token_ids == singles[0].token_ids for b in batch)
    finally:
        backend.close()


def test_rows_admitted_mid_decode_match_singles(tiny):
    # Continuous batching, driven step by step: rows join a running batch (their cache padded to
    # the running one's length), rows leave it, and every row decodes exactly as it would alone.
    from concurrent.futures import Future

    from harness.backends.hf import _Request, _Running

    backend, _, tok = tiny
    specs = [
        ("the quick brown fox", SamplingParams(max_new_tokens=20, logprobs=True)),
        ("a", SamplingParams(max_new_tokens=6)),
        ("1 2 3 4 5 6 7 8 9 10 11 12", SamplingParams(max_new_tokens=9, logprobs=True)),
        ("xyz", SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)),
        ("hello world", SamplingParams(max_new_tokens=4)),
    ]
    alone = [gather(backend, [ids(tok, t)], sp)[0] for t, sp in specs]
    reqs = [_Request(ids(tok, t), sp, Future()) for t, sp in specs]
    with backend._lock:
        state = _Running(backend)
        state.admit(reqs[:1])
        for _ in range(3):
            state.step()
        state.admit(reqs[1:3])  # join a row three tokens in: one shorter prompt, one longer
        widths = []
        for _ in range(7):
            state.step()
            widths.append(state.mask.shape[1])
        assert reqs[1].future.done() and not reqs[0].future.done()
        state.admit(reqs[3:])  # join again after a row has left
        while state.rows:
            widths.append(state.mask.shape[1])
            state.step()
    for r, a in zip(reqs, alone, strict=True):
        got = r.future.result(timeout=0)
        assert got.token_ids == a.token_ids and got.finish_reason == a.finish_reason
        if a.logprobs:
            assert got.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    # Columns no running row owns are cut off: the cache never outgrows its longest row.
    assert max(widths) <= max(len(r.input_ids) + len(r.out) for r in reqs)


def test_a_request_joins_a_running_batch(tiny):
    # A short request sent while a long one decodes is answered before the long one ends
    # (batch-at-a-time decoding would make it wait for the whole long request).
    backend, _, tok = tiny
    long_p, short_p = ids(tok, "hello world"), ids(tok, "xyz")
    short_alone = gather(backend, [short_p], SamplingParams(max_new_tokens=5))[0]

    async def main():
        start = backend.steps_run
        long = asyncio.ensure_future(backend.agenerate(long_p, SamplingParams(max_new_tokens=200)))
        while backend.steps_run < start + 5:
            await asyncio.sleep(0.001)
        short = await backend.agenerate(short_p, SamplingParams(max_new_tokens=5))
        joined = not long.done()
        return short, joined, await long

    short, joined, long = asyncio.run(main())
    assert joined and short.token_ids == short_alone.token_ids and len(long.token_ids) == 200


def test_finished_rows_wait_for_the_next_admission_to_leave(tiny):
    """A finished row stays in the batch (unread, its position held) until the next admission
    rebuilds the cache in one copy, or until half the batch has finished; every row still decodes
    as it would alone."""
    from concurrent.futures import Future

    from harness.backends.hf import _Request, _Running

    backend, _, tok = tiny
    specs = [("the quick brown fox", 3), ("a", 12), ("1 2 3 4 5", 12), ("xyz", 12), ("hello world", 5)]
    specs = [(t, SamplingParams(max_new_tokens=n, logprobs=True)) for t, n in specs]
    alone = [gather(backend, [ids(tok, t)], sp)[0] for t, sp in specs]
    reqs = [_Request(ids(tok, t), sp, Future()) for t, sp in specs]
    with backend._lock:
        state = _Running(backend)
        state.admit(reqs[:4])
        for _ in range(4):  # row 0 ends after its third token
            state.step()
        assert reqs[0].future.done() and state.rows[0] is reqs[0]  # still in the batch, finished
        assert state.live_count == 3 and state.mask.shape[0] == 4
        held = int(state.next_pos[0])
        state.step()
        assert int(state.next_pos[0]) == held  # a finished row's position does not move on
        state.admit(reqs[4:])  # the rebuild drops it
        assert state.rows == reqs[1:] and state.mask.shape[0] == 4
        while state.rows:
            state.step()
            # compacted once at most half the rows still run
            assert not state.rows or 2 * state.live_count > len(state.rows)
    for r, a in zip(reqs, alone, strict=True):
        got = r.future.result(timeout=0)
        assert got.token_ids == a.token_ids and got.finish_reason == a.finish_reason
        assert got.logprobs == pytest.approx(a.logprobs, abs=1e-4)


@pytest.mark.slow
def test_embedded_smollm2_rows_joined_mid_decode_are_token_exact():
    from concurrent.futures import Future

    from harness.backends.hf import _Request, _Running

    backend = HFBackend(max_batch_size=4)
    try:
        tok = backend.tokenizer

        def chat(text):
            out = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            return list(out["input_ids"] if hasattr(out, "keys") else out)

        prompts = [chat("Name a colour."), chat("What is the capital of France? Answer in one sentence."), chat("Hi")]
        params = SamplingParams(max_new_tokens=24)
        alone = [gather(backend, [p], params)[0].token_ids for p in prompts]
        reqs = [_Request(p, params, Future()) for p in prompts]
        with backend._lock:
            state = _Running(backend)
            state.admit(reqs[:1])
            for _ in range(5):
                state.step()
            state.admit(reqs[1:])  # a longer and a shorter prompt join five tokens in
            while state.rows:
                state.step()
        assert [r.future.result(timeout=0).token_ids for r in reqs] == alone
    finally:
        backend.close()


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.4])
def test_logprobs_are_of_the_distribution_each_token_was_sampled_from(tiny, temperature):
    """log softmax(logits / T) of the chosen token (raw logits when greedy), before top-p: the
    behaviour policy the trainer scores at the rollout temperature. Two rows at other temperatures
    in one batch each get their own."""
    backend, model, tok = tiny
    p = ids(tok, "the quick brown fox")
    params = SamplingParams(max_new_tokens=10, temperature=temperature, top_p=0.9, seed=3, logprobs=True)
    other = params.with_(temperature=0.5 if temperature != 0.5 else 0.8, seed=4)
    got, _ = gather_mixed(backend, [(p, params), (p, other)])
    full = torch.tensor([p + got.token_ids])  # [1, L]
    with torch.no_grad():
        logits = model(full).logits[0, len(p) - 1 : -1].float()  # [10, V] the logits each token was picked from
    scale = temperature if temperature > 0 else 1.0
    expect = torch.log_softmax(logits / scale, dim=-1).gather(-1, torch.tensor(got.token_ids)[:, None])[:, 0]
    assert got.logprobs == pytest.approx(expect.tolist(), abs=1e-4)


def gather_mixed(backend, jobs):
    async def main():
        return await asyncio.gather(*(backend.agenerate(p, sp) for p, sp in jobs))

    return asyncio.run(main())


def test_no_logprobs_unless_asked_and_the_same_tokens(tiny):
    """Evaluation asks for no logprobs: none are computed or returned, and the tokens are the
    same as with them (a batch mixing both gets each row what it asked for)."""
    backend, _, tok = tiny
    p = ids(tok, "hello world")

    async def both():
        return await asyncio.gather(
            backend.agenerate(p, SamplingParams(max_new_tokens=10)),
            backend.agenerate(p, SamplingParams(max_new_tokens=10, logprobs=True)),
        )

    plain, with_lp = asyncio.run(both())
    assert plain.logprobs is None and len(with_lp.logprobs) == 10
    assert plain.token_ids == with_lp.token_ids
    (alone,) = gather(backend, [p], SamplingParams(max_new_tokens=10))
    assert alone.logprobs is None and alone.token_ids == plain.token_ids


def test_decoding_raises_no_transformers_deprecation_warning(tiny):
    """Issue 23 defect 7: ``make demo`` printed transformers' FutureWarning (``past_key_values`` is
    now ``cache``) once per method; the backend passes the cache under the name the model takes."""
    import warnings

    backend, _, tok = tiny
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # process-wide: the decoding thread sees it too
        outs = gather(backend, [ids(tok, "abc"), ids(tok, "de")], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert len(outs) == 2 and all(1 <= len(o.token_ids) <= 4 for o in outs)


def _fresh_tiny(tok, seed):
    model = _tiny_llama(tok, seed, max_positions=512)
    with torch.no_grad():  # never EOS: the generation must still be running when the update lands
        model.lm_head.weight[tok.eos_token_id] = 0.0  # logit 0, below the largest of ~260 random ones
    return model


@pytest.mark.parametrize("in_flight", ["drain", "pause"])
def test_an_update_mid_completion_drains_or_pauses_it(in_flight):
    """``drain``: the running completion ends on the old weights, then the update lands.
    ``pause``: the update lands at the next decode step; the row goes on under the new weights
    (its tokens so far are the old weights' greedy ones), and reports both versions. Its KV is
    recomputed by the new weights (AReaL resubmits the output so far): what follows the switch is
    the new model's greedy continuation of the prompt and the old tokens, which a row attending to
    the old weights' KV would not give."""
    import threading
    import time

    tok = byte_tokenizer()
    model = _fresh_tiny(tok, 0)
    new_state = {k: v.clone() for k, v in _fresh_tiny(tok, 1).state_dict().items()}
    backend = HFBackend(model_obj=model, tokenizer=tok, max_batch_size=4)
    try:
        p, n = ids(tok, "hello"), 300
        old_greedy = model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)[0, len(p) :].tolist()
        box = {}
        runner = threading.Thread(
            target=lambda: box.update(c=gather(backend, [p], SamplingParams(max_new_tokens=n))[0])
        )
        start = backend.steps_run
        runner.start()
        deadline = time.monotonic() + 60
        while backend.steps_run < start + 20 and runner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)
        backend.update_weights(WeightUpdate(new_state, version=5, in_flight=in_flight))
        steps_at_update = backend.steps_run - start
        runner.join(60)
        c = box["c"]
        assert len(c.token_ids) == n
        if in_flight == "drain":
            assert c.token_ids == old_greedy and c.weight_version == "0" and steps_at_update >= n - 1
            assert "weight_versions" not in c.meta
        else:
            assert 20 <= steps_at_update < n - 1
            k = steps_at_update  # tokens picked before the new weights came in (at least)
            assert c.token_ids[:k] == old_greedy[:k] and c.token_ids != old_greedy
            assert c.weight_version == "5" and c.meta["weight_versions"] == ["0", "5"]
            new_model = _fresh_tiny(tok, 1)

            def continues_afresh(j: int) -> bool:  # tokens [0, j) old, the next 16 the new model's greedy
                head = torch.tensor([p + c.token_ids[:j]])
                fresh = new_model.generate(head, max_new_tokens=16, do_sample=False)[0, head.shape[1] :].tolist()
                return fresh == c.token_ids[j : j + 16]

            # the switch: the admission's pick and one per step before the update held the lock
            assert any(continues_afresh(j) for j in range(k - 1, k + 4))
        # Either way the prefix cache holds no KV of the old weights: the update emptied it, and a row
        # that went on under the new weights (pause) mixes both versions, so it is not kept.
        assert backend.prefix_cache.tokens == 0
    finally:
        backend.close()


def test_draw_samples_the_distribution_and_never_a_token_without_mass():
    """The sampler's one-uniform CDF inversion: frequencies follow the probabilities (any
    positive sum), zero-probability tokens (top-p's cut) are never drawn, and a seed repeats."""
    from harness.backends.hf import _draw

    probs = torch.tensor([0.0, 0.5, 0.0, 1.0, 0.5, 0.0])  # [V], sums to 2
    g = torch.Generator().manual_seed(0)
    draws = [_draw(torch, probs, g) for _ in range(4000)]
    counts = torch.bincount(torch.tensor(draws), minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert counts[3] / 4000 == pytest.approx(0.5, abs=0.03)
    assert counts[1] / 4000 == pytest.approx(0.25, abs=0.03)
    again = torch.Generator().manual_seed(0)
    assert [_draw(torch, probs, again) for _ in range(50)] == draws[:50]
    assert _draw(torch, torch.tensor([0.0, 0.0, 3.0]), g) == 2  # all the mass on one token


def test_draw_past_the_total_falls_back_to_the_last_token_with_mass(monkeypatch):
    from harness.backends.hf import _draw

    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.tensor(1.0, dtype=torch.float64))
    assert _draw(torch, torch.tensor([0.2, 0.8, 0.0, 0.0]), None) == 1
