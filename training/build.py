"""From a :class:`~training.config.TrainConfig` to a ready :class:`~training.trainer.Trainer`.

The rollout backend and the retriever are built through the same registries ``harness eval``
uses (``BackendConfig`` / ``RetrieverConfig``), the agent is THE search agent, and validation
is the eval path itself: :func:`benchmarks.evaluate.evaluate` on the validation split, greedy,
with the trainer's own backend (the current policy), into ``RUN/validation/step-N/``.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.evaluate import evaluate
from harness.backends import build_backend
from harness.config import from_dict, to_dict
from harness.engines import engine_for_backend
from harness.run_records import RunManifest, RunResults
from training.config import TrainConfig

logger = logging.getLogger(__name__)


def rollout_backend(cfg: TrainConfig) -> Any:
    """The backend rollouts come from; its weights are synced from the policy after each update.

    It serves the policy, so its model and dtype are the policy's. ``model.tiny`` (tests,
    offline) builds a random tiny Llama on the byte tokenizer, in process.
    """
    b = cfg.rollout.backend
    if cfg.model.tiny is not None:
        from harness.backends.hf import HFBackend
        from harness.tokenization import byte_tokenizer
        from training.engine import build_model

        if b.kind != "hf":
            raise ValueError(f"model.tiny builds an in-process model: rollout.backend.kind must be hf, not {b.kind!r}")
        tok = byte_tokenizer()
        return HFBackend(model_obj=build_model(cfg.model, len(tok)), tokenizer=tok, max_batch_size=b.max_batch_size)
    return build_backend(
        replace(b, model=cfg.model.path, dtype=cfg.model.dtype, threads=b.threads or cfg.optim.threads)
    )


@dataclass
class Validation:
    """Greedy evaluation of the current policy on the validation split, through ``evaluate``."""

    method: Any
    examples: list
    manifest: RunManifest
    metrics: tuple[str, ...]
    out: Path

    def __call__(self, step: int) -> RunResults:
        manifest = replace(self.manifest, model=f"{self.manifest.model}@step-{step}", extra=dict(self.manifest.extra))
        name = f"{manifest.method}-{manifest.dataset}-{manifest.split}"
        return evaluate(self.method, self.examples, self.out / f"step-{step}" / name, self.metrics, manifest)


def build_validation(cfg: TrainConfig, backend: Any, out: Path) -> Validation | None:
    """The validation of ``data.val_split`` (None without one), built like ``harness eval``
    builds a run: the split's own corpus, the rollout agent's options at temperature 0."""
    from benchmarks.build import build_eval
    from harness.eval_config import EvalConfig

    d = cfg.data
    if not d.val_split:
        return None
    ecfg = from_dict(
        EvalConfig,
        {
            "method": cfg.rollout.method,
            "dataset": {"name": first_dataset(cfg), "split": d.val_split, "limit": d.val_limit, "data_dir": d.data_dir},
            "retriever": to_dict(cfg.retriever),
            "backend": {"kind": cfg.rollout.backend.kind, "model": cfg.model.path},
            "agent": {**cfg.rollout.agent, "temperature": 0.0},
            "out": str(out / "validation"),
        },
        where="validation",
    )
    run = build_eval(ecfg, backend=backend)
    return Validation(run.method, run.examples, run.manifest, tuple(ecfg.metrics), out / "validation")


def first_dataset(cfg: TrainConfig) -> str:
    """The dataset named first in ``data.dataset`` (validation runs on it)."""
    d = cfg.data.dataset
    return d if isinstance(d, str) else d[0]


def merged_corpus_dataset(cfg: TrainConfig) -> str:
    """The dataset whose corpus the retriever uses. A merged training set has no single dataset
    corpus: it needs a shared one (an http retriever, or ``retriever.corpus`` / ``index``)."""
    d, r = cfg.data.dataset, cfg.retriever
    if isinstance(d, str) or len(d) == 1:
        return first_dataset(cfg)
    if r.kind in ("http", "memory") or r.corpus or r.index:
        return d[0]
    raise ValueError(
        f"data.dataset={list(d)} merges datasets with different local corpora: give the retriever a "
        "shared corpus (retriever.kind=http, or retriever.corpus / retriever.index)"
    )


def build_trainer(cfg: TrainConfig, out: Path, backend: Any = None) -> Any:
    """The :class:`~training.trainer.Trainer` for ``cfg``, writing into ``out``. ``backend``: an
    already built rollout backend (e.g. one pointing at a launched engine). ``algo.kind: sft``
    builds a :class:`~training.sft.SFTTrainer` instead (no backend, retriever or agent), and
    ``algo.kind: prm`` a :class:`~training.prm.PRMTrainer`."""
    if cfg.algo.kind == "sft":
        from training.sft import SFTTrainer

        return SFTTrainer(cfg, Path(out))
    if cfg.algo.kind == "prm":
        from training.prm import PRMTrainer

        return PRMTrainer(cfg, Path(out))
    from benchmarks.build import dataset_retriever
    from benchmarks.datasets import load_examples, load_merged_examples
    from pipelines.search_agent import AgentConfig, SearchAgent
    from training.trainer import Trainer

    d = cfg.data
    if isinstance(d.dataset, str):
        examples = load_examples(d.dataset, d.split, data_dir=d.data_dir, limit=d.limit)
    else:
        examples = load_merged_examples(d.dataset, d.split, data_dir=d.data_dir, limit=d.limit)
    retriever = dataset_retriever(cfg.retriever, merged_corpus_dataset(cfg), d.split, d.data_dir)
    backend = backend or rollout_backend(cfg)
    agent_cfg = from_dict(AgentConfig, dict(cfg.rollout.agent), where="rollout.agent")
    agent = SearchAgent(backend, retriever, cfg.rollout.method, agent_cfg, method=cfg.rollout.method)
    validation = build_validation(cfg, backend, Path(out))
    return Trainer(cfg, agent, examples, out, validate=validation)


def train_cached(cfg: TrainConfig, run: str | Path) -> tuple[Path, bool]:
    """Train ``cfg`` into ``run`` unless ``run`` already holds a final model trained with exactly
    this config (its ``config.json``); returns the final model folder and whether it trained now.
    A ``run`` of any other config is cleared first (a cached demo or stage never mixes recipes)."""
    run = Path(run)
    final, recorded = run / "final", run / "config.json"
    wanted = json.loads(json.dumps(to_dict(cfg)))  # as config.json holds it (tuples as lists)
    if final.is_dir() and recorded.exists() and json.loads(recorded.read_text()) == wanted:
        return final, False
    if run.exists():
        logger.info("retraining: %s holds no final model of this config", run)
        shutil.rmtree(run)
    return Path(build_trainer(cfg, run).train()), True


def rollout_engine(cfg: Any) -> tuple[str, Any]:
    """The engine ``rollout.backend.launch`` starts and its launch config, with what weight sync
    needs: ``sglang`` → SGLang as configured; ``openai`` → vLLM with its RL endpoints
    (``VLLM_SERVER_DEV_MODE=1``). With ``model.lora.sync: adapter`` the engine also gets LoRA
    enabled at the recipe's rank (vLLM: ``--enable-lora --max-lora-rank R`` and runtime adapter
    loading; SGLang: ``--enable-lora --max-lora-rank R --lora-target-modules ...``, which its CPU
    build cannot start with: see tests/engines/test_lora_sync.py). Flags given in
    ``rollout.backend.engine.args`` win."""
    b = cfg.rollout.backend
    engine = engine_for_backend(b.kind)  # EngineError (a RuntimeError) for kinds with no engine
    env: dict[str, str] = {}
    args: list[str] = []
    lora = cfg.model.lora
    adapter = lora is not None and lora.sync == "adapter"
    if engine == "vllm":
        env["VLLM_SERVER_DEV_MODE"] = "1"
        if adapter:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
            args += ["--enable-lora", "--max-lora-rank", str(lora.r)]
    elif adapter:
        args += ["--enable-lora", "--max-lora-rank", str(lora.r), "--lora-target-modules", *lora.target_modules]
    given = set(b.engine.args)
    if "--enable-lora" in given:
        args = []  # the recipe configured LoRA on the engine itself
    return engine, replace(b.engine, env={**env, **b.engine.env}, args=[*args, *b.engine.args])
