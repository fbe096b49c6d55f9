"""Chunked log-probs and entropy (training.logprobs) against the full-logits path they replace.

The reference below is the computation the trainer used before issue 21, kept here verbatim:
the model's full logits, ``token_logprobs`` (fp32 log_softmax + gather) and
``entropy_from_logits``. Every RL loss term and every gradient must agree to 1e-5 in fp32.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.helpers.models import random_llama
from training.batch import token_logprobs
from training.logprobs import chunk_logprobs, supports_chunking, window_token_stats
from training.losses import RLLoss, entropy_from_logits

V = 97


def tiny_llama(tied: bool = False, seed: int = 0) -> LlamaForCausalLM:
    return random_llama(V, seed, hidden_size=32, intermediate_size=64, tie_word_embeddings=tied).float()


def inputs(b: int = 3, L: int = 21, w: int = 14, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, L), generator=g)  # [b, L]
    attn = torch.ones(b, L, dtype=torch.long)
    attn[1, L - 4 :] = 0  # row 1 is right-padded
    targets = ids[:, L - w :]  # [b, w]
    mask = (torch.rand(b, w, generator=g) > 0.3).float()  # [b, w]: model tokens
    mask[1, w - 4 :] = 0  # padding carries no loss
    return ids, attn, targets, mask


def reference(model, ids, attn, targets, mask, temperature=1.0):
    """Today's path: full logits [b, w, V], fp32 log_softmax, entropy from the same logits."""
    w = targets.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=w + 1).logits[:, :-1]  # [b, w, V]
    logits = logits / temperature  # the sampling policy at temperature T
    return token_logprobs(logits, targets), entropy_from_logits(logits)


def losses_of(logp, ent, mask, agg):
    g = torch.Generator().manual_seed(3)
    adv = torch.randn(mask.shape, generator=g)  # [b, w]
    old = logp.detach() + 0.05 * torch.randn(mask.shape, generator=g)  # ratio ≠ 1: clipping acts
    ref = logp.detach() - 0.1 * torch.rand(mask.shape, generator=g)
    f = RLLoss(agg=agg, kl_coef=0.1, entropy_coef=0.01, clip_low=0.03, clip_high=0.03)
    return f(logp, old, adv, mask, ent, ref, global_tokens=float(mask.sum()) + 3, grad_accum=2)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("chunk", [1, 5, 1024])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "dapo", "dr_grpo"])
