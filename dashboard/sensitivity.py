"""The Failures page's "What the ranking hangs on": tornadoes over ``sim.sensitivity``. Pure
functions of a ``Sensitivity`` (no Streamlit), so they are tested without a browser."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from sim.sensitivity import Sensitivity
from . import charts

__all__ = ["tornado_figure", "flips_frame", "bands_frame"]


def tornado_figure(result: Sensitivity, strategy: str) -> go.Figure:
    """One strategy's tornado: a bar per varied figure from its ratio at one end of the band
    to the other, widest swing on top, and the point ratio as a line."""
    df = result.frame()
    if strategy not in result.point:
        raise ValueError(f"{strategy!r} was not simulated; one of {', '.join(result.point)}")
    rows = df[df["strategy"] == strategy].sort_values("swing")
    point = result.point[strategy]
    fig = go.Figure()
    for end, colour in (("at_low", "#4c78a8"), ("at_high", "#f58518")):
        fig.add_bar(y=rows["figure"], x=rows[end] - point, base=point, orientation="h",
                    name=f"figure at its {end[3:]} end", marker_color=colour,
                    customdata=rows["band"], hovertemplate=(
                        "%{y}: band %{customdata}<br>ratio %{x:+.3f} from the point<extra></extra>"))
    fig.add_vline(x=point, line_dash="dash", annotation_text=f"{strategy} {point:.3f}")
    fig.update_layout(barmode="overlay", title=f"{result.scenario}: {strategy}'s effective ratio "
                      "across each figure's band", xaxis_title="effective ratio",
                      height=max(300, 24 * len(rows) + 120), legend_orientation="h")
    return charts.tidy(fig)


def flips_frame(result: Sensitivity) -> pd.DataFrame:
    """The figures that change which strategy ranks first: figure, end, value, new leader."""
    return pd.DataFrame(result.flips(), columns=["figure", "end", "value", "leader", "ratio"])


def bands_frame(result: Sensitivity) -> pd.DataFrame:
    """Each varied figure with its source, value, band and the band's reason."""
    return pd.DataFrame([{k: r[k] for k in ("figure", "source", "value", "low", "high", "reason")}
                         for r in result.rows],
                        columns=["figure", "source", "value", "low", "high", "reason"])
