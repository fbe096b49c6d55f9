"""Token log-probs and entropy without the full ``[batch, tokens, vocab]`` logits.

The update needs log π(target_t) (and sometimes the entropy) at the model tokens only. Computing
them from ``model(...).logits`` materialises the logits of every position in the model's dtype,
then an fp32 copy for ``log_softmax``, another for the entropy, and autograd keeps them for the
backward: at 7.5k tokens × 152k vocabulary one fp32 copy is 4.6 GB per row (issue 21).

Here the model runs with ``logits_to_keep=1`` (its vocabulary projection sees one position), a
forward hook takes the decoder's last hidden states, and the output embedding (``lm_head``) is
applied over chunks of ``chunk_tokens`` tokens. Inside a chunk the logits are cast to fp32 and
reduced to log-prob and entropy by :class:`_LogProbEntropy`, whose backward recomputes softmax
from the saved chunk. Under autograd each chunk is wrapped in a non-reentrant
``torch.utils.checkpoint``, so only its hidden states are kept between forward and backward and
the chunk's logits are recomputed there (one more vocabulary matmul per chunk, as in verl's
chunked entropy / Liger's fused linear cross-entropy). Peak memory is then one chunk's logits in
fp32 (a few copies), independent of the sequence length.

Only positions where ``mask`` is 1 are computed (prompt, observation and padding tokens never
carry a loss); the rest are 0. The numbers equal the full-logits path (``training.batch.
token_logprobs``, ``training.losses.entropy_from_logits``) to fp32 rounding, as tested.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


class _LogProbEntropy(torch.autograd.Function):
    """One chunk: logits [N, V] (model dtype), targets [N] → log-prob [N] and entropy [N] in fp32.

    Backward, with p = softmax(z), log q = z − lse:  ∂logp_t/∂z = onehot_t − p;
    ∂H/∂z = −p ⊙ (log q + H). Written by hand so the backward holds two fp32 chunk tensors, not
    the four or five autograd's log_softmax / gather / exp / mul graph would keep.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):  # noqa: ANN205
        z = logits.float()  # [N, V] fp32, this chunk only
        lse = torch.logsumexp(z, dim=-1)  # [N]
        logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse  # [N]
        ent = None
        if with_entropy:
            logq = z - lse.unsqueeze(-1)  # [N, V]
            ent = -(logq.exp() * logq).sum(-1)  # [N]
            del logq
        ctx.save_for_backward(logits, targets, lse, ent if ent is not None else lse)
        ctx.with_entropy = with_entropy
        ctx.set_materialize_grads(False)  # an output nothing backpropagates through gets None, not zeros
        if ent is None:
            ent = lse.new_zeros(0)
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None):  # noqa: ANN205
        logits, targets, lse, ent = ctx.saved_tensors
        if g_logp is None and (g_ent is None or not ctx.with_entropy):
            return None, None, None
        logq = logits.float() - lse.unsqueeze(-1)  # [N, V]
        p = logq.exp()  # [N, V]
        grad = torch.zeros_like(p) if g_logp is None else p.mul(-g_logp.unsqueeze(-1))  # [N, V]
        if ctx.with_entropy and g_ent is not None:
            grad -= logq.add_(ent.unsqueeze(-1)).mul_(p).mul_(g_ent.unsqueeze(-1))  # −g·p(log q + H)
        del logq, p
        if g_logp is not None:
            grad.scatter_add_(-1, targets.unsqueeze(-1), g_logp.unsqueeze(-1))
        return grad.to(logits.dtype), None, None


