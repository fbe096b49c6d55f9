"""Progress shows when nobody watches a terminal (issue 23 defect 7): with stderr piped (a log
file, a stage of a chain) ``harness eval`` printed nothing until the end; now a plain line every
tenth of the items (or 30 s), and one at the end."""

from __future__ import annotations

from pathlib import Path

from benchmarks.eval_runs import Progress
from harness.run_records import ItemScore


def score(i: int, em: float, error: str | None = None) -> ItemScore:
    return ItemScore(
        id=f"q{i}", sample_index=0, metrics={"em": em}, error=error, error_kind="retrieval" if error else None
    )


def test_plain_progress_lines_when_stderr_is_not_a_terminal(tmp_path: Path):
    lines: list[str] = []
    with Progress(25, tmp_path / "run", "search_r1 on demo", "em", say=lines.append) as progress:
        assert progress._progress is None  # under pytest stderr is captured: not a terminal
        for i in range(25):
            progress.add(score(i, 1.0 if i % 2 == 0 else 0.0, "RetrievalError: down" if i == 24 else None))
    assert len(lines) == 9  # every 2.5 items: at 3, 6, ..., 24 (eight lines), then one at the end
    assert lines[0].startswith("search_r1 on demo  EM ") and "3/25 items" in lines[0]
    assert "25/25 items, 1 failed" in lines[-1] and "EM 0.500" in lines[-1]  # the failed item is not scored
