"""Replication: a card (:mod:`benchmarks.replication_cards`) run through the normal eval path, the
paper's numbers beside ours.

:func:`compare` puts the paper's numbers beside ours with 95% bootstrap intervals, and the field's
published rows (the paper's other rows, independent reproductions) beside them; :func:`replicate`
is ``harness replicate``: the card's configs (a local BM25 run unless the paper's index is given),
run through :func:`benchmarks.eval_runs.run_configs`, compared row by row, each with a closed-book
run beside it; :func:`replication_table` and :func:`replication_notes` render the result.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from benchmarks.answerability import answerability_line, beats_corpus, check_index, known_answerability
from benchmarks.build import default_corpus, load_eval_examples, run_dir_for
from benchmarks.datasets import corpus_path
from benchmarks.eval_runs import run_configs
from benchmarks.fmt import NAMES, pct
from benchmarks.profiles import judge_note
from benchmarks.replication_cards import REPO_ROOT, Card, card_configs, card_names, load_card, setting_differences
from benchmarks.report import load_reference, load_run, reference_setting
from benchmarks.stats import bootstrap_ci
from harness.config import ConfigError, deep_merge, load_yaml, parse_overrides
from harness.retrieval.factory import index_from_config
from harness.retrieval.index import read_manifest
from harness.runlog import RunDir
from pipelines.methods import method_kind

logger = logging.getLogger(__name__)

# Published rows: the papers' other rows and independent reproductions (benchmarks.report.load_reference)
PUBLISHED = REPO_ROOT / "configs" / "reference" / "published.yaml"


@dataclass(frozen=True)
class FieldRow:
    """A published row beside a card's number (``configs/reference/published.yaml`` with
    ``replicates: CARD``): the paper's other rows and independent reproductions, in percent."""

    system: str
    model: str
    kind: str
    value: float
    setting: str  # benchmarks.report.reference_setting: how it was measured, and its source


def metric_family(name: str) -> str:
    """``em`` for every exact match (``em_last_answer``, ``EM (R1-Searcher)``, ``EM``), ``f1`` for
    every token F1, ``cover_em``, ``acc``: which published rows a measured metric sits beside."""
    n = name.lower().replace("-", "_").replace(" ", "_")
    for fam in ("cover_em", "em", "f1", "acc"):
        if n == fam or n.startswith((fam + "_", fam + "(")):
            return fam
    return n


def field_rows(card: Card, dataset: str, metric: str, entries: list[dict[str, Any]]) -> list[FieldRow]:
    """The published rows of ``card``'s system on ``dataset`` in ``metric``'s family."""
    out = []
    for e in entries:
        if e.get("replicates") != card.name or dataset not in e["values"]:
            continue
        if metric_family(e["metric"]) != metric_family(metric):
            continue
        out.append(FieldRow(e["system"], e["model"], e["kind"], float(e["values"][dataset]), reference_setting(e)))
    return out


def field_span(paper: float | None, rows: list[FieldRow]) -> tuple[float, float, int] | None:
    """(lowest, highest, how many) over the paper's number and the published rows (percent)."""
    values = ([paper] if paper is not None else []) + [r.value for r in rows]
    return (min(values), max(values), len(values)) if values else None


def lands(ours: float | None, span: tuple[float, float, int] | None) -> str:
    """Where a measured value (0..1) sits against the field's span (percent): ``below``,
    ``within`` or ``above`` the paper's and the reproductions' numbers."""
    if ours is None or span is None:
        return ""
    low, high, n = span
    x = 100 * ours
    where = "below" if x < low - 1e-9 else "above" if x > high + 1e-9 else "within"
    return f"{where} ({n} published)" if n > 1 else where


@dataclass
class ComparisonRow:
    """One (dataset, metric) line of a replication table; values in 0..1, the paper's in percent."""

    dataset: str
    metric: str
    paper: float | None
    source: str
    ours: float | None
    low: float | None
    high: float | None
    n: int
    missing: int
    differences: list[str]
    run_dir: str
    run: str = "search agent"  # or CLOSED_BOOK: the same model and prompt, retrieval turned off
    # The paper's other rows and independent reproductions on this dataset and metric family.
    published: list[FieldRow] = field(default_factory=list)

    @property
    def span(self) -> tuple[float, float, int] | None:
        return field_span(self.paper, self.published)


CLOSED_BOOK = "closed-book"


