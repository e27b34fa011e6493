"""dashboard.mtbf over the simulator."""
from __future__ import annotations

import dataclasses

import numpy as np

from dashboard import mtbf, whatif
from sim.calibrated import FIGURES
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
    assert any(t.name == "this MTBF (0.5 h)" for t in mtbf.curves_figure(frame, 1800).data)


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


def test_phi_in_the_failures_numbers(trace):
    """The breakdown counts phi x stale_s as lost once (the rest is in useful compute), the
    threshold table carries the ratio at phi's bounds, and the notes name phi and say when
    the first strategy depends on it."""
    from layercheck.contract.calibration import Figure
    paper = preset_calibration("llama-3.2-1b")
    record = Figure(value=0.5, low=0.0, high=1.0, source="measured", method="a test's")
    costs = mtbf.cost_model(dataclasses.replace(trace, costs=dataclasses.replace(
        paper, figures={**paper.figures, "stale_cost": record})), mtbf.TRACE_COSTS)
    scenario = mtbf.scenario_for(trace, costs=costs)
    table = mtbf.strategies_table(scenario, mtbf_s=600, seeds=2, window_s=DAY)
    used = table[list(mtbf.PARTS)].sum(axis=1)
    assert (used <= DAY * (1 + 1e-12)).all()
    lc = table.set_index("strategy").loc["layercheck"]
    assert lc.stale_lost_s == 0.5 * lc.stale_s and lc.ratio_at_phi_low > lc.ratio_at_phi_high
    line, note = mtbf.stale_notes(scenario, table)
    assert line == "stale cost phi: 0.5 (interval 0..1); measured: a test's"
    flipped = table.assign(ratio_at_phi_low=np.where(table.strategy == "none", 1.0,
                                                     table.ratio_at_phi_low))
    assert mtbf.stale_notes(scenario, flipped)[1].startswith(
        "the ranking depends on phi: first at phi 0 (low) is none")
    assert mtbf.costs_frame(costs).set_index("figure").loc["stale_cost", "interval"] == "0..1"
    settings = whatif.Settings.from_trace(trace)
    by_k = mtbf.threshold_table(trace, scenario, settings, [1e-3], mtbf_s=600, seeds=2, window_s=DAY)
    assert by_k.loc[0, "ratio_at_phi_low"] > by_k.loc[0, "effective_ratio"] > by_k.loc[0, "ratio_at_phi_high"]
