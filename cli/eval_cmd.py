"""``harness eval``: run methods on datasets, one run directory per (method, dataset).

Precedence: ``-c`` YAML files, then flags, then ``key.path=value`` overrides. Comma-separated
``--method`` and ``--dataset`` run every pair in turn. Rerunning the same command resumes.
The configs come from :func:`benchmarks.eval_runs.eval_configs` and run through
:func:`benchmarks.eval_runs.run_configs`.
"""

from __future__ import annotations

import logging
from typing import Any

import typer

from benchmarks.profiles import PROFILES
from cli.common import console, fail, say
from cli.options import ConfigFiles, DataDir, JudgeKeyEnv, JudgeModel, JudgeUrl, Limit, Model, Overrides, TopK

logger = logging.getLogger(__name__)


def eval_command(
    method: str = typer.Option(
        None, "--method", "-m", help="Method(s), comma-separated (default: the -c config's, else research)."
    ),
    dataset: str = typer.Option(
        None, "--dataset", "-d", help="Dataset(s), comma-separated (default: the -c config's, else demo)."
    ),
    split: str = typer.Option(None, "--split", help="Dataset split (default: the dataset's eval split)."),
    limit: Limit = None,
    sample: int = typer.Option(None, "--sample", help="A deterministic random subset of N questions."),
    seed: int = typer.Option(None, "--seed", help="Seed for --sample."),
    data_dir: DataDir = None,
    backend: str = typer.Option(None, "--backend", help="hf | sglang | openai | scripted."),
    model: Model = None,
    url: str = typer.Option(None, "--url", help="Server URL(s) for sglang/openai, comma-separated."),
    script: str = typer.Option(None, "--script", help="Script JSONL for the scripted backend."),
    retriever: str = typer.Option(None, "--retriever", help="bm25 | dense | harr | http | memory."),
    index: str = typer.Option(None, "--index", help="A built index directory (or the URL for http)."),
    encoder: str = typer.Option(
        None,
        "--encoder",
        help="dense/harr: a trained query encoder dir (retriever RL's RUN/encoder, or a LoRA adapter).",
    ),
    topk: TopK = None,
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
        None,
        "--metric-profile",
        help=f"A paper's metric set: {', '.join(PROFILES.names())}.",
    ),
    judge_url: JudgeUrl = None,
    judge_model: JudgeModel = None,
    judge_key_env: JudgeKeyEnv = None,
    label: str = typer.Option(
        None,
        "--label",
        help="Name the run in reports and its run dir (one method), e.g. research+sft for a checkpoint.",
    ),
    schedule: str = typer.Option(
        None, "--schedule", help="async (default: each question at its own pace) | sync (turn-synchronous waves)."
    ),
    config_files: ConfigFiles = None,
    overrides: Overrides = None,
) -> None:
    # deferred: the command's library loads when it runs, not at every harness --help
    from benchmarks.eval_runs import RunError, eval_configs, judge_flags, run_configs
    from benchmarks.evaluate import InfrastructureDown, error_summary
    from benchmarks.profiles import judge_note
    from harness.config import ConfigError

    flags = dict(
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
        schedule=schedule,
    )
    judge = judge_flags(judge_url, judge_model, judge_key_env)
    try:
        configs = eval_configs(
            list(config_files or []), flags, list(overrides or []), method, dataset, metric_profile, judge
        )
        results = run_configs(configs, say=say)
    except (ConfigError, KeyError, ValueError, RunError) as e:  # RegistryError (an unknown profile) is a KeyError
        fail(str(e))
    except InfrastructureDown as e:  # a dead retriever or server stopped the run: exit 1, as failed items do
        fail(str(e), code=1)
    print_results_table(results, profile=configs[0].metric_profile if configs else None)
    note = judge_note(configs[0].metric_profile, set(configs[0].metrics)) if configs else None
    if note:
        console.print(note, highlight=False)
    failed = [(r, error_summary(r)) for r in results if r.errors]
    for r, summary in failed:
        console.print(f"[bold red]{r.method} on {r.dataset}:[/] {summary}", highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(1)


def print_results_table(results: list[Any], profile: str | None = None) -> None:
    """The comparison table of this invocation's runs (:func:`benchmarks.results_table.print_results`)."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from benchmarks.results_table import print_results

    print_results(results, profile)
