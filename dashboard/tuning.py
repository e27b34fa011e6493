"""Tuning (view 2, lower half): the frontier of settings and the recommendation.

Pure functions over ``sim.frontier`` and ``sim.tuning``: the numbers, tables and
Plotly figures the What-if page shows. No Streamlit here.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from layercheck.contract.config import LayerCheckConfig
from layercheck.contract.trace import Trace
from sim.api import Scenario
from sim.frontier import Evaluation, Grid, config_line, rate, write_bandwidth
from sim.tuning import Budgets, Recommendation, evaluate_with_references, recommend

from .whatif import GB, Outcome, Settings
from . import charts

__all__ = ["frontier", "rate_front", "frontier_figure", "front_frame", "settings_for",
           "advise", "recommendation_frame", "slider_values", "budgets_from_form", "config_line"]


def frontier(trace: Trace, scenario: Scenario) -> Evaluation:
    """Every setting of the trace's default grid (``Grid.for_trace``, 400: a picture to pick
    from; ``python -m sim tune`` and the Verdict page search the wider
    ``sim.settings.layercheck_grid``), with the paper's default and the recorded setting
    (``sim.tuning.evaluate_with_references``); the write share uses the trace's measured
    write bandwidth where it has one."""
    return evaluate_with_references(trace, Grid.for_trace(trace),
                                    bandwidth=write_bandwidth(trace, scenario)[0])


def rate_front(result: Evaluation, scenario: Scenario, *, mtbf_s: float, seeds: int,
               window_s: float) -> pd.DataFrame:
    """The table with the effective ratio simulated for the Pareto points and the
    paper's default (NaN elsewhere)."""
    table = result.table
    rows = np.flatnonzero(table["pareto"].to_numpy() | (table["role"] == "paper default").to_numpy())
    return rate(result, scenario, rows=rows, mtbf_s=mtbf_s, seeds=seeds, window_s=window_s)


def frontier_figure(table: pd.DataFrame, current: Outcome | None = None,
                    recommended: dict[str, Any] | None = None, title: str = "") -> go.Figure:
    """Bytes written against mean weighted staleness for every setting (grey), the
    Pareto front coloured by effective ratio, the current setting, the paper's default
    and the recommendation marked. Each point carries its table row as customdata."""
    grid = table[table["role"] == "grid"]
    front = grid[grid["pareto"]].sort_values("bytes_written")
    fig = go.Figure()
    fig.add_scatter(x=grid["mean_weighted_staleness"], y=grid["bytes_written"] / GB, mode="markers",
                    name="grid settings", marker=dict(color="lightgrey", size=6),
                    customdata=grid.index.to_numpy(), hovertext=_hover(grid), hoverinfo="text")
    rated = front["effective_ratio"].notna().any()
    fig.add_scatter(
        x=front["mean_weighted_staleness"], y=front["bytes_written"] / GB, mode="lines+markers",
        name="Pareto front", line=dict(color="grey", width=1), customdata=front.index.to_numpy(),
        hovertext=_hover(front), hoverinfo="text",
        marker=dict(size=11, color=front["effective_ratio"] if rated else "steelblue",
                    colorscale="Viridis", showscale=bool(rated),
                    colorbar=dict(title="effective<br>ratio") if rated else None))
    if current is not None:
        fig.add_scatter(x=[current.mean_weighted_staleness], y=[current.total_bytes / GB],
                        mode="markers", name="current setting (sidebar)",
                        marker=dict(symbol="star", size=18, color="gold",
                                    line=dict(color="black", width=1)))
    paper = table[table["role"] == "paper default"]   # open, over the star: they often coincide
    fig.add_scatter(x=paper["mean_weighted_staleness"], y=paper["bytes_written"] / GB,
                    mode="markers", name="paper's default", customdata=paper.index.to_numpy(),
                    hovertext=_hover(paper), hoverinfo="text",
                    marker=dict(symbol="diamond-open", size=22, color="crimson",
                                line=dict(color="crimson", width=3)))
    if recommended is not None:
        fig.add_scatter(x=[recommended["mean_weighted_staleness"]],
                        y=[recommended["bytes_written"] / GB], mode="markers", name="recommended",
                        marker=dict(symbol="circle-open", size=22, color="black",
                                    line=dict(width=3)))
    fig.update_layout(title=title or "Every setting: bytes written against staleness "
                      "(colour: effective ratio)",
                      xaxis_title="mean parameter-weighted staleness (steps)",
                      yaxis_title="GB written over the run",
                      height=460, margin=dict(t=50, b=40), clickmode="event+select",
                      legend=dict(orientation="h", y=-0.2))
    charts.log_axis(fig, "x", grid["mean_weighted_staleness"], "steps")
    charts.log_axis(fig, "y", grid["bytes_written"] / GB, "GB")
    return charts.tidy(fig)


