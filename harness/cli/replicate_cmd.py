"""``harness replicate SYSTEM``: run a replication card and print the paper's numbers beside ours.

The card (``configs/replicate/SYSTEM.yaml``) becomes ordinary eval configs (one per dataset),
run through ``benchmarks.build`` like ``harness eval`` (same run directories, resumable). A run
is the paper's setting only with the released checkpoint and the paper's index (``--index``, e.g.
from ``harness index download wiki18-e5``) on a GPU. Without ``--index`` it runs locally: BM25
over each dataset's local corpus (or ``--corpus``), which exercises the machinery, and every row
says how its setting differs from the paper's.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import typer

from harness.cli.common import console, fail

logger = logging.getLogger(__name__)


def _local_data(
    card: Any, cfg: Any, corpus: str | None
) -> tuple[Any, str | None]:  # (config to run or None, why it was skipped)
    """The config adjusted for a local run (BM25 over the local corpus or ``corpus``), or why not."""
    from dataclasses import replace

    from benchmarks.build import load_eval_examples
    from benchmarks.datasets import corpus_path

    try:
        load_eval_examples(cfg)
    except (ValueError, OSError, KeyError, RuntimeError) as e:
        return None, f"questions not available locally ({e})"
    if cfg.retriever.corpus or cfg.retriever.index:
        return cfg, None
    own = corpus_path(cfg.dataset.name, cfg.dataset.split, cfg.dataset.data_dir, warn=False)
    if own is not None:
        return cfg, None
    if corpus is None:
        return None, "no local corpus for this split (pass --corpus FILE)"
    return replace(cfg, retriever=replace(cfg.retriever, corpus=corpus)), None


def _full_size(cfg: Any) -> int | None:
    from dataclasses import replace

    from benchmarks.build import load_eval_examples

    if cfg.dataset.limit is None and cfg.dataset.sample is None:
        return None
    try:
        return len(load_eval_examples(replace(cfg, dataset=replace(cfg.dataset, limit=None, sample=None))))
    except (ValueError, OSError, KeyError, RuntimeError):
        return None


def replicate_command(
    system: str = typer.Argument(..., help="A card under configs/replicate/ (search_r1, r1_searcher, ...) or a path."),
    model_path: str = typer.Option(None, "--model-path", help="Model to run instead of the card's checkpoint."),
    limit: int = typer.Option(None, "--limit", help="First N questions of each dataset."),
    launch: bool = typer.Option(False, "--launch", help="Start SGLang for the model and stop it at the end."),
    data_dir: str = typer.Option(None, "--data-dir", help="FlashRAG-layout data dir (default $HARNESS_DATA_DIR)."),
    index: str = typer.Option(None, "--index", help="The paper's index directory (e.g. wiki18-e5); else a local run."),
    corpus: str = typer.Option(None, "--corpus", help="Local run: corpus for datasets that have none locally."),
    backend: str = typer.Option(
        None, "--backend", help="hf | sglang | openai | scripted (default hf; sglang with --launch)."
    ),
    datasets: str = typer.Option(None, "--datasets", help="Comma-separated subset of the card's datasets."),
    out: str = typer.Option(
        None, "--out", help="Parent folder of the run directories (default runs/replicate/SYSTEM)."
    ),
    judge_url: str = typer.Option(None, "--judge-url", help="OpenAI-compatible endpoint of the LLM judge."),
    config_files: list[str] = typer.Option(None, "-c", "--config", help="YAML config file(s) over the card."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides, e.g. agent.max_turns=2"),
) -> None:
    from benchmarks.replicate import card_configs, load_card
    from harness.config import ConfigError, deep_merge, load_yaml, parse_overrides

    try:
        card = load_card(system)
    except (ValueError, KeyError) as e:
        fail(str(e))
    data_dir = data_dir or os.environ.get("HARNESS_DATA_DIR")
    data: dict[str, Any] = {"out": out or str(Path("runs") / "replicate" / card.name)}
    if data_dir:
        data["dataset"] = {"data_dir": data_dir}
    bcfg: dict[str, Any] = {}
    if model_path:
        bcfg["model"] = model_path
    if backend:
        bcfg["kind"] = backend
    if launch:
        bcfg.update(launch=True, kind=backend or "sglang")
    if bcfg:
        data["backend"] = bcfg
    local = index is None
    data["retriever"] = {"kind": "bm25"} if local else {"kind": card.retriever.get("kind", "dense"), "index": index}
    if judge_url:
        data["judge"] = {"url": judge_url}
    try:
        for f in config_files or []:
            data = deep_merge(data, load_yaml(f))
        data = deep_merge(data, parse_overrides(overrides or []))
        only = [d.strip() for d in datasets.split(",")] if datasets else None
        configs = card_configs(card, data, limit=limit, only=only)
    except (ConfigError, ValueError, KeyError) as e:
        fail(f"card {card.name}: {e}")
    if not configs:
        fail(f"card {card.name}: no dataset selected (card datasets: {', '.join(d.key for d in card.datasets)})")
    if corpus is None and local and data_dir and (Path(data_dir) / "hotpotqa" / "corpus_distractor1352.jsonl").exists():
        corpus = str(Path(data_dir) / "hotpotqa" / "corpus_distractor1352.jsonl")
    runnable, skipped = [], []
    labels = {(d.name, d.split): d.key for d in card.datasets}
    for cfg in configs:
        label = labels[(cfg.dataset.name, cfg.dataset.split)]
        ready, why = _local_data(card, cfg, corpus) if local else (cfg, None)
        if ready is None:
            skipped.append((label, why))
        else:
            runnable.append((label, ready))
    if not runnable:
        fail(f"card {card.name}: nothing to run: " + "; ".join(f"{label}: {why}" for label, why in skipped))
    rows = _run_and_compare(card, runnable)
    print_replication(card, rows, skipped, local, runnable[0][1].metric_profile)


def _run_and_compare(card: Any, runnable: list[tuple[str, Any]]) -> list[Any]:
    from benchmarks.build import run_dir_for
    from benchmarks.replicate import compare, setting_differences
    from harness.cli.eval_cmd import run_configs
    from harness.runlog import RunDir

    results = run_configs([cfg for _, cfg in runnable])
    rows = []
    for (label, cfg), res in zip(runnable, results, strict=True):
        run_dir = run_dir_for(cfg)
        manifest = RunDir(run_dir).manifest
        diffs = setting_differences(card, cfg, manifest, res.n_total, _full_size(cfg))
        rows.extend(compare(card, label, run_dir, tuple(cfg.metrics), diffs))
    return rows


def print_replication(card: Any, rows: list[Any], skipped: list[tuple[str, str]], local: bool, profile: str) -> None:
    """The paper-vs-ours table, then, per dataset, how the setting differs from the paper's."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from benchmarks.report_render import NAMES

    def pct(v: float | None) -> str:
        return "–" if v is None or v != v else f"{100 * v:.1f}"

    table = Table(title=f"harness replicate {card.name}: {card.system} (metric profile: {profile}; percent)")
    for col in ("dataset", "metric", "paper", "ours", "95% CI", "n", "missing"):
        table.add_column(col, justify="left" if col in ("dataset", "metric") else "right", no_wrap=True)
    for r in rows:
        table.add_row(
            r.dataset,
            NAMES.get(r.metric, r.metric),
            "–" if r.paper is None else f"{r.paper:g}",
            pct(r.ours),
            f"[{pct(r.low)}, {pct(r.high)}]",
            str(r.n),
            str(r.missing) if r.missing else "",
        )
    out = Console()
    if not out.is_terminal:
        out = Console(width=max(160, out.width))
    out.print(table)
    sources = sorted({r.source for r in rows if r.source})
    for s in sources:
        console.print(f"paper: {escape(s)}", highlight=False)
    seen = set()
    for r in rows:
        if r.dataset in seen:
            continue
        seen.add(r.dataset)
        if r.differences:
            console.print(
                f"[bold yellow]{escape(r.dataset)}: NOT the paper's setting:[/] {escape('; '.join(r.differences))}",
                highlight=False,
            )
        else:
            console.print(f"{escape(r.dataset)}: the paper's setting (model, retrieval, top-k, all questions)")
    for label, why in skipped:
        console.print(f"[yellow]{escape(label)}: not run[/]: {escape(why)}", highlight=False)
    judge_note(profile, {r.metric for r in rows})
    if local:
        console.print(
            "Local run (no --index): this checks the card's machinery, not the paper's number. A real "
            "replication needs the released checkpoint and the paper's index on a GPU.",
            highlight=False,
        )


def judge_note(profile: str, metrics: set[str]) -> None:
    """Say so when the profile's paper also reports an LLM judge and this run has none."""
    from benchmarks.profiles import JUDGE, get_profile

    if get_profile(profile).uses_judge and JUDGE not in metrics:
        console.print(
            f"LLM judge: not configured (the {profile} profile's paper also reports one; pass --judge-url)",
            highlight=False,
        )
