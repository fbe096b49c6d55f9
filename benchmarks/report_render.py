"""Leaderboard renderers: Markdown, CSV and LaTeX (the HTML report lives in ``report_html``).

Numbers are percentages with one decimal. A cell reads ``43.5 [40.1, 46.9]``; the best value of
a column is bold; ``*`` marks a significant paired difference from ``--baseline``; a partial or
failed cell adds its status, e.g. ``(4/6, 1 err)``: failed items are left out of the mean
(:func:`benchmarks.evaluate.item_values`); a missing cell, a run whose items all failed, or an
average over incomplete cells is ``–``. Published numbers, when asked for, follow in their own table labelled as such.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from benchmarks.answerability import answerability_short
from benchmarks.fmt import NAMES, p_value, pct
from benchmarks.profiles import PROFILES
from benchmarks.replicate import replication_rows
from benchmarks.report import Cell, Leaderboard, reference_datasets, reference_setting
from benchmarks.training_curves import panels

PUBLISHED_TITLE = "Published numbers (not directly comparable: corpora, retrievers, models, k and subsets differ)"


def profile_source(name: str) -> str:
    """Where a metric profile's definitions come from (one line), or a note when unknown."""
    return PROFILES.get(name).source if name in PROFILES else "unknown profile"


def _num(x: float | None, fmt: str) -> str:
    return "–" if x is None or x != x else format(x, fmt)


def cell_text(lb: Leaderboard, ds: str, cell: Cell | None, m: str, bold: tuple[str, str] = ("**", "**")) -> str:
    """``mean [low, high]``, bold when best, ``*`` when significant vs. baseline, status when partial."""
    if cell is None:
        return "–"
    ci = cell.ci[m]
    text = f"{pct(ci.mean)} [{pct(ci.low)}, {pct(ci.high)}]" if ci.mean == ci.mean else pct(ci.mean)  # NaN: no score
    if cell.run.complete and lb.is_best(ds, m, ci.mean):
        text = f"{bold[0]}{text}{bold[1]}"
    diff = cell.vs_baseline.get(m)
    if diff is not None and diff.significant:
        text += "*"
    return text + (f" ({cell.run.status})" if cell.run.status else "")


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def leaderboard_markdown(lb: Leaderboard) -> list[str]:
    """The main table: one row per method, a column group per dataset, then the average."""
    head = ["method"]
    for ds in lb.datasets:
        head += [f"{ds} {NAMES.get(m, m)}" for m in lb.metrics] + [f"{ds} n"]
    head += [f"avg {NAMES.get(m, m)}" for m in lb.metrics]
    rows = []
    for row in lb.rows:
        cells = [row.label]
        for ds in lb.datasets:
            c = row.cells.get(ds)
            cells += [cell_text(lb, ds, c, m) for m in lb.metrics]
            cells.append(f"{c.run.n}/{c.run.n_total}" if c else "–")
        for m in lb.metrics:
            v = row.average[m]
            text = f"**{pct(v)}**" if lb.is_best("avg", m, v) else pct(v)
            cells.append(text)
        rows.append(cells)
    return _md_table(head, rows)


