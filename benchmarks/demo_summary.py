"""The demo's before/after text: the same agent untrained, after the SFT warm-up, and after RL,
on the same questions (``harness demo`` writes it as ``demo.md``).

Per run: EM and F1 with their 95% bootstrap intervals (:func:`benchmarks.stats.bootstrap_ci`),
the fraction of format-valid responses and searches per question (:func:`behaviour`, which
``scripts/perf/agent_behaviour.py`` prints for any run directories); then, for each stage
against the one before it, the paired bootstrap on the shared items
(:func:`benchmarks.stats.paired_bootstrap`) with a plain verdict that says when the later stage
does not beat the earlier one, overall and per question template (:func:`question_template`).
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.datasets import load_examples
from benchmarks.fmt import p_value, pct
from benchmarks.metrics import normalize_answer
from benchmarks.report import RunSummary, load_run
from benchmarks.stats import bootstrap_ci, paired_bootstrap
from harness.runlog import RunDir
from pipelines.dialects import resolve_dialect

METRICS = ("em", "f1")

# The demo's question templates (benchmarks/demo_data/build_demo.py: v1's five, and v2's two
# year templates), by their wording.
TEMPLATES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("inventor's town", re.compile(r"^In which town was the inventor of ")),
    ("river of a town", re.compile(r"^On which river lies ")),
    ("company founder", re.compile(r"^Who founded the company ")),
    ("inventor's birth year", re.compile(r"^In which year was the inventor of ")),
    ("company's founding year", re.compile(r"^In which year was the company ")),
    ("born earlier", re.compile(r"^Who was born earlier, ")),
    ("same province", re.compile(r"^Are \S+ and \S+ in the same province")),
)


def question_template(question: str) -> str:
    """The demo template a question was written from (``other`` for any other question)."""
    return next((name for name, pattern in TEMPLATES if pattern.search(question)), "other")


def behaviour(run_dir: str | Path) -> dict[str, float]:
    """What an agent's run did: items, the fraction of format-valid responses (the run dialect's
    own check, ``Dialect.validate_format``), searches per question, and EM."""
    run = RunDir(run_dir)
    trajs = run.trajectories()
    scores = {s.key: s for s in run.scores()}
    n = max(1, len(trajs))
    valid = 0
    for t in trajs:
        d = resolve_dialect(t.metadata.get("dialect", "research"))
        valid += bool(d.validate_format(t.response_text)[0])
    em = [
        scores[(t.example_id, t.sample_index)].metric("em") or 0.0
        for t in trajs
        if (t.example_id, t.sample_index) in scores
    ]
    return {
        "n": float(len(trajs)),
        "format_valid": valid / n,
        "searches_per_q": sum(len(t.searches) for t in trajs) / n,
        "em": sum(em) / max(1, len(em)),
    }


def _templates(run: RunSummary) -> dict[str, str]:
    """Example id → template, from the run's own trajectories."""
    return {t.example_id: question_template(t.question) for t in RunDir(run.path).trajectories()}


_OPTIONS = re.compile(r",\s*(?P<first>[^,?]+?)\s+or\s+(?P<second>[^,?]+?)\s*\?\s*$")
_YES_NO = ("yes", "no")


def answer_choice(question: str, golds: list[str], prediction: str) -> str | None:
    """Which option an answer to a choice question names: ``yes``/``no`` for a question whose gold
    is yes or no, ``1st``/``2nd`` for "..., X or Y?" (the entity named first or second), ``other``
    for anything else; None for a question that offers no choice. Compared after the metric's
    normalisation, so "the Mirren." names "Mirren"."""
    pred = normalize_answer(prediction)
    if golds and all(normalize_answer(g) in _YES_NO for g in golds):
        return pred if pred in _YES_NO else "other"
    m = _OPTIONS.search(question)
    if not m:
        return None
    first, second = normalize_answer(m["first"]), normalize_answer(m["second"])
    return "1st" if pred == first else "2nd" if pred == second else "other"


