"""Failures (view 3): the simulator at an MTBF, across MTBFs, and across thresholds.

Thin wrappers over ``sim`` (its ``Scenario``, ``simulate`` and ``sweep``) plus
the figures of the view. No Streamlit here.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from layercheck.contract.trace import Trace
from sim.calibrated import FIGURES
from sim import COST_MODELS, LIMIT, CostModel, Scenario, simulate, sweep, sweep_figure
from sim.report import ranking_note, stale_line
from sim.workload import LayerWrites

from .whatif import Settings, replay_trace
from . import charts

__all__ = ["HOUR", "TRACE_COSTS", "cost_options", "cost_model", "costs_frame", "scenario_for", "strategies_table", "breakdown_figure", "curves",
           "curves_figure", "threshold_table", "threshold_figure", "replayed_trace", "stale_notes"]

HOUR = 3600.0
PARTS = {"useful_s": "useful compute", "stale_lost_s": "discarded by stale layers (phi x stale_s)",
         "checkpoint_stall_s": "checkpoint stall", "lost_work_s": "lost work redone",
         "recovery_s": "recovery and restart"}
TRACE_COSTS = "this trace's calibration (costs.json)"


def cost_options(trace: Trace) -> list[str]:
    """The cost models a trace can be simulated with, its own calibration first."""
    return ([TRACE_COSTS] if trace.costs is not None else []) + list(COST_MODELS)


def cost_model(trace: Trace, choice: str) -> CostModel:
    """The cost model ``choice`` (one of ``cost_options``)."""
    if choice == TRACE_COSTS:
        return CostModel.from_calibration(trace.costs)
    return CostModel.named(choice)


def costs_frame(costs: CostModel) -> pd.DataFrame:
    """Every figure of a cost model with its unit, source and method: where each cost came from."""
    return pd.DataFrame([{"figure": name, "value": getattr(costs, name), "unit": spec.unit,
                          "interval": _interval(costs.provenance[name]),
                          "source": costs.provenance[name].source, "used by": spec.used_by,
                          "method": costs.provenance[name].method}
                         for name, spec in FIGURES.items()])


def _interval(record) -> str:
    return "" if record.low is None else f"{record.low:g}..{record.high:g}"


def stale_notes(scenario: Scenario, table: pd.DataFrame) -> tuple[str, str | None]:
    """The stale cost factor in force (value, interval, source) and, when the strategy
    ranked first depends on it within its interval, the line that says so (else None)."""
    phi = scenario.stale_figure()
    return stale_line(phi), ranking_note(table, phi)


def scenario_for(trace: Trace, *, costs: CostModel | None = None, **fields) -> Scenario:
    """The trace's compute, layer sizes and writes, with ``costs`` (default: the trace's
    own calibration, else the paper's server) and any other scenario fields."""
    if costs is None:
        costs = cost_model(trace, cost_options(trace)[0])
    return Scenario.from_trace(trace, costs=costs, **fields)


def strategies_table(scenario: Scenario, *, mtbf_s: float, seeds: int, window_s: float) -> pd.DataFrame:
    """``sim.simulate``: one row per strategy."""
    return simulate(scenario, mtbf_s=mtbf_s, seeds=seeds, window_s=window_s)


def breakdown_figure(table: pd.DataFrame, window_s: float) -> go.Figure:
    """Where the wall-clock time of a run went, per strategy (hours, stacked)."""
    fig = go.Figure()
    for column, label in PARTS.items():
        fig.add_bar(y=table["strategy"], x=table[column] / HOUR, name=label, orientation="h")
    other = window_s - table[list(PARTS)].sum(axis=1)
    fig.add_bar(y=table["strategy"], x=np.maximum(other, 0) / HOUR, name="other (idle, partial)",
                orientation="h", marker_color="lightgrey")
    fig.update_layout(barmode="stack", title="Where the time goes (hours per simulated window)",
                      xaxis_title="hours", height=340, margin=dict(t=50, b=40),
                      legend=dict(orientation="h", y=-0.3))
    return charts.tidy(fig)


def curves(scenario: Scenario, *, mtbf_s: Sequence[float], seeds: int, window_s: float) -> pd.DataFrame:
    """``sim.sweep`` with the perfect checkpointer's limit rows."""
    return sweep(scenario, mtbf_s=list(mtbf_s), seeds=seeds, window_s=window_s, limit=True)


