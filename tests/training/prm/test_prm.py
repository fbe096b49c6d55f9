"""The process reward model: ``algo.kind: prm`` learns its own MCTS pairs (pair accuracy above
chance), saves/loads with safetensors, serves over loopback HTTP, and as ``algo.step_scorer: prm``
it is what the dual-granularity step advantages are computed from."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from harness.config import compose
from harness.types import Segment, Trajectory
from tests.training.data.test_mcts import EXAMPLES, make_agent
from training.advantages import dual_granularity, step_score_tensor
from training.batch import collate
from training.config import TrainConfig
from training.data.mcts import MCTSConfig, run_mcts
from training.prm.prm import (
    PairExample,
    PRMStepScorer,
    fitting,
    load_pairs,
    load_points,
    load_prm,
    pairwise_loss,
    pointwise_loss,
    prorag_step_format,
    split_held_out,
    step_sequences,
)
from training.prm_window import ScoringWindow
from training.rewards import RuleStepScorer, algo_step_scorer

TINY_PRM = """
name: prm
model:
  tiny: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}
algo: {kind: prm}
prm: {batch_size: 4, val_fraction: 0.0, max_len: 512, too_long: left}
optim: {lr: 1.0e-3, micro_batch_size: 4}
trainer: {max_steps: 12, save_every: 0, tensorboard: false, progress: false}
"""


@pytest.fixture(scope="module")
def mcts_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mcts")
    cfg = MCTSConfig(num_simulations=10, expansion_width=4, max_depth=6, margin=0.3, concurrency=1)
    run_mcts(make_agent(), EXAMPLES[:1], cfg, out)
    return out


@pytest.fixture(scope="module")
def trained(mcts_dir, tmp_path_factory):
    from training.build import build_trainer

    tmp = tmp_path_factory.mktemp("prm")
    (tmp / "prm.yaml").write_text(TINY_PRM)
    cfg = compose(TrainConfig, [tmp / "prm.yaml"], [f"prm.data=[{mcts_dir}]"])
    trainer = build_trainer(cfg, tmp / "run")
    before = pair_loss(trainer)
    final = trainer.train()
    return trainer, before, final


@torch.no_grad()
def pair_loss(trainer) -> float:
    """Mean Bradley-Terry loss over the training pairs under the current weights."""
    ps = trainer.train_pairs
    s = trainer._scores([p.chosen for p in ps] + [p.rejected for p in ps])
    return float(pairwise_loss(s[: len(ps)], s[len(ps) :]))


def test_pair_loss_by_hand():
    c, r = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0])
    want = -(torch.log(torch.sigmoid(torch.tensor(2.0))) + torch.log(torch.tensor(0.5))) / 2
    assert torch.isclose(pairwise_loss(c, r), want)


def test_pointwise_loss_by_hand_and_value_targets(mcts_dir, tmp_path):
    s, v = torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.25])
    p = torch.sigmoid(s)
    want = -(v * torch.log(p) + (1 - v) * torch.log(1 - p)).mean()
    assert torch.isclose(pointwise_loss(s, v), want)
    points = load_points([str(mcts_dir)], eos=None)
    steps = [json.loads(x) for x in (mcts_dir / "steps.jsonl").read_text().splitlines()]
    assert [pt.value for pt in points] == [r["value"] for r in steps]
    bad = tmp_path / "steps.jsonl"
    bad.write_text(json.dumps({**steps[0], "value": 2.5}) + "\n")
    with pytest.raises(ValueError, match="steps.jsonl:1.*\\[0, 1\\]"):
        load_points([str(tmp_path)], None)


def test_pairs_load_with_eos_and_a_held_out_split(mcts_dir):
    pairs = load_pairs([str(mcts_dir)], eos=7)
    assert len(pairs) >= 3 and all(p.chosen[-1] == 7 and p.rejected[-1] == 7 for p in pairs)
    rec = json.loads((mcts_dir / "pairs.jsonl").read_text().splitlines()[0])
    prefix = [t for s in rec["prefix"] for t in s["token_ids"]]
    assert pairs[0].chosen[: len(prefix)] == prefix and pairs[0].chosen != pairs[0].rejected
    train, val = split_held_out(list(range(100)), 0.02, 0)
    assert len(val) == 2 and sorted(train + val) == list(range(100))
    bad = mcts_dir.parent / "bad.jsonl"
    bad.write_text('{"prefix": []}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_pairs([str(bad)], None)


@pytest.mark.slow  # trains a tiny PRM (~30-90 s on a loaded 2-core machine)
def test_prm_learns_its_training_pairs_and_round_trips(trained):
    trainer, loss_before, final = trained
    after = trainer.pair_accuracy(trainer.train_pairs)
    # Above chance on its own training pairs, and it got there by learning: the pair loss fell
    # well below its starting value (log 2 ≈ 0.69 for an untrained head).
    assert after > 0.5, after
    assert pair_loss(trainer) < loss_before - 0.15, (loss_before, pair_loss(trainer))
    logged = [json.loads(x) for x in (trainer.out / "metrics.jsonl").read_text().splitlines()]
    assert any("prm/train_pair_acc" in m for m in logged) and logged[-1]["prm/train_pair_acc_all"] == after
    for f in ("model.safetensors", "head.safetensors", "config.json", "prm.json"):
        assert (final / f).exists(), f
    prm = load_prm(final)
    p = trainer.train_pairs[0]
    # The loaded PRM scores exactly as the trained one (EOS is already in the pair's ids).
    with torch.no_grad():
        s = trainer._scores([p.chosen, p.rejected]).tolist()
    loaded = prm.score([p.chosen[:-1], p.rejected[:-1]])
    assert loaded == pytest.approx(s, abs=1e-4) and loaded[0] > loaded[1]


def traj_with_steps(agent_trajs):
    return [t for t in agent_trajs if sum(s.role == "model" for s in t.segments) >= 2]


@pytest.mark.slow  # trains a tiny PRM (~30-90 s on a loaded 2-core machine)
def test_dual_granularity_step_advantages_come_from_the_prm(trained, tmp_path):
    import asyncio

    _, _, final = trained
    agent = make_agent()
    ex = EXAMPLES[0]
    from harness.backends.base import SamplingParams

    trajs = [asyncio.run(agent.arun(ex, sampling=SamplingParams(64, 1.0, seed=k, logprobs=True))) for k in range(3)]
    algo = compose(
        TrainConfig, [], ["algo.advantage=dual_granularity", "algo.step_scorer=prm", f"algo.step_scorer_path={final}"]
    ).algo
    scorer = algo_step_scorer(algo)
    assert isinstance(scorer, PRMStepScorer)
    batch = collate(trajs, rewards=[1.0, 0.0, 0.5], group_ids=[0, 0, 0])
    T = batch.mask.shape[1]
    got = step_score_tensor(trajs, scorer, T)  # [B, T]
    # By hand: σ(PRM(prefix + step)) of each model turn, on that turn's target positions, seen as
    # ProRAG's RL sees it (algo.step_scorer_*: no EOS, the first 4096 tokens), not as it was
    # trained (EOS appended, the end kept).
    prm = load_prm(final)
    want, trained = torch.zeros(len(trajs), T), torch.zeros(len(trajs), T)
    for i, t in enumerate(trajs):
        spans, seqs, _ = step_sequences(t)
        rl = prm.score(seqs, window=ScoringWindow(append_eos=False, max_len=4096, keep="first"))
        for (a, b), r, r_trained in zip(spans, rl, prm.score(seqs), strict=True):
            want[i, a - 1 : b - 1] = torch.sigmoid(torch.tensor(r))
            trained[i, a - 1 : b - 1] = torch.sigmoid(torch.tensor(r_trained))
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, trained, atol=1e-5)
    assert len({round(float(x), 4) for x in got[batch.mask.bool()]}) > 1  # the PRM tells steps apart
    adv = dual_granularity(batch.rewards, got, batch.group_ids, batch.mask, beta=0.3)
    rule = dual_granularity(batch.rewards, step_score_tensor(trajs, RuleStepScorer(), T), batch.group_ids, batch.mask)
    assert not torch.allclose(adv, rule)  # not the rule scorer's
    # The trainer builds this scorer from the recipe keys and its advantages are these.
    from tests.training.rl.test_trainer import make
    from training.rl.rl_update import Forward

    trainer = make(
        tmp_path,
        "algo.advantage=dual_granularity",
        "algo.step_scorer=prm",
        f"algo.step_scorer_path={final}",
        "trainer.save_every=0",
        "trainer.tensorboard=false",
    )
    assert isinstance(trainer.rl_update.step_scorer, PRMStepScorer)
    adv_t, _ = trainer.rl_update.advantages(batch.to(trainer.device), trajs, Forward(0, None, None, None))
    assert torch.allclose(adv_t.cpu(), adv, atol=1e-5)


def two_step_trajectory() -> Trajectory:
    """A ProRAG trajectory of two steps over byte ids: a subquery and its retrieval, then the answer."""
    t = Trajectory("q", "?", ["Lunne"], "prorag")
    t.segments = [
        Segment("prompt", [65, 66, 67]),
        Segment("model", [68, 69], "x</step>\n<subquery>a</subquery>"),
        Segment("observation", [70], "\n<retrieval>d</retrieval>\n<step>\n"),
        Segment("model", [71, 72, 73], "y</step>\n<answer>Lunne</answer>"),
    ]
    return t


@pytest.mark.slow  # trains a tiny PRM (~30-90 s on a loaded 2-core machine)
def test_served_prm_scores_like_the_in_process_one(trained):
    import socket

    import uvicorn

    from training.prm.prm_server import create_app

    _, _, final = trained
    app = create_app(load_prm(final))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        remote = PRMStepScorer(url=f"http://127.0.0.1:{port}")
        local = PRMStepScorer(path=str(final))
        t = two_step_trajectory()
        r, lo = remote.score_steps(t), local.score_steps(t)
        assert [x[2] for x in r] == pytest.approx([x[2] for x in lo], abs=1e-5)
        assert [(a, b) for a, b, _ in local.score_steps(t)] == [(3, 5), (6, 9)]
        import httpx

        bad = httpx.post(f"http://127.0.0.1:{port}/score", json={"sequences": "nope"})
        assert bad.status_code == 422 and "sequences" in bad.text
    finally:
        server.should_exit = True
        th.join(timeout=10)


def test_step_format_term_and_scorer_arguments():
    assert prorag_step_format("x</step>\n<subquery>q</subquery>\n<retrieval>d</retrieval>\n<step>\n") == 1.0
    assert prorag_step_format("x</step>\n<answer>a</answer>") == 1.0
    assert prorag_step_format("x<answer>a</answer>") == -2.0
    with pytest.raises(ValueError, match="exactly one"):
        PRMStepScorer()
    algo = compose(TrainConfig, [], ["algo.step_scorer=rule", "algo.step_scorer_path=/x"]).algo
    with pytest.raises(ValueError, match="step_scorer=prm"):
        algo_step_scorer(algo)


@pytest.mark.slow  # two tiny PRM trainers (~10-20 s on a loaded machine)
def test_prm_at_lr_1e30_stops_naming_the_step_and_saves_no_prm(mcts_dir, tmp_path):
    """Issue 31: a diverging PRM run skips its NaN steps and stops; it used to save a NaN PRM."""
    from training.build import build_trainer
    from training.divergence import DivergenceError

    (tmp_path / "prm.yaml").write_text(TINY_PRM)
    over = [f"prm.data=[{mcts_dir}]", "optim.lr=1e30", "trainer.max_steps=30", "trainer.max_nonfinite_steps=2"]
    trainer = build_trainer(compose(TrainConfig, [tmp_path / "prm.yaml"], over), tmp_path / "run")
    with pytest.raises(DivergenceError, match=r"diverged at step \d+"):
        trainer.train()
    assert trainer.step_no < 30 and not (tmp_path / "run" / "final").exists()


def test_checkpoint_resume_continues_the_same_run(mcts_dir, tmp_path):
    from training.build import build_trainer

    (tmp_path / "prm.yaml").write_text(TINY_PRM)
    over = [f"prm.data=[{mcts_dir}]", "trainer.save_every=1", "trainer.max_steps=3", "prm.max_len=256"]
    cfg = compose(TrainConfig, [tmp_path / "prm.yaml"], over)
    a = build_trainer(cfg, tmp_path / "a")
    a.step(), a.step()
    b = build_trainer(cfg, tmp_path / "a")
    b.resume(tmp_path / "a")
    assert b.step_no == 2 and b.sampler.state() == a.sampler.state()
    pa, pb = a.step(), b.step()  # the same next step: same pairs, same weights and optimizer state
    assert pa["loss"] == pytest.approx(pb["loss"], rel=1e-5)


@pytest.mark.slow  # trains a tiny PRM (~30-90 s on a loaded 2-core machine)
def test_a_steps_turns_are_scored_together_and_equal_one_by_one(trained):
    _, _, final = trained
    scorer = PRMStepScorer(path=str(final), batch_size=3)
    assert scorer.prm.device.type == "cpu" and next(scorer.prm.model.parameters()).dtype == torch.float32
    trajs = []
    for k in range(4):
        t = Trajectory(f"q{k}", "?", ["Lunne"], "prorag")
        t.segments = [
            Segment("prompt", [65, 66, 67 + k]),
            Segment("model", [68, 69] * (k + 1), "x</step>\n<subquery>a</subquery>"),
            Segment("observation", [70], "\n<retrieval>d</retrieval>\n<step>\n"),
            Segment("model", [71, 72, 73], "y</step>\n<answer>Lunne</answer>"),
        ]
        trajs.append(t)
    calls = []
    raw = scorer.raw_scores
    scorer.raw_scores = lambda seqs: calls.append(len(seqs)) or raw(seqs)
    together = scorer.score_many(trajs)
    assert calls == [8]  # one call for the step's 8 turns, batched inside
    one_by_one = [scorer.score_steps(t) for t in trajs]
    for a, b in zip(together, one_by_one, strict=True):
        assert [x[:2] for x in a] == [x[:2] for x in b]
        assert [x[2] for x in a] == pytest.approx([x[2] for x in b], abs=1e-5)


@pytest.mark.slow  # trains a tiny PRM
def test_one_prm_per_node_local_rank_0_serves_the_others(trained, monkeypatch):
    """Two ranks of one node: local rank 0 loads the PRM and serves it; local rank 1 loads
    nothing and scores through local rank 0's server, with the same scores."""
    import socket

    from training.prm.prm_scorer import _rendezvous_file

    _, _, final = trained
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))  # this "job"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    rank0 = PRMStepScorer(path=str(final))
    assert rank0.prm is not None and rank0.url is None and _rendezvous_file().is_file()
    monkeypatch.setenv("LOCAL_RANK", "1")
    rank1 = PRMStepScorer(path=str(final))
    assert rank1.prm is None and rank1.url.startswith("http://127.0.0.1:")
    t = two_step_trajectory()
    assert [x[2] for x in rank1.score_steps(t)] == pytest.approx([x[2] for x in rank0.score_steps(t)], abs=1e-5)
    _rendezvous_file().unlink()