def compare(
    card: Card,
    label: str,
    run_dir: str | Path,
    metrics: tuple[str, ...],
    differences: list[str],
    run: str = "search agent",
    reference: list[dict[str, Any]] | None = None,
) -> list[ComparisonRow]:
    """Paper vs ours for every metric of the run (bootstrap 95% CI over items, as reports do),
    with the field's published rows (``reference``: :func:`benchmarks.report.load_reference`
    entries) beside the search agent's."""
    summary = load_run(Path(run_dir))
    rows = []
    for m in metrics:
        values = list(summary.item_values(m).values())

        ci = bootstrap_ci(values) if values else None
        paper, source = card.paper_value(m, label) if run != CLOSED_BOOK else (None, "")
        rows.append(
            ComparisonRow(
                dataset=label,
                metric=m,
                paper=paper,
                source=source,
                ours=ci.mean if ci else None,
                low=ci.low if ci else None,
                high=ci.high if ci else None,
                n=len(values),
                missing=summary.missing(m),
                differences=differences,
                run_dir=str(run_dir),
                run=run,
                published=field_rows(card, label, m, reference or []) if run != CLOSED_BOOK else [],
            )
        )
    return rows


def replication_rows(lb: Any, reference: list[dict[str, Any]] | None = None) -> list[list[str]]:
    """Paper vs ours for every leaderboard cell that runs a card's method on a card's dataset:
    ``[system, dataset, metric, paper, field, ours [CI], lands, n, run]``, the rows ``harness
    replicate`` prints; ``field``: the span of the paper's and the published rows
    (``reference``, default the published-numbers file) and where ours lands in it."""
    cards = [load_card(n) for n in card_names()]
    reference = load_reference(PUBLISHED) if reference is None else reference
    out = []
    for row in lb.rows:
        for cell in row.cells.values():
            run = cell.run
            for card in cards:
                if card.method != run.method:
                    continue
                for d in card.datasets:
                    if d.name != run.dataset or (d.split and d.split != run.split):
                        continue
                    for m in lb.metrics:
                        paper, _ = card.paper_value(m, d.key)
                        if paper is None:
                            continue
                        ci = cell.ci[m]
                        ours = f"{pct(ci.mean)} [{pct(ci.low)}, {pct(ci.high)}]"
                        n = f"{run.n}/{run.n_total}"
                        span = field_span(paper, field_rows(card, d.key, m, reference))
                        where = lands(ci.mean if ci.mean == ci.mean else None, span)
                        row_ = [card.system, d.key, NAMES.get(m, m), f"{paper:g}", span_text(span), ours, where]
                        out.append([*row_, n, row.label])
    return out


# ---- harness replicate ---------------------------------------------------------------------------
@dataclass
class Replication:
    """What ``harness replicate`` ran and found: paper-vs-ours rows (the search agent's, then its
    closed-book run's), the datasets it could not run (with why), whether it was a local run (no
    paper index), the metric profile, and how answerable the questions are on the index."""

    card: Card
    rows: list[ComparisonRow]
    skipped: list[tuple[str, str]]
    local: bool
    profile: str
    # Per dataset label: its questions' shares on the searched index (None: unknown).
    answerability: dict[str, Any] = field(default_factory=dict)


def local_config(cfg: Any, corpus: str | None) -> tuple[Any, str | None]:
    """(config to run or None, why it was skipped): the config adjusted for a local run (BM25
    over the split's own corpus, else ``corpus``), or why it cannot run here."""
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


def full_size(cfg: Any) -> int | None:
    """How many questions the config's split has without its ``limit`` / ``sample`` (None when
    it has neither, or the split cannot be read)."""
    if cfg.dataset.limit is None and cfg.dataset.sample is None:
        return None
    try:
        return len(load_eval_examples(replace(cfg, dataset=replace(cfg.dataset, limit=None, sample=None))))
    except (ValueError, OSError, KeyError, RuntimeError):
        return None


