"""HARR retriever RL: rollouts through the agent, the loss, learning on a toy corpus, filter, CLI."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.build import simple_evaluate
from harness.config import from_dict
from harness.eval_config import BackendConfig, EvalConfig
from harness.retrieval.stochastic import StochasticDenseRetriever
from harness.types import Example, Trajectory
from pipelines.methods import build_method
from pipelines.search_agent import AgentConfig
from tests.helpers.harr_toy import OracleReader, tiny_tower, toy_index
from training.retriever.retriever_rl import (
    AgentRunner,
    RetrieverRL,
    filter_examples,
    per_call_loss,
    retrieval_loss,
    reward_of,
    step_layout,
)
from training.retriever_config import RetrieverRLConfig

# Questions that share no words with their documents: the tower has to learn where each answer is.
TARGETS = {
    "Name the secret of the purple owl?": "W3",
    "What hides beneath the frozen lantern?": "W11",
    "Tell the password for marble harbour?": "W16",
    "Recall the token of the sleeping giant?": "W7",
}
EXAMPLES = [Example(f"q{i}", q, (a,)) for i, (q, a) in enumerate(TARGETS.items())]


def _setup(tmp_path, seed=0, n_candidates=20, tau=0.05, topk=2, concurrency=8):
    tower = tiny_tower(seed=seed)
    retriever = StochasticDenseRetriever.from_index_dir(
        toy_index(tmp_path, tower), tower, n_candidates=n_candidates, tau=tau, seed=seed
    )
    # Concurrent rollouts: each retrieval call is seeded from (seed, step, example#sample, turn, query).
    options = {"max_turns": 1, "topk": topk, "max_concurrency": concurrency}
    agent = build_method("search_r1", OracleReader.backend(TARGETS), retriever, options)
    return retriever, AgentRunner(agent)


def greedy_em(runner, retriever, out) -> float:
    """EM of the tower's greedy (top-k) retrieval over EXAMPLES, through the eval path."""
    retriever.greedy = True  # the trainer's next step samples again
    cfg = EvalConfig(
        method="search_r1",
        backend=BackendConfig(kind="scripted"),
        metrics=["em"],
        out=str(out),
        agent={"max_turns": 1, "topk": 2},
    )
    res = simple_evaluate(cfg, backend=runner.agent.backend, retriever=retriever, examples=EXAMPLES)
    return res.metrics["em"]


def test_rollouts_group_and_ratio_is_one_before_update(tmp_path):
    retriever, runner = _setup(tmp_path)
    trajs = runner.run(EXAMPLES[:2], 3)
    assert [t.example_id for t in trajs] == ["q0"] * 3 + ["q1"] * 3
    assert all(len(t.searches) == 1 and t.searches[0].sample is not None for t in trajs)
    # The oracle answers right exactly when the gold document was retrieved.
    for t in trajs:
        gold_doc = f"d{t.answers[0][1:]}"
        assert reward_of(t, "em") == float(gold_doc in t.searches[0].doc_ids)
    retriever.tower.freeze_reference()
    layout = step_layout(trajs)
    new = layout.grid(retriever.recompute_logprobs(layout.samples))  # [B, 1]: one call each
    assert layout.mask.all() and torch.allclose(new, layout.old_logp, atol=1e-3)
    loss, stats = retrieval_loss(retriever, trajs, torch.ones(len(trajs)), RetrieverRLConfig(kl_coef=0.1))
    assert stats["kl"] == pytest.approx(0.0, abs=1e-5) and loss.requires_grad