def test_the_prm_server_answers_bad_token_ids_with_422_and_caps_the_length():
    """Issue 23 defect 11: negative, out-of-vocabulary and beyond-int64 token ids were a 500; a
    60k-token sequence was taken with no cap."""
    import asyncio

    import httpx

    from harness.tokenization import byte_tokenizer
    from training.engine import ValueHead, build_model
    from training.prm.prm import PRM
    from training.prm.prm_server import create_app

    tok = byte_tokenizer()
    cfg = compose(TrainConfig, [], []).model
    tiny = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    from dataclasses import replace

    model = ValueHead(build_model(replace(cfg, tiny={**tiny, "num_key_value_heads": 1}), vocab_size=len(tok)))
    app = create_app(PRM(model, tok), max_tokens=64)
    vocab = len(tok)

    async def post(body):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://prm") as c:
            return await c.post("/score", json=body)

    def answer(body):
        return asyncio.run(post(body))

    ok = answer({"sequences": [[65, 66], [67]]})
    assert ok.status_code == 200 and len(ok.json()["scores"]) == 2
    for bad, where in (([65, -1], "sequences.0.1"), ([vocab], "sequences.0.0"), ([2**70], "sequences.0.0")):
        r = answer({"sequences": [bad]})
        assert r.status_code == 422 and where in r.json()["detail"] and "outside the vocabulary" in r.json()["detail"]
    long = answer({"sequences": [[65], [66] * 65]})
    assert long.status_code == 413 and "sequences.1: 65 tokens" in long.json()["detail"] and "--max-tokens" in long.text
    # A window: the server scores what the client's algo.step_scorer_* ask for, the same as in process.
    seqs = [[65, 66, 67], [68]]
    w = {"append_eos": False, "max_len": 2, "keep": "first"}
    got = answer({"sequences": seqs, "window": w}).json()["scores"]
    assert got == pytest.approx(PRM(model, tok).score(seqs, window=ScoringWindow(False, 2, "first")), abs=1e-6)
    assert got != pytest.approx(ok_scores := answer({"sequences": seqs}).json()["scores"], abs=1e-6), ok_scores
    bad = answer({"sequences": seqs, "window": {"append_eos": False, "keep": "middle"}})
    assert bad.status_code == 422 and "window.keep" in bad.json()["detail"]