def _hover(rows: pd.DataFrame) -> list[str]:
    out = []
    for row in rows.itertuples():
        ratio = "" if math.isnan(row.effective_ratio) else (
            f"<br>ratio {row.effective_ratio:.4f} +- {row.ci95:.4f}")
        out.append(f"K {row.base_threshold:g}, embeddings {row.embedding_threshold:g}, Smax "
                   f"{row.smax}, interval {row.interval}<br>{row.bytes_written / GB:,.1f} GB, "
                   f"staleness mean {row.mean_weighted_staleness:.1f} max {row.max_staleness}"
                   f"<br>write share {row.write_share:.2%}{ratio}")
    return out


def front_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The Pareto points, fewest bytes first, for a table with a 'use this' choice."""
    front = table[table["pareto"] & (table["role"] == "grid")].sort_values("bytes_written")
    out = front[["base_threshold", "embedding_threshold", "smax", "interval", "warmup_steps",
                 "layer_writes", "max_staleness", "mean_weighted_staleness", "write_share",
                 "effective_ratio", "ci95"]].copy()
    out.insert(5, "GB written", front["bytes_written"] / GB)
    return out


def settings_for(table: pd.DataFrame, row: int, *, lr_scaling: bool = True) -> Settings:
    """The What-if settings of a table row."""
    r = table.loc[row]
    return Settings(base_threshold=float(r["base_threshold"]),
                    embedding_threshold=float(r["embedding_threshold"]), smax=int(r["smax"]),
                    warmup_steps=int(r["warmup_steps"]), interval=int(r["interval"]),
                    lr_scaling=lr_scaling)


def slider_values(settings: Settings) -> dict[str, Any]:
    """Session-state values of the What-if sliders that show ``settings`` (fixed thresholds)."""
    return {"k_base": settings.base_threshold, "k_emb": settings.embedding_threshold,
            "smax": settings.smax, "warmup": settings.warmup_steps, "interval": settings.interval,
            "lr_scaling": settings.lr_scaling, "budget_on": settings.write_budget is not None}


def budgets_from_form(max_gb: float, max_staleness: float, max_share_percent: float) -> Budgets:
    """The form's numbers (0: no limit) as budgets."""
    return Budgets(max_bytes=max_gb * 1e9 if max_gb > 0 else None,
                   max_staleness=max_staleness if max_staleness > 0 else None,
                   max_write_share=max_share_percent / 100 if max_share_percent > 0 else None)


def advise(trace: Trace, scenario: Scenario, result: Evaluation, budgets: Budgets, *,
           mtbf_s: float, seeds: int, window_s: float) -> Recommendation:
    """``sim.tuning.recommend`` over an evaluation already made (raises SimError with the
    budget that binds). The baselines are the Verdict page's (every strategy at its own
    best), not searched again here."""
    return recommend(trace, scenario, budgets, mtbf_s=mtbf_s, seeds=seeds, window_s=window_s,
                     result=result, baselines=False)


def recommendation_frame(advice: Recommendation) -> pd.DataFrame:
    """Recommended, paper's default and recorded setting side by side."""
    rows = []
    for label, row in (("recommended", advice.best), ("paper default", advice.paper),
                       ("recorded", advice.recorded)):
        rows.append({"setting": label, "effective ratio": row["effective_ratio"],
                     "+-95%": row["ci95"], "GB written": row["bytes_written"] / GB,
                     "max staleness": row["max_staleness"],
                     "mean weighted staleness": row["mean_weighted_staleness"],
                     "write share": row["write_share"],
                     "config": config_line(LayerCheckConfig(**{k: row[k] for k in (
                         "base_threshold", "embedding_threshold", "smax", "interval",
                         "warmup_steps")}))})
    return pd.DataFrame(rows)