def test_per_call_ratio_clip_and_k3_by_hand():
    """HARR's _compute_loss with two calls. Trajectory A (advantage +1): calls with ratios 1.5 and
    0.5 (old log-probs 0); B (advantage −1): one call with ratio 2. Clip ε = 0.2.

    A: call 0 −min(1.5, 1.2) = −1.2 (clipped), call 1 −min(0.5, 0.8) = −0.5; mean over A's calls
    −0.85. (The summed log-prob clips the product 0.75 instead: −min(0.75, 0.8) = −0.75.)
    B: −min(−2, −1.2) = 2. Mean over trajectories: (−0.85 + 2) / 2 = 0.575.
    k3 to a reference at log-prob 0, d = ref − logp: A: d = −ln 1.5 → 2/3 + .405465 − 1 = .072132,
    d = ln 2 → 2 − .693147 − 1 = .306853, mean .189492; B: d = −ln 2 → .5 + .693147 − 1 = .193147.
    Mean over trajectories .191320 (k3 of A's summed log-ratio would give .045652 instead).
    β = 0.1: 0.575 + 0.019132 = 0.594132."""
    import math

    new = torch.tensor([[math.log(1.5), math.log(0.5)], [math.log(2.0), 0.0]], requires_grad=True)  # [B, T]
    old, ref = torch.zeros(2, 2), torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    loss, stats = per_call_loss(new, old, adv, mask, ref, clip_eps=0.2, kl_coef=0.1, agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx(0.594132, abs=1e-5)
    assert stats["clip_frac"] == pytest.approx(1 / 3)  # A's first call only
    assert stats["kl"] == pytest.approx((0.072132 + 0.306853 + 0.193147) / 3, abs=1e-5)  # mean over calls
    policy, _ = per_call_loss(new, old, adv, mask, clip_eps=0.2, agg="seq_mean_token_mean")
    assert policy.item() == pytest.approx(0.575, abs=1e-6)
    # Gradient of the policy term: 0 on the clipped call; −ρA × ½ (A's 2 calls) × ½ (2 trajectories)
    # = −0.5/4 = −0.125 on A's second; −ρA × 1 × ½ = 2/2 = 1 on B's call; 0 on the padding.
    policy.backward()
    assert new.grad.tolist() == [pytest.approx([0.0, -0.125]), pytest.approx([1.0, 0.0])]


def test_per_call_loss_default_is_trl_bnpo_by_hand():
    """TRL 0.18.1's default loss_type bnpo (grpo_trainer.py 1281-1283), HARR's: the sum over every
    call of the batch / the number of calls. The calls of the test above: (−1.2 − 0.5 + 2) / 3 = 0.1;
    k3 (.072132 + .306853 + .193147) / 3 = .190711, β = 0.1: 0.1 + .0190711 = .1190711. Gradient:
    each call weighs 1/3: −0.5/3 on A's second call, +2/3 on B's."""
    import math

    new = torch.tensor([[math.log(1.5), math.log(0.5)], [math.log(2.0), 0.0]], requires_grad=True)  # [B, T]
    old, ref = torch.zeros(2, 2), torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    loss, _ = per_call_loss(new, old, adv, mask, ref, clip_eps=0.2, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1190711, abs=1e-5)
    policy, _ = per_call_loss(new, old, adv, mask, clip_eps=0.2)
    assert policy.item() == pytest.approx(0.1, abs=1e-6)
    policy.backward()
    assert new.grad.tolist() == [pytest.approx([0.0, -0.5 / 3]), pytest.approx([2 / 3, 0.0])]


def test_samples_do_not_depend_on_concurrency(tmp_path):
    """Concurrency 1 and 8 draw the same documents for every (question, sample); the G samples of
    a question still differ from each other, and a new trainer step (salt) draws anew."""

    def sampled(concurrency, salt=0):
        (tmp_path / f"c{concurrency}-{salt}").mkdir()
        retriever, runner = _setup(tmp_path / f"c{concurrency}-{salt}", tau=1.0, concurrency=concurrency)
        retriever.salt = salt
        trajs = runner.run(EXAMPLES, 6)
        return [(t.example_id, t.sample_index, tuple(t.searches[0].doc_ids)) for t in trajs]

    one, eight = sampled(1), sampled(8)
    assert one == eight
    per_question = {}
    for ex_id, _, docs in one:
        per_question.setdefault(ex_id, set()).add(docs)
    assert all(len(v) > 1 for v in per_question.values()), per_question
    assert sampled(8, salt=1) != eight


@pytest.mark.slow  # ~20 s on a shared 2-core VM
def test_reward_rises_on_toy_corpus(tmp_path):
    """Real learning: 20 docs, 2 sampled per question, the gold one is found by chance ~10% of the
    time at start; GRPO on the tower must raise the sampled reward and the greedy EM."""
    retriever, runner = _setup(tmp_path)
    before = greedy_em(runner, retriever, tmp_path / "before")
    cfg = RetrieverRLConfig(
        group_size=8, questions_per_step=4, steps=10, lr=1e-2, epochs=2, kl_coef=0.0, reward="em", seed=0
    )
    rewards: list[float] = []
    trainer = RetrieverRL(retriever, runner, cfg, tmp_path / "run")
    saved = trainer.train(EXAMPLES, on_step=lambda r: rewards.append(r.metrics["reward"]))
    after = greedy_em(runner, retriever, tmp_path / "after")
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert late > early + 0.2, rewards  # seen: 0.23 → 0.55
    assert after > before, (before, after)
    assert (saved / "config.json").is_file() and (tmp_path / "run" / "metrics.jsonl").is_file()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 10 and "reward" in json.loads(lines[0])


def test_filter_keeps_mixed_outcome_questions(tmp_path):
    retriever, runner = _setup(tmp_path, tau=1.0, topk=2)
    easy = Example("e", "Which code does the rope walk keep?", ("W17",))  # not in TARGETS: always wrong
    targets_runner = runner
    kept, rows = filter_examples(targets_runner, [*EXAMPLES, easy], n=8)
    by_id = {r["id"]: r for r in rows}
    assert by_id["e"]["successes"] == 0 and not by_id["e"]["kept"]
    assert [e.id for e in kept] == [r["id"] for r in rows if 0 < r["successes"] < 8]
    assert kept and all(r["samples"] == 8 for r in rows)


@pytest.mark.slow  # two CLI runs + eval factory, ~15-40 s on the shared VM
def test_cli_train_filter_and_eval_encoder(tmp_path):
    """`harness train` (algo.kind: retriever), `harness data harr-filter`, and the saved encoder as the
    query encoder of the same index through the eval retriever factory."""
    import yaml
    from typer.testing import CliRunner

    from cli.main import app
    from harness.eval_config import RetrieverConfig
    from harness.retrieval.factory import build_retriever

    tower = tiny_tower(seed=2)
    tower_dir = tower.save(tmp_path / "tower")
    index = toy_index(tmp_path, tower)
    qfile, script = tmp_path / "q.jsonl", tmp_path / "script.jsonl"
    qfile.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in EXAMPLES[:2]))
    script.write_text(
        "".join(
            json.dumps({"match": e.question, "turns": [f"<search>{e.question}</search>", "<answer>W3</answer>"]}) + "\n"
            for e in EXAMPLES[:2]
        )
    )
    recipe = {
        "algo": {"kind": "retriever"},
        "data": {"file": str(qfile)},
        "retriever_rl": {
            "method": "search_r1",
            "index": str(index),
            "encoder": {"name": str(tower_dir)},
            "backend": {"kind": "scripted", "script": str(script)},
            "sampling": {"n_candidates": 8, "topk": 2},
            "agent": {"max_turns": 1},
            "rl": {"steps": 1, "group_size": 2, "questions_per_step": 2},
        },
    }
    cfg = tmp_path / "harr.yaml"
    cfg.write_text(yaml.safe_dump(recipe))
    cli = CliRunner()
    res = cli.invoke(app, ["train", "-c", str(cfg), "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    encoder = tmp_path / "run" / "encoder"
    assert (encoder / "model.safetensors").is_file() and (tmp_path / "run" / "metrics.jsonl").is_file()
    res = cli.invoke(
        app, ["data", "harr-filter", "-c", str(cfg), "--out", str(tmp_path / "kept.jsonl"), "--samples", "2"]
    )
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (tmp_path / "kept.stats.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q0", "q1"]
    retriever = build_retriever(RetrieverConfig(kind="dense", index=str(index), model=str(encoder)))
    assert retriever.inner.encoder.spec.path == str(encoder)
    assert len(retriever.search(["purple owl"], 3)[0]) == 3


def test_shipped_retriever_recipes_compose():
    from pathlib import Path

    from harness.config import compose
    from training.config import TrainConfig

    recipes = sorted((Path(__file__).resolve().parents[3] / "configs" / "train" / "harr").glob("*.yaml"))
    assert recipes
    for path in recipes:
        cfg = compose(TrainConfig, [path])
        assert cfg.algo.kind == "retriever" and cfg.papers
        from_dict(AgentConfig, cfg.retriever_rl.agent, where="retriever_rl.agent")


def test_training_step_syncs_served_retriever(tmp_path):
    """With rl.sync_url the trainer pushes its tower to `harness serve retriever`'s admin route."""
    from harness.retrieval.encoders import Encoder
    from harness.retrieval.index import load_index
    from harness.retrieval.server import create_app
    from tests.harness.conftest import ServerThread

    retriever, runner = _setup(tmp_path)
    enc0 = retriever.tower.save(tmp_path / "enc0")
    app = create_app(load_index(tmp_path / "index", encoder=Encoder(str(enc0), device="cpu")))
    with ServerThread(app) as s:
        cfg = RetrieverRLConfig(group_size=2, questions_per_step=2, steps=2, lr=1e-2, sync_url=s.url)
        trainer = RetrieverRL(retriever, runner, cfg, tmp_path / "run")
        trainer.train(EXAMPLES[:2])
    synced = (tmp_path / "run" / "sync" / "step-2").resolve()
    assert app.encoder_version == 2 and app.encoder_path == str(synced)
    assert not (tmp_path / "run" / "sync" / "step-1").exists()  # the previous sync dir is cleaned up
    texts = ["Name the secret of the purple owl?"]
    assert abs(app.retriever.encoder.encode(texts, kind="query") - retriever.tower.encode(texts, "query")).max() < 1e-4


def _traj(i, reward_answer, logps):
    from harness.types import SearchRecord, Trajectory

    t = Trajectory(f"q{i}", "?", ["yes"], "search_r1", prediction=reward_answer, finish_reason="answer")
    t.searches = [SearchRecord(j, "q", [], [], 0.0, [], sample={"logprob": lp}) for j, lp in enumerate(logps)]
    return t


def test_ppo_advantages_by_hand():
    """Two trajectories: A has two retrieval calls (reward 1, V = 0.2, 0.5), B one (reward 0, V = 0.4)."""
    from training.retriever.retriever_rl import ppo_advantages, step_layout

    trajs = [_traj(0, "yes", [-1.0, -2.0]), _traj(1, "no", [-0.5]), _traj(2, "yes", [])]
    layout = step_layout(trajs)
    assert layout.mask.tolist() == [[True, True], [True, False], [False, False]]
    assert layout.old_logp.tolist() == [[-1.0, -2.0], [-0.5, 0.0], [0.0, 0.0]]
    rewards = torch.tensor([reward_of(t, "em") for t in trajs])  # [1, 0, 1]: C has no call, no signal
    values = torch.tensor([[0.2, 0.5], [0.4, 0.0], [0.0, 0.0]])
    # γ = λ = 1: A_1 = 1 − 0.5 = 0.5, A_0 = (0 + 0.5 − 0.2) + 0.5 = 0.8; B: 0 − 0.4 = −0.4.
    adv, ret = ppo_advantages(rewards, values, layout.mask, 1.0, 1.0, whiten=False)
    assert torch.allclose(adv, torch.tensor([[0.8, 0.5], [-0.4, 0.0], [0.0, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))
    # γ = 0.9, λ = 0.5: A_1 = 0.5, A_0 = (0.9·0.5 − 0.2) + 0.9·0.5·0.5 = 0.25 + 0.225 = 0.475.
    adv, _ = ppo_advantages(rewards, values, layout.mask, 0.9, 0.5, whiten=False)
    assert torch.allclose(adv[0], torch.tensor([0.475, 0.5]))
    # Whitened over the 3 calls (unbiased std): mean 0.3, var ((0.5)² + 0.2² + 0.7²) / 2 = 0.39.
    adv, _ = ppo_advantages(rewards, values, layout.mask, 1.0, 1.0, whiten=True)
    want = torch.tensor([0.5, 0.2, -0.7]) / 0.39**0.5
    assert torch.allclose(adv[layout.mask], want, atol=1e-4) and adv[2].abs().sum() == 0
    # HARR's PPO folds −β·k1 per call into that call's reward: A's calls get −0.1 and −0.2, so its
    # token rewards are (−0.1, 1 − 0.2): A_1 = 0.8 − 0.5 = 0.3, A_0 = (−0.1 + 0.5 − 0.2) + 0.3 = 0.5;
    # B: −0.05 − 0.4 = −0.45; C has no call, so its penalty is masked out.
    call_rewards = torch.tensor([[-0.1, -0.2], [-0.05, -9.0], [-9.0, -9.0]])
    adv, ret = ppo_advantages(rewards, values, layout.mask, 1.0, 1.0, False, call_rewards)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.3], [-0.45, 0.0], [0.0, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.7, 0.8], [-0.05, 0.0], [0.0, 0.0]]))


