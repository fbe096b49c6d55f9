"""``harness report``: leaderboards (md, csv, tex) and a self-contained HTML report from run dirs.

Reads run directories only (never a model). The Markdown leaderboard is also printed to the
terminal; files go to ``--out``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.cli.common import console, fail

logger = logging.getLogger(__name__)

FORMATS = ("md", "html", "csv", "latex")
FILES = {"md": "leaderboard.md", "csv": "leaderboard.csv", "latex": "leaderboard.tex", "html": "report.html"}
REFERENCE = Path(__file__).resolve().parents[2] / "configs" / "reference" / "published.yaml"


def _formats(spec: str) -> list[str]:
    wanted = [f.strip().lower() for f in spec.split(",") if f.strip()]
    wanted = ["latex" if f == "tex" else f for f in wanted]  # the file is .tex; accept either name
    unknown = [f for f in wanted if f not in FORMATS]
    if unknown or not wanted:
        fail(f"unknown format {', '.join(unknown) or spec!r}; use a comma-separated subset of {','.join(FORMATS)}")
    return list(dict.fromkeys(wanted))


def _render(fmt: str, lb, ref) -> str:
    from benchmarks import report_render

    if fmt == "md":
        return report_render.to_markdown(lb, ref)
    if fmt == "csv":
        return report_render.to_csv(lb, ref)
    if fmt == "latex":
        return report_render.to_latex(lb, ref)
    from benchmarks.report_html import to_html

    return to_html(lb, ref)


def report_command(
    runs: list[str] = typer.Argument(
        ..., help="Run directories, their parent folders, or globs (quote globs: 'runs/demo/*')."
    ),
    out: str = typer.Option("report", "--out", help="Output directory for the report files."),
    baseline: str = typer.Option(
        None, "--baseline", help="Method every other row is tested against (paired bootstrap on shared items)."
    ),
    formats: str = typer.Option(",".join(FORMATS), "--format", help="Comma-separated subset of md,html,csv,latex."),
    rescore: bool = typer.Option(
        False, "--rescore", help="Recompute scores from stored trajectories with the current metric code (in memory)."
    ),
    reference: bool = typer.Option(
        False, "--reference", help="Add the published numbers (labelled as such; not directly comparable)."
    ),
    reference_file: str = typer.Option(str(REFERENCE), "--reference-file", help="Published numbers YAML."),
    metric_profile: str = typer.Option(
        None,
        "--metric-profile",
        help="Columns of a paper's metric set (default: the profile the runs recorded, else em,f1,acc,cover_em).",
    ),
    bootstrap: int = typer.Option(1000, "--bootstrap", min=10, help="Bootstrap resamples B."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed (reports are reproducible)."),
) -> None:
    """Group runs by method × dataset and write the leaderboard files and the HTML report."""
    from benchmarks.replicate import reference_entries
    from benchmarks.report import METRICS, build_leaderboard, load_runs, profile_columns, run_profile

    wanted = _formats(formats)
    try:
        loaded, skipped = load_runs(runs, rescore=rescore)
        if not loaded:
            fail("no readable run directories: " + "; ".join(skipped))
        profile = metric_profile or run_profile(loaded)
        metrics = profile_columns(profile, loaded) if profile else METRICS
        lb = build_leaderboard(
            loaded, metrics=metrics, baseline=baseline, b=bootstrap, seed=seed, skipped=skipped, profile=profile
        )
        ref = reference_entries(reference_file) if reference else None
    except (ValueError, OSError, KeyError) as e:  # KeyError: RegistryError, an unknown profile
        fail(str(e))
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for fmt in wanted:
            (out_dir / FILES[fmt]).write_text(_render(fmt, lb, ref), encoding="utf-8")
            logger.info("wrote %s", out_dir / FILES[fmt])
    except OSError as e:
        fail(f"cannot write the report to {out_dir}: {e}")
    # The leaderboard goes to stdout (pipeable); wide enough that the columns stay readable.
    Console(width=max(shutil.get_terminal_size().columns, 140)).print(_terminal_table(lb))
    for s in skipped:
        console.print(f"[yellow]skipped[/] {escape(s)}", highlight=False, soft_wrap=True)
    console.print(f"{lb.n_runs} runs → {out_dir}/ ({', '.join(FILES[f] for f in wanted)})", highlight=False)


def _terminal_table(lb) -> Table:
    """The leaderboard as a rich table: one column per dataset, one line per metric in each cell."""
    from benchmarks.report_render import NAMES, cell_text, pct

    title = "Leaderboard (percent, 95% bootstrap CI; * significant vs. baseline)"
    if lb.profile:
        title += f"; metric profile: {lb.profile}"
    table = Table(title=title, show_lines=True)
    table.add_column("method")
    for ds in [*lb.datasets, "avg"]:
        table.add_column(ds)
    for row in lb.rows:
        cells = [escape(row.label)]
        for ds in lb.datasets:
            c = row.cells.get(ds)
            lines = [f"{NAMES.get(m, m)} {cell_text(lb, ds, c, m, bold=('[bold]', '[/bold]'))}" for m in lb.metrics]
            cells.append("\n".join(lines) if c else "–")
        avg = [f"{NAMES.get(m, m)} {pct(row.average[m])}" for m in lb.metrics]
        cells.append("\n".join(avg) + (f"\n({row.average_status})" if row.average_status else ""))
        table.add_row(*cells)
    return table
