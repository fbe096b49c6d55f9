"""The demo's before/after text: the untrained agent against the same agent after the SFT
warm-up, on the same questions (``harness demo`` writes it as ``demo.md``).

Per run: EM and F1 with their 95% bootstrap intervals (:func:`benchmarks.stats.bootstrap_ci`),
the fraction of format-valid responses and searches per question (:func:`behaviour`, which
``benchmarks/perf/agent_behaviour.py`` prints for any run directories); then the paired
bootstrap of trained minus untrained on the shared items (:func:`benchmarks.stats.paired_bootstrap`)
and a plain verdict that says when the trained agent does not beat the untrained one.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.fmt import p_value, pct
from benchmarks.report import load_run
from benchmarks.stats import bootstrap_ci, paired_bootstrap
from harness.runlog import RunDir
from pipelines.dialects import resolve_dialect

METRICS = ("em", "f1")


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


def summarize(untrained: str | Path, trained: str | Path) -> str:
    """Markdown comparing two run directories of one method on the same split."""
    runs = {"untrained": load_run(Path(untrained)), "trained": load_run(Path(trained))}
    a, b = runs["untrained"], runs["trained"]
    lines = [
        f"# Demo: {a.method} before and after the SFT warm-up ({a.dataset} {a.split}, n={a.n})",
        "",
        "| run | model | EM (95% CI) | F1 (95% CI) | format-valid | searches/q |",
        "|---|---|---|---|---|---|",
    ]
    for r in (a, b):
        cis = {m: bootstrap_ci(list(r.item_values(m).values())) for m in METRICS}
        f = behaviour(r.path)
        cells = [f"{pct(c.mean)} [{pct(c.low)}, {pct(c.high)}]" for c in cis.values()]
        lines.append(
            f"| {r.method} | {r.model} | {' | '.join(cells)} | {pct(f['format_valid'])} | {f['searches_per_q']:.2f} |"
        )
    lines += ["", f"Paired bootstrap, {b.method} minus {a.method}, on the items both answered:", ""]
    verdict = []
    for m in METRICS:
        mine, theirs = b.item_values(m), a.item_values(m)
        shared = sorted(set(mine) & set(theirs))
        d = paired_bootstrap([mine[k] for k in shared], [theirs[k] for k in shared])
        lines.append(
            f"- {m.upper()}: {pct(d.diff, signed=True)} points "
            f"[{pct(d.low)}, {pct(d.high)}], {p_value(d.p)}, n={d.n}" + (" (significant)" if d.significant else "")
        )
        verdict.append((m, d))
    em = verdict[0][1]
    lines.append("")
    if em.significant and em.diff > 0:
        lines.append(f"The trained agent beats the untrained one on EM (95% interval above 0, {p_value(em.p)}).")
    elif em.diff > 0:
        lines.append(
            f"The trained agent scores higher on EM, but the paired 95% interval includes 0 ({p_value(em.p)}): "
            "not a significant gain on these items."
        )
    else:
        lines.append("The trained agent does NOT beat the untrained one on EM on these items.")
    return "\n".join(lines) + "\n"
