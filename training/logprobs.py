"""Token log-probs and entropy without the full ``[batch, tokens, vocab]`` logits.

The update needs log π(target_t) (and sometimes the entropy) at the model tokens only. Computing
them from ``model(...).logits`` materialises the logits of every position in the model's dtype,
then an fp32 copy for ``log_softmax``, another for the entropy, and autograd keeps them for the
backward: at 7.5k tokens × 152k vocabulary one fp32 copy is 4.6 GB per row (issue 21).

Here the model runs with ``logits_to_keep=1`` (its vocabulary projection sees one position), a
forward hook takes the decoder's last hidden states, and the output embedding (``lm_head``) is
applied over chunks of ``chunk_tokens`` tokens: inside a chunk the logits are cast to fp32 and
reduced to log-prob and entropy by :class:`_LogProbEntropy`; under autograd each chunk is a
non-reentrant checkpoint, so only the chunk's hidden states are kept and the backward recomputes
its logits (one more vocabulary matmul and log_softmax per chunk, the trade verl's chunked
entropy and Liger's fused linear cross-entropy make). Peak memory is then one chunk's logits in
fp32 (two copies), independent of the sequence length.

Only positions where ``mask`` is 1 are computed (prompt, observation and padding tokens never
carry a loss); the rest are 0. The numbers equal the full-logits path (``training.batch.
token_logprobs``, ``training.losses.entropy_from_logits``) to fp32 rounding, as tested.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import FunctionCtx
from torch.utils.checkpoint import checkpoint

from training.batch import token_logprobs
from training.losses import entropy_from_logits


class _LogProbEntropy(torch.autograd.Function):
    """One chunk's logits [n, V] (model dtype), targets [n] → log-prob [n] and entropy [n] (or an
    empty tensor), fp32.

    Backward, with p = softmax(z), log q = z − lse:  ∂logp_t/∂z = onehot_t − p;
    ∂H/∂z = −p ⊙ (log q + H). Written by hand: log_softmax once forward, one softmax backward,
    at most two fp32 copies of the chunk alive (autograd's log_softmax / gather / exp graph keeps
    more, and ``logsumexp`` allocates two on CPU).
    """

    @staticmethod
    def forward(ctx: FunctionCtx, logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):  # noqa: ANN205
        z = logits.float()  # [n, V] fp32, this chunk only (the same tensor when the model is fp32)
        logq = torch.log_softmax(z, dim=-1)  # [n, V]
        lse = z[:, 0] - logq[:, 0]  # [n] log-sum-exp, for the backward's softmax
        logp = logq.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [n]
        if with_entropy:
            # −Σ p log q as a batched dot product: no third [n, V] temporary
            ent = -(logq.exp().unsqueeze(1) @ logq.unsqueeze(2)).reshape(-1)  # [n]
        else:
            ent = lse.new_zeros(0)
        del logq
        ctx.save_for_backward(logits, targets, lse, ent if with_entropy else lse)
        ctx.with_entropy = with_entropy
        ctx.set_materialize_grads(False)  # an output nothing backpropagates through gets None, not zeros
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx: FunctionCtx, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None):  # noqa: ANN205
        logits, targets, lse, ent = ctx.saved_tensors
        g_ent = g_ent if ctx.with_entropy else None
        if g_logp is None and g_ent is None:
            return None, None, None
        logq = logits.float() - lse.unsqueeze(-1)  # [n, V]
        if g_ent is None:
            grad = logq.exp_()  # [n, V] p, in place
            grad.mul_(-g_logp.unsqueeze(-1))
        else:
            p = logq.exp()  # [n, V]
            grad = logq.add_(ent.unsqueeze(-1)).mul_(p).mul_(-g_ent.unsqueeze(-1))  # −g·p(log q + H)
            if g_logp is not None:
                grad.sub_(p.mul_(g_logp.unsqueeze(-1)))
            del p
        if g_logp is not None:
            grad.scatter_add_(-1, targets.unsqueeze(-1), g_logp.unsqueeze(-1))
        return grad.to(logits.dtype), None, None


def chunk_logprobs(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    targets: torch.Tensor,
    chunk_tokens: int,
    with_entropy: bool,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each target and (optionally) the entropy, ``chunk_tokens`` positions at a time.

    hidden [N, H] (the final hidden states that predict ``targets``), targets [N] → logp [N],
    entropy [N] or None; both fp32, of the distribution softmax(logits / ``temperature``).
    Gradients reach ``hidden`` and ``lm_head``'s parameters.

    Under autograd each chunk runs inside a NON-reentrant ``torch.utils.checkpoint``: only its
    hidden states are kept, its logits are recomputed in the backward, and the whole backward is
    one graph, so the head's weight gets ONE accumulated gradient (DeepSpeed ZeRO-1/2 refuse a
    parameter whose gradient arrives twice in a backward, as per-chunk nested backwards would do).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))

    def one(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = lm_head(h)  # [n, V], lives only in here
        if temperature != 1.0:
            logits = logits.div_(temperature)  # in place: the head's backward needs h, not its output
        return _LogProbEntropy.apply(logits, t, with_entropy)

    logps, ents = [], []
    for i in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[i : i + chunk_tokens], targets[i : i + chunk_tokens]  # [n, H], [n]
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


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose output is the final hidden states (Llama/Qwen: ``model.model``), through
    DeepSpeed's engine and peft's wrappers."""
    inner = model.module if hasattr(model, "module") else model
    if not hasattr(inner, "get_decoder") or not hasattr(inner, "get_output_embeddings"):
        raise TypeError(f"{type(inner).__name__} has no get_decoder/get_output_embeddings: not a causal LM")
    return inner