def test_ppo_loss_ratio_one_and_value_head_only_from_value_loss(tmp_path):
    from training.engine import ValueHead
    from training.retriever.retriever_rl import ppo_advantages, ppo_loss, step_layout

    retriever, runner = _setup(tmp_path)
    trajs = runner.run(EXAMPLES[:2], 3)
    retriever.tower.freeze_reference()
    layout = step_layout(trajs)
    head = ValueHead(dim=retriever.tower.dim, hidden=16)
    with torch.no_grad():
        old_v = layout.grid(head(retriever.recompute(layout.samples)[1]))
    rewards = torch.tensor([reward_of(t, "em") for t in trajs])
    adv, ret = ppo_advantages(rewards, old_v, layout.mask, 1.0, 1.0, True)
    cfg = RetrieverRLConfig(algo="ppo", kl_coef=0.1)
    loss, stats = ppo_loss(retriever, head, layout, adv, ret, old_v, cfg)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-3) and stats["kl"] == pytest.approx(0.0, abs=1e-5)
    assert stats["value_loss"] == pytest.approx(0.5 * float(((old_v - ret)[layout.mask] ** 2).mean()), rel=1e-4)
    loss.backward()
    assert all(p.grad is not None for p in head.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in retriever.tower.parameters())


@pytest.mark.slow  # ~20 s on a shared 2-core VM
def test_ppo_reward_rises_on_toy_corpus(tmp_path):
    """PPO (value head, GAE, whitening) on the same toy task as GRPO: the reward must rise."""
    retriever, runner = _setup(tmp_path)
    before = greedy_em(runner, retriever, tmp_path / "before")
    cfg = RetrieverRLConfig(
        algo="ppo", group_size=8, questions_per_step=4, steps=10, lr=1e-2, epochs=2, kl_coef=0.0, reward="em"
    )
    rewards: list[float] = []
    trainer = RetrieverRL(retriever, runner, cfg, tmp_path / "run")
    trainer.train(EXAMPLES, on_step=lambda r: rewards.append(r.metrics["reward"]))
    after = greedy_em(runner, retriever, tmp_path / "after")
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert late > early + 0.2, rewards
    assert after > before, (before, after)
    assert (tmp_path / "run" / "value_head.safetensors").is_file()
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "loss/value_loss" in metrics[-1]


