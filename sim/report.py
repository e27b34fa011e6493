"""Results as a text table, JSON, CSV, and a Plotly figure."""
from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from .api import COLUMNS, LIMIT

__all__ = ["table", "to_json", "to_csv", "figure"]


def table(df: pd.DataFrame) -> str:
    """A fixed-width table: ratio +- ci95, then where the time went (hours per run)."""
    head = (f"{'strategy':<11} {'ratio':>7} {'+-95%':>7} {'useful h':>9} {'stall h':>8} "
            f"{'lost h':>8} {'recov h':>8} {'failures':>9} {'written TB':>11} {'interval':>9}")
    lines = [head, "-" * len(head)]
    for row in df.itertuples(index=False):
        ci = "" if row.ci95 is None or math.isnan(row.ci95) else f"{row.ci95:.4f}"
        interval = "" if row.interval is None or pd.isna(row.interval) else str(int(row.interval))
        lines.append(f"{row.strategy:<11} {row.effective_ratio:>7.4f} {ci:>7} "
                     f"{row.useful_s / 3600:>9.1f} {row.checkpoint_stall_s / 3600:>8.1f} "
                     f"{row.lost_work_s / 3600:>8.1f} {row.recovery_s / 3600:>8.1f} "
                     f"{row.failures:>9.1f} {row.bytes_written / 1e12:>11.2f} {interval:>9}")
    return "\n".join(lines)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def rows(df: pd.DataFrame, *, extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """JSON rows with exactly ``extra`` + ``COLUMNS`` keys (NaN -> null)."""
    keys = [*extra, *COLUMNS]
    return [{k: _clean(r[k]) for k in keys} for r in df.to_dict("records")]


def to_json(df: pd.DataFrame, scenario: dict[str, Any], *, extra: tuple[str, ...] = ()) -> str:
    return json.dumps({"rows": rows(df, extra=extra), "scenario": scenario}, indent=2,
                      default=str)


def to_csv(df: pd.DataFrame, *, extra: tuple[str, ...] = ()) -> str:
    return df[[*extra, *COLUMNS]].to_csv(index=False)


def figure(df: pd.DataFrame, *, title: str | None = None):
    """Effective ratio against MTBF (hours, log axis), one line per strategy with a 95%
    band, the perfect checkpointer ('limit') dashed black."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    fig = go.Figure()
    for i, (name, group) in enumerate(df.groupby("strategy", sort=False)):
        group = group.sort_values("mtbf_s")
        x, y = group["mtbf_s"] / 3600.0, group["effective_ratio"]
        ci = group["ci95"].fillna(0.0)
        if name == LIMIT:
            fig.add_trace(go.Scatter(x=x, y=y, name="limit (perfect checkpointer)", mode="lines",
                                     line={"color": "black", "dash": "dash"}))
            continue
        color = qualitative.Plotly[i % len(qualitative.Plotly)]
        fig.add_trace(go.Scatter(x=pd.concat([x, x[::-1]]), y=pd.concat([y + ci, (y - ci)[::-1]]),
                                 fill="toself", fillcolor=color, opacity=0.2, line={"width": 0},
                                 hoverinfo="skip", showlegend=False, legendgroup=name))
        fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers", legendgroup=name,
                                 line={"color": color}))
    fig.update_layout(title=title or "Effective training time ratio vs MTBF",
                      xaxis_title="MTBF (hours)", yaxis_title="effective training time ratio",
                      xaxis_type="log", yaxis_range=[0, 1.02], template="plotly_white")
    return fig
