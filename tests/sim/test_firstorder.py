"""The first-order closed form (sim.firstorder) against the simulator and by hand."""
import dataclasses
import math

import pytest

from sim import Scenario, simulate
from sim.errors import SimError
from sim.firstorder import first_order
from sim.strategies import PROTOCOLS

STRATEGIES = ("layercheck", "layercheck-sync", "lowdiff", "gemini", "checkfreq", "deepspeed")
TOLERANCE = {1800.0: 0.015, 7200.0: 0.005}
"""|closed form - simulator| on the Qwen2.5-7B preset, 10 seeds x 30 days (95% bands of
0.001-0.016). At 0.5 h the rollback strategies' 106-step segments (662 s) are a third of
the MTBF, so the terms the closed form leaves out (failures during recoveries, the
exponential's shape within a segment) are worth up to 0.013 (CheckFreq); at 2 h they
shrink below the simulator's own noise."""


@pytest.mark.parametrize("mtbf", sorted(TOLERANCE))
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_closed_form_explains_the_simulator(protocol, mtbf):
    scenario = Scenario.from_preset("qwen2.5-7b", protocol=protocol)
    phi = scenario.stale_figure().value
    counted = simulate(scenario, mtbf_s=mtbf, strategies=list(STRATEGIES), seeds=10)
    useful = simulate(dataclasses.replace(scenario, stale_cost=0.0), mtbf_s=mtbf,
                      strategies=list(STRATEGIES), seeds=10)
    for strategy in STRATEGIES:
        terms = first_order(scenario.schedule(strategy, mtbf), mtbf)
        sim_phi = counted.set_index("strategy").loc[strategy, "effective_ratio"]
        sim_0 = useful.set_index("strategy").loc[strategy, "effective_ratio"]
        assert terms.ratio(0.0) == pytest.approx(sim_0, abs=TOLERANCE[mtbf]), strategy
        assert terms.ratio(phi) == pytest.approx(sim_phi, abs=TOLERANCE[mtbf]), strategy


def test_a_synchronous_periodic_checkpoint_by_hand():
    """DeepSpeed every k steps of c s, a save of C s: failures strike uniformly when M is
    long, so s = C / (k c + C), W = (k c + C) / 2 (the segment from the last resume) and R
    the restart plus the load; the ratio tends to the exact renewal form (sim.theory)."""
    from sim.theory import periodic_ratio
    scenario = Scenario.custom(iteration_s=6.0, iterations=600, checkpoint_gb=100.0,
                               checkpoint_s=60.0, interval=50)
    costs, m = scenario.costs, 1e7
    terms = first_order(scenario.schedule("deepspeed", m), m)
    checkpoints = len(range(50, 600, 50))
    assert terms.stall_share == pytest.approx(checkpoints * 60 / (600 * 6 + checkpoints * 60))
    # 11 segments of 50 x 6 s + 60 s, then the last 50 steps (the job's end commits them)
    segments = [360.0] * checkpoints + [300.0]
    expected_w = sum(s * s / 2 for s in segments) / sum(segments)
    assert terms.rework_s == pytest.approx(expected_w, rel=2e-3)
    load = costs.restart_s + costs.load_s(100e9)
    assert terms.recovery_s == pytest.approx((sum(segments[1:]) * load + 360 * costs.restart_s)
                                             / sum(segments), rel=2e-3)
    assert terms.stale_s == 0.0
    # the first segment resumes at the job's start (restart only, no checkpoint to load)
    assert terms.start_share == pytest.approx(360 / sum(segments), rel=2e-3)
    assert terms.start_rework_s == pytest.approx(180.0, rel=2e-3)
    exact = periodic_ratio(step_s=6.0, steps=600, interval=50, checkpoint_s=60.0,
                           restart_s=load, mtbf_s=m)
    assert terms.ratio() == pytest.approx(exact, abs=1e-4)


def test_layercheck_stale_term_and_the_clamp_at_zero():
    """S is counted at phi; a phi large enough to lose more than the run trains gives 0,
    as the simulator does (it never trains backwards)."""
    scenario = Scenario.from_preset("qwen2.5-7b")
    terms = first_order(scenario.schedule("layercheck", 1800.0), 1800.0)
    assert terms.stale_s > 0
    assert terms.ratio(1.0) == pytest.approx(terms.ratio(0.0) - terms.stale_s / 1800.0)
    assert terms.ratio(1e3) == 0.0
    assert first_order(scenario.schedule("gemini", 1800.0), 1800.0).stale_s == 0.0


def test_layercheck_loses_most_before_its_base_checkpoint():
    """docs/sim-paper.md's warm-up term: about a sixth of LayerCheck's failures at 0.5 h strike a
    job before its base checkpoint (step 200) and throw away about 600 s each; the rest
    lose under one step (6.25 s)."""
    scenario = Scenario.from_preset("qwen2.5-7b")
    for strategy in ("layercheck", "layercheck-sync"):
        t = first_order(scenario.schedule(strategy, 1800.0), 1800.0)
        assert 0.15 < t.start_share < 0.19 and 550 < t.start_rework_s < 650
        rest = (t.rework_s - t.start_share * t.start_rework_s) / (1 - t.start_share)
        assert 0 < rest < 6.25


@pytest.mark.parametrize("mtbf", [0.0, -1.0, math.inf, math.nan, "1h"])
def test_a_bad_mtbf_says_what_to_give(mtbf):
    scenario = Scenario.from_preset("llama-3.2-1b")
    with pytest.raises(SimError, match="positive number of seconds"):
        first_order(scenario.schedule("deepspeed", 1800.0), mtbf)
