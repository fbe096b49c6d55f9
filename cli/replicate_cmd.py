"""``harness replicate SYSTEM``: run a replication card and print the paper's numbers beside ours.

The card (``configs/replicate/SYSTEM.yaml``) becomes ordinary eval configs (one per dataset),
run like ``harness eval`` runs them (same run directories, resumable): see
:func:`benchmarks.replicate.replicate`. A run is the paper's setting only with the released
checkpoint and the paper's index (``--index``, e.g. from ``harness index download wiki18-e5``) on
a GPU. Without ``--index`` it runs locally: BM25 over each dataset's local corpus (or
``--corpus``), which exercises the machinery, and every row says how its setting differs from
the paper's.
"""

from __future__ import annotations

import typer

from cli.common import console, fail, say
from cli.options import ConfigFiles, DataDir, JudgeUrl, Limit, Overrides


def replicate_command(
    system: str = typer.Argument(..., help="A card under configs/replicate/ (search_r1, r1_searcher, ...) or a path."),
    model_path: str = typer.Option(None, "--model-path", help="Model to run instead of the card's checkpoint."),
    limit: Limit = None,
    launch: bool = typer.Option(False, "--launch", help="Start SGLang for the model and stop it at the end."),
    data_dir: DataDir = None,
    index: str = typer.Option(None, "--index", help="The paper's index directory (e.g. wiki18-e5); else a local run."),
    corpus: str = typer.Option(None, "--corpus", help="Local run: corpus for datasets that have none locally."),
    backend: str = typer.Option(
        None, "--backend", help="hf | sglang | openai | scripted (default hf; sglang with --launch)."
    ),
    datasets: str = typer.Option(None, "--datasets", help="Comma-separated subset of the card's datasets."),
    out: str = typer.Option(
        None, "--out", help="Parent folder of the run directories (default runs/replicate/SYSTEM)."
    ),
    judge_url: JudgeUrl = None,
    config_files: ConfigFiles = None,
    overrides: Overrides = None,
) -> None:
    # deferred: the command's library loads when it runs, not at every harness --help
    from rich.console import Console

    # deferred: the command's library loads when it runs, not at every harness --help
    from benchmarks.eval_runs import RunError
    from benchmarks.replicate import replicate, replication_notes, replication_table

    only = [d.strip() for d in datasets.split(",")] if datasets else None
    try:
        rep = replicate(
            system,
            model_path,
            limit,
            launch,
            data_dir,
            index,
            corpus,
            backend,
            only,
            out,
            judge_url,
            list(config_files or []),
            list(overrides or []),
            say=say,
        )
    except (ValueError, KeyError, RunError) as e:  # KeyError: RegistryError (an unknown profile)
        fail(str(e))
    out_console = Console()
    if not out_console.is_terminal:
        out_console = Console(width=max(160, out_console.width))
    out_console.print(replication_table(rep))
    for line in replication_notes(rep):
        console.print(line, highlight=False)
