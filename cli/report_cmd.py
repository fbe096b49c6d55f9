"""``harness report``: leaderboards (md, csv, tex), a self-contained HTML report and training curves from run dirs.

Reads run directories only (never a model): :func:`benchmarks.report_write.write_report`. The
leaderboard is also printed to the terminal; files go to ``--out``.
"""

from __future__ import annotations

import shutil
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from cli.common import console, fail


def report_command(
    runs: list[str] = typer.Argument(
        ...,
        help="Eval run folders, training run folders (drawn as training curves), folders holding runs at any "
        "depth, or globs (quote globs: 'runs/*').",
    ),
    out: str = typer.Option("report", "--out", help="Output directory for the report files."),
    baseline: str = typer.Option(
        None, "--baseline", help="Method every other row is tested against (paired bootstrap on shared items)."
    ),
    formats: str = typer.Option(
        "md,html,csv,latex",
        "--format",
        help="Comma-separated subset of md,html,csv,latex, and searchagent-leaderboard (the TencentBAC "
        "SearchAgent Leaderboard's JSON, one file per row; only rows in its setting: wiki-18, top-3, complete).",
    ),
    any_setting: bool = typer.Option(
        False, "--any-setting", help="Export leaderboard files for rows measured in another setting too."
    ),
    rescore: bool = typer.Option(
        False, "--rescore", help="Recompute scores from stored trajectories with the current metric code (in memory)."
    ),
    reference: bool = typer.Option(
        False, "--reference", help="Add the published numbers (labelled as such; not directly comparable)."
    ),
    reference_file: str = typer.Option(
        None, "--reference-file", help="Published numbers YAML (default: configs/reference/published.yaml)."
    ),
    metric_profile: str = typer.Option(
        None,
        "--metric-profile",
        help="Columns of a paper's metric set (default: the profile the runs recorded, else em,f1,acc,cover_em).",
    ),
    bootstrap: int = typer.Option(1000, "--bootstrap", min=10, help="Bootstrap resamples B."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed (reports are reproducible)."),
) -> None:
    """Group eval runs by method × dataset and write the leaderboard files and the HTML report; draw
    training runs' curves (HTML and PNG)."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from benchmarks.report_write import write_report

    try:
        rep = write_report(
            runs,
            out,
            formats,
            baseline,
            rescore,
            reference,
            reference_file,
            metric_profile,
            bootstrap,
            seed,
            any_setting=any_setting,
        )
    except (ValueError, OSError, KeyError) as e:  # KeyError: RegistryError, an unknown profile
        fail(str(e))
    print_report(rep)


def print_report(rep: Any) -> None:
    """A written report on the terminal: the leaderboard (stdout, pipeable; wide enough that the
    columns stay readable), then what was skipped and where the files are (stderr)."""
    # deferred: the command's library loads when it runs, not at every harness --help
    from benchmarks.report_write import terminal_table

    Console(width=max(shutil.get_terminal_size().columns, 140)).print(terminal_table(rep.leaderboard))
    for s in rep.skipped:
        console.print(f"[yellow]skipped[/] {escape(s)}", highlight=False, soft_wrap=True)
    curves = f", {len(rep.curves)} training curves in curves/" if rep.curves else ""
    console.print(f"{rep.leaderboard.n_runs} runs → {rep.out}/ ({', '.join(rep.files)}{curves})", highlight=False)
