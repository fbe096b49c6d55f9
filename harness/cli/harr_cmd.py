"""HARR commands: retriever RL (``harness train`` with ``policy: retriever``) and ``harness data harr-filter``.

``harness train -c configs/train/harr_*.yaml [key=value ...]`` trains the dense retriever's query
tower with the generator frozen (:mod:`training.retriever_rl`); the trained encoder lands in
``RUN/encoder`` and evaluates with ``harness eval --retriever harr --index INDEX --encoder RUN/encoder``
(greedy top-k with the history-aware state it was trained with) or ``--retriever dense`` (the
bare query, as any dense retriever).

``harness data harr-filter -c CONFIG --out FILE`` writes the questions where some sampled
retrievals succeed and some fail under the frozen generator (HARR's training-set filter).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from harness.cli.common import console, fail


def _compose(files: list[str], overrides: list[str]):
    from harness.config import ConfigError, compose
    from training.retriever_config import RetrieverTrainConfig

    try:
        return compose(RetrieverTrainConfig, files, overrides)
    except (ConfigError, FileNotFoundError) as e:
        fail(str(e))


def train_retriever(files: list[str], data_dir: str | None, out: str | None, overrides: list[str]) -> None:
    """``harness train`` for ``policy: retriever``: GRPO (or PPO) on the query tower, generator frozen."""
    from harness.config import to_dict
    from training.retriever_rl import RetrieverRL, build_from_config, load_train_examples

    extra = list(overrides) + ([f"data.data_dir={data_dir}"] if data_dir else [])
    cfg = _compose(files, extra)
    run = Path(out or Path(cfg.out) / cfg.name)
    try:
        retriever, runner = build_from_config(cfg)
        examples = load_train_examples(cfg)
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.json").write_text(json.dumps(to_dict(cfg), indent=2) + "\n", encoding="utf-8")
        encoder = RetrieverRL(retriever, runner, cfg.rl, run).train(examples)
    except (ValueError, FileNotFoundError, RuntimeError, KeyError) as e:
        fail(f"{type(e).__name__}: {e}")
    console.print(
        f"trained the query encoder {cfg.rl.steps} steps → {encoder}\n"
        f"evaluate: harness eval --retriever harr --index INDEX --encoder {encoder}  (or --retriever dense)"
    )


def harr_filter_command(
    config: list[str] = typer.Option(None, "-c", "--config", help="A retriever-RL recipe (policy: retriever)."),
    out: str = typer.Option(..., "--out", help="Where to write the kept questions (FlashRAG JSONL)."),
    samples: int = typer.Option(8, "--samples", help="Sampled retrievals per question."),
    metric: str = typer.Option("em", "--metric", help="em | f1: the success measure."),
    threshold: float = typer.Option(1.0, "--threshold", help="A sample succeeds when metric >= this."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides of the recipe."),
) -> None:
    """Keep the training questions where retrieval changes the outcome under the frozen generator."""
    from training.retriever_rl import build_from_config, filter_examples, load_train_examples

    if metric not in ("em", "f1"):
        fail(f"--metric must be em or f1, got {metric!r}")
    cfg = _compose(list(config or []), list(overrides or []))
    try:
        _, runner = build_from_config(cfg)
        examples = load_train_examples(cfg)
        kept, rows = filter_examples(runner, examples, samples, metric, threshold)
    except (ValueError, FileNotFoundError, RuntimeError, KeyError) as e:
        fail(f"{type(e).__name__}: {e}")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for ex in kept:
            f.write(json.dumps(ex.to_dict(), ensure_ascii=False) + "\n")
    stats = path.with_suffix(".stats.jsonl")
    stats.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    console.print(f"kept {len(kept)}/{len(examples)} questions → {path} (per-question counts: {stats})")