def to_markdown(lb: Leaderboard, reference: list[dict[str, Any]] | None = None) -> str:
    """The whole Markdown report: leaderboard, notes, paired tests, cost, published numbers."""
    out = [
        "## Leaderboard",
        "",
        f"Percent; 95% percentile-bootstrap CI over items (B={lb.bootstrap}, seed {lb.seed}). Bold: best "
        "among complete runs. `(k/n, e err)`: k of n items scored, e failed (the retriever or a server "
        "failed); failed items are left out of every mean, and a run whose items all failed shows `–`. avg: "
        "mean over datasets, only for rows with a complete run on every dataset.",
        "",
    ]
    if lb.profile:
        out += [f"Metric profile: `{lb.profile}` ({profile_source(lb.profile)}).", ""]
    if lb.baseline:
        out += [f"`*`: significantly different from `{lb.baseline}` (paired bootstrap on shared items).", ""]
    out += leaderboard_markdown(lb) if lb.rows else ["No evaluation runs in this report."]
    missing = [(r.label, ds, m, c.run.missing(m)) for r in lb.rows for ds, c in r.cells.items() for m in lb.metrics]
    missing = [x for x in missing if x[3]]
    if missing:
        out += ["", "Missing values (left out of the mean, not counted as wrong):", ""]
        out += [f"- {label} on {ds}: {NAMES.get(m, m)} missing for {k} items" for label, ds, m, k in missing]
    known = [(r.label, ds, c.run.answerability) for r in lb.rows for ds, c in r.cells.items() if c.run.answerability]
    if known:
        out += ["", "How answerable the questions are on the corpus searched (`harness index check`):", ""]
        out += [f"- {label} on {ds}: {answerability_short(a)}" for label, ds, a in known]
    if lb.skipped:
        out += ["", "Skipped (not in this report, and why):", ""] + [f"- {s}" for s in lb.skipped]
    if lb.baseline:
        out += ["", f"## Paired differences vs. {lb.baseline}", "", *paired_markdown(lb)]
    if lb.rows:
        out += ["", "## Cost", "", *cost_markdown(lb)]
    if lb.training:
        out += ["", *training_markdown(lb)]
    if reference:
        out += ["", *replication_markdown(lb)]
        out += ["", *reference_markdown(reference)]
    return "\n".join(out) + "\n"


def training_markdown(lb: Leaderboard) -> list[str]:
    """The training curves: the runs drawn, then one PNG link per panel (files in ``curves/``)."""
    out = ["## Training curves", "", "Against step; one line per training run:", ""]
    for r in lb.training:
        out.append(f"- `{r.label}`: {r.path}")
        out += [f"  - note: {n}" for n in r.notes]
    out.append("")
    out += [f"![{p.title}]({p.file})" for p in panels(lb.training)]
    return out


def replication_markdown(lb: Leaderboard) -> list[str]:
    """Runs of a replication card's method and dataset beside that paper's number (as ``harness
    replicate`` prints them); the setting may still differ from the paper's (see the run's manifest)."""
    rows = replication_rows(lb)
    if not rows:
        return []
    head = ["system", "dataset", "metric", "paper", "field (paper + published)", "ours (95% CI)", "lands", "n", "row"]
    title = "## Paper vs ours (replication cards; same number only in the paper's setting)"
    return [title, "", *_md_table(head, rows)]


def paired_markdown(lb: Leaderboard) -> list[str]:
    """Difference (points) with its 95% CI, p-like fraction and the number of shared items."""
    head = ["method", "dataset", "metric", "diff", "95% CI", "p", "shared n", "significant"]
    rows = []
    for row in lb.rows:
        for ds, c in row.cells.items():
            for m, d in c.vs_baseline.items():
                rows.append(
                    [
                        row.label,
                        ds,
                        NAMES.get(m, m),
                        pct(d.diff, signed=True),
                        f"[{pct(d.low, signed=True)}, {pct(d.high, signed=True)}]",
                        p_value(d.p, bare=True),
                        str(d.n),
                        "yes" if d.significant else "no",
                    ]
                )
    return _md_table(head, rows)


COST_COLUMNS = ("searches", "gen tokens", "p50 s", "p95 s", "abstain %", "tokens/ok", "searches/ok")