def test_scoring_window_and_too_long_pairs_by_hand():
    eos = 9
    assert ScoringWindow(append_eos=False, max_len=3, keep="first").apply([1, 2, 3, 4], eos) == [1, 2, 3]
    assert ScoringWindow(append_eos=True, max_len=3, keep="last").apply([1, 2, 3, 4], eos) == [3, 4, 9]
    assert ScoringWindow(append_eos=True, max_len=None).apply([1, 2], eos) == [1, 2, 9]
    # TRL's RewardTrainer keeps a pair only when chosen AND rejected fit max_length (prm.too_long: drop).
    pairs = [PairExample([1] * 3, [2] * 4), PairExample([1] * 5, [2] * 2), PairExample([1] * 4, [2] * 4)]
    assert fitting(pairs, 4, "drop") == [pairs[0], pairs[2]]
    assert fitting(pairs, 4, "left") == pairs and fitting(pairs, None, "drop") == pairs


def test_prm_final_holds_the_step_with_the_best_held_out_pair_accuracy(mcts_dir, tmp_path):
    """ProRAG's PRM (HF load_best_model_at_end, metric_for_best_model accuracy): val/pair_acc .5,
    .8, .6 at steps 1-3 -> final/ is step 2's PRM (its head's weights), the other bests removed."""
    from safetensors.torch import load_file

    from training.build import build_trainer
    from training.engine import unwrap

    (tmp_path / "prm.yaml").write_text(TINY_PRM)
    over = [f"prm.data=[{mcts_dir}]", "prm.val_fraction=0.2", "trainer.max_steps=3", "trainer.eval_every=1"]
    trainer = build_trainer(
        compose(TrainConfig, [tmp_path / "prm.yaml"], [*over, "trainer.best_metric=pair_acc"]), tmp_path / "run"
    )
    assert trainer.val_pairs
    accs, seen = {1: 0.5, 2: 0.8, 3: 0.6}, {}

    def scripted(pairs):
        seen[trainer.step_no] = {k: v.detach().clone() for k, v in unwrap(trainer.engine).head.state_dict().items()}
        return accs[trainer.step_no]

    trainer.pair_accuracy = scripted
    final = trainer.train()
    head = load_file(str(final / "head.safetensors"))
    assert all(torch.equal(head[k], seen[2][k]) for k in seen[2]) and any(
        not torch.equal(seen[2][k], seen[3][k]) for k in seen[2]
    )
    assert json.loads((final / "prm.json").read_text())["metrics"] == {"prm/val_pair_acc": 0.8}
    assert sorted(p.name for p in (tmp_path / "run").glob("best-step-*")) == ["best-step-2"]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["val/pair_acc"] for r in rows if "val/pair_acc" in r] == [0.5, 0.8, 0.6]
    assert load_prm(final).score([[65, 66]])  # a loadable PRM folder
