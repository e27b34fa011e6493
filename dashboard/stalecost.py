"""What a stale layer costs (the Recovery fidelity page): the staleness study's curves.

``staleness.json`` (``python -m profiler staleness``, ``Trace.staleness``) holds
the failure-free reference's held-out loss curve, one run per recovery (per
replicate, a failure step and a data order: the ``composite``, its ``blocks``
and ``embedding`` parts, the lost-work ``control``, the failure-free ``twin`` on
another data order; the ``exact`` control; an older study's ``reorder``
control) with its curve and its Delta readings per horizon, the noise floor
and the summary of phi. ``read_study`` checks the parts drawn here and says
what is missing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd
import plotly.graph_objects as go
from . import charts

__all__ = ["StudyError", "Study", "read_study", "curves_figure", "delta_figure", "phi_table"]

KINDS = ("composite", "blocks", "embedding", "control", "twin", "exact", "reorder")
PHI_KINDS = ("composite", "blocks", "embedding", "control")
"""The runs with a phi of their own."""
NOISE_KINDS = ("twin", "reorder")
"""The runs that show the data order's own spread (the noise floor)."""


class StudyError(ValueError):
    """staleness.json is not in the shape the profiler writes; the message says which part."""


@dataclass(frozen=True)
class Study:
    reference: pd.DataFrame
    """Columns step, loss: the failure-free run's held-out loss."""
    runs: pd.DataFrame
    """One row per recovery: label, kind, threshold, failure_step, staleness, identical."""
    curves: pd.DataFrame
    """Columns label, step, loss: each recovery's held-out loss after it."""
    readings: pd.DataFrame
    """Columns label, kind, threshold, horizon, after (steps after the recovery), step,
    delta, low, high, censored, phi."""
    noise_floor: Mapping[str, float]
    figure: Mapping[str, Any] | None
    steps: int


def _label(run: Mapping[str, Any]) -> str:
    order = f", data order {run['draw']}" if "draw" in run else ""
    if run["kind"] in PHI_KINDS:
        return f"{run['kind']}, threshold {run['threshold']:g}, step {run['failure_step']}{order}"
    if run["kind"] == "twin":
        return f"failure-free twin, step {run['failure_step']}{order}"
    return f"{run['kind']} control, step {run['failure_step']}"


def read_study(data: Mapping[str, Any] | None) -> Study:
    """Validate a parsed staleness.json."""
    if data is None:
        raise StudyError("this trace has no staleness.json: run `python -m profiler staleness "
                         "--from traces/NAME` to measure what a stale layer costs")
    try:
        ref = data["reference"]
        reference = pd.DataFrame({"step": ref["curve_steps"], "loss": ref["curve"]})
        runs, curves, readings = [], [], []
        for run in data["runs"]:
            if run["kind"] not in KINDS:
                raise StudyError(f"staleness.json: run kind {run['kind']!r}; known {KINDS}")
            label = _label(run)
            runs.append({"label": label, "kind": run["kind"], "threshold": run["threshold"],
                         "failure_step": int(run["failure_step"]),
                         "staleness": float(run["staleness"]),
                         "identical": run["identical_to_reference"]})
            curves.append(pd.DataFrame({"label": label, "step": run["curve_steps"],
                                        "loss": run["curve"]}))
            for name, r in run["readings"].items():
                phi = (run.get("phi") or {}).get(name)
                readings.append({"label": label, "kind": run["kind"], "threshold": run["threshold"],
                                 "horizon": name, "after": int(r["step"]) - int(run["failure_step"]),
                                 "step": int(r["step"]), "delta": float(r["delta"]),
                                 "low": float(r["low"]), "high": float(r["high"]),
                                 "censored": r["censored"],
                                 "phi": math.nan if phi is None else float(phi["value"])})
        return Study(reference=reference, runs=pd.DataFrame(runs),
                     curves=pd.concat(curves, ignore_index=True) if curves else
                     pd.DataFrame(columns=["label", "step", "loss"]),
                     readings=pd.DataFrame(readings), noise_floor=dict(data["noise_floor"]),
                     figure=data["summary"]["figure"], steps=int(reference["step"].max()))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, StudyError):
            raise
        raise StudyError(f"staleness.json: not in the profiler's shape ({type(exc).__name__}: "
                         f"{exc}); re-run `python -m profiler staleness`") from None


