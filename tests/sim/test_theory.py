"""The simulator against closed forms: Daly (2006) and the perfect checkpointer."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim import CostModel, Scenario, simulate, sweep
from sim.theory import daly_interval_s, limit_ratio_exponential, periodic_ratio, young_interval_s

YEAR = 365 * 86400.0


@pytest.mark.parametrize("step,interval,checkpoint,restart,mtbf", [
    (10, 30, 60, 120, 3600), (6, 100, 30, 30, 1800), (2, 50, 10, 60, 6 * 3600),
    (20, 10, 120, 300, 7200)])
def test_daly_closed_form(step, interval, checkpoint, restart, mtbf):
    """Synchronous periodic checkpointing under exponential failures: the simulated
    mean effective ratio is within 0.5% of e^(R/M) M (e^((T+C)/M) - 1) per segment."""
    costs = CostModel(restart_s=restart, load_fixed_s=0.0, load_gbps=1e12)
    scenario = Scenario.custom(iteration_s=step, iterations=10_000, checkpoint_gb=100.0,
                               checkpoint_s=checkpoint, costs=costs, interval=interval,
                               window_s=YEAR)
    row = simulate(scenario, mtbf_s=mtbf, strategies=["deepspeed"], seeds=20).iloc[0]
    recovery = restart + costs.load_s(100e9)
    expected = periodic_ratio(step_s=step, steps=10_000, interval=interval, checkpoint_s=checkpoint,
                              restart_s=recovery, mtbf_s=mtbf)
    assert row.ci95 / expected < 0.002          # the comparison is sharp enough to fail
    assert abs(row.effective_ratio - expected) / expected < 0.005


def test_perfect_checkpointer_limit():
    scenario = Scenario.from_preset("llama-3.2-1b", window_s=60 * 86400.0)
    frame = sweep(scenario, mtbf_s=[300.0, 1800.0], strategies=["layercheck"], seeds=10)
    limit = frame[frame.strategy == "limit"]
    expected = limit_ratio_exponential(scenario.costs.restart_s, limit.mtbf_s.to_numpy())
    np.testing.assert_allclose(limit.effective_ratio, expected, rtol=0.005)
    lc = frame[frame.strategy == "layercheck"].effective_ratio.to_numpy()
    assert (lc < limit.effective_ratio.to_numpy()).all()


@given(c=st.floats(1, 600), m1=st.floats(60, 1e5), factor=st.floats(1.01, 10),
       restart=st.floats(0, 600), interval=st.integers(1, 500))
def test_expected_ratio_rises_with_mtbf(c, m1, factor, restart, interval):
    kw = dict(step_s=5.0, steps=2000, interval=interval, checkpoint_s=c, restart_s=restart)
    assert periodic_ratio(mtbf_s=m1 * factor, **kw) >= periodic_ratio(mtbf_s=m1, **kw)


@pytest.mark.parametrize("strategy", ["none", "deepspeed", "checkfreq", "gemini", "lowdiff",
                                      "layercheck", "layercheck-sync"])
def test_simulated_ratio_rises_with_mtbf(strategy):
    """In expectation (not path by path: a longer gap can end just before a commit):
    the mean over seeds rises with the MTBF beyond its confidence intervals."""
    scenario = Scenario.from_preset("llama-3.2-1b", window_s=10 * 86400.0)
    frame = sweep(scenario, mtbf_s=[300.0, 1200.0, 4800.0, 19200.0], strategies=[strategy],
                  seeds=20, limit=False)
    ratio, ci = frame.effective_ratio.to_numpy(), frame.ci95.to_numpy()
    assert (np.diff(ratio) > -(ci[1:] + ci[:-1])).all()
    assert ratio[-1] > ratio[0]


def test_young_and_daly_intervals():
    assert young_interval_s(60, 3600) == pytest.approx(math.sqrt(2 * 60 * 3600))
    assert daly_interval_s(60, 3600) < young_interval_s(60, 3600) + 60
    assert daly_interval_s(10_000, 3600) == 3600
