"""ProRAG's four stages end to end on a tiny Llama (byte tokenizer) and a toy question, each stage's
output feeding the next, every artifact checked:

1. SFT warm-up on the agent's protocol-following trajectories → an SFT checkpoint;
2. MCTS step values through the agent loop (values in range, sibling pairs) → a PRM trained from
   the SFT checkpoint whose pair accuracy on its own training pairs is above chance;
3. RFT: K sampled trajectories per question (``evaluate(..., n_samples=K)``), filtered by outcome
   and by the learned PRM's step scores → an SFT run from the SFT checkpoint on the kept set;
4. dual-granularity RL from the RFT checkpoint whose step advantages come from the learned PRM.

Generation in stages 1–3 is the scripted policy of ``tests/training/data/test_mcts.py`` (a sampled
request's seed picks one of three behaviours: right, wrong, half-right), so the tree and the
samples have the spread a trained policy would give; stage 4 rolls out the tiny model itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.evaluate import evaluate
from harness.config import compose
from harness.retrieval.memory import InMemoryRetriever
from harness.run_records import RunManifest
from pipelines.search_agent import AgentConfig, SearchAgent
from tests.pipelines.conftest import TOY_DOCS
from tests.training.data.test_mcts import EXAMPLES, GOOD, HALF, WRONG, SeededScripts, make_agent
from training.config import TrainConfig
from training.data.mcts import PAIRS_FILE, STEPS_FILE, MCTSConfig, run_mcts
from training.data.rft import RFTFilterConfig, rft_filter
from training.prm.prm import PRMStepScorer

pytestmark = pytest.mark.slow

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
TINY_MODEL = "tiny: " + json.dumps({**TINY, "num_key_value_heads": 1})  # JSON is YAML flow

SFT = f"""
name: prorag_sft_tiny
model:
  {TINY_MODEL}
algo: {{kind: sft}}
optim: {{lr: 1.0e-3, micro_batch_size: 2}}
trainer: {{max_steps: 3, save_every: 0, tensorboard: false, progress: false}}
"""

PRM = """
name: prorag_prm_tiny
model: {path: PLACEHOLDER}
algo: {kind: prm}
prm: {batch_size: 4, val_fraction: 0.0, max_len: 512, too_long: left}
optim: {lr: 1.0e-3, micro_batch_size: 4}
trainer: {max_steps: 12, save_every: 0, tensorboard: false, progress: false}
"""

RL = """
name: prorag_rl_tiny
model: {path: PLACEHOLDER}
data: {dataset: demo, split: test, limit: 4}
rollout:
  method: prorag
  n_samples: 2
  prompts_per_step: 2
  sampling: {temperature: 1.0, max_new_tokens: 16}
  agent: {max_turns: 1, max_total_tokens: 1200, chat: false, max_doc_tokens: 16}
