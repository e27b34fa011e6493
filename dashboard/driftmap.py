"""Drift (view 1): the accumulator heatmap with write events, and per-layer drift rates.

Pure functions over a ``Trace``; no Streamlit here.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from layercheck.contract.trace import Trace
from . import charts

__all__ = ["MAX_COLUMNS", "heatmap_figure", "rates_frame", "rates_figure", "window_stats"]

MAX_COLUMNS = 1200
"""Heatmap columns at most: longer runs are binned (each cell the bin's maximum,
so every peak before a reset stays visible)."""


def _window(trace: Trace, first: int, last: int) -> slice:
    if not 1 <= first <= last <= trace.num_steps:
        raise ValueError(f"step window {first}..{last} must lie within 1..{trace.num_steps}")
    return slice(first - 1, last)


def heatmap_figure(trace: Trace, first: int = 1, last: int | None = None, *,
                   log_color: bool = False) -> go.Figure:
    """Layers x steps of the accumulator A_l (rising with drift, reset when the
    layer is written), write events as markers, over steps ``first..last``."""
    last = trace.num_steps if last is None else last
    window = _window(trace, first, last)
    acc = trace.accumulator_matrix()[window]
    writes = trace.write_matrix()[window]
    b = max(1, math.ceil(len(acc) / MAX_COLUMNS))
    n = len(acc) // b * b
    cells = acc[:n].reshape(-1, b, acc.shape[1]).max(axis=1) if b > 1 else acc
    hit = writes[:n].reshape(-1, b, writes.shape[1]).any(axis=1) if b > 1 else writes
    x = first + np.arange(len(cells)) * b
    z = np.log10(np.maximum(cells, 1e-12)) if log_color else cells
    names = trace.layer_names
    fig = go.Figure(go.Heatmap(z=z.T, x=x, y=names, colorscale="Viridis",
                               colorbar=dict(title="log10 A" if log_color else "A"),
                               hovertemplate="step %{x}<br>%{y}<br>A=%{z:.3g}<extra></extra>"))
    col, row = np.nonzero(hit)
    fig.add_scatter(x=x[col], y=[names[r] for r in row], mode="markers", name="layer written",
                    marker=dict(symbol="line-ns-open", size=9, color="white", line=dict(width=1)))
    fig.update_layout(title="Drift accumulator per layer (resets when the layer is written)",
                      xaxis_title="step" + (f" (bins of {b})" if b > 1 else ""),
                      height=max(320, 16 * len(names) + 140), margin=dict(t=50, b=40),
                      showlegend=True,
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return charts.tidy(fig)


def rates_frame(trace: Trace, first: int = 1, last: int | None = None) -> pd.DataFrame:
    """Per layer over steps ``first..last``: mean and max drift per step, writes,
    and mean steps between writes."""
    last = trace.num_steps if last is None else last
    window = _window(trace, first, last)
    drift = trace.drift_matrix()[window]
    writes = trace.write_matrix()[window]
    count = writes.sum(axis=0)
    layers = trace.layers
    return pd.DataFrame({
        "layer": layers["name"], "kind": layers["kind"], "params": layers["params"],
        "mean_drift": drift.mean(axis=0), "max_drift": drift.max(axis=0),
        "writes": count,
        "steps_per_write": np.where(count > 0, len(drift) / np.maximum(count, 1), np.nan)})


def rates_figure(rates: pd.DataFrame) -> go.Figure:
    """Mean drift per step per layer, a dot per layer on a log axis (a dot's position, not a
    bar's length, carries the value): fast and slow layers at a glance."""
    fig = go.Figure()
    embedding = rates["kind"] == "embedding"
    for name, rows, colour in (("embedding", rates[embedding], "#d62728"),
                               ("other layers", rates[~embedding], "#1f77b4")):
        if not rows.empty:
            fig.add_scatter(x=rows["layer"], y=rows["mean_drift"], mode="markers", name=name,
                            marker=dict(color=colour, size=9),
                            hovertemplate="%{x}: %{y:.3g} a step<extra></extra>")
    fig.update_layout(title="Per-layer drift rate (mean drift a step)", yaxis_title="mean drift a step",
                      height=360, margin=dict(t=50, b=40), legend=dict(orientation="h", y=1.1),
                      xaxis=dict(categoryorder="array", categoryarray=list(rates["layer"])))
    charts.log_axis(fig, "y", rates["mean_drift"])
    return charts.tidy(fig)


def window_stats(rates: pd.DataFrame) -> dict[str, float]:
    """Headline numbers of the rates table."""
    return {"writes": int(rates["writes"].sum()),
            "mean_drift": float(rates["mean_drift"].mean()),
            "fastest": str(rates.loc[rates["mean_drift"].idxmax(), "layer"]),
            "slowest": str(rates.loc[rates["mean_drift"].idxmin(), "layer"])}