def replicate(
    system: str,
    model_path: str | None = None,
    limit: int | None = None,
    launch: bool = False,
    data_dir: str | None = None,
    index: str | None = None,
    corpus: str | None = None,
    backend: str | None = None,
    datasets: list[str] | None = None,
    out: str | None = None,
    judge_url: str | None = None,
    config_files: list[str] | None = None,
    overrides: list[str] | None = None,
    say: Callable[[str], None] = logger.info,
) -> Replication:
    """Run card ``system`` (a name or path) as ``harness replicate`` does; see the module docstring.

    Without ``index`` it is a local run: BM25 over each dataset's local corpus (or ``corpus``;
    HotpotQA's distractor corpus under ``data_dir`` when present). ``data_dir`` defaults to
    ``$HARNESS_DATA_DIR``. Raises ``ValueError`` (a bad card, nothing to run) or
    :class:`benchmarks.eval_runs.RunError`.
    """

    card = load_card(system)
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
        configs = card_configs(card, data, limit=limit, only=datasets)
    except (ConfigError, ValueError, KeyError) as e:
        raise ValueError(f"card {card.name}: {e}") from e
    if not configs:
        raise ValueError(
            f"card {card.name}: no dataset selected (card datasets: {', '.join(d.key for d in card.datasets)})"
        )
    distractor = Path(data_dir) / "hotpotqa" / "corpus_distractor1352.jsonl" if data_dir else None
    if corpus is None and local and distractor is not None and distractor.exists():
        corpus = str(distractor)
    runnable, skipped = [], []
    labels = {(d.name, d.split): d.key for d in card.datasets}
    for cfg in configs:
        label = labels[(cfg.dataset.name, cfg.dataset.split)]
        ready, why = local_config(cfg, corpus) if local else (cfg, None)
        if ready is None:
            skipped.append((label, str(why)))
        else:
            runnable.append((label, ready))
    if not runnable:
        raise ValueError(f"card {card.name}: nothing to run: " + "; ".join(f"{lb}: {why}" for lb, why in skipped))
    answerability = {label: card_answerability(cfg, compute=local, say=say) for label, cfg in runnable}
    closed = [(label, closed_book_config(cfg)) for label, cfg in runnable]
    results = run_configs([cfg for _, cfg in runnable + closed], say=say)
    rows: list[ComparisonRow] = []
    published = load_reference(PUBLISHED)
    for (label, cfg), res in zip(runnable, results[: len(runnable)], strict=True):
        run_dir = run_dir_for(cfg)
        diffs = setting_differences(card, cfg, RunDir(run_dir).manifest, res.n_total, full_size(cfg))
        rows.extend(compare(card, label, run_dir, tuple(cfg.metrics), diffs, reference=published))
    for label, cfg in closed:
        rows.extend(compare(card, label, run_dir_for(cfg), tuple(cfg.metrics), [], run=CLOSED_BOOK))
    answerability = {k: v.to_dict() if v is not None else None for k, v in answerability.items()}
    return Replication(card, rows, skipped, local, runnable[0][1].metric_profile, answerability)


def closed_book_config(cfg: Any) -> Any:
    """The same model and prompt with retrieval turned off, labelled ``<name>-closed-book``.

    An agent method runs its own dialect with no search turn (``agent.max_turns=0``) and one
    final turn (``agent.final_turn=true``): the prompt, the stops of the dialect's last
    no-search turn (Search-R1's own final turn) and the answer extraction stay the agent's, so
    the difference from the search run is retrieval alone. A baseline method runs FlashRAG's
    ``naive`` (generation without retrieval) with the same backend.
    """
    label = f"{cfg.name}-{CLOSED_BOOK}"
    if method_kind(cfg.method) == "agent":
        return replace(cfg, agent={**cfg.agent, "max_turns": 0, "final_turn": True}, label=label)
    return replace(cfg, method="naive", label=label)


def card_answerability(cfg: Any, compute: bool, say: Callable[[str], None] = logger.info) -> Any:
    """How answerable ``cfg``'s questions are on the index it searches
    (:class:`benchmarks.answerability.Answerability`), or None when unknown.

    Read from what ``harness index check`` recorded beside the index; with ``compute`` (local
    runs: small corpora) checked now when not recorded, so the eval run records it in its
    manifest too. A paper index (wiki-18) is never scanned here: run ``harness index check``.
    """
    r = cfg.retriever
    if r.kind not in ("bm25", "dense") or r.encoder:
        return None  # no index directory of ours, or a query encoder the check did not use
    examples = load_eval_examples(cfg)
    d = cfg.dataset
    retriever = None
    if r.index:
        index_dir, index_id = Path(r.index), read_manifest(r.index)["index_id"]
    else:
        corpus = default_corpus(r, d.name, d.split, d.data_dir)
        retriever = index_from_config(r, str(corpus) if corpus else None)
        index_dir, index_id = retriever.index_dir, retriever.index_id
    known = known_answerability(index_dir, index_id, examples, r.topk)
    if known is not None or not compute:
        if known is None:
            say(f"{d.name}: answerability unknown; harness index check --index {index_dir} --dataset {d.name}")
        return known
    check_index(index_dir, [d.name], d.split, max(r.topk, 5), examples={d.name: examples}, retriever=retriever, say=say)
    return known_answerability(index_dir, index_id, examples, r.topk)


