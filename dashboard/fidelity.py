"""Recovery fidelity (view 4): failure-free vs recovered loss curves from a drill.

``drill.json`` (written by ``python -m profiler drill``) holds failure_steps,
recovery_seconds, max_abs_loss_deviation, max_rel_loss_deviation,
final_metric {name, failure_free, recovered} and curves {step, failure_free,
recovered}. ``read_drill`` checks that shape and says what is missing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from . import charts

__all__ = ["DrillError", "Drill", "read_drill", "curves_figure", "deviation_in"]


class DrillError(ValueError):
    """drill.json is not in the shape the profiler writes; the message says which part."""


@dataclass(frozen=True, kw_only=True)
class Drill:
    """A validated drill result."""

    failure_steps: list[int]
    recovery_seconds: list[float]
    max_abs_loss_deviation: float
    max_rel_loss_deviation: float
    metric_name: str
    metric_failure_free: float
    metric_recovered: float
    curves: pd.DataFrame
    """Columns step, failure_free, recovered, deviation (recovered - failure_free)."""


def _number(data: Mapping[str, Any], key: str, where: str = "drill.json") -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DrillError(f"{where}: {key} must be a number, got {value!r}; "
                         "re-run `python -m profiler drill` to rewrite it")
    return float(value)


def read_drill(data: Mapping[str, Any] | None) -> Drill:
    """Validate a parsed drill.json (``Trace.drill``)."""
    if data is None:
        raise DrillError("this trace has no drill.json: run `python -m profiler drill` "
                         "to measure recovery fidelity and add it")
    for key in ("failure_steps", "recovery_seconds", "final_metric", "curves"):
        if key not in data:
            raise DrillError(f"drill.json: missing {key!r}")
    metric, curves = data["final_metric"], data["curves"]
    if not isinstance(metric, Mapping) or not isinstance(curves, Mapping):
        raise DrillError("drill.json: final_metric and curves must be objects")
    try:
        frame = pd.DataFrame({k: np.asarray(curves[k], dtype=np.float64)
                              for k in ("step", "failure_free", "recovered")})
    except KeyError as exc:
        raise DrillError(f"drill.json: curves needs step, failure_free, recovered (missing {exc})") from None
    except (ValueError, TypeError) as exc:
        raise DrillError(f"drill.json: curves must be equal-length lists of numbers ({exc})") from None
    frame["deviation"] = frame["recovered"] - frame["failure_free"]
    return Drill(failure_steps=[int(s) for s in data["failure_steps"]],
                 recovery_seconds=[float(s) for s in data["recovery_seconds"]],
                 max_abs_loss_deviation=_number(data, "max_abs_loss_deviation"),
                 max_rel_loss_deviation=_number(data, "max_rel_loss_deviation"),
                 metric_name=str(metric.get("name", "metric")),
                 metric_failure_free=_number(metric, "failure_free", "drill.json final_metric"),
                 metric_recovered=_number(metric, "recovered", "drill.json final_metric"),
                 curves=frame)


def deviation_in(drill: Drill, first: float, last: float) -> dict[str, float]:
    """Largest absolute and relative loss deviation over steps ``first..last``,
    computed from the curves (NaN when the window holds no point)."""
    c = drill.curves
    part = c[(c["step"] >= first) & (c["step"] <= last)]
    if part.empty:
        return {"max_abs": math.nan, "max_rel": math.nan, "points": 0}
    abs_dev = part["deviation"].abs()
    rel = abs_dev / part["failure_free"].abs().replace(0, np.nan)
    return {"max_abs": float(abs_dev.max()), "max_rel": float(rel.max()), "points": len(part)}


def curves_figure(drill: Drill, *, show_deviation: bool = False) -> go.Figure:
    """The two loss curves (or their difference) with the injected failures marked."""
    c = drill.curves
    fig = go.Figure()
    if show_deviation:
        fig.add_scatter(x=c["step"], y=c["deviation"], name="recovered - failure-free", mode="lines")
        fig.update_layout(yaxis_title="loss difference")
    else:
        fig.add_scatter(x=c["step"], y=c["failure_free"], name="failure-free", mode="lines")
        fig.add_scatter(x=c["step"], y=c["recovered"], name="recovered", mode="lines",
                        line=dict(dash="dot"))
        fig.update_layout(yaxis_title="training loss")
    for step in drill.failure_steps:
        fig.add_vline(x=step, line=dict(color="red", dash="dash"), annotation_text="failure")
    fig.update_layout(title="Loss: failure-free run vs run recovered from LayerCheck's composite",
                      xaxis_title="step", height=380, margin=dict(t=50, b=40),
                      legend=dict(orientation="h", y=-0.2))
    return charts.tidy(fig)
