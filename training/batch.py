"""Collating trajectories into right-padded tensors for the update.

The loss mask comes from the segments' roles (1 on ``model`` tokens only), never from decoded
text: rebuilding it from text misaligns it (REFERENCE §2, Search-R1's mask bug). Two axes:

- the TOKEN axis, length ``L`` (padded sequence length): ``input_ids``, ``attention_mask``,
  ``loss_mask``, ``old_logprobs`` — position i describes token i;
- the TARGET axis, length ``T = L − 1``: logits at position t predict token t + 1, so the
  per-token loss tensors (``targets``, ``mask``, ``rollout_logprobs``) are the token-axis
  tensors shifted left by one. :func:`shift_for_next_token` does the same for logits.

Groups: ``group_ids`` [B] is the index of the PROMPT in the batch (first-seen order), so samples
of one prompt share it; a fresh id per sample would silently disable GRPO (REFERENCE §2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.types import Trajectory


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, L] long, right-padded with pad_id
    attention_mask: torch.Tensor  # [B, L] long, 1 on real tokens
    loss_mask: torch.Tensor  # [B, L] float, 1 on model-generated tokens (token axis)
    old_logprobs: torch.Tensor  # [B, L] float, the backend's logprob of each model token, else 0
    has_rollout_logprobs: bool  # False when any model token lacks a backend logprob
    response_start: torch.Tensor  # [B] long, index of the first token after the prompt segments
    group_ids: torch.Tensor  # [B] long, the prompt's index in the batch
    rewards: torch.Tensor  # [B] float
    step_spans: list[list[tuple[int, int]]]  # per row: [start, end) TARGET positions of each model turn

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with every tensor on ``device`` (the engine's)."""
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.__dict__.items()}
        return Batch(**moved)

    @property
    def targets(self) -> torch.Tensor:
        """Next-token targets.  [B, T] = input_ids[:, 1:]"""
        return self.input_ids[:, 1:]

    @property
    def mask(self) -> torch.Tensor:
        """Loss mask in the target axis: 1 where the TARGET token is a model token.  [B, T]"""
        return self.loss_mask[:, 1:]

    @property
    def response_mask(self) -> torch.Tensor:
        """1 where the TARGET token is a real token after the prompt segments (model AND observation
        tokens: verl's response attention mask).  [B, T]"""
        pos = torch.arange(1, self.input_ids.shape[1], device=self.input_ids.device)[None]  # [1, T] target index
        after = pos >= self.response_start.to(pos.device)[:, None]  # [B, T]
        return (after & self.attention_mask[:, 1:].bool()).to(self.loss_mask.dtype)

    @property
    def rollout_logprobs(self) -> torch.Tensor:
        """The backend's logprobs aligned to targets.  [B, T]"""
        return self.old_logprobs[:, 1:]

    @property
    def n_tokens(self) -> int:
        return int(self.loss_mask.sum())


def prompt_group_ids(trajs: list[Trajectory]) -> list[int]:
    """Group id per trajectory = first-seen index of its prompt (example id + prompt token ids)."""
    seen: dict[tuple, int] = {}
    out = []
    for t in trajs:
        key = (t.example_id, tuple(i for s in t.segments if s.role == "prompt" for i in s.token_ids))
        out.append(seen.setdefault(key, len(seen)))
    return out


def collate(
    trajs: list[Trajectory],
    rewards: list[float] | None = None,
    group_ids: list[int] | None = None,
    pad_id: int = 0,
    max_len: int | None = None,
) -> Batch:
    """Right-pad trajectories into a :class:`Batch`, truncating each to ``max_len`` tokens if given.

    ``group_ids`` defaults to :func:`prompt_group_ids`; ``rewards`` to zeros.
    """
    if not trajs:
        raise ValueError("collate needs at least one trajectory")
    seqs, masks, lps, spans, starts = [], [], [], [], []
    known = True
    for t in trajs:
        ids: list[int] = []
        m: list[int] = []
        lp: list[float] = []
        sp: list[tuple[int, int]] = []
        start = None
        for seg in t.segments:
            if start is None and seg.role != "prompt":
                start = len(ids)
            first = len(ids)
            ids += seg.token_ids
            m += seg.loss_mask  # from the role, never from text
            if seg.role == "model":
                if seg.logprobs is None or len(seg.logprobs) != len(seg.token_ids):
                    known = False
                    lp += [0.0] * len(seg.token_ids)
                else:
                    lp += [float(x) for x in seg.logprobs]
                sp.append((first - 1, first - 1 + len(seg.token_ids)))  # token i is target i − 1
            else:
                lp += [0.0] * len(seg.token_ids)
        if max_len is not None:
            ids, m, lp = ids[:max_len], m[:max_len], lp[:max_len]
        seqs.append(ids)
        masks.append(m)
        lps.append(lp)
        starts.append(len(ids) if start is None else min(start, len(ids)))
        # Clip spans to the (possibly truncated) target axis; drop turns that start past it, so
        # span k is still model turn k (RuleStepScorer's legacy form relies on that order).
        n_targets = len(ids) - 1
        spans.append([(max(0, a), min(b, n_targets)) for a, b in sp if a < n_targets])
    B, L = len(seqs), max(len(s) for s in seqs)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)  # [B, L]
    attn = torch.zeros((B, L), dtype=torch.long)  # [B, L]
    loss_mask = torch.zeros((B, L), dtype=torch.float32)  # [B, L]
    old_lp = torch.zeros((B, L), dtype=torch.float32)  # [B, L]
    for i, (s, m, lp) in enumerate(zip(seqs, masks, lps, strict=True)):
        n = len(s)
        input_ids[i, :n] = torch.tensor(s, dtype=torch.long)
        attn[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(m, dtype=torch.float32)
        old_lp[i, :n] = torch.tensor(lp, dtype=torch.float32)
    gids = prompt_group_ids(trajs) if group_ids is None else list(group_ids)
    rs = [0.0] * B if rewards is None else list(rewards)
    return Batch(
        input_ids=input_ids,
        attention_mask=attn,
        loss_mask=loss_mask,
        old_logprobs=old_lp,
        has_rollout_logprobs=known,
        response_start=torch.tensor(starts, dtype=torch.long),  # [B]
        group_ids=torch.tensor(gids, dtype=torch.long),  # [B]
        rewards=torch.tensor(rs, dtype=torch.float32),  # [B]
        step_spans=spans,
    )


def shift_for_next_token(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Align for next-token prediction: logits at t predict token t + 1, and the mask follows the
    target.  [B, L, V], [B, L], [B, L] → logits [B, T, V], targets [B, T], mask [B, T]"""
    return logits[:, :-1], input_ids[:, 1:], loss_mask[:, 1:]


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log π(target_t | prefix) from already-shifted logits.  [B, T, V], [B, T] → [B, T]"""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]
