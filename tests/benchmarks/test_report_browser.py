"""The HTML report in a real headless Chromium (Debian's ``chromium``, driven by Playwright's
Python package; no browser is ever downloaded): the table and charts render, sorting works, the
trajectory browser filters and opens an item, no console errors. A screenshot is saved to
``test-artifacts/report.png``.

Needs: ``apt-get install -y chromium`` and ``pip install playwright`` (never ``playwright install``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli.main import app

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


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html")
    args = ["report", str(FIX / "runs" / "*"), "--out", str(out), "--baseline", "naive", "--reference"]
    result = CliRunner().invoke(app, [*args, "--format", "html"])
    assert result.exit_code == 0, result.output
    return out / "report.html"


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (Debian package `chromium`); `make browser` installs it"
)
def test_report_renders_in_chromium(report_html):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (PyPI) not installed")
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            # Offline at view time: any request leaving the file is an error.
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
            page.goto(report_html.as_uri())
            _check_tables(page)
            _check_charts(page)
            _check_browser(page)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            browser.close()
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
    from benchmarks.replicate import reference_entries

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
