"""Cold start of the dashboard: from `streamlit run` to the first chart visible in Chromium.

    python benchmarks/dashboard_coldstart.py [--repeat 5] [--page ""] [--page drift]

Each repeat starts a fresh server (nothing cached in memory: a cold server) and a fresh
headless Chromium, opens the page, and times until the first Plotly chart is drawn
(``.js-plotly-plot`` visible) and, for the dashboard, until the page has finished its
run. The reference, in the same run and interleaved with it, is a bare Streamlit page
that draws one Plotly chart: what Streamlit, Plotly and the browser cost on this machine
whatever the app does. Prints min and median of each, of the dashboard's excess over the
reference and of their ratio, and the load average before and after. It also reads the
server process's CPU seconds (user + system, psutil) when the first chart shows: the work
the server did, which other processes on a loaded machine stretch far less than the wall
clock.

The My job page keeps its answers on disk (``dashboard.answerstore``): ``--store kept``
(the default) times servers started after one (untimed) that answered the default job,
as on any machine where the dashboard ran before; ``--store empty`` gives each start an
empty store, as on the first start after the simulator's code changed. The store is a
temporary folder either way ($LAYERCHECK_DASHBOARD_STORE), never the user's.

Needs Chromium (/usr/bin/chromium or on PATH) and playwright (no `playwright install`).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dashboard import headless  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BARE = '''import plotly.graph_objects as go
import streamlit as st
st.title("Reference")
st.plotly_chart(go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 3, 2])))
'''


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
    if not Path(found).exists():
        sys.exit("needs Chromium: apt-get install -y chromium")
    return found


def _server_cpu_s() -> float:
    """CPU seconds (user + system) the running ``streamlit run`` child has used: what the
    server itself did, whatever else the machine ran meanwhile."""
    import psutil
    servers = [p for p in psutil.Process().children()
               if any("streamlit" in part for part in p.cmdline())]
    return sum(sum(p.cpu_times()[:2]) for p in servers)


def cold_start(script: str, path: str, playwright, *, env: dict) -> tuple[float, float, float]:
    """Seconds from starting the server to the first chart visible, to the page idle, and
    the server's CPU seconds until the first chart."""
    start = time.perf_counter()
    with headless.serve(script, env=env, timeout_s=120) as url:
        browser = playwright.chromium.launch(executable_path=_chromium(), args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/{path}")
        page.wait_for_selector(".js-plotly-plot .main-svg", state="visible", timeout=300_000)
        chart = time.perf_counter() - start
        cpu = _server_cpu_s()
        page.wait_for_function("""() => !document.querySelector('[data-testid="stStatusWidget"]')""",
                               timeout=300_000, polling=50)
        idle = time.perf_counter() - start
        browser.close()
        return chart, idle, cpu


def cli_time(env: dict) -> float:
    """Seconds for the command line to answer the dashboard's default job, fresh process."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sim", "--mtbf", "0.5h", "--no-bands", "--json"], cwd=ROOT,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _summary(name: str, values: list[float]) -> str:
    return f"{name:<34} min {min(values):6.2f}  median {statistics.median(values):6.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--page", action="append", help="the dashboard's page path ('' for the default "
                   "page, drift, whatif ...); repeatable (default: the default page)")
    p.add_argument("--store", choices=("kept", "empty"), default="kept",
                   help="kept: My job's answer stored by an earlier server (one untimed start "
                        "fills it); empty: every start searches (default: kept)")
    args = p.parse_args()
    pages = args.page if args.page is not None else [""]
    from playwright.sync_api import sync_playwright
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        bare = Path(tmp) / "bare.py"
        bare.write_text(BARE)
        store = Path(tmp) / "answers"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERCHECK_DASHBOARD_STORE": str(store)}
        if args.store == "kept":
            cold_start("dashboard/app.py", "", pw, env=env)
        times: dict[str, list[tuple[float, ...]]] = {"reference": [], "cli": []}
        for page in pages:
            times[page] = []
        for _ in range(args.repeat):                     # interleaved: reference, each page
            times["reference"].append(cold_start(str(bare), "", pw, env=env))
            if "" in pages:
                seconds = cli_time(env)
                times["cli"].append((seconds,))
            for page in pages:
                if args.store == "empty":
                    shutil.rmtree(store, ignore_errors=True)
                times[page].append(cold_start("dashboard/app.py", page, pw, env=env))
    load_after = os.getloadavg()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.repeat} repeats, "
          f"store {args.store}, load average before {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    ref = [t[0] for t in times["reference"]]
    ref_cpu = [t[2] for t in times["reference"]]
    print(_summary("reference: first chart (s)", ref))
    print(_summary("reference: server CPU to chart (s)", ref_cpu))
    if times["cli"]:
        print(_summary("python -m sim --mtbf 0.5h (s)", [t[0] for t in times["cli"]]))
    for page in pages:
        label = page or "default page"
        chart, idle, cpu = ([t[i] for t in times[page]] for i in range(3))
        print(_summary(f"{label}: first chart (s)", chart))
        print(_summary(f"{label}: page finished (s)", idle))
        print(_summary(f"{label}: chart - reference (s)", [c - r for c, r in zip(chart, ref)]))
        print(_summary(f"{label}: chart / reference", [c / r for c, r in zip(chart, ref)]))
        print(_summary(f"{label}: server CPU to chart (s)", cpu))
        print(_summary(f"{label}: CPU / reference's", [c / r for c, r in zip(cpu, ref_cpu)]))


if __name__ == "__main__":
    main()
