"""What every figure of the dashboard shares: log axes that read (ticks at 1, 2 and 5 of
each decade, each with its unit, no bare minor labels), labels that are not cut off
(automargin, wrapped titles), and legend keys for marks that no trace of their own names.

Pure Plotly, no Streamlit; each figure module calls these on the figure it returns.
"""
from __future__ import annotations

import math
import textwrap
from typing import Iterable

import numpy as np
import plotly.graph_objects as go

__all__ = ["log_ticks", "log_axis", "tidy", "wrap", "legend_key", "number"]


def number(value: float) -> str:
    """A tick's number: 0.001, 0.5, 20, 1,000, 2e-05 (short, no float noise)."""
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 1e-3:
        return f"{value:.3g}"
    return f"{value:.0e}".replace("e-0", "e-")


def log_ticks(values: Iterable[float], unit: str = "", *, most: int = 9) -> tuple[list[float], list[str]]:
    """Tick positions and labels for a log axis spanning ``values`` (positive ones): 1, 2
    and 5 of each decade, only 1 and 3 where that gives more than ``most`` ticks, only the
    decades where even that does (every other decade past that); each label with ``unit``."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x) and x > 0], dtype=float)
    if v.size == 0:
        return [], []
    lo, hi = math.floor(math.log10(v.min())), math.ceil(math.log10(v.max()))
    for mantissas in ((1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10.0 ** e for e in range(lo, hi + 1) for m in mantissas]
        ticks = [t for t in ticks if v.min() / 1.5 <= t <= v.max() * 1.5]
        if len(ticks) <= most:
            break
    else:
        step = math.ceil(len(ticks) / most)
        ticks = ticks[::step]
    if len(ticks) < 2:                       # a narrow range: its ends
        ticks = sorted({float(f"{v.min():.2g}"), float(f"{v.max():.2g}")})
    suffix = f" {unit}" if unit else ""
    return ticks, [number(t) + suffix for t in ticks]


def log_axis(fig: go.Figure, axis: str, values: Iterable[float], unit: str = "") -> go.Figure:
    """Make ``axis`` ("x", "y", "y2" ...) of ``fig`` a log axis with ``log_ticks`` labels."""
    tickvals, ticktext = log_ticks(values, unit)
    name = axis[0] + "axis" + axis[1:]
    fig.update_layout({name: dict(type="log", tickvals=tickvals, ticktext=ticktext,
                                  minor=dict(ticks="", showgrid=False))})
    return fig


def wrap(text: str, width: int = 40) -> str:
    """``text`` broken into lines of at most ``width`` characters (Plotly's <br>)."""
    return "<br>".join(textwrap.wrap(text, width)) or text


def tidy(fig: go.Figure) -> go.Figure:
    """Margins that grow to fit every tick label and axis title: nothing cut off."""
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


def legend_key(fig: go.Figure, name: str, **style) -> go.Figure:
    """A legend entry for marks drawn without one of their own (a band, bound markers):
    an empty trace with ``style`` (mode, marker, line, fill)."""
    fig.add_scatter(x=[None], y=[None], name=name, hoverinfo="skip", **style)
    return fig
