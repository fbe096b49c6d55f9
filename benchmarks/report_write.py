"""``harness report``: run directories in, leaderboard files out (the CLI parses options and calls
:func:`write_report`, then prints :func:`terminal_table`).

Reads run directories only (never a model). Formats: Markdown, CSV and LaTeX
(:mod:`benchmarks.report_render`) and the self-contained HTML report (:mod:`benchmarks.report_html`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import Leaderboard

logger = logging.getLogger(__name__)

FILES = {"md": "leaderboard.md", "csv": "leaderboard.csv", "latex": "leaderboard.tex", "html": "report.html"}
FORMATS = tuple(FILES)
REFERENCE = Path(__file__).resolve().parents[1] / "configs" / "reference" / "published.yaml"


def _html(lb: Leaderboard, ref: list[dict[str, Any]] | None) -> str:
    from benchmarks.report_html import to_html

    return to_html(lb, ref)


def _renderer(fmt: str) -> Callable[[Leaderboard, list[dict[str, Any]] | None], str]:
    from benchmarks import report_render

    return {
        "md": report_render.to_markdown,
        "csv": report_render.to_csv,
        "latex": report_render.to_latex,
        "html": _html,
    }[fmt]


def parse_formats(spec: str) -> list[str]:
    """``"md,html"`` → the formats, in order, once each (``tex`` is accepted for ``latex``)."""
    wanted = [f.strip().lower() for f in spec.split(",") if f.strip()]
    wanted = ["latex" if f == "tex" else f for f in wanted]  # the file is .tex; accept either name
    unknown = [f for f in wanted if f not in FORMATS]
    if unknown or not wanted:
        raise ValueError(
            f"unknown format {', '.join(unknown) or spec!r}; use a comma-separated subset of {','.join(FORMATS)}"
        )
    return list(dict.fromkeys(wanted))


@dataclass
class Report:
    """What :func:`write_report` wrote: the leaderboard, the run directories it skipped (with
    why), and the files under ``out``."""

    leaderboard: Leaderboard
    skipped: list[str]
    out: Path
    files: list[str]


def write_report(
    runs: list[str],
    out: str | Path = "report",
    formats: str = ",".join(FORMATS),
    baseline: str | None = None,
    rescore: bool = False,
    reference: bool = False,
    reference_file: str | Path | None = None,
    metric_profile: str | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
) -> Report:
    """Group ``runs`` (directories, their parents, or globs) by method × dataset, bootstrap the
    cells (``bootstrap`` resamples, ``seed``), test every row against ``baseline``, and write the
    ``formats`` into ``out``. ``metric_profile``: its columns (default: the runs' recorded
    profile, else the default metrics); ``reference``: add the published numbers (``reference_file``,
    default :data:`REFERENCE`). Raises
    ``ValueError`` (nothing readable, bad options) or ``OSError`` naming what failed."""
    from benchmarks.replicate import reference_entries
    from benchmarks.report import METRICS, build_leaderboard, load_runs, profile_columns, run_profile

    wanted = parse_formats(formats)
    loaded, skipped = load_runs(runs, rescore=rescore)
    if not loaded:
        raise ValueError("no readable run directories: " + "; ".join(skipped))
    profile = metric_profile or run_profile(loaded)
    metrics = profile_columns(profile, loaded) if profile else METRICS
    lb = build_leaderboard(
        loaded, metrics=metrics, baseline=baseline, b=bootstrap, seed=seed, skipped=skipped, profile=profile
    )
    ref = reference_entries(reference_file or REFERENCE) if reference else None
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for fmt in wanted:
            (out_dir / FILES[fmt]).write_text(_renderer(fmt)(lb, ref), encoding="utf-8")
            logger.info("wrote %s", out_dir / FILES[fmt])
    except OSError as e:
        raise OSError(f"cannot write the report to {out_dir}: {e}") from e
    return Report(lb, skipped, out_dir, [FILES[f] for f in wanted])


def terminal_table(lb: Leaderboard) -> Any:
    """The leaderboard as a rich table: one column per dataset, one line per metric in each cell."""
    from rich.markup import escape
    from rich.table import Table

    from benchmarks.fmt import NAMES, pct
    from benchmarks.report_render import cell_text

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