def test_lr_schedule_is_set_once_per_step(tmp_path):
    """retriever_rl.rl.schedule linear over schedule_steps 4 (HARR's PPO: TrainingArguments'
    linear over its 313 batches, stepped once per batch): step k (1-based) runs at
    lr × (4 − (k − 1)) / 4 = 1e-2, .75e-2, .5e-2, .25e-2, then 0 past the span; constant keeps 1e-2."""
    retriever, runner = _setup(tmp_path)
    lrs: list[float] = []
    cfg = RetrieverRLConfig(
        group_size=2, questions_per_step=1, steps=5, lr=1e-2, schedule="linear", schedule_steps=4, kl_coef=0.0
    )
    RetrieverRL(retriever, runner, cfg, tmp_path / "run").train(EXAMPLES, on_step=lambda r: lrs.append(r.metrics["lr"]))
    assert lrs == pytest.approx([1e-2, 0.75e-2, 0.5e-2, 0.25e-2, 0.0])
    lrs.clear()
    cfg = RetrieverRLConfig(group_size=2, questions_per_step=1, steps=2, lr=1e-2, kl_coef=0.0)
    RetrieverRL(retriever, runner, cfg, tmp_path / "run2").train(
        EXAMPLES, on_step=lambda r: lrs.append(r.metrics["lr"])
    )
    assert lrs == pytest.approx([1e-2, 1e-2])


