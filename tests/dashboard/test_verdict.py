"""dashboard.verdict: the frontier figure, the budget ranges, the bill and the prices form,
over a fair comparison of a tiny trace."""
from __future__ import annotations

import numpy as np
import pytest

from dashboard import mtbf, verdict
from sim import CostModel
from sim.budgets import Budgets
from sim.dollars import PRICES, Prices
from sim.fair import compare
from sim.verdict import judge



@pytest.fixture(scope="module")
def result():
    from conftest import make_trace          # tests/dashboard/conftest.py, on the path
    trace = make_trace(steps=200)
    scenario = mtbf.scenario_for(trace, costs=CostModel.paper_a100())
    return compare(scenario, mtbf_s=1800.0, seeds=3, window_s=2 * 86400.0, front=True,
                   strategies=["deepspeed", "checkfreq", "layercheck"])


def test_the_frontier_draws_each_strategys_front_and_the_budget_staircase(result):
    fig = verdict.frontier_figure(result)
    fronts = {t.name for t in fig.data if t.mode == "lines+markers"}
    assert fronts == {"deepspeed", "checkfreq", "layercheck"}
    staircase = [t for t in fig.data if t.name == "best under the budget"]
    assert len(staircase) == 1 and np.all(np.diff(staircase[0].y) >= 0)
    assert fig.layout.xaxis.type == "log"


def test_budget_ranges_are_contiguous_and_their_ratio_rises(result):
    ranges = verdict.budget_frame(result)
    assert len(ranges) >= 1
    assert np.all(np.diff(ranges["effective ratio"]) > 0)
    assert np.allclose(ranges["to TB"].iloc[:-1].to_numpy(), ranges["from TB"].iloc[1:].to_numpy())
    assert np.isnan(ranges["to TB"].iloc[-1])


def test_the_bill_follows_the_prices(result):
    cheap = verdict.bill_frame(result, verdict.prices_from_form(1.0, 8, 0.023, 0.0006, 2))
    dear = verdict.bill_frame(result, verdict.prices_from_form(2.0, 8, 0.023, 0.0006, 2))
    assert np.allclose(dear["usd_gpu"], 2 * cheap["usd_gpu"])
    assert np.allclose(dear["gpu_h_stall"], cheap["gpu_h_stall"])


def test_prices_carry_their_sources_and_a_given_one_says_so():
    frame = verdict.prices_frame(Prices())
    assert set(frame["price"]) == set(PRICES)
    assert (frame["source"] != "given").all()
    given = verdict.prices_frame(verdict.prices_from_form(3.0, 8, 0.023, PRICES["write_usd_per_gb"].value, 2))
    assert given.set_index("price").at["gpu_hour_usd", "source"] == "given"


def test_flips_and_settings_tables(result):
    outcome = judge(result, bands=False, fresh=False)
    assert list(verdict.flips_frame(outcome).columns)[:4] == ["figure", "end", "value", "leader"]
    settings = verdict.settings_frame(result)
    assert list(settings["strategy"]) == ["deepspeed", "checkfreq", "layercheck"]
    assert settings["TB a job"].notna().all()


def test_a_budget_no_setting_meets_leaves_a_strategy_without_a_row(trace):
    scenario = mtbf.scenario_for(trace, costs=CostModel.paper_a100())
    tight = compare(scenario, mtbf_s=1800.0, seeds=2, window_s=86400.0, strategies=["checkfreq"],
                    budgets=Budgets(max_host_bytes=1.0))
    assert tight.table()["setting"].iloc[0] == "none within the budgets"
