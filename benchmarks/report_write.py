"""``harness report``: run directories in, leaderboard files out (the CLI parses options and calls
:func:`write_report`, then prints :func:`terminal_table`).

Reads run directories only (never a model). Formats: Markdown, CSV and LaTeX
(:mod:`benchmarks.report_render`) and the self-contained HTML report (:mod:`benchmarks.report_html`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from benchmarks import report_render
from benchmarks.answerability import answerability_short
from benchmarks.fmt import NAMES, pct
from benchmarks.leaderboard_export import BOARDS, board_files
from benchmarks.replication_cards import reference_entries
from benchmarks.report import (
    METRICS,
    Leaderboard,
    build_leaderboard,
    find_runs,
    load_paths,
    profile_columns,
    run_profile,
)
from benchmarks.report_files import write_all_or_none
from benchmarks.report_html import to_html
from benchmarks.report_render import cell_text
from benchmarks.training_curves import load_training_run, render_pngs, run_labels

logger = logging.getLogger(__name__)

FILES = {"md": "leaderboard.md", "csv": "leaderboard.csv", "latex": "leaderboard.tex", "html": "report.html"}
# A public leaderboard's own format (benchmarks.leaderboard_export.BOARDS): one file per row, in a folder.
FORMATS = (*FILES, *BOARDS.names())
REFERENCE = Path(__file__).resolve().parents[1] / "configs" / "reference" / "published.yaml"


def _html(lb: Leaderboard, ref: list[dict[str, Any]] | None) -> str:
    return to_html(lb, ref)


def _renderer(fmt: str) -> Callable[[Leaderboard, list[dict[str, Any]] | None], str]:
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
    """What :func:`write_report` wrote: the leaderboard, what it passed over (with why), and the
    files under ``out`` (the training curves' PNGs in ``curves``)."""

    leaderboard: Leaderboard
    skipped: list[str]
    out: Path
    files: list[str]
    curves: list[str] = field(default_factory=list)


def _training_runs(paths: list[Path]) -> tuple[list[Any], list[str]]:
    """The training runs that can be read, and ``"path: reason"`` for those that cannot."""
    runs, skipped = [], []
    for path, label in zip(paths, run_labels(paths), strict=True):
        try:
            runs.append(load_training_run(path, label))
        except (ValueError, OSError) as e:
            logger.warning("skipping %s: %s", path, e)
            skipped.append(f"{path}: {e}")
    return runs, skipped


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
    any_setting: bool = False,
) -> Report:
    """Group the evaluation runs among ``runs`` (run folders, folders holding runs at any depth,
    or globs) by method × dataset, bootstrap the cells (``bootstrap`` resamples, ``seed``), test
    every row against ``baseline``, and write the ``formats`` into ``out``; training runs among
    them are drawn as training curves (in the HTML and Markdown, and as PNGs in ``out/curves/``).

    ``metric_profile``: its columns (default: the runs' recorded profile, else the default
    metrics); ``reference``: add the published numbers (``reference_file``, default
    :data:`REFERENCE`). A leaderboard format (``searchagent-leaderboard``) writes one file per row
    into its folder, refusing rows not measured in the board's setting unless ``any_setting``
    (:func:`benchmarks.leaderboard_export.board_files`). Every file is rendered before any is
    written, and they are written all or none. Raises ``ValueError`` (nothing readable, bad
    options, a row off the board's setting) or ``OSError`` naming what failed.
    """
    wanted = parse_formats(formats)
    found = find_runs(runs)
    # The HTML's browser shows trajectories: read them now, so a corrupt line skips its run here.
    loaded, unreadable = load_paths(found.runs, rescore=rescore, trajectories="html" in wanted)
    training, bad_training = _training_runs(found.training)
    skipped = found.skipped + unreadable + bad_training
    if not loaded and not training:
        raise ValueError("no readable run directories: " + "; ".join(skipped))
    profile = metric_profile or run_profile(loaded)
    metrics = profile_columns(profile, loaded) if profile else METRICS
    lb = build_leaderboard(
        loaded, metrics=metrics, baseline=baseline, b=bootstrap, seed=seed, skipped=skipped, profile=profile
    )
    lb.training = training
    ref = reference_entries(reference_file or REFERENCE) if reference else None
    files = {FILES[fmt]: _renderer(fmt)(lb, ref).encode("utf-8") for fmt in wanted if fmt in FILES}
    for fmt in (f for f in wanted if f in BOARDS):
        files.update(board_files(lb, fmt, any_setting))
    pngs = render_pngs(training)
    write_all_or_none(out, {**files, **pngs})
    logger.info("wrote %d files to %s", len(files) + len(pngs), out)
    return Report(lb, skipped, Path(out), list(files), list(pngs))


def terminal_table(lb: Leaderboard) -> Any:
    """The leaderboard as a rich table: one column per dataset, one line per metric in each cell."""

    if not lb.rows:
        return "No evaluation runs (training curves only)."
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
            if c and c.run.answerability:  # how much of the set the searched corpus could answer
                lines.append(answerability_short(c.run.answerability))
            cells.append("\n".join(lines) if c else "–")
        avg = [f"{NAMES.get(m, m)} {pct(row.average[m])}" for m in lb.metrics]
        cells.append("\n".join(avg))
        table.add_row(*cells)
    return table
