"""The compiled engine loop (``sim.kernel``) against the numpy loop it replaces, on a grid."""
import numpy as np
import pytest

from sim.engine import RESULT_FIELDS, run_lanes
from sim.errors import SimError

from .conftest import sweep_lanes

pytest.importorskip("numba")


SLOW_WRITER = {"persist_gbps": 0.1, "lc_write_gbps": 0.3}
"""Persists that outlast the 106-step interval: snapshots wait for the writer (wait_skip)."""


@pytest.mark.parametrize("costs", [None, SLOW_WRITER], ids=["preset", "slow-writer"])
def test_compiled_loop_equals_the_numpy_loop_on_a_sweep_grid(costs):
    """Bit for bit on every field; the grid has lanes of 0 to 7,200 failures, finished
    jobs, GEMINI's lost peer copies, LayerCheck's stale layers and (slow writer)
    snapshots that wait for the writer."""
    grid = sweep_lanes(costs=costs)
    if costs:
        assert sum((t.wait_skip > 0).any() for t in grid[0][:7]) == 2   # CheckFreq, LayerCheck
    fast, slow = run_lanes(*grid, kernel="compiled"), run_lanes(*grid, kernel="numpy")
    assert slow.failures.max() > 7000 and slow.jobs.max() > 0 and slow.stale_s.max() > 0
    for field in RESULT_FIELDS:
        np.testing.assert_array_equal(getattr(fast, field), getattr(slow, field), err_msg=field)


def test_compiled_loop_equals_the_numpy_loop_with_a_downtime_per_failure():
    """The scale model's per-event downtime (detection, rescheduling: ``sim.recovery``),
    drawn differently for every failure, repeated by each failure that interrupts a
    recovery: both loops add it alike, bit for bit."""
    timelines, strategy, times, row, uniforms, window = sweep_lanes(seeds=2)
    rng = np.random.default_rng(7)
    downtime = [rng.exponential(120.0, size=len(t)) for t in times]
    fast = run_lanes(timelines, strategy, times, row, uniforms, window, downtime, kernel="compiled")
    slow = run_lanes(timelines, strategy, times, row, uniforms, window, downtime, kernel="numpy")
    plain = run_lanes(timelines, strategy, times, row, uniforms, window, kernel="numpy")
    assert (slow.recovery_s > plain.recovery_s).any()
    for field in RESULT_FIELDS:
        np.testing.assert_array_equal(getattr(fast, field), getattr(slow, field), err_msg=field)


@pytest.mark.parametrize("kernel", ["compiled", "numpy"])
def test_a_lane_does_not_depend_on_the_others_of_its_call(kernel):
    """What lets a grid be cut into pieces run anywhere (``sim.grid``): any subset of the
    lanes, with the same timelines, gives those lanes' totals exactly, in either loop."""
    timelines, strategy, times, row, uniforms, window = sweep_lanes(seeds=2)
    whole = run_lanes(timelines, strategy, times, row, uniforms, window, kernel=kernel)
    pick = np.array([3, 0, len(row) - 1, 7, 9, 12, 13, 20, 30])
    part = run_lanes(timelines, strategy[pick], times, row[pick], uniforms, window, kernel=kernel)
    for field in RESULT_FIELDS:
        np.testing.assert_array_equal(getattr(part, field), getattr(whole, field)[pick])


def test_kernel_names_are_checked(monkeypatch):
    grid = sweep_lanes(mtbfs=(3600.0,), seeds=1, window=86400.0)
    with pytest.raises(SimError, match="use one of auto, compiled, numpy"):
        run_lanes(*grid, kernel="fortran")
    monkeypatch.setenv("LAYERCHECK_SIM_KERNEL", "fast")
    with pytest.raises(SimError, match="LAYERCHECK_SIM_KERNEL"):
        run_lanes(*grid)
    import sim.engine
    monkeypatch.setattr(sim.engine, "_KERNEL", False)       # as where numba does not import
    monkeypatch.delenv("LAYERCHECK_SIM_KERNEL")
    with pytest.raises(SimError, match="needs numba"):
        run_lanes(*grid, kernel="compiled")
    auto = run_lanes(*grid)                                  # auto: the numpy loop then
    np.testing.assert_array_equal(auto.useful_s, run_lanes(*grid, kernel="numpy").useful_s)


# --- the smaller walks: the same numbers as their numpy and Python originals -------------
import sys  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402

from sim import timeline as timeline_module  # noqa: E402
from sim.strategies import lowdiff_writer as writer_module  # noqa: E402
from sim.engine import compiled_kernel  # noqa: E402


def _without_kernel(monkeypatch, fn, *args):
    """``fn(*args)`` as it runs where the compiled walks are not loaded."""
    with monkeypatch.context() as m:
        m.delitem(sys.modules, "sim.kernel", raising=False)
        return fn(*args)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 60))
def test_timeline_walk_is_the_python_walk(seed, steps):
    kernel = compiled_kernel(load=True)
    assert kernel is not None, "numba is in both test environments (the sim-fast extra)"
    rng = np.random.default_rng(seed)
    compute = np.concatenate(([0.0], rng.uniform(0.1, 3.0, steps)))
    snap = np.where(rng.random(steps + 1) < 0.5, rng.uniform(0, 2, steps + 1), 0.0)
    persist = np.where(rng.random(steps + 1) < 0.5, rng.uniform(0, 9, steps + 1), 0.0)

    class S:     # the three arrays _walk reads
        pass
    s = S()
    s.compute, s.snap, s.persist, s.steps = compute, snap, persist, steps
    ours = kernel.timeline_walk(compute, snap, persist)
    with pytest.MonkeyPatch.context() as m:
        m.delitem(sys.modules, "sim.kernel")
        theirs = timeline_module._walk(s)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(2, 80), slots=st.one_of(st.none(),
                                                                              st.integers(1, 4)))
def test_queued_writer_walk_is_the_python_walk(seed, steps, slots):
    kernel = compiled_kernel(load=True)
    assert kernel is not None, "numba is in both test environments (the sim-fast extra)"
    rng = np.random.default_rng(seed)
    compute = rng.uniform(0.5, 2.0, steps)
    snap = np.concatenate(([0.0], rng.uniform(0, 0.5, steps)))
    write = np.where(rng.random(steps + 1) < 0.6, rng.uniform(0.1, 4.0, steps + 1), 0.0)
    full = rng.random(steps + 1) < 0.1
    snap_ours = snap.copy()
    ours = writer_module.queued_writer(compute, snap_ours, write, full, 3.0, slots)
    snap_theirs = snap.copy()
    with pytest.MonkeyPatch.context() as m:
        m.delitem(sys.modules, "sim.kernel")
        theirs = writer_module.queued_writer(compute, snap_theirs, write, full, 3.0, slots)
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert ours[1] == theirs[1]
    np.testing.assert_array_equal(snap_ours, snap_theirs)
