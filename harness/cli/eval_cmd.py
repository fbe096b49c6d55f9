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
        "encoder": "retriever.encoder",
        "topk": "retriever.topk",
        "out": "out",
        "launch": "backend.launch",
        "n_samples": "n_samples",
        "label": "label",
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
    method: str = typer.Option(
        None, "--method", "-m", help="Method(s), comma-separated (default: the -c config's, else research)."
    ),
    dataset: str = typer.Option(
        None, "--dataset", "-d", help="Dataset(s), comma-separated (default: the -c config's, else demo)."
    ),
    split: str = typer.Option(None, "--split", help="Dataset split (default: the dataset's eval split)."),
    limit: int = typer.Option(None, "--limit", help="First N questions."),
    sample: int = typer.Option(None, "--sample", help="A deterministic random subset of N questions."),
    seed: int = typer.Option(None, "--seed", help="Seed for --sample."),
    data_dir: str = typer.Option(None, "--data-dir", help="FlashRAG-layout data dir (DIR/<dataset>/<split>.jsonl)."),
    backend: str = typer.Option(None, "--backend", help="hf | sglang | openai | scripted."),
    model: str = typer.Option(None, "--model", help="Model name, local path or hub id."),
    url: str = typer.Option(None, "--url", help="Server URL(s) for sglang/openai, comma-separated."),
    script: str = typer.Option(None, "--script", help="Script JSONL for the scripted backend."),
    retriever: str = typer.Option(None, "--retriever", help="bm25 | dense | harr | http | memory."),
    index: str = typer.Option(None, "--index", help="A built index directory (or the URL for http)."),
    encoder: str = typer.Option(
        None,
        "--encoder",
        help="dense/harr: a trained query encoder dir (retriever RL's RUN/encoder, or a LoRA adapter).",
    ),
    topk: int = typer.Option(None, "--topk", help="Documents per search."),
    out: str = typer.Option(None, "--out", help="Parent folder of run directories (default runs/)."),
    n_samples: int = typer.Option(
        None,
        "--n-samples",
        help="K sampled trajectories per question (needs agent.temperature>0); run dir gets -kK; "
        "results are the mean over all samples.",
    ),
    launch: bool = typer.Option(
        False, "--launch", help="Start the engine (sglang: SGLang, openai: vLLM) for --model, and stop it at the end."
    ),
    metric_profile: str = typer.Option(
        None, "--metric-profile", help="A paper's metric set: default|search_r1|r1_searcher|research|rag_r1|prorag."
    ),
    judge_url: str = typer.Option(None, "--judge-url", help="OpenAI-compatible endpoint (…/v1) of the LLM judge."),
    judge_model: str = typer.Option(None, "--judge-model", help="Judge model name (default: the judge prompt's)."),
    judge_key_env: str = typer.Option(
        None, "--judge-api-key-env", help="Env var holding the judge's API key (default OPENAI_API_KEY)."
    ),
    label: str = typer.Option(
        None,
        "--label",
        help="Name the run in reports and its run dir (one method), e.g. research+sft for a checkpoint.",
    ),
    config_files: list[str] = typer.Option(None, "-c", "--config", help="YAML config file(s)."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides, e.g. agent.max_turns=2"),
) -> None:
    from benchmarks.evaluate import error_summary
    from benchmarks.profiles import apply_profile
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
        encoder=encoder,
        topk=topk,
        out=out,
        launch=launch or None,
        n_samples=n_samples,
        label=label,
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
        data = deep_merge(data, judge_flags(judge_url, judge_model, judge_key_env))
        data = deep_merge(data, parse_overrides(overrides or []))
        data = apply_profile(data, metric_profile)
    except (ConfigError, KeyError) as e:  # RegistryError (an unknown profile) is a KeyError
        fail(str(e))

    # A -c config's method and dataset count unless a flag names others (a flag's default would
    # silently replace them).
    method = method or str(data.get("method") or "research")
    dataset = dataset or str((data.get("dataset") or {}).get("name") or "demo")
    methods = [m.strip() for m in method.split(",") if m.strip()]
    if data.get("label") and len(methods) > 1:
        fail(f"--label names one run: give one --method, not {len(methods)} ({', '.join(methods)})")
    datasets = [d.strip() for d in dataset.split(",") if d.strip()]
    configs = []
    for ds in datasets:
        for m in methods:
            try:
                configs.append(build(EvalConfig, deep_merge(data, {"method": m, "dataset": {"name": ds}})))
            except ConfigError as e:
                fail(str(e))
    results = run_configs(configs)
    print_results_table(results, profile=configs[0].metric_profile if configs else None)
    if configs:
        from harness.cli.replicate_cmd import judge_note

        judge_note(configs[0].metric_profile, set(configs[0].metrics))
    failed = [(r, error_summary(r)) for r in results if r.errors]
    for r, summary in failed:
        console.print(f"[bold red]{r.method} on {r.dataset}:[/] {summary}", highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(1)


def judge_flags(url: str | None, model: str | None, key_env: str | None) -> dict[str, Any]:
    """The ``judge`` config section from the ``--judge-*`` flags (only those given)."""
    values = {"url": url, "model": model, "api_key_env": key_env}
    judge = {k: v for k, v in values.items() if v is not None}
    return {"judge": judge} if judge else {}


def launched_backend_config(stack: Any, bcfg: Any, out: str) -> Any:
    """``bcfg`` itself, or (``launch: true``) a copy pointing at an engine started inside ``stack``.

    The run's config (and its hash, for resuming) keeps ``launch: true``, not the ephemeral URL.
    """
    from dataclasses import replace
    from pathlib import Path

    from harness.engines import engine_for_backend

    if not bcfg.launch:
        return bcfg
    proc = start_engine(stack, engine_for_backend(bcfg.kind), bcfg.model, bcfg.engine, Path(out) / "engines")
    return replace(bcfg, url=[proc.url])


def run_configs(configs: list[Any]) -> list[Any]:
    """Run each config in turn with one shared backend (and one launched engine, if asked); the
    engine is stopped and the backend closed however the runs end. Returns their results."""
    import contextlib

    from benchmarks.build import build_eval, simple_evaluate
    from harness.backends import build_backend
    from harness.engines import sigterm_as_exit

    results = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_as_exit())
        bcfg = configs[0].backend
        try:
            bcfg = launched_backend_config(stack, bcfg, configs[0].out)
            backend = build_backend(bcfg)
        except (ValueError, OSError, RuntimeError) as e:  # EngineError, BackendError are RuntimeErrors
            fail(f"backend {bcfg.kind}: {e}")
        stack.callback(backend.close)
        for cfg in configs:
            label = f"{cfg.name} on {cfg.dataset.name}"
            try:
                run = build_eval(cfg, backend=backend)
                console.print(f"[bold]{cfg.name}[/] on [bold]{cfg.dataset.name}[/] → {run.run_dir}", highlight=False)
                headline = cfg.metrics[0] if cfg.metrics else "em"
                total = len(run.examples) * cfg.n_samples
                with Progress(total, run.run_dir, label, headline) as progress:
                    results.append(simple_evaluate(cfg, run=run, on_item=progress.add))
            except (ValueError, KeyError, FileNotFoundError, RuntimeError) as e:
                fail(f"{label}: {e}")
    return results


