"""Collation: padding, role-based masks, target alignment, logprobs, groups by prompt, truncation."""

from __future__ import annotations

import math

import pytest
import torch

from harness.types import Segment, Trajectory
from training.batch import collate, prompt_group_ids, shift_for_next_token, token_logprobs


def multi_turn(eid, prompt, m1, obs, m2, lp=True):
    return Trajectory(
        example_id=eid,
        question="q",
        answers=["a"],
        method="m",
        segments=[
            Segment("prompt", prompt),
            # The model's text mentions tags, the observation's does not: the mask must follow the
            # roles, never the decoded text.
            Segment("model", m1, "<information>fake</information>", [-0.1] * len(m1) if lp else None),
            Segment("observation", obs, "plain words"),
            Segment("model", m2, "<answer>a</answer>", [-0.2] * len(m2) if lp else None),
        ],
    )


def test_collate_pads_right_and_masks_by_role():
    t1 = multi_turn("a", [1, 2], [3, 4], [5, 6, 7], [8])
    t2 = multi_turn("a", [1, 2], [9], [5], [10, 11])
    b = collate([t1, t2], rewards=[1.0, 0.0], pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 9, 5, 10, 11, 0, 0]]  # [B, L]
    assert b.attention_mask.tolist() == [[1] * 8, [1] * 6 + [0, 0]]
    assert b.loss_mask.tolist() == [[0, 0, 1, 1, 0, 0, 0, 1], [0, 0, 1, 0, 1, 1, 0, 0]]  # token axis
    assert b.mask.tolist() == [[0, 1, 1, 0, 0, 0, 1], [0, 1, 0, 1, 1, 0, 0]]  # target axis = shifted
    assert b.targets.tolist() == [[2, 3, 4, 5, 6, 7, 8], [2, 9, 5, 10, 11, 0, 0]]
    assert b.old_logprobs[0].tolist() == pytest.approx([0, 0, -0.1, -0.1, 0, 0, 0, -0.2])
    assert b.rollout_logprobs[1].tolist() == pytest.approx([0, -0.1, 0, -0.2, -0.2, 0, 0])
    assert b.has_rollout_logprobs and b.n_tokens == 6
    assert b.response_start.tolist() == [2, 2]
    assert b.group_ids.tolist() == [0, 0] and b.rewards.tolist() == [1.0, 0.0]
    assert b.step_spans == [[(1, 3), (6, 7)], [(1, 2), (3, 5)]]
    # verl's response mask (algo.gae_over=response): every real target after the prompt, the
    # observation's too; the loss mask above keeps model tokens only.
    assert b.response_mask.tolist() == [[0, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0, 0]]


def test_missing_logprobs_are_flagged():
    b = collate([multi_turn("a", [1], [2], [3], [4], lp=False)])
    assert not b.has_rollout_logprobs and b.old_logprobs.abs().sum() == 0


def test_group_ids_are_prompt_indices():
    a1, b1, a2, b2 = (multi_turn(e, p, [3], [4], [5]) for e, p in [("a", [1]), ("b", [2]), ("a", [1]), ("b", [2])])
    assert prompt_group_ids([a1, a2, b1, b2]) == [0, 0, 1, 1]
    assert prompt_group_ids([a1, b1, a2, b2]) == [0, 1, 0, 1]  # interleaved samples still share
    assert collate([a1, b1, a2]).group_ids.tolist() == [0, 1, 0]
    assert collate([a1, a2], group_ids=[5, 5]).group_ids.tolist() == [5, 5]  # explicit ids win


def test_truncation_clips_spans():
    t = multi_turn("a", [1, 2], [3, 4], [5, 6, 7], [8])
    b = collate([t], max_len=4)  # keeps tokens 1 2 3 4: the second model turn is cut off
    assert b.input_ids.tolist() == [[1, 2, 3, 4]] and b.mask.tolist() == [[0, 1, 1]]
    assert b.step_spans == [[(1, 3)]]


def test_shift_and_token_logprobs_by_hand():
    # Two tokens [0, 1]; the logits at position 0 are [0, ln 3] -> p(1) = 3/4, so log p = ln .75.
    ids = torch.tensor([[0, 1]])  # [B, L]
    logits = torch.tensor([[[0.0, math.log(3)], [5.0, 5.0]]])  # [B, L, V]
    lg, targets, mask = shift_for_next_token(logits, ids, torch.tensor([[0.0, 1.0]]))
    assert lg.shape == (1, 1, 2) and targets.tolist() == [[1]] and mask.tolist() == [[1.0]]
    assert token_logprobs(lg, targets).item() == pytest.approx(math.log(0.75))


def test_empty_batch_is_an_error():
    with pytest.raises(ValueError):
        collate([])