class _SilentRunner:
    """Rollouts that never search (HARR's generator then makes a pseudo-call on the question)."""

    def run(self, examples, n):
        return [
            Trajectory(
                ex.id, ex.question, list(ex.answers), "m", prediction="W3", finish_reason="answer", sample_index=k
            )
            for ex in examples
            for k in range(n)
        ]


def test_a_rollout_without_a_search_trains_on_a_pseudo_call(tmp_path):
    """generator.py: ``if not source_node`` retrieves the question itself (empty history), its
    greedy top-k unsampled, and the rollout's reward trains the tower on that call."""
    retriever, _ = _setup(tmp_path)
    cfg = RetrieverRLConfig(group_size=2, questions_per_step=1, steps=1, lr=1e-2, kl_coef=0.0, reward="em")
    rl = RetrieverRL(retriever, _SilentRunner(), cfg, tmp_path / "run", topk=2)
    trajs = _SilentRunner().run(EXAMPLES[:2], 2)
    rl._add_pseudo_calls(trajs)
    for t in trajs:
        (s,) = t.searches
        assert s.turn == -1 and s.query == t.question and len(s.docs) == 2
        assert s.sample["greedy"] and s.sample["sampled"] == [0, 1]  # the top 2, not a draw
    assert not retriever.greedy  # left as it was: rollouts sample
    layout = step_layout(trajs)
    assert layout.mask.all() and layout.mask.shape == (4, 1)
    # Rewards differ within the group (EM 1 for q0's "W3", 0 for q1): the pseudo-calls carry a gradient.
    loss, _ = retrieval_loss(retriever, trajs, torch.tensor([1.0, -1.0, 1.0, -1.0]), cfg)
    assert loss.requires_grad
    off = RetrieverRL(
        retriever, _SilentRunner(), RetrieverRLConfig(**{**cfg.__dict__, "pseudo_call": False}), tmp_path / "r2"
    )
    assert off.step(EXAMPLES[:1]).metrics["retrievals_per_traj"] == 0.0
    assert rl.step(EXAMPLES[:1]).metrics["retrievals_per_traj"] == 1.0


