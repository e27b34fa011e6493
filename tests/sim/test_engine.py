"""The fast engine against the SimPy reference, lane by lane, and its accounting."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costs import CostModel
from sim.engine import RESULT_FIELDS, run_lanes, run_limit
from sim.reference import run_reference
from sim.strategies import STRATEGIES, Cadence, Schedule, get_strategy
from sim.timeline import Timeline

from .conftest import BASE_STEP, SMALL_COSTS, small_workload

COMPARED = ("useful_s", "stale_s", "checkpoint_stall_s", "lost_work_s", "recovery_s", "failures",
            "bytes_written", "jobs", "rolled_back_steps", "events")
NAMES = list(STRATEGIES)


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def kernel(request, monkeypatch):
    """Every test here on both engine loops (``run_lanes``' kernel): each equals SimPy."""
    if request.param == "compiled":
        pytest.importorskip("numba")
    monkeypatch.setenv("LAYERCHECK_SIM_KERNEL", request.param)
    return request.param


def _schedule(name, workload, costs, every):
    strategy = get_strategy(name)
    cadence = Cadence(every=every, storage_every=2 * every) if strategy.rollback else None
    return strategy.schedule(workload, costs, cadence)


def _both(schedule, failures, uniforms, window):
    res = run_lanes([Timeline.build(schedule)], np.zeros(len(failures), dtype=int), failures,
                    np.arange(len(failures)), uniforms, window)
    return res, [run_reference(schedule, f, u, window) for f, u in zip(failures, uniforms)]


def _assert_equal(res, refs):
    for lane, ref in enumerate(refs):
        for field in COMPARED:
            assert getattr(res, field)[lane] == pytest.approx(ref[field], rel=1e-9, abs=1e-6), field


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("every", [1, 4, 7])
def test_engine_equals_simpy_reference(name, every):
    rng = np.random.default_rng([NAMES.index(name), every])  # reproducible in every process
    schedule = _schedule(name, small_workload(), SMALL_COSTS, every)
    window = 3000.0
    failures = [np.sort(rng.uniform(0, window, rng.integers(0, 60))) for _ in range(6)]
    uniforms = [rng.random(len(f)) for f in failures]
    _assert_equal(*_both(schedule, failures, uniforms, window))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(NAMES),
       every=st.integers(1, 12), write=st.floats(0.3, 20), restart=st.floats(0, 40))
def test_engine_equals_reference_property(seed, name, every, write, restart):
    rng = np.random.default_rng(seed)
    costs = CostModel(save_gbps=write, persist_gbps=write, lc_write_gbps=write, peer_gbps=write,
                      restart_s=restart, peer_loss_probability=0.5,
                      diff_batch=int(rng.integers(1, 4)), lc_commit_s=float(rng.uniform(0, 2)))
    workload = small_workload(seed, steps=int(rng.integers(BASE_STEP, 30)))
    schedule = _schedule(name, workload, costs, every)
    window = float(rng.uniform(50, 1500))
    failures = [np.sort(rng.uniform(0, window, rng.integers(0, 40))) for _ in range(3)]
    uniforms = [rng.random(len(f)) for f in failures]
    _assert_equal(*_both(schedule, failures, uniforms, window))


@pytest.mark.parametrize("name", NAMES)
def test_time_adds_up_to_the_window(name):
    rng = np.random.default_rng(3)
    schedule = _schedule(name, small_workload(), SMALL_COSTS, 5)
    window = 5000.0
    failures = [np.sort(rng.uniform(0, window, n)) for n in (0, 10, 200)]
    res = run_lanes([Timeline.build(schedule)], np.zeros(3, dtype=int), failures, np.arange(3),
                    [rng.random(len(f)) for f in failures], window)
    total = res.useful_s + res.checkpoint_stall_s + res.lost_work_s + res.recovery_s
    np.testing.assert_allclose(total, window, rtol=1e-12)
    assert (res.stale_s >= 0).all() and (res.stale_s <= res.useful_s).all()
    assert set(RESULT_FIELDS) == set(res.__dataclass_fields__)


def _one_failure(name, at_fn, costs=SMALL_COSTS, window=500.0):
    workload = small_workload()
    timeline = Timeline.build(_schedule(name, workload, costs, 10))
    at = [np.array([at_fn(timeline, workload)])]
    res = run_lanes([timeline], np.zeros(1, dtype=int), at, np.arange(1), [np.ones(1)], window)
    return res, workload, timeline


