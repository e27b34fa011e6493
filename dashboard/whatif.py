"""What-if tuning (view 2): re-decide a trace's run under other policy settings.

Pure functions: ``Settings`` -> ``layercheck.contract.policy.Policy`` -> ``fast_replay``
-> ``Outcome`` (numbers) and Plotly figures. No Streamlit here.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from layercheck.contract import decision
from layercheck.contract.config import LayerCheckConfig
from layercheck.contract.decision import lr_ratio, recorded_config
from layercheck.contract.policy import Policy
from layercheck.contract.trace import Trace, last_written

from layercheck.contract.fastreplay import base_step, fast_replay
from layercheck.contract.replayed import REPLAYED_REASONS, Replayed
from . import charts

__all__ = ["Settings", "Outcome", "policy_for", "replay_trace", "outcome", "written_trace_frame",
           "staleness_figure", "io_figure", "writes_figure", "budget_figure", "summary_frame", "GB"]

GB = 1e9


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The knobs of view 2; validated by ``LayerCheckConfig`` (whose errors say the fix)."""

    base_threshold: float = 1e-3
    """K at the peak learning rate for blocks, head and norm (0: every
    opportunity; inf: only when Smax forces)."""
    embedding_threshold: float = 1e-2
    """K at the peak learning rate for embedding layers."""
    smax: int = 1000
    """Staleness guard in steps; must be >= warmup_steps."""
    warmup_steps: int = 200
    """Steps before the base checkpoint."""
    interval: int = 1
    """A checkpoint opportunity every ``interval`` steps."""
    lr_scaling: bool = True
    """Scale thresholds by lr(t) / lr_peak (the paper's rule)."""
    write_budget: float | None = None
    """Budget mode: bytes per step after the base checkpoint (``layercheck.contract.budget``)."""

    def __post_init__(self) -> None:
        self.config()  # raises ConfigError with the fix

    def config(self) -> LayerCheckConfig:
        return LayerCheckConfig(base_threshold=self.base_threshold,
                                embedding_threshold=self.embedding_threshold, smax=self.smax,
                                warmup_steps=self.warmup_steps, interval=self.interval,
                                lr_scaling=self.lr_scaling, write_budget=self.write_budget)

    @classmethod
    def from_trace(cls, trace: Trace) -> "Settings":
        """The settings the trace was recorded with (``layercheck.contract.decision.recorded_config``:
        missing fields at the library's defaults; a config that is not valid raises
        TraceError, never shows the defaults as the recorded settings)."""
        config = recorded_config(trace)
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a setting buys on a trace (bytes in bytes, staleness in steps)."""

    layer_writes: int
    checkpoints: int
    """Steps at which at least one layer is written (the paper's 'checkpoints')."""
    total_bytes: float
    mean_bytes_per_checkpoint: float
    full_total_bytes: float
    """Bytes a full checkpoint at every opportunity would write (DeepSpeed default)."""
    max_staleness: int
    """Largest staleness of any layer after the base checkpoint."""
    peak_weighted_staleness: float
    mean_weighted_staleness: float
    """Parameter-weighted average staleness: its peak and its mean over steps after the base."""
    by_reason: dict[str, int]
    bytes_per_step: float = 0.0
    """Bytes written per step after the base checkpoint (the base not counted, as a
    write budget counts)."""

    @property
    def io_saving(self) -> float:
        """Share of the full-checkpoint bytes not written."""
        return 1.0 - self.total_bytes / self.full_total_bytes if self.full_total_bytes else math.nan


def policy_for(trace: Trace, settings: Settings) -> Policy:
    """The library's Policy of ``settings`` on this trace's layers (kind 'embedding'
    gets the embedding threshold; the per-layer overrides recorded in the trace are
    kept: ``layercheck.contract.decision.policy_for``)."""
    return decision.policy_for(trace, settings.config())


def replay_trace(trace: Trace, settings: Settings) -> Replayed:
    """Every write decision of the trace's run under ``settings``."""
    return fast_replay(policy_for(trace, settings), trace.drift_matrix(), lr_ratio(trace))


def weighted_staleness_series(trace: Trace, writes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max over layers, parameter-weighted mean) staleness per step, NaN before the
    base checkpoint (``layercheck.contract.trace``'s one definition)."""
    weighted = trace.weighted_staleness(writes)
    oldest = (np.arange(1, len(writes) + 1) - last_written(writes).min(axis=1)).astype(np.float64)
    return np.where(np.isnan(weighted), np.nan, oldest), weighted


def outcome(trace: Trace, replayed: Replayed, settings: Settings) -> Outcome:
    """The numbers of view 2 for one replay."""
    writes = replayed.writes
    per_step = writes @ trace.layer_bytes.astype(np.float64)
    checkpoints = int((per_step > 0).sum())
    opportunities = trace.num_steps // settings.interval
    max_s, weighted = weighted_staleness_series(trace, writes)
    defined = ~np.isnan(weighted)
    reasons = replayed.reasons[writes]
    base = base_step(policy_for(trace, settings), trace.num_steps)
    after = trace.num_steps - base if base is not None else 0
    return Outcome(
        layer_writes=int(writes.sum()), checkpoints=checkpoints, total_bytes=float(per_step.sum()),
        mean_bytes_per_checkpoint=float(per_step.sum() / checkpoints) if checkpoints else 0.0,
        full_total_bytes=float(opportunities * trace.full_checkpoint_bytes),
        max_staleness=int(max_s[defined].max()) if defined.any() else 0,
        peak_weighted_staleness=float(weighted[defined].max()) if defined.any() else 0.0,
        mean_weighted_staleness=float(weighted[defined].mean()) if defined.any() else 0.0,
        by_reason={r.label: int((reasons == r).sum()) for r in REPLAYED_REASONS},
        bytes_per_step=float(per_step[base:].sum() / after) if after > 0 else 0.0)


def summary_frame(result: Outcome) -> pd.DataFrame:
    """The outcome as a two-column table (for CSV download)."""
    rows = [("layer writes", result.layer_writes), ("checkpoints", result.checkpoints),
            ("total GB", result.total_bytes / GB),
            ("mean GB per checkpoint", result.mean_bytes_per_checkpoint / GB),
            ("full checkpoints total GB", result.full_total_bytes / GB),
            ("I/O saved vs full", result.io_saving),
            ("max staleness (steps)", result.max_staleness),
            ("peak weighted staleness (steps)", result.peak_weighted_staleness),
            ("mean weighted staleness (steps)", result.mean_weighted_staleness),
            ("bytes per step after the base", result.bytes_per_step),
            *((f"writes by {k}", v) for k, v in result.by_reason.items())]
    return pd.DataFrame(rows, columns=["quantity", "value"])


def written_trace_frame(trace: Trace, replayed: Replayed) -> pd.DataFrame:
    """The replay's writes as rows (step, layer, name, bytes, reason)."""
    step, layer = np.nonzero(replayed.writes)
    names = np.array(trace.layer_names, dtype=object)
    return pd.DataFrame({"step": step + 1, "layer": layer, "name": names[layer],
                         "bytes": trace.layer_bytes[layer],
                         "reason": replayed.labels(step, layer)})


def _bins(n: int, most: int = 1500) -> int:
    return max(1, math.ceil(n / most))


def staleness_figure(trace: Trace, replayed: Replayed) -> go.Figure:
    """Maximum and parameter-weighted average staleness over time."""
    max_s, weighted = weighted_staleness_series(trace, replayed.writes)
    b = _bins(len(max_s))
    steps = np.arange(1, len(max_s) + 1)[::b]
    fig = go.Figure()
    fig.add_scatter(x=steps, y=max_s[::b], name="max over layers", mode="lines")
    fig.add_scatter(x=steps, y=weighted[::b], name="parameter-weighted average", mode="lines")
    fig.update_layout(title="Staleness (steps since each layer's newest saved copy)",
                      xaxis_title="step", yaxis_title="staleness (steps)", height=330,
                      margin=dict(t=50, b=40), legend=dict(orientation="h", y=-0.25))
    return charts.tidy(fig)


def io_figure(trace: Trace, replayed: Replayed, settings: Settings) -> go.Figure:
    """Bytes written per step (binned) against full checkpoints at every opportunity."""
    per_step = replayed.writes @ trace.layer_bytes.astype(np.float64)
    b = _bins(len(per_step), 400)
    n = len(per_step) // b * b
    binned = per_step[:n].reshape(-1, b).sum(axis=1) if n else per_step
    starts = np.arange(len(binned)) * b + 1
    full = trace.full_checkpoint_bytes * b / settings.interval  # opportunities per bin
    fig = go.Figure()
    fig.add_bar(x=starts, y=binned / GB, name="LayerCheck (this setting)")
    fig.add_scatter(x=starts, y=np.full(len(starts), full / GB), name="full checkpoints",
                    mode="lines", line=dict(dash="dash", color="black"))
    fig.update_layout(title=f"I/O over time (GB per {b} step{'s' if b > 1 else ''})",
                      xaxis_title="step", yaxis_title="GB written", yaxis_rangemode="tozero",
                      height=330, margin=dict(t=50, b=40), legend=dict(orientation="h", y=-0.25),
                      bargap=0)
    return charts.tidy(fig)


def writes_figure(trace: Trace, replayed: Replayed) -> go.Figure:
    """Layer writes per layer, split by reason."""
    fig = go.Figure()
    for reason in REPLAYED_REASONS:
        fig.add_bar(x=trace.layer_names, y=(replayed.reasons == reason).sum(axis=0),
                    name=reason.label)
    fig.update_layout(barmode="stack", title="Layer writes per layer", yaxis_title="writes",
                      height=330, margin=dict(t=50, b=40), legend=dict(orientation="h", y=1.12))
    return charts.tidy(fig)


def budget_figure(trace: Trace, replayed: Replayed, settings: Settings) -> go.Figure:
    """Budget mode: bytes written since the base against the budget's allowance, and
    the factor the controller put on every threshold (right axis)."""
    per_step = replayed.writes @ trace.layer_bytes.astype(np.float64)
    base = base_step(policy_for(trace, settings), trace.num_steps) or trace.num_steps
    steps = np.arange(1, trace.num_steps + 1)
    spent = np.where(steps > base, np.cumsum(np.where(steps > base, per_step, 0.0)), np.nan)
    allowance = np.where(steps > base, (steps - base) * (settings.write_budget or 0.0), np.nan)
    b = _bins(len(steps))
    fig = go.Figure()
    fig.add_scatter(x=steps[::b], y=spent[::b] / GB, name="written since the base", mode="lines")
    fig.add_scatter(x=steps[::b], y=allowance[::b] / GB, name="budget x steps", mode="lines",
                    line=dict(dash="dash", color="black"))
    fig.add_scatter(x=steps[::b], y=replayed.k_scales()[::b], name="K factor (right)",
                    mode="lines", yaxis="y2", line=dict(color="grey", width=1))
    fig.update_layout(title="Budget mode: bytes against the budget, and the K factor",
                      xaxis_title="step", yaxis_title="GB since the base checkpoint",
                      yaxis2=dict(title="K factor", overlaying="y", side="right"),
                      height=330, margin=dict(t=50, b=40), legend=dict(orientation="h", y=-0.25))
    charts.log_axis(fig, "y2", replayed.k_scales(), "x")
    return charts.tidy(fig)