# Configs that change logits after lm_head (a softcap, a scale): the chunked path would skip it.
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def supports_chunking(model: torch.nn.Module) -> bool:
    """Whether logits are exactly ``lm_head(hidden)`` for this model (no softcap or scale after it)."""
    inner = _decoder(model)
    cfg = getattr(inner, "config", None)
    if any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in _LOGIT_POSTPROCESSING):
        return False
    return isinstance(inner.get_output_embeddings(), torch.nn.Module)


def window_token_stats(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None = None,
    chunk_tokens: int = 1024,
    entropy: bool = False,
    temperature: float = 1.0,
    share: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> TokenStats:
    """Log-probs (and entropy) of the last ``w = targets.shape[1]`` targets of a forward.

    input_ids, attention_mask [b, L]; targets [b, w] are the tokens at positions L − w .. L − 1,
    predicted by the hidden states at L − w − 1 .. L − 2; mask [b, w] picks the positions to
    compute (default all). ``chunk_tokens`` ≤ 0 takes the full-logits path (the reference: one
    [b, w, V] tensor, fp32 in log_softmax), as does a model whose logits are not ``lm_head(h)``.
    ``temperature`` divides the logits first: the policy that sampled at temperature T is
    softmax(logits / T), and RL scores the samples under that policy (verl's actor divides its
    logits by the rollout temperature for the old, reference and training log-probs alike).
    ``share`` = (prompt_len [b], group_ids [b]) runs each group's prompt once
    (:func:`shared_prompt_hidden`, ``model.share_prompt``); the full-logits path ignores it.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    b, w = targets.shape
    L = input_ids.shape[1]
    if chunk_tokens <= 0 or not supports_chunking(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=w + 1).logits[:, :-1]
        if temperature != 1.0:
            logits = logits / temperature  # [b, w, V]
        logp = token_logprobs(logits, targets)  # [b, w]
        ent = entropy_from_logits(logits) if entropy else None  # [b, w]
        if mask is not None:
            keep = mask.bool()
            logp = torch.where(keep, logp, torch.zeros_like(logp))
            ent = torch.where(keep, ent, torch.zeros_like(ent)) if ent is not None else None
        return TokenStats(logp, ent)

    inner = _decoder(model)
    if share is not None:
        positions = torch.arange(L - w - 1, L - 1, device=input_ids.device)  # [w]
        hidden = shared_prompt_hidden(model, input_ids, attention_mask, share[0], share[1], positions)  # [b, w, H]
    else:
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
    if idx is not None and idx.numel() == 0:
        # No model token in these rows (e.g. every trajectory failed before generating): zeros that
        # still hang on the graph, so the loss backpropagates (zero gradients) instead of failing.
        head = inner.get_output_embeddings().weight
        zero = ((hidden.sum() + head.sum()) * 0.0).expand(b, w)  # [b, w]; the head gets its (zero) gradient too
        return TokenStats(zero, zero if entropy else None)
    if idx is not None:
        flat_h, flat_t = flat_h.index_select(0, idx), flat_t.index_select(0, idx)  # [n, H], [n]
    lp, en = chunk_logprobs(flat_h, inner.get_output_embeddings(), flat_t, chunk_tokens, entropy, temperature)

    def unflatten(x: torch.Tensor) -> torch.Tensor:
        if idx is None:
            return x.reshape(b, w)
        return x.new_zeros(b * w).index_put((idx,), x).reshape(b, w)  # [b, w], 0 where masked

    return TokenStats(unflatten(lp), unflatten(en) if en is not None else None)


# --- One forward of each group's prompt (``model.share_prompt``) ----------------------------------
#
# The G samples of one prompt repeat its tokens; the update ran them G times. Here the rows of a
# micro-batch are split at their group's prompt: the distinct prompts run once (one row each), and
# the continuations run after them over those prompts' keys and values, read from a cache that is
# never written after the prompt pass (so a gradient-checkpointed layer replays the same read in
# the backward). The prompt's keys and values keep their graph: a continuation's loss reaches the
# prompt's tokens as it does in the unshared forward. Same math; the float order differs (matmuls
# of other shapes, an explicit mask where the causal kernel ran), so log-probs agree to fp32
# rounding, as tested.


class _PromptKV:
    """Stands in for transformers' cache in the two passes. Without ``rows`` (the prompt pass) it
    keeps each layer's keys and values [n, kv_heads, P, d] of ``kv``; with them (a continuation
    pass over the same ``kv``) it returns them gathered per row ([b, kv_heads, P, d]) before the
    row's own. Each pass has its own instance and nothing is replaced once kept, so replaying a
    layer in the backward (gradient checkpointing) sees exactly what the forward saw."""

    def __init__(self, kv: dict[int, tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor | None = None) -> None:
        self.kv = kv
        self.rows = rows  # [b] the prompt index of each continuation row; None in the prompt pass

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):  # noqa: ANN201
        if self.rows is None:
            self.kv.setdefault(layer_idx, (key, value))
            return key, value
        pk, pv = self.kv[layer_idx]
        pk, pv = pk.index_select(0, self.rows), pv.index_select(0, self.rows)  # [b, kv_heads, P, d]
        return torch.cat([pk, key], dim=-2), torch.cat([pv, value], dim=-2)  # [b, kv_heads, P + R, d]


def _cache_kwarg(model: torch.nn.Module) -> str:
    """The name transformers' decoder takes its KV cache by (``cache`` in 5.x, ``past_key_values`` before)."""
    params = inspect.signature(_decoder(model).get_decoder().forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    name = type(_decoder(model)).__name__
    raise NotImplementedError(f"{name}'s decoder takes no KV cache argument: model.share_prompt needs one")


class _CacheThroughCheckpointing:
    """While active, a gradient-checkpointed decoder layer keeps the cache argument (transformers
    drops it unless the layer only reads it; ours is only read after the prompt pass)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = list(getattr(_decoder(model).get_decoder(), "layers", []))

    def __enter__(self) -> None:
        for layer in self.layers:
            if getattr(layer, "gradient_checkpointing", False) and not hasattr(layer, "_can_checkpoint_with_cache"):
                raise NotImplementedError(
                    "model.share_prompt with gradient checkpointing needs transformers >= 5 (a decoder layer that can "
                    "keep a read-only cache); set model.share_prompt=false"
                )
            layer._can_checkpoint_with_cache = True  # instance attribute over the class's False

    def __exit__(self, *exc: object) -> None:
        for layer in self.layers:
            layer.__dict__.pop("_can_checkpoint_with_cache", None)


def _mask(allow: torch.Tensor, attn_implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """A 4-D mask [n, 1, q, k] in the form the attention kernel takes: bool for sdpa, additive for eager."""
    allow = allow[:, None]
    if attn_implementation == "sdpa":
        return allow
    if attn_implementation == "eager":
        return torch.zeros(allow.shape, dtype=dtype, device=allow.device).masked_fill_(~allow, torch.finfo(dtype).min)
    raise ValueError(f"model.share_prompt needs attn_implementation sdpa or eager, not {attn_implementation}")


def shared_prompt_hidden(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: torch.Tensor,
    group_ids: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """The decoder's final hidden states at ``positions`` of each row, each group's prompt run once.

    input_ids, attention_mask [b, L] right-padded; prompt_len [b] where each row's prompt ends (a
    group shares its rows' shortest; a row sharing fewer tokens with its group is refused);
    group_ids [b] (rows of one prompt share an id, as ``training.batch.collate`` makes them); positions [w] token
    positions (the same for every row) → hidden [b, w, H]. Positions at or past a row's length
    return some other position's state (they are padding: the caller never scores them).
    """
    inner = _decoder(model)
    attn_impl = getattr(inner.config, "_attn_implementation", "sdpa")
    dtype = next(inner.parameters()).dtype
    device, b = input_ids.device, input_ids.shape[0]
    lengths = attention_mask.sum(1)  # [b]
    uniq, row_prompt = torch.unique(group_ids, return_inverse=True)  # [n], [b]: each row's prompt index
    first = torch.full((len(uniq),), b, dtype=torch.long, device=device).scatter_reduce(
        0, row_prompt, torch.arange(b, device=device), reduce="amin"
    )  # [n] a row holding each prompt
    # A group's shared prompt: its rows' shortest (a row cut by max_len inside it has fewer), ≥ 1
    P = torch.full_like(first, input_ids.shape[1]).scatter_reduce(0, row_prompt, prompt_len, reduce="amin")  # [n]
    P = P.clamp(min=1)
    prompt_len = P[row_prompt]  # [b]
    Pm = int(P.max())
    ar = torch.arange(Pm, device=device)
    prompts = input_ids[first, :Pm]  # [n, Pm] (past a prompt's end: the row's own tokens, masked below)
    if not bool(((input_ids[:, :Pm] == prompts[row_prompt]) | (ar[None] >= prompt_len[:, None])).all()):
        raise ValueError("model.share_prompt: rows of one group do not share their prompt tokens")
    R = lengths - prompt_len  # [b] continuation tokens of each row (≥ 0)
    Rm = int(R.max())
    box: dict[str, torch.Tensor] = {}

    def grab(_module: Any, _args: Any, output: Any) -> None:
        box["h"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    name = _cache_kwarg(model)
    handle = inner.get_decoder().register_forward_hook(grab)
    try:
        with _CacheThroughCheckpointing(model):
            # The prompts [n, Pm]: causal over each prompt's own tokens (a padding query sees the prompt).
            allow = (ar[None, :] <= ar[:, None])[None] & (ar[None, None, :] < P[:, None, None])  # [n, Pm, Pm]
            pos = ar[None].expand(len(uniq), Pm)  # [n, Pm]
            model(
                input_ids=prompts,
                attention_mask=_mask(allow, attn_impl, dtype),
                position_ids=pos,
                logits_to_keep=1,
                use_cache=False,
                **{name: _PromptKV(kv)},
            )
            h_prompt = box["h"]  # [n, Pm, H]
            h_cont = None
            if Rm > 0:
                ac = torch.arange(Rm, device=device)
                src = (prompt_len[:, None] + ac[None]).clamp(max=input_ids.shape[1] - 1)  # [b, Rm]
                cont = torch.where(ac[None] < R[:, None], input_ids.gather(1, src), 0)  # [b, Rm]
                seen = ar[None, None, :] < prompt_len[:, None, None]  # [b, 1, Pm] the row's prompt keys
                own = (ac[None, :] <= ac[:, None])[None] & (ac[None, None, :] < R[:, None, None])  # [b, Rm, Rm]
                allow = torch.cat([seen.expand(b, Rm, Pm), own], dim=-1)  # [b, Rm, Pm + Rm]
                model(
                    input_ids=cont,
                    attention_mask=_mask(allow, attn_impl, dtype),
                    position_ids=prompt_len[:, None] + ac[None],
                    logits_to_keep=1,
                    use_cache=False,
                    **{name: _PromptKV(kv, row_prompt)},
                )
                h_cont = box["h"]  # [b, Rm, H]
    finally:
        handle.remove()
    H = h_prompt.shape[-1]
    t = positions[None].expand(b, -1)  # [b, w]
    in_prompt = t < prompt_len[:, None]  # [b, w]
    flat = [h_prompt.reshape(-1, H)]  # prompt states first, then the continuations'
    idx = row_prompt[:, None] * Pm + t.clamp(max=Pm - 1)  # [b, w]
    if h_cont is not None:
        flat.append(h_cont.reshape(-1, H))
        at = len(uniq) * Pm + torch.arange(b, device=device)[:, None] * Rm + (t - prompt_len[:, None]).clamp(0, Rm - 1)
        idx = torch.where(in_prompt, idx, at)
    return torch.cat(flat).index_select(0, idx.reshape(-1)).reshape(b, -1, H)  # [b, w, H]