def cost_markdown(lb: Leaderboard) -> list[str]:
    """Mean searches, mean generated tokens and latency percentiles per cell, then abstention and
    the cost per correct answer (``ok``: the headline metric, :func:`correct_metric`); then, for
    cells whose questions ``harness index check`` recorded, accuracy on the answerable questions
    and abstention on the unanswerable ones."""
    correct = correct_metric(lb)
    head = ["method"] + [f"{ds} {k}" for ds in lb.datasets for k in COST_COLUMNS]
    rows, split = [], []
    for row in lb.rows:
        cells = [row.label]
        for ds in lb.datasets:
            c = row.cells.get(ds)
            if c is None:
                cells += ["–"] * len(COST_COLUMNS)
                continue
            r = c.run
            b = r.behaviour(correct)
            cells += [
                _num(r.mean("n_searches"), ".2f"),
                _num(r.mean("generated_tokens"), ".0f"),
                _num(r.latency(50), ".2f"),
                _num(r.latency(95), ".2f"),
                pct(b["abstention"]),
                _num(b["tokens_per_correct"], ".0f"),
                _num(b["searches_per_correct"], ".2f"),
            ]
            if "answerable_accuracy" in b:
                split.append((row.label, ds, b))
        rows.append(cells)
    out = [
        f"`ok`: a correct answer by {NAMES.get(correct, correct)} (its sum over items); abstain: the share of "
        'predictions that decline to answer (no answer, or "I don\'t know"); docs/evaluation.md defines each.',
        "",
    ]
    out += _md_table(head, rows)
    if split:
        out += [
            "",
            "Answerable and unanswerable questions apart (`harness index check`: is a gold answer anywhere in "
            "the corpus searched):",
            "",
        ]
        out += _md_table(
            [
                "method",
                "dataset",
                f"{NAMES.get(correct, correct)} on answerable",
                "abstain on unanswerable",
                "unanswerable n",
            ],
            [
                [
                    lb_,
                    ds,
                    pct(b["answerable_accuracy"]),
                    pct(b["unanswerable_abstention"]),
                    f"{b['n_unanswerable']:.0f}",
                ]
                for lb_, ds, b in split
            ],
        )
    return out


def correct_metric(lb: Leaderboard) -> str:
    """The metric a report counts a correct answer by: its headline (the first column)."""
    return lb.metrics[0] if lb.metrics else "em"


def _ref_value(e: dict[str, Any], ds: str) -> str:
    v = e["values"].get(ds)
    return "–" if v is None else str(v)


def reference_markdown(reference: list[dict[str, Any]]) -> list[str]:
    """Published numbers, each row labelled ``(published)`` with its full setting."""
    datasets = reference_datasets(reference)
    head = ["system", "model", "metric", *datasets, "setting"]
    rows = [
        [
            f"{e['system']} (published)",
            e["model"],
            e["metric"],
            *[_ref_value(e, ds) for ds in datasets],
            reference_setting(e),
        ]
        for e in reference
    ]
    return [f"## {PUBLISHED_TITLE}", "", *_md_table(head, rows)]


CSV_HEAD = [
    "kind",
    "method",
    "model",
    "retriever",
    "dataset",
    "metric",
    "mean",
    "ci_low",
    "ci_high",
    "n",
    "n_total",
    "errors",
    "complete",
    "best",
    "diff_vs_baseline",
    "diff_ci_low",
    "diff_ci_high",
    "p_vs_baseline",
    "shared_n",
    "significant",
    "mean_searches",
    "mean_generated_tokens",
    "latency_p50_s",
    "latency_p95_s",
    "abstention",
    "tokens_per_correct",
    "searches_per_correct",
    "answerable_accuracy",
    "unanswerable_abstention",
    "setting",
]


def _f4(x: float | None) -> str:
    return "" if x is None or x != x else f"{x:.4f}"