def _choices(run: RunSummary, of_gold: bool = False) -> dict[str, dict[str, int]]:
    """Per template, how often the run's answers (or, ``of_gold``, the first gold answers of its
    questions) name each option (see :func:`answer_choice`)."""
    out: dict[str, dict[str, int]] = {}
    for t in RunDir(run.path).trajectories():
        answer = (t.answers[0] if t.answers else "") if of_gold else t.prediction
        choice = answer_choice(t.question, list(t.answers), answer)
        if choice is not None:
            counts = out.setdefault(question_template(t.question), {})
            counts[choice] = counts.get(choice, 0) + 1
    return out


def _choice_table(runs: list[RunSummary]) -> list[str]:
    """Per choice template and run, the answers naming each option next to the gold's share, so a
    policy that drifts to one position (or to always "no") is visible beside its accuracy."""
    per_run = [_choices(r) for r in runs]
    gold = _choices(runs[0], of_gold=True)
    names = [n for n in [*(n for n, _ in TEMPLATES), "other"] if any(n in c for c in per_run)]
    if not names:
        return []
    lines = [
        "Answers to the choice templates, by the option they name (yes/no, or the entity named 1st/2nd in "
        "the question; `other`: neither):",
        "",
        f"| template | gold | {' | '.join(r.method for r in runs)} |",
        "|---|---|" + "---|" * len(runs),
    ]
    for name in names:
        cells = [_counts(c.get(name, {})) for c in per_run]
        lines.append(f"| {name} | {_counts(gold.get(name, {}))} | {' | '.join(cells)} |")
    return lines


def _counts(counts: dict[str, int]) -> str:
    order = ["yes", "no", "1st", "2nd", "other"]
    return ", ".join(f"{k} {counts[k]}" for k in order if counts.get(k)) or "–"


def _paired_lines(later: RunSummary, earlier: RunSummary) -> list[str]:
    """The paired bootstrap of ``later`` minus ``earlier`` (EM, F1) and a plain verdict on EM."""
    lines = [f"Paired bootstrap, {later.method} minus {earlier.method}, on the items both answered:", ""]
    em = None
    for m in METRICS:
        mine, theirs = later.item_values(m), earlier.item_values(m)
        shared = sorted(set(mine) & set(theirs))
        d = paired_bootstrap([mine[k] for k in shared], [theirs[k] for k in shared])
        lines.append(
            f"- {m.upper()}: {pct(d.diff, signed=True)} points [{pct(d.low)}, {pct(d.high)}], {p_value(d.p)}, n={d.n}"
            + (" (significant)" if d.significant else "")
        )
        em = d if m == "em" else em
    p = p_value(em.p)
    lines.append(
        f"- One-sided, {later.method} higher than {earlier.method} on EM: {p_value(em.p_greater)} "
        f"({'below' if em.p_greater < 0.05 else 'not below'} 0.05)"
    )
    lines.append("")
    if em.significant and em.diff > 0:
        lines.append(f"{later.method} beats {earlier.method} on EM (95% interval above 0, {p}).")
    elif em.diff > 0:
        lines.append(
            f"{later.method} scores higher on EM than {earlier.method}, but the paired 95% interval includes 0 "
            f"({p}): not a significant gain on these items."
        )
    else:
        lines.append(f"{later.method} does NOT beat {earlier.method} on EM on these items.")
    return lines


def _template_table(later: RunSummary, earlier: RunSummary) -> list[str]:
    """EM per template of two runs, with the paired difference and its p per template."""
    kinds = _templates(later)
    mine, theirs = later.item_values("em"), earlier.item_values("em")
    lines = [
        f"Per question template (EM), {later.method} against {earlier.method}:",
        "",
        f"| template | n | {earlier.method} | {later.method} | difference | p (two-sided) |",
        "|---|---|---|---|---|---|",
    ]
    for name in [n for n, _ in TEMPLATES] + ["other"]:
        ids = sorted(k for k in set(mine) & set(theirs) if kinds.get(k) == name)
        if not ids:
            continue
        d = paired_bootstrap([mine[k] for k in ids], [theirs[k] for k in ids])
        right_a, right_b = sum(theirs[k] for k in ids), sum(mine[k] for k in ids)
        p = p_value(d.p, bare=True)
        lines.append(
            f"| {name} | {len(ids)} | {right_a:g}/{len(ids)} | {right_b:g}/{len(ids)} | "
            f"{pct(d.diff, signed=True)} | {p} |"
        )
    return lines


