"""The Scale page (AppTest) and its figures: it runs, and its settings move the numbers."""
from __future__ import annotations

from test_views import metrics, run

from dashboard import scale
from sim import Scenario
from sim.scale import WHERE

DEFAULTS = {"scale_seeds": 2, "scale_window_d": 1, "scale_gpus": (8, 64),
            "trace_name": "qwen2.5-7b-synthetic"}


def _run(**session):
    return run("scale", **{**DEFAULTS, **session})


def test_scale_page_shows_the_curve_and_where_the_time_goes(traces_dir):
    at = _run()
    frame = at.dataframe[0].value
    assert sorted(frame["GPUs"].unique()) == [8, 16, 32, 64]
    assert "limit" in set(frame["strategy"])
    assert "Best at 64 GPUs" in metrics(at)
    assert len(at.get("plotly_chart")) == 2


def test_a_shorter_node_mtbf_means_more_failures(traces_dir):
    before = metrics(_run())["Failures per run there"]
    after = metrics(_run(scale_node_mtbf_d=2.0))["Failures per run there"]
    assert float(after) > 10 * max(float(before), 0.1)


def test_curve_figure_has_one_trace_per_strategy_and_a_dashed_limit():
    frame = scale.curve(Scenario.from_preset("llama-3.2-1b", window_s=86400.0),
                        scale.model_for(spares=None, no_spare="wait", node_mtbf_days=30.0,
                                        aggregate_gbps=2000.0), low=8, high=16, seeds=2)
    fig = scale.curve_figure(frame)
    assert {t.name for t in fig.data} == set(frame["strategy"])
    assert [t.line.dash for t in fig.data if t.name == "limit"] == ["dash"]
    bars = scale.where_figure(frame, 16, 86400.0)
    assert [t.name for t in bars.data] == list(WHERE.values())
    assert list(bars.data[0].x) == list(frame[frame["gpus"] == 16]["strategy"])