def chunk_logprobs(
    hidden: torch.Tensor, lm_head: Any, targets: torch.Tensor, chunk_tokens: int, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each target and (optionally) the entropy, ``chunk_tokens`` positions at a time.

    hidden [N, H] (the final hidden states that predict ``targets``), targets [N] → logp [N],
    entropy [N] or None; both fp32.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))

    def one(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _LogProbEntropy.apply(lm_head(h), t, with_entropy)  # [n, V] lives only in here

    logps, ents = [], []
    for i in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[i : i + chunk_tokens], targets[i : i + chunk_tokens]  # [n, H], [n]
        # Checkpointed: the backward recomputes this chunk's logits instead of keeping them.
        lp, en = checkpoint(one, h, t, use_reentrant=False) if grad else one(h, t)
        logps.append(lp)
        ents.append(en)
    logp = torch.cat(logps) if logps else hidden.new_zeros(0, dtype=torch.float32)  # [N]
    ent = (torch.cat(ents) if ents else hidden.new_zeros(0, dtype=torch.float32)) if with_entropy else None
    return logp, ent


@dataclass
class TokenStats:
    """Per target position of a window: ``logp`` [b, w] and ``entropy`` [b, w] (None unless asked); 0 where masked."""

    logp: torch.Tensor
    entropy: torch.Tensor | None


def _decoder(model: Any) -> Any:
    """The module whose output is the final hidden states (Llama/Qwen: ``model.model``), through
    DeepSpeed's engine and peft's wrappers."""
    inner = model.module if hasattr(model, "module") else model
    if not hasattr(inner, "get_decoder") or not hasattr(inner, "get_output_embeddings"):
        raise TypeError(f"{type(inner).__name__} has no get_decoder/get_output_embeddings: not a causal LM")
    return inner


# Configs that change logits after lm_head (a softcap, a scale): the chunked path would skip it.
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def supports_chunking(model: Any) -> bool:
    """Whether logits are exactly ``lm_head(hidden)`` for this model (no softcap or scale after it)."""
    inner = _decoder(model)
    cfg = getattr(inner, "config", None)
    if any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in _LOGIT_POSTPROCESSING):
        return False
    return isinstance(inner.get_output_embeddings(), torch.nn.Module)


def window_token_stats(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None = None,
    chunk_tokens: int = 1024,
    entropy: bool = False,
) -> TokenStats:
    """Log-probs (and entropy) of the last ``w = targets.shape[1]`` targets of a forward.

    input_ids, attention_mask [b, L]; targets [b, w] are the tokens at positions L − w .. L − 1,
    predicted by the hidden states at L − w − 1 .. L − 2; mask [b, w] picks the positions to
    compute (default all). ``chunk_tokens`` ≤ 0 takes the full-logits path (the reference: one
    [b, w, V] tensor, fp32 in log_softmax), as does a model whose logits are not ``lm_head(h)``.
    """
    b, w = targets.shape
    L = input_ids.shape[1]
    if chunk_tokens <= 0 or not supports_chunking(model):
        from training.batch import token_logprobs
        from training.losses import entropy_from_logits

        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=w + 1).logits[:, :-1]
        logp = token_logprobs(logits, targets)  # [b, w]
        ent = entropy_from_logits(logits) if entropy else None  # [b, w]
        if mask is not None:
            keep = mask.bool()
            logp = torch.where(keep, logp, torch.zeros_like(logp))
            ent = torch.where(keep, ent, torch.zeros_like(ent)) if ent is not None else None
        return TokenStats(logp, ent)

    inner = _decoder(model)
    box: dict[str, torch.Tensor] = {}

    def grab(_module: Any, _args: Any, output: Any) -> None:
        box["h"] = output[0] if isinstance(output, tuple) else output.last_hidden_state  # [b, L, H]

    handle = inner.get_decoder().register_forward_hook(grab)
    try:
        # logits_to_keep=1: the model's own vocabulary projection sees one position, not L.
        model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1)
    finally:
        handle.remove()
    hidden = box["h"][:, L - w - 1 : L - 1]  # [b, w, H]
    flat_h = hidden.reshape(b * w, -1)  # [b·w, H]
    flat_t = targets.reshape(b * w)  # [b·w]
    idx = mask.reshape(-1).nonzero().squeeze(-1) if mask is not None else None  # [n] valid positions
    if idx is not None:
        flat_h, flat_t = flat_h.index_select(0, idx), flat_t.index_select(0, idx)  # [n, H], [n]
    lp, en = chunk_logprobs(flat_h, inner.get_output_embeddings(), flat_t, chunk_tokens, entropy)

    def unflatten(x: torch.Tensor) -> torch.Tensor:
        if idx is None:
            return x.reshape(b, w)
        return x.new_zeros(b * w).index_put((idx,), x).reshape(b, w)  # [b, w], 0 where masked

    return TokenStats(unflatten(lp), unflatten(en) if en is not None else None)
