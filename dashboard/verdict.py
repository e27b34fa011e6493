"""The Verdict page: every strategy at its own best setting, the winner and what can flip
it, the frontier of ratio against durable bytes, and the bill in hours and dollars.

Pure functions over ``sim.fair``, ``sim.verdict``, ``sim.bytefront`` and ``sim.dollars``
(no Streamlit here), so they are tested without a browser.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from sim.bytefront import best_by_budget, front_table
from sim.dollars import PRICES, Prices
from sim.fair import FairResult
from sim.verdict import Verdict
from . import charts

__all__ = ["frontier_figure", "budget_frame", "settings_frame", "bill_frame", "flips_frame",
           "prices_frame", "prices_from_form"]

HOUR = 3600.0


def frontier_figure(result: FairResult) -> go.Figure:
    """Effective ratio against durable bytes over one job (TB, log axis): every setting
    rated as a faint point, each strategy's front as a line, the best under each budget
    as the upper staircase (dashed)."""
    table = front_table(result)
    fig = go.Figure()
    for i, name in enumerate(n for n in result.strategies if n != "none"):
        rows = table[(table["strategy"] == name) & (table["job_bytes"] > 0)]
        if rows.empty:
            continue
        colour = qualitative.Plotly[i % len(qualitative.Plotly)]
        fig.add_scatter(x=rows["job_bytes"] / 1e12, y=rows["effective_ratio"], mode="markers",
                        marker=dict(color=colour, opacity=0.25, size=6), legendgroup=name,
                        showlegend=False, customdata=rows["setting"], name=f"{name}: a setting",
                        hovertemplate="%{customdata}<br>%{x:.3g} TB, ratio %{y:.4f}<extra></extra>")
        front = rows[rows["front"]]
        fig.add_scatter(x=front["job_bytes"] / 1e12, y=front["effective_ratio"], name=name,
                        mode="lines+markers", line=dict(color=colour, shape="hv"),
                        legendgroup=name, customdata=front["setting"],
                        hovertemplate="%{customdata}<br>%{x:.3g} TB, ratio %{y:.4f}<extra></extra>")
    ranges = best_by_budget(result)
    if ranges:
        top = max(float(table["job_bytes"].max()), ranges[-1]["from_bytes"]) / 1e12
        x = [r["from_bytes"] / 1e12 for r in ranges] + [top]
        y = [r["effective_ratio"] for r in ranges] + [ranges[-1]["effective_ratio"]]
        fig.add_scatter(x=x, y=y, mode="lines", name="best under the budget",
                        line=dict(color="black", dash="dash", shape="hv"))
    charts.legend_key(fig, "faint: every other setting rated", mode="markers",
                      marker=dict(color="grey", opacity=0.35, size=6))
    fig.update_layout(title="Effective ratio against durable bytes a job (each strategy's front)",
                      xaxis_title="durable bytes over one job (TB)",
                      yaxis_title="effective ratio", yaxis_range=[0, 1.02], height=480,
                      template="plotly_white", legend=dict(orientation="h", y=-0.25))
    charts.log_axis(fig, "x", table["job_bytes"][table["job_bytes"] > 0] / 1e12, "TB")
    return charts.tidy(fig)


def budget_frame(result: FairResult) -> pd.DataFrame:
    """Which strategy is best under each budget of durable bytes a job (TB)."""
    rows = [{"from TB": r["from_bytes"] / 1e12,
             "to TB": np.nan if r["to_bytes"] is None else r["to_bytes"] / 1e12,
             "strategy": r["strategy"], "setting": r["setting"],
             "effective ratio": r["effective_ratio"], "+-95%": r["ci95"]}
            for r in best_by_budget(result)]
    return pd.DataFrame(rows, columns=["from TB", "to TB", "strategy", "setting",
                                       "effective ratio", "+-95%"])


def settings_frame(result: FairResult) -> pd.DataFrame:
    """One row per strategy: its best setting, ratio, and what it takes (TB a job, share of
    the write bandwidth, host GB)."""
    table = result.table()
    best = result.best_rows()
    extra = []
    for name in table["strategy"]:
        row = best[name]
        f = result.field
        extra.append({"TB a job": np.nan if row is None else f.at[row, "job_bytes"] / 1e12,
                      "write share": np.nan if row is None else f.at[row, "write_share"],
                      "host GB": np.nan if row is None else f.at[row, "host_bytes"] / 1e9})
    cols = ["strategy", "setting", "effective_ratio", "ci95", "ratio_at_phi_low", "ratio_at_phi_high"]
    return pd.concat([table[cols], pd.DataFrame(extra)], axis=1)


def bill_frame(result: FairResult, prices: Prices) -> pd.DataFrame:
    """GPU hours a run by cause and the dollars of each strategy (``sim.dollars``)."""
    bills = result.bills(prices)
    return bills[["strategy", "gpu_h_stall", "gpu_h_lost_work", "gpu_h_stale_work", "gpu_h_restart",
                  "gpu_h_recovery", "usd_gpu", "usd_storage", "usd_writes", "usd_total"]]


def flips_frame(verdict: Verdict) -> pd.DataFrame:
    """The band ends (phi's included) at which another strategy ranks first."""
    return pd.DataFrame([f.to_dict() for f in verdict.flips],
                        columns=["figure", "end", "value", "leader", "setting", "ratio",
                                 "against", "winner_ratio"])


def prices_frame(prices: Prices) -> pd.DataFrame:
    """Each price with its value and source."""
    return pd.DataFrame([{"price": name, "value": s["value"], "source": s["source"],
                          "method": s["method"]} for name, s in prices.sources().items()])


def prices_from_form(gpu_hour_usd: float, gpus: int, storage_usd_per_gb_month: float,
                     write_usd_per_gb: float, keep: int) -> Prices:
    """The page's price inputs as ``Prices`` (each default is ``sim.dollars.PRICES``')."""
    return Prices(gpu_hour_usd=float(gpu_hour_usd), gpus=int(gpus),
                  storage_usd_per_gb_month=float(storage_usd_per_gb_month),
                  write_usd_per_gb=float(write_usd_per_gb), keep=int(keep))


DEFAULTS = {name: figure.value for name, figure in PRICES.items()}
"""The form's starting values."""
