"""Before/after figures of an agent's run directories: format-valid fraction, searches per
question, EM (the SFT warm-up's effect on the demo).

    python scripts/perf/agent_behaviour.py RUN_DIR [RUN_DIR ...]

Format validity is the run dialect's own check (``Dialect.validate_format``) on each response
(:func:`benchmarks.demo_summary.behaviour`).
"""

from __future__ import annotations

import sys

from benchmarks.demo_summary import behaviour

if __name__ == "__main__":
    for path in sys.argv[1:]:
        f = behaviour(path)
        print(
            f"{path}: n={f['n']:.0f} format_valid={f['format_valid']:.3f} "
            f"searches/q={f['searches_per_q']:.2f} EM={f['em']:.3f}"
        )
