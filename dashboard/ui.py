"""Streamlit glue shared by the views: cached loaders, the trace picker, downloads.

The only module besides the view scripts that imports streamlit. Loaders are
cached on the trace folder's path and modification time, so an edited trace
is reloaded and an unchanged one is read once per server.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from layercheck.contract.trace import Trace, TraceError

from . import catalog, tables
from .downloads import csv_bytes, filename, html_bytes

__all__ = ["page", "current_trace", "entries", "load", "remember_upload", "figure", "table_download",
           "UPLOAD_KEY", "trace_key", "restore", "keep", "remember", "settings", "table", "folder_stamp"]

UPLOAD_KEY = "uploaded_trace"
_CHOICE = "trace_name"
_KEPT = "kept_widget_values"


def page(title: str, caption: str) -> None:
    """Page header (the app's page config is set once in app.py)."""
    st.title(title)
    st.caption(caption)


def _stamp(path: Path) -> float:
    """Newest modification time of a trace folder's files: the cache key's freshness part."""
    return max((p.stat().st_mtime for p in path.iterdir()), default=0.0) if path.is_dir() else 0.0


@st.cache_resource(show_spinner=False, max_entries=8)
def _load(path: str, stamp: float) -> Trace:
    return catalog.load(Path(path))


def folder_stamp(path: str | Path) -> float:
    """A folder's newest modification time: key a cache on it to see the folder change."""
    return _stamp(Path(path))


def load(path: Path) -> Trace:
    """The validated trace at ``path`` (cached; shared read-only across sessions)."""
    return _load(str(path), _stamp(path))


@st.cache_data(show_spinner=False, ttl=30)
def _scan(root: str) -> list[catalog.Entry]:
    return catalog.scan(Path(root))


def entries() -> list[catalog.Entry]:
    """The traces directory's folders, valid or not (rescanned at most every 30 s)."""
    return _scan(str(catalog.traces_dir()))


def remember_upload(path: Path, name: str) -> None:
    """Make an uploaded (already validated) trace selectable on every page."""
    st.session_state[UPLOAD_KEY] = {"path": str(path), "name": f"uploaded: {name}"}
    st.session_state[_CHOICE] = st.session_state[UPLOAD_KEY]["name"]


def current_trace() -> Trace:
    """The trace picked in the sidebar (the default rule picks the first one);
    stops the page with a message that says what to do when there is none."""
    valid = [e for e in entries() if e.valid]
    choices = {e.name: e.path for e in valid}
    upload = st.session_state.get(UPLOAD_KEY)
    if upload:
        choices[upload["name"]] = Path(upload["path"])
    if not choices:
        st.warning(f"No valid trace in {catalog.traces_dir()}. Make one with "
                   "`python -m profiler capture` or `python -m sim presets --write`, "
                   f"point ${catalog.ENV} at a folder of traces, or upload one on the Traces page.")
        st.stop()
    names = list(choices)
    wanted = st.session_state.get(_CHOICE)
    if wanted not in choices:
        default = catalog.default_entry(valid)
        wanted = default.name if default else names[0]
    picked = st.sidebar.selectbox("Trace", names, index=names.index(wanted), key="trace_picker",
                                  help="Shipped traces from the traces folder, and your upload.")
    st.session_state[_CHOICE] = picked
    try:
        trace = load(choices[picked])
    except TraceError as exc:  # changed on disk since the scan
        st.error(f"This trace cannot be read: {exc}")
        st.stop()
    label = "measured" if trace.kind == "captured" else "synthetic (from published figures)"
    st.sidebar.caption(f"**{trace.name}**: {catalog.model_label(trace)}, {trace.num_steps:,} steps, "
                       f"{len(trace.layer_names)} layers, {label}")
    return trace


def restore(keys: list[str]) -> None:
    """Put back the values ``keep`` saved for the widgets ``keys`` before they are drawn.

    Streamlit forgets a widget's state when a run does not draw it (the user is on another
    page), so a page whose widgets take their value from session state would open at each
    widget's minimum on the way back. The saved copies live under a key no widget owns,
    which Streamlit keeps."""
    saved = st.session_state.get(_KEPT, {})
    for name in keys:
        if name not in st.session_state and name in saved:
            st.session_state[name] = saved[name]


def settings(defaults: dict) -> list[str]:
    """Start a page's widgets at ``defaults`` (key -> value) unless the user set them on an
    earlier visit (``restore``); the widgets then take no ``value=``. Returns the keys, for
    ``keep`` once the widgets are drawn."""
    keys = list(defaults)
    restore(keys)
    for name, value in defaults.items():
        st.session_state.setdefault(name, value)
    return keys


def keep(keys: list[str]) -> None:
    """Save the widgets ``keys``' current values (call after drawing them) for ``restore``."""
    saved = st.session_state.setdefault(_KEPT, {})
    saved.update({name: st.session_state[name] for name in keys if name in st.session_state})


def remember() -> None:
    """Refresh every saved copy from the values this run was asked with (call first in
    every run, whatever the page: app.py does).

    A run that switches page carries the widget values the browser holds, the page the
    user leaves included; but that page's own last run, the one whose ``keep`` would have
    saved a value set just before the switch, may never reach ``keep``: Streamlit stops a
    run as soon as the next is asked for. Without this, a slider moved and a page left
    within a rerun's time came back at its previous value."""
    saved = st.session_state.get(_KEPT)
    if saved:
        keep(list(saved))


def trace_key(trace: Trace) -> tuple:
    """A cache key for results computed from a trace (name, size and a checksum of its drift)."""
    return (trace.name, trace.num_steps, len(trace.writes), float(trace.drift["drift"].sum()))


def figure(fig: go.Figure, name: str, *, key: str) -> None:
    """Show a figure with a download of it as standalone HTML (built on click)."""
    st.plotly_chart(fig, width="stretch", key=f"chart-{key}")
    st.download_button("Download figure (HTML)", data=lambda: html_bytes(fig),
                       file_name=filename(name, ext="html"), mime="text/html",
                       key=f"html-{key}", on_click="ignore")


def table(frame: pd.DataFrame) -> None:
    """Show a table as people read it (``tables.styled``: words, units, separators)."""
    st.dataframe(tables.styled(frame), hide_index=True, width="stretch")


def table_download(frame: pd.DataFrame | Callable[[], pd.DataFrame], name: str, *, key: str,
                   label: str = "Download table (CSV)") -> None:
    """A CSV download of a table (a callable builds it only when clicked)."""
    data = (lambda: csv_bytes(frame())) if callable(frame) else csv_bytes(frame)
    st.download_button(label, data=data, file_name=filename(name, ext="csv"), mime="text/csv",
                       key=f"csv-{key}", on_click="ignore")
