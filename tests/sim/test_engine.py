"""The fast engine against the SimPy reference, lane by lane, and its accounting."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costs import CostModel
from sim.engine import RESULT_FIELDS, run_lanes
from sim.reference import run_reference
from sim.strategies import STRATEGIES, get_strategy
from sim.timeline import Timeline

from .conftest import SMALL_COSTS, small_workload

COMPARED = ("useful_s", "checkpoint_stall_s", "lost_work_s", "recovery_s", "failures",
            "bytes_written", "jobs", "rolled_back_steps")


def _both(plan, failures, uniforms, window):
    res = run_lanes([Timeline.build(plan)], np.zeros(len(failures), dtype=int), failures,
                    np.arange(len(failures)), uniforms, window)
    return res, [run_reference(plan, f, u, window) for f, u in zip(failures, uniforms)]


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("interval", [1, 4, 7])
def test_engine_equals_simpy_reference(name, interval):
    rng = np.random.default_rng(hash((name, interval)) % 2**32)
    plan = get_strategy(name).plan(small_workload(), SMALL_COSTS, interval=interval)
    window = 3000.0
    failures = [np.sort(rng.uniform(0, window, rng.integers(0, 60))) for _ in range(6)]
    uniforms = [rng.random(len(f)) for f in failures]
    res, refs = _both(plan, failures, uniforms, window)
    for lane, ref in enumerate(refs):
        for field in COMPARED:
            assert getattr(res, field)[lane] == pytest.approx(ref[field], rel=1e-9, abs=1e-6), field


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(list(STRATEGIES)),
       interval=st.integers(1, 12), write=st.floats(0.3, 20), restart=st.floats(0, 40))
def test_engine_equals_reference_property(seed, name, interval, write, restart):
    rng = np.random.default_rng(seed)
    costs = CostModel(write_gbps=write, peer_gbps=write, restart_s=restart,
                      peer_loss_probability=0.5, diff_batch=int(rng.integers(1, 4)))
    plan = get_strategy(name).plan(small_workload(seed, steps=int(rng.integers(2, 30))), costs,
                                   interval=interval)
    window = float(rng.uniform(50, 1500))
    failures = [np.sort(rng.uniform(0, window, rng.integers(0, 40))) for _ in range(3)]
    uniforms = [rng.random(len(f)) for f in failures]
    res, refs = _both(plan, failures, uniforms, window)
    for lane, ref in enumerate(refs):
        for field in COMPARED:
            assert getattr(res, field)[lane] == pytest.approx(ref[field], rel=1e-9, abs=1e-6), field


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_time_adds_up_to_the_window(name):
    rng = np.random.default_rng(3)
    plan = get_strategy(name).plan(small_workload(), SMALL_COSTS, interval=5)
    window = 5000.0
    failures = [np.sort(rng.uniform(0, window, n)) for n in (0, 10, 200)]
    res = run_lanes([Timeline.build(plan)], np.zeros(3, dtype=int), failures, np.arange(3),
                    [rng.random(len(f)) for f in failures], window)
    total = res.useful_s + res.checkpoint_stall_s + res.lost_work_s + res.recovery_s
    np.testing.assert_allclose(total, window, rtol=1e-12)
    assert set(RESULT_FIELDS) == set(res.__dataclass_fields__)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(1, 80))
def test_layercheck_never_redoes_work(seed, count):
    """Every completed step is a recovery point: only the step in flight is lost."""
    rng = np.random.default_rng(seed)
    workload = small_workload(seed)
    plan = get_strategy("layercheck").plan(workload, SMALL_COSTS)
    failures = [np.sort(rng.uniform(0, 4000.0, count))]
    res = run_lanes([Timeline.build(plan)], np.zeros(1, dtype=int), failures, np.arange(1),
                    [rng.random(count)], 4000.0)
    assert res.rolled_back_steps[0] == 0
    assert res.lost_work_s[0] <= count * workload.compute_s.max() + 1e-9


def test_rollback_is_counted():
    """A failure just after step 9 costs a rollback strategy 9 steps, LayerCheck none."""
    workload = small_workload()
    counts = {}
    for name in ("deepspeed", "layercheck"):
        timeline = Timeline.build(get_strategy(name).plan(workload, SMALL_COSTS, interval=10))
        at = [np.array([timeline.resume[9] + 0.5 * workload.compute_s[9]])]  # mid step 10
        res = run_lanes([timeline], np.zeros(1, dtype=int), at, np.arange(1), [np.ones(1)], 500.0)
        counts[name] = (res.rolled_back_steps[0], res.lost_work_s[0])
    assert counts["deepspeed"][0] == 9
    assert counts["deepspeed"][1] == pytest.approx(workload.compute_s[:9].sum() + 0.5 * workload.compute_s[9])
    assert counts["layercheck"] == (0, pytest.approx(0.5 * workload.compute_s[9]))
