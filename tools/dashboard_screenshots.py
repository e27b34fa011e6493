"""Screenshots of every dashboard page for docs/dashboard.md, from the code as it is.

    python tools/dashboard_screenshots.py [--out docs/img] [--traces traces] [--pages myjob,drift]

Starts `streamlit run dashboard/app.py` headless on the shipped traces, opens each page
in headless Chromium (the system's; playwright without `playwright install`), waits until
the page has finished running, and saves the top of the page as docs/img/page-NAME.png
(a 1280 x 900 viewport: small PNGs).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dashboard import headless  # noqa: E402

PAGES = {"myjob": "", "drift": "drift", "whatif": "whatif", "failures": "failures",
         "verdict": "verdict", "scale": "scale", "fidelity": "fidelity", "traces": "traces"}
"""File name part -> the page's URL path (the default page, My job, is the root)."""
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _settled(page) -> None:
    """Wait until the app's run is over: no running indicator for a second, a chart drawn
    where the page has one."""
    page.wait_for_timeout(1500)
    page.wait_for_function("""() => { const busy = document.querySelector('[data-testid="stStatusWidget"]');
        if (busy) { window.__idle = 0; return false; }
        window.__idle = (window.__idle || 0) + 1; return window.__idle > 10 }""", polling=100,
        timeout=900_000)
    page.wait_for_timeout(1000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="docs/img")
    p.add_argument("--traces", default="traces")
    p.add_argument("--pages", default=",".join(PAGES), help="comma list of " + ", ".join(PAGES))
    args = p.parse_args()
    from playwright.sync_api import sync_playwright
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERCHECK_TRACES": str(Path(args.traces).resolve())}
    with headless.serve(env=env, timeout_s=120) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for name in args.pages.split(","):
            start = time.perf_counter()
            page.goto(f"{url}/{PAGES[name]}")
            _settled(page)
            target = out / f"page-{name}.png"
            page.screenshot(path=str(target))
            print(f"{target}: {target.stat().st_size / 1e3:.0f} kB, "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
        browser.close()


if __name__ == "__main__":
    main()
