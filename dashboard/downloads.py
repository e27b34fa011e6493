"""Bytes for the download buttons: tables as CSV, figures as standalone HTML."""
from __future__ import annotations

import re

import pandas as pd
import plotly.graph_objects as go

__all__ = ["csv_bytes", "html_bytes", "filename", "human_bytes"]


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """UTF-8 CSV without the index."""
    return frame.to_csv(index=False).encode("utf-8")


def html_bytes(fig: go.Figure) -> bytes:
    """A self-contained interactive HTML page of the figure (plotly.js inlined:
    it opens offline)."""
    return fig.to_html(include_plotlyjs=True, full_html=True).encode("utf-8")


def filename(*parts: object, ext: str) -> str:
    """A safe file name from parts, e.g. ('qwen', 'whatif') -> 'qwen-whatif.csv'."""
    stem = "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", str(p)).strip("_") for p in parts if str(p))
    return f"{stem or 'layercheck'}.{ext}"


def human_bytes(n: float) -> str:
    """1234567 -> '1.23 MB' (decimal units, as the paper's GB)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return f"{n:,.2f} PB"
