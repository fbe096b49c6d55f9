"""The shipped stage chains (ProRAG's four stages at paper scale and on CPU, RAG-R1's SFT → PPO)
resolve, feed each stage's output to the next, and name configs that compose; the ProRAG
recipes carry the paper's settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from harness.config import compose
from harness.eval_config import EvalConfig
from training.config import TrainConfig
from training.stages import load_chain

REPO = Path(__file__).resolve().parents[2]
CHAINS = [REPO / "configs/train/prorag/chain.yaml", REPO / "configs/train/prorag/cpu_chain.yaml"]
CHAINS.append(REPO / "configs/train/rag_r1/chain.yaml")
# Configs the MCTS / PRM module ships: named through chain vars, checked where present.
COORDINATED = ("mcts_config", "prm_config")


def config_args(stage):
    return stage.config[0] if stage.config else None


@pytest.mark.parametrize("path", CHAINS, ids=lambda p: p.parent.name + "/" + p.name)
def test_chain_resolves_and_its_configs_compose(path, monkeypatch):
    monkeypatch.chdir(REPO)
    chain = load_chain(path, workdir="W")
    coordinated = {chain.vars[k] for k in COORDINATED if k in chain.vars}
    for stage in chain.stages:
        assert stage.output.startswith("W/")
        cfg = config_args(stage)
        if cfg is None or (cfg in coordinated and not Path(cfg).exists()):
            continue
        # Option keys owned by the PRM module (vars named *_key) are left to its configs.
        foreign = tuple(v + "=" for k, v in chain.vars.items() if k.endswith("_key"))
        overrides = [a for a in stage.set if not a.startswith(foreign)]
        if stage.command[0] == "train":
            assert compose(TrainConfig, [cfg], overrides).papers
        elif stage.command[0] == "eval":
            compose(EvalConfig, [cfg], overrides)


def test_prorag_chain_feeds_sft_to_everything_then_rft_to_rl():
    chain = load_chain(REPO / "configs/train/prorag/chain.yaml", workdir="W")
    assert chain.names == ["sft", "mcts", "prm", "sample", "rft_set", "rft", "rl"]
    run = {s.name: " ".join(s.argv) for s in chain.stages}
    assert "--model W/sft/final" in run["mcts"] and "model.path=W/sft/final" in run["prm"]
    assert "--model W/sft/final" in run["sample"] and "--n-samples 1" in run["sample"]
    assert "rft-filter W/samples" in run["rft_set"] and "--step-scorer prm" in run["rft_set"]
    assert "path=W/prm/final" in run["rft_set"] and "--step-agg step" in run["rft_set"]
    assert "sft.sources=[{kind: run, path: W/rft_set}]" in run["rft"] and "model.path=W/sft/final" in run["rft"]
    assert "model.path=W/rft/final" in run["rl"] and "=W/prm/final" in run["rl"]
    # --set reaches the commands (K samples instead of ProRAG's one).
    k4 = load_chain(REPO / "configs/train/prorag/chain.yaml", workdir="W", variables={"k": "4"})
    assert "--n-samples 4" in " ".join(k4.stage("sample").argv)


def test_prorag_recipes_carry_the_papers_settings():
    sft = compose(TrainConfig, [REPO / "configs/train/prorag/sft.yaml"])
    assert sft.algo.kind == "sft" and sft.optim.lr == 2e-5 and sft.model.lora is None
    rl = compose(TrainConfig, [REPO / "configs/train/prorag/rl.yaml"])
    assert rl.algo.advantage == "dual_granularity" and rl.algo.step_scorer == "prm" and rl.algo.dual_beta == 0.3
    assert rl.rollout.n_samples == 8 and rl.optim.lr == 1e-5 and rl.model.lora.r == 16
    cpu_rl = compose(TrainConfig, [REPO / "configs/train/prorag/cpu_rl.yaml"])
    assert cpu_rl.algo.step_scorer == "prm" and cpu_rl.trainer.max_steps == 4
    sample = compose(EvalConfig, [REPO / "configs/train/prorag/rft_sample.yaml"])
    assert sample.method == "prorag" and sample.agent["temperature"] == 0.8


def test_rag_r1_chain_runs_ppo_from_the_sft_model():
    chain = load_chain(REPO / "configs/train/rag_r1/chain.yaml", workdir="W")
    assert chain.names == ["sft", "ppo"]
    assert "model.path=W/sft/final" in chain.stage("ppo").set
    assert "configs/train/rag_r1_ppo.yaml" in chain.stage("ppo").config


def test_dry_run_lists_every_stage_without_running_any(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    runner = CliRunner()
    result = runner.invoke(
        app, ["stages", "run", "configs/train/prorag/cpu_chain.yaml", "--workdir", str(tmp_path), "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    for name in ("eval_base", "synth", "sft", "mcts", "prm", "sample", "rft_set", "rft", "rl", "eval_rl"):
        assert name in result.output
    assert "todo" in result.output and not any(tmp_path.iterdir())
