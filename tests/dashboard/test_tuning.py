"""dashboard.tuning: the frontier figure and tables over sim.frontier and sim.tuning."""
from __future__ import annotations

import numpy as np

from dashboard import tuning, whatif
from sim.api import Scenario
from sim.costs import CostModel
from sim.tuning import Budgets


def test_frontier_figure_marks_front_current_default_and_recommendation(trace):
    scenario = Scenario.from_trace(trace, costs=CostModel.paper_a100(), window_s=86400.0)
    result = tuning.frontier(trace, scenario)
    table = tuning.rate_front(result, scenario, mtbf_s=3600.0, seeds=2, window_s=86400.0)
    rated = table["effective_ratio"].notna().to_numpy()
    assert (rated == (table["pareto"] | (table["role"] == "paper default")).to_numpy()).all()
    settings = whatif.Settings.from_trace(trace)
    current = whatif.outcome(trace, whatif.replay_trace(trace, settings), settings)
    advice = tuning.advise(trace, scenario, result, Budgets(max_staleness=60), mtbf_s=3600.0,
                           seeds=2, window_s=86400.0)
    fig = tuning.frontier_figure(table, current, advice.best)
    names = [t.name for t in fig.data]
    assert names == ["grid settings", "Pareto front", "current setting (sidebar)",
                     "paper's default", "recommended"]
    front = fig.data[1]
    np.testing.assert_array_equal(front.customdata, tuning.front_frame(table).index)
    assert fig.data[1].marker.showscale                  # coloured by the ratio
    assert tuning.recommendation_frame(advice)["setting"].tolist() == [
        "recommended", "paper default", "recorded"]


def test_a_row_becomes_slider_values(trace):
    scenario = Scenario.from_trace(trace, costs=CostModel.paper_a100())
    table = tuning.frontier(trace, scenario).table
    row = int(np.flatnonzero(table["pareto"])[0])
    values = tuning.slider_values(tuning.settings_for(table, row))
    assert values["k_base"] == table.loc[row, "base_threshold"]
    assert values["smax"] == table.loc[row, "smax"] and values["budget_on"] is False


def test_form_zeroes_mean_no_budget():
    assert tuning.budgets_from_form(0, 0, 0) == Budgets()
    assert tuning.budgets_from_form(500, 100, 5) == Budgets(max_bytes=500e9, max_staleness=100,
                                                            max_write_share=0.05)