def test_no_recovery_point_before_the_base_checkpoint():
    """LayerCheck writes nothing during its warm-up: a failure there loses every step."""
    res, w, _ = _one_failure("layercheck", lambda t, w: t.ready[BASE_STEP - 1] - 0.1)
    assert res.rolled_back_steps[0] == BASE_STEP - 2
    assert res.lost_work_s[0] == pytest.approx(w.compute_s[: BASE_STEP - 1].sum() - 0.1)


def test_a_step_is_recoverable_once_its_state_is_committed():
    """Just after step 5's compute and snapshot, before its persist (state commit) is
    durable: the recovery point is step 4, whose commit was durable."""
    def at(t, w):
        return t.resume[5] + 1e-6
    res, w, t = _one_failure("layercheck", at)
    assert t.schedule.persist[5] > 1e-3 and res.rolled_back_steps[0] == 1
    fast = SMALL_COSTS.with_overrides(lc_write_gbps=1e6, lc_commit_s=0.0)
    res, _, t = _one_failure("layercheck", lambda t, w: t.resume[5] + 1e-3, fast)
    assert res.rolled_back_steps[0] == 0


def test_layercheck_recovery_discards_stale_layers():
    res, w, t = _one_failure("layercheck", lambda t, w: t.resume[30] + 1e-3,
                             SMALL_COSTS.with_overrides(lc_write_gbps=1e6, lc_commit_s=0.0))
    assert res.stale_s[0] == pytest.approx(t.schedule.stale_s(30, 0)) and res.stale_s[0] > 0


def test_rollback_is_counted():
    """A failure in step 10 costs a rollback strategy 9 steps."""
    res, w, _ = _one_failure("deepspeed", lambda t, w: t.resume[9] + 0.5 * w.compute_s[9])
    assert res.rolled_back_steps[0] == 9
    assert res.lost_work_s[0] == pytest.approx(w.compute_s[:9].sum() + 0.5 * w.compute_s[9])


def test_the_perfect_checkpointer_loses_only_restarts():
    """``run_limit`` by hand: failures at 10, 12 and 100 s in a 200 s window with a 5 s
    restart. The restart after 10 is cut short at 12 (2 s), then redone in full (5 s),
    as is the one after 100; nothing else is lost, nothing is written."""
    times = [np.array([10.0, 12.0, 100.0]), np.array([]), np.array([150.0])]
    res = run_limit(times, 200.0, 5.0)
    assert res.recovery_s.tolist() == [12.0, 0.0, 5.0]
    assert res.useful_s.tolist() == [188.0, 200.0, 195.0]
    assert res.failures.tolist() == [3.0, 0.0, 1.0]
    # failures + completed restarts (the one cut short at 12 s does not complete)
    assert res.events.tolist() == [5.0, 0.0, 2.0]
    for field in ("stale_s", "checkpoint_stall_s", "lost_work_s", "bytes_written", "jobs",
                  "rolled_back_steps"):
        assert getattr(res, field).tolist() == [0.0, 0.0, 0.0], field
    free = run_limit(times, 200.0, 0.0)  # an instant restart: failures are the only events
    assert free.useful_s.tolist() == [200.0] * 3 and free.events.tolist() == [3.0, 0.0, 1.0]
    # a restart under a second is counted like any other
    assert run_limit([np.array([10.0])], 200.0, 0.5).events.tolist() == [2.0]
    # a restart longer than the time left in the window ends with it
    assert run_limit([np.array([198.0])], 200.0, 5.0).recovery_s.tolist() == [2.0]


def test_many_strategies_and_failure_rows_in_one_call_equal_the_reference():
    """Lanes of every strategy side by side (timelines stacked and shifted in time),
    rows of 0 to 40 failures, lanes in no particular order: each lane alone in SimPy."""
    rng = np.random.default_rng(11)
    schedules = [_schedule(name, small_workload(), SMALL_COSTS, every)
                 for name in NAMES for every in (3, 8)]
    window = 2000.0
    failures = [np.sort(rng.uniform(0, window, n)) for n in (40, 0, 7, 19, 1)]
    uniforms = [rng.random(len(f)) for f in failures]
    strategy = np.array([s for s in range(len(schedules)) for _ in failures])
    row = np.array([r for _ in schedules for r in range(len(failures))])
    shuffle = rng.permutation(len(strategy))
    res = run_lanes([Timeline.build(s) for s in schedules], strategy[shuffle], failures,
                    row[shuffle], uniforms, window)
    refs = [run_reference(schedules[s], failures[r], uniforms[r], window)
            for s, r in zip(strategy[shuffle], row[shuffle])]
    _assert_equal(res, refs)


