"""The eval results table never cuts a number (issue 23 defect 7: on an 80-column terminal the
numbers read "2…", "100…", in ``make demo`` too): names wrap, and number columns that do not fit
together move to a further table."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rich.console import Console

from benchmarks.results_table import print_results


def result(method, dataset, metrics, **kw):
    base = dict(n=98, n_total=100, missing={}, mean_searches=2.345, mean_generated_tokens=1234.0)
    return SimpleNamespace(
        method=method, dataset=dataset, metrics=metrics, **{**base, "latency_p50_s": 123.45, "errors": 2, **kw}
    )


RESULTS = [
    result(
        "research+sft-with-a-long-label",
        "hotpotqa",
        {"em": 0.25, "f1": 1 / 3, "acc": 1.0, "cover_em": 0.5, "judge": 0.44, "em_last_answer": 1.0},
        missing={"judge": 12},
    ),
    result("naive", "demo", {"em": 1.0, "f1": 1.0}, n=12, n_total=12, mean_searches=None, latency_p50_s=0.01, errors=0),
]


@pytest.mark.parametrize("width", [60, 80, 120])
def test_no_number_is_cut_at_any_width(width):
    console = Console(width=width, record=True, force_terminal=True, color_system=None)
    print_results(RESULTS, "research", console=console)
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    for cell in (
        "98/100",
        "12/12",
        "25.0",
        "33.3",
        "100.0",
        "50.0",
        "44.0 (12 missing)",
        "2.35",
        "1234",
        "123.45",
        "0.01",
    ):
        assert cell in text, (cell, text)
    assert "research+sft" in text  # the long name wraps, it is not dropped


def test_a_wide_terminal_gets_one_table():
    console = Console(width=200, record=True, force_terminal=True, color_system=None)
    print_results(RESULTS, console=console)
    assert console.export_text().count("harness eval") == 1
