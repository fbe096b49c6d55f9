"""The HTML report in a real headless Chromium (Debian's ``chromium``, driven by Playwright's
Python package; no browser is ever downloaded): the table and charts render, sorting works, the
trajectory browser filters and opens an item, no console errors. A screenshot is saved to
``test-artifacts/report.png``.

Needs: ``apt-get install -y chromium`` and ``pip install playwright`` (never ``playwright install``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

FIX = Path(__file__).resolve().parents[1] / "fixtures"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (Debian package `chromium`); `make browser` installs it"
)


@contextmanager
def chromium_page(errors: list[str]) -> Iterator:
    """A page in the system's headless Chromium, 1400x1800; uncaught page errors go to ``errors``."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (PyPI) not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html")
    args = ["report", str(FIX / "runs" / "*"), "--out", str(out), "--baseline", "naive", "--reference"]
    result = CliRunner().invoke(app, [*args, "--format", "html"])
    assert result.exit_code == 0, result.output
    return out / "report.html"


@pytest.mark.slow
@needs_chromium
def test_report_renders_in_chromium(report_html):
    errors: list[str] = []
    with chromium_page(errors) as page:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        # Offline at view time: any request leaving the file is an error.
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
        page.goto(report_html.as_uri())
        _check_tables(page)
        _check_charts(page)
        _check_browser(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    assert errors == []


def _check_tables(page) -> None:
    rows = page.locator("#board tr.row")
    assert rows.count() == 2
    # research beats naive significantly on demo EM, F1 and cover-EM (acc is not significant)
    assert page.locator("#board td.best").count() > 0 and page.locator("#board .sig").count() == 3
    assert "4/6" in page.locator("#board").inner_text()  # the partial run says so
    # Sorting by demo EM, descending, puts research (80.0) first; clicking again flips it.
    page.locator('#board th[data-col="demo EM"]').click()
    assert rows.nth(0).locator("td").first.inner_text() == "research"
    page.locator('#board th[data-col="demo EM"]').click()
    assert rows.nth(0).locator("td").first.inner_text() == "naive"
    assert page.locator("#cost-table tr").count() == 3
    from benchmarks.replication_cards import reference_entries

    published = page.locator("#pub tr")  # a header, then one row per published entry (cards first)
    reference = Path(__file__).resolve().parents[2] / "configs" / "reference" / "published.yaml"
    assert published.count() == len(reference_entries(reference)) + 1
    assert "(published)" in published.nth(1).inner_text()


def _check_charts(page) -> None:
    assert page.locator("#bars svg").count() == 2  # one chart per dataset
    assert page.locator("#bars rect.bar").count() == 4 and page.locator("#bars line.errbar").count() == 4
    assert page.locator("#scatter circle.point").count() == 4
    page.locator("#cost").select_option("tokens")
    assert "generated tokens" in page.locator("#scatter").inner_text()
    page.locator("#metric").select_option("f1")
    assert "demo F1" in page.locator("#bars").inner_text()


def _check_browser(page) -> None:
    items = page.locator("#list .item")
    assert items.count() == 20
    page.locator("#f-wrong").check()
    n_wrong = items.count()
    assert 0 < n_wrong < 20
    page.locator("#f-finish").select_option("error")
    assert items.count() == 1
    page.locator("#f-finish").select_option("(all)")
    page.locator("#f-method").select_option("research")
    page.locator("#f-dataset").select_option("demo")
    assert items.count() == 1  # research misses only d5 on demo
    page.locator("#f-wrong").uncheck()
    page.locator("#list .item", has_text="Which river?").click()
    detail = page.locator("#detail")
    text = detail.inner_text()
    assert "gold: Lunne" in text and "prediction: Lunne" in text and "correct" in text
    assert detail.locator(".seg.search").count() == 2 and "search (turn 1)" in text
    # Retrieved text is shown as text: "<b>not bold</b>" and "</script>" never become markup.
    assert "<b>not bold</b>" in text and detail.locator(".doc b", has_text="not bold").count() == 0


LONG = "research+sft+rl / smollm2-135m-instruct / bm25"


@pytest.fixture(scope="module")
def crowded_html(tmp_path_factory) -> Path:
    """Two more methods scoring exactly as naive on demo (three points at one place), one with a
    long label, and a training run: what the demo's report looks like."""
    import json

    root = tmp_path_factory.mktemp("crowded")
    for name in ("naive-demo-test", "research-demo-test", "naive-bamboogle-test"):
        shutil.copytree(FIX / "runs" / name, root / "runs" / name)
    for name, method in (("long-demo-test", LONG), ("standard-demo-test", "standard")):
        shutil.copytree(FIX / "runs" / "naive-demo-test", root / "runs" / name)
        manifest = json.loads((root / "runs" / name / "manifest.json").read_text())
        (root / "runs" / name / "manifest.json").write_text(json.dumps({**manifest, "method": method}))
    rl = root / "runs" / "rl"
    rl.mkdir()
    rows = [{"step": s, "reward/mean": 0.1 * s, "kl": 0.01 * s, "searches": 1.0} for s in range(1, 6)]
    (rl / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = root / "report"
    result = CliRunner().invoke(app, ["report", str(root / "runs" / "*"), "--out", str(out), "--format", "html"])
    assert result.exit_code == 0, result.output
    return out / "report.html"


def _boxes(page, selector: str) -> list[dict]:
    return page.eval_on_selector_all(
        selector,
        """els => els.map(e => { const b = e.getBoundingClientRect(), s = e.ownerSVGElement.getBoundingClientRect();
            return {text: [...e.querySelectorAll('tspan')].map(t => t.textContent).join('') || e.textContent,
                    x0: b.left, x1: b.right, y0: b.top, y1: b.bottom,
                    sx0: s.left, sx1: s.right, sy0: s.top, sy1: s.bottom,
                    chart: [...document.querySelectorAll('svg')].indexOf(e.ownerSVGElement),
                    method: e.dataset ? e.dataset.method : null}; })""",
    )


def _overlap(a: dict, b: dict) -> bool:
    return a["x0"] < b["x1"] - 0.5 and b["x0"] < a["x1"] - 0.5 and a["y0"] < b["y1"] - 0.5 and b["y0"] < a["y1"] - 0.5


def _inside(a: dict) -> bool:
    return (
        a["x0"] >= a["sx0"] - 0.5
        and a["x1"] <= a["sx1"] + 0.5
        and a["y0"] >= a["sy0"] - 0.5
        and a["y1"] <= a["sy1"] + 0.5
    )


@pytest.mark.slow
@needs_chromium
def test_charts_label_methods_and_nothing_hides_or_is_cut(crowded_html):
    errors: list[str] = []
    with chromium_page(errors) as page:
        page.goto(crowded_html.as_uri())
        methods = {"naive", "research", "standard", LONG}
        # Scatter: one chart per dataset, every point labelled with its method (not the dataset).
        labels = _boxes(page, "#scatter text.point-label")
        assert {x["text"] for x in labels} == methods
        points = _boxes(page, "#scatter circle.point")
        assert len(points) == 5 and {x["method"] for x in points} == methods
        for chart in {x["chart"] for x in points}:
            mine = [x for x in points if x["chart"] == chart]
            for i, a in enumerate(mine):  # markers at one place are spread: each shows
                for b in mine[i + 1 :]:
                    centre = abs((a["x0"] + a["x1"]) - (b["x0"] + b["x1"])) / 2
                    centre = max(centre, abs((a["y0"] + a["y1"]) - (b["y0"] + b["y1"])) / 2)
                    assert centre >= 6, (a["method"], b["method"])
            texts = [x for x in labels if x["chart"] == chart]
            for i, a in enumerate(texts):
                assert _inside(a), a["text"]
                assert not any(_overlap(a, b) for b in texts[i + 1 :]), a["text"]
                assert not any(_overlap(a, m) for m in mine), a["text"]  # no label on a marker
        # Bars: full labels (wrapped, never cut), inside the chart, not overlapping.
        bars = _boxes(page, "#bars text.bar-label")
        assert sorted(x["text"].replace(" ", "") for x in bars) == sorted(
            m.replace(" ", "") for m in ["naive", "naive", "research", "standard", LONG]
        )
        for i, a in enumerate(bars):
            assert _inside(a), a["text"]
            assert not any(_overlap(a, b) for b in bars[i + 1 :] if b["chart"] == a["chart"]), a["text"]
        # Training curves: a chart per logged quantity, the run's line in each.
        charts = page.locator("#curves svg")
        assert charts.count() == 3 and page.locator("#training").is_visible()
        assert page.locator('#curves path.curve[data-run="rl"]').count() == 3
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "report-crowded.png"), full_page=True)
    assert errors == []