def test_a_backup_counts_at_its_own_time_before_the_skipped_wait():
    """One-second steps; steps 1 and 3 persist for 2.5 s (the primary tier), step 2's
    backup takes 2 s. Failure-free, step 3 waits 0.5 s for the writer and step 2's
    backup is durable at 4.0. A failure at 3.6 rolls back to step 1 (durable at 3.5):
    resumed there, step 3 does not wait, so everything from step 3 on runs 0.5 s earlier
    than failure-free, but step 2's backup is still durable 3 s after the resume, at
    6.6. A failure at 6.3 comes before it: back to step 1 again, two steps rolled back
    each time (crediting the backup with the skipped wait would roll back to step 2)."""
    n = 6
    persist, commit = np.zeros(n + 1), np.zeros(n + 1, dtype=bool)
    persist[[1, 3]], commit[[1, 3]] = 2.5, True
    backup = np.full(n + 1, np.nan)
    backup[2] = 2.0
    compute = np.ones(n + 1)
    compute[0] = 0.0
    schedule = Schedule(strategy="hand", compute=compute, snap=np.zeros(n + 1), persist=persist,
                        commit=commit, bytes=np.zeros(n + 1), recover=np.zeros(n + 1),
                        backup=backup)
    assert Timeline.build(schedule).backup_after_skip[:2].tolist() == [4.0, np.inf]
    res, refs = _both(schedule, [np.array([3.6, 6.3])], [np.ones(2)], 7.0)
    _assert_equal(res, refs)
    assert res.rolled_back_steps.tolist() == [4.0]


def test_a_backup_before_the_first_persist_after_a_resume_keeps_its_own_time():
    """Tiered's durable tier (the engine's backup) commits between its memory copies. After
    a resume at j, a backup of a step before the first persist q after j is durable at its
    failure-free time: unlike the events from q on, it is not shifted by the writer wait
    that the resume skipped at q (shifted, it would count up to that wait too early). A
    case the property test above found, pinned."""
    seed, every, write = 4, 2, 1.0
    rng = np.random.default_rng(seed)
    costs = CostModel(save_gbps=write, persist_gbps=write, lc_write_gbps=write, peer_gbps=write,
                      restart_s=0.0, peer_loss_probability=0.5,
                      diff_batch=int(rng.integers(1, 4)), lc_commit_s=float(rng.uniform(0, 2)))
    workload = small_workload(seed, steps=int(rng.integers(BASE_STEP, 30)))
    schedule = _schedule("tiered", workload, costs, every)
    window = float(rng.uniform(50, 1500))
    failures = [np.sort(rng.uniform(0, window, rng.integers(0, 40))) for _ in range(3)]
    uniforms = [rng.random(len(f)) for f in failures]
    _assert_equal(*_both(schedule, failures, uniforms, window))


def test_no_lanes_give_empty_results():
    timeline = Timeline.build(_schedule("layercheck", small_workload(), SMALL_COSTS, 5))
    res = run_lanes([timeline], np.zeros(0, dtype=int), [np.array([1.0])], np.zeros(0, dtype=int),
                    [np.ones(1)], 100.0)
    assert all(getattr(res, f).shape == (0,) for f in RESULT_FIELDS)


def test_recovering_from_the_backup_tier_costs_its_own_time():
    """A schedule whose backup tier is slower to recover from (``recover_backup``; no
    built-in strategy sets it): the engine picks the tier per failure as SimPy does."""
    import dataclasses
    rng = np.random.default_rng(5)
    base = _schedule("gemini", small_workload(), SMALL_COSTS, 4)
    assert base.backup is not None and base.backup_probability > 0
    schedule = dataclasses.replace(base, recover_backup=base.recover * 3 + 7.0)
    window = 3000.0
    failures = [np.sort(rng.uniform(0, window, n)) for n in (30, 12, 50)]
    uniforms = [rng.random(len(f)) for f in failures]
    res, refs = _both(schedule, failures, uniforms, window)
    _assert_equal(res, refs)
    plain, _ = _both(base, failures, uniforms, window)
    assert (res.recovery_s > plain.recovery_s).all()
    # the same lanes on the second of two stacked timelines (a non-zero offset)
    stacked = run_lanes([Timeline.build(base), Timeline.build(schedule)], np.ones(3, dtype=int),
                        failures, np.arange(3), uniforms, window)
    _assert_equal(stacked, refs)


