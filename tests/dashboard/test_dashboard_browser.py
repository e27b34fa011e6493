"""A real Chromium against the running dashboard (pytest -m browser).

Needs: apt-get install -y chromium; pip install -c constraints.txt playwright
(no `playwright install`: the system Chromium is used). Saves a screenshot in
the test's temporary folder, or to $DASHBOARD_SCREENSHOT (the README's picture
is made by tools/dashboard_screenshots.py; the frontier picture of docs/dashboard.md with
DASHBOARD_BROWSER_TRACES=traces DASHBOARD_FRONTIER_SCREENSHOT=docs/img/frontier.png).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dashboard import headless

pytestmark = pytest.mark.browser
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def server(traces_dir):
    env = {**os.environ, "LAYERCHECK_TRACES": os.environ.get("DASHBOARD_BROWSER_TRACES", str(traces_dir))}
    try:
        with headless.serve(env=env, timeout_s=120) as url:
            yield url
    except headless.ServerError as exc:
        pytest.fail(str(exc))


def test_slider_changes_the_numbers_and_screenshot(server, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        page = _open(p, server, "whatif")
        page.wait_for_selector(".js-plotly-plot", timeout=60_000)
        metric = page.locator('[data-testid="stMetric"]', has_text="Layer writes").first
        before = metric.locator('[data-testid="stMetricValue"]').inner_text()
        slider = page.get_by_role("slider").first          # the base threshold
        slider.focus()
        for _ in range(3):
            slider.press("ArrowLeft")                     # lower K: more writes
        page.wait_for_function(
            "([sel, old]) => { const e = document.querySelector(sel); return e && e.innerText !== old }",
            arg=['[data-testid="stMetric"] [data-testid="stMetricValue"]', before], timeout=30_000)
        after = metric.locator('[data-testid="stMetricValue"]').inner_text()
        assert int(after.replace(",", "")) > int(before.replace(",", ""))
        page.wait_for_selector(".js-plotly-plot", timeout=60_000)
        page.wait_for_timeout(1500)
        out = Path(os.environ.get("DASHBOARD_SCREENSHOT", tmp_path / "dashboard.png"))
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=False)
        page.context.browser.close()
    assert out.stat().st_size > 10_000


def _chromium(playwright):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    return playwright.chromium.launch(executable_path=chromium, args=ARGS)


def _open(playwright, server: str, path: str, *, height: int = 1100):
    """A fresh headless Chromium on the dashboard's page ``path`` (its first content loaded)."""
    page = _chromium(playwright).new_page(viewport={"width": 1500, "height": height})
    page.goto(f"{server}/{path}", wait_until="networkidle")
    return page


def _text(page, selector: str) -> str:
    return page.locator(selector).first.inner_text()


def test_budget_moves_the_recommendation_and_a_click_applies_a_point(server, tmp_path):
    """The What-if page's lower half in a real browser: a budget typed into the form
    changes the recommended config; clicking a point of the frontier puts it on the
    sliders. Saves the frontier's picture ($DASHBOARD_FRONTIER_SCREENSHOT: the docs')."""
    playwright = pytest.importorskip("playwright.sync_api")
    code = '[data-testid="stCode"]'
    with playwright.sync_playwright() as p:
        page = _open(p, server, "whatif", height=1300)
        page.wait_for_selector(code, timeout=120_000)
        before = _text(page, code)
        assert before.startswith("LayerCheckConfig(")
        shown = page.locator('[data-testid="stMetric"]', has_text="Recommended writes").first.locator(
            '[data-testid="stMetricValue"]').inner_text()          # e.g. "76.3 MB"
        value, unit = shown.split()
        gb = float(value.replace(",", "")) * {"B": 1e-9, "kB": 1e-6, "MB": 1e-3, "GB": 1, "TB": 1e3, "PB": 1e6}[unit]
        page.get_by_label("Max GB written over the run (0: none)").fill(f"{gb / 3:.6g}")
        page.get_by_role("button", name="Recommend", exact=True).click()
        page.wait_for_function(
            "([sel, old]) => { const e = document.querySelector(sel); return e && e.innerText !== old }",
            arg=[code, before], timeout=120_000)
        assert _text(page, code) != before
        chart = page.locator('[data-testid="stPlotlyChart"]').filter(
            has_text="Every setting").first
        chart.scroll_into_view_if_needed()
        page.wait_for_timeout(1500)
        out = Path(os.environ.get("DASHBOARD_FRONTIER_SCREENSHOT", tmp_path / "frontier.png"))
        out.parent.mkdir(parents=True, exist_ok=True)
        chart.screenshot(path=str(out))
        assert out.stat().st_size > 10_000
        writes = page.locator('[data-testid="stMetric"]', has_text="Layer writes").first
        old = writes.locator('[data-testid="stMetricValue"]').inner_text()
        points = chart.locator(".scatterlayer .trace").nth(1).locator(".points path")
        points.last.click(force=True)                     # the freshest point on the front
        page.wait_for_function(
            "([sel, old]) => { const e = document.querySelector(sel); return e && e.innerText !== old }",
            arg=['[data-testid="stMetric"] [data-testid="stMetricValue"]', old], timeout=60_000)
        assert int(writes.locator('[data-testid="stMetricValue"]').inner_text().replace(",", "")) \
            > int(old.replace(",", ""))
        page.context.browser.close()


def _slider_values(page) -> list[str]:
    sliders = page.locator('[data-testid="stSidebar"]').get_by_role("slider")
    return [sliders.nth(i).get_attribute("aria-valuetext") or sliders.nth(i).get_attribute("aria-valuenow")
            for i in range(sliders.count())]