def curves_figure(frame: pd.DataFrame, mtbf_s: float) -> go.Figure:
    """Effective ratio against MTBF in hours (the simulator's figure), the chosen MTBF marked."""
    fig = sweep_figure(frame, title="Effective training time ratio vs MTBF (dashed: perfect checkpointer)")
    # A trace, not a shape: shapes on a log axis take log10 coordinates.
    fig.add_scatter(x=[mtbf_s / HOUR] * 2, y=[0, 1.02], mode="lines",
                    name=f"this MTBF ({mtbf_s / HOUR:g} h)", line=dict(color="grey", dash="dot"))
    charts.legend_key(fig, "shaded: 95% band over seeds", mode="lines",
                      line=dict(color="rgba(128,128,128,0.35)", width=10))
    if any(getattr(t.marker, "symbol", None) == "triangle-up-open" for t in fig.data):
        charts.legend_key(fig, "ratio at phi's low end", mode="markers",
                          marker=dict(symbol="triangle-up-open", size=8, color="grey"))
        charts.legend_key(fig, "ratio at phi's high end", mode="markers",
                          marker=dict(symbol="triangle-down-open", size=8, color="grey"))
    fig.update_layout(height=460, legend=dict(orientation="h", y=-0.2))
    charts.log_axis(fig, "x", frame["mtbf_s"] / HOUR, "h")
    return charts.tidy(fig)


def replayed_trace(trace: Trace, settings: Settings) -> Trace:
    """The trace with its writes replaced by what ``settings`` would write."""
    replayed = replay_trace(trace, settings)
    step, layer = np.nonzero(replayed.writes)
    writes = pd.DataFrame({"step": (step + 1).astype(np.int64), "layer": layer.astype(np.int64),
                           "bytes": trace.layer_bytes[layer],
                           "reason": replayed.labels(step, layer),
                           "stall_s": np.nan, "persist_s": np.nan})
    return dataclasses.replace(trace, writes=writes)


def threshold_table(trace: Trace, scenario: Scenario, settings: Settings, thresholds: Sequence[float],
                    *, mtbf_s: float, seeds: int, window_s: float) -> pd.DataFrame:
    """LayerCheck at each base threshold (other settings kept), simulated at one
    MTBF on the same failures: ratio, bytes, staleness. ``best`` marks the highest ratio."""
    rows = []
    for k in thresholds:
        variant = replayed_trace(trace, dataclasses.replace(settings, base_threshold=float(k)))
        run = dataclasses.replace(scenario, workload=_workload(scenario, variant))
        row = simulate(run, mtbf_s=mtbf_s, strategies=["layercheck"], seeds=seeds,
                       window_s=window_s).iloc[0]
        weighted = variant.mean_weighted_staleness()
        rows.append({"base_threshold": float(k), "effective_ratio": row["effective_ratio"],
                     "ci95": row["ci95"], "ratio_at_phi_low": row["ratio_at_phi_low"],
                     "ratio_at_phi_high": row["ratio_at_phi_high"], "stale_s": row["stale_s"],
                     "checkpoint_stall_s": row["checkpoint_stall_s"],
                     "lost_work_s": row["lost_work_s"], "bytes_written": row["bytes_written"],
                     "layer_writes": len(variant.writes),
                     "mean_weighted_staleness": weighted})
    out = pd.DataFrame(rows)
    out["best"] = out["effective_ratio"] == out["effective_ratio"].max()
    return out


def _workload(scenario: Scenario, trace: Trace):
    """The scenario's workload with the variant's writes (compute stays the scenario's)."""
    return dataclasses.replace(scenario.workload, layers=LayerWrites.from_trace(trace))


def threshold_figure(table: pd.DataFrame) -> go.Figure:
    """Effective ratio and bytes written against the base threshold."""
    fig = go.Figure()
    fig.add_scatter(x=table["base_threshold"], y=table["effective_ratio"], mode="lines+markers",
                    name="effective ratio", error_y=dict(type="data", array=table["ci95"]))
    fig.add_scatter(x=table["base_threshold"], y=table["bytes_written"] / 1e12, yaxis="y2",
                    mode="lines+markers", name="TB written", line=dict(dash="dot"))
    best = table[table["best"]]
    fig.add_scatter(x=best["base_threshold"], y=best["effective_ratio"], mode="markers",
                    marker=dict(size=14, symbol="star", color="gold"), name="best")
    fig.update_layout(title="LayerCheck at this MTBF, by base threshold",
                      xaxis_title="base threshold K", yaxis_title="effective ratio",
                      yaxis2=dict(title="TB written (dotted)", overlaying="y", side="right",
                                  rangemode="tozero"),
                      height=380, margin=dict(t=50, b=40), legend=dict(orientation="h", y=-0.3))
    charts.log_axis(fig, "x", table["base_threshold"])
    return charts.tidy(fig)
