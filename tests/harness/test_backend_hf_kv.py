"""The hf backend's in-place KV cache layer (:mod:`harness.backends.hf_kv`): the layer against
``torch.cat``, and the backend with it against the same backend on transformers' own
``DynamicLayer`` (``grow_in_place`` turned off): greedy tokens identical, logprobs within 1e-4,
seeded samples the same, with rows of different lengths, admission mid-decode, prefix reuse and
rows leaving."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

import harness.backends.hf_kv as hf_kv
from harness.backends.base import SamplingParams
from harness.backends.hf_kv import MIN_ROOM, GrowingLayer
from tests.harness.test_backend_hf import gather, ids
from tests.harness.test_backend_hf_prefix import _same, join_mid_decode


def _kv(b: int, q: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, q, 4, generator=g), torch.randn(b, 2, q, 4, generator=g)  # [B, H, q, D]


def test_updates_write_in_place_and_equal_torch_cat():
    layer, ref = GrowingLayer(), DynamicLayer()
    buffers = set()
    for step in range(300):
        k, v = _kv(3, 7 if step == 0 else 1, step)  # a prefill, then decode steps
        got, want = layer.update(k, v), ref.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        buffers.add(layer._kbuf.data_ptr())
    assert layer.get_seq_length() == 7 + 299
    # Amortized: a new buffer only when the last is full, each half as large again (7 -> 71 -> 106 ...).
    assert len(buffers) <= 6
    assert layer.capacity >= 7 + 299


def test_dropping_columns_and_rows_keeps_the_buffer_and_outside_assignments_are_adopted():
    layer, ref = GrowingLayer(), DynamicLayer()
    for step in range(10):
        k, v = _kv(4, 5 if step == 0 else 1, step)
        layer.update(k, v)
        ref.update(k, v)
    buf = layer._kbuf.data_ptr()
    layer.drop_front(3)  # as the backend's trim does when leading columns lost their last owner
    ref.keys, ref.values = ref.keys[:, :, 3:], ref.values[:, :, 3:]
    assert layer._kbuf.data_ptr() == buf and torch.equal(layer.keys, ref.keys)
    sel = torch.tensor([0, 2])
    layer.batch_select_indices(sel)  # rows leave
    ref.batch_select_indices(sel)
    k, v = _kv(2, 1, 99)
    got, want = layer.update(k, v), ref.update(k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # Assigned from outside (the backend's row joining): copied into a new buffer at the next update.
    extra_k, extra_v = _kv(1, ref.keys.shape[2], 5)
    for x in (layer, ref):
        x.keys, x.values = torch.cat([x.keys, extra_k]), torch.cat([x.values, extra_v])
    k, v = _kv(3, 1, 100)
    got, want = layer.update(k, v), ref.update(k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert layer.capacity >= layer.get_seq_length() + MIN_ROOM - 1
    layer.reset()
    assert layer.capacity == 0 and layer.get_seq_length() == 0


def _mixed_run(backend, tok, base, warm_tokens, check=None):
    """A running row, then one admission mixing a long cached prefix, a short one and none, of
    different lengths, greedy and sampled, with logprobs; rows leave at different steps."""
    specs = [
        (ids(tok, "an unrelated running row"), SamplingParams(max_new_tokens=40, logprobs=True)),
        (base + warm_tokens + ids(tok, " and on"), SamplingParams(max_new_tokens=9, logprobs=True)),
        (base[:8] + ids(tok, "X different"), SamplingParams(max_new_tokens=14)),
        (ids(tok, "zzz cold"), SamplingParams(max_new_tokens=25, temperature=1.0, seed=2, logprobs=True)),
    ]
    return join_mid_decode(backend, specs, each_step=check)


def test_the_backend_decodes_as_with_transformers_own_layer(pair, monkeypatch):
    on, off, _, tok = pair
    base = ids(tok, "the shared beginning of a long context, then more")
    buffers: list[int] = []

    def check(state):
        assert all(isinstance(layer, GrowingLayer) for layer in state.past.layers)
        buffers.append(state.past.layers[0]._kbuf.data_ptr() if state.past.layers[0]._kbuf is not None else 0)

    on.prefix_cache.clear()
    warm = gather(on, [base], SamplingParams(max_new_tokens=20))[0]
    got = _mixed_run(on, tok, base, warm.token_ids, check)
    assert len(set(buffers)) < len(buffers) / 4  # most steps wrote into the buffer they found

    monkeypatch.setattr(hf_kv, "grow_in_place", lambda past: None)  # transformers' DynamicLayer: torch.cat
    on.prefix_cache.clear()
    warm_ref = gather(on, [base], SamplingParams(max_new_tokens=20))[0]
    assert warm_ref.token_ids == warm.token_ids
    ref = _mixed_run(on, tok, base, warm.token_ids)
    for g, r in zip(got, ref, strict=True):
        _same(g, r)
    # And against no prefix reuse on the old layer (the reference of test_backend_hf_prefix).
    singles = [gather(off, [p], sp)[0] for p, sp in [(base + warm.token_ids + ids(tok, " and on"), SamplingParams(9))]]
    assert singles[0].token_ids == got[1].token_ids


def test_batched_rows_of_different_lengths_and_seeded_samples_match_the_old_layer(pair, monkeypatch):
    _, off, _, tok = pair
    prompts = [ids(tok, t) for t in ("hello world", "a", "the quick brown fox jumps over", "xyz 1 2 3")]
    greedy = SamplingParams(max_new_tokens=30, logprobs=True)
    sampled = SamplingParams(max_new_tokens=30, temperature=0.8, top_p=0.9, seed=7, logprobs=True)
    new = gather(off, prompts, greedy) + gather(off, prompts, sampled)
    monkeypatch.setattr(hf_kv, "grow_in_place", lambda past: None)
    old = gather(off, prompts, greedy) + gather(off, prompts, sampled)
    for g, r in zip(new, old, strict=True):
        _same(g, r)


def test_joined_equals_padded_concatenation_with_zero_pads_and_room():
    """Rows 0, 2, 3 of a running layer (from column 2 on) then a new layer's rows, right-aligned
    in one buffer: what torch.cat of the left-padded parts gives, pads exactly zero, and the next
    decode step written in place (no copy)."""
    import torch.nn.functional as F

    from harness.backends.hf_kv import joined, row_runs

    mine = GrowingLayer()
    mine.update(*_kv(4, 9, 1))
    theirs = DynamicLayer()
    theirs.update(*_kv(2, 12, 2))
    keep, first = [0, 2, 3], 2
    assert row_runs(keep) == [(0, 1, 0), (2, 4, 1)]
    for width in (12, 15):  # the new rows wider than the running ones, then narrower than both
        got = joined(mine, first, row_runs(keep), theirs, width)
        for g, m, t in ((got.keys, mine.keys, theirs.keys), (got.values, mine.values, theirs.values)):
            ta, tn = m.shape[2] - first, t.shape[2]
            want = torch.cat([F.pad(m[keep, :, first:], (0, 0, width - ta, 0)), F.pad(t, (0, 0, width - tn, 0))])
            assert torch.equal(g, want)  # pads included: zeros, not leftover memory
        assert got.capacity >= width + MIN_ROOM
        buf = got._kbuf.data_ptr()
        k, v = _kv(5, 1, 3)
        keys, _ = got.update(k, v)
        assert got._kbuf.data_ptr() == buf and keys.shape[2] == width + 1 and torch.equal(keys[:, :, -1:], k)
