"""``harness train -c configs/train/NAME.yaml [--data-dir DIR] [--out DIR] [--resume RUN_DIR] [key=value ...]``

Wires the trainer: the rollout backend and retriever (the same factories ``harness eval``
uses), THE search agent, the training examples, and validation through ``run_eval`` into the
run folder (``RUN/validation/step-N/``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import typer

from harness.cli.common import console, fail, start_engine

logger = logging.getLogger(__name__)


def build_rollout_backend(cfg: Any, urls: list[str] | None = None) -> Any:
    """The backend rollouts come from; its weights are synced from the policy after each update.
    ``urls``: the servers of a launched engine (instead of ``rollout.url``)."""
    if cfg.rollout.backend == "sglang":
        from harness.backends.sglang import SGLangBackend

        urls = urls or cfg.rollout.url
        if not urls:
            raise ValueError("rollout.backend=sglang needs rollout.url=[http://host:port] or rollout.launch=true")
        return SGLangBackend(urls, model=cfg.model.path)
    from harness.backends.hf import HFBackend

    if cfg.model.tiny is not None:  # a random tiny Llama on the byte tokenizer (tests, offline)
        from harness.tokenization import byte_tokenizer
        from training.engine import build_model

        tok = byte_tokenizer()
        model = build_model(cfg.model, len(tok))
        return HFBackend(model_obj=model, tokenizer=tok, max_batch_size=cfg.rollout.max_batch_size)
    return HFBackend(
        model=cfg.model.path,
        dtype=cfg.model.dtype,
        max_batch_size=cfg.rollout.max_batch_size,
        threads=cfg.optim.threads,
    )


def build_trainer(cfg: Any, out: Path, backend: Any = None) -> Any:
    """The :class:`~training.trainer.Trainer` for a composed ``TrainConfig``, writing into ``out``."""
    from benchmarks.datasets import load_examples
    from harness.cli.eval_run import make_retriever
    from harness.config import from_dict, to_dict
    from pipelines.search_agent import AgentConfig, SearchAgent
    from training.trainer import Trainer

    d = cfg.data
    examples = load_examples(d.dataset, d.split, data_dir=d.data_dir, limit=d.limit)
    retriever = make_retriever(cfg.retriever, d.dataset, d.split, d.data_dir)
    backend = backend or build_rollout_backend(cfg)
    agent_cfg = from_dict(AgentConfig, dict(cfg.rollout.agent), where="rollout.agent")
    agent = SearchAgent(backend, retriever, cfg.rollout.method, agent_cfg, method=cfg.rollout.method)

    def validate(step: int) -> dict:
        """Greedy ``harness eval`` of the current policy (the rollout backend) on the validation split."""
        from harness.cli.eval_run import run_eval
        from harness.eval_config import EvalConfig

        ecfg = from_dict(
            EvalConfig,
            {
                "method": cfg.rollout.method,
                "dataset": {"name": d.dataset, "split": d.val_split, "limit": d.val_limit, "data_dir": d.data_dir},
                "retriever": to_dict(cfg.retriever),
                "backend": {"kind": cfg.rollout.backend, "model": f"{cfg.model.path}@step-{step}"},
                "agent": {**cfg.rollout.agent, "temperature": 0.0},
                "out": str(Path(out) / "validation" / f"step-{step}"),
            },
            where="validation",
        )
        # The validation split has its own corpus; the backend is the trainer's (current weights).
        return run_eval(ecfg, backend=backend, show_progress=False)["metrics"]

    return Trainer(cfg, agent, examples, out, validate=validate if d.val_split else None)


def train_command(
    config: list[str] = typer.Option(None, "-c", "--config", help="Training recipe YAML (configs/train/...)."),
    data_dir: str = typer.Option(None, "--data-dir", help="FlashRAG-layout data dir."),
    out: str = typer.Option(None, "--out", help="Run folder (default trainer.out/name)."),
    resume: str = typer.Option(None, "--resume", help="A training run folder to continue from its last checkpoint."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides, e.g. trainer.max_steps=2"),
) -> None:
    """Train the search agent with a recipe; see the module docstring."""
    from harness.cli import harr_cmd  # `policy: retriever`: HARR's retriever RL, generator frozen

    if not resume and harr_cmd.is_retriever_policy(config, overrides):
        return harr_cmd.train_retriever(list(config), data_dir, out, list(overrides or []))
    from harness.config import ConfigError, compose
    from training.config import TrainConfig

    if not config and not resume:
        fail("give a recipe with -c configs/train/NAME.yaml (or --resume RUN_DIR)")
    extra = list(overrides or [])
    if data_dir:
        extra.append(f"data.data_dir={data_dir}")
    try:
        files = list(config or [])
        if resume and not files:  # the run remembers its recipe
            files = [str(Path(resume) / "config.json")]
        cfg = compose(TrainConfig, files, extra)
    except (ConfigError, FileNotFoundError) as e:
        fail(str(e))
    run = Path(resume or out or Path(cfg.trainer.out) / cfg.name)
    if resume and not (run / "checkpoints").is_dir():
        fail(f"--resume {run}: no checkpoints/ folder there")
    import contextlib

    from harness.engines import sigterm_as_exit

    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(sigterm_as_exit())
            backend = None
            if cfg.rollout.launch:
                if cfg.rollout.backend != "sglang":
                    raise ValueError("rollout.launch=true starts SGLang: set rollout.backend=sglang")
                if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                    # Every rank would start its own engine; one shared server is what RL needs.
                    raise ValueError(
                        "rollout.launch=true starts one engine from a single-process run; with several "
                        "ranks start it once with `harness serve model --engine sglang` and set rollout.url"
                    )
                proc = start_engine(stack, "sglang", cfg.model.path, cfg.rollout.engine, run)
                backend = build_rollout_backend(cfg, urls=[proc.url])
            trainer = build_trainer(cfg, run, backend=backend)
            if resume:
                trainer.resume(run)
            final = trainer.train()
    except (ValueError, FileNotFoundError, RuntimeError, KeyError) as e:  # EngineError is a RuntimeError
        fail(f"{type(e).__name__}: {e}")
    console.print(
        f"trained {trainer.step_no} steps → {run} (model: {final}; eval it with harness eval --model {final})"
    )
