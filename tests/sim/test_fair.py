"""sim.fair: every strategy at its own best setting within the budgets, on the same failures."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from sim import CostModel, Scenario
from sim.budgets import Budgets
from sim.errors import SimError
from sim.fair import compare, fixed
from sim.frontier import rate
from sim.presets import preset_trace
from sim.settings import layercheck_grid

from .conftest import small_workload

BASELINES = ["deepspeed", "checkfreq", "gemini", "lowdiff"]


def small_scenario(seed: int, costs: CostModel, protocol: str = "matched") -> Scenario:
    return Scenario(name="small", workload=small_workload(seed, steps=120), costs=costs,
                    protocol=protocol, window_s=86400.0, seed=seed)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 50), write=st.floats(0.5, 20.0), peer=st.floats(0.5, 20.0),
       mtbf=st.floats(120.0, 3600.0), restart=st.floats(0.0, 60.0))
def test_the_fair_protocol_never_scores_a_baseline_below_its_matched_or_native_ratio(
        seed, write, peer, mtbf, restart):
    costs = CostModel.paper_a100(save_gbps=write, persist_gbps=write, peer_gbps=peer,
                                 restart_s=restart)
    fair = compare(small_scenario(seed, costs), mtbf_s=mtbf, strategies=BASELINES, seeds=2)
    best = dict(zip(fair.table()["strategy"], fair.table()["effective_ratio"]))
    for protocol in ("matched", "native"):
        rule = fixed(small_scenario(seed, costs, protocol), mtbf_s=mtbf, strategies=BASELINES,
                     seeds=2).table()
        for name, ratio in zip(rule["strategy"], rule["effective_ratio"]):
            assert best[name] >= ratio - 1e-12, (protocol, name, best[name], ratio)


def test_fixed_is_simulates_table():
    from sim.api import simulate
    scenario = small_scenario(3, CostModel.paper_a100(save_gbps=2.0))
    ours = fixed(scenario, mtbf_s=600.0, seeds=3).table()
    theirs = simulate(scenario, mtbf_s=600.0, seeds=3)
    np.testing.assert_array_equal(ours["effective_ratio"].to_numpy(),
                                  theirs["effective_ratio"].to_numpy())


def test_budgets_choose_among_the_settings_that_meet_them():
    scenario = small_scenario(1, CostModel.paper_a100(save_gbps=2.0))
    free = compare(scenario, mtbf_s=600.0, strategies=["deepspeed", "gemini"], seeds=2)
    rows = free.best_rows()
    job = free.field.at[rows["deepspeed"], "job_bytes"]
    tight = compare(scenario, mtbf_s=600.0, strategies=["deepspeed", "gemini"], seeds=2,
                    budgets=Budgets(max_bytes=job / 2, max_host_bytes=30e9))
    chosen = tight.best_rows()
    assert tight.field.at[chosen["deepspeed"], "job_bytes"] <= job / 2
    for result in (free, tight):              # the best is the highest of those that meet them
        mine = result.field[(result.field["strategy"] == "deepspeed") & result.field["within"]]
        best = result.best_rows()["deepspeed"]
        assert result.field.at[best, "effective_ratio"] == mine["effective_ratio"].max()
    assert free.field[free.field["strategy"] == "deepspeed"]["effective_ratio"].nunique() > 1
    assert chosen["gemini"] is None          # its two full copies, 40 GB, in host memory
    assert tight.table().set_index("strategy").at["gemini", "setting"] == "none within the budgets"


def test_an_interval_override_is_refused_with_the_fix():
    scenario = dataclasses.replace(small_scenario(1, CostModel.paper_a100()), interval=10)
    with pytest.raises(SimError, match="--protocol matched or native"):
        compare(scenario, mtbf_s=600.0, strategies=["deepspeed"], seeds=2)


@pytest.fixture(scope="module")
def preset():
    return Scenario.from_preset("qwen2.5-7b", window_s=86400.0)


@pytest.fixture(scope="module")
def searched(preset):
    return compare(preset, mtbf_s=1800.0, strategies=["layercheck"], seeds=2)


def test_layercheck_searches_smax_below_the_papers_and_beats_its_recorded_setting(preset, searched):
    grid, refs = layercheck_grid(preset.workload.trace)
    assert min(grid.smax) < 100 and max(grid.smax) == 1000
    result = searched
    field = result.field
    recorded = field.index[field["origin"].str.contains("recorded")][0]
    best = result.best_rows()["layercheck"]
    assert field.at[best, "effective_ratio"] >= field.at[recorded, "effective_ratio"]
    assert result.screened["layercheck"] > field["exact"].sum()


def test_an_exact_layercheck_rating_is_the_tuners_on_the_same_failures(preset, searched):
    from sim.frontier import evaluate
    result = searched
    row = result.best_rows()["layercheck"]
    trace = preset.workload.trace
    config = result.settings[row].config
    ev = evaluate(trace, [config])
    ours = rate(ev, preset, rows=[0], mtbf_s=1800.0, seeds=2)["effective_ratio"].iloc[0]
    assert ours == pytest.approx(result.field.at[row, "effective_ratio"], rel=1e-9)