def to_csv(lb: Leaderboard, reference: list[dict[str, Any]] | None = None) -> str:
    """Long format: one line per (row, dataset, metric); published numbers as ``kind=published``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_HEAD)
    correct = correct_metric(lb)
    for row in lb.rows:
        for ds in lb.datasets:
            c = row.cells.get(ds)
            if c is None:
                continue
            r = c.run
            b = r.behaviour(correct)
            behaviour = [_f4(b.get(k)) for k in CSV_HEAD[-6:-1]]
            for m in lb.metrics:
                ci, d = c.ci[m], c.vs_baseline.get(m)
                paired = [""] * 6 if d is None else [_f4(d.diff), _f4(d.low), _f4(d.high), _f4(d.p), d.n]
                paired += [] if d is None else [int(d.significant)]
                w.writerow(
                    ["measured", *row.key, ds, m, _f4(ci.mean), _f4(ci.low), _f4(ci.high), r.n, r.n_total, r.errors]
                    + [int(r.complete), int(r.complete and lb.is_best(ds, m, ci.mean)), *paired]
                    + [_f4(r.mean("n_searches")), _f4(r.mean("generated_tokens")), _f4(r.latency(50))]
                    + [_f4(r.latency(95)), *behaviour, r.status]
                )
    for e in reference or []:
        for ds, v in e["values"].items():
            w.writerow(
                ["published", f"{e['system']} (published)", e["model"], e["retriever"], ds, e["metric"], _f4(v / 100)]
                + [""] * (len(CSV_HEAD) - 8)
                + [reference_setting(e)]
            )
    return buf.getvalue()


def _tex(s: str) -> str:
    return (
        s.replace("\\", r"\textbackslash{}")
        .replace("_", r"\_")
        .replace("&", r"\&")
        .replace("%", r"\%")
        .replace("#", r"\#")
        .replace("§", r"\S{}")
    )


def _tex_cell(lb: Leaderboard, ds: str, c: Cell | None, m: str) -> str:
    if c is None:
        return "--"
    v = pct(c.ci[m].mean)
    if c.run.complete and lb.is_best(ds, m, c.ci[m].mean):
        v = rf"\textbf{{{v}}}"
    d = c.vs_baseline.get(m)
    if d is not None and d.significant:
        v += r"$^{*}$"
    if c.run.status:
        v += r"$^{\dagger}$"
    return v


def to_latex(lb: Leaderboard, reference: list[dict[str, Any]] | None = None) -> str:
    """A booktabs tabular of means (CIs are in the CSV); published numbers in a second tabular."""
    k = len(lb.metrics)
    cols = "l" + "r" * (len(lb.datasets) * k + k)
    head1 = " & ".join(
        [""]
        + [rf"\multicolumn{{{k}}}{{c}}{{{_tex(ds)}}}" for ds in lb.datasets]
        + [rf"\multicolumn{{{k}}}{{c}}{{Avg}}"]
    )
    head2 = " & ".join(["Method"] + [NAMES.get(m, m) for _ in [*lb.datasets, "avg"] for m in lb.metrics])
    lines = [r"\begin{tabular}{" + cols + "}", r"\toprule", head1 + r" \\", head2 + r" \\", r"\midrule"]
    for row in lb.rows:
        cells = [_tex(row.label)] + [_tex_cell(lb, ds, row.cells.get(ds), m) for ds in lb.datasets for m in lb.metrics]
        for m in lb.metrics:
            v = row.average[m]
            text = "--" if v is None else (rf"\textbf{{{pct(v)}}}" if lb.is_best("avg", m, v) else pct(v))
            cells.append(text)
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    note = (
        rf"% Percent; best in bold; $^{{*}}$ significant vs. {_tex(lb.baseline or 'baseline')} (paired bootstrap, "
        rf"B={lb.bootstrap}); $^{{\dagger}}$ partial run or errors; Avg only over complete rows."
    )
    out = [note, *lines]
    if reference:
        out += ["", *_latex_reference(reference)]
    return "\n".join(out) + "\n"


def _latex_reference(reference: list[dict[str, Any]]) -> list[str]:
    datasets = reference_datasets(reference)
    lines = [
        rf"% {_tex(PUBLISHED_TITLE)}",
        r"\begin{tabular}{lll" + "r" * len(datasets) + "}",
        r"\toprule",
        " & ".join(["System (published)", "Model", "Metric", *[_tex(d) for d in datasets]]) + r" \\",
        r"\midrule",
    ]
    for e in reference:
        vals = [_ref_value(e, ds).replace("–", "--") for ds in datasets]
        lines.append(" & ".join([_tex(e["system"]), _tex(e["model"]), _tex(e["metric"]), *vals]) + r" \\")
    return lines + [r"\bottomrule", r"\end{tabular}"]