def _settled(page) -> None:
    """Wait until the app has finished its reruns (no running indicator for a second)."""
    page.wait_for_timeout(700)
    page.wait_for_function("""() => { const busy = document.querySelector('[data-testid="stStatusWidget"]');
        if (busy) { window.__idle = 0; return false; }
        window.__idle = (window.__idle || 0) + 1; return window.__idle > 10 }""", polling=100,
        timeout=120_000)


def _go(page, title: str) -> None:
    """Another page through the sidebar's navigation (the same session, as a user does)."""
    page.locator('[data-testid="stSidebarNav"] a', has_text=title).first.click()
    page.wait_for_function("t => [...document.querySelectorAll('h1')].some(h => h.innerText.includes(t))",
                           arg=title, timeout=60_000)


def _config_shown(values: list[str]) -> str:
    """The part of What-if's "As a config to paste" line that the sliders ``values`` give."""
    k_base, k_emb, smax, warmup, interval = values
    num = lambda v: 'float("inf")' if v == "inf" else f"{float(v):.3g}"  # noqa: E731
    return (f"base_threshold={num(k_base)}, embedding_threshold={num(k_emb)}, smax={smax}, "
            f"warmup_steps={warmup}, interval={interval}")


def _applied(page, values: list[str]) -> None:
    """Wait until the server has run What-if with the sliders at ``values`` (its sidebar's
    config line says them). A value the browser shows is not yet one the server has:
    under load Streamlit drops a rerun asked for before it started when the next one
    comes, and a page switch carries only the new page's widgets, so a test that leaves
    the page before this point loses what it set, as a user would."""
    page.wait_for_function("t => [...document.querySelectorAll('[data-testid=\"stSidebar\"] code')]"
                           ".some(c => c.innerText.includes(t))", arg=_config_shown(values),
                           polling=100, timeout=120_000)
    _settled(page)


def _round_trip(page, title: str, *, via: str = "Drift") -> None:
    """To ``via`` and back to ``title`` through the sidebar, as a user goes; wait until
    the page is drawn again and has finished its run."""
    _go(page, via)
    _go(page, title)
    page.wait_for_selector(".js-plotly-plot", timeout=120_000)
    _settled(page)


def test_whatif_keeps_its_settings_across_a_visit_to_another_page(server):
    """Sliders moved on What-if, a visit to Drift, back: every slider and the numbers they
    give are as the user left them (Streamlit forgets the state of widgets it does not draw)."""
    playwright = pytest.importorskip("playwright.sync_api")
    value = '[data-testid="stMetric"] [data-testid="stMetricValue"]'
    with playwright.sync_playwright() as p:
        page = _open(p, server, "whatif")
        page.wait_for_selector(".js-plotly-plot", timeout=60_000)
        opened = _slider_values(page)
        _applied(page, opened)
        sliders = page.locator('[data-testid="stSidebar"]').get_by_role("slider")
        for index, key, presses in ((0, "ArrowLeft", 2), (2, "ArrowLeft", 30), (4, "ArrowRight", 3)):
            sliders.nth(index).focus()
            for _ in range(presses):
                sliders.nth(index).press(key)
            _applied(page, _slider_values(page))
        moved, writes = _slider_values(page), _text(page, value)
        assert moved != opened
        _round_trip(page, "What-if tuning")
        assert _slider_values(page) == moved
        _applied(page, moved)
        assert _text(page, value) == writes
        page.context.browser.close()


def test_tables_read_in_words_and_units_in_the_browser(server):
    """What a user sees in a table (the grid's cells, not the frame behind them): headers
    in words with units, sizes converted to them. (The grid's accessible cells carry the
    value, not the drawn text: thousands separators are checked on dashboard.tables.)"""
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        page = _open(p, server, "traces")
        grid = '[data-testid="stDataFrame"]'
        page.wait_for_selector(grid, timeout=60_000)
        _settled(page)
        # the grid draws on a canvas; its accessible cells hold the values it draws
        shown = page.locator(f'{grid} [role="gridcell"]').all_text_contents()
        headers = page.locator(f'{grid} [role="columnheader"]').all_text_contents()
        page.context.browser.close()
    assert "parameters" in headers and "size (kB)" in headers, headers
    assert not [h for h in headers if "_" in h], headers
    assert "5000" in shown                       # the embedding's parameters
    assert "70000" not in shown and "70" in shown   # its 70,000 bytes as 70 kB


def test_failures_keeps_its_mtbf_across_a_visit_to_another_page(server):
    """A sidebar setting with a default (Failures' MTBF) is kept too, not put back to it."""
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        page = _open(p, server, "failures")
        page.wait_for_selector(".js-plotly-plot", timeout=120_000)
        _settled(page)
        mtbf = page.locator('[data-testid="stSidebar"]').get_by_role("slider").first
        opened = mtbf.get_attribute("aria-valuetext") or mtbf.get_attribute("aria-valuenow")
        failures = page.locator('[data-testid="stMetric"]', has_text="Failures per window").first
        before = failures.locator('[data-testid="stMetricValue"]').inner_text()
        mtbf.focus()
        mtbf.press("ArrowRight")
        # the server has run with the new MTBF once its failure count moves (see _applied)
        page.wait_for_function("""old => [...document.querySelectorAll('[data-testid="stMetric"]')]
            .some(m => m.innerText.includes('Failures per window') && !m.innerText.includes(old))""",
                               arg=f"\n{before}", polling=100, timeout=120_000)
        _settled(page)
        moved = mtbf.get_attribute("aria-valuetext") or mtbf.get_attribute("aria-valuenow")
        assert moved != opened
        _round_trip(page, "Failures")
        assert _slider_values(page)[0] == moved
        page.context.browser.close()
