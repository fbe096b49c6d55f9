"""The hf backend's prefix KV cache: the cache itself (longest prefix, LRU budget, superseding),
and the backend with reuse against the same model without it: greedy tokens identical, logprobs
equal up to float noise, seeded samples the same, on multi-turn contexts, GRPO groups and rows
joined from cached prefixes of different lengths; weight updates empty it."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import numpy as np
import pytest
import torch

from harness.backends.base import SamplingParams, WeightUpdate
from harness.backends.hf import HFBackend, _Request, _Running
from harness.backends.hf_prefix import PrefixCache, common_prefix
from harness.tokenization import byte_tokenizer
from tests.harness.test_backend_hf import _tiny_llama, gather, ids


def _kv(n: int, fill: float = 0.0) -> torch.Tensor:
    return torch.full((2, 2, 1, n, 4), fill)  # [layers, 2, heads, n, dim]


def t(xs) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


def test_common_prefix():
    assert common_prefix(t([1, 2, 3]), t([1, 2, 4, 5])) == 2
    assert common_prefix(t([1, 2]), t([1, 2, 3])) == 2
    assert common_prefix(t([7]), t([1])) == 0
    assert common_prefix(t([]), t([1])) == 0


def test_cache_matches_the_longest_prefix_and_supersedes_shorter_entries():
    c = PrefixCache(budget=100)
    c.insert(t([1, 2, 3, 4]), _kv(4, 1.0))
    c.insert(t([1, 2, 9]), _kv(3, 2.0))
    entry, n = c.match(t([1, 2, 3, 7, 7]))
    assert n == 3 and entry.kv[0, 0, 0, 0, 0] == 1.0
    entry, n = c.match(t([1, 2, 9, 9]))
    assert n == 3 and entry.kv[0, 0, 0, 0, 0] == 2.0
    assert c.match(t([5, 1]))[0] is None
    # A sequence held within a longer entry is not stored twice; one that extends an entry replaces it.
    c.insert(t([1, 2, 3]), _kv(3))
    assert (len(c), c.tokens) == (2, 7)
    c.insert(t([1, 2, 3, 4, 5, 6]), _kv(6, 3.0))
    assert (len(c), c.tokens) == (2, 9)
    assert c.match(t([1, 2, 3, 4, 5]))[1] == 5
    c.clear()
    assert (len(c), c.tokens, c.match(t([1, 2]))) == (0, 0, (None, 0))


def test_cache_evicts_least_recently_used_within_its_budget():
    c = PrefixCache(budget=10)
    c.insert(t([1, 1, 1, 1]), _kv(4))
    c.insert(t([2, 2, 2, 2]), _kv(4))
    c.match(t([1, 1]))  # 1... is now the most recently used
    c.insert(t([3, 3, 3]), _kv(3))  # 11 > 10: the least recently used (2...) goes
    assert c.match(t([2, 2]))[1] == 0 and c.match(t([1, 1]))[1] == 2 and c.match(t([3]))[1] == 1
    assert c.tokens == 7 and c.evicted_tokens == 4 and c.peak_tokens == 8
    c.insert(t(list(range(11))), _kv(11))  # larger than the whole budget: not kept, nothing evicted
    assert c.tokens == 7 and len(c) == 2
    with pytest.raises(ValueError, match="at least 0"):
        PrefixCache(-1)


def _same(a, b):
    assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
    if b.logprobs is not None:
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def join_mid_decode(backend, specs, admitted=None, each_step=None):
    """Decode the first of ``specs`` (prompt ids, sampling) alone for 4 steps, then admit the rest
    into the running batch and decode until every row has left; returns the completions in order.
    ``admitted(state, reqs)`` runs right after the admission, ``each_step(state)`` before each
    later step."""
    reqs = [_Request(p, sp, Future()) for p, sp in specs]
    with backend._lock:
        state = _Running(backend)
        state.admit(reqs[:1])
        for _ in range(4):
            state.step()
        state.admit(reqs[1:])
        if admitted:
            admitted(state, reqs)
        while state.rows:
            if each_step:
                each_step(state)
            state.step()
    return [r.future.result(timeout=0) for r in reqs]


def test_next_turns_reuse_the_finished_rows_kv_and_are_token_exact(pair):
    on, off, _, tok = pair
    on.prefix_cache.clear()
    params = SamplingParams(max_new_tokens=12, logprobs=True)
    contexts = [ids(tok, "question one: who wrote it?"), ids(tok, "q2: where is the tower?")]
    for turn in range(3):
        got, ref = gather(on, contexts, params), gather(off, contexts, params)
        for g, r in zip(got, ref, strict=True):
            _same(g, r)
            assert r.meta["cached_tokens"] == 0
            if turn:  # all of the previous input and generation but its last token came from the cache
                assert g.meta["cached_tokens"] == g.prompt_tokens - len(ids(tok, " <obs> doc text </obs> ")) - 1
        # The next turn: input + generated + an observation, as the agent builds it.
        contexts = [c + g.token_ids + ids(tok, " <obs> doc text </obs> ") for c, g in zip(contexts, got, strict=True)]


def test_a_grpo_group_prefills_its_prompt_once_and_samples_as_without_reuse(pair):
    on, off, _, tok = pair
    on.prefix_cache.clear()
    prompt = ids(tok, "a prompt that all eight samples of the group share")
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=11, logprobs=True)

    async def group(backend):
        return await backend.agenerate_n(prompt, params, 8)

    computed, reused = on.prefill_computed, on.prefill_reused
    got = asyncio.run(group(on))
    assert on.prefill_computed - computed == len(prompt) + 7  # the prompt once, then each sample's last token
    assert on.prefill_reused - reused == 7 * (len(prompt) - 1)
    ref = asyncio.run(group(off))
    for g, r in zip(got, ref, strict=True):
        _same(g, r)
    assert len({tuple(g.token_ids) for g in got}) > 1  # the seeds still differ per sample


def test_rows_from_cached_prefixes_of_different_lengths_batch_and_join_exactly(pair):
    """One admission mixing a long cached prefix, a short one and none, joined to a running row:
    padding, positions and masks must keep every row as it would be alone."""
    on, off, _, tok = pair
    on.prefix_cache.clear()
    base = ids(tok, "the shared beginning of a long context, then more")
    warm = gather(on, [base], SamplingParams(max_new_tokens=20))[0]  # caches base + 19 generated tokens
    specs = [
        (ids(tok, "an unrelated running row"), SamplingParams(max_new_tokens=30, logprobs=True)),
        (base + warm.token_ids + ids(tok, " and on"), SamplingParams(max_new_tokens=9, logprobs=True)),  # long hit
        (base[:8] + ids(tok, "X different"), SamplingParams(max_new_tokens=14)),  # short hit
        (ids(tok, "zzz cold"), SamplingParams(max_new_tokens=6, temperature=1.0, seed=2)),  # no hit
    ]

    def admitted(state, reqs):
        assert [r.cached for r in reqs[1:]] == [len(base) + len(warm.token_ids) - 1, 8, 0]
        # Compacted: the widest row fills the cache, with no columns left over from the prefill's layout.
        assert state.mask.shape[1] == max(int(m.sum()) for m in state.mask)

    for got, (p, sp) in zip(join_mid_decode(on, specs, admitted), specs, strict=True):
        _same(got, gather(off, [p], sp)[0])


def test_prefill_asks_for_the_last_positions_logits_only(pair):
    on, _, model, tok = pair
    seen = []  # (logits_to_keep, positions fed) of every forward

    def record(_module, _args, kw):
        seen.append((kw.get("logits_to_keep"), kw["input_ids"].shape[1]))

    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        gather(on, [ids(tok, "abc"), ids(tok, "defgh")], SamplingParams(max_new_tokens=3))
    finally:
        hook.remove()
    prefills = [keep for keep, width in seen if width > 1]
    assert prefills and all(keep == 1 for keep in prefills)  # decode steps feed one position and get one


def test_a_small_budget_evicts_and_stays_exact(pair):
    _, off, model, tok = pair
    small = HFBackend(model_obj=model, tokenizer=tok, max_batch_size=4, prefix_cache_tokens=40)
    try:
        contexts = [ids(tok, f"item {i}: some context to continue") for i in range(4)]
        for _ in range(2):
            got, ref = (
                gather(small, contexts, SamplingParams(max_new_tokens=8)),
                gather(off, contexts, SamplingParams(8)),
            )
            for g, r in zip(got, ref, strict=True):
                _same(g, r)
            contexts = [c + g.token_ids for c, g in zip(contexts, got, strict=True)]
        assert small.prefix_cache.tokens <= 40 and small.prefix_cache.evicted_tokens > 0
    finally:
        small.close()


def test_a_weight_update_empties_the_cache():
    tok = byte_tokenizer()
    model = _tiny_llama(tok, seed=0, max_positions=256)
    new_state = {k: v.clone() for k, v in _tiny_llama(tok, seed=1, max_positions=256).state_dict().items()}
    backend = HFBackend(model_obj=model, tokenizer=tok)
    try:
        p = ids(tok, "hello world, the same prompt")
        first = gather(backend, [p], SamplingParams(max_new_tokens=8))[0]
        assert gather(backend, [p], SamplingParams(max_new_tokens=8))[0].meta["cached_tokens"] == len(p) - 1
        backend.update_weights(WeightUpdate(new_state, version=1))
        assert backend.prefix_cache.tokens == 0
        after = gather(backend, [p], SamplingParams(max_new_tokens=8))[0]
        assert after.meta["cached_tokens"] == 0 and after.token_ids != first.token_ids
        fresh = _tiny_llama(tok, seed=1, max_positions=256)
        ref = fresh.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False)[0, len(p) :].tolist()
        assert after.token_ids == ref
    finally:
        backend.close()