def test_chunked_losses_and_gradients_equal_the_full_logits_path(tied, chunk, agg):
    ids, attn, targets, mask = inputs()
    m_ref, m_new = tiny_llama(tied), tiny_llama(tied)
    lp_ref, ent_ref = reference(m_ref, ids, attn, targets, mask)
    loss_ref, st_ref = losses_of(lp_ref, ent_ref, mask, agg)
    loss_ref.backward()
    st = window_token_stats(m_new, ids, attn, targets, mask, chunk_tokens=chunk, entropy=True)
    keep = mask.bool()
    torch.testing.assert_close(st.logp[keep], lp_ref[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(st.entropy[keep], ent_ref[keep], atol=1e-5, rtol=1e-5)
    assert (st.logp[~keep] == 0).all() and (st.entropy[~keep] == 0).all()  # never computed
    loss_new, st_new = losses_of(st.logp, st.entropy, mask, agg)
    loss_new.backward()
    assert loss_new.item() == pytest.approx(loss_ref.item(), abs=1e-5)
    assert st_new.keys() == st_ref.keys()
    for k in st_ref:
        assert st_new[k] == pytest.approx(st_ref[k], abs=1e-5), k
    n = 0
    for (name, p_ref), (_, p_new) in zip(m_ref.named_parameters(), m_new.named_parameters(), strict=True):
        if p_ref.grad is None:
            assert p_new.grad is None or not p_new.grad.any(), name
            continue
        torch.testing.assert_close(p_new.grad, p_ref.grad, atol=1e-5, rtol=1e-4, msg=name)
        n += 1
    assert n >= 10  # embeddings, every layer and lm_head got gradients


@pytest.mark.parametrize("chunk", [0, 4])
@pytest.mark.parametrize("temperature", [0.6, 1.3])
def test_log_probs_are_of_the_policy_at_the_rollout_temperature(chunk, temperature):
    """softmax(logits / T), values and gradients, on both paths (verl divides its logits by the
    rollout temperature); T = 1 would give other numbers."""
    ids, attn, targets, mask = inputs(seed=11)
    m_ref, m_new = tiny_llama(), tiny_llama()
    lp_ref, ent_ref = reference(m_ref, ids, attn, targets, mask, temperature)
    ((lp_ref + 0.1 * ent_ref) * mask).sum().backward()
    st = window_token_stats(m_new, ids, attn, targets, mask, chunk, entropy=True, temperature=temperature)
    keep = mask.bool()
    torch.testing.assert_close(st.logp[keep], lp_ref[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(st.entropy[keep], ent_ref[keep], atol=1e-5, rtol=1e-5)
    ((st.logp + 0.1 * st.entropy) * mask).sum().backward()
    for (name, p_ref), (_, p_new) in zip(m_ref.named_parameters(), m_new.named_parameters(), strict=True):
        torch.testing.assert_close(p_new.grad, p_ref.grad, atol=1e-5, rtol=1e-4, msg=name)
    with torch.no_grad():
        at_one = window_token_stats(m_new, ids, attn, targets, mask, chunk)
    assert not torch.allclose(at_one.logp[keep], st.logp[keep], atol=1e-3)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        window_token_stats(m_new, ids, attn, targets, mask, chunk, temperature=0.0)


def test_entropy_is_skipped_when_not_asked_and_grads_still_match():
    ids, attn, targets, mask = inputs(seed=5)
    m_ref, m_new = tiny_llama(), tiny_llama()
    lp_ref, _ = reference(m_ref, ids, attn, targets, mask)
    (lp_ref * mask).sum().backward()
    st = window_token_stats(m_new, ids, attn, targets, mask, chunk_tokens=4, entropy=False)
    assert st.entropy is None
    (st.logp * mask).sum().backward()
    torch.testing.assert_close(m_new.lm_head.weight.grad, m_ref.lm_head.weight.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(
        m_new.model.embed_tokens.weight.grad, m_ref.model.embed_tokens.weight.grad, atol=1e-5, rtol=1e-4
    )


def test_entropy_as_a_metric_adds_no_gradient():
    """Entropy logged with coefficient 0 must not change the gradient."""
    ids, attn, targets, mask = inputs(seed=7)
    grads = []
    for want in (False, True):
        m = tiny_llama()
        st = window_token_stats(m, ids, attn, targets, mask, chunk_tokens=3, entropy=want)
        loss, stats = RLLoss()(st.logp, st.logp.detach(), torch.ones_like(mask), mask, st.entropy)
        assert ("entropy" in stats) == want
        loss.backward()
        grads.append(m.lm_head.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], atol=0, rtol=0)


def test_no_grad_and_chunk_zero_is_the_reference_path():
    ids, attn, targets, mask = inputs(seed=9)
    m = tiny_llama()
    with torch.no_grad():
        lp_ref, ent_ref = reference(m, ids, attn, targets, mask)
        a = window_token_stats(m, ids, attn, targets, mask, chunk_tokens=2, entropy=True)
        b = window_token_stats(m, ids, attn, targets, mask, chunk_tokens=0, entropy=True)
    keep = mask.bool()
    for x in (a, b):
        torch.testing.assert_close(x.logp[keep], lp_ref[keep], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x.entropy[keep], ent_ref[keep], atol=1e-5, rtol=1e-5)


def test_bf16_stays_in_model_dtype_outside_the_chunk():
    """A bf16 model: hidden states and lm_head stay bf16; log-probs come out fp32 and close to fp32 math."""
    m = tiny_llama().to(torch.bfloat16)
    h = torch.randn(11, 32, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, V, (11,))
    lp, ent = chunk_logprobs(h, m.lm_head, t, 4, True)
    assert lp.dtype == ent.dtype == torch.float32
    (lp.sum() + ent.sum()).backward()
    assert h.grad.dtype == torch.bfloat16 and m.lm_head.weight.grad.dtype == torch.bfloat16
    want = token_logprobs(m.lm_head(h.detach()).unsqueeze(0), t.unsqueeze(0))[0]
    torch.testing.assert_close(lp.detach(), want, atol=1e-5, rtol=1e-5)


def test_models_with_logit_postprocessing_take_the_full_path():
    m = tiny_llama()
    assert supports_chunking(m)
    m.config.final_logit_softcapping = 30.0
    assert not supports_chunking(m)
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        chunk_logprobs(torch.zeros(2, 32), m.lm_head, torch.zeros(2, dtype=torch.long), 0, False)


def test_the_head_gets_one_gradient_accumulation_per_backward():
    """DeepSpeed ZeRO-1/2 refuse a parameter whose gradient hook fires twice in one backward:
    many chunks must still accumulate into lm_head (and a tied embedding) once."""
    for tied in (False, True):
        m = tiny_llama(tied)
        calls: list[int] = []
        m.lm_head.weight.register_post_accumulate_grad_hook(lambda p, c=calls: c.append(1))
        ids, attn, targets, mask = inputs()
        st = window_token_stats(m, ids, attn, targets, mask, chunk_tokens=2, entropy=True)
        (st.logp.sum() + st.entropy.sum()).backward()
        assert len(calls) == 1, tied


def test_rows_without_a_model_token_give_zeros_that_still_backpropagate():
    """A micro-batch whose trajectories all failed before generating has no model token: the loss
    must still backpropagate (zero gradients), not fail with 'does not require grad'."""
    ids, attn, targets, mask = inputs(seed=7)
    m = tiny_llama()
    st = window_token_stats(m, ids, attn, targets, torch.zeros_like(mask), chunk_tokens=4, entropy=True)
    assert st.logp.shape == mask.shape and torch.all(st.logp == 0) and torch.all(st.entropy == 0)
    (st.logp * mask).sum().backward()
    for p in (m.lm_head.weight, m.model.embed_tokens.weight):
        assert p.grad is not None and torch.all(p.grad == 0)


def grouped_rows(seed: int = 4):
    """Six right-padded rows in three groups: prompts of 7, 11 and 5 tokens; row 4 is cut by
    max_len inside its group's prompt (9 of 11 tokens), row 5 is a group of one."""
    g = torch.Generator().manual_seed(seed)
    b, L = 6, 30
    groups = torch.tensor([0, 0, 0, 1, 1, 2])
    prompt_len = torch.tensor([7, 7, 7, 11, 9, 5])
    lengths = torch.tensor([30, 22, 18, 25, 9, 28])
    ids = torch.randint(0, V, (b, L), generator=g)  # [b, L]
    ids[:3, :7] = ids[0, :7]
    ids[3:5, :11] = ids[3, :11]
    attn = (torch.arange(L)[None] < lengths[:, None]).long()  # [b, L]
    ids = ids * attn
    w = L - 5
    pos = torch.arange(L - w, L)[None]  # [1, w] target token positions
    mask = ((pos >= prompt_len[:, None]) & (pos < lengths[:, None])).float()  # [b, w] model tokens
    return ids, attn, ids[:, L - w :], mask, prompt_len, groups


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_each_groups_prompt_run_once_gives_the_same_logprobs_and_gradients(checkpointing, attn):
    """model.share_prompt: the prompts run once, the continuations over their keys and values. The
    log-probs, entropies and every gradient equal the row-by-row forward to fp32 rounding, with
    gradient checkpointing too (its replay must read the prompt's keys again, not drop them)."""
    ids, attn_mask, targets, mask, prompt_len, groups = grouped_rows()
    models = [tiny_llama(), tiny_llama()]
    for m in models:
        m.config._attn_implementation = attn
        m.train()
        if checkpointing:
            m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    plain = window_token_stats(models[0], ids, attn_mask, targets, mask, chunk_tokens=5, entropy=True)
    shared = window_token_stats(
        models[1], ids, attn_mask, targets, mask, chunk_tokens=5, entropy=True, share=(prompt_len, groups)
    )
    keep = mask.bool()
    torch.testing.assert_close(shared.logp[keep], plain.logp[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared.entropy[keep], plain.entropy[keep], atol=1e-5, rtol=1e-5)
    assert (shared.logp[~keep] == 0).all()
    for st in (plain, shared):
        loss, _ = losses_of(st.logp, st.entropy, mask, "token_mean")
        loss.backward()
    for (name, p0), (_, p1) in zip(models[0].named_parameters(), models[1].named_parameters(), strict=True):
        torch.testing.assert_close(p1.grad, p0.grad, atol=1e-5, rtol=1e-4, msg=name)
    # the prompt's own positions reached through the continuation: the embedding of a prompt-only
    # token gets its gradient (were the prompt's keys cut off, the gradients above would differ)
    assert models[1].model.embed_tokens.weight.grad.abs().sum() > 0


def test_rows_of_one_group_that_do_not_share_their_prompt_are_refused():
    ids, attn_mask, targets, mask, prompt_len, groups = grouped_rows()
    ids[1, 3] = (ids[0, 3] + 1) % V  # row 1 leaves its group's prompt
    with pytest.raises(ValueError, match="do not share their prompt"):
        window_token_stats(tiny_llama(), ids, attn_mask, targets, mask, chunk_tokens=5, share=(prompt_len, groups))


def test_share_prompt_needs_the_chunked_path_and_an_explicit_mask_kernel():
    from training.config import ModelConfig

    with pytest.raises(ValueError, match="logits_chunk_tokens"):
        ModelConfig(share_prompt=True, logits_chunk_tokens=0)
    with pytest.raises(ValueError, match="sdpa or eager"):
        ModelConfig(share_prompt=True, attn_implementation="flash_attention_2")
