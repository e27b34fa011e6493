"""LayerCheck dashboard: ``streamlit run dashboard/app.py``.

Thin entry point: page config and navigation. Every view is a short script in
dashboard/views/ over the pure functions of the dashboard package.
"""
import sys
from pathlib import Path

# `streamlit run dashboard/app.py` puts dashboard/ on sys.path, not the
# repository; make the packages importable when they are not installed.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboard import ui  # noqa: E402

st.set_page_config(page_title="LayerCheck", page_icon=":floppy_disk:", layout="wide")
ui.remember()  # before any page: the values of the page being left, if its run was cut short
VIEWS = Path(__file__).resolve().parent / "views"
pages = st.navigation([
    st.Page(VIEWS / "myjob.py", title="My job", icon=":material/work:", default=True),
    st.Page(VIEWS / "drift.py", title="Drift", icon=":material/grid_on:"),
    st.Page(VIEWS / "whatif.py", title="What-if tuning", icon=":material/tune:"),
    st.Page(VIEWS / "failures.py", title="Failures", icon=":material/bolt:"),
    st.Page(VIEWS / "verdict.py", title="Verdict", icon=":material/gavel:"),
    st.Page(VIEWS / "scale.py", title="Scale", icon=":material/hub:"),
    st.Page(VIEWS / "fidelity.py", title="Recovery fidelity", icon=":material/restore:"),
    st.Page(VIEWS / "traces.py", title="Traces", icon=":material/folder_open:"),
])
pages.run()
