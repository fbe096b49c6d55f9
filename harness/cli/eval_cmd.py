"""``harness eval``: run methods on datasets, one run directory per (method, dataset).

Precedence: ``-c`` YAML files, then flags, then ``key.path=value`` overrides. Comma-separated
``--method`` and ``--dataset`` run every pair in turn. Rerunning the same command resumes.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import typer

from harness.cli.common import console, fail, start_engine

logger = logging.getLogger(__name__)


def _flags_dict(**flags: Any) -> dict[str, Any]:
    """Map CLI flags onto config key paths (only flags the user gave)."""
    mapping = {
        "split": "dataset.split",
        "limit": "dataset.limit",
        "sample": "dataset.sample",
        "seed": "dataset.seed",
        "data_dir": "dataset.data_dir",
        "backend": "backend.kind",
        "model": "backend.model",
        "url": "backend.url",
        "script": "backend.script",
        "retriever": "retriever.kind",
        "index": "retriever.index",
        "topk": "retriever.topk",
        "out": "out",
        "launch": "backend.launch",
    }
    from harness.config import set_path

    out: dict[str, Any] = {}
    for flag, path in mapping.items():
        value = flags.get(flag)
        if value is None:
            continue
        if flag == "url":
            value = [u.strip() for u in value.split(",") if u.strip()]
        set_path(out, path, value)
    return out


def eval_command(
    method: str = typer.Option("research", "--method", "-m", help="Method(s), comma-separated."),
    dataset: str = typer.Option("demo", "--dataset", "-d", help="Dataset(s), comma-separated."),
    split: str = typer.Option(None, "--split", help="Dataset split (default: the dataset's eval split)."),
    limit: int = typer.Option(None, "--limit", help="First N questions."),
    sample: int = typer.Option(None, "--sample", help="A deterministic random subset of N questions."),
    seed: int = typer.Option(None, "--seed", help="Seed for --sample."),
    data_dir: str = typer.Option(None, "--data-dir", help="FlashRAG-layout data dir (DIR/<dataset>/<split>.jsonl)."),
    backend: str = typer.Option(None, "--backend", help="hf | sglang | openai | scripted."),
    model: str = typer.Option(None, "--model", help="Model name, local path or hub id."),
    url: str = typer.Option(None, "--url", help="Server URL(s) for sglang/openai, comma-separated."),
    script: str = typer.Option(None, "--script", help="Script JSONL for the scripted backend."),
    retriever: str = typer.Option(None, "--retriever", help="bm25 | dense | http | memory."),
    index: str = typer.Option(None, "--index", help="A built index directory (or the URL for http)."),
    topk: int = typer.Option(None, "--topk", help="Documents per search."),
    out: str = typer.Option(None, "--out", help="Parent folder of run directories (default runs/)."),
    launch: bool = typer.Option(
        False, "--launch", help="Start the engine (sglang: SGLang, openai: vLLM) for --model, and stop it at the end."
    ),
    config_files: list[str] = typer.Option(None, "-c", "--config", help="YAML config file(s)."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides, e.g. agent.max_turns=2"),
) -> None:
    from harness.config import ConfigError, deep_merge, load_yaml, parse_overrides
    from harness.config import from_dict as build
    from harness.eval_config import EvalConfig

    if data_dir is None and os.environ.get("HARNESS_DATA_DIR"):
        data_dir = os.environ["HARNESS_DATA_DIR"]
    flag_values = dict(
        split=split,
        limit=limit,
        sample=sample,
        seed=seed,
        data_dir=data_dir,
        backend=backend,
        model=model,
        url=url,
        script=script,
        retriever=retriever,
        index=index,
        topk=topk,
        out=out,
        launch=launch or None,
    )
    try:
        data: dict[str, Any] = {}
        for f in config_files or []:
            data = deep_merge(data, load_yaml(f))
        flags = _flags_dict(**flag_values)
        if retriever == "http" and index:
            # --url is the model server's; an HTTP retriever's URL comes with --index (or retriever.url).
            flags["retriever"]["url"] = flags["retriever"].pop("index")
        data = deep_merge(data, flags)
        data = deep_merge(data, parse_overrides(overrides or []))
    except ConfigError as e:
        fail(str(e))

    methods = [m.strip() for m in method.split(",") if m.strip()]
    datasets = [d.strip() for d in dataset.split(",") if d.strip()]
    configs = []
    for ds in datasets:
        for m in methods:
            try:
                configs.append(build(EvalConfig, deep_merge(data, {"method": m, "dataset": {"name": ds}})))
            except ConfigError as e:
                fail(str(e))
    results = run_configs(configs)
    print_results_table(results)


def run_configs(configs: list[Any]) -> list[tuple[Any, dict]]:
    """Run each config in turn with one shared backend (and one launched engine, if asked);
    the engine is stopped and the backend closed however the runs end."""
    import contextlib
    from dataclasses import replace
    from pathlib import Path

    from harness.cli.eval_run import make_backend, run_dir_for, run_eval
    from harness.engines import engine_for_backend, sigterm_as_exit

    results: list[tuple[Any, dict]] = []
    bcfg = configs[0].backend
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_as_exit())
        try:
            if bcfg.launch:
                engine = engine_for_backend(bcfg.kind)
                proc = start_engine(stack, engine, bcfg.model, bcfg.engine, Path(configs[0].out) / "engines")
                # The run's config (and its hash, for resuming) keeps launch=true, not this URL.
                bcfg = replace(bcfg, url=[proc.url])
            backend = make_backend(bcfg)
        except (ValueError, OSError, RuntimeError) as e:  # EngineError is a RuntimeError
            fail(f"backend {bcfg.kind}: {e}")
        stack.callback(backend.close)
        for cfg in configs:
            try:
                console.print(
                    f"[bold]{cfg.method}[/] on [bold]{cfg.dataset.name}[/] → {run_dir_for(cfg)}", highlight=False
                )
                results.append((run_dir_for(cfg), run_eval(cfg, backend=backend)))
            except (ValueError, KeyError, FileNotFoundError, RuntimeError) as e:
                fail(f"{cfg.method} on {cfg.dataset.name}: {e}")
    return results


def print_results_table(results: list[tuple[Any, dict]]) -> None:
    """The comparison table of this invocation's runs (stdout, for people)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="harness eval")
    for col in ("method", "dataset", "n", "EM", "F1", "acc", "cEM", "srch", "tok", "p50 s", "err"):
        table.add_column(col, justify="right" if col not in ("method", "dataset") else "left", no_wrap=True)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}"

    for _, r in results:
        m = r["metrics"]
        table.add_row(
            r["method"],
            r["dataset"],
            f"{r['n']}/{r['n_total']}",
            pct(m.get("em")),
            pct(m.get("f1")),
            pct(m.get("acc")),
            pct(m.get("cover_em")),
            "-" if r["mean_searches"] is None else f"{r['mean_searches']:.2f}",
            "-" if r["mean_generated_tokens"] is None else f"{r['mean_generated_tokens']:.0f}",
            "-" if r["latency_p50_s"] is None else f"{r['latency_p50_s']:.2f}",
            str(r["errors"]),
        )
    Console().print(table)