def test_start_encoder_searches_as_step_zero_and_is_rewritten_only_for_another_recipe(tmp_path):
    """save_start_encoder: the recipe's untrained tower with its state format in the sidecar, so the
    eval factory's ``harr`` retriever renders the training's state; kept while the recipe's tower
    and sampling are the same, replaced (and said so) when they change."""
    from harness.config import compose
    from harness.eval_config import RetrieverConfig
    from harness.retrieval.factory import build_retriever as eval_retriever
    from harness.retrieval.state import RetrievalState
    from harness.retrieval.stochastic import render_state
    from training.config import TrainConfig
    from training.retriever.retriever_rl import START_RECORD, build_retriever, save_start_encoder

    tower_dir = tiny_tower(seed=3).save(tmp_path / "tower")
    index = toy_index(tmp_path, tiny_tower(seed=3))
    base = [
        "algo.kind=retriever",
        f"retriever_rl.index={index}",
        f"retriever_rl.encoder.name={tower_dir}",
        "retriever_rl.sampling.max_chars=300",
    ]
    cfg = compose(TrainConfig, [], base)
    start = tmp_path / "start"
    assert save_start_encoder(cfg, start) is True
    assert json.loads((start / START_RECORD).read_text())["sampling"]["max_chars"] == 300
    assert save_start_encoder(cfg, start) is False  # the same recipe: kept
    trained_side = build_retriever(cfg)  # what the training's step 0 searches with
    evaluated = eval_retriever(RetrieverConfig(kind="harr", index=str(index), encoder=str(start), topk=2))
    state = RetrievalState(question="Name the secret of the purple owl?")
    assert evaluated.state_format == trained_side.state_format and evaluated.state_format.max_chars == 300
    query = "purple owl"
    assert render_state(query, state, evaluated.state_format) == render_state(query, state, trained_side.state_format)
    a = evaluated.search([query], 2, state=[state])[0]
    trained_side.greedy = True
    b = trained_side.search([query], 2, state=[state])[0]
    assert [d.id for d in a] == [d.id for d in b] and len(a) == 2
    other = compose(TrainConfig, [], [*base[:-1], "retriever_rl.sampling.max_chars=200"])
    assert save_start_encoder(other, start) is True  # another state format: a new start
    assert json.loads((start / START_RECORD).read_text())["sampling"]["max_chars"] == 200


