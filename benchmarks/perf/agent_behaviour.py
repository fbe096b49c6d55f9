"""Before/after figures of an agent's run directories: format-valid fraction, searches per
question, EM (the SFT warm-up's effect on the demo).

    python benchmarks/perf/agent_behaviour.py RUN_DIR [RUN_DIR ...]

Format validity is the run dialect's own check (``Dialect.validate_format``) on each response.
"""

from __future__ import annotations

import sys

from harness.runlog import RunDir
from pipelines.dialects import resolve_dialect


def figures(run_dir: str) -> dict[str, float]:
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


if __name__ == "__main__":
    for path in sys.argv[1:]:
        f = figures(path)
        print(
            f"{path}: n={f['n']:.0f} format_valid={f['format_valid']:.3f} "
            f"searches/q={f['searches_per_q']:.2f} EM={f['em']:.3f}"
        )
