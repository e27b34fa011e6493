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


@pytest.mark.parametrize("gpus,job_hours,step,interval,checkpoint_gb", [
    (1024, 8, 6.0, 100, 1000.0), (8192, 3, 4.0, 60, 4000.0), (64, 24, 10.0, 200, 300.0)])
def test_meta_ettr_closed_form(gpus, job_hours, step, interval, checkpoint_gb):
    """Meta's ETTR ~ (1 - N r (u0 + dt/2)) / (1 + w/dt) (arXiv 2410.21680), where its
    assumptions hold (N r (u0 + dt) of a few percent, exponential nodes, every failure
    costing the same u0): the scale model's mean ratio within 1% (in practice 0.03%).
    u0 is everything a failure costs before training resumes: detection (no hangs),
    host selection, restart on N nodes and the load; w the save on N nodes."""
    from sim.recovery import RecoveryModel
    from sim.scale import ScaleModel, scale_costs, simulate_scale
    from sim.theory import meta_ettr
    nodes = gpus // 8
    recovery = RecoveryModel(hang_share=0.0)
    model = ScaleModel(node_mtbf_s=job_hours * 3600.0 * nodes, recovery=recovery)
    scenario = Scenario.custom(iteration_s=step, iterations=100_000, checkpoint_gb=checkpoint_gb,
                               window_s=YEAR, interval=interval)
    row = simulate_scale(scenario, model, gpus=gpus, seeds=10, strategies=["deepspeed"]).iloc[0]
    costs = scale_costs(scenario.costs, nodes, model.storage(scenario.costs, nodes), recovery)
    full = scenario.workload.full_bytes
    u0 = recovery.crash_detect_s + recovery.host_selection_s + costs.restart_s + costs.load_s(full)
    expected = meta_ettr(nodes=nodes, node_rate=1 / model.node_mtbf_s, restart_s=u0,
                         stall_s=costs.save_s(full), interval_s=interval * step)
    assert row.ci95 / expected < 0.002          # the comparison is sharp enough to fail
    assert abs(row.effective_ratio - expected) / expected < 0.01


def test_meta_best_interval_maximises_its_ettr():
    from sim.theory import meta_best_interval_s, meta_ettr
    kw = dict(nodes=2048, node_rate=1 / (264 * 86400.0), stall_s=3.0)
    best = meta_best_interval_s(**kw)
    at = lambda dt: meta_ettr(restart_s=300.0, interval_s=dt, **kw)  # noqa: E731
    assert at(best) > at(best * 0.8) and at(best) > at(best * 1.25)