def _validated_trainer(tmp_path, *overrides):
    """A retriever-RL trainer (tiny tower over the toy index, the oracle generator) validated on a
    local split of the toy questions (``data_dir/bamboogle/toyval.jsonl``) every step."""
    from harness.config import compose
    from training.build import build_trainer
    from training.config import TrainConfig

    tower_dir = tiny_tower(seed=4).save(tmp_path / "tower")
    index = toy_index(tmp_path, tiny_tower(seed=4))
    (tmp_path / "data" / "bamboogle").mkdir(parents=True)
    rows = "".join(json.dumps(e.to_dict()) + "\n" for e in EXAMPLES)
    (tmp_path / "data" / "bamboogle" / "toyval.jsonl").write_text(rows)
    (tmp_path / "q.jsonl").write_text(rows)
    cfg = compose(
        TrainConfig,
        [],
        [
            "algo.kind=retriever",
            "data.dataset=bamboogle",
            f"data.data_dir={tmp_path / 'data'}",
            f"data.file={tmp_path / 'q.jsonl'}",
            "data.val_split=toyval",
            "data.val_limit=4",
            "trainer.eval_every=1",
            "retriever_rl.method=search_r1",
            f"retriever_rl.index={index}",
            f"retriever_rl.encoder.name={tower_dir}",
            "retriever_rl.sampling.n_candidates=8",
            "retriever_rl.sampling.topk=2",
            "retriever_rl.agent.max_turns=1",
            "retriever_rl.rl.steps=2",
            "retriever_rl.rl.group_size=4",  # every question each step: both steps have a signal
            "retriever_rl.rl.questions_per_step=4",
            "retriever_rl.rl.lr=0.05",
            "retriever_rl.rl.reward=em",
            *overrides,
        ],
    )
    return build_trainer(cfg, tmp_path / "run", backend=OracleReader.backend(TARGETS)), index


def test_validation_searches_greedily_as_the_eval_path_does_the_trained_encoder(tmp_path):
    """data.val_split + trainer.eval_every: the tower is validated at steps 0, 1, 2 through the eval
    path, greedily; the last validation scores what `harness eval --retriever harr --encoder` gives
    the saved encoder, and the rollouts between them still sample."""
    from harness.eval_config import RetrieverConfig
    from harness.retrieval.factory import build_retriever as eval_retriever

    trainer, index = _validated_trainer(tmp_path)
    encoder = trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val/em"] for r in rows if "val/em" in r}
    assert sorted(val) == [0, 1, 2]
    assert [r["step"] for r in rows if "reward" in r] == [1, 2]
    for step in (0, 1, 2):
        (traj_file,) = (tmp_path / "run" / "validation" / f"step-{step}").glob("*/trajectories.jsonl")
        searches = [s for line in traj_file.read_text().splitlines() for s in json.loads(line)["searches"]]
        assert searches and all(s["sample"]["greedy"] for s in searches)
    assert not trainer.retriever.greedy  # rollouts sample again after a validation
    cfg = EvalConfig(
        method="search_r1",
        backend=BackendConfig(kind="scripted"),
        metrics=["em"],
        out=str(tmp_path / "eval"),
        agent={"max_turns": 1, "topk": 2},
    )
    evaluated = eval_retriever(RetrieverConfig(kind="harr", index=str(index), encoder=str(encoder), topk=2))
    res = simple_evaluate(cfg, backend=OracleReader.backend(TARGETS), retriever=evaluated, examples=EXAMPLES)
    assert res.metrics["em"] == val[2]


def test_best_metric_makes_the_encoder_the_best_validated_tower(tmp_path):
    """trainer.best_metric: encoder/ is the tower of the validation that scored highest (step 1
    here, scores given), not the last step's; the other kept towers are pruned."""
    from types import SimpleNamespace

    from safetensors.torch import load_file

    from harness.retrieval.stochastic import state_format_of

    trainer, _ = _validated_trainer(tmp_path, "trainer.best_metric=em")
    scores = {0: 0.25, 1: 0.75, 2: 0.5}

    def validate(step):
        trainer.retriever.save_tower(tmp_path / "seen" / f"step-{step}")  # the tower each validation saw
        return SimpleNamespace(metrics={"em": scores[step]})

    trainer.validate = validate
    encoder = trainer.train()
    weights = load_file(encoder / "model.safetensors")
    step1 = load_file(tmp_path / "seen" / "step-1" / "model.safetensors")
    step2 = load_file(tmp_path / "seen" / "step-2" / "model.safetensors")
    assert all(torch.equal(weights[k], step1[k]) for k in step1)
    assert any(not torch.equal(weights[k], step2[k]) for k in step2)  # the last step moved on
    assert state_format_of(encoder) == trainer.retriever.state_format  # the sidecar came along
    assert sorted(p.name for p in (tmp_path / "run").glob("best-step-*")) == ["best-step-1"]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["val/best_step"] for r in rows if "val/best_step" in r] == [0.0, 1.0, 1.0]
