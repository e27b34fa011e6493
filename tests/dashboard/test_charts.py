"""Figures that read: log axes ticked at 1-2-5 with units, no bars on a log axis, every
mark named in the legend (or grouped with a mark that is), margins that fit labels."""
from __future__ import annotations

import plotly.graph_objects as go
import pytest

from dashboard import charts, driftmap, mtbf, scale, whatif
from sim import CostModel, Scenario
from sim.fair import compare

DAY = 86400.0


def readable(fig: go.Figure) -> None:
    """Assert the dashboard's rules for one figure."""
    layout = fig.layout.to_plotly_json()
    logs = {name for name, axis in layout.items()
            if name[1:5] == "axis" and isinstance(axis, dict) and axis.get("type") == "log"}
    for name in logs:
        axis = layout[name]
        assert axis.get("tickvals") is not None and len(axis["tickvals"]) >= 2, name
        assert all(str(t).strip() for t in axis["ticktext"]), name
        assert axis.get("minor", {}).get("ticks", "") == "", name
    for name in [n for n in layout if n[1:5] == "axis"]:
        assert layout[name].get("automargin") is True, name
    shown = {t.legendgroup for t in fig.data if t.showlegend is not False and t.legendgroup}
    for t in fig.data:
        if t.type == "heatmap":
            continue
        if t.type == "bar":
            axis = "yaxis" if t.orientation != "h" else "xaxis"      # the value axis
            assert axis not in logs, f"bars of {t.name!r} on a log axis"
        if t.showlegend is False:
            assert t.legendgroup in shown, f"{t.name!r} has no legend entry"
        else:
            assert t.name, "a mark without a name in the legend"


def test_log_ticks_carry_the_unit_at_one_two_five():
    ticks, text = charts.log_ticks([0.01, 10.0], "h")
    assert ticks[:3] == [0.01, 0.02, 0.05] or ticks[:2] == [0.01, 0.03]
    assert all(label.endswith(" h") for label in text)
    ticks, text = charts.log_ticks([8, 16384], "GPUs", most=9)
    assert len(ticks) <= 9 and text[0] == "10 GPUs"
    assert charts.log_ticks([1e-5, 0.1])[1][0] == "1e-5"


def test_the_drift_and_whatif_figures_read(trace):
    readable(driftmap.rates_figure(driftmap.rates_frame(trace)))
    readable(driftmap.heatmap_figure(trace))
    settings = whatif.Settings.from_trace(trace)
    replayed = whatif.replay_trace(trace, settings)
    for fig in (whatif.io_figure(trace, replayed, settings), whatif.staleness_figure(trace, replayed),
                whatif.writes_figure(trace, replayed)):
        readable(fig)


def test_the_failures_figures_read(trace):
    scenario = mtbf.scenario_for(trace)
    frame = mtbf.curves(scenario, mtbf_s=[600, 7200], seeds=2, window_s=DAY)
    fig = mtbf.curves_figure(frame, 1800)
    readable(fig)
    assert any(t.name == "shaded: 95% band over seeds" for t in fig.data)
    table = mtbf.threshold_table(trace, scenario, whatif.Settings.from_trace(trace), [1e-4, 1e-2],
                                 mtbf_s=1800, seeds=2, window_s=DAY)
    readable(mtbf.threshold_figure(table))
    readable(mtbf.breakdown_figure(mtbf.strategies_table(scenario, mtbf_s=1800, seeds=2,
                                                         window_s=DAY), DAY))


def test_the_scale_and_verdict_figures_read(trace):
    from dashboard import verdict
    frame = scale.curve(Scenario.from_preset("llama-3.2-1b", window_s=DAY),
                        scale.model_for(spares=None, no_spare="wait", node_mtbf_days=30.0,
                                        aggregate_gbps=2000.0), low=8, high=64, seeds=2)
    readable(scale.curve_figure(frame))
    readable(scale.where_figure(frame, 64, DAY))
    result = compare(mtbf.scenario_for(trace, costs=CostModel.paper_a100()), mtbf_s=1800.0,
                     seeds=2, window_s=DAY, front=True, strategies=["deepspeed", "checkfreq"])
    readable(verdict.frontier_figure(result))


@pytest.mark.parametrize("bad", ["log bars", "unnamed"])
def test_the_checker_catches_what_it_forbids(bad):
    fig = go.Figure()
    if bad == "log bars":
        fig.add_bar(x=["a", "b"], y=[90e-6, 160e-6], name="rate")
        charts.log_axis(fig, "y", [90e-6, 160e-6])
    else:
        fig.add_scatter(x=[1, 2], y=[1, 2], mode="markers", showlegend=False)
    with pytest.raises(AssertionError):
        readable(charts.tidy(fig))