retriever: {kind: memory}
algo: {advantage: dual_granularity, loss_agg: dapo, reward: prorag, step_scorer: prm}
optim: {lr: 1.0e-3, micro_batch_size: 1}
trainer: {max_steps: 1, save_every: 0, tensorboard: false, progress: false}
"""


def _train(tmp: Path, name: str, text: str, overrides: list[str]) -> tuple[object, Path]:
    from training.build import build_trainer

    (tmp / f"{name}.yaml").write_text(text)
    cfg = compose(TrainConfig, [tmp / f"{name}.yaml"], overrides)
    trainer = build_trainer(cfg, tmp / name)
    return trainer, trainer.train()


def _manifest(n_total: int) -> RunManifest:
    return RunManifest(method="prorag", dataset="toy", split="test", n_total=n_total)


def test_prorag_four_stages_end_to_end(tmp_path):
    # --- 1. SFT warm-up: the right protocol-following trajectories, as a harness run directory.
    demo_run = tmp_path / "demo_run"
    evaluate(make_agent((GOOD,)), EXAMPLES, demo_run, ["em", "f1"], _manifest(len(EXAMPLES)))
    _, sft_final = _train(tmp_path, "sft", SFT, [f"sft.sources=[{{kind: run, path: {demo_run}, where: 'em >= 1'}}]"])
    assert (sft_final / "model.safetensors").is_file() and (sft_final / "tokenizer.json").is_file()

    # --- 2a. MCTS through the agent loop: step records with values in range, sibling pairs.
    mcts_dir = tmp_path / "mcts"
    cfg = MCTSConfig(num_simulations=10, expansion_width=4, max_depth=6, margin=0.3, concurrency=1)
    run_mcts(make_agent((GOOD, WRONG, HALF)), EXAMPLES[:2], cfg, mcts_dir)
    steps = [json.loads(x) for x in (mcts_dir / STEPS_FILE).read_text().splitlines()]
    pairs = [json.loads(x) for x in (mcts_dir / PAIRS_FILE).read_text().splitlines()]
    assert steps and all(0.0 <= s["value"] <= 1.0 and s["visits"] >= 1 for s in steps)
    assert pairs, "the right and the wrong first steps must make at least one contrastive pair"

    # --- 2b. The PRM, from the SFT checkpoint, learns its pairs (above chance).
    prm, prm_final = _train(tmp_path, "prm", PRM.replace("PLACEHOLDER", str(sft_final)), [f"prm.data=[{mcts_dir}]"])
    acc = prm.pair_accuracy(prm.train_pairs)
    assert acc > 0.5, f"PRM pair accuracy {acc:.2f} on its own training pairs is not above chance"
    scorer = PRMStepScorer(path=str(prm_final))

    # --- 3. RFT: K=4 samples per question, kept by outcome and by the learned PRM's step scores.
    samples = tmp_path / "samples"
    backend = SeededScripts([GOOD, WRONG, HALF])  # sample j decodes with seed j: one behaviour each
    config = AgentConfig(max_turns=6, max_total_tokens=8192, temperature=0.9, seed=0)
    sampler = SearchAgent(backend, InMemoryRetriever(TOY_DOCS), "prorag", config)
    evaluate(sampler, EXAMPLES, samples, ["em", "f1"], _manifest(len(EXAMPLES) * 4), n_samples=4)
    rft_set = tmp_path / "rft_set"
    threshold = _median_mean_step_score(samples, scorer)
    summary = rft_filter(
        [samples],
        rft_set,
        RFTFilterConfig(metric="f1", min_outcome=0.5, step_scorer="prm", step_agg="mean", step_threshold=threshold),
        scorer=scorer,
    )
    assert 0 < summary.n_kept < summary.n_in, summary.line()
    assert summary.dropped.get("outcome", 0) > 0  # the wrong answers went
    assert (rft_set / "rft_summary.json").is_file() and (rft_set / "decisions.jsonl").is_file()
    rft_sft = SFT.replace(TINY_MODEL, f"path: {sft_final}")  # from the SFT checkpoint
    _, rft_final = _train(tmp_path, "rft", rft_sft, [f"sft.sources=[{{kind: run, path: {rft_set}}}]"])
    assert (rft_final / "model.safetensors").is_file()

    # --- 4. Dual-granularity RL from the RFT checkpoint, step advantages from the learned PRM.
    from training.build import build_trainer

    (tmp_path / "rl.yaml").write_text(RL.replace("PLACEHOLDER", str(rft_final)))
    cfg = compose(TrainConfig, [tmp_path / "rl.yaml"], [f"algo.step_scorer_path={prm_final}"])
    rl = build_trainer(cfg, tmp_path / "rl")
    assert isinstance(rl.rl_update.step_scorer, PRMStepScorer)
    seen: list[list[float]] = []
    score_many = rl.rl_update.step_scorer.score_many

    def recorded(trajs):  # the scores the step's advantages are computed from, all turns at once
        out = score_many(trajs)
        seen.extend([sc for _, _, sc in per] for per in out)
        return out

    rl.rl_update.step_scorer.score_many = recorded
    m = rl.step()
    assert m["grad_norm"] > 0 and all(v == v for v in m.values()), m
    assert len(seen) == 4, "every rollout of the step is scored by the learned PRM"
    assert all(0.0 < sc < 1.0 for scores in seen for sc in scores)  # sigmoid(PRM), not the rule's 0/1


def _median_mean_step_score(run: Path, scorer: PRMStepScorer) -> float:
    """The median over the right-enough samples of their mean PRM step score: a threshold that keeps
    about half of them (the PRM is tiny and barely trained; what it ranks higher is what is kept)."""
    from harness.types import Trajectory

    f1 = {(r["id"], r["sample_index"]): r["f1"] for r in _jsonl(run / "scores.jsonl")}
    means = []
    for rec in _jsonl(run / "trajectories.jsonl"):
        traj = Trajectory.from_dict(rec)
        if f1[(traj.example_id, traj.sample_index)] >= 0.5:
            scores = [sc for _, _, sc in scorer.score_steps(traj)]
            means.append(sum(scores) / len(scores))
    means.sort()
    return means[len(means) // 2]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]
