"""dashboard.mtbf over the simulator."""
from __future__ import annotations

import dataclasses

import numpy as np

from dashboard import mtbf, whatif
from layercheck.calibration import FIGURES
from sim.presets import preset_calibration

DAY = 86400.0


def test_tables_and_figures(trace):
    scenario = mtbf.scenario_for(trace)
    table = mtbf.strategies_table(scenario, mtbf_s=1800, seeds=2, window_s=DAY)
    assert "layercheck" in set(table["strategy"])
    assert [b.name for b in mtbf.breakdown_figure(table, DAY).data] == [*mtbf.PARTS.values(),
                                                                        "other (idle, partial)"]
    frame = mtbf.curves(scenario, mtbf_s=[600, 7200], seeds=2, window_s=DAY)
    assert "limit" in set(frame["strategy"])
    assert mtbf.curves_figure(frame, 1800).data[-1].name == "this MTBF"


def test_cost_models_and_their_sources(trace):
    assert mtbf.cost_options(trace) == ["paper-a100"]           # no costs.json
    with_costs = dataclasses.replace(trace, costs=preset_calibration("llama-3.2-1b"))
    assert mtbf.cost_options(with_costs)[0] == mtbf.TRACE_COSTS
    costs = mtbf.cost_model(with_costs, mtbf.TRACE_COSTS)
    assert mtbf.scenario_for(with_costs).costs == costs
    frame = mtbf.costs_frame(costs)
    assert list(frame["figure"]) == list(FIGURES)
    assert frame.set_index("figure").loc["diff_fraction", "source"] == "derived"


def test_threshold_table_replays_each_threshold(trace):
    settings = whatif.Settings.from_trace(trace)
    out = mtbf.threshold_table(trace, mtbf.scenario_for(trace), settings, [1e-4, 1e-3, 1e-1],
                               mtbf_s=1800, seeds=2, window_s=DAY)
    assert out["layer_writes"].is_monotonic_decreasing
    assert out["best"].sum() >= 1
    same = mtbf.replayed_trace(trace, settings)
    np.testing.assert_array_equal(same.write_matrix(), trace.write_matrix())