_DASH = {"composite": "solid", "blocks": "solid", "embedding": "solid", "control": "dashdot",
         "twin": "dot", "exact": "dash", "reorder": "dot"}


def curves_figure(study: Study) -> go.Figure:
    """Held-out loss: the reference, every recovery from its failure step on."""
    fig = go.Figure()
    fig.add_scatter(x=study.reference["step"], y=study.reference["loss"], name="failure-free",
                    mode="lines", line=dict(color="black", width=3))
    for run in study.runs.itertuples(index=False):
        part = study.curves[study.curves["label"] == run.label]
        fig.add_scatter(x=part["step"], y=part["loss"], name=run.label, mode="lines+markers",
                        line=dict(dash=_DASH[run.kind]), marker=dict(size=4))
    for step in sorted(set(study.runs["failure_step"])):
        fig.add_vline(x=step, line=dict(color="red", dash="dash"), annotation_text="recovery")
    fig.update_layout(title="Held-out loss after each recovery, against the failure-free run",
                      xaxis_title="step", yaxis_title="held-out loss", height=420,
                      margin=dict(t=50, b=40), legend=dict(orientation="h", y=-0.25))
    return charts.tidy(fig)


def delta_figure(study: Study) -> go.Figure:
    """Delta (steps behind, 95% interval) against the steps since the recovery, the
    data-order noise floor shaded."""
    fig = go.Figure()
    r = study.readings
    if not r.empty:
        floor = r[r["kind"].isin(NOISE_KINDS)].sort_values("after")
        if not floor.empty:
            fig.add_scatter(x=list(floor["after"]) + list(floor["after"])[::-1],
                            y=list(floor["delta"].abs()) + list(-floor["delta"].abs())[::-1],
                            fill="toself", fillcolor="rgba(128,128,128,0.2)", line=dict(width=0),
                            name="noise floor (data order)", hoverinfo="skip")
        for label, part in r[~r["kind"].isin(NOISE_KINDS)].groupby("label", sort=False):
            part = part.sort_values("after")
            fig.add_scatter(x=part["after"], y=part["delta"], name=label, mode="lines+markers",
                            error_y=dict(type="data", symmetric=False,
                                         array=part["high"] - part["delta"],
                                         arrayminus=part["delta"] - part["low"]))
    fig.add_hline(y=0, line=dict(color="black", width=1))
    fig.update_layout(title="Steps behind the failure-free run (Delta), by held-out loss",
                      xaxis_title="steps since the recovery", yaxis_title="Delta (steps)",
                      height=400, margin=dict(t=50, b=40), legend=dict(orientation="h", y=-0.25))
    return charts.tidy(fig)


def phi_table(study: Study) -> pd.DataFrame:
    """Per recovery with a phi (the composite, its parts, the control) and horizon: Delta
    with its interval, the staleness and phi as the study read it, beside the noise floor."""
    r = study.readings[study.readings["kind"].isin(PHI_KINDS)]
    runs = study.runs.set_index("label")
    out = pd.DataFrame({
        "run": r["kind"], "threshold": r["threshold"],
        "failure step": r["label"].map(runs["failure_step"]), "horizon": r["horizon"],
        "staleness (steps)": r["label"].map(runs["staleness"]), "Delta": r["delta"],
        "Delta low": r["low"], "Delta high": r["high"], "phi": r["phi"],
        "noise floor": r["horizon"].map(lambda h: study.noise_floor.get(h, math.nan)),
        "censored": r["censored"].fillna("")})
    return out.reset_index(drop=True)
