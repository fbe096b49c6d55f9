"""Every seed recipe carries its original run's values (``source:``), and every hyper-parameter it
sets equals the original's unless a ``deviations:`` entry says why it differs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.config import ConfigError, compose, to_dict
from training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
SEEDS = [
    "configs/train/search_r1_ppo_qwen2.5_3b.yaml",
    "configs/train/research_grpo_qwen2.5_7b.yaml",
    "configs/train/r1_searcher_reinforce_pp_stage1.yaml",
    "configs/train/r1_searcher_reinforce_pp_stage2.yaml",
    "configs/train/rag_r1_sft.yaml",
    "configs/train/rag_r1_ppo.yaml",
    "configs/train/prorag_dual_granularity.yaml",
    "configs/train/prorag/rl.yaml",
    "configs/train/prorag_prm.yaml",
    "configs/train/prorag/sft.yaml",
    "configs/train/prorag/rft_sft.yaml",
    "configs/train/harr/minilm_search_r1.yaml",
    "configs/train/harr/minilm_search_r1_ppo.yaml",
]
# Where a run goes and how it is served, not how it trains: not hyper-parameters.
NOT_HYPER = (
    "name", "papers", "source", "deviations", "model.", "data.", "retriever.url", "retriever.kind", "retriever.api",
    "rollout.backend", "rollout.method", "rollout.weight_sync", "algo.kind", "algo.step_scorer_path",
    "algo.step_scorer_url", "optim.zero_stage", "optim.bf16", "optim.threads", "trainer.out", "trainer.save_every",
    "trainer.eval_every", "trainer.save_every_minutes", "trainer.keep_checkpoints", "trainer.tensorboard",
    "trainer.wandb_project", "trainer.save_rollouts", "trainer.progress", "prm.data", "sft.sources",
    # retriever RL: the frozen generator and where it is served are not the retriever's training values
    "retriever_rl.method", "retriever_rl.backend", "retriever_rl.agent", "retriever_rl.encoder.name",
)  # fmt: skip


def leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested mapping's leaves (lists are leaves)."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= leaves(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def lookup(d: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            raise KeyError(key)
        d = d[part]
    return d


def same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool) | isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@pytest.mark.parametrize("path", SEEDS)
def test_every_key_equals_its_source_except_the_listed_deviations(path):
    raw = yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))
    cfg = compose(TrainConfig, [ROOT / path])
    src = cfg.source
    assert src.repository and src.file and len(src.commit) == 40, f"{path}: source needs repository, file, commit"
    effective = to_dict(cfg)
    deviations = {d.key: d.reason for d in cfg.deviations}
    assert len(deviations) == len(cfg.deviations), f"{path}: a key is listed twice under deviations"
    for key, want in src.values.items():
        got = lookup(effective, key)
        if key in deviations:
            assert not same(got, want), f"{path}: {key} is listed as a deviation but equals the original's {want!r}"
        else:
            assert same(got, want), f"{path}: {key} = {got!r}, the original's is {want!r} (no deviation listed)"
    hyper = [k for k in leaves(raw) if not k.startswith(NOT_HYPER)]
    covered = set(src.values) | set(deviations)  # a key covers its sub-keys (algo.reward: {name, ...})
    missing = [k for k in hyper if not any(k == c or k.startswith(c + ".") for c in covered)]
    assert not missing, f"{path}: keys set without the original's value or a deviation: {missing}"
    for key in deviations:
        lookup(effective, key)  # a deviation names a real key


def test_the_blocks_are_accepted_and_a_deviation_needs_a_reason(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text(
        "source: {repository: a/b, file: f, commit: c, values: {optim.lr: 1}}\n"
        "deviations: [{key: optim.lr, reason: ' '}]\n"
    )
    with pytest.raises(ConfigError, match="needs a reason"):
        compose(TrainConfig, [bad])
    bad.write_text("deviations: [{key: optim.lr}]\n")
    with pytest.raises(ConfigError, match="reason"):
        compose(TrainConfig, [bad])
