"""The dashboard's Scale page, data and figures: each strategy's ratio against job size.

And where the time goes.

Thin wrappers over ``sim.scale`` plus the page's figures. No Streamlit here.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from sim import LIMIT, Scenario
from sim.recovery import RecoveryModel
from sim.scale import WHERE, ScaleModel, gpu_steps, scale_curve, shares
from . import charts

__all__ = ["SIZES", "model_for", "curve", "curve_figure", "where_figure"]

SIZES = gpu_steps(8, 16384)
"""The job sizes the page offers (GPUs, doubling)."""


def model_for(*, spares: int | None, no_spare: str, node_mtbf_days: float,
              aggregate_gbps: float) -> ScaleModel:
    """The scale model of the page's settings (every other figure the default, with its source)."""
    return ScaleModel(node_mtbf_s=node_mtbf_days * 86400.0, aggregate_gbps=aggregate_gbps,
                      read_aggregate_gbps=aggregate_gbps,
                      recovery=RecoveryModel(spares=spares, no_spare=no_spare))


def curve(scenario: Scenario, model: ScaleModel, *, low: int, high: int, seeds: int) -> pd.DataFrame:
    """``sim.scale.scale_curve`` from ``low`` to ``high`` GPUs (doubling)."""
    return scale_curve(scenario, model, gpus=gpu_steps(low, high), seeds=seeds)


def curve_figure(frame: pd.DataFrame) -> go.Figure:
    """Ratio against GPUs (log axis), the 95% band as error bars, the perfect checkpointer dashed."""
    fig = go.Figure()
    for name, group in frame.groupby("strategy", sort=False):
        fig.add_scatter(x=group["gpus"], y=group["effective_ratio"], name=name,
                        mode="lines+markers",
                        error_y=dict(type="data", array=group["ci95"], visible=True),
                        line=dict(dash="dash") if name == LIMIT else None)
    fig.update_layout(title="Effective training time ratio vs job size (dashed: perfect "
                      "checkpointer; bars: 95% band over seeds)", xaxis_title="GPUs",
                      yaxis_title="effective ratio", height=440, legend=dict(orientation="h", y=-0.2))
    sizes = sorted(frame["gpus"].unique())
    fig.update_xaxes(type="log", tickvals=sizes, ticktext=[f"{int(g):,}" for g in sizes],
                     minor=dict(ticks="", showgrid=False))
    return charts.tidy(fig)


def where_figure(frame: pd.DataFrame, gpus: int, window_s: float) -> go.Figure:
    """At ``gpus``: each strategy's window beyond useful training, by cause (shares, stacked)."""
    rows = shares(frame[frame["gpus"] == gpus], window_s)
    fig = go.Figure()
    for column, label in WHERE.items():
        fig.add_bar(x=rows["strategy"], y=rows[column], name=label)
    fig.update_layout(barmode="stack", title=f"Where the time goes at {gpus:,} GPUs",
                      yaxis_title="share of the window", yaxis_tickformat=".1%", height=420)
    return charts.tidy(fig)