def supporting_recall(run_dir: str | Path, supporting: dict[str, list[str]]) -> float | None:
    """Mean over a run's items of the share of the question's supporting passages
    (``metadata.supporting_doc_ids`` of the demo questions) that any of its searches retrieved:
    recall@k of the passages a retriever must find, k the searches' top-k. None when no item of the
    run has supporting passages."""
    shares = []
    for t in RunDir(run_dir).trajectories():
        gold = set(supporting.get(t.example_id, ()))
        if gold:
            found = {d for s in t.searches for d in s.doc_ids}
            shares.append(len(gold & found) / len(gold))
    return sum(shares) / len(shares) if shares else None


def supporting_passages(run: RunSummary) -> dict[str, list[str]]:
    """Example id → supporting passage ids of the run's dataset split ({} when it has none or is
    not a registered dataset)."""
    try:
        examples = load_examples(run.dataset, run.split)
    except (KeyError, ValueError, FileNotFoundError, OSError):
        return {}
    return {e.id: list(e.metadata.get("supporting_doc_ids", [])) for e in examples}


def summarize(
    *stages: str | Path,
    curves: list[tuple[str, str]] | None = None,
    note: str | None = None,
    against: list[int | None] | None = None,
) -> str:
    """Markdown comparing run directories of one agent on the same split, in training order
    (untrained, then each trained stage): one row each, then every stage paired against the one
    before it (or, with ``against``, against ``stages[against[i]]``: several seeds' trained agents
    each against the model they started from), overall and per question template. ``curves``:
    (title, relative path) of training curve images to link; ``note``: a paragraph under the title
    (what was run on what). Where the questions name their supporting passages, each row also gives
    the share of them the searches retrieved."""
    if len(stages) < 2:
        raise ValueError("summarize needs at least two runs (before and after)")
    against = against if against is not None else [None, *range(len(stages) - 1)]
    if len(against) != len(stages) or any(a is not None and not 0 <= a < i for i, a in enumerate(against)):
        raise ValueError(f"against must name an earlier stage for each stage, not {against}")
    runs = [load_run(Path(s)) for s in stages]
    first = runs[0]
    supporting = supporting_passages(first)
    recall = {r.path: supporting_recall(r.path, supporting) for r in runs} if supporting else {}
    names = " → ".join(r.method for r in runs)
    head = "| run | model | n | EM (95% CI) | F1 (95% CI) | format-valid | searches/q |"
    rule = "|---|---|---|---|---|---|---|"
    if recall:
        head, rule = head + " supporting passages retrieved |", rule + "---|"
    lines = [f"# Demo: {names} ({first.dataset} {first.split})", "", *([note, ""] if note else []), head, rule]
    for r in runs:
        cis = {m: bootstrap_ci(list(r.item_values(m).values())) for m in METRICS}
        f = behaviour(r.path)
        cells = [f"{pct(c.mean)} [{pct(c.low)}, {pct(c.high)}]" for c in cis.values()]
        row = (
            f"| {r.method} | {r.model} | {r.n} | {' | '.join(cells)} | {pct(f['format_valid'])} | "
            f"{f['searches_per_q']:.2f} |"
        )
        if recall:
            row += f" {pct(recall[r.path]) if recall[r.path] is not None else '–'} |"
        lines.append(row)
    for i, later in enumerate(runs):
        if against[i] is None:
            continue
        earlier = runs[against[i]]
        paired = _paired_lines(later, earlier)
        lines += ["", f"## {later.method} against {earlier.method}", "", *paired, "", *_template_table(later, earlier)]
    choices = _choice_table(runs[1:])
    if choices:
        lines += ["", "## Position and yes/no drift", "", *choices]
    if curves:
        lines += ["", "## Training curves", ""]
        lines += [f"- [{title}]({path})" for title, path in curves]
    return "\n".join(lines) + "\n"
