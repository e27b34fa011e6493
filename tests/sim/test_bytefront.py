"""sim.bytefront: each strategy's front of ratio against durable bytes, and the best under a
budget: at every budget, the best setting that writes at most that much."""
from __future__ import annotations

import numpy as np
import pytest

from sim import CostModel, Scenario
from sim.bytefront import best_by_budget, front_table
from sim.fair import compare

from .conftest import small_workload


@pytest.fixture(scope="module")
def result():
    scenario = Scenario(name="small", workload=small_workload(steps=200), window_s=86400.0,
                        costs=CostModel.paper_a100(save_gbps=2.0, persist_gbps=2.0, peer_gbps=3.0))
    return compare(scenario, mtbf_s=900.0, strategies=["deepspeed", "checkfreq", "gemini"], seeds=2)


def test_a_front_point_has_no_setting_of_its_strategy_with_as_few_bytes_and_more_ratio(result):
    table = front_table(result)
    for row in table.to_dict("records"):
        same = table[table["strategy"] == row["strategy"]]
        beaten = ((same["job_bytes"] <= row["job_bytes"])
                  & (same["effective_ratio"] > row["effective_ratio"])).any()
        twins = ((same["job_bytes"] == row["job_bytes"])
                 & (same["effective_ratio"] == row["effective_ratio"])).sum() > 1
        assert (not beaten) if row["front"] else (beaten or twins), row
    assert table["front"].sum() < len(table)


def test_the_best_under_every_budget_is_the_brute_force_best(result):
    table = front_table(result)
    ranges = best_by_budget(result)
    for budget in np.unique(table["job_bytes"]):
        fits = table[(table["job_bytes"] <= budget) & table["strategy"].isin(
            ["deepspeed", "checkfreq", "gemini"])]
        if fits.empty:
            continue
        best = fits["effective_ratio"].max()
        [r] = [r for r in ranges if r["from_bytes"] <= budget
               and (r["to_bytes"] is None or budget < r["to_bytes"])]
        assert r["effective_ratio"] == pytest.approx(best)
