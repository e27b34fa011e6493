"""sim.verdict: the winner and its paired margin; the band ends and the ends of phi's interval
that put another strategy first."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from layercheck.contract.calibration import Figure
from sim import CostModel, Scenario
from sim.budgets import Budgets
from sim.fair import COLUMNS, FIELD_COLUMNS, FairResult, compare
from sim.settings import Setting
from sim.verdict import judge

from .conftest import small_workload


@pytest.fixture(scope="module")
def close_race():
    """DeepSpeed just ahead of CheckFreq, whose persist is slow: a faster persist puts
    CheckFreq first, a slower save takes DeepSpeed back (it touches only DeepSpeed)."""
    costs = CostModel.paper_a100(save_gbps=1.0, persist_gbps=0.1, snapshot_gbps=20.0,
                                 restart_s=5.0)
    scenario = Scenario.custom(iteration_s=1.0, iterations=2000, checkpoint_gb=20.0, costs=costs,
                               window_s=2 * 86400.0)
    return compare(dataclasses.replace(scenario, costs=costs), mtbf_s=1800.0,
                   strategies=["deepspeed", "checkfreq"], seeds=4)


def test_the_winner_and_its_margin_paired_over_the_seeds(close_race):
    verdict = judge(close_race, bands=False, fresh=False)
    ratios = close_race.ratios(close_race.scenario.stale_figure().value)
    best = close_race.best_rows()
    diff = ratios[best["deepspeed"]] - ratios[best["checkfreq"]]
    assert verdict.winner == "deepspeed" and verdict.runner_up == "checkfreq"
    assert verdict.margin == pytest.approx(diff.mean())
    assert verdict.margin_ci95 == pytest.approx(
        stats.t.ppf(0.975, diff.size - 1) * diff.std(ddof=1) / math.sqrt(diff.size))


def test_band_ends_that_move_the_leader_are_named(close_race):
    verdict = judge(close_race, fresh=False)
    flips = {(f.figure, f.end): f for f in verdict.flips}
    assert flips[("persist_gbps", "high")].leader == "checkfreq"
    assert flips[("save_gbps", "low")].leader == "checkfreq"
    # a save 3x slower touches only DeepSpeed: CheckFreq's ratio there is its point's
    assert flips[("save_gbps", "low")].ratio == pytest.approx(verdict.check["ratios"]["checkfreq"])
    assert ("save_gbps", "high") not in flips and ("restart_s", "low") not in flips
    assert not verdict.robust and "persist_gbps at its high end" in verdict.text()
    # each flip names what it displaces: the band check's own leader at the cost model's values
    leader0 = verdict.check["leader"]
    assert {f.against for f in verdict.flips if f.figure != "stale_cost"} == {leader0}
    flip = flips[("persist_gbps", "high")]
    assert f"against {leader0}'s {flip.winner_ratio:.4f}" in verdict.text()


def hand_made(phi: Figure, ratios: dict[str, list[tuple[float, float]]]) -> FairResult:
    """A comparison whose settings (per strategy, in order) had runs of ``(useful, stale)``
    shares of the window, seed by seed a little apart: phi's arithmetic without a
    simulation."""
    costs = CostModel.paper_a100(stale_cost=phi.value)
    costs = dataclasses.replace(costs, provenance={**costs.provenance, "stale_cost": phi})
    scenario = Scenario(name="hand", workload=small_workload(), costs=costs, window_s=1000.0)
    rows = [(n, k, u, s) for n, settings in ratios.items() for k, (u, s) in enumerate(settings)]
    noise = np.array([0.0, 0.001, -0.001])
    useful = np.array([[u * 1000 + 1000 * e for e in noise] for _, _, u, _ in rows])
    stale = np.array([[s * 1000] * 3 for *_, s in rows])
    field = pd.DataFrame({c: [0.0] * len(rows) for c in (*FIELD_COLUMNS, *COLUMNS[1:])})
    field["strategy"] = [n for n, *_ in rows]
    field["setting"] = [f"{n} {k}" for n, k, *_ in rows]
    field["origin"], field["exact"], field["within"] = "", True, True
    field["effective_ratio"] = (useful - np.minimum(phi.value * stale, useful)).mean(axis=1) / 1000
    return FairResult(scenario=scenario, protocol="fair", mtbf_s=600.0, seeds=3, window_s=1000.0,
                      budgets=Budgets(), bandwidth=1e9, strategies=tuple(ratios), screened={},
                      field=field, settings=tuple(Setting(strategy=n) for n, *_ in rows),
                      useful=useful, stale=stale, layers=(None,) * len(rows))


def test_an_end_of_phis_interval_that_moves_the_leader_is_named():
    phi = Figure(value=1.0, low=0.0, high=2.0, source="measured", method="a test's")
    result = hand_made(phi, {"deepspeed": [(0.80, 0.0)], "layercheck": [(0.95, 0.10)]})
    verdict = judge(result, bands=False, fresh=False)
    assert verdict.winner == "layercheck" and verdict.ratio == pytest.approx(0.85)
    assert verdict.phi["leader_low"] == "layercheck" and verdict.phi["leader_high"] == "deepspeed"
    [flip] = verdict.flips
    assert (flip.figure, flip.end, flip.leader) == ("stale_cost", "high", "deepspeed")
    assert flip.ratio == pytest.approx(0.80) and flip.winner_ratio == pytest.approx(0.75)
    assert flip.against == "layercheck"


def test_at_an_end_of_phis_interval_each_strategy_chooses_its_best_setting_again():
    phi = Figure(value=1.0, low=0.0, high=2.0, source="measured", method="a test's")
    # layercheck's first setting is its best at phi 1 (0.85), its second at phi 2 (0.83)
    result = hand_made(phi, {"deepspeed": [(0.80, 0.0)],
                             "layercheck": [(0.95, 0.10), (0.83, 0.0)]})
    verdict = judge(result, bands=False, fresh=False)
    assert verdict.winner == "layercheck"
    assert verdict.phi["leader_high"] == "layercheck" and not verdict.flips
    assert verdict.phi["ratios_high"]["layercheck"] == pytest.approx(0.83)


def test_a_phi_without_an_interval_is_not_checked():
    phi = Figure(value=1.0, source="given", method="given for a test")
    verdict = judge(hand_made(phi, {"deepspeed": [(0.80, 0.0)], "layercheck": [(0.95, 0.10)]}),
                    bands=False, fresh=False)
    assert verdict.phi["checked"] is False and not verdict.flips and verdict.robust


def test_fresh_seeds_rate_every_best_setting_again(close_race):
    verdict = judge(close_race, bands=False)
    assert set(verdict.fresh) == {"deepspeed", "checkfreq"}
    assert all(abs(verdict.fresh[n] - verdict.ratio) < 0.2 for n in verdict.fresh)
    assert verdict.to_dict()["fresh"] == verdict.fresh
