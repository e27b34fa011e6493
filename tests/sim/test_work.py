"""sim.workbound: the work bound, one estimate checked before anything is drawn (issue 27, item 11)."""
import dataclasses

import numpy as np
import pytest

from sim import Scenario, simulate, sweep
from sim.errors import SimError
from sim.failures import FailureModel
from sim.workbound import (MAX_FAILURES, MAX_LANE_FAILURES, MAX_RUN_FAILURES, MAX_SIMPY_STEPS,
                           bound_work)

DAY = 86400.0


def _bound(model=FailureModel(), mtbfs=(3600.0,), seeds=10, window_s=30 * DAY, strategies=7,
           engine="fast", mean_step_s=6.0):
    bound_work(model, list(mtbfs), seeds=seeds, window_s=window_s, strategies=strategies,
               engine=engine, mean_step_s=mean_step_s)


@pytest.mark.parametrize("model", [FailureModel(), FailureModel(kind="weibull", shape=0.7),
                                   FailureModel(kind="weibull", shape=0.3)], ids=str)
def test_the_estimate_is_what_runs_draw(model):
    """window/MTBF + (CV^2 - 1)/2: within 5% of the mean count over 300 runs."""
    rng = np.random.default_rng(0)
    counts = [len(model.failure_times(rng, mtbf_s=3600.0, window_s=30 * DAY)) for _ in range(300)]
    expected = model.expected_failures(mtbf_s=3600.0, window_s=30 * DAY)
    assert np.mean(counts) == pytest.approx(expected, rel=0.05)


def test_the_defaults_fit_with_room():
    """The default sweep (0.01h..3h, 20 points, 10 seeds, every strategy) is far inside."""
    _bound(mtbfs=np.geomspace(36.0, 10800.0, 20), strategies=8)
    _bound(engine="simpy", window_s=2 * DAY)


@pytest.mark.parametrize("change,words", [
    (dict(mtbfs=[1e-6]), f"more than the simulator's limit of {MAX_RUN_FAILURES:,} failures per run"),
    (dict(window_s=1e12 * DAY), "shorten the window to at most"),
    (dict(seeds=1_000_000_000), f"limit of {MAX_FAILURES:,} failures in all"),
    (dict(mtbfs=[30.0], seeds=300), f"limit of {MAX_FAILURES:,} held at once"),
    (dict(mtbfs=[30.0], seeds=200, strategies=12), f"limit of {MAX_LANE_FAILURES:,}"),
    (dict(engine="simpy", window_s=3000 * DAY), f"its limit of {MAX_SIMPY_STEPS:,}"),
    (dict(model=FailureModel(kind="weibull", shape=0.01)), "Weibull shape 0.01 spreads the gaps"),
    (dict(model=FailureModel(kind="log", log_times=(1e-9, 2e-9)), mtbfs=[None]),
     "the failure log's mean gap"),
])
def test_each_limit_is_refused_with_the_numbers_and_the_fix(change, words):
    with pytest.raises(SimError, match="docs/sim.md, Work limits") as info:
        _bound(**change)
    assert words in str(info.value)


def test_the_shape_it_names_is_the_least_that_fits():
    with pytest.raises(SimError) as info:
        _bound(model=FailureModel(kind="weibull", shape=0.002), seeds=1, strategies=1)
    least = float(str(info.value).split("use a shape of at least ")[1].split()[0])
    _bound(model=FailureModel(kind="weibull", shape=least), seeds=1, strategies=1)
    with pytest.raises(SimError):
        _bound(model=FailureModel(kind="weibull", shape=least * 0.97), seeds=1, strategies=1)


def test_the_api_refuses_before_drawing():
    """simulate and sweep go through the bound (a 1 us MTBF would otherwise allocate ~10 GB)."""
    scenario = Scenario.from_preset("llama-3.2-1b")
    with pytest.raises(SimError, match="failures per run"):
        simulate(scenario, mtbf_s=1e-6, seeds=1)
    with pytest.raises(SimError, match="failures per run"):
        sweep(scenario, mtbf_s=[1e-6, 3600.0], seeds=1)
    weibull = dataclasses.replace(scenario, failures=FailureModel(kind="weibull", shape=0.002))
    with pytest.raises(SimError, match="Weibull shape 0.002"):
        simulate(weibull, mtbf_s=3600.0, seeds=1)


def test_a_job_of_nodes_is_bounded_by_its_failures_and_its_streams():
    """A job of nodes expects window / job MTBF failures exactly (stationary nodes), and its
    streams (one per 64 nodes a run) are counted over the call's runs."""
    from sim.nodes import NodeFailures
    from sim.workbound import MAX_STREAMS
    model = NodeFailures(nodes=1000, node_law=FailureModel(kind="weibull", shape=0.7),
                         node_mtbf_s=1000 * 3600.0)
    counts = [len(model.failure_times(np.random.default_rng(s), mtbf_s=None, window_s=30 * DAY))
              for s in range(100)]
    assert np.mean(counts) == pytest.approx(model.expected_failures(mtbf_s=None, window_s=30 * DAY),
                                            rel=0.03)
    _bound(model, mtbfs=[None])
    with pytest.raises(SimError, match="nodes' job MTBF"):
        _bound(NodeFailures(nodes=1000, node_mtbf_s=1.0), mtbfs=[None])
    big = NodeFailures(nodes=1_000_000, node_mtbf_s=1e12)
    assert big.streams == 15_625
    _bound(big, mtbfs=[None], seeds=MAX_STREAMS // 15_625)
    with pytest.raises(SimError, match="random streams"):
        _bound(big, mtbfs=[None], seeds=MAX_STREAMS // 15_625 + 1)