class Progress:
    """A rich progress bar with the running headline metric (EM unless the profile's first metric
    says otherwise; quiet when stderr is not a terminal)."""

    def __init__(self, total: int, run_dir: Any, label: str, metric: str = "em") -> None:
        from harness.runlog import RunDir

        done = RunDir(run_dir).scores() if (run_dir / "scores.jsonl").exists() else []
        self.total, self.label, self.metric = total, label, metric
        self.n = len(done)
        self.em_sum = sum(s.metric(metric) or 0.0 for s in done)
        self._progress = None

    def __enter__(self) -> Progress:
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._progress = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            )
            self._progress.start()
            self._task = self._progress.add_task(self._desc(), total=self.total, completed=min(self.n, self.total))
        return self

    def _desc(self) -> str:
        em = self.em_sum / self.n if self.n else 0.0
        from benchmarks.report_render import NAMES

        return f"{self.label}  {NAMES.get(self.metric, self.metric)} {em:.3f}"

    def add(self, score: Any) -> None:
        self.n += 1
        self.em_sum += score.metric(self.metric) or 0.0
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=self._desc())

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()


def print_results_table(results: list[Any], profile: str | None = None) -> None:
    """The comparison table of this invocation's runs (stdout, for people): one column per metric
    of the runs (the profile's), then searches, tokens, latency and errors. Not a terminal
    (piped, logged): rendered at full width, so no column is cut."""
    from rich.console import Console
    from rich.table import Table

    from benchmarks.report_render import NAMES

    metrics = list(dict.fromkeys(m for r in results for m in r.metrics))
    title = "harness eval" + (f" (metric profile: {profile})" if profile else "")
    table = Table(title=title)
    cols = ["method", "dataset", "n", *(NAMES.get(m, m) for m in metrics), "srch", "tok", "p50 s", "err"]
    for col in cols:
        table.add_column(col, justify="right" if col not in ("method", "dataset") else "left", no_wrap=True)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}"

    def cell(r: Any, m: str) -> str:
        missing = (getattr(r, "missing", None) or {}).get(m, 0)
        return pct(r.metrics.get(m)) + (f" ({missing} missing)" if missing else "")

    for r in results:
        table.add_row(
            str(r.method),
            str(r.dataset),
            f"{r.n}/{r.n_total}",
            *(cell(r, m) for m in metrics),
            "-" if r.mean_searches is None else f"{r.mean_searches:.2f}",
            "-" if r.mean_generated_tokens is None else f"{r.mean_generated_tokens:.0f}",
            "-" if r.latency_p50_s is None else f"{r.latency_p50_s:.2f}",
            str(r.errors),
        )
    out = Console()
    if not out.is_terminal:
        out = Console(width=max(200, out.width))
    out.print(table)
