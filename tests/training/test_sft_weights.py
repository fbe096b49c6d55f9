"""ProRAG's tag-weighted SFT cross-entropy (training.sft_weights), by hand arithmetic."""

from __future__ import annotations

import pytest
import torch

from harness.tokenization import byte_tokenizer
from training.sft_weights import tag_id_weights, token_weights, weighted_token_mean

PRORAG = {"<answer>": 5.0, "</answer>": 5.0, "<subquery>": 3.0, "</step>": 2.0}


def test_tag_tokens_carry_their_weight_and_the_longer_tag_wins():
    tok = byte_tokenizer()  # one token per byte, so every position below is a character
    tags = tag_id_weights(tok, PRORAG)
    assert [len(ids) for ids, _ in tags] == [10, 9, 8, 7]  # </subquery>... longest first
    text = "x</step><answer>y</answer>"
    targets = torch.tensor([tok.encode(text, add_special_tokens=False)])  # [1, 26]
    w = token_weights(targets, tags)[0].tolist()
    want = [1.0] + [2.0] * 7 + [5.0] * 8 + [1.0] + [5.0] * 9  # </answer> is not read as <answer>
    assert w == want
    with pytest.raises(ValueError, match="must be > 0"):
        tag_id_weights(tok, {"<answer>": 0})


def test_weighted_mean_by_hand():
    """Tokens with nll 1, 2, 3, 4 and weights 1, 5, 5, 2, the last masked out:
    (1·1 + 5·2 + 5·3) / (1 + 5 + 5) = 26 / 11, as CrossEntropyLoss(weight=w) with mean reduction.
    Split over two micro-batches that each divide by the step's Σ w, the parts add up to it."""
    nll = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w = torch.tensor([[1.0, 5.0], [5.0, 2.0]])
    total = float((mask * w).sum())
    assert total == 11.0
    whole = weighted_token_mean(nll, mask, w, total)
    assert whole.item() == pytest.approx(26 / 11)
    parts = sum(weighted_token_mean(nll[i : i + 1], mask[i : i + 1], w[i : i + 1], total) for i in range(2))
    assert parts.item() == pytest.approx(26 / 11)
    # ProRAG's own form: CrossEntropyLoss(weight=class weights) over three targets (classes 0, 1, 1
    # with class weights 1 and 5) equals the weighted mean with each target's class weight.
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0]])
    targets = torch.tensor([0, 1, 1])
    ce = torch.nn.functional.cross_entropy(logits, targets, weight=torch.tensor([1.0, 5.0]))
    per = torch.nn.functional.cross_entropy(logits, targets, reduction="none")[None]  # [1, 3]
    ours = weighted_token_mean(per, torch.ones(1, 3), torch.tensor([[1.0, 5.0, 5.0]]), 11.0)
    assert ours.item() == pytest.approx(ce.item())