def test_timelines_shorter_than_ten_seconds_stay_apart():
    """Stacked timelines are shifted by more than the longest one, however short."""
    costs = SMALL_COSTS.with_overrides(save_gbps=1e4, persist_gbps=1e4, lc_write_gbps=1e4,
                                       peer_gbps=1e4, restart_s=0.5, lc_commit_s=0.0)
    schedules = [_schedule(name, small_workload(steps=4), costs, 1) for name in ("none", "deepspeed")]
    timelines = [Timeline.build(s) for s in schedules]
    assert max(t.ready[-1] for t in timelines) < 10.0
    window = 30.0
    failures = [np.array([2.5, 9.0, 17.25])]
    res = run_lanes(timelines, np.array([0, 1]), failures, np.array([0, 0]), [np.ones(3)], window)
    _assert_equal(res, [run_reference(s, failures[0], np.ones(3), window) for s in schedules])


def test_times_the_float64_keys_cannot_resolve_are_refused():
    """Issue 27, item 11: the engine stacks every strategy's times in one float64 array; a
    job whose span swamps its shortest step (1 ns steps, 15-minute saves) would answer
    garbage (ratios above 1, NaN), so it is refused with what to change."""
    from sim.errors import SimError
    from sim.workload import Workload
    tiny = Workload.custom(iteration_s=1e-9, iterations=1000, full_bytes=int(1e12))
    timeline = Timeline.build(_schedule("deepspeed", tiny, CostModel(), 1))
    with pytest.raises(SimError, match="float64 cannot resolve its shortest step"):
        run_lanes([timeline], np.zeros(1, dtype=int), [np.array([5.0])], np.zeros(1, dtype=int),
                  [np.array([0.5])], 3600.0)


@pytest.mark.parametrize("name", NAMES)
def test_a_constant_downtime_is_a_longer_restart(name):
    """Downtime d per failure (detection, rescheduling) costs exactly what a restart longer
    by d costs, lane by lane, including failures that interrupt a recovery."""
    import dataclasses
    rng = np.random.default_rng(NAMES.index(name))
    window, d = 3000.0, 7.5
    failures = [np.sort(rng.uniform(0, window, rng.integers(0, 60))) for _ in range(6)]
    uniforms = [rng.random(len(f)) for f in failures]
    costs = dataclasses.replace(SMALL_COSTS, peer_loss_probability=0.5)
    plain = _schedule(name, small_workload(), costs, 4)
    longer = _schedule(name, small_workload(),
                       dataclasses.replace(costs, restart_s=costs.restart_s + d), 4)
    lanes = dict(strategy=np.zeros(len(failures), dtype=int), failures=failures,
                 row=np.arange(len(failures)), uniforms=uniforms, window_s=window)
    with_down = run_lanes([Timeline.build(plain)], **lanes,
                          downtime=[np.full(len(f), d) for f in failures])
    expected = run_lanes([Timeline.build(longer)], **lanes)
    for field in RESULT_FIELDS:
        np.testing.assert_allclose(getattr(with_down, field), getattr(expected, field),
                                   rtol=1e-9, atol=1e-6, err_msg=field)
    limit = run_limit(failures, window, costs.restart_s, downtime=[np.full(len(f), d) for f in failures])
    np.testing.assert_allclose(limit.recovery_s,
                               run_limit(failures, window, costs.restart_s + d).recovery_s)


def test_each_failure_pays_its_own_downtime():
    schedule = _schedule("none", small_workload(), SMALL_COSTS, 1)
    res = run_lanes([Timeline.build(schedule)], np.zeros(1, dtype=int), [np.array([100.0, 1000.0])],
                    np.zeros(1, dtype=int), [np.ones(2)], 3000.0, downtime=[np.array([50.0, 400.0])])
    assert res.recovery_s[0] == pytest.approx(2 * SMALL_COSTS.restart_s + 450.0)
