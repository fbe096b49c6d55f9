"""ProRAG's tag-weighted SFT cross-entropy (training.sft.sft_weights), by hand arithmetic."""

from __future__ import annotations

import pytest
import torch

from harness.tokenization import byte_tokenizer
from training.sft.sft_weights import tag_id_weights, token_weights, weighted_token_mean

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


@pytest.mark.slow
def test_the_sft_step_loss_is_the_tag_weighted_mean(tmp_path):
    """Through SFTTrainer: the logged loss of a step equals Σ w·nll / Σ w over its model tokens,
    with nll from the same weights before the step, and differs from the plain mean."""
    from harness.config import compose
    from harness.types import Segment, Trajectory
    from training.batch import collate
    from training.config import TrainConfig
    from training.sft.sft import SFTTrainer

    tok = byte_tokenizer()
    text = "a</step><answer>b</answer>"
    traj = Trajectory(
        example_id="q", question="q", answers=["b"], method="m",
        segments=[Segment("prompt", tok.encode("Q: ", add_special_tokens=False), "Q: "),
                  Segment("model", tok.encode(text, add_special_tokens=False), text)],
    )  # fmt: skip
    (tmp_path / "r.yaml").write_text(
        "model: {tiny: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2,"
        " num_key_value_heads: 1}}\nalgo: {kind: sft}\nsft: {batch_size: 1, shuffle: false}\n"
        "optim: {lr: 1.0e-3, micro_batch_size: 1}\ntrainer: {max_steps: 1, tensorboard: false, progress: false}\n"
    )
    cfg = compose(TrainConfig, [tmp_path / "r.yaml"], ["sft.tag_weights={'</step>': 2.0, '<answer>': 5.0}"])
    trainer = SFTTrainer(cfg, tmp_path / "run", trajectories=[traj])
    batch = collate([traj], pad_id=trainer.pad_id)
    with torch.no_grad():
        nll, m = trainer.nll(batch, slice(0, 1))  # [1, T']
    w = token_weights(batch.targets, trainer.tags)[:, : m.shape[1]]
    weighted = float((nll * m * w).sum() / (m * w).sum())
    plain = float((nll * m).sum() / m.sum())
    assert w.max() == 5.0 and abs(weighted - plain) > 1e-4
    assert trainer.step()["loss"] == pytest.approx(weighted, rel=1e-5)