def replication_table(rep: Replication) -> Any:
    """The paper-vs-ours table (a rich ``Table``; values in percent)."""

    card = rep.card
    table = Table(title=f"harness replicate {card.name}: {card.system} (metric profile: {rep.profile}; percent)")
    cols = ("dataset", "run", "metric", "paper", "field", "ours", "95% CI", "lands", "n", "missing")
    for col in cols:
        table.add_column(col, justify="left" if col in ("dataset", "run", "metric", "lands") else "right", no_wrap=True)
    for r in sorted(rep.rows, key=lambda r: r.dataset):  # stable: per dataset, the search run first
        table.add_row(
            r.dataset,
            r.run,
            NAMES.get(r.metric, r.metric),
            "–" if r.paper is None else f"{r.paper:g}",
            span_text(r.span) if r.published else "–",
            pct(r.ours),
            f"[{pct(r.low)}, {pct(r.high)}]",
            lands(r.ours, r.span) if r.published else "",
            str(r.n),
            str(r.missing) if r.missing else "",
        )
    return table


def span_text(span: tuple[float, float, int] | None) -> str:
    """``33.1–44.8 (6)``: the lowest and highest published number and how many there are."""
    return "–" if span is None else f"{span[0]:g}–{span[1]:g} ({span[2]})"


def field_notes(rows: list[ComparisonRow]) -> list[str]:
    """Each published row the table's ``field`` column spans, once, beside the paper's: its numbers
    on the table's datasets, its kind, how it was measured and its source."""
    seen: dict[tuple[str, str], tuple[FieldRow, dict[str, float]]] = {}
    for r in rows:
        for f in r.published:
            seen.setdefault((f.system, f.model), (f, {}))[1][f"{r.dataset} {NAMES.get(r.metric, r.metric)}"] = f.value
    if not seen:
        return []
    out = ["field: the paper's number and these published rows (same dataset and metric family; settings differ):"]
    for f, values in seen.values():
        shown = ", ".join(f"{k} {v:g}" for k, v in sorted(values.items()))
        out.append(f"  {escape(f.system)}, {escape(f.model)}: {escape(shown)}; {escape(f.setting)}")
    return out


def replication_notes(rep: Replication) -> list[str]:
    """What to read beside the table (rich markup lines): the papers' sources, per dataset how
    its setting differs from the paper's, what was not run and why, and whether it was local."""

    out = [f"paper: {escape(s)}" for s in sorted({r.source for r in rep.rows if r.source})]
    out += field_notes(rep.rows)
    out += answerability_notes(rep)
    seen = set()
    for r in rep.rows:
        if r.dataset in seen:
            continue
        seen.add(r.dataset)
        if r.differences:
            out.append(
                f"[bold yellow]{escape(r.dataset)}: NOT the paper's setting:[/] {escape('; '.join(r.differences))}"
            )
        else:
            out.append(f"{escape(r.dataset)}: the paper's setting (model, retrieval, top-k, all questions)")
    out += [f"[yellow]{escape(label)}: not run[/]: {escape(why)}" for label, why in rep.skipped]
    note = judge_note(rep.profile, {r.metric for r in rep.rows})
    if note:
        out.append(escape(note))
    out.append(
        f"{CLOSED_BOOK}: the same model and prompt with no search turn (agent.max_turns=0, one final turn): "
        "what the model answers without retrieval"
    )
    if rep.local:
        out.append(
            "Local run (no --index): this checks the card's machinery, not the paper's number. A real "
            "replication needs the released checkpoint and the paper's index on a GPU."
        )
    return out


def answerability_notes(rep: Replication) -> list[str]:
    """Under the paper's numbers, per dataset: how many of its questions the searched corpus can
    answer at all and from its top-k (``harness index check``), and a note on every score above
    the in-corpus share: those answers cannot have come from the corpus, so the model answers
    from memory."""

    out = []
    for label in dict.fromkeys(r.dataset for r in rep.rows):
        a = rep.answerability.get(label)
        if a is None:
            out.append(f"{escape(label)}: answerability on this corpus unknown (harness index check)")
            continue
        out.append(f"{escape(label)}: {escape(answerability_line(a))}")
        for r in rep.rows:
            if r.dataset == label and beats_corpus(r.ours, a):
                out.append(
                    f"[bold yellow]{escape(label)} {escape(r.run)} {escape(NAMES.get(r.metric, r.metric))} "
                    f"{pct(r.ours)} is above the in-corpus share {pct(a['in_corpus'])}:[/] the model answers "
                    "from memory, not only from the corpus"
                )
    return out
